"""Durability benchmarks: SYNC_FLUSH group commit with 1, 4 and 16 producer threads beside sqlite3 (WAL,
synchronous=FULL, one transaction per message), lmdb (sync=True, one write transaction per message) and the raw
ceiling of one pwrite + fdatasync per message, in the same run; and ASYNC_FLUSH put latency percentiles across
many segment rolls, with and without allocation ahead and warm-up.

    python -m pytest perf/test_durability_bench.py --benchmark-only -q -p no:cacheprovider -s
"""

import os
import sqlite3
import struct
import threading
import time

import pytest

import report
from conftest import QUICK, ROWS

localmq = pytest.importorskip("localmq")

THREADS = [1, 4, 16]
SYNC_MESSAGES = 600 if QUICK else 8000  # per round, split over the threads
SYNC_ROUNDS = 1 if QUICK else 3
BODY = 100
_KEY = struct.Struct(">Q")


class SyncLocalMQ:
    name = "localmq SYNC_FLUSH"

    def open(self, d):
        self.st = localmq.open(d, flush_disk_type="SYNC_FLUSH")
        return self

    def worker(self, k):
        put = self.st.put

        def send(body):
            r = put("sync", body, queue_id=k)
            if not r.ok:
                raise AssertionError(r)

        return send

    def count(self):
        self.st.wait_for_dispatch()
        return sum(self.st.max_offset("sync", q) for q in self.st.topics().get("sync", []))

    def close(self):
        self.st.close()


class SqliteFull:
    name = "sqlite3 WAL FULL"

    def open(self, d):
        self.path = os.path.join(d, "q.db")
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        db.close()
        self.conns = []
        return self

    def worker(self, k):
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=60)
        db.execute("PRAGMA synchronous=FULL")
        self.conns.append(db)
        execute = db.execute

        def send(body):
            execute("INSERT INTO q (body) VALUES (?)", (body,))  # autocommit: one fsynced transaction each

        return send

    def count(self):
        db = sqlite3.connect(self.path)
        n = db.execute("SELECT count(*) FROM q").fetchone()[0]
        db.close()
        return n

    def close(self):
        for c in self.conns:
            c.close()


class LmdbSync:
    name = "lmdb sync=True"

    def open(self, d):
        import lmdb

        self.env = lmdb.open(str(d), map_size=1 << 30, sync=True)
        self.lock = threading.Lock()
        self.next_key = 0
        return self

    def worker(self, k):
        env = self.env
        lock = self.lock
        pack = _KEY.pack

        def send(body):
            with lock:  # the key counter; lmdb serialises write transactions anyway
                key = self.next_key
                self.next_key += 1
            with env.begin(write=True) as txn:
                txn.put(pack(key), body)

        return send

    def count(self):
        with self.env.begin() as txn:
            return txn.stat()["entries"]

    def close(self):
        self.env.close()


