"""Scanning the same 100-byte messages in Spark: the localmq data source (the JVM reader, format "localmq" with its
jar on the session), the Python data source (format "localmq-python"), read_commitlog (mapInArrow) and Parquet.

One store per size (2M and 8M messages; LOCALMQ_BENCH_QUICK=1: 20k) and two Parquet files of the same messages: the
bodies alone (pyarrow, as a producer of such a file would write it) and every column of the data source (written by
Spark from the store), one local[*] Spark session for the module, the jar built by ``localmq.spark.jar_path()``.
Every scan scenario materialises every row of its DataFrame through Spark's ``noop`` sink
(``df.write.format("noop")``), for the value column and for all columns; the ``agg`` scenarios compute count(*) and
sum(length(value)) instead, which Parquet answers from its vectorised reader; the streaming catch-up reads every row
with trigger(availableNow) into the noop sink, against a Parquet file-source stream of the same bodies. The summary
prints rows/s, MB/s (body bytes) and localmq/peer ratios from the same run (issue 28).
"""

import os
import shutil
import sys
import time

import numpy as np
import pytest

from conftest import QUICK, ROWS, localmq_missing

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

SIZES = [20_000] if QUICK else [2_000_000, 8_000_000]
BODY = 100
QUEUES = 4
ROUNDS = 1 if QUICK else 5
PERF = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(PERF)
FLOOR = "python data source floor"


@pytest.fixture(scope="module")
def spark():
    if localmq_missing():
        pytest.skip(localmq_missing())
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # the workers import localmq from this tree and the floor data source from perf/
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [REPO, PERF] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    from pyspark.sql import SparkSession

    import localmq.spark

    # Python workers talk to the JVM over Unix domain sockets instead of loopback TCP: +12 % (localmq), +21 %
    # (read_commitlog), +23 % (the floor) rows/s at 8M in 20 alternating rounds each, Parquet unchanged (no
    # Python worker); every scenario runs under it alike
    builder = (
        SparkSession.builder.master("local[*]")
        .appName("localmq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.unix.domain.socket.enabled", "true")
        .config("spark.driver.memory", "4g")
    )
    # the JVM reader's jar: format("localmq") is the JVM reader, format("localmq-python") the Python source
    s = localmq.spark.configure_spark(builder).getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    from spark_floor import FloorDataSource

    s.dataSource.register(FloorDataSource)
    yield s
    s.stop()


def bodies(start, stop):
    """Bodies start..stop-1: a big-endian index, then a fixed pseudo-random filler (numpy rows of BODY bytes)."""
    filler = np.frombuffer(np.random.default_rng(BODY).bytes(BODY), np.uint8)
    out = np.empty((stop - start, BODY), np.uint8)
    out[:] = filler
    out[:, :8] = np.arange(start, stop, dtype=">u8").view(np.uint8).reshape(-1, 8)
    return out


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n // 1_000_000}M" if n >= 1_000_000 else str(n))
def data(request, tmp_path_factory, spark):
    """(store path, parquet directory, message count): the same messages in a localmq store, in ``bodies.parquet``
    (the bodies, written by pyarrow) and in ``all-columns/`` (every column of the data source, written by Spark), both
    in the parquet directory (a file-source stream reads ``bodies/``, the bodies file alone)."""
    import localmq

    n = request.param
    root = tmp_path_factory.mktemp(f"spark{n}")
    store = root / "store"
    with localmq.open(store) as st:
        for i in range(0, n, 1000):
            rows = bodies(i, min(n, i + 1000))
            st.put_batch("bench", [r.tobytes() for r in rows], queue_id=(i // 1000) % QUEUES)
        st.wait_for_dispatch()
    all_rows = bodies(0, n)
    offsets = pa.py_buffer(np.arange(0, (n + 1) * BODY, BODY, dtype=np.int32))
    values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(all_rows)])
    (root / "pq" / "bodies").mkdir(parents=True)
    pq.write_table(pa.table({"value": values}), root / "pq" / "bodies" / "bodies.parquet")
    del all_rows, values
    spark.read.format("localmq").load(str(store)).write.parquet(str(root / "pq" / "all-columns"))
    yield str(store), str(root / "pq"), n
    shutil.rmtree(root, ignore_errors=True)


