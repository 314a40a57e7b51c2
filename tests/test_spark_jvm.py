"""The JVM reader (spark-jvm/, ``format("localmq-jvm")``) against the Python data source
(``format("localmq-python")``) on shared vectors: RocketMQ's own stores, localmq stores with IPv6 hosts, V2 records,
compressed bodies, transactions, empty bodies and odd properties, gap records, a bad CRC. Every column is compared,
row by row (issue 28)."""

import os
import re
import shutil
import struct
import zlib

import pytest

import localmq
from localmq.spark.read import plan
from localmq.store.commit_log import PutExtra

JVM = "localmq-jvm"
# the Python data source by its own name: with the JVM jar on the session Spark resolves PY to the JVM reader
PY = "localmq-python"
SEG = 64 * 1024
ORDER = "physical_offset"
COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "tags",
    "keys",
    "properties",
    "physical_offset",
    "born_timestamp",
    "reconsume_times",
    "sys_flag",
    "msg_id",
)

COMPRESSED, PREPARED, COMMIT, ROLLBACK = 0x1, 0x4, 0x8, 0xC
V2_TOPIC = "t" * 200  # longer than a V1 record's 127 bytes: written as a V2 record


def read(spark, fmt, path, columns=None, **options):
    """Every row of ``path`` through the reader ``fmt``, ordered by commit log offset, as dicts."""
    df = spark.read.format(fmt).options(**{k: str(v) for k, v in options.items()}).load(str(path))
    if columns is not None:
        df = df.select(*columns)
    cols = df.columns
    rows = df.orderBy(ORDER).collect() if ORDER in cols else df.collect()
    return cols, [r.asDict() for r in rows]


def same_rows(spark, path, columns=None, expect_rows=None, **options):
    """Both readers give the same columns and rows; returns the rows."""
    py_cols, py = read(spark, PY, path, columns, **options)
    jvm_cols, jvm = read(spark, JVM, path, columns, **options)
    assert jvm_cols == py_cols == list(columns or COLUMNS)
    assert len(jvm) == len(py)
    for i, (a, b) in enumerate(zip(jvm, py)):
        assert a == b, (i, a, b)
    if expect_rows is not None:
        assert len(py) == expect_rows
    return py


@pytest.mark.parametrize(
    "fixture, records",
    [
        ("apache-rocketmq-4e25b979/store", 47),
        ("EricPanGopher-rocketmq-9835cd5f/store/unit_test_store", 179),
        ("Shaoxubao-rocketmq-study-c4dcaab0/store/unit_test_store", None),
    ],
)
def test_rocketmq_fixture_stores(spark, fixtures_dir, tmp_path, fixture, records):
    """RocketMQ 4.x broker stores (8 KiB segments read off the files; one has an empty last segment and a
    ConsumeQueue that indexes 56 of its 179 records): the same rows, and the same with the size given."""
    store = shutil.copytree(fixtures_dir / fixture, tmp_path / "store")
    rows = same_rows(spark, store, expect_rows=records)
    assert rows and all(r["msg_id"] and len(r["msg_id"]) == 32 for r in rows)
    same_rows(spark, store, mapped_file_size_commit_log=8192, expect_rows=len(rows))


def write_vectors(path):
    """A closed localmq store of 64 KiB segments holding every kind of record the readers must agree on; returns the
    number of rows a reader gives (PREPARED and ROLLBACK records are none)."""
    rows = 0
    with localmq.open(
        path, mapped_file_size_commit_log=SEG, store_host="[2001:db8::7]:10911", born_host="[fe80::1]:4321"
    ) as st:
        for i in range(300):
            # bodies of 0..~1 KiB (rolling several segments, so blank records end them), tags, two keys
            st.put(
                "orders",
                bytes([i % 251]) * (i * 7 % 1100),
                queue_id=i % 3,
                tags=None if i % 4 == 0 else "tag%d" % (i % 5),
                keys=None if i % 3 == 0 else ["k%d" % i, "o%d" % i],
                properties={"n": str(i), "e": "x" * (i % 2)} if i % 2 else None,
            )
            rows += 1
        st.put(V2_TOPIC, b"a V2 record", queue_id=1, tags="long", keys=["v2"])
        st.put(V2_TOPIC, b"", queue_id=1)
        rows += 2
        body = b"compressible " * 500
        st.put_ext(
            "zipped",
            zlib.compress(body),
            extra=PutExtra(sys_flag=COMPRESSED, born_host="10.0.0.9:77", store_host="192.168.1.2:10911"),
        )
        rows += 1
        for flag in (PREPARED, ROLLBACK, COMMIT, PREPARED, COMMIT):
            st.put_ext(
                "txn",
                b"txn %d" % flag,
                queue_id=0,
                tags="t",
                keys=["tx"],
                extra=PutExtra(sys_flag=flag, reconsume_times=flag, prepared_transaction_offset=17),
            )
            rows += flag not in (PREPARED, ROLLBACK)
        # properties as a broker may store them: empty names and values dropped, a trailing separator, duplicates
        raw = b"\x01a\x02b\x01\x02ab\x02KEYS\x01  one  two \x02TAGS\x01T\x02x\x01y\x02x\x01z\x02"
        st.put_ext("raw", b"raw props", extra=PutExtra(raw_properties=raw))
        st.put_ext("raw", b"no props", extra=PutExtra(raw_properties=b""))
        rows += 2
        st.wait_for_dispatch()
    return rows


