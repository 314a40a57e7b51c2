"""Spark decode layer without Spark: Arrow gathers against the record decoder, planning, bounds, errors, fixtures."""

import logging
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import localmq
from conftest import cut_dispatch
from helpers import require
from localmq import _columns, _record
from localmq.errors import ConfigError, CorruptFrameError, CorruptStoreError, NotAStoreError
from localmq.store.files import StoreFiles

pa = require("pyarrow")

from localmq.spark import decode  # noqa: E402
from localmq.spark import plan as planmod  # noqa: E402
from localmq.spark.read import arrow_batches, plan  # noqa: E402

SEG = 64 * 1024
OPTS = {"mapped_file_size_commit_log": SEG}
TOPICS = ("orders", "audit", "clicks")
QUEUES = 4


def table(path, **options):
    return pa.Table.from_batches(
        list(arrow_batches(path, **dict(OPTS, **options))),
        schema=decode.arrow_schema(options["columns"].split(",") if "columns" in options else None),
    )


@pytest.fixture
def written(tmp_path):
    return write_store(tmp_path)


def write_store(tmp_path):
    """A closed store (64 KiB segments, 10-unit CQ files) with 3 topics x 4 queues; returns (path, messages)."""
    path = tmp_path / "store"
    sent = []
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=200) as st:
        for i in range(1200):
            topic, qid = TOPICS[i % 3], (i // 3) % QUEUES
            keys = [f"k{i}", "x"] if i % 4 == 0 else None
            r = st.put(
                topic,
                b"body-%06d" % i,
                queue_id=qid,
                tags=f"t{i % 5}" if i % 2 else None,
                keys=keys,
                properties={"n": str(i)},
            )
            sent.append((topic, qid, r.queue_offset, i))
        st.wait_for_dispatch()
    return str(path), sent


def records(props=None, n=6):
    """Hand-made records: IPv4 and IPv6 store hosts, with and without properties, keys with extra spaces."""
    out, pos = [], 0
    for i in range(n):
        p = (
            props
            if props is not None
            else ({"TAGS": f"tag{i}", "KEYS": f" a{i}  b ", "UNIQ_KEY": f"U{i}"} if i % 2 == 0 else None)
        )
        r = localmq.encode_message(
            f"top{i % 2}",
            b"v" * i,
            queue_id=i,
            queue_offset=10 + i,
            physical_offset=pos,
            store_host="[fe80::1]:10911" if i == 3 else "10.1.2.3:10911",
            born_host="[::1]:9" if i == 5 else "127.0.0.1:1",
            store_timestamp=1000 + i,
            born_timestamp=900 + i,
            reconsume_times=i,
            properties=p,
        )
        out.append(r)
        pos += len(r)
    return b"".join(out) + bytes(64)


def test_arrow_schema_is_what_spark_expects():
    require("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {
        "binary": BinaryType(),
        "string": StringType(),
        "int": IntegerType(),
        "bigint": LongType(),
        "timestamp": TimestampType(),
        "array<string>": ArrayType(StringType()),
        "map<string,string>": MapType(StringType(), StringType()),
    }
    spark_schema = StructType([StructField(n, types[t]) for n, t in decode.COLUMNS])
    assert decode.arrow_schema().equals(to_arrow_schema(spark_schema, timezone="UTC"))
    assert [n for n, _ in decode.COLUMNS][:7] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_batch_columns_match_the_record_decoder():
    data = records()
    cols = _columns.RecordColumns(16)
    n, _, reason = _columns.decode_range(data, cols)
    assert (n, reason) == (6, "end")
    rows = decode.record_batch(cols, None, [c for c, _ in decode.COLUMNS], decode.arrow_schema()).to_pylist()
    pos = 0
    for row in rows:
        m = localmq.decode_message(data, pos)
        pos += m.store_size
        assert row["value"] == m.body and row["topic"] == m.topic
        assert (row["partition"], row["offset"], row["physical_offset"]) == (
            m.queue_id,
            m.queue_offset,
            m.physical_offset,
        )
        assert row["timestamp"].timestamp() * 1000 == pytest.approx(m.store_timestamp)
        assert row["born_timestamp"].timestamp() * 1000 == pytest.approx(m.born_timestamp)
        assert row["timestampType"] == decode.TIMESTAMP_TYPE_LOG_APPEND
        assert row["tags"] == m.tags
        assert row["keys"] == list(m.keys)
        assert row["key"] == (m.properties["KEYS"].encode() if "KEYS" in m.properties else None)
        assert dict(row["properties"]) == m.properties
        assert row["msg_id"] == m.msg_id
        assert (row["reconsume_times"], row["sys_flag"]) == (m.reconsume_times, m.sys_flag)
    assert len(rows[3]["msg_id"]) == 56 and len(rows[0]["msg_id"]) == 32


def test_row_selection_and_topic_codes():
    data = records()
    cols = _columns.RecordColumns(16)
    _columns.decode_range(data, cols)
    codes, names = _columns.topic_codes(cols)
    assert names == ["top0", "top1"] and codes.tolist() == [0, 1, 0, 1, 0, 1]
    sel = np.array([5, 0, 2])
    b = decode.record_batch(cols, sel, ["value", "offset", "tags"], decode.arrow_schema(["value", "offset", "tags"]))
    assert b.to_pydict() == {"value": [b"v" * 5, b"", b"vv"], "offset": [15, 10, 12], "tags": [None, "tag0", "tag2"]}
    with pytest.raises(IndexError):
        _columns.gather_binary(cols, "body", np.array([6]))


def test_topic_codes_of_many_topics_interleaved():
    # past 16 distinct topics the codes come from a dict of their bytes (a linear search was quadratic): every row's
    # code names its record's topic, codes in order of first occurrence, one per distinct topic
    topics = [f"t{i % 40}-{'x' * (i % 3)}" for i in range(500)]
    data = b"".join(localmq.encode_message(t, b"b", physical_offset=0) for t in topics)
    cols = _columns.RecordColumns(1024)
    assert _columns.decode_range(data, cols)[0] == 500
    codes, names = _columns.topic_codes(cols)
    assert [names[c] for c in codes.tolist()] == topics
    assert names == list(dict.fromkeys(topics)) and len(names) == 120


def test_properties_follow_rocketmq_parsing_rules():
    raw = b"A\x01x\x02\x01bad\x02short\x02E\x01\x02K\x01v1\x01v2\x02KEYS\x01 one  two \x02TAGS\x01t\x02"
    cols = _columns.RecordColumns(4)
    _columns.decode_range(localmq.encode_message("t", b"b", properties=raw), cols)
    row = decode.record_batch(
        cols, None, ["properties", "keys", "key", "tags"], decode.arrow_schema(["properties", "keys", "key", "tags"])
    ).to_pylist()[0]
    assert dict(row["properties"]) == localmq.parse_properties(raw)
    assert row["keys"] == ["one", "two"] and row["key"] == b" one  two " and row["tags"] == "t"


def test_decode_positions_checks_sizes_and_records():
    data = records()
    cols = _columns.RecordColumns(16)
    _columns.decode_range(data, cols)
    pos, sizes = cols["physical_offset"].copy(), cols["store_size"].copy()
    out = _columns.RecordColumns(16)
    assert _columns.decode_positions(data, out, pos[::-1], sizes[::-1]) == (6, 6, "end")
    assert out["queue_id"].tolist() == [5, 4, 3, 2, 1, 0]
    assert _columns.decode_positions(data, out, pos[:2], sizes[:2] + 1)[2] == "corrupt"
    assert _columns.decode_positions(data, out, [pos[1] + 1])[2] == "corrupt"
    assert _columns.decode_positions(data, out, [len(data) - 8])[2] == "corrupt"  # zero bytes, not a record
    assert _columns.decode_positions(data, _columns.RecordColumns(2), pos)[:3] == (2, 2, "full")


def expected_rows(sent, topics=TOPICS, bounds=None):
    out = set()
    for topic, qid, off, i in sent:
        if topic not in topics:
            continue
        lo, hi = (bounds or {}).get((topic, qid), (0, 1 << 62))
        if lo <= off < hi:
            out.add((topic, qid, off, b"body-%06d" % i))
    return out


def rows_of(t):
    d = t.select(["topic", "partition", "offset", "value"]).to_pydict()
    return list(zip(d["topic"], d["partition"], d["offset"], d["value"]))


@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_whole_store_in_both_partitionings(written, mode):
    path, sent = written
    p = plan(path, partitioning=mode, minPartitions=5, **OPTS)
    assert p.mode == mode and len(p.partitions) >= 5
    assert p.offsets == {(t, q): (0, sum(1 for s in sent if s[:2] == (t, q))) for t in TOPICS for q in range(QUEUES)}
    got = rows_of(table(path, partitioning=mode, minPartitions=5, batchSize=97))
    assert len(got) == len(sent) and set(got) == expected_rows(sent)


def ranges_of(part):
    return part.ranges if isinstance(part, planmod.SegmentRanges) else (part,)


@pytest.mark.parametrize("wanted", [1, 2, 3, 7])
def test_segment_partitions_start_at_record_boundaries(written, wanted):
    path, _ = written
    p = plan(path, partitioning="segment", minPartitions=wanted, **OPTS)
    for part in p.partitions:
        for r in ranges_of(part):
            mf = localmq._mapped_file.MappedFile(r.path, SEG, r.base, create=False, writable=False)
            try:
                assert _record.scan_record(mf, r.start)[0] in ("ok", "blank")
            finally:
                mf.close()
    # the ranges tile the log in order; shares are a multiple of the wanted count, none over a segment, even
    flat = [r for part in p.partitions for r in ranges_of(part)]
    assert all(
        a.base + a.end == b.base + b.start or (b.start == 0 and b.base == a.base + SEG) for a, b in zip(flat, flat[1:])
    )
    shares = [sum(r.end - r.start for r in ranges_of(part)) for part in p.partitions]
    assert len(shares) % wanted == 0 and max(shares) <= SEG
    assert max(shares) - min(shares) < 1024  # within a record or so (records here are under 300 bytes)
    assert any(isinstance(part, planmod.SegmentRanges) for part in p.partitions) or wanted == 7


@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_offsets_topics_and_bounds(written, mode):
    path, sent = written
    # Kafka's rule: JSON offsets name every queue of the topics read (-2 earliest, -1 latest)
    starting = '{"orders": {"0": 5, "1": -2, "2": -2, "3": -2}, "clicks": {"0": -2, "1": 30, "2": -2, "3": -2}}'
    ending = '{"orders": {"0": 50, "1": -1, "2": -1, "3": 7}, "clicks": {"0": -1, "1": -1, "2": -1, "3": -1}}'
    t = table(path, topics="orders,clicks", startingOffsets=starting, endingOffsets=ending, partitioning=mode)
    n = {(tp, q): sum(1 for s in sent if s[:2] == (tp, q)) for tp in TOPICS for q in range(QUEUES)}
    bounds = {("orders", 0): (5, 50), ("orders", 3): (0, 7), ("clicks", 1): (30, n[("clicks", 1)])}
    assert set(rows_of(t)) == expected_rows(sent, ("orders", "clicks"), bounds)
    assert len(rows_of(t)) == len(expected_rows(sent, ("orders", "clicks"), bounds))


def test_timestamps_select_by_store_time(tmp_path):
    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        st.put_batch("t", [b"a"] * 30, queue_id=0)
        st.wait_for_dispatch()
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        st.put_batch("t", [b"b"] * 20, queue_id=0)
        st.wait_for_dispatch()
    later = table(str(path), startingTimestamp=cut)
    assert later.column("value").to_pylist() == [b"b"] * 20 and later.column("offset").to_pylist()[0] == 30
    assert (pa.compute.min(later.column("timestamp")).as_py().timestamp() * 1000) >= cut
    earlier = table(str(path), endingTimestamp=cut)
    assert earlier.column("value").to_pylist() == [b"a"] * 30


def test_columns_subset(written):
    path, sent = written
    t = table(path, columns="offset,value")
    assert t.column_names == ["offset", "value"] and t.num_rows == len(sent)


def test_not_a_store(tmp_path):
    with pytest.raises(NotAStoreError, match="no commitlog directory"):
        list(arrow_batches(str(tmp_path)))
    with pytest.raises(NotAStoreError):
        list(arrow_batches(str(tmp_path / "missing")))
    with pytest.raises(ConfigError):
        list(arrow_batches(str(tmp_path), startingOffsets="nonsense"))


def test_wrong_segment_size_is_named(written):
    """Without the option the size comes from the store's settings record (issue 14); a wrong one is named."""
    path, sent = written
    assert sum(b.num_rows for b in arrow_batches(path)) == len(sent)
    with pytest.raises(CorruptStoreError, match="mapped_file_size_commit_log=65536"):
        list(arrow_batches(path, mapped_file_size_commit_log=1 << 30))


def test_corrupt_record_inside_the_range_raises(written):
    path, sent = written
    seg = os.path.join(path, "commitlog", "%020d" % 0)
    with open(seg, "rb") as f:
        data = f.read()
    cols = _columns.RecordColumns(1024)
    _columns.decode_range(data, cols)
    # break the magic of the first record that starts after position 1000: a damaged record with data after it
    at = int(cols["physical_offset"][np.searchsorted(cols["physical_offset"], 1000)])
    with open(seg, "r+b") as f:
        f.seek(at + 4)
        f.write(b"\0\0\0\1")
    for mode in ("segment", "queue"):
        with pytest.raises(CorruptFrameError) as e:
            list(arrow_batches(path, partitioning=mode, **OPTS))
        assert e.value.offset == at and e.value.path == seg


ALL_ORDERS_FROM_0 = '{"orders": {"0": 0, "1": -2, "2": -2, "3": -2}}'


def test_offsets_json_must_name_every_queue(written):
    """Kafka's rule: a queue left out of JSON offsets is an error, not a silent earliest/latest; without a topics
    option the JSON's topics are the ones read."""
    path, sent = written
    with pytest.raises(ConfigError, match="every queue.*missing: orders/1, orders/2, orders/3"):
        plan(path, startingOffsets='{"orders": {"0": 0}}', **OPTS)
    with pytest.raises(ConfigError, match="endingOffsets.*missing: clicks/0"):
        plan(path, topics="orders,clicks", endingOffsets='{"orders": {"0": 1, "1": 1, "2": 1, "3": 1}}', **OPTS)
    with pytest.raises(ConfigError, match="does not have.*orders/9"):
        plan(path, startingOffsets='{"orders": {"0": 0, "1": 0, "2": 0, "3": 0, "9": 0}}', **OPTS)
    p = plan(path, startingOffsets='{"orders": {"0": 3, "1": -2, "2": -2, "3": -2}}', **OPTS)
    assert {t for t, _ in p.offsets} == {"orders"}
    assert p.offsets[("orders", 0)][0] == 3


def test_retention_and_fail_on_data_loss(written, caplog):
    path, sent = written
    os.unlink(os.path.join(path, "commitlog", "%020d" % 0))  # what retention does to the oldest segment
    p = plan(path, **OPTS)
    lo = p.offsets[("orders", 0)][0]
    assert lo > 0
    with pytest.raises(planmod.OffsetRangeError, match="failOnDataLoss"):
        plan(path, startingOffsets=ALL_ORDERS_FROM_0, **OPTS)
    with caplog.at_level(logging.WARNING, logger="localmq.spark"):
        t = table(path, startingOffsets=ALL_ORDERS_FROM_0, failOnDataLoss="false", topics="orders")
    assert "removed by retention" in caplog.text
    offs = [o for tp, q, o, _ in rows_of(t) if q == 0]
    assert min(offs) == lo


def test_rocketmq_fixture_bare_commitlog(fixtures_dir, tmp_path):
    store = shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store")
    with pytest.raises(CorruptStoreError, match="mapped_file_size_commit_log=8192"):
        list(arrow_batches(str(store), mapped_file_size_commit_log=1 << 30))
    # a RocketMQ store has no settings record: the size is read off its segment files
    assert pa.Table.from_batches(list(arrow_batches(str(store)))).num_rows == 47
    t = table(str(store), mapped_file_size_commit_log=8192)
    assert t.num_rows == 47
    assert t.column("offset").to_pylist() == list(range(47))
    assert set(t.column("value").to_pylist()) == {b"Once, there was a chance for me!"}
    assert set(t.column("tags").to_pylist()) == {"TAG1"} and set(t.column("topic").to_pylist()) == {"abc"}
    assert t.column("physical_offset").to_pylist() == [172 * i for i in range(47)]
    assert t.column("msg_id").to_pylist()[1] == "C0A8470100001FBB" + "%016X" % 172  # store host 192.168.71.1:8123


def spec_walk(commitlog):
    """(queue offset, physical offset) of every record of a RocketMQ commit log, walked as the spec's section 1
    lays records out: TOTALSIZE, MAGICCODE (0xDAA320A7; blank 0xCBD43194 ends a file), QUEUEOFFSET at 20,
    PHYSICALOFFSET at 28; a zero size ends the data."""
    out = []
    for name in sorted(os.listdir(commitlog)):
        data = (commitlog / name).read_bytes()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">iI", data, pos)
            if size == 0 or magic == 0xCBD43194:
                break
            assert magic == 0xDAA320A7
            out.append(struct.unpack_from(">qq", data, pos + 20))
            pos += size
    return out