def record(request, benchmark, scenario, implementation, n, caveat=""):
    info = benchmark.extra_info
    info.update(scenario=scenario, body_size=BODY, implementation=implementation, messages=n, body_bytes=n * BODY)
    if caveat:
        info["caveat"] = caveat
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        from report import row_from_extra_info

        request.config.stash[ROWS].append(row_from_extra_info(info, stats.stats.median))


def scan(benchmark, make_df, n, query):
    """Time ``query`` over a fresh DataFrame per round (planning included); check the row count once."""
    from pyspark.sql import functions as F

    df = make_df()
    assert df.count() == n

    def noop():
        make_df().write.format("noop").mode("overwrite").save()

    def agg():
        row = make_df().agg(F.count("*"), F.sum(F.length("value"))).first()
        assert (row[0], row[1]) == (n, n * BODY)

    benchmark.pedantic(noop if query == "noop" else agg, rounds=ROUNDS, warmup_rounds=1, iterations=1)


SCENARIOS = {
    "parquet": lambda spark, path, pqdir, n, cols: spark.read.parquet(
        os.path.join(pqdir, "bodies" if cols == "value" else "all-columns")
    ),
    "localmq": lambda spark, path, pqdir, n, cols: _columns(spark.read.format("localmq").load(path), cols),
    # the body CRC check's share of a scan (every other scenario checks it, the default)
    "localmq checkCRC=false": lambda spark, path, pqdir, n, cols: _columns(
        spark.read.format("localmq").option("checkCRC", "false").load(path), cols
    ),
    # the Python source decodes the columns of its schema only (Spark gives it no projection)
    "localmq-python": lambda spark, path, pqdir, n, cols: (
        spark.read.format("localmq-python").schema("value binary").load(path)
        if cols == "value"
        else spark.read.format("localmq-python").load(path)
    ),
    "read_commitlog": lambda spark, path, pqdir, n, cols: _read_commitlog(
        spark, path, **({"columns": "value"} if cols == "value" else {})
    ),
    # Spark's ceiling for a Python data source: the same rows from one prebuilt Arrow batch, nothing decoded
    FLOOR: lambda spark, path, pqdir, n, cols: (
        spark.read.format("python_floor")
        .option("rows", n)
        .option("body", BODY)
        .option("partitions", spark.sparkContext.defaultParallelism)
        .load()
    ),
}
FLOOR_CAVEAT = (
    f"decodes nothing: one prebuilt Arrow batch of {BODY}-byte values, repeated (perf/spark_floor.py); "
    "what Spark itself spends on any Python data source"
)


def _columns(df, cols):
    return df.select("value") if cols == "value" else df


def _read_commitlog(spark, path, **kw):
    import localmq.spark

    return localmq.spark.read_commitlog(spark, path, **kw)


@pytest.mark.parametrize(
    "implementation,columns",
    # the floor has a value column only
    [(i, c) for c in ("value", "all") for i in SCENARIOS if c == "value" or i != FLOOR],
)
def test_spark_scan_noop(spark, data, implementation, columns, benchmark, request):
    """Every row of the value column (or of every column, against Parquet with the same columns) through the noop
    sink; the floor row scans the same number of rows of values from a Python data source that decodes nothing."""
    path, pqdir, n = data
    scan(benchmark, lambda: SCENARIOS[implementation](spark, path, pqdir, n, columns), n, "noop")
    scenario = f"spark_scan_noop_{n // 1000}k" if columns == "value" else f"spark_scan_noop_all_columns_{n // 1000}k"
    record(request, benchmark, scenario, implementation, n, FLOOR_CAVEAT if implementation == FLOOR else "")


