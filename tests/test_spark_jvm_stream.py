"""Streams through both readers (issue 28): the JVM reader's MicroBatchStream (``format("localmq-jvm")``) against the
Python data source's (``format("localmq-python")``): the same micro-batches, a resume from the other reader's
checkpoint, starting offsets, bad options and a shared store read to its committed end. The helpers and vectors are
tests/test_spark_jvm.py's."""

import re

import pytest

import localmq
from test_spark_jvm import JVM, PY, SEG, partitions, same_rows


def run_stream(spark, fmt, path, out, checkpoint, **options):
    """An availableNow stream of ``path`` through reader ``fmt`` into Parquet at ``out``; returns the rows of each
    micro-batch."""
    r = spark.readStream.format(fmt).options(**{k: str(v) for k, v in options.items()})
    q = (
        r.load(str(path))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(300)
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()
    return [p["numInputRows"] for p in q.recentProgress]


def stream_rows(spark, out):
    return sorted(
        (r.asDict() for r in spark.read.parquet(str(out)).collect()),
        key=lambda r: (r["topic"], r["partition"], r["offset"]),
    )


def put_more(path, start, stop):
    """Messages start..stop-1 into ``path``: topics a and (odd ones) b, queues 0..2 (new queues and a new topic)."""
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=2000) as st:
        for i in range(start, stop):
            st.put(
                "a" if i < 1000 or i % 2 else "b",
                b"%06d" % i,
                queue_id=i % (2 if i < 1000 else 3),
                tags="t%d" % (i % 4),
                keys=["k%d" % i],
            )
        st.wait_for_dispatch()


def test_streams_give_the_same_micro_batches(spark, tmp_path):
    """The same availableNow stream through both readers (maxOffsetsPerTrigger shares a batch over the queues by
    lag, as in datasource.py): the same micro-batch sizes and, every column, the same rows; restarted from their
    checkpoints after new messages in new queues and a new topic, the same again."""
    path = tmp_path / "store"
    put_more(path, 0, 1000)
    sizes = {}
    for fmt in (PY, JVM):
        sizes[fmt] = run_stream(
            spark,
            fmt,
            path,
            tmp_path / fmt / "out",
            tmp_path / fmt / "ck",
            startingOffsets="earliest",
            maxOffsetsPerTrigger=300,
        )
    assert sizes[PY] == sizes[JVM] == [300, 300, 300, 100]
    put_more(path, 1000, 1500)
    for fmt in (PY, JVM):
        sizes[fmt] = run_stream(
            spark, fmt, path, tmp_path / fmt / "out", tmp_path / fmt / "ck", maxOffsetsPerTrigger=170
        )
    assert sizes[PY] == sizes[JVM] and sum(sizes[JVM]) == 500
    py, jvm = (stream_rows(spark, tmp_path / fmt / "out") for fmt in (PY, JVM))
    assert len(py) == len(jvm) == 1500
    for i, (a, b) in enumerate(zip(jvm, py)):
        assert a == b, (i, a, b)


def test_a_stream_resumes_from_the_other_readers_checkpoint(spark, tmp_path):
    """Offsets are the same JSON in both readers: a stream started by one resumes in the other, each message once."""
    path = tmp_path / "store"
    put_more(path, 0, 1000)
    out, ck = tmp_path / "out", tmp_path / "ck"
    assert sum(run_stream(spark, PY, path, out, ck, startingOffsets="earliest", maxOffsetsPerTrigger=400)) == 1000
    put_more(path, 1000, 1300)
    assert sum(run_stream(spark, JVM, path, out, ck)) == 300
    put_more(path, 1300, 1500)
    assert sum(run_stream(spark, PY, path, out, ck)) == 200
    assert sorted(int(r["value"]) for r in stream_rows(spark, out)) == list(range(1500))


@pytest.mark.parametrize(
    "options, rows",
    [
        ({}, 0),  # a stream starts at latest by default
        ({"startingOffsets": '{"a": {"0": 490, "1": -1}}'}, 10),  # -1: latest, allowed in a stream
        ({"startingOffsets": '{"a": {"0": -2, "1": 495}}', "topics": "a", "partitioning": "queue"}, 505),
    ],
)
def test_stream_starting_offsets(spark, tmp_path, options, rows):
    path = tmp_path / "store"
    put_more(path, 0, 1000)
    for fmt in (PY, JVM):
        assert sum(run_stream(spark, fmt, path, tmp_path / fmt / "out", tmp_path / fmt / "ck", **options)) == rows
    if rows:
        assert stream_rows(spark, tmp_path / PY / "out") == stream_rows(spark, tmp_path / JVM / "out")


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"endingOffsets": "latest"}, "endingOffsets is for batch reads only"),
        ({"endingTimestamp": "5"}, "endingTimestamp is for batch reads only"),
        ({"startingOffsets": '{"a": {"0": 0}}'}, "startingOffsets JSON must give every queue.*missing: a/1"),
        ({"maxOffsetsPerTrigger": "-5"}, "option maxOffsetsPerTrigger must be >= 1, not -5"),
    ],
)
def test_stream_bad_options_fail_alike(spark, tmp_path, options, pattern):
    path = tmp_path / "store"
    put_more(path, 0, 10)
    errors = {}
    for fmt in (PY, JVM):
        with pytest.raises(Exception) as e:
            run_stream(spark, fmt, path, tmp_path / fmt / "out", tmp_path / fmt / "ck", **options)
        errors[fmt] = str(e.value)
        assert re.search(pattern, errors[fmt]), errors[fmt]
        if fmt == JVM:
            # the query's exception carries the message; the Java exception is its cause
            origin, causes = getattr(e.value, "_origin", None), []
            while origin is not None:
                causes.append(origin.getClass().getName())
                origin = origin.getCause()
            assert "java.lang.IllegalArgumentException" in causes, causes
    assert "localmq.errors.ConfigError" in errors[PY]


def test_a_shared_store_is_read_to_its_committed_end(spark, tmp_path):
    """While processes share a store (this one holds it open shared), both readers stop at the committed end its
    control file publishes: a whole record written past it (a put being copied) is no row, even with
    includeUndispatched=true, which reads past the ConsumeQueues.

    (Found with this test: ControlView.open closed a second descriptor of the control file, which dropped this
    process's locks on it; fixed, tests/test_shared.py::test_reading_the_files_of_a_store_this_process_shares_keeps_
    its_locks.)"""
    path = tmp_path / "store"
    with localmq.open(path, shared=True, mapped_file_size_commit_log=SEG) as st:
        rs = [st.put("t", b"m%d" % i, queue_id=i % 2) for i in range(50)]
        st.wait_for_dispatch()
        seg = path / "commitlog" / ("%020d" % 0)
        data = bytearray(seg.read_bytes())
        at = rs[-1].physical_offset
        live = at + int.from_bytes(data[at : at + 4], "big")  # the committed end: after the last put
        record = bytearray(data[at:live])
        assert data[live : live + len(record)] == bytes(len(record))
        record[20:28] = (25).to_bytes(8, "big")  # the next offset of queue 1 (its CRC covers the body only)
        record[28:36] = live.to_bytes(8, "big")  # where it stands
        with open(seg, "r+b") as f:
            f.seek(live)
            f.write(record)
        for mode in ("segment", "queue"):
            options = {"partitioning": mode, "includeUndispatched": "true"}
            rows = same_rows(spark, path, expect_rows=50, **options)
            assert max(r["physical_offset"] for r in rows) == at
            assert partitions(spark, JVM, path, **options) == partitions(spark, PY, path, **options)