def test_rocketmq_fixture_with_consume_queues(fixtures_dir, tmp_path):
    """A store whose ConsumeQueue stops at unit 56 while its commit log holds 179 records (never dispatched):
    with no writer holding it, a batch read gives every record; includeUndispatched=false gives what is indexed."""
    src = fixtures_dir / "EricPanGopher-rocketmq-9835cd5f" / "store" / "unit_test_store"
    store = shutil.copytree(src, tmp_path / "store")
    units = localmq.read_consume_queue(str(store / "consumequeue" / "abc" / "0"))
    records = spec_walk(store / "commitlog")
    assert len(records) == 179 and len(units) == 56
    for mode in ("segment", "queue"):
        t = table(str(store), mapped_file_size_commit_log=8192, partitioning=mode)
        got = sorted(zip(t.column("offset").to_pylist(), t.column("physical_offset").to_pylist()))
        assert got == sorted(records)
        t = table(str(store), mapped_file_size_commit_log=8192, partitioning=mode, includeUndispatched="false")
        assert t.column("offset").to_pylist() == list(range(len(units)))
        assert t.column("physical_offset").to_pylist() == units["offset"].tolist()
    # offsets and times reach into the undispatched records
    t = table(
        str(store),
        mapped_file_size_commit_log=8192,
        startingOffsets='{"abc": {"0": 50}}',
        endingOffsets='{"abc": {"0": 100}}',
    )
    assert sorted(t.column("offset").to_pylist()) == list(range(50, 100))
    p = plan(str(store), mapped_file_size_commit_log=8192)
    assert p.offsets == {("abc", 0): (0, 179)}


