"""The single-pass Arrow scan (``_scan.scan_range``, ``scan_positions``) against the general path (``decode_range``
/ ``decode_positions`` + gathers) of the Spark decode layer, without Spark: what the scan yields must be the general
path's output, byte for byte, errors included. The stores and helpers are tests/test_spark_decode.py's."""

import os
import shutil
import struct
import time

import numpy as np
import pytest

import localmq
from helpers import require
from localmq import _columns, _record, _scan
from localmq.errors import CorruptFrameError, CorruptStoreError

pa = require("pyarrow")

from localmq.spark import decode  # noqa: E402
from localmq.spark import plan as planmod  # noqa: E402
from localmq.spark.read import arrow_batches, plan  # noqa: E402
from test_spark_decode import OPTS, SEG, TOPICS, ranges_of, records, table, write_store  # noqa: E402


@pytest.fixture
def written(tmp_path):
    """tests/test_spark_decode.py's store: 3 topics x 4 queues over several segments; (path, messages)."""
    return write_store(tmp_path)


# ---------------------------------------------------------------------------------------------- single-pass scan
# The cheap columns are read by one walk (_scan.scan_range) instead of decode_range + gathers; what it yields
# must be the general path's output, byte for byte, errors included.

SCAN_COLUMNS = [c for c in decode._SCAN_FIELDS]


@pytest.fixture
def general_path(monkeypatch):
    """Call to make the reader use decode_range / decode_positions + gathers only (what every read used before)."""

    def force():
        monkeypatch.setattr(decode, "_scan_fields", lambda columns, *always: None)

    return force


@pytest.fixture
def scans(monkeypatch):
    """Counts the single-pass scans (segment ranges and ConsumeQueue units) the reader makes."""
    seen = []
    for name in ("scan_range", "scan_positions"):

        def spy(*args, _real=getattr(_scan, name), **kw):
            seen.append(args[1:3])
            return _real(*args, **kw)

        monkeypatch.setattr(decode._scan, name, spy)
    return seen


def both_paths(general_path, scans, read):
    """``read()`` through the scan (which must serve it), then through the general path: the two results."""
    fast = read()
    assert scans, "the single-pass scan did not serve this read"
    general_path()
    return fast, read()


def batches(path, **options):
    return list(arrow_batches(path, **dict(OPTS, **options)))


def assert_same(fast, general):
    """Equal schemas and columns, down to the bytes of every value buffer."""
    ft, gt = pa.Table.from_batches(fast), pa.Table.from_batches(general)
    assert ft.schema.equals(gt.schema) and ft.num_rows == gt.num_rows
    assert ft.equals(gt)
    for name in ft.column_names:
        fc, gc = ft.column(name).combine_chunks(), gt.column(name).combine_chunks()
        assert [None if b is None else b.to_pybytes() for b in fc.buffers()[1:]] == [
            None if b is None else b.to_pybytes() for b in gc.buffers()[1:]
        ], name


def test_written_store_spans_segments_with_blank_ends(written):
    path, _ = written
    segs = sorted(os.listdir(os.path.join(path, "commitlog")))
    assert len(segs) >= 3
    with open(os.path.join(path, "commitlog", segs[0]), "rb") as f:
        data = f.read()
    pos, outcome, _, _, _ = _record.walk_records(data, 0, -1, True)
    assert outcome == "blank" and pos < SEG


@pytest.mark.parametrize("columns", ["value", "partition,value,offset", ",".join(SCAN_COLUMNS)])
@pytest.mark.parametrize("batch", [65536, 97, 1])
@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_scan_matches_general_path_whole_store(written, general_path, scans, columns, batch, mode):
    path, sent = written
    fast, general = both_paths(
        general_path, scans, lambda: batches(path, columns=columns, batchSize=batch, partitioning=mode, minPartitions=3)
    )
    assert_same(fast, general)
    # no row filter: the same batches too
    assert [b.num_rows for b in fast] == [b.num_rows for b in general]
    assert sum(b.num_rows for b in fast) == len(sent)