class FdatasyncCeiling:
    """Not a queue: one thread writing with pwrite + fdatasync per message into a pre-allocated file (what one
    flush per put costs at best)."""

    name = "pwrite+fdatasync (1 thread ceiling)"

    def open(self, d):
        self.fd = os.open(os.path.join(d, "log"), os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(self.fd, 0, 64 << 20)  # pre-sized like a segment: no size change to journal per sync
        self.pos = 0
        self.n = 0
        self.lock = threading.Lock()
        return self

    def worker(self, k):
        def send(body):
            with self.lock:
                os.pwrite(self.fd, body, self.pos)
                self.pos += len(body)
                os.fdatasync(self.fd)
                self.n += 1

        return send

    def count(self):
        return self.n

    def close(self):
        os.close(self.fd)


SYNC_IMPLS = {c.name: c for c in (SyncLocalMQ, SqliteFull, LmdbSync, FdatasyncCeiling)}


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("impl", list(SYNC_IMPLS))
def test_sync_put(benchmark, request, tmp_path, impl, threads):
    """Scenario: every put is durable before it returns; `threads` producers share the store."""
    if impl.startswith("pwrite") and threads != 1:
        pytest.skip("the ceiling is a single-thread reference")
    cls = SYNC_IMPLS[impl]
    per = SYNC_MESSAGES // threads
    body = os.urandom(BODY)
    state = {"round": 0}

    def setup():
        state["round"] += 1
        d = tmp_path / f"r{state['round']}"
        d.mkdir()
        store = cls().open(d)
        senders = [store.worker(k) for k in range(threads)]
        return (store, senders), {}

    def run(store, senders):
        errors = []

        def loop(send):
            try:
                for _ in range(per):
                    send(body)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        ts = [threading.Thread(target=loop, args=(s,)) for s in senders]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]

    def teardown(store, senders):
        try:
            assert store.count() == per * threads  # everything acknowledged is there
        finally:
            store.close()

    benchmark.pedantic(run, setup=setup, teardown=teardown, rounds=SYNC_ROUNDS, warmup_rounds=0)
    info = benchmark.extra_info
    name = "localmq" if cls is SyncLocalMQ else impl  # the reference of the ratio column
    info.update(
        scenario=f"sync_put_{threads}_threads",
        body_size=BODY,
        implementation=name,
        messages=per * threads,
        body_bytes=per * threads * BODY,
        how=f"{threads} threads, one put each",
    )
    request.config.stash[ROWS].append(report.row_from_extra_info(info, benchmark.stats.stats.median))


# -- ASYNC_FLUSH put latency across segment rolls ------------------------------------------------------------------

LAT_SEGMENT = (4 << 20) if QUICK else (32 << 20)
LAT_BODY = 1024
LAT_MESSAGES = 20_000 if QUICK else 400_000  # ~12 segment rolls of 32 MiB in the full run
LAT_CONFIGS = {
    "no allocation ahead": dict(preallocate_mapped_file=False),
    "allocation ahead": dict(),
    "allocation ahead + warm": dict(warm_mapped_file_enable=True),
}


@pytest.mark.parametrize("config", list(LAT_CONFIGS))
def test_put_latency_across_rolls(benchmark, tmp_path, config):
    body = os.urandom(LAT_BODY)
    lat = []
    state = {"round": 0}

    def setup():
        state["round"] += 1
        d = tmp_path / f"r{state['round']}"
        st = localmq.open(d, mapped_file_size_commit_log=LAT_SEGMENT, **LAT_CONFIGS[config])
        st.put("lat", body)
        time.sleep(0.5 if not QUICK else 0.05)  # let the allocator create (and warm) the next segments
        return (st,), {}

    def run(st):
        import numpy as np

        ns = np.empty(LAT_MESSAGES, dtype=np.int64)
        put = st.put
        clock = time.perf_counter_ns
        for i in range(LAT_MESSAGES):
            t0 = clock()
            put("lat", body)
            ns[i] = clock() - t0
        rolls = st.commit_log_max_offset // LAT_SEGMENT
        st.close()
        lat.append((ns, rolls))

    benchmark.pedantic(run, setup=setup, rounds=1 if QUICK else 2, warmup_rounds=0)
    import numpy as np

    ns = np.concatenate([x[0] for x in lat])
    p = {q: float(np.percentile(ns, q)) / 1000 for q in (50, 99, 99.9)}
    mx = float(ns.max()) / 1000
    benchmark.extra_info.update(
        config=config,
        p50_us=round(p[50], 2),
        p99_us=round(p[99], 2),
        p999_us=round(p[99.9], 2),
        max_us=round(mx, 1),
        rolls_per_round=lat[-1][1],
        puts=int(ns.size),
    )
    print(
        f"\nput latency, {config}: p50 {p[50]:.2f} us  p99 {p[99]:.2f} us  p99.9 {p[99.9]:.2f} us  "
        f"max {mx:.0f} us  ({ns.size:,} puts of {LAT_BODY} B, {lat[-1][1]} rolls of {LAT_SEGMENT >> 20} MiB "
        f"per round)"
    )