@pytest.fixture
def undispatched(tmp_path):
    """A closed store whose dispatcher "stopped" at message 200 of 350: orders 0..299 then topic ``late``
    50 (only in the log); returns (path, sent rows, store time of the first message after the pause)."""
    path = tmp_path / "store"
    sent = []
    with localmq.open(path, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=200) as st:
        for i in range(350):
            if i == 250:
                time.sleep(0.02)
            r = st.put("orders" if i < 300 else "late", b"body-%06d" % i, queue_id=i % 2)
            if i == 200:
                cut = r.physical_offset
            if i == 250:
                t250 = r.store_timestamp
            sent.append(("orders" if i < 300 else "late", i % 2, r.queue_offset, i))
        st.wait_for_dispatch()
    cut_dispatch(str(path), cut)
    return str(path), sent, t250


def test_undispatched_records_are_read_from_a_stopped_store(undispatched):
    path, sent, t250 = undispatched
    assert planmod.writer_active(path) is False
    want = {(t, q, o, b"body-%06d" % i) for t, q, o, i in sent}
    for mode in ("segment", "queue"):
        t = table(path, partitioning=mode)
        assert sorted(rows_of(t)) == sorted(want)
        t = table(path, partitioning=mode, includeUndispatched="false")
        assert sorted(rows_of(t)) == sorted(r for r in want if int(r[3][5:]) < 200)
    p = plan(path, **OPTS)
    assert p.offsets == {("orders", 0): (0, 150), ("orders", 1): (0, 150), ("late", 0): (0, 25), ("late", 1): (0, 25)}
    # offsets and store times that fall past the ConsumeQueues
    t = table(path, topics="orders", startingOffsets='{"orders": {"0": 90, "1": 140}}')
    assert sorted(rows_of(t)) == sorted(r for r in want if r[0] == "orders" and r[2] >= (90, 140)[r[1]])
    t = table(path, startingTimestamp=t250)
    assert sorted(rows_of(t)) == sorted(r for r in want if int(r[3][5:]) >= 250)
    t = table(path, endingTimestamp=t250, topics="late")
    assert t.num_rows == 0


