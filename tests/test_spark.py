"""The localmq data source and read_commitlog in a real local Spark session: batch, streaming, live writers."""

import os
import shutil
import subprocess
import sys
import time

import pytest

import localmq
from conftest import cut_dispatch
from helpers import require

require("pyspark")
from pyspark.sql import functions as F  # noqa: E402

# the Python data source by its own name: the session carries the JVM jar, which answers to "localmq" (README)
PY = "localmq-python"
SEG = 64 * 1024
TOPICS = ("orders", "audit", "clicks")
QUEUES = 4
N = 3000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A closed store: 3 topics x 4 queues, N messages ``body-%06d`` with tags, keys and a property."""
    path = tmp_path_factory.mktemp("spark") / "store"
    sent = []
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=2000) as st:
        for i in range(N):
            topic, qid = TOPICS[i % 3], (i // 3) % QUEUES
            r = st.put(
                topic, b"body-%06d" % i, queue_id=qid, tags=f"t{i % 5}", keys=[f"k{i}"], properties={"n": str(i)}
            )
            sent.append((topic, qid, r.queue_offset, i, r.physical_offset))
        st.wait_for_dispatch()
    return str(path), sent


def load(spark, path, **options):
    r = spark.read.format(PY).option("mapped_file_size_commit_log", SEG)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(path)


def index_sum(df):
    return df.select(F.sum(F.substring(F.col("value").cast("string"), 6, 6).cast("long"))).first()[0]


def test_batch_counts_sums_and_offsets(spark, store):
    path, sent = store
    df = load(spark, path)  # found through pyspark_localmq_python.DefaultSource, no register() call
    assert df.count() == N
    assert index_sum(df) == sum(s[3] for s in sent)
    per_queue = {
        (r[0], r[1]): (r[2], r[3], r[4])
        for r in df.groupBy("topic", "partition").agg(F.min("offset"), F.max("offset"), F.count("*")).collect()
    }
    want = {}
    for topic, qid, off, _, _ in sent:
        lo, hi, n = want.get((topic, qid), (off, off, 0))
        want[(topic, qid)] = (min(lo, off), max(hi, off), n + 1)
    assert per_queue == want and all(lo == 0 and hi == n - 1 for lo, hi, n in want.values())
    row = df.where("topic = 'orders' AND partition = 1 AND offset = 7").first()
    i = next(s[3] for s in sent if s[:3] == ("orders", 1, 7))
    assert row.value == b"body-%06d" % i and row.key == b"k%d" % i and row.keys == [f"k{i}"]
    assert row.tags == f"t{i % 5}" and row.properties["n"] == str(i) and row.timestampType == 1
    assert row.physical_offset == next(s[4] for s in sent if s[3] == i)


def test_timestamps_are_store_times(spark, store):
    path, _ = store
    stored = {
        (m.topic, m.queue_id, m.queue_offset): m.store_timestamp
        for m in localmq.read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG)
    }
    got = {
        (r[0], r[1], r[2]): r[3]
        for r in load(spark, path).select("topic", "partition", "offset", F.unix_millis("timestamp")).collect()
    }
    assert got == stored


def test_read_commitlog_matches_the_data_source(spark, store):
    import localmq.spark

    path, _ = store
    localmq.spark.register(spark)
    df = localmq.spark.read_commitlog(spark, path, mapped_file_size_commit_log=SEG, minPartitions=3)
    assert df.rdd.getNumPartitions() >= 3
    cols = ["topic", "partition", "offset", "value", "msg_id", "timestamp"]
    assert sorted(df.select(cols).collect()) == sorted(load(spark, path).select(cols).collect())


def test_bounds_topics_and_schema_subset(spark, store):
    path, sent = store
    df = (
        spark.read.format(PY)
        .schema("topic string, partition int, offset long")
        .option("mapped_file_size_commit_log", SEG)
        .option("topics", "orders")
        .option("startingOffsets", '{"orders": {"0": 10, "1": -2, "2": -2, "3": -2}}')
        .option("endingOffsets", '{"orders": {"0": 20, "1": -1, "2": 5, "3": -1}}')
        .load(path)
    )
    got = sorted(tuple(r) for r in df.collect())
    full = {q: sum(1 for s in sent if s[:2] == ("orders", q)) for q in range(QUEUES)}
    want = (
        [("orders", 0, o) for o in range(10, 20)]
        + [("orders", 1, o) for o in range(full[1])]
        + [("orders", 2, o) for o in range(5)]
        + [("orders", 3, o) for o in range(full[3])]
    )
    assert got == sorted(want)
    with pytest.raises(Exception, match="has no column 'nope'"):
        spark.read.format(PY).schema("nope string").load(path).collect()


def test_not_a_store_is_a_clear_error(spark, tmp_path):
    with pytest.raises(Exception, match="NotAStoreError.*not a localmq / RocketMQ store"):
        spark.read.format(PY).load(str(tmp_path)).collect()


def test_rocketmq_fixture_store(spark, fixtures_dir, tmp_path):
    store = shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store")
    df = spark.read.format(PY).option("mapped_file_size_commit_log", "8192").load(str(store))
    rows = df.select("topic", "partition", "offset", "value", "tags").collect()
    assert len(rows) == 47 and sorted(r.offset for r in rows) == list(range(47))
    assert {(r.topic, r.partition, r.value, r.tags) for r in rows} == {
        ("abc", 0, b"Once, there was a chance for me!", "TAG1")
    }
    # without the option the size is read off the segment files (issue 14); a wrong one is named
    assert spark.read.format(PY).load(str(store)).count() == 47
    with pytest.raises(Exception, match="mapped_file_size_commit_log=8192"):
        spark.read.format(PY).option("mapped_file_size_commit_log", str(1 << 20)).load(str(store)).collect()


def run_stream(spark, path, out, checkpoint, seg=SEG, **options):
    r = spark.readStream.format(PY).option("mapped_file_size_commit_log", seg)
    for k, v in options.items():
        r = r.option(k, v)
    q = (
        r.load(path)
        .select("topic", "partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    return [p["numInputRows"] for p in q.recentProgress]


def test_streaming_available_now_and_restart(spark, tmp_path):
    path = str(tmp_path / "store")
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=2000) as st:
        for i in range(1000):
            st.put("a", b"%06d" % i, queue_id=i % 2)
        st.wait_for_dispatch()
        batches = run_stream(spark, path, out, ck, startingOffsets="earliest", maxOffsetsPerTrigger=300)
        assert batches == [300, 300, 300, 100]
        for i in range(1000, 1500):
            st.put("a" if i % 2 else "b", b"%06d" % i, queue_id=i % 3)  # a new topic and a new queue
        st.wait_for_dispatch()
        assert sum(run_stream(spark, path, out, ck)) == 500  # restarts from the checkpoint
        assert run_stream(spark, path, out, ck) in ([], [0])
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.value) for r in rows) == list(range(1500))
    per_queue = {}
    for r in rows:
        per_queue.setdefault((r.topic, r.partition), []).append(r.offset)
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values())
    assert ("b", 2) in per_queue


WRITER = """
import os, sys, time, localmq
path, stop = sys.argv[1], sys.argv[2]
i = 0
with localmq.open(path, mapped_file_size_commit_log=%d, mapped_file_size_consume_queue=20000) as st:
    while not os.path.exists(stop) and i < 100_000:
        st.put_batch("live", [b"%%08d" %% (i + j) for j in range(50)], queue_id=(i // 50) %% 2)
        i += 50
        time.sleep(0.005)
    st.wait_for_dispatch()
print(i)
""" % (1 << 20)


def test_live_writer_batch_prefix_and_streaming(spark, tmp_path):
    path = str(tmp_path / "store")
    stop = tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, path, str(stop)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while not os.path.isdir(os.path.join(path, "consumequeue", "live", "1")):
            assert time.time() < deadline and writer.poll() is None
            time.sleep(0.05)
        out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
        streamed = sum(run_stream(spark, path, out, ck, 1 << 20, startingOffsets="earliest"))
        # a batch read while the writer appends: a consistent prefix of every queue
        df = spark.read.format(PY).option("mapped_file_size_commit_log", 1 << 20).load(path)
        rows = df.select("partition", "offset", "value").collect()
        for q in (0, 1):
            offs = sorted(r.offset for r in rows if r.partition == q)
            assert offs == list(range(len(offs)))
        assert len(rows) >= streamed > 0
        streamed += sum(run_stream(spark, path, out, ck, 1 << 20))
    finally:
        stop.touch()
        total = int(writer.communicate(timeout=60)[0])
    assert writer.returncode == 0
    streamed += sum(run_stream(spark, path, out, ck, 1 << 20))
    assert streamed == total
    values = sorted(int(r.value) for r in spark.read.parquet(out).select("value").collect())
    assert values == list(range(total))


def test_streaming_starts_at_latest_by_default(spark, tmp_path):
    path = str(tmp_path / "store")
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        st.put_batch("a", [b"old"] * 100, queue_id=0)
        st.wait_for_dispatch()
        assert sum(run_stream(spark, path, out, ck)) == 0  # as Kafka's source: only what comes next
        st.put_batch("a", [b"new"] * 50, queue_id=0)
        st.wait_for_dispatch()
        assert sum(run_stream(spark, path, out, ck)) == 50
    assert {r.value for r in spark.read.parquet(out).collect()} == {b"new"}


def test_streaming_reads_undispatched_records_of_a_stopped_store(spark, tmp_path):
    """A store closed with 400 of its 1000 records indexed: the stream reads all 1000 from the log; after a
    writer reopens it (its recovery indexes the rest) and adds 100, the stream goes on with those 100 only."""
    path = str(tmp_path / "store")
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        rs = [st.put("a" if i < 900 else "z", b"%06d" % i, queue_id=i % 2) for i in range(1000)]
        st.wait_for_dispatch()
    cut_dispatch(path, rs[400].physical_offset)
    assert sum(run_stream(spark, path, out, ck, startingOffsets="earliest", maxOffsetsPerTrigger=300)) == 1000
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        st.wait_for_dispatch()
        for i in range(1000, 1100):
            st.put("a", b"%06d" % i, queue_id=i % 2)
        st.wait_for_dispatch()
    assert sum(run_stream(spark, path, out, ck)) == 100
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.value) for r in rows) == list(range(1100))
    per_queue = {}
    for r in rows:
        per_queue.setdefault((r.topic, r.partition), []).append(r.offset)
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values())


def test_streaming_fail_on_data_loss(spark, tmp_path):
    """Retention removes records a stream has not read yet: failOnDataLoss (default) stops the query with the
    offsets lost; false skips to the earliest offset left, with a warning, and reads the rest."""
    path = str(tmp_path / "store")
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        st.put_batch("a", [b"%06d" % i for i in range(100)], queue_id=0)
        st.wait_for_dispatch()
        assert sum(run_stream(spark, path, out, ck, startingOffsets="earliest")) == 100
        for i in range(100, 3000, 100):
            st.put_batch("a", [b"%06d" % j for j in range(i, i + 100)], queue_id=0)
        st.wait_for_dispatch()
    os.unlink(os.path.join(path, "commitlog", "%020d" % 0))  # what retention does to the oldest segment
    with pytest.raises(Exception, match="removed by retention.*failOnDataLoss"):
        run_stream(spark, path, out, ck)
    lost_to = min(m.queue_offset for m in localmq.read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG))
    assert lost_to > 100
    assert sum(run_stream(spark, path, out, ck, failOnDataLoss="false")) == 3000 - lost_to
    values = sorted(int(r.value) for r in spark.read.parquet(out).collect())
    assert values == list(range(100)) + list(range(lost_to, 3000))


def test_filter_pushdown_prunes_and_stays_exact(spark, store):
    """With spark.sql.python.filterPushdown.enabled and option pushFilters, topic / partition / offset filters
    reach the reader, which plans only the matching queue ranges; the rows equal those without pushdown."""
    path, sent = store
    query = "topic = 'orders' AND partition IN (1, 2) AND offset >= 5 AND offset < 60 AND value LIKE 'body-%'"
    want = sorted(tuple(r) for r in load(spark, path).where(query).select("topic", "partition", "offset").collect())
    assert want == sorted(("orders", q, o) for q in (1, 2) for o in range(5, 60))
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = load(spark, path, pushFilters="true").where(query).select("topic", "partition", "offset")
        got = sorted(tuple(r) for r in df.collect())
        scan = df._jdf.queryExecution().executedPlan().collectLeaves().head()
        scanned = scan.metrics().apply("numOutputRows").value()
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    assert got == want
    assert scanned == len(want)  # the scan produced only the rows of the pruned ranges, not all N


def test_tags_and_sql_options(spark, store):
    """Issue 15: ``tags`` and ``sql`` keep the rows a consumer subscribed with them would get, in both
    partitionings (queue: units dropped by tag hash code before decoding)."""
    path, sent = store
    want = sorted(i for _, _, _, i, _ in sent if i % 5 in (1, 4) and 1000 <= i < 2000)
    for mode in ("segment", "queue"):
        df = load(spark, path, partitioning=mode, tags="t1 || t4", sql="n >= 1000 AND n < 2000")
        got = sorted(int(r[0]) for r in df.select(F.col("properties")["n"]).collect())
        assert got == want