@pytest.fixture
def vectors(tmp_path):
    path = tmp_path / "vectors"
    return path, write_vectors(path)


def test_localmq_store_every_column(spark, vectors):
    path, expected = vectors
    segments = len(os.listdir(path / "commitlog"))
    assert segments >= 3
    # partitions are planned as the Python source plans them (shares of the log cut at record boundaries)
    planned = len(plan(str(path)).partitions)
    assert spark.read.format(JVM).load(str(path)).rdd.getNumPartitions() == planned >= 2
    rows = same_rows(spark, path, expect_rows=expected)
    by_topic = {}
    for r in rows:
        by_topic.setdefault(r["topic"], []).append(r)
    # the vectors are what they claim to be (read off the rows both readers agreed on)
    assert {len(r["msg_id"]) for r in by_topic["orders"]} == {56}  # IPv6 store host
    assert len(by_topic[V2_TOPIC]) == 2 and by_topic[V2_TOPIC][1]["value"] == bytearray()
    assert zlib.decompress(by_topic["zipped"][0]["value"]) == b"compressible " * 500  # stored bytes, as stored
    assert by_topic["zipped"][0]["sys_flag"] & COMPRESSED and len(by_topic["zipped"][0]["msg_id"]) == 32
    assert [r["sys_flag"] & 0xC for r in by_topic["txn"]] == [COMMIT, COMMIT]
    raw = by_topic["raw"][0]
    assert raw["keys"] == ["one", "two"] and raw["tags"] == "T" and raw["key"] == bytearray(b"  one  two ")
    assert set(raw["properties"]) == {"KEYS", "TAGS", "x"}
    assert by_topic["raw"][1]["properties"] == {} and by_topic["raw"][1]["keys"] == []


@pytest.mark.parametrize(
    "columns",
    [
        ("value",),
        ("offset", "partition"),
        ("keys", "msg_id", "physical_offset"),
        ("properties", "tags", "key", "topic", "timestamp", "born_timestamp"),
    ],
)
def test_pruned_columns(spark, vectors, columns):
    """Only the columns a query uses are decoded: each subset gives the same values as the Python source's."""
    path, expected = vectors
    same_rows(spark, path, columns=list(columns), expect_rows=expected)


def test_count_topics_and_batch_size(spark, vectors):
    """No column at all (count), the topics option, and batches of 7 rows give the same rows."""
    path, expected = vectors
    assert spark.read.format(JVM).load(str(path)).count() == expected
    same_rows(spark, path, topics="txn, raw", expect_rows=4)
    same_rows(spark, path, batchSize=7, expect_rows=expected)
    same_rows(spark, path, checkCRC="false", expect_rows=expected)


def test_given_schema_and_bad_options(spark, vectors):
    path, _ = vectors
    df = spark.read.format(JVM).schema("value binary, offset bigint").load(str(path))
    assert df.columns == ["value", "offset"]
    py = spark.read.format(PY).schema("value binary, offset bigint").load(str(path))
    assert sorted(map(tuple, df.collect())) == sorted(map(tuple, py.collect()))
    for schema, message in (("nope int", "localmq has no column 'nope'"), ("value string", "is binary, not string")):
        with pytest.raises(Exception, match=message):
            spark.read.format(JVM).schema(schema).load(str(path)).collect()
    with pytest.raises(Exception, match="mapped_file_size_commit_log=65536"):
        spark.read.format(JVM).option("mapped_file_size_commit_log", 1 << 20).load(str(path)).collect()
    with pytest.raises(Exception, match="no commitlog directory"):
        spark.read.format(JVM).load(str(path / "config")).collect()