def test_undispatched_records_end_at_a_torn_write(undispatched):
    """A crashed store as a kill leaves it, not recovered: past the undispatched records, half of a record (a put
    the kill cut short) and a next segment made ahead and never written. The read ends where recovery ends the
    log, at the torn record, with every whole record (it raised CorruptFrameError on the torn one)."""
    path, sent, _ = undispatched
    files = StoreFiles(path)
    end = files.walk_end()
    base, seg = files.segments[-1]
    with open(files.segments[0][1], "rb") as f:
        first = f.read(4096)
    record = first[: int.from_bytes(first[:4], "big")]
    with open(seg, "r+b") as f:
        f.seek(end - base)
        f.write(record[: len(record) // 2])
    with open(files.segment_path(base + SEG), "wb") as f:
        f.truncate(SEG)
    open(os.path.join(path, "abort"), "wb").close()
    want = {(t, q, o, b"body-%06d" % i) for t, q, o, i in sent}
    for mode in ("segment", "queue"):
        assert sorted(rows_of(table(path, partitioning=mode))) == sorted(want)
    with localmq.open(path, **OPTS) as st:  # recovery ends the log at the same offset
        assert st.recovery.end_offset == end


def test_undispatched_records_wait_while_a_writer_holds_the_store(tmp_path):
    """With a live writer, records past the ConsumeQueues may still be written: auto leaves them for later."""
    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        rs = [st.put("t", b"m%d" % i) for i in range(100)]
        st.wait_for_dispatch()
        assert planmod.writer_active(str(path)) is True
        cut_dispatch(str(path), rs[60].physical_offset)
        assert table(str(path)).num_rows == 60
        assert table(str(path), includeUndispatched="true").num_rows == 100
    assert planmod.writer_active(str(path)) is False
    with pytest.raises(ConfigError, match="includeUndispatched"):
        plan(str(path), includeUndispatched="maybe")


def test_topics_without_queues_read_nothing(written):
    path, _ = written
    p = plan(path, topics="nothing-here", **OPTS)
    assert p.partitions == [] and p.offsets == {}


def test_transactional_half_and_rollback_records_are_not_rows(tmp_path):
    """A dispatcher skips PREPARED (sysflag 0x4) and ROLLBACK (0xC) records (spec 1.3, dispatch): a read of the
    log does too, COMMIT (0x8) and plain records are rows."""
    seg = 4096
    flags = [0x0, 0x4, 0x8, 0xC, 0x0]
    data, pos = b"", 0
    for i, f in enumerate(flags):
        r = localmq.encode_message("tx", b"m%d" % i, queue_offset=i, physical_offset=pos, sys_flag=f)
        data += r
        pos += len(r)
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / ("%020d" % 0)).write_bytes(data + bytes(seg - len(data)))
    t = table(str(tmp_path), mapped_file_size_commit_log=seg)
    assert t.column("value").to_pylist() == [b"m0", b"m2", b"m4"]
    assert t.column("sys_flag").to_pylist() == [0x0, 0x8, 0x0]
    for columns in ("value", "value,sys_flag,offset"):  # the single-pass scan's columns
        t = table(str(tmp_path), mapped_file_size_commit_log=seg, columns=columns)
        assert t.column("value").to_pylist() == [b"m0", b"m2", b"m4"]


def test_spark_finds_the_data_source_without_registering(tmp_path):
    """What Spark 4's lookup_data_sources does in a fresh worker (pkgutil.iter_modules for ``pyspark_*`` modules
    with a DefaultSource), run with no PYTHONPATH from another directory: the install must expose the module."""
    require("pyspark")
    code = (
        "import pkgutil, importlib\n"
        "found = [m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_localmq']\n"
        "src = importlib.import_module(found[0]).DefaultSource if found else None\n"
        "print(src.name() if src else 'missing', src.__module__ if src else '')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["localmq", "localmq.spark.datasource"], (
        "pyspark_localmq is not visible to pkgutil: install with pip install --config-settings "
        "editable_mode=compat -e . (or a regular install), as the README says"
    )


def test_pushed_filters_narrow_the_plan(written):
    """pushFilters (Spark 4.1+) prunes topics, queues and offsets, and hands every filter back to Spark."""
    require("pyspark")
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, IsNotNull, LessThan, StringStartsWith
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from localmq.spark.datasource import LocalMQFilteringReader as LocalMQReader

    schema = StructType(
        [StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType())]
    )

    path, sent = written
    reader = LocalMQReader(dict(OPTS, path=path), schema)
    filters = [
        EqualTo(("topic",), "orders"),
        In(("partition",), (1, 3)),
        GreaterThanOrEqual(("offset",), 10),
        LessThan(("offset",), 40),
        StringStartsWith(("topic",), "ord"),
        IsNotNull(("offset",)),
    ]
    assert list(reader.pushFilters(filters)) == filters
    p = planmod.plan_batch(reader.opts)
    assert p.offsets == {("orders", 1): (10, 40), ("orders", 3): (10, 40)}
    rows = [
        r
        for part in p.partitions
        for b in decode.read_partition(part, ["topic", "partition", "offset"])
        for r in zip(*(b.column(i).to_pylist() for i in range(3)))
    ]
    kept = [r for r in rows if r[0] == "orders" and r[1] in (1, 3) and 10 <= r[2] < 40]
    assert sorted(kept) == sorted(("orders", q, o) for q in (1, 3) for o in range(10, 40))
    # a JSON offsets option naming more topics than the filters leave is not an error
    reader = LocalMQReader(
        dict(
            OPTS,
            path=path,
            startingOffsets='{"orders": {"0": 1, "1": 2, "2": 3, "3": 4}, "clicks": {"0": 0, "1": 0, "2": 0, "3": 0}}',
        ),
        schema,
    )
    list(reader.pushFilters([EqualTo(("topic",), "orders"), EqualTo(("partition",), 2)]))
    assert planmod.plan_batch(reader.opts).offsets == {("orders", 2): (3, 100)}


