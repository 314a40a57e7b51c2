"""Peers of perf/many_queues.py (issue 27): the same workload, N topics x 4 queues, one 100-byte message per queue,
in sqlite3 and in RocketMQ 4.9.8's DefaultMessageStore, with the same figures. Each phase runs in a fresh process.

- ``sqlite``: one database file (stdlib sqlite3), one table ``msg(topic TEXT, queue INTEGER, qoffset INTEGER, body
  BLOB)`` with a UNIQUE index on (topic, queue, qoffset) (a rowid table plus a separate index), ``journal_mode=WAL``
  and ``synchronous=NORMAL`` (no fsync per commit: the durability of localmq's default ASYNC_FLUSH; perf/peers.py's
  sqlite3 peer uses the same). ``write``: connect and create the table and index (open), then a put to every queue
  as a queue would do it: its next offset from the index (``SELECT coalesce(max(qoffset) + 1, 0) ... WHERE topic = ?
  AND queue = ?``), then the INSERT, each put committed on its own (autocommit); the ``sqlite (one transaction)`` row
  does the same puts inside one BEGIN ... COMMIT. ``reopen``: connect until a first query can run (``SELECT 1``,
  which does not read the schema: the first read of the table does, inside "read every queue"), then every queue's
  message read back by (topic, queue, offset 0) and checked. There is no dispatch: the index is written by the
  INSERT. The close of the last connection checkpoints the WAL into the database file and deletes the WAL.
- ``rocketmq``: interop/bench's ManyQueuesBench (Java; its class comment has the store settings: the defaults, so
  ConsumeQueue files of 6,000,000 bytes, except a 64 MiB CommitLog segment), one JVM per phase. ``write``: a store
  on an empty directory (constructor + load() + start()), putMessage to every queue, wait until the ConsumeQueue
  dispatch caught up (``dispatchBehindBytes() == 0``), shutdown(). ``reopen``: constructor + load() + start() over
  the same directory, then getMessage of offset 0 of every queue, decoded and checked, then shutdown(). The jar is
  built with Maven first when missing or older than its sources (as perf/test_jvm_bench.py does), and run with
  perf/test_jvm_bench.py's JVM flags (-Xmx512m, the --add-opens RocketMQ needs). A phase that cannot complete (a
  ConsumeQueue file that cannot be created or mapped, dispatch making no progress for ``--stall-s`` seconds) is
  reported with how far it got and RocketMQ's error lines, not raised.

Figures, as perf/many_queues.py's: the open (time until the store can serve), the first put to every queue plus its
dispatch (and per queue, in microseconds), the close, the descriptors and mappings the process holds beyond those it
held before opening (after the puts / after the reads), its RSS growth, and the store's disk use (``du``, after both
phases; ``du --apparent-size`` too, since RocketMQ's ConsumeQueue files are sparse).

Usage: python perf/many_queues_peers.py sqlite|rocketmq|all N [N ...]   (N topics; issue 27's sizes: 2500 25000)
Prints a Markdown table with perf/many_queues.py's columns (plus the store's name), one JSON line per run on stderr.
The stores live in temporary directories (TMPDIR chooses the filesystem), removed after. Options: ``--timeout S``
per phase (default 1200), ``--stall-s S`` (RocketMQ's dispatch, default 60: longer than the 30 one-second retries
of a ConsumeQueue that cannot be written, so that the store's own outcome is seen).
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from many_queues import BODY, TOPIC_QUEUES, _du, _held  # perf/ (this script's directory)
from proc_stats import fds, maps, rss_kib

PERF = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PERF)
BENCH = os.path.join(ROOT, "interop", "bench")
POM = os.path.join(BENCH, "pom.xml")
JAR = os.path.join(BENCH, "target", "jvm-bench.jar")
JAVA_CLASS = "localmq.interop.ManyQueuesBench"

SQL_NEXT = "SELECT coalesce(max(qoffset) + 1, 0) FROM msg WHERE topic = ? AND queue = ?"
SQL_PUT = "INSERT INTO msg (topic, queue, qoffset, body) VALUES (?, ?, ?, ?)"
SQL_GET = "SELECT body FROM msg WHERE topic = ? AND queue = ? AND qoffset = ?"


def _base() -> dict:
    return {"fds": fds(), "maps": maps(), "rss_kib": rss_kib()}


def sqlite_phase(kind: str, root: str, n_topics: int, batch: bool = False) -> dict:
    """One sqlite3 phase in this process: ``write`` (create, first put to every queue, close) or ``reopen``."""
    import sqlite3

    base = _base()
    out: dict = {"sqlite": sqlite3.sqlite_version}
    t = time.perf_counter()
    db = sqlite3.connect(os.path.join(root, "msg.db"), isolation_level=None)  # autocommit: a transaction per put
    db.execute("PRAGMA synchronous=NORMAL")  # per connection; journal_mode=WAL is kept by the database file
    if kind == "write":
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE msg (topic TEXT NOT NULL, queue INTEGER NOT NULL, qoffset INTEGER NOT NULL, body BLOB)"
        )
        db.execute("CREATE UNIQUE INDEX msg_queue ON msg (topic, queue, qoffset)")
    else:
        db.execute("SELECT 1").fetchone()
    out["open_s"] = time.perf_counter() - t
    try:
        execute = db.execute
        if kind == "write":
            out["plan_next_offset"] = [r[-1] for r in execute("EXPLAIN QUERY PLAN " + SQL_NEXT, ("t0", 0))]
            t = time.perf_counter()
            if batch:
                execute("BEGIN")
            for i in range(n_topics):
                topic = "t%d" % i
                for q in range(TOPIC_QUEUES):
                    (offset,) = execute(SQL_NEXT, (topic, q)).fetchone()
                    execute(SQL_PUT, (topic, q, offset, BODY))
            if batch:
                execute("COMMIT")
            out["put_dispatch_s"] = time.perf_counter() - t
            out["us_per_queue"] = out["put_dispatch_s"] * 1e6 / (n_topics * TOPIC_QUEUES)
        else:
            out["after_open"] = _held(base)
            out["journal_mode"] = execute("PRAGMA journal_mode").fetchone()[0]  # untimed, after the open's figures
            t = time.perf_counter()
            for i in range(n_topics):
                topic = "t%d" % i
                for q in range(TOPIC_QUEUES):
                    row = execute(SQL_GET, (topic, q, 0)).fetchone()
                    if row is None or row[0] != BODY:
                        raise RuntimeError(f"{topic}/{q}: {row!r}")
            out["read_all_s"] = time.perf_counter() - t
        out.update(_held(base))
    finally:
        t = time.perf_counter()
        db.close()
        out["close_s"] = time.perf_counter() - t
    out["after_close"] = _held(base)
    return out


def _du_apparent(root: str) -> int:
    r = subprocess.run(["du", "-sk", "--apparent-size", root], capture_output=True, text=True, check=True)
    return int(r.stdout.split()[0])


def run_sqlite(n_topics: int, batch: bool, timeout: float) -> dict:
    root = tempfile.mkdtemp(prefix="sqlite-many-queues-")
    try:
        res = {
            "store": "sqlite3 (one transaction)" if batch else "sqlite3",
            "topics": n_topics,
            "queues": n_topics * TOPIC_QUEUES,
            "load_avg": os.getloadavg(),
        }
        for kind in ("write", "reopen"):
            cmd = [sys.executable, os.path.abspath(__file__), "--phase", "sqlite", kind, root, str(n_topics)]
            if batch:
                cmd.append("--batch")
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"sqlite {kind} phase failed:\n{p.stderr[-4000:]}")
            res[kind] = json.loads(p.stdout.strip().splitlines()[-1])
        res["du_kib"] = _du(root)
        res["du_apparent_kib"] = _du_apparent(root)
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def jvm_flags() -> list:
    """perf/test_jvm_bench.py's JVM_FLAGS, read from its source (importing it would import pytest and the peers)."""
    with open(os.path.join(PERF, "test_jvm_bench.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "JVM_FLAGS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("perf/test_jvm_bench.py has no JVM_FLAGS")


def build_jar() -> None:
    """``mvn -q -B package`` of interop/bench when the jar is missing or older than the pom or a source file."""
    newest = os.path.getmtime(POM)
    for d, _, files in os.walk(os.path.join(BENCH, "src")):
        for name in files:
            newest = max(newest, os.path.getmtime(os.path.join(d, name)))
    if os.path.exists(JAR) and os.path.getmtime(JAR) >= newest:
        return
    mvn = shutil.which("mvn")
    if mvn is None or shutil.which("java") is None:
        raise RuntimeError("the rocketmq peer needs a JDK 17 (`java`) and Maven (`mvn`) on PATH")
    r = subprocess.run([mvn, "-q", "-B", "-f", POM, "package"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not os.path.exists(JAR):
        tail = f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        raise RuntimeError(f"`mvn -q -B -f {POM} package` failed ({r.returncode}):\n{tail}")


def _error_lines(stderr: str) -> dict:
    """RocketMQ's error lines and exceptions from a phase's stderr: how many, the first and the last few."""
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if any(k in line for k in (" ERROR ", "[BUG]", "Exception", "Error", "Too many open files", "Map failed"))
    ]
    kinds = ("Too many open files", "Map failed", "consume queue can not write", "failed, retry")
    counts = {k: sum(k in line for line in lines) for k in kinds}
    return {"count": len(lines), "counts": counts, "first": lines[:4], "last": lines[-4:] if len(lines) > 4 else []}


def run_rocketmq(n_topics: int, timeout: float, stall_s: float) -> dict:
    build_jar()
    java = shutil.which("java")
    flags = jvm_flags()
    root = tempfile.mkdtemp(prefix="rocketmq-many-queues-")
    try:
        res = {"store": "RocketMQ DefaultMessageStore", "topics": n_topics, "queues": n_topics * TOPIC_QUEUES}
        res["load_avg"] = os.getloadavg()
        for kind in ("write", "reopen"):
            cmd = [java, *flags, "-cp", JAR, JAVA_CLASS, kind, root, str(n_topics), "--stall-s", str(stall_s)]
            t = time.perf_counter()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
                res[kind] = {"status": "timeout", "error": f"no result within {timeout:.0f} s"}
                res[kind]["log"] = _error_lines(err)
                break
            docs = [line for line in p.stdout.splitlines() if line.startswith("{")]
            doc = json.loads(docs[-1]) if docs else {"status": "error", "error": p.stderr.strip()[-2000:]}
            doc["rc"] = p.returncode
            doc["process_s"] = time.perf_counter() - t  # the whole JVM, start-up and exit included
            doc["log"] = _error_lines(p.stderr)
            res[kind] = doc
        res["du_kib"] = _du(root)
        res["du_apparent_kib"] = _du_apparent(root)
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cell(doc: dict, key: str, fmt: str = "{:.2f} s") -> str:
    v = doc.get(key)
    return "—" if v is None or v == -1 else fmt.format(v)


def _why(doc: dict) -> str:
    """The system error behind a failed RocketMQ phase, from its log, e.g. " (Too many open files)"."""
    counts = doc.get("log", {}).get("counts", {})
    return "".join(f" ({k})" for k in ("Too many open files", "Map failed") if counts.get(k))


def row(r: dict) -> str:
    w, o = r.get("write", {}), r.get("reopen", {})
    if w.get("status", "ok") == "ok":
        put = f"{w['put_dispatch_s']:.2f} s ({w['us_per_queue']:.0f} µs/queue)"
    elif w.get("queues_dispatched") is not None:
        put = f"{w['status']} after {w['put_dispatch_s']:.0f} s: {w['queues_dispatched']:,} queues dispatched{_why(w)}"
    else:
        put = f"{w.get('status')}: {w.get('error', '')}"
    if o.get("status", "ok") != "ok":
        took = f" after {o['load_s']:.0f} s" if "load_s" in o else ""
        reopen = f"{o.get('status')}{took}: {o.get('error', '')}{_why(o)}"
    elif "load_s" in o:
        reopen = f"{o['open_s']:.2f} s (load {o['load_s']:.2f} s + start {o['start_s']:.2f} s)"
    else:
        reopen = f"{o['open_s']:.3f} s (connect + SELECT 1)"
    disk = f"{r['du_kib'] / 1024:.0f} MiB"
    if r["du_apparent_kib"] > 2 * r["du_kib"]:
        disk += f" (apparent {r['du_apparent_kib'] / 1024 / 1024:.1f} GiB)"

    def pair(key: str, scale: float = 1, unit: str = "") -> str:
        f = []
        for d in (w, o):
            v = d.get(key)
            if v == -1 and key == "fds" and d.get("fd_limit", -1) > 0:
                f.append(f"all ({d['fd_limit']:,}, the limit)")  # /proc/self/fd could not even be listed
            else:
                f.append("—" if v is None or v == -1 else f"{v / scale:,.0f}")
        return f"{f[0]} / {f[1]}{unit}"

    return (
        f"| {r['store']} | {r['queues']:,} | {put} | {reopen} | — | {_cell(o, 'read_all_s')} | {pair('fds')} | "
        f"{pair('maps')} | {pair('rss_kib', 1024, ' MiB')} | {disk} |"
    )


def main(argv) -> None:
    if argv and argv[0] == "--phase":
        print(json.dumps(sqlite_phase(argv[2], argv[3], int(argv[4]), batch="--batch" in argv)))
        return
    opts = {"--timeout": 1200.0, "--stall-s": 60.0}
    for k in opts:
        if k in argv:
            i = argv.index(k)
            opts[k] = float(argv[i + 1])
            del argv[i : i + 2]
    if not argv or argv[0] not in ("sqlite", "rocketmq", "all"):
        sys.exit(__doc__)
    peer, sizes = argv[0], [int(a) for a in argv[1:]] or [2500]
    print(
        "| store | queues (topics x 4) | first put + dispatch | reopen (recovery) | reopen, every queue checked | "
        "read every queue | fds held | mappings | RSS growth | disk |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        runs = []
        if peer in ("sqlite", "all"):
            runs += [(run_sqlite, n, False, opts["--timeout"]), (run_sqlite, n, True, opts["--timeout"])]
        if peer in ("rocketmq", "all"):
            runs.append((run_rocketmq, n, opts["--timeout"], opts["--stall-s"]))
        for fn, *args in runs:
            r = fn(*args)
            print(row(r), flush=True)
            print("  " + json.dumps(r), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
