"""The open after a crash with many queues (issue 27): N topics x 4 queues, one 100-byte message per queue, then
the running store's cut (config/queues.running, written by the queue flush's thorough pass), then K topics written
again (one queue each) and K/4 new topics, then SIGKILL. The reopen is timed twice, each after its own write and
crash: with the cut, and with the cut deleted before the open (every queue read and checked, as an open after a
crash did before the running snapshot). After each open every queue's messages are read back and counted.

``--shared``: every open is ``shared=True``; the write phase fills the store and closes it cleanly, then opens it
again (its first opener: every queue a snapshot row, handed over to the housekeeper's cuts) before the cut, the
writes after it and the SIGKILL.

Usage: python perf/crash_reopen.py [N ...] [--touched K] [--shared]   (default: 2000 topics, K = 1% of N, >= 1)
(measures the localmq of the checkout it lives in; the stores live in temporary directories, removed after.)
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOPIC_QUEUES = 4
BODY, AGAIN, NEW = b"x" * 100, b"y" * 100, b"z" * 100
THOROUGH_MS = 5000  # the cut's period here (default 60 s): the write phase waits for a cut taken after its puts


def _wait_for_cut(root: str, after: float) -> None:
    """Until a cut taken after ``after`` is written: the second queues.running written after that time."""
    path = os.path.join(root, "config", "queues.running")
    seen = set()
    deadline = time.monotonic() + 600
    while len(seen) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("no running snapshot written")
        try:
            st = os.stat(path)
            if st.st_mtime > after:
                seen.add(st.st_ino)
        except FileNotFoundError:
            pass
        time.sleep(0.05)


def write(root: str, n: int, k: int, shared: bool) -> dict:
    import localmq

    st = localmq.open(root, flush_consume_queue_thorough_interval=THOROUGH_MS, shared=shared)
    t = time.perf_counter()
    for i in range(n):
        for q in range(TOPIC_QUEUES):
            st.put(f"t{i}", BODY, queue_id=q)
    if not st.wait_for_dispatch(3600):
        raise RuntimeError("dispatch did not finish")
    out = {"put_dispatch_s": time.perf_counter() - t}
    if shared:  # closed and opened again: the queues are the snapshot's rows, handed over to the housekeeper
        st.close()
        t = time.perf_counter()
        st = localmq.open(root, flush_consume_queue_thorough_interval=THOROUGH_MS, shared=True)
        out["clean_reopen_s"] = time.perf_counter() - t
    _wait_for_cut(root, time.time())
    for i in range(k):
        st.put(f"t{i}", AGAIN, queue_id=i % TOPIC_QUEUES)
    for i in range(max(1, k // 4)):
        st.put(f"new{i}", NEW, queue_id=0)
    if not st.wait_for_dispatch(60):
        raise RuntimeError("dispatch did not finish")
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return out  # (never)


def reopen(root: str, n: int, k: int, with_cut: bool, shared: bool) -> dict:
    import localmq

    if not with_cut:
        os.unlink(os.path.join(root, "config", "queues.running"))
    t = time.perf_counter()
    st = localmq.open(root, shared=shared)
    out = {"open_s": time.perf_counter() - t}
    try:
        r = st.recovery
        out.update(mode=r.mode, recovery_s=r.seconds, vouched=r.cq_vouched, built=st.stats()["consume_queues_built"])
        bad = 0
        for i in range(n):
            for q in range(TOPIC_QUEUES):
                want = [BODY] + ([AGAIN] if i < k and q == i % TOPIC_QUEUES else [])
                bad += [bytes(m.body) for m in st.get_message(f"t{i}", q, 0, 4).messages] != want
        for i in range(max(1, k // 4)):
            bad += [bytes(m.body) for m in st.get_message(f"new{i}", 0, 0, 4).messages] != [NEW]
        out["queues_wrong"] = bad
    finally:
        st.close()
    return out


def _phase(*args) -> dict:
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--phase", *map(str, args)], capture_output=True, text=True
    )
    lines = p.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"phase {args[0]} failed:\n{p.stderr[-4000:]}")
    return json.loads(lines[-1])


def run(n: int, k: int, shared: bool) -> dict:
    res: dict = {"topics": n, "queues": n * TOPIC_QUEUES, "touched": k, "shared": shared}
    for with_cut in (True, False):
        root = tempfile.mkdtemp(prefix="localmq-crash-reopen-")
        try:
            res.setdefault("write", _phase("write", root, n, k, int(shared)))
            res["with_cut" if with_cut else "without_cut"] = _phase("reopen", root, n, k, int(shared), int(with_cut))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return res


def main(argv) -> None:
    k = None
    shared = "--shared" in argv
    argv = [a for a in argv if a != "--shared"]
    if "--touched" in argv:
        i = argv.index("--touched")
        k = int(argv[i + 1])
        del argv[i : i + 2]
    if argv and argv[0] == "--phase":
        kind, root, n, kk, sh = argv[1], argv[2], int(argv[3]), int(argv[4]), bool(int(argv[5]))
        if kind == "write":
            write(root, n, kk, sh)
        else:
            print(json.dumps(reopen(root, n, kk, bool(int(argv[6])), sh)))
        return
    print(
        "| queues | written after the cut | reopen after SIGKILL, with the cut | without it | queues vouched / built |"
    )
    print("|---|---|---|---|---|")
    for n in [int(a) for a in argv] or [2000]:
        kk = k if k is not None else max(1, n // 100)
        r = run(n, kk, shared)
        w, wo = r["with_cut"], r["without_cut"]
        if w["queues_wrong"] or wo["queues_wrong"]:
            raise RuntimeError(f"messages wrong after the reopen: {r}")
        print(
            f"| {r['queues']:,} | {kk:,} queues + {max(1, kk // 4):,} new | {w['open_s']:.2f} s "
            f"({w['recovery_s']:.2f} s) | {wo['open_s']:.2f} s ({wo['recovery_s']:.2f} s) | "
            f"{w['vouched']:,} / {w['built']:,} |",
            flush=True,
        )
        print("  " + json.dumps(r), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