@pytest.mark.parametrize(
    "implementation", ["parquet", "localmq", "localmq checkCRC=false", "localmq-python", "read_commitlog"]
)
def test_spark_scan_agg(spark, data, implementation, benchmark, request):
    """count(*) and sum(length(value)) over the value column."""
    path, pqdir, n = data
    scan(benchmark, lambda: SCENARIOS[implementation](spark, path, pqdir, n, "value"), n, "agg")
    record(request, benchmark, f"spark_scan_agg_{n // 1000}k", implementation, n)


STREAMS = {
    # a stream gets no column pruning from Spark (a select after load decodes every column): the schema names the
    # one column read, as for the Python source
    "localmq": lambda spark, path, pqdir: (
        spark.readStream.format("localmq").schema("value binary").option("startingOffsets", "earliest").load(path)
    ),
    "localmq-python": lambda spark, path, pqdir: (
        spark.readStream.format("localmq-python")
        .schema("value binary")
        .option("startingOffsets", "earliest")
        .load(path)
    ),
    # Spark's file source over the directory holding the bodies' Parquet file
    "parquet": lambda spark, path, pqdir: spark.readStream.schema("value binary").parquet(
        os.path.join(pqdir, "bodies")
    ),
}


@pytest.mark.parametrize("implementation", list(STREAMS))
def test_spark_streaming_catch_up(spark, data, implementation, benchmark, request, tmp_path):
    """A stream from earliest to the end with trigger(availableNow), noop sink: rows/s a stream of this store can
    absorb (to compare with a producer's rate), against a Parquet file-source stream of the same bodies."""
    path, pqdir, n = data
    state = {"round": 0}

    def run():
        state["round"] += 1
        q = (
            STREAMS[implementation](spark, path, pqdir)
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / f"ck{state['round']}"))
            .start()
        )
        q.awaitTermination()
        assert sum(p["numInputRows"] for p in q.recentProgress) == n

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    record(request, benchmark, f"spark_stream_{n // 1000}k", implementation, n)


def test_spark_streaming_live_producer(spark, tmp_path, benchmark, request):
    """A producer thread appends batches of 1000 as fast as it can while a processingTime(1 s) stream follows;
    the time runs until the stream has read everything. extra_info: the producer's rate and how long the stream
    needed after the producer's last put (one micro-batch or so when it keeps up)."""
    import localmq

    n = 20_000 if QUICK else 4_000_000
    path = str(tmp_path / "live")
    chunks = [[r.tobytes() for r in bodies(i, i + 1000)] for i in range(0, 100_000, 1000)]
    result = {}

    def run():
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(tmp_path / "ck", ignore_errors=True)
        import threading

        with localmq.open(path) as st:
            st.put_batch("bench", chunks[0], queue_id=0)
            st.wait_for_dispatch()
            q = (
                spark.readStream.format("localmq")
                .schema("value binary")
                .option("startingOffsets", "earliest")
                .load(path)
                .writeStream.format("noop")
                .trigger(processingTime="1 second")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .start()
            )

            def produce():
                t0 = time.perf_counter()
                for i in range(1000, n, 1000):
                    st.put_batch("bench", chunks[(i // 1000) % len(chunks)], queue_id=(i // 1000) % QUEUES)
                result["producer_s"] = time.perf_counter() - t0

            t = threading.Thread(target=produce)
            t.start()
            t.join()
            st.wait_for_dispatch()
            deadline = time.time() + 600
            done = time.perf_counter()
            seen = 0
            while seen < n:
                assert time.time() < deadline and q.isActive
                time.sleep(0.05)
                seen = sum(p["numInputRows"] for p in q.recentProgress)
            result["tail_s"] = time.perf_counter() - done
            q.stop()

    benchmark.pedantic(run, rounds=1, warmup_rounds=0, iterations=1)
    benchmark.extra_info["producer_msgs_s"] = round((n - 1000) / result["producer_s"])
    # how long the stream needed, after the producer's last put, to have read everything
    benchmark.extra_info["stream_tail_s"] = round(result["tail_s"], 2)
    record(request, benchmark, f"spark_stream_live_{n // 1000}k", "localmq", n)