def test_pushed_not_filter_is_handed_back(written):
    """A pushed Not filter (``topic <> 'x'``) names no column of its own: it prunes nothing and goes back to Spark
    (it raised AttributeError)."""
    require("pyspark")
    from pyspark.sql.datasource import EqualTo, Not
    from pyspark.sql.types import StringType, StructField, StructType

    from localmq.spark.datasource import LocalMQFilteringReader

    path, _ = written
    reader = LocalMQFilteringReader(dict(OPTS, path=path), StructType([StructField("topic", StringType())]))
    filters = [Not(EqualTo(("topic",), "orders"))]
    assert list(reader.pushFilters(filters)) == filters
    assert reader.opts.topics is None and not reader.opts.pushed


@pytest.mark.parametrize("partitioning", ["segment", "queue"])
def test_gap_record_fails_on_data_loss_or_is_read_past(written, partitioning, caplog):
    """A damaged record in the middle of the log becomes a gap record at the next open (issue 13): Spark reads
    every other row, and the loss follows failOnDataLoss (an OffsetRangeError naming it by default)."""
    path, sent = written
    victim = 600
    store = dict(OPTS, mapped_file_size_consume_queue=200)
    with localmq.open(path, **store) as st:
        m = st.get_message(sent[victim][0], sent[victim][1], sent[victim][2], 1).messages[0]
    seg_path = os.path.join(path, "commitlog", "%020d" % (m.physical_offset - m.physical_offset % SEG))
    with open(seg_path, "r+b") as f:  # one body byte flipped: the CRC no longer matches
        f.seek(m.physical_offset % SEG)
        at = m.physical_offset % SEG + f.read(m.store_size).index(m.body) + 3
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    with localmq.open(path, **store) as st:
        assert [g["offset"] for g in st.recovery.gaps] == [m.physical_offset]
    with pytest.raises(planmod.OffsetRangeError, match="failOnDataLoss"):
        table(path, partitioning=partitioning)
    with caplog.at_level(logging.WARNING, logger="localmq.spark"):
        t = table(path, partitioning=partitioning, failOnDataLoss="false")
    assert str(m.physical_offset) in caplog.text
    want = sorted((tp, q, o) for tp, q, o, i in sent if i != victim)
    assert sorted((tp, q, o) for tp, q, o, _ in rows_of(t)) == want


