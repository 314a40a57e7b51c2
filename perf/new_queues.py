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
* ``apart``: as ``beside``, but the watcher is another process (no GIL shared with the store): it maps the busy
  queue's ConsumeQueue file read-only and polls, 0.1 ms apart, for each next unit's size field; the wait runs from
  the put's start to the poll that saw the unit (CLOCK_MONOTONIC in both processes), so a figure includes the put
  itself and up to one poll interval (plus the watcher's own scheduling delays on a 2-core machine).
* ``alone``: ``apart`` without the new queues (only the busy queue's puts, 0.2 ms apart): the machine's own tail.

Usage: python perf/new_queues.py [N] [ROUNDS] [KIND...]   (default 4000 queues, 2 rounds of each mode, every kind;
stores in /tmp)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial

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


def watch_units(path: str, n: int) -> None:
    """The ``apart`` watcher (its own process): the CLOCK_MONOTONIC time (ns) at which units 1..n of the queue file
    at ``path`` were first seen written (their size field non-zero), one JSON list on stdout."""
    import mmap
    import struct

    unit = 20  # a ConsumeQueue unit: commit log offset (8), size (4), tags code (8)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    size_at = struct.Struct(">i").unpack_from
    seen = [0] * (n + 1)  # the poll that saw unit k written
    before = [0] * (n + 1)  # the poll before it, which did not: unit k was written in (before[k], seen[k]]
    k = 1
    print("ready", flush=True)
    deadline = time.monotonic() + 3600
    last = time.monotonic_ns()
    while k <= n and time.monotonic() < deadline:
        if size_at(m, k * unit + 8)[0]:
            now = time.monotonic_ns()
            while k <= n and size_at(m, k * unit + 8)[0]:
                seen[k] = now
                before[k] = last
                k += 1
        else:
            time.sleep(0.0001)
        last = time.monotonic_ns()
    print(json.dumps([seen, before]))


def apart(root: str, n: int, maker: bool, new_queues: bool = True) -> dict:
    st = _open(root, maker)
    try:
        st.put("busy", BODY)
        if not st.wait_for_dispatch(60):
            raise RuntimeError("dispatch did not finish")
        path = os.path.join(root, "consumequeue", "busy", "0", "0" * 20)
        w = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--watch", path, str(n)], stdout=subprocess.PIPE, text=True
        )
        try:
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError("the watcher did not start")
            put_t = [0] * (n + 1)
            put_end = [0] * (n + 1)
            for i in range(n):
                if new_queues:
                    st.put("n%d" % (i // 4), BODY, queue_id=i % 4)
                put_t[i + 1] = time.monotonic_ns()
                st.put("busy", BODY)
                put_end[i + 1] = time.monotonic_ns()
                time.sleep(0.0002)
            seen, before = json.loads(w.stdout.readline())
        finally:
            w.wait(3600)
        if not st.wait_for_dispatch(3600):
            raise RuntimeError("dispatch did not finish")
    finally:
        st.close()
    if not all(seen[1:]):
        raise RuntimeError("the watcher did not see every unit")
    # at most: the poll that saw it; at least: the poll before it (0 when the unit was there before that poll)
    hi = sorted((seen[k] - put_t[k]) / 1e6 for k in range(1, n + 1))
    lo = sorted(max(0, before[k] - put_t[k]) / 1e6 for k in range(1, n + 1))
    put = sorted((put_end[k] - put_t[k]) / 1e6 for k in range(1, n + 1))
    out = {"put_p99_ms": put[int(n * 0.99)], "put_max_ms": put[-1]}
    for name, d in (("at_most", hi), ("at_least", lo)):
        out.update({f"{name}_p50_ms": d[n // 2], f"{name}_p99_ms": d[int(n * 0.99)], f"{name}_max_ms": d[-1]})
        out[f"{name}_over_1ms"] = sum(1 for x in d if x > 1.0)
    return out


def main(argv) -> None:
    if argv and argv[0] == "--watch":
        watch_units(argv[1], int(argv[2]))
        return
    if argv and argv[0] == "--child":
        kind, root, n, maker = argv[1], argv[2], int(argv[3]), argv[4] == "on"
        kinds = {"burst": burst, "beside": beside, "apart": apart, "alone": partial(apart, new_queues=False)}
        print(json.dumps(kinds[kind](root, n, maker)))
        return
    n = int(argv[0]) if argv else 4000
    rounds = int(argv[1]) if len(argv) > 1 else 2
    kinds = argv[2:] or ["burst", "beside", "apart", "alone"]
    print(f"{n} new queues (topics x 4), one 100-byte message each; maker on/off alternating, {rounds} rounds")
    for r in range(rounds):
        for kind in kinds:
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