@pytest.mark.parametrize(
    "options",
    [
        {"topics": "orders,clicks"},
        {
            "topics": "audit",
            "startingOffsets": '{"audit": {"0": -2, "1": 20, "2": -2, "3": -2}}',
            "endingOffsets": '{"audit": {"0": -1, "1": 60, "2": -1, "3": 5}}',
        },
        {
            "startingOffsets": '{"orders": {"0": 5, "1": -2, "2": -2, "3": -2}, "clicks": {"0": -2, "1": 30, "2": -2, '
            '"3": -2}}',
            "endingOffsets": '{"orders": {"0": 50, "1": -1, "2": -1, "3": 7}, "clicks": {"0": -1, "1": -1, "2": -1, '
            '"3": -1}}',
        },
        {"checkCRC": "true"},
    ],
)
@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_scan_matches_general_path_with_row_filters(written, general_path, scans, options, mode):
    path, _ = written
    columns = "topic,partition,offset,value,physical_offset"
    fast, general = both_paths(
        general_path, scans, lambda: batches(path, columns=columns, batchSize=50, partitioning=mode, **options)
    )
    assert_same(fast, general)
    assert sum(b.num_rows for b in fast) > 0


def test_scan_matches_general_path_on_a_bare_commitlog_by_time(tmp_path, general_path, scans):
    """No ConsumeQueues: store-time and offset filters are row filters of the scan."""
    path = tmp_path / "store"
    with localmq.open(path, mapped_file_size_commit_log=SEG) as st:
        for i in range(6):
            st.put_batch(TOPICS[i % 3], [b"m%04d-%d" % (j, i) * (1 + j % 7) for j in range(150)], queue_id=i % 2)
            st.wait_for_dispatch()
            time.sleep(0.01)
    shutil.rmtree(path / "consumequeue")
    cols = _columns.RecordColumns(4096)
    seg = os.path.join(path, "commitlog", "%020d" % 0)
    with open(seg, "rb") as f:
        _columns.decode_range(f.read(), cols)
    times = np.unique(cols["store_timestamp"])
    assert len(times) >= 3
    options = {
        "startingTimestamp": int(times[1]),
        "endingTimestamp": int(times[-1]),
        "startingOffsets": '{"audit": {"1": 10}}',
        "endingOffsets": '{"clicks": {"0": 100}}',
    }
    fast, general = both_paths(
        general_path, scans, lambda: batches(str(path), columns=",".join(SCAN_COLUMNS), batchSize=64, **options)
    )
    assert_same(fast, general)
    assert 0 < sum(b.num_rows for b in fast) < 900


