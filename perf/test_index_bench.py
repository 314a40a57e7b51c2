"""Query by key on a store of 10 million messages: localmq's IndexFile beside a sqlite3 table with an index on key.

Both stores are built once per module with the same messages: topic "bench", 100-byte bodies, one distinct key
``order-<i>`` per message (localmq: ``put`` with ``keys``, since ``put_batch`` gives every message of a batch
the same keys; sqlite3: WAL, synchronous=NORMAL, ``CREATE INDEX ... (key)`` before the rows are inserted in
transactions of 100,000 ``executemany`` rows, as a queue would fill it). The build times are printed and kept
in extra_info; they are not the benchmark.

A round runs QUERIES lookups of keys drawn at random (fixed seed) over the whole store and checks each answer
(exactly one message, the right body). localmq: ``query_message("bench", key)`` (hash walk, the record read
and its topic / key / time checked, a Message built); sqlite3: ``SELECT body, ts FROM msgs WHERE key = ? AND
topic = ? ORDER BY id DESC LIMIT 32``. Both return at most 32 messages, newest first.

Size: LOCALMQ_INDEX_MESSAGES (default 10,000,000; 20,000 with LOCALMQ_BENCH_QUICK=1). Disk: about 2.2 GB of
commit log + a 420 MB index file, and about 1.6 GB of sqlite database.
"""

import os
import random
import shutil
import sqlite3
import time

import pytest

import report
from conftest import QUICK, ROWS

localmq = pytest.importorskip("localmq")

MESSAGES = int(os.environ.get("LOCALMQ_INDEX_MESSAGES", 20_000 if QUICK else 10_000_000))
QUERIES = 1000 if QUICK else 10_000
ROUNDS = 2 if QUICK else 7
BODY = random.Random(100).randbytes(100)
TOPIC = "bench"
CHUNK = 100_000

report.SCENARIOS.append("query_by_key")


def key_of(i):
    return "order-%d" % i


@pytest.fixture(scope="module")
def query_keys():
    rng = random.Random(7)
    return [rng.randrange(MESSAGES) for _ in range(QUERIES)]


@pytest.fixture(scope="module")
def localmq_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("index_bench") / "store"
    t0 = time.perf_counter()
    # the disk is shared with other jobs: retention's disk-full guard (which refuses puts past 90 % used) must
    # not flip during the build; a put that fails for a real reason (no space for a segment) still fails below
    st = localmq.open(path, disk_usage=lambda _path: 0.0)
    put = st.put
    for i in range(MESSAGES):
        if not put(TOPIC, BODY, queue_id=i & 7, keys=key_of(i)).ok:
            pytest.fail(f"put {i} failed: {put(TOPIC, BODY, keys=key_of(i))!r}")
    t1 = time.perf_counter()
    assert st.wait_for_index(3600) and st.wait_for_dispatch(3600)
    t2 = time.perf_counter()
    build = {
        "put_s": round(t1 - t0, 1),
        "index_lag_after_puts_s": round(t2 - t1, 1),
        "keys": st.stats()["index"]["keys"],
        "commit_log_bytes": st.commit_log_max_offset,
    }
    print(
        f"\nlocalmq: {MESSAGES:,} puts with keys in {t1 - t0:.1f} s ({MESSAGES / (t1 - t0):,.0f}/s), "
        f"index caught up {t2 - t1:.1f} s later; {st.commit_log_max_offset / 1e9:.2f} GB log"
    )
    yield st, build
    st.close()
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("index_bench_sqlite") / "q.db"
    t0 = time.perf_counter()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE msgs (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, key TEXT NOT NULL, "
        "ts INTEGER NOT NULL, body BLOB NOT NULL)"
    )
    db.execute("CREATE INDEX msgs_key ON msgs (key)")
    for start in range(0, MESSAGES, CHUNK):
        ts = time.time_ns() // 1_000_000
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO msgs (topic, key, ts, body) VALUES (?, ?, ?, ?)",
            [(TOPIC, key_of(i), ts, BODY) for i in range(start, min(MESSAGES, start + CHUNK))],
        )
        db.execute("COMMIT")
    t1 = time.perf_counter()
    size = sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))
    print(
        f"\nsqlite3: {MESSAGES:,} rows with a key index in {t1 - t0:.1f} s ({MESSAGES / (t1 - t0):,.0f}/s); "
        f"{size / 1e9:.2f} GB"
    )
    yield db, {"insert_s": round(t1 - t0, 1), "db_bytes": size}
    db.close()
    shutil.rmtree(path.parent, ignore_errors=True)


def _record(benchmark, request, implementation, build):
    info = benchmark.extra_info
    info.update(
        scenario="query_by_key",
        body_size=len(BODY),
        implementation=implementation,
        messages=QUERIES,
        body_bytes=QUERIES * len(BODY),
        store_messages=MESSAGES,
        **build,
    )
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        median = stats.stats.median
        request.config.stash[ROWS].append(report.row_from_extra_info(info, median))
        print(
            f"\n{implementation}: {median / QUERIES * 1e6:.2f} us per query by key "
            f"({QUERIES / median:,.0f} queries/s) on {MESSAGES:,} messages"
        )


def test_query_by_key_localmq(benchmark, request, localmq_store, query_keys):
    st, build = localmq_store
    keys = [key_of(i) for i in query_keys]
    query = st.query_message

    def run():
        for k in keys:
            (m,) = query(TOPIC, k)
            assert m.body == BODY

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    _record(benchmark, request, "localmq", build)


def test_query_by_key_sqlite(benchmark, request, sqlite_store, query_keys):
    db, build = sqlite_store
    keys = [key_of(i) for i in query_keys]
    execute = db.execute
    sql = "SELECT body, ts FROM msgs WHERE key = ? AND topic = ? ORDER BY id DESC LIMIT 32"

    def run():
        for k in keys:
            (row,) = execute(sql, (k, TOPIC)).fetchall()
            assert row[0] == BODY

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    _record(benchmark, request, "sqlite3 (index on key)", build)


def test_query_missing_key_localmq(benchmark, request, localmq_store):
    """A key that is not there: the slot walk and nothing else (no record read)."""
    st, build = localmq_store
    keys = ["absent-%d" % i for i in range(QUERIES)]
    query = st.query_message

    def run():
        for k in keys:
            assert not query(TOPIC, k)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    print(f"\nlocalmq missing key: {benchmark.stats.stats.median / QUERIES * 1e6:.2f} us per query")