def test_misspelled_option_is_an_error_naming_the_right_one(written):
    """Issue 14: a misspelled option was silently ignored."""
    path, _ = written
    with pytest.raises(ConfigError, match="(?i)'startingoffset'.*did you mean 'startingOffsets'"):
        plan(path, startingOffset="earliest", **OPTS)
    with pytest.raises(ConfigError, match="'checkcr'.*checkCRC"):
        list(arrow_batches(path, checkcr="true", **OPTS))


def _ns(t):
    """The ``n`` property of each row, as ints, sorted."""
    return sorted(int(dict(p)["n"]) for p in t.column("properties").to_pylist())


@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_tags_and_sql_options_keep_the_rows_a_subscription_would(written, mode):
    """Issue 15: ``tags`` ("a || b", as a consumer's subscription) and ``sql`` (RocketMQ's SQL92 on the
    properties) keep rows exactly; queue partitioning drops units by tag hash code before decoding."""
    path, _ = written
    cols = "topic,partition,offset,tags,properties"
    t = table(path, partitioning=mode, tags=" t1 || t3 ", columns=cols)
    assert _ns(t) == [i for i in range(1200) if i % 2 and i % 5 in (1, 3)]
    assert set(t.column("tags").to_pylist()) == {"t1", "t3"}
    assert _ns(table(path, partitioning=mode, tags="*", columns=cols)) == list(range(1200))
    t = table(path, partitioning=mode, sql="n BETWEEN 100 AND 199 AND TAGS IS NOT NULL", columns=cols)
    assert _ns(t) == [i for i in range(100, 200) if i % 2]
    t = table(
        path, partitioning=mode, tags="t2", sql="n >= 600 OR KEYS = 'k8 x'", topics="orders", columns="value,properties"
    )
    assert _ns(t) == [i for i in range(1200) if i % 3 == 0 and i % 2 and i % 5 == 2 and i >= 600]
    assert len(table(path, partitioning=mode, tags="t9")) == 0