def test_scan_matches_general_path_on_the_rocketmq_fixture(fixtures_dir, tmp_path, general_path, scans):
    store = str(shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store"))
    fast, general = both_paths(
        general_path,
        scans,
        lambda: batches(store, columns=",".join(SCAN_COLUMNS), mapped_file_size_commit_log=8192, batchSize=10),
    )
    assert_same(fast, general)
    assert sum(b.num_rows for b in fast) == 47


def test_columns_the_scan_cannot_fill_use_the_general_path(written, scans):
    path, sent = written
    for mode in ("segment", "queue"):
        t = table(path, columns="value,tags", partitioning=mode)
        assert not scans and t.num_rows == len(sent)
    part = ranges_of(plan(path, **OPTS).partitions[0])[0]
    assert decode._scan_setup(part, ["value", "key"]) is None
    assert decode._scan_setup(part, ["value", "msg_id"]) is None
    assert decode._scan_setup(part, ["value"]) is not None
    # a topic the raw-bytes comparison could judge differently from the decoded-name filter
    assert decode._scan_setup(planmod.SegmentRange(part.path, 0, SEG, 0, 10, topics=("a\ufffd",)), ["value"]) is None
    assert decode._scan_setup(planmod.SegmentRange(part.path, 0, SEG, 0, 10, topics=("a\udcff",)), ["value"]) is None


def segment_of(tmp_path, blobs, size=SEG):
    """A commit log segment file holding ``blobs`` back to back, zeros after; its path."""
    data = b"".join(blobs)
    path = tmp_path / ("%020d" % 0)
    path.write_bytes(data + bytes(size - len(data)))
    return str(path), len(data)


def read_both(general_path, part, columns):
    fast = list(decode.read_partition(part, columns, 4))
    general_path()
    return fast, list(decode.read_partition(part, columns, 4))


def test_a_negative_queue_id_under_bounds_falls_back_to_the_general_path(tmp_path, general_path, scans):
    recs = [
        localmq.encode_message("t", b"x%d" % i, queue_id=-1 if i == 6 else i % 2, queue_offset=i) for i in range(10)
    ]
    path, end = segment_of(tmp_path, recs)
    part = planmod.SegmentRange(path, 0, SEG, 0, end, bounds={("t", 0): (2, 8)})
    fast, general = read_both(general_path, part, ["partition", "offset", "value"])
    assert_same(fast, general)
    assert scans
    got = pa.Table.from_batches(fast).to_pydict()
    # queue 0 is bounded to [2, 8); the record of queue -1 and those after it went through the general path
    assert (got["partition"], got["offset"]) == ([1, 0, 1, 0, 1, -1, 1, 1], [1, 2, 3, 4, 5, 6, 7, 9])
    flt = _scan.RowFilter(None, {(b"t", 0): (2, 8)})
    with open(path, "rb") as f:
        data = f.read()
    n, nxt, reason, _ = _scan.scan_range(data, 0, end, 0, False, 100, ("queue_offset",), flt)
    assert (n, nxt, reason) == (5, sum(len(r) for r in recs[:6]), "fallback")


@pytest.mark.parametrize("damage", ["magic", "length", "crc", "torn", "zeros"])
def test_scan_raises_what_the_general_path_raises(tmp_path, general_path, damage):
    recs = [localmq.encode_message("t", b"body%d" % i * 20, queue_id=0, queue_offset=i) for i in range(8)]
    at = sum(len(r) for r in recs[:5])
    bad = bytearray(recs[5])
    if damage == "magic":
        bad[4:8] = b"\0\0\0\1"
    elif damage == "length":
        bad[0:4] = struct.pack(">i", len(bad) - 1)
    elif damage == "crc":
        bad[-20] ^= 0xFF  # in the body
    elif damage == "torn":
        bad = bad[:40]
    elif damage == "zeros":
        bad = bytes(len(bad))
    path, end = segment_of(tmp_path, recs[:5] + [bytes(bad)] + recs[6:])
    part = planmod.SegmentRange(path, 0, SEG, 0, end if damage != "torn" else at + 40, check_crc=True)
    errors = []
    for _ in range(2):
        rows = []
        with pytest.raises(CorruptFrameError) as e:
            for b in decode.read_partition(part, ["offset", "value"], 4):
                rows.extend(b.column("offset").to_pylist())
        errors.append((str(e.value), e.value.offset, e.value.path, rows))
        general_path()
    assert errors[0] == errors[1]
    assert errors[0][1] == at and errors[0][3] == [0, 1, 2, 3, 4]  # the rows before the damage come first


def test_scan_range_against_decode_range(general_path):
    """Hand-made records (IPv6 hosts, properties, empty bodies), a body buffer that must grow, capacity."""
    good = records(n=9)[:-64]
    data = good + localmq.encode_blank(64) + bytes(56)
    cols = _columns.RecordColumns(64)
    n, nxt, reason = _columns.decode_range(data, cols)
    fields = tuple(_scan.SCAN_FIELDS)
    got = _scan.scan_range(data, 0, len(data), 0, True, 64, fields, None, 1)
    assert got[:3] == (n, nxt, reason) == (9, len(good), "blank")
    out = got[3]
    for f in ("body", "topic"):
        assert all(np.array_equal(a, b) for a, b in zip(out[f], _columns.gather_binary(cols, f)))
    for f in fields:
        if f not in ("body", "topic"):
            assert np.array_equal(out[f], cols[f]), f
    # capacity: the same records, three at a time
    pos, seen = 0, []
    while True:
        k, pos, reason, out = _scan.scan_range(data, pos, len(data), 0, False, 3, ("queue_offset",))
        seen.extend(out["queue_offset"].tolist())
        if reason != "full":
            break
    assert seen == cols["queue_offset"].tolist() and (pos, reason) == (len(good), "blank")
    assert _scan.scan_range(data + bytes(8), 0, len(good) + 5, 0, False, 64, ("body",))[:3] == (9, len(good), "torn")
    assert _scan.scan_range(good + bytes(64), 0, -1, 0, False, 64, ("body",))[:3] == (9, len(good), "end")
    flt = _scan.RowFilter([b"top1"], None, 1002, 1006)
    k, _, _, out = _scan.scan_range(data, 0, len(data), 0, False, 64, ("queue_offset",), flt)
    assert out["queue_offset"].tolist() == [13, 15]  # top1 is every odd record; store times 1000 + i


def test_scan_body_buffer_grows_past_its_hint():
    data = b"".join(localmq.encode_message("t", bytes([i]) * (2500 * i), queue_offset=i) for i in range(12))
    cols = _columns.RecordColumns(16)
    _columns.decode_range(data, cols)
    for hint in (0, 100, 10**6):
        n, nxt, reason, out = _scan.scan_range(data, 0, len(data), 0, False, 16, ("body",), None, hint)
        assert (n, nxt, reason) == (12, len(data), "end")
        offs, body = _columns.gather_binary(cols, "body")
        assert np.array_equal(out["body"][0], offs) and out["body"][1].tobytes() == body.tobytes()


@pytest.mark.parametrize("damage", ["magic", "crc", "unit size", "unit offset"])
def test_queue_scan_raises_what_the_general_path_raises(written, general_path, scans, damage):
    path, _ = written
    cq = os.path.join(path, "consumequeue", "orders", "1")
    first = os.path.join(cq, sorted(os.listdir(cq))[0])
    with open(first, "r+b") as f:
        units = f.read(20 * 8)
        j = 5
        phys, size = struct.unpack_from(">qi", units, 20 * j)
        seg = os.path.join(path, "commitlog", "%020d" % (phys // SEG * SEG))
        if damage == "unit size":
            f.seek(20 * j + 8)
            f.write(struct.pack(">i", size + 1))
        elif damage == "unit offset":  # the next unit's record: a valid record, of the same queue, wrong offset
            f.seek(20 * j)
            f.write(units[20 * (j + 1) : 20 * (j + 2)])
    if damage in ("magic", "crc"):
        with open(seg, "r+b") as f:
            at = phys % SEG + (4 if damage == "magic" else 90)  # the magic, or a body byte (IPv4 hosts: at 88)
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x5A]))
    errors = []
    for _ in range(2):
        rows = []
        with pytest.raises((CorruptFrameError, CorruptStoreError)) as e:
            for b in arrow_batches(
                path,
                partitioning="queue",
                columns="offset,value",
                topics="orders",
                checkCRC="true",
                batchSize=4,
                **OPTS,
            ):
                rows.extend(b.column("offset").to_pylist())
        errors.append((type(e.value), str(e.value), getattr(e.value, "offset", None), rows))
        assert scans or errors[1:]
        general_path()
    assert errors[0] == errors[1]
    assert errors[0][0] is (CorruptStoreError if damage == "unit offset" else CorruptFrameError)