def test_bad_crc_raises_in_both_readers(spark, vectors):
    """A body byte flipped in a closed store (no open since, so no recovery): both readers fail naming the record's
    offset; with checkCRC=false both give the flipped body."""
    path, expected = vectors
    rows = same_rows(spark, path, columns=["value", "physical_offset"])
    victim = next(r for r in rows if len(r["value"]) > 100)
    seg = SEG * (victim["physical_offset"] // SEG)
    f = path / "commitlog" / ("%020d" % seg)
    data = bytearray(f.read_bytes())
    # the body is the last field before topic length, topic and properties: find it from the record's start
    at = data.index(bytes(victim["value"][:64]), victim["physical_offset"] - seg) + 10
    data[at] ^= 0x55
    f.write_bytes(bytes(data))
    for mode in ("segment", "queue"):
        # a walk meets a corrupt record; a queue unit points at an offset where no record of its size is
        for fmt in (PY, JVM):
            with pytest.raises(Exception, match=f"offset {victim['physical_offset']}"):
                spark.read.format(fmt).option("partitioning", mode).load(str(path)).collect()
        got = same_rows(spark, path, checkCRC="false", expect_rows=expected, partitioning=mode)
        flipped = next(r for r in got if r["physical_offset"] == victim["physical_offset"])
        assert flipped["value"] != victim["value"]


def test_gap_records(spark, tmp_path):
    """Damage in an old segment that recovery replaced by a gap record (tests/test_store_damage.py's recipe): both
    readers refuse by default (failOnDataLoss) and, with failOnDataLoss=false, step over it to the same rows."""
    root = tmp_path / "s"
    cfg = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=20000)
    with localmq.open(root, **cfg) as st:
        for i in range(3000):
            st.put("topic", b"m%05d:" % i + bytes([i % 251]) * 60, queue_id=i % 4, tags="t%d" % (i % 3))
        st.wait_for_dispatch()
    seg = sorted((root / "commitlog").iterdir())[2]
    with open(seg, "r+b") as f:
        f.seek(8192)
        f.write(bytes(4096))
    with localmq.open(root, **cfg) as st:
        assert st.recovery.gaps, st.recovery
    data = seg.read_bytes()
    assert struct.pack(">Q", 0x4C4D512E47415021) in data  # "LMQ.GAP!"
    for fmt in (PY, JVM):
        with pytest.raises(Exception, match="gap record"):
            spark.read.format(fmt).load(str(root)).collect()
    rows = same_rows(spark, root, failOnDataLoss="false")
    assert 3000 - 80 < len(rows) < 3000
    # queue partitions: the units of the lost messages point at the gap record; both readers say so, or skip them
    same_error(
        spark,
        root,
        "OffsetRangeError",
        "DataLossException",
        "lost to damage in the commit log: a gap record stands at offset",
        exact=False,
        partitioning="queue",
    )
    assert same_plan_and_rows(spark, root, failOnDataLoss="false", partitioning="queue") == rows


# ------------------------------------------------------------------------------------------------ options (issue 28)


def error_of(spark, fmt, path, **options):
    """The exception reading ``path`` through ``fmt`` with ``options`` raises (a read that succeeds fails the test)."""
    with pytest.raises(Exception) as e:
        spark.read.format(fmt).options(**{k: str(v) for k, v in options.items()}).load(str(path)).collect()
    return e.value


def same_error(spark, path, py_type, jvm_type, pattern, exact=True, **options):
    """Both readers refuse the read: the Python source with ``py_type`` (localmq.errors), the JVM reader with the
    Java exception ``jvm_type``, both messages matching ``pattern``, and (``exact``) the Python message's own text
    (its first line) found in the JVM's. Not ``exact`` where the failing task decides which queue a message names."""
    py = str(error_of(spark, PY, path, **options))
    jvm = error_of(spark, JVM, path, **options)
    text = str(jvm)
    assert re.search(pattern, py), py
    assert re.search(pattern, text), text
    assert f"{py_type}: " in py, py
    assert jvm_type in text or jvm_type in type(jvm).__name__, (type(jvm), text)
    message = py.split(f"{py_type}: ", 1)[1].splitlines()[0].strip()
    assert message in text or not exact, (message, text)


def partitions(spark, fmt, path, **options):
    df = spark.read.format(fmt).options(**{k: str(v) for k, v in options.items()}).load(str(path))
    return df.rdd.getNumPartitions()


