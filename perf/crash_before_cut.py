"""The open after a crash that came before the session's first running cut (issue 27): N topics x 4 queues, one
100-byte message per queue, a clean close; then a child process opens the store with its first queue flush pass (and
so its first cut) an hour away, writes again to one queue of K topics and is SIGKILLed. The open after the crash is
timed, then every queue's message count is checked. A clean open keeps the close's snapshot as the first cut
(config/queues.running); ``--no-cut`` deletes it before the timed open (every queue checked, as before).

``--after-crash``: the store is written by a process that waits for two running cuts after its last dispatch and is
SIGKILLed, instead of closed; the child's open is then one after a crash (a crash loop), which keeps the cut it read.

Usage: python perf/crash_before_cut.py N K [--no-cut] [--after-crash]   (the store lives in a temporary directory,
removed after)
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
print("open", st.recovery.cq_vouched, round(st.recovery.seconds, 2), flush=True)
for t in range(int(sys.argv[2])):
    st.put("t%d" % t, b"y" * 100, queue_id=1)
assert st.wait_for_dispatch(60)
print("ready", flush=True)
time.sleep(3600)
"""

FIRST = """
import os, sys, time, localmq
root, n = sys.argv[1], int(sys.argv[2])
st = localmq.open(root, mapped_file_size_commit_log=64 << 20, flush_consume_queue_thorough_interval=1000)
for t in range(n):
    for q in range(4):
        st.put("t%d" % t, b"x" * 100, queue_id=q)
assert st.wait_for_dispatch(600)
running = os.path.join(root, "config", "queues.running")
seen, last = 0, None
while seen < 2:  # two cuts written after the dispatch caught up: the second was taken after it
    ino = os.stat(running).st_ino if os.path.exists(running) else None
    seen, last = seen + (ino is not None and ino != last and last is not None), ino
    time.sleep(0.05)
print("ready", flush=True)
time.sleep(3600)
"""


def killed(env, code, *args) -> list:
    """Run ``python -c code args``, read its lines up to "ready", SIGKILL it; returns the lines before "ready"."""
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            if line.strip() == "ready":
                break
            lines.append(line.strip())
        else:
            raise AssertionError(f"no ready line: {lines}")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()  # type: ignore[union-attr]
    return lines


def main() -> None:
    import localmq

    n, k = int(sys.argv[1]), int(sys.argv[2])
    root = tempfile.mkdtemp(prefix="lmq-crash-before-cut-")
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        t0 = time.monotonic()
        if "--after-crash" in sys.argv:
            killed(env, FIRST, root, str(n))
            print(f"{n * 4} queues written, two cuts after the dispatch, SIGKILL: {time.monotonic() - t0:.1f} s")
        else:
            with localmq.open(root, **KW) as st:
                for t in range(n):
                    for q in range(4):
                        st.put(f"t{t}", b"x" * 100, queue_id=q)
                st.wait_for_dispatch(600)
            print(f"{n * 4} queues written and closed in {time.monotonic() - t0:.1f} s", flush=True)
        opened = killed(env, CHILD, root, str(k))[0].split()
        assert opened[0] == "open", opened
        print(f"child's open: {opened[2]} s, {opened[1]} queues vouched; {k} queues written, SIGKILL", flush=True)
        running = os.path.join(root, "config", "queues.running")
        print(f"first cut kept: {os.path.exists(running)}")
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