def test_scan_positions_checks_what_decode_positions_checks():
    data = records()
    cols = _columns.RecordColumns(16)
    _columns.decode_range(data, cols)
    pos, sizes = cols["physical_offset"].copy(), cols["store_size"].copy()
    fields = tuple(_scan.SCAN_FIELDS)
    n, i, reason, out = _scan.scan_positions(data, pos[::-1], sizes[::-1], 0, True, fields)
    assert (n, i, reason) == (6, 6, "end")
    ref = _columns.RecordColumns(16)
    _columns.decode_positions(data, ref, pos[::-1], sizes[::-1])
    for f in fields:
        if f in ("body", "topic"):
            assert all(np.array_equal(a, b) for a, b in zip(out[f], _columns.gather_binary(ref, f)))
        else:
            assert np.array_equal(out[f], ref[f]), f
    for args in (
        (pos[:2], sizes[:2] + 1),
        ([pos[1] + 1], [sizes[1]]),
        ([len(data) - 8], [sizes[0]]),
        ([len(data) + 5], [sizes[0]]),
        ([-1], [sizes[0]]),
    ):
        got = _scan.scan_positions(data, *args, 0, False, ("body",))[:3]
        want = _columns.decode_positions(data, _columns.RecordColumns(4), *args)
        assert got == want[:3], args
    good = records(n=2)[:-64]
    blank = good + localmq.encode_blank(64) + bytes(56)
    assert (
        _scan.scan_positions(blank, [len(good)], [64], 0, False, ("body",))[:3]
        == (0, 0, "corrupt")
        == _columns.decode_positions(blank, _columns.RecordColumns(1), [len(good)], [64])
    )
    with pytest.raises(ValueError):
        _scan.scan_positions(data, pos, sizes[:2])