def same_plan_and_rows(spark, path, expect_rows=None, **options):
    """The JVM reader plans as many partitions as the Python source's plan (plan_batch) and gives the same rows."""
    planned = len(plan(str(path), **options).partitions)
    assert partitions(spark, JVM, path, **options) == planned, options
    return same_rows(spark, path, expect_rows=expect_rows, **options)


ORDERS_FROM = '{"orders": {"0": 10, "1": -2, "2": 5}}'
ORDERS_TO = '{"orders": {"0": 50, "1": -1, "2": 7}}'


@pytest.mark.parametrize(
    "options, rows",
    [
        ({"startingOffsets": ORDERS_FROM, "endingOffsets": ORDERS_TO}, 40 + 100 + 2),
        (
            {"startingOffsets": ORDERS_FROM, "endingOffsets": ORDERS_TO, "partitioning": "queue", "minPartitions": 3},
            142,
        ),
        (
            {"startingOffsets": ORDERS_FROM, "endingOffsets": ORDERS_TO, "partitioning": "segment", "minPartitions": 5},
            142,
        ),
        (
            {"topics": "orders, txn", "startingOffsets": '{"orders": {"0": 90, "1": 99, "2": 0}, "txn": {"0": 1}}'},
            10 + 1 + 100 + 1,
        ),
        ({"topics": "txn,raw", "endingOffsets": '{"txn": {"0": 1}, "raw": {"0": -1}}'}, 1 + 2),
        ({"startingOffsets": "earliest", "endingOffsets": "latest", "partitioning": "queue"}, None),
        ({"partitioning": "queue", "minPartitions": 1}, None),
        ({"partitioning": "queue", "minPartitions": 7, "batchSize": 3}, None),
        ({"partitioning": "segment", "minPartitions": 3}, None),
        ({"partitioning": "auto", "minPartitions": 1, "maxOffsetsPerTrigger": 5}, None),
    ],
)
def test_offsets_and_partitioning_options(spark, vectors, options, rows):
    """startingOffsets / endingOffsets (JSON, -2 / -1, the JSON's topics read without a topics option), partitioning
    (queue, segment, auto) and minPartitions: the same partitions planned and the same rows."""
    path, expected = vectors
    same_plan_and_rows(spark, path, expect_rows=expected if rows is None else rows, **options)


@pytest.fixture
def timed(tmp_path):
    """A closed store of 3 bursts of puts 30 ms apart (2 topics x 2 queues, 8 KiB segments); returns (path, the
    store times of the first message of bursts 2 and 3)."""
    import time

    path = tmp_path / "timed"
    cuts = []
    with localmq.open(path, mapped_file_size_commit_log=8192) as st:
        for burst in range(3):
            if burst:
                time.sleep(0.03)
            for i in range(60):
                r = st.put("a" if i % 3 else "b", b"burst %d message %d" % (burst, i), queue_id=i % 2)
                if i == 0 and burst:
                    cuts.append(r.store_timestamp)
        st.wait_for_dispatch()
    return path, cuts


def test_timestamp_options(spark, timed):
    path, (t1, t2) = timed
    same_plan_and_rows(spark, path, expect_rows=120, startingTimestamp=t1)
    same_plan_and_rows(spark, path, expect_rows=60, startingTimestamp=t1, endingTimestamp=t2)
    same_plan_and_rows(
        spark, path, expect_rows=40, startingTimestamp=t1, endingTimestamp=t2, topics="a", partitioning="queue"
    )
    same_plan_and_rows(spark, path, expect_rows=0, startingTimestamp=t2 + 10**6)
    # a bare commit log (no ConsumeQueues): times and offsets are row filters
    shutil.rmtree(path / "consumequeue")
    same_plan_and_rows(spark, path, expect_rows=60, startingTimestamp=t1, endingTimestamp=t2)
    same_plan_and_rows(
        spark,
        path,
        expect_rows=(60 - 50) + 15,  # 60 messages of topic a in each queue
        startingOffsets='{"a": {"0": 50, "1": -2}}',
        endingOffsets='{"a": {"0": 90, "1": 15}}',
    )


