"""What many queues cost (issue 27): N topics x 4 queues, one 100-byte message per queue, in an exclusive store with
the default settings. For each N: the first put to every queue plus its dispatch, a clean close, then a reopen
(queues taken from the queue snapshot the close wrote), then a reopen without it (every queue read and checked);
after each, the file descriptors and mappings the process holds (beyond those it held before opening), its RSS
growth and the store's disk use (``du``). Each phase runs in a fresh process, so the figures are the store's own.

Usage: python perf/many_queues.py [N ...]   (default: 500 2000; issue 27's target is 25000)
(measures the localmq of the checkout it lives in; the stores live in temporary directories, removed after;
``--rlimit-nofile K`` runs the phases under that limit; ``--shared`` opens the store with ``shared=True``, the
multi-process mode, whose control file's disk is counted with the store's.)
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

# the localmq of this checkout, whatever else is installed
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from proc_stats import fds, maps, rss_kib  # noqa: E402 - perf/ (this script's directory)

TOPIC_QUEUES = 4
BODY = b"x" * 100


def _held(base: dict) -> dict:
    return {"fds": fds() - base["fds"], "maps": maps() - base["maps"], "rss_kib": rss_kib() - base["rss_kib"]}


def phase(kind: str, root: str, n_topics: int, shared: bool = False) -> dict:
    """One phase in this process: ``write`` (open, first put to every queue, dispatch, close) or ``reopen``."""
    import localmq

    base = {"fds": fds(), "maps": maps(), "rss_kib": rss_kib()}
    out: dict = {}
    if kind == "reopen-checked":  # without the queue snapshot of the last close: every queue read and checked
        snap = os.path.join(root, "config", "queues.snapshot")
        out["had_snapshot"] = os.path.exists(snap)
        if out["had_snapshot"]:
            os.unlink(snap)
    t = time.perf_counter()
    st = localmq.open(root, shared=shared)
    out["open_s"] = time.perf_counter() - t
    try:
        if kind == "write":
            t = time.perf_counter()
            for i in range(n_topics):
                topic = "t%d" % i
                for q in range(TOPIC_QUEUES):
                    st.put(topic, BODY, queue_id=q)
            out["put_s"] = time.perf_counter() - t
            if not st.wait_for_dispatch(3600):
                raise RuntimeError("dispatch did not finish")
            out["put_dispatch_s"] = time.perf_counter() - t
        else:
            out["after_open"] = _held(base)  # before any queue is used: idle queues (built on first use)
            check = getattr(st, "_handover", None)  # a shared first opener checks its rows on a thread after its open
            if check is not None:
                check.join()
                # until then other processes wait to open the store
                out["rows_checked_s"] = time.perf_counter() - t
            out["recovery_s"] = st.recovery.seconds
            out["cq_vouched"] = st.recovery.cq_vouched
            out["recovery_mode"] = st.recovery.mode  # "abnormal": the last close was not clean
            # every queue reads back its one message
            t = time.perf_counter()
            for i in range(n_topics):
                for q in range(TOPIC_QUEUES):
                    r = st.get_message("t%d" % i, q, 0, 1)
                    if len(r.messages) != 1 or bytes(r.messages[0].body) != BODY:
                        raise RuntimeError(f"t{i}/{q}: {r}")
            out["read_all_s"] = time.perf_counter() - t
        out.update(_held(base))
    finally:
        t = time.perf_counter()
        st.close()
        out["close_s"] = time.perf_counter() - t
    out["after_close"] = _held(base)
    return out


def _du(root: str) -> int:
    return int(subprocess.run(["du", "-sk", root], capture_output=True, text=True, check=True).stdout.split()[0])


def checked(reopen: dict) -> str:
    """A shared reopen: when its rows were checked (other processes open the store from then on)."""
    return f"; rows checked at {reopen['rows_checked_s']:.2f} s" if "rows_checked_s" in reopen else ""


def run(n_topics: int, rlimit=None, shared=False) -> dict:
    root = tempfile.mkdtemp(prefix="localmq-many-queues-")
    try:
        res = {"topics": n_topics, "queues": n_topics * TOPIC_QUEUES, "shared": shared}
        for kind in ("write", "reopen", "reopen-checked"):
            cmd = [sys.executable, os.path.abspath(__file__), "--phase", kind, root, str(n_topics)]
            if rlimit:
                cmd += ["--rlimit-nofile", str(rlimit)]
            if shared:
                cmd.append("--shared")
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"{kind} phase failed:\n{p.stderr[-4000:]}")
            res[kind] = json.loads(p.stdout.strip().splitlines()[-1])
            # why a snapshot was not written or not used, when that happened (the store logs it as a warning)
            res[kind]["snapshot_log"] = [line for line in p.stderr.splitlines() if "snapshot" in line][-3:]
        res["du_kib"] = _du(root)
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv) -> None:
    rlimit = None
    shared = "--shared" in argv
    argv = [a for a in argv if a != "--shared"]
    if "--rlimit-nofile" in argv:
        i = argv.index("--rlimit-nofile")
        rlimit = int(argv[i + 1])
        del argv[i : i + 2]
    if argv and argv[0] == "--phase":
        if rlimit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (rlimit, rlimit))
        print(json.dumps(phase(argv[1], argv[2], int(argv[3]), shared)))
        return
    sizes = [int(a) for a in argv] or [500, 2000]
    print(
        "| queues (topics x 4) | first put + dispatch | reopen (recovery) | reopen, every queue checked | "
        "read every queue | fds held | mappings | RSS growth (write / reopen: idle, every queue read) | disk |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        r = run(n, rlimit, shared)
        w, o, c = r["write"], r["reopen"], r["reopen-checked"]
        print(
            f"| {r['queues']:,} | {w['put_dispatch_s']:.2f} s | {o['open_s']:.2f} s ({o['recovery_s']:.2f} s, "
            f"{o['cq_vouched']:,} from the snapshot{checked(o)}) | {c['open_s']:.2f} s ({c['recovery_s']:.2f} s) | "
            f"{o['read_all_s']:.2f} s | {w['fds']:,} / {o['fds']:,} | {w['maps']:,} / {o['maps']:,} | "
            f"{w['rss_kib'] / 1024:.0f} / {o['after_open']['rss_kib'] / 1024:.0f}, {o['rss_kib'] / 1024:.0f} MiB | "
            f"{r['du_kib'] / 1024:.0f} MiB |",
            flush=True,
        )
        print("  " + json.dumps(r), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