def test_queue_partitions_prefilter_units_by_tag_hash_then_check_the_tag(tmp_path):
    """ "Aa" and "BB" share a Java hashCode: the ConsumeQueue step keeps both, the exact check only "Aa"."""
    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        assert localmq.java_hash("Aa") == localmq.java_hash("BB")
        for i in range(60):
            st.put("t", b"%d" % i, queue_id=0, tags=("Aa", "BB", "Cc")[i % 3], properties={"n": str(i)})
        st.wait_for_dispatch()
    (part,) = plan(str(path), partitioning="queue", minPartitions=1, tags="Aa", **OPTS).partitions
    assert isinstance(part, planmod.QueueRange) and part.tag_names == frozenset({"Aa"})
    qoffs, _, _ = decode._queue_units(part)
    assert qoffs.tolist() == [i for i in range(60) if i % 3 != 2]  # "Cc" never decoded
    for mode in ("queue", "segment"):
        t = table(str(path), partitioning=mode, tags="Aa")
        assert t.column("offset").to_pylist() == list(range(0, 60, 3))
        assert set(t.column("tags").to_pylist()) == {"Aa"}


def test_filter_options_are_checked(written):
    path, _ = written
    with pytest.raises(ConfigError, match="option sql: .*out of order.*position 10") as e:
        plan(path, sql="n BETWEEN 5 AND 1", **OPTS)
    assert isinstance(e.value.__cause__, localmq.FilterSyntaxError) and e.value.__cause__.position == 10
    with pytest.raises(ConfigError, match="option sql: unexpected end"):
        plan(path, sql="n >", **OPTS)
    with pytest.raises(ConfigError, match="'tag'.*did you mean 'tags'"):
        plan(path, tag="a", **OPTS)