BAD_OPTIONS = [
    ({"chekCRC": "false"}, r"unknown localmq option\(s\): 'chekcrc' \(did you mean 'checkCRC'\?\)"),
    ({"startingOffset": "earliest"}, r"did you mean 'startingOffsets'\?"),
    ({"subscribe": "orders"}, "option subscribe is Kafka's; localmq takes 'topics'"),
    ({"startingOffsets": "nonsense"}, "option startingOffsets must be 'earliest', 'latest' or JSON like"),
    ({"endingOffsets": "[1, 2]"}, "option endingOffsets: JSON must map topics to"),
    ({"startingOffsets": '{"orders": 3}'}, "option startingOffsets: JSON must map topics to"),
    ({"startingOffsets": '{"orders": {"x": 1}}'}, "option startingOffsets queue id of orders must be an integer"),
    ({"startingOffsets": '{"orders": {"0": -3}}'}, "option startingOffsets offset must be >= -2, not -3"),
    ({"startingOffsets": '{"orders": {"0": "ten"}}'}, "option startingOffsets offset must be an integer"),
    ({"endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
    ({"endingOffsets": '{"orders": {"0": -2, "1": 0, "2": 0}}'}, r"endingOffsets cannot use -2 \(earliest\)"),
    ({"startingOffsets": "latest"}, "startingOffsets of a batch read cannot be 'latest'"),
    ({"startingOffsets": '{"orders": {"0": -1, "1": 0, "2": 0}}'}, "batch read cannot use -1"),
    ({"startingTimestamp": "-1"}, "option startingTimestamp must be >= 0, not -1"),
    ({"endingTimestamp": "soon"}, "option endingTimestamp must be an integer"),
    ({"maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger must be >= 1"),
    ({"failOnDataLoss": "maybe"}, "option failOnDataLoss must be true or false"),
    ({"checkCRC": "maybe"}, "option checkCRC must be true or false"),
    ({"includeUndispatched": "maybe"}, "option includeUndispatched must be true or false"),
    ({"pushFilters": "maybe"}, "option pushFilters must be true or false"),
    ({"batchSize": "0"}, "option batchSize must be >= 1, not 0"),
    ({"minPartitions": "x"}, "option minPartitions must be an integer"),
    ({"partitioning": "round-robin"}, "option partitioning must be auto, segment or queue"),
    ({"mapped_file_size_commit_log": "100"}, "option mapped_file_size_commit_log must be >= 4096"),
    # planning: a JSON must name exactly the queues read (Kafka's rule)
    (
        {"startingOffsets": '{"orders": {"0": 0}}'},
        "startingOffsets JSON must give every queue.*missing: orders/1, orders/2",
    ),
    (
        {"topics": "orders,raw", "endingOffsets": '{"orders": {"0": 1, "1": 1, "2": 1}}'},
        "endingOffsets JSON must give every queue.*missing: raw/0",
    ),
    (
        {"startingOffsets": '{"orders": {"0": 0, "1": 0, "2": 0, "9": 0}}'},
        "names queues the store does not have.*orders/9",
    ),
]


@pytest.mark.parametrize(
    "tags, rows", [("tag1 || tag3", None), ("*", 307), ("", 307), (" || ", 0), ("T", 1), ("long||t", 3)]
)
@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_tags_option(spark, vectors, tags, rows, mode):
    """A tag subscription keeps the rows whose TAGS is one of its names exactly (queue partitions first drop units by
    their tags code, as a broker does); "" and "*" keep every row, an expression of blanks none."""
    path, _ = vectors
    got = same_plan_and_rows(spark, path, expect_rows=rows, tags=tags, partitioning=mode)
    if rows is None:
        assert got and {r["tags"] for r in got} == {"tag1", "tag3"}


def test_tags_of_separators_only_fail_alike(spark, vectors):
    path, _ = vectors
    same_error(
        spark,
        path,
        "FilterSyntaxError",
        "IllegalArgumentException",
        "a tag expression of separators only names nothing",
        tags="||",
    )


@pytest.mark.parametrize("options, pattern", BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_bad_options_fail_alike(spark, vectors, options, pattern):
    """A bad option fails both readers with the same message: localmq.errors.ConfigError in the Python source,
    IllegalArgumentException in the JVM reader."""
    path, _ = vectors
    same_error(spark, path, "ConfigError", "IllegalArgumentException", pattern, **options)


def test_offset_range_errors_and_retention(spark, vectors, tmp_path):
    """An ending offset before a starting one, and offsets that retention removed (the first segment deleted):
    OffsetRangeError / OffsetRangeException alike; failOnDataLoss=false reads from the earliest offset left."""
    path, _ = vectors
    same_error(
        spark,
        path,
        "OffsetRangeError",
        "OffsetRangeException",
        "orders queue 0: ending offset 10 is before starting offset 50",
        startingOffsets='{"orders": {"0": 50, "1": 0, "2": 0}}',
        endingOffsets='{"orders": {"0": 10, "1": 5, "2": 5}}',
    )
    store = shutil.copytree(path, tmp_path / "retained")
    os.remove(sorted((store / "commitlog").iterdir())[0])
    whole = '{"orders": {"0": 0, "1": -2, "2": -2}}'
    same_error(
        spark,
        store,
        "OffsetRangeError",
        "OffsetRangeException",
        r"orders queue 0: offsets 0\.\.\d+ were removed by retention .*set failOnDataLoss=false",
        startingOffsets=whole,
    )
    rows = same_plan_and_rows(spark, store, startingOffsets=whole, failOnDataLoss="false")
    assert rows and min(r["offset"] for r in rows if r["partition"] == 0) > 0


def scanned_rows(df):
    """(rows, the rows the scan under ``df`` produced): what filter pushdown let it skip shows here."""
    got = sorted(tuple(r) for r in df.collect())
    scan = df._jdf.queryExecution().executedPlan().collectLeaves().head()
    return got, scan.metrics().apply("numOutputRows").value()


@pytest.mark.parametrize(
    "query, options",
    [
        ("topic = 'orders' AND partition IN (1, 2) AND offset >= 5 AND offset < 60", {"partitioning": "queue"}),
        ("topic = 'orders' AND partition IN (1, 2) AND offset >= 5 AND offset < 60", {}),
        ("topic IN ('txn', 'raw', 'none') AND offset <= 0", {}),
        ("partition = 1 AND offset > 95", {"topics": "orders," + V2_TOPIC}),
        ("offset = 7", {"partitioning": "segment"}),
        ("topic = 'nowhere'", {}),
        # the JSON names queues the filters leave out: no error once they narrowed the read (plan.py's ``pushed``)
        (
            "topic = 'orders' AND partition = 2",
            {"startingOffsets": '{"orders": {"0": 3, "1": 4, "2": 5}, "txn": {"0": 0}}'},
        ),
    ],
)
def test_filter_pushdown(spark, vectors, query, options):
    """topic / partition / offset filters reach the JVM scan without any Spark setting (the Python source needs
    spark.sql.python.filterPushdown.enabled and pushFilters=true): it plans the same pruned ranges as the Python
    source with its pushdown, so both scans produce the same number of rows (only the matching ones, except that a
    segment-range read keeps the rows of queues its filters do not name; plan.py's bounds), and the rows equal the
    Python source's with and without its pushdown. With pushFilters=false the JVM scan reads everything."""
    path, _ = vectors
    cols = ("topic", "partition", "offset", "value", "physical_offset")

    def load(fmt, **extra):
        opts = {k: str(v) for k, v in dict(options, **extra).items()}
        return spark.read.format(fmt).options(**opts).load(str(path)).where(query).select(*cols)

    want, everything = scanned_rows(load(PY))
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        py, py_scanned = scanned_rows(load(PY, pushFilters="true"))
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    got, scanned = scanned_rows(load(JVM))
    assert got == py == want
    assert scanned == py_scanned < everything
    if options.get("partitioning") == "queue" or "partition" not in query:
        assert scanned == len(want)  # pruned to exactly the matching rows
    assert scanned_rows(load(JVM, pushFilters="false")) == (want, everything)


# ------------------------------------------------------------------------ records past the ConsumeQueues (tail)


@pytest.fixture
def undispatched(tmp_path):
    """A closed store whose dispatcher "stopped" at message 200 of 350 (test_spark_decode's recipe): orders 0..299,
    then topic ``late`` 300..349 (only in the log); returns (path, store time of message 250)."""
    import time

    from conftest import cut_dispatch

    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=200) as st:
        for i in range(350):
            if i == 250:
                time.sleep(0.02)
            r = st.put("orders" if i < 300 else "late", b"body-%06d" % i, queue_id=i % 2, tags="t%d" % (i % 3))
            if i == 200:
                cut = r.physical_offset
            if i == 250:
                t250 = r.store_timestamp
        st.wait_for_dispatch()
    cut_dispatch(str(path), cut)
    return path, t250


@pytest.mark.parametrize("mode", ["auto", "segment", "queue"])
def test_include_undispatched(spark, undispatched, mode):
    """No writer holds the store: by default (auto) and with includeUndispatched=true both readers read the records
    past the ConsumeQueues too, in every partitioning; with false only what is indexed."""
    path, _ = undispatched
    same_plan_and_rows(spark, path, expect_rows=350, partitioning=mode)
    same_plan_and_rows(spark, path, expect_rows=350, partitioning=mode, includeUndispatched="true", minPartitions=3)
    same_plan_and_rows(spark, path, expect_rows=200, partitioning=mode, includeUndispatched="false")


def test_offsets_and_times_reach_past_the_consume_queues(spark, undispatched):
    path, t250 = undispatched
    same_plan_and_rows(
        spark,
        path,
        expect_rows=(150 - 90) + (150 - 140),
        topics="orders",
        startingOffsets='{"orders": {"0": 90, "1": 140}}',
    )
    same_plan_and_rows(spark, path, expect_rows=100, startingTimestamp=t250)
    same_plan_and_rows(spark, path, expect_rows=50, startingTimestamp=t250, partitioning="queue", topics="orders")
    same_plan_and_rows(spark, path, expect_rows=0, endingTimestamp=t250, topics="late")
    same_plan_and_rows(
        spark,
        path,
        expect_rows=15 + 15,
        startingOffsets='{"late": {"0": -2, "1": 10}}',
        endingOffsets='{"late": {"0": 15, "1": -1}}',
    )


def test_undispatched_records_end_at_a_torn_write(spark, undispatched):
    """A crashed store as a kill leaves it: past the undispatched records half a record and a next segment made
    ahead and never written. Both readers end where recovery ends the log, at the torn record."""
    from localmq.store.files import StoreFiles

    path, _ = undispatched
    files = StoreFiles(str(path))
    end = files.walk_end()
    base, seg = files.segments[-1]
    record = (path / "commitlog" / ("%020d" % 0)).read_bytes()[:4096]
    record = record[: int.from_bytes(record[:4], "big")]
    with open(seg, "r+b") as f:
        f.seek(end - base)
        f.write(record[: len(record) // 2])
    with open(files.segment_path(base + SEG), "wb") as f:
        f.truncate(SEG)
    (path / "abort").touch()
    for mode in ("segment", "queue"):
        same_plan_and_rows(spark, path, expect_rows=350, partitioning=mode)


def test_undispatched_records_wait_while_a_writer_holds_the_store(spark, tmp_path):
    """With a live writer (this process holds the store's lock, seen in /proc/locks by both readers' processes),
    auto leaves the records past the ConsumeQueues for later; includeUndispatched=true reads them."""
    from conftest import cut_dispatch

    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        rs = [st.put("t", b"m%d" % i) for i in range(100)]
        st.wait_for_dispatch()
        cut_dispatch(str(path), rs[60].physical_offset)
        same_rows(spark, path, expect_rows=60)
        same_rows(spark, path, expect_rows=100, includeUndispatched="true")
    same_rows(spark, path, expect_rows=100)


def test_rocketmq_fixture_past_its_consume_queue(spark, fixtures_dir, tmp_path):
    """A RocketMQ broker store whose ConsumeQueue indexes 56 of its 179 records: the same rows with and without
    includeUndispatched, in both partitionings, and offsets that reach past the queue."""
    store = shutil.copytree(fixtures_dir / "EricPanGopher-rocketmq-9835cd5f/store/unit_test_store", tmp_path / "s")
    for mode in ("segment", "queue"):
        same_plan_and_rows(spark, store, expect_rows=179, partitioning=mode)
        same_plan_and_rows(spark, store, expect_rows=56, partitioning=mode, includeUndispatched="false")
    same_plan_and_rows(
        spark, store, expect_rows=50, startingOffsets='{"abc": {"0": 50}}', endingOffsets='{"abc": {"0": 100}}'
    )


# -------------------------------------------------------------------------------------------- SQL92 (option sql)


@pytest.fixture(scope="module")
def props_store(tmp_path_factory):
    """A closed store of 240 messages whose properties exercise RocketMQ's SQL92 conversions: ints, longs,
    floats (NaN, exponents, hex, blanks), booleans in any case, strings, and missing ones."""
    path = tmp_path_factory.mktemp("sql") / "store"
    values = [
        "0",
        "7",
        "-3",
        "2147483648",
        "9999999999",
        "1.5",
        "-0.0",
        "NaN",
        "1e3",
        " 7 ",
        "0x10p0",
        "abc",
        "",
        "true",
        "TRUE",
        "false",
        "x'y",
        "007",
    ]
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        for i in range(240):
            props = {
                "i": str(i),
                "v": values[i % len(values)],
                "w": values[(i * 7) % len(values)],
                "s": "name-%d" % (i % 9),
            }
            if i % 5 == 0:
                del props["v"]
            if i % 11 == 0:
                props = {}
            st.put("p", b"m%d" % i, queue_id=i % 3, tags="t%d" % (i % 4), properties=props or None)
        st.wait_for_dispatch()
    return path


SQL_EXPRESSIONS = [
    "i > 100",
    "i >= 100 AND i < 120",
    "i BETWEEN 10 AND 20",
    "i NOT BETWEEN 10 AND 230",
    "v = 7",
    "v > 5",
    "v < 2.5",
    "v >= 1e2",
    "v = 'abc'",
    "v <> 'abc'",
    "v = TRUE",
    "v IS NULL",
    "v IS NOT NULL",
    "v IN ('abc', 'true', '7')",
    "v NOT IN ('abc', '7')",
    "s CONTAINS '-3'",
    "s STARTSWITH 'name-1'",
    "s ENDSWITH '8'",
    "s NOT CONTAINS '4'",
    "v > w",
    "v = w",
    "NOT (v > 3)",
    "v > 3 OR w > 3",
    "v > 3 AND w < 1000",
    "-v IS NULL",
    "v > -1 /* a comment */ -- and another",
    "v < 9999999999",
    "v > 2147483647",
    "v = 1.5",
    "v BETWEEN 0 AND 1e4",
    "NOT v",
    "(v > 1 OR v IS NULL) AND NOT (w IN ('abc'))",
    "v = '007'",
    "i <> 3L",
]


@pytest.mark.parametrize("sql", SQL_EXPRESSIONS)
def test_sql_option(spark, props_store, sql):
    """Every expression keeps the same rows in both readers (the JVM reader's Sql92Filter is filter.py's port:
    Java's conversions, three-valued logic, RocketMQ's short-circuits)."""
    columns = ["offset", "partition", "properties", "physical_offset"]
    mode = "queue" if len(sql) % 2 else "segment"
    rows = same_rows(spark, props_store, columns=columns, sql=sql, partitioning=mode)
    assert len(rows) <= 240


BAD_SQL = [
    "i >",
    "v = NULL",
    "'x' > 1",
    "i BETWEEN 5 AND 1",
    "5 IN ('a')",
    "v IN (1)",
    "v = 'abc",
    "v > 1 /* x",
    "v # 1",
    "v > 1.5e999",
    "v > 99999999999999999999",
    "-v",
    "v IS 5",
    "v = 1 w",
    "",
    "(" * 70 + "v",
    "v BETWEEN NULL AND 5",
    "TRUE = 'x'",
    "v IS NOT 3",
    "v > 0.0",
    "v > 'x'",
    "i = 007",
]


@pytest.mark.parametrize("sql", BAD_SQL)
def test_bad_sql_fails_alike(spark, props_store, sql):
    """An expression that does not compile fails both readers with the same message and position."""
    same_error(spark, props_store, "ConfigError", "IllegalArgumentException", "option sql: ", sql=sql)


def test_edge_stores_and_topics(spark, vectors, fixtures_dir, tmp_path):
    """Reads that find nothing, or a bare commit log: the same (no) rows and the same partition counts."""
    path, _ = vectors
    same_plan_and_rows(spark, path, expect_rows=0, topics="nope")
    same_plan_and_rows(spark, path, expect_rows=0, topics=" , ")
    empty = tmp_path / "empty"
    with localmq.open(empty, mapped_file_size_commit_log=SEG):
        pass
    same_plan_and_rows(spark, empty, expect_rows=0)
    bare = shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979/store", tmp_path / "bare")
    assert not (bare / "consumequeue").exists() or not any((bare / "consumequeue").rglob("0000*"))
    rows = same_plan_and_rows(spark, bare, expect_rows=47, minPartitions=3, includeUndispatched="false")
    topic = rows[0]["topic"]
    same_plan_and_rows(spark, bare, topics=topic, partitioning="queue")


def test_a_path_that_is_no_store_fails_at_load(spark, vectors, tmp_path):
    """Both readers check the path (and the segment size) when the DataFrame is defined, before any action."""
    path, _ = vectors
    for fmt in (PY, JVM):
        with pytest.raises(Exception, match="not a localmq / RocketMQ store: no such directory"):
            spark.read.format(fmt).load(str(tmp_path / "nowhere"))
        with pytest.raises(Exception, match="no commitlog directory"):
            spark.read.format(fmt).load(str(path / "config"))
        with pytest.raises(Exception, match="mapped_file_size_commit_log=65536"):
            spark.read.format(fmt).option("mapped_file_size_commit_log", 1 << 20).load(str(path))
        # other options are checked when the read runs (a stream takes what a batch read refuses)
        spark.read.format(fmt).option("startingOffsets", "latest").load(str(path))
