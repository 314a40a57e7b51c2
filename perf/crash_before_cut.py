"""The open after a crash that came before the session's first running cut (issue 27): N topics x 4 queues, one
100-byte message per queue, a clean close; then a child process opens the store with its first queue flush pass (and
so its first cut) an hour away, writes again to one queue of K topics and is SIGKILLed. The open after the crash is
timed, then every queue's message count is checked. A clean open keeps the close's snapshot as the first cut
(config/queues.running); ``--no-cut`` deletes it before the timed open (every queue checked, as before).

Usage: python perf/crash_before_cut.py N K [--no-cut]   (the store lives in a temporary directory, removed after)
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KW = dict(mapped_file_size_commit_log=64 << 20)

CHILD = """
import sys, time, localmq
st = localmq.open(sys.argv[1], mapped_file_size_commit_log=64 << 20, flush_interval_consume_queue=3_600_000)
print("open", st.recovery.cq_vouched, flush=True)
for t in range(int(sys.argv[2])):
    st.put("t%d" % t, b"y" * 100, queue_id=1)
assert st.wait_for_dispatch(60)
print("ready", flush=True)
time.sleep(3600)
"""


def main() -> None:
    import localmq

    n, k = int(sys.argv[1]), int(sys.argv[2])
    root = tempfile.mkdtemp(prefix="lmq-crash-before-cut-")
    try:
        t0 = time.monotonic()
        with localmq.open(root, **KW) as st:
            for t in range(n):
                for q in range(4):
                    st.put(f"t{t}", b"x" * 100, queue_id=q)
            st.wait_for_dispatch(600)
        print(f"{n * 4} queues written and closed in {time.monotonic() - t0:.1f} s", flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        p = subprocess.Popen([sys.executable, "-c", CHILD, root, str(k)], stdout=subprocess.PIPE, text=True, env=env)
        try:
            opened, ready = p.stdout.readline().split(), p.stdout.readline().strip()  # type: ignore[union-attr]
            assert opened[0] == "open" and ready == "ready", (opened, ready)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()  # type: ignore[union-attr]
        running = os.path.join(root, "config", "queues.running")
        print(f"reopened (vouched {opened[1]}), {k} queues written, SIGKILL; first cut kept: {os.path.exists(running)}")
        if "--no-cut" in sys.argv:
            os.unlink(running)
        t0 = time.monotonic()
        st = localmq.open(root, **KW)
        dt = time.monotonic() - t0
        try:
            wrong = sum(st.max_offset(f"t{t}", q) != (2 if q == 1 and t < k else 1) for t in range(n) for q in range(4))
            print(
                f"open after the crash: {dt:.2f} s ({st.recovery.mode}, {st.recovery.cq_vouched} queues vouched); "
                f"queues with a wrong count: {wrong}"
            )
        finally:
            st.close()
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
