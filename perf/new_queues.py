"""What a new queue costs the dispatcher (issue 27: <= 50 us amortised, and no other queue's dispatch delayed by more
than 1 ms by queue creation), with the QueueFileMaker (the default) and without it (``maker off``: the dispatcher
makes every new queue's first file itself, as before it existed), alternating in one run.

Two measures, each in a fresh store (default settings, exclusive) and a fresh process:

* ``burst``: N puts, each to a new queue (N/4 topics x 4), as fast as one thread puts. ``dispatcher`` is the time
  until the dispatcher has walked every record (``ReputCore.dispatched``: a record whose unit waits for its file
  counts), per new queue; ``visible`` until every message is readable (``wait_for_dispatch``).
* ``beside``: a put to a new queue, then a put to one busy queue, N times, 0.2 ms apart (a producer that does other
  work): how long each busy-queue message waits before its queue shows it (a watcher thread polls the queue's max
  offset; its figures include waits for the GIL, whose switch interval is 5 ms).

Usage: python perf/new_queues.py [N] [ROUNDS]   (default 4000 queues, 2 rounds of each mode; stores in /tmp)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BODY = b"x" * 100


def _open(root: str, maker: bool):
    import localmq

    st = localmq.open(root)
    if not maker:
        st._reput.maker = None  # the dispatcher makes new queues' files itself
    return st


def burst(root: str, n: int, maker: bool) -> dict:
    st = _open(root, maker)
    try:
        core = st._reput
        target = core.dispatched + n
        t = time.perf_counter()
        for i in range(n):
            st.put("n%d" % (i // 4), BODY, queue_id=i % 4)
        put_s = time.perf_counter() - t
        while core.dispatched < target:
            time.sleep(0.0002)
        walked_s = time.perf_counter() - t
        if not st.wait_for_dispatch(3600):
            raise RuntimeError("dispatch did not finish")
        visible_s = time.perf_counter() - t
    finally:
        st.close()
    return {"put_us": put_s / n * 1e6, "dispatcher_us": walked_s / n * 1e6, "visible_us": visible_s / n * 1e6}


def beside(root: str, n: int, maker: bool) -> dict:
    st = _open(root, maker)
    try:
        st.put("busy", BODY)
        if not st.wait_for_dispatch(60):
            raise RuntimeError("dispatch did not finish")
        cq = st._cq_table.get(("busy", 0))
        put_t = [0.0] * (n + 1)
        seen_t = [0.0] * (n + 1)

        def watch() -> None:
            last = 1
            deadline = time.monotonic() + 3600
            while last <= n and time.monotonic() < deadline:
                m = min(cq.max_offset, n + 1)
                if m > last:
                    now = time.perf_counter()
                    for k in range(last, m):
                        seen_t[k] = now
                    last = m
                else:
                    time.sleep(0.0001)

        w = threading.Thread(target=watch)
        w.start()
        for i in range(n):
            st.put("n%d" % (i // 4), BODY, queue_id=i % 4)
            put_t[i + 1] = time.perf_counter()
            st.put("busy", BODY)
            time.sleep(0.0002)
        w.join()
        if not st.wait_for_dispatch(3600):
            raise RuntimeError("dispatch did not finish")
    finally:
        st.close()
    d = sorted(seen_t[k] - put_t[k] for k in range(1, n + 1))
    return {"busy_p50_ms": d[n // 2] * 1e3, "busy_p99_ms": d[int(n * 0.99)] * 1e3, "busy_max_ms": d[-1] * 1e3}


def main(argv) -> None:
    if argv and argv[0] == "--child":
        kind, root, n, maker = argv[1], argv[2], int(argv[3]), argv[4] == "on"
        print(json.dumps((burst if kind == "burst" else beside)(root, n, maker)))
        return
    n = int(argv[0]) if argv else 4000
    rounds = int(argv[1]) if len(argv) > 1 else 2
    print(f"{n} new queues (topics x 4), one 100-byte message each; maker on/off alternating, {rounds} rounds")
    for r in range(rounds):
        for kind in ("burst", "beside"):
            for maker in ("on", "off"):
                root = tempfile.mkdtemp(prefix="lmq-newq-")
                try:
                    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, root, str(n), maker]
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
                    if p.returncode != 0:
                        raise RuntimeError(p.stderr[-4000:])
                    res = json.loads(p.stdout.strip().splitlines()[-1])
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                figures = ", ".join(f"{k} {v:.2f}" for k, v in res.items())
                print(f"round {r + 1} {kind:6s} maker {maker:3s}: {figures}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
