"""Dispatch throughput of a shared store's housekeeper (records a second through ``ReputCore`` with the control file
attached): one process opens the store shared (its first opener, so its housekeeper), stops its dispatcher, puts N
100-byte messages over 4 queues, starts a new dispatcher thread over the same core and times it until it has caught
up. Rounds alternate nothing: run it once per build to compare two builds (e.g. before and after a change to
store/dispatch.pyx), several times each.

Usage: PYTHONPATH=$PWD python perf/shared_dispatch.py [N] [ROUNDS]   (default 500000 messages, 5 rounds; prints the
median and each round's rate; the store lives in a temporary directory, removed after)
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one_round(n: int) -> float:
    import localmq
    from localmq.services.reput import ReputMessageService

    root = tempfile.mkdtemp(prefix="lmq-shared-dispatch-")
    try:
        q = localmq.open(root, shared=True, mapped_file_size_commit_log=256 << 20)
        try:
            assert q.housekeeper
            q._stop_service(q._reput_service)
            body = b"x" * 100
            for i in range(0, n, 1000):
                q.put_batch("T", [body] * min(1000, n - i), queue_id=i // 1000 % 4)
            end = q.commit_log.sync_view()
            svc = ReputMessageService(q._reput)
            t0 = time.perf_counter()
            svc.start()
            while q._reput.reput_offset < end:
                time.sleep(0.0005)
            dt = time.perf_counter() - t0
            svc.shutdown()
            q._reput_service = ReputMessageService(q._reput)  # the close stops it
            q._reput_service.start()
            assert sum(q.max_offset("T", k) for k in range(4)) == n
            return n / dt
        finally:
            q.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rates = [one_round(n) for _ in range(rounds)]
    print(f"shared dispatch: median {statistics.median(rates):,.0f} records/s; rounds: {[round(r) for r in rates]}")


if __name__ == "__main__":
    main()
