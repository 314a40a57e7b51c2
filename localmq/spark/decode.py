"""Decode planned partitions of a store into pyarrow RecordBatches whose buffers the Cython codec fills."""

import itertools
import logging
import os
from collections.abc import Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from localmq import _columns, _scan
from localmq._record import java_hash, scan_record
from localmq.errors import CorruptFrameError, CorruptStoreError
from localmq.filter import compile_sql92
from localmq.layout import CQ_EXT_ADDRESS_MAX, file_name
from localmq.spark.plan import OffsetRangeError, Partition, QueueRange, SegmentRange, SegmentRanges, dispatched
from localmq.status import RecordStatus, Stop
from localmq.store.files import ConsumeQueueFiles, map_segment, points_at_records

if TYPE_CHECKING:
    import pyarrow as pa

    from localmq._mapped_file import MappedFile

__all__ = ["COLUMNS", "TIMESTAMP_TYPE_LOG_APPEND", "arrow_schema", "spark_ddl", "read_partition"]

log = logging.getLogger("localmq.spark")

# (name, Spark SQL type). Kafka's source columns first, then RocketMQ's.
COLUMNS = (
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
    ("tags", "string"),
    ("keys", "array<string>"),
    ("properties", "map<string,string>"),
    ("physical_offset", "bigint"),
    ("born_timestamp", "timestamp"),
    ("reconsume_times", "int"),
    ("sys_flag", "int"),
    ("msg_id", "string"),
)
COLUMN_TYPES = dict(COLUMNS)
# Kafka's timestampType: 0 CreateTime, 1 LogAppendTime. ``timestamp`` is the store time the broker (or localmq)
# set when it appended the record, so it is LogAppendTime; the producer's time is ``born_timestamp``.
TIMESTAMP_TYPE_LOG_APPEND = 1
_I64_MAX = np.iinfo(np.int64).max


def spark_ddl(columns: Iterable[str] | None = None) -> str:
    """The Spark DDL schema string of ``columns`` (default: all, in order)."""
    names = [c for c, _ in COLUMNS] if columns is None else list(columns)
    return ", ".join(f"`{c}` {COLUMN_TYPES[c]}" for c in names)


def _arrow_type(sql: str) -> "pa.DataType":
    import pyarrow as pa

    return {
        "binary": pa.binary(),
        "string": pa.string(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "array<string>": pa.list_(pa.field("element", pa.string())),
        "map<string,string>": pa.map_(pa.string(), pa.string()),
    }[sql]


def arrow_schema(columns: Iterable[str] | None = None) -> "pa.Schema":
    """The pyarrow schema of ``columns`` (default: all): what Spark expects for the Spark schema of the same names."""
    import pyarrow as pa

    names = [c for c, _ in COLUMNS] if columns is None else list(columns)
    return pa.schema([pa.field(c, _arrow_type(COLUMN_TYPES[c])) for c in names])


# ---------------------------------------------------------------------------------------------- batches


def _buf(a: npt.NDArray[Any]) -> "pa.Buffer":
    import pyarrow as pa

    return pa.py_buffer(a)


def _binary(
    pa_type: "pa.DataType",
    n: int,
    offs: npt.NDArray[np.int32],
    data: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.uint8] | None = None,
    nulls: int = 0,
) -> "pa.Array":
    import pyarrow as pa

    return pa.Array.from_buffers(
        pa_type, n, [None if valid is None else _buf(valid), _buf(offs), _buf(data)], null_count=nulls
    )


def _fixed(pa_type: "pa.DataType", values: npt.NDArray[Any]) -> "pa.Array":
    import pyarrow as pa

    return pa.Array.from_buffers(pa_type, len(values), [None, _buf(np.ascontiguousarray(values))], null_count=0)


def record_batch(
    cols: _columns.RecordColumns, rows: npt.NDArray[np.integer[Any]] | None, columns: Iterable[str], schema: "pa.Schema"
) -> "pa.RecordBatch":
    """One RecordBatch of the decoded rows of ``cols`` (all, or the int64 indices ``rows``), columns as named."""
    import pyarrow as pa

    n = cols.count if rows is None else len(rows)

    def col(name: str) -> npt.NDArray[Any]:
        a = cols[name]
        return a if rows is None else a[rows]

    out: list[pa.Array] = []
    for name in columns:
        t = schema.field(name).type
        if name == "value":
            out.append(_binary(t, n, *_columns.gather_binary(cols, "body", rows)))
        elif name == "topic":
            out.append(_binary(t, n, *_columns.gather_binary(cols, "topic", rows)))
        elif name in ("key", "tags"):
            valid, nulls, offs, data = _columns.gather_property(cols, "KEYS" if name == "key" else "TAGS", rows)
            out.append(_binary(t, n, offs, data, valid, nulls))
        elif name == "partition":
            out.append(_fixed(t, col("queue_id")))
        elif name == "offset":
            out.append(_fixed(t, col("queue_offset")))
        elif name == "timestamp":
            out.append(_fixed(t, col("store_timestamp") * 1000))
        elif name == "born_timestamp":
            out.append(_fixed(t, col("born_timestamp") * 1000))
        elif name == "timestampType":
            out.append(_fixed(t, np.full(n, TIMESTAMP_TYPE_LOG_APPEND, np.int32)))
        elif name == "keys":
            loffs, coffs, data = _columns.gather_keys(cols, rows)
            child = _binary(pa.string(), len(coffs) - 1, coffs, data)
            out.append(pa.Array.from_buffers(t, n, [None, _buf(loffs)], null_count=0, children=[child]))
        elif name == "properties":
            moffs, koffs, kdata, voffs, vdata = _columns.gather_properties(cols, rows)
            k = len(koffs) - 1
            entries = pa.StructArray.from_arrays(
                [_binary(pa.string(), k, koffs, kdata), _binary(pa.string(), k, voffs, vdata)],
                fields=[t.key_field, t.item_field],
            )
            out.append(pa.Array.from_buffers(t, n, [None, _buf(moffs)], null_count=0, children=[entries]))
        elif name == "physical_offset":
            out.append(_fixed(t, col("physical_offset")))
        elif name == "reconsume_times":
            out.append(_fixed(t, col("reconsume_times")))
        elif name == "sys_flag":
            out.append(_fixed(t, col("sys_flag")))
        elif name == "msg_id":
            out.append(_binary(t, n, *_columns.gather_msg_ids(cols, rows)))
        else:
            raise KeyError(name)
    return pa.RecordBatch.from_arrays(out, schema=schema)


def _segment_rows(cols: _columns.RecordColumns, part: SegmentRange) -> npt.NDArray[np.intp] | None:
    """Indices of the rows ``part``'s filters keep, or None for all of them.

    PREPARED and ROLLBACK transactional records are never rows: a dispatcher does not index them, so they have
    no queue offset of their own (RocketMQ writes 0) and consumers never see them.
    """
    hidden = ~dispatched(cols["sys_flag"])
    if part.topics is None and part.bounds is None and part.min_ts is None and part.max_ts is None:
        if not hidden.any():
            return None
        return np.flatnonzero(~hidden)
    keep = ~hidden
    if part.topics is not None or part.bounds is not None:
        codes, names = _columns.topic_codes(cols)
        if part.topics is not None:
            wanted = set(part.topics)
            keep &= np.array([nm in wanted for nm in names], bool)[codes]
        if part.bounds:
            qid = cols["queue_id"]
            qoff = cols["queue_offset"]
            index = {nm: i for i, nm in enumerate(names)}
            width = int(max(qid.max(initial=0), max(q for _, q in part.bounds)) + 1)
            lo = np.zeros((len(names), width), np.int64)
            hi = np.full((len(names), width), _I64_MAX, np.int64)
            for (topic, q), (s, e) in part.bounds.items():
                i = index.get(topic)
                if i is not None:
                    lo[i, q] = s
                    hi[i, q] = _I64_MAX if e < 0 else e
            keep &= (qoff >= lo[codes, qid]) & (qoff < hi[codes, qid])
    if part.min_ts is not None:
        keep &= cols["store_timestamp"] >= part.min_ts
    if part.max_ts is not None:
        keep &= cols["store_timestamp"] < part.max_ts
    return np.flatnonzero(keep)


def _filtered(part: SegmentRange | QueueRange) -> bool:
    """Whether ``part`` keeps rows by their content (a tags or SQL92 filter): those need the properties decoded."""
    return part.tag_names is not None or part.sql is not None


def _content_rows(
    cols: _columns.RecordColumns, part: SegmentRange | QueueRange, rows: npt.NDArray[np.integer[Any]] | None
) -> npt.NDArray[np.integer[Any]] | None:
    """``rows`` (indices, or None for all) narrowed to those ``part``'s tags and SQL92 filters keep.

    Tags: the TAGS value must be one of the names exactly (bytes compared; no TAGS, no match), as a consumer's
    second check. SQL92: the compiled expression on each row's properties (RocketMQ's evaluation, see
    localmq.filter).
    """
    if not _filtered(part):
        return rows
    idx = np.arange(cols.count, dtype=np.int64) if rows is None else rows
    if not len(idx):
        return idx
    if part.tag_names is not None:
        import pyarrow as pa
        import pyarrow.compute as pc

        valid, nulls, offs, data = _columns.gather_property(cols, "TAGS", idx)
        tags = _binary(pa.binary(), len(idx), offs, data, valid, nulls)
        wanted = pa.array(sorted(t.encode("utf-8", "surrogatepass") for t in part.tag_names), pa.binary())
        idx = idx[pc.fill_null(pc.is_in(tags, value_set=wanted), False).to_numpy(zero_copy_only=False)]
    if part.sql is not None and len(idx):
        matches = compile_sql92(part.sql).matches
        props = cols.properties
        idx = idx[np.fromiter((matches(props(i)) for i in idx.tolist()), bool, len(idx))]
    return idx


def _tag_units(part: QueueRange, tags_codes: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.bool_]:
    """A bool mask of the units whose tags code may be one of ``part``'s tags (the ConsumeQueue step of a tag
    subscription): the int32 hash code matches, or the unit holds no tags code (a ConsumeQueueExt address)."""
    assert part.tag_names is not None  # called for a tag subscription only
    codes = np.array(sorted({java_hash(t) for t in part.tag_names}), np.int32)
    tags_codes = tags_codes.astype(np.int64)
    return (tags_codes <= CQ_EXT_ADDRESS_MAX) | np.isin(tags_codes.astype(np.int32), codes)


def _range_done(part: SegmentRange, reason: Stop, nxt: int) -> bool:
    """Whether a walk of ``part`` that stopped at ``nxt`` for ``reason`` read it all; raises for damage in it."""
    if reason == Stop.BLANK or (reason == Stop.END and nxt >= part.end):
        return True
    if reason in (Stop.FULL, Stop.FALLBACK):
        return False
    what = "zero bytes" if reason == Stop.END else f"a {reason} record"
    raise CorruptFrameError(
        f"{what} at offset {part.base + nxt} of the commit log, inside the range planned to read ({part.path})",
        offset=part.base + nxt,
        path=part.path,
    )


# Columns the single-pass scan (_scan.scan_range) fills, with the codec field each comes from.
_SCAN_FIELDS = {
    "value": "body",
    "topic": "topic",
    "partition": "queue_id",
    "offset": "queue_offset",
    "timestamp": "store_timestamp",
    "timestampType": None,
    "physical_offset": "physical_offset",
    "born_timestamp": "born_timestamp",
    "reconsume_times": "reconsume_times",
    "sys_flag": "sys_flag",
}


def _utf8(topic: str) -> bytes | None:
    """``topic`` as the bytes a record holds, or None when a raw-bytes comparison could disagree with the numpy
    filter, which compares topics decoded with errors="replace" (a name holding U+FFFD, or not encodable)."""
    if "\ufffd" in topic:
        return None
    try:
        return topic.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _scan_fields(columns: Iterable[str], *always: str) -> tuple[str, ...] | None:
    """The codec fields a single-pass scan fills for ``columns`` (and ``always``), or None when it cannot."""
    if not all(c in _SCAN_FIELDS for c in columns):
        return None
    return tuple(dict.fromkeys([f for c in columns if (f := _SCAN_FIELDS[c]) is not None] + list(always)))


def _scan_setup(part: SegmentRange, columns: Iterable[str]) -> tuple[tuple[str, ...], _scan.RowFilter] | None:
    """(codec fields, RowFilter) for scanning ``part`` in one pass, or None when only the general path can."""
    fields = _scan_fields(columns)
    if fields is None or _filtered(part):
        return None
    topics: list[bytes | None] | None = None
    bounds: dict[tuple[bytes, int], tuple[int, int]] | None = None
    if part.topics is not None:
        topics = [_utf8(t) for t in part.topics]
        if None in topics:
            return None
    if part.bounds:
        bounds = {}
        for (t, q), v in part.bounds.items():
            raw = _utf8(t)
            if raw is None:
                return None
            bounds[(raw, q)] = v
    try:
        flt = _scan.RowFilter(
            cast("list[bytes] | None", topics),  # None in topics returned above
            bounds,
            part.min_ts,
            part.max_ts,
        )
    except (ValueError, OverflowError):
        return None  # a negative queue id or a bound beyond int64: the numpy filter's own rules apply
    return fields, flt


def _scan_batch(n: int, out: dict[str, Any], columns: Iterable[str], schema: "pa.Schema") -> "pa.RecordBatch":
    """One RecordBatch of ``n`` rows from the arrays ``_scan.scan_range`` returned, columns as named."""
    import pyarrow as pa

    arrays: list[pa.Array] = []
    for name in columns:
        t = schema.field(name).type
        field = _SCAN_FIELDS[name]
        if field in ("body", "topic"):
            arrays.append(_binary(t, n, *out[field]))
        elif field is None:  # timestampType, the one column of no codec field
            arrays.append(_fixed(t, np.full(n, TIMESTAMP_TYPE_LOG_APPEND, np.int32)))
        elif name in ("timestamp", "born_timestamp"):
            arrays.append(_fixed(t, out[field] * 1000))
        else:
            arrays.append(_fixed(t, out[field]))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _scan_segment(
    mf: "MappedFile",
    part: SegmentRange,
    columns: list[str],
    schema: "pa.Schema",
    batch_size: int,
    fields: tuple[str, ...],
    flt: _scan.RowFilter,
) -> Generator["pa.RecordBatch", None, int | None]:
    """Yield ``part``'s batches from single-pass scans; returns where the general path must go on, or None."""
    pos, hint = part.start, 0
    while True:
        n, nxt, reason, out = _scan.scan_range(
            mf, pos, part.end, part.base, part.check_crc, batch_size, fields, flt, hint
        )
        if n:
            if "body" in out:
                # the next batch's data buffer: this one's bytes per row (no regrowth for even bodies)
                hint = len(out["body"][1]) * batch_size // n + 4096
            yield _scan_batch(n, out, columns, schema)
        if _range_done(part, reason, nxt):
            return None
        pos = nxt
        if reason == Stop.FALLBACK:
            return pos


def _read_segment(
    part: SegmentRange, columns: list[str], schema: "pa.Schema", batch_size: int
) -> Iterator["pa.RecordBatch"]:
    """Batches of a SegmentRange: single-pass scans when its columns and filters allow, else decode_range."""
    mf = map_segment(part.path, part.size, part.base)
    try:
        pos: int | None
        pos = part.start
        scan = _scan_setup(part, columns)
        if scan is not None:
            pos = yield from _scan_segment(mf, part, columns, schema, batch_size, *scan)
            if pos is None:
                return
        while pos < part.end:
            cols = _columns.RecordColumns(batch_size)
            n, nxt, reason = _columns.decode_range(mf, cols, pos, part.end, part.base, part.check_crc)
            if n:
                rows = _content_rows(cols, part, _segment_rows(cols, part))
                if rows is None or len(rows):
                    yield record_batch(cols, rows, columns, schema)
            if _range_done(part, reason, nxt):
                return
            pos = nxt
    finally:
        mf.close()


def _queue_units(part: QueueRange) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """(queue offsets, physical offsets, sizes) of ``part``'s units, native int arrays; lost ranges handled."""
    cq = ConsumeQueueFiles(part.topic, part.queue_id, part.cq_path)
    offs: list[npt.NDArray[np.int64]] = []
    phys: list[npt.NDArray[np.int64]] = []
    sizes: list[npt.NDArray[np.int32]] = []
    for i, stop, units in cq.unit_runs(part.start, part.end):
        if units is None:
            _lost(part, i, stop, "its ConsumeQueue file is gone")
            continue
        if len(units) < stop - i or not points_at_records(units):
            raise CorruptStoreError(
                f"consume queue {part.cq_path}: units {i}..{stop} planned to be read are missing or invalid"
            )
        keep = None if part.tag_names is None else _tag_units(part, units["tags_code"])
        offs.append(np.arange(i, stop, dtype=np.int64) if keep is None else np.flatnonzero(keep) + i)
        phys.append(units["offset"].astype(np.int64) if keep is None else units["offset"][keep].astype(np.int64))
        sizes.append(units["size"].astype(np.int32) if keep is None else units["size"][keep].astype(np.int32))
    if not offs:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32)
    return np.concatenate(offs), np.concatenate(phys), np.concatenate(sizes)


def _lost(part: QueueRange, first: int, stop: int, why: str) -> None:
    msg = f"{part.topic} queue {part.queue_id}: offsets {first}..{stop} are gone ({why})"
    if part.fail_on_data_loss:
        raise OffsetRangeError(msg + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them", msg)


def _read_queue(
    part: QueueRange, columns: list[str], schema: "pa.Schema", batch_size: int
) -> Iterator["pa.RecordBatch"]:
    """Batches of a QueueRange: its units' records, each checked against its unit (size, queue id, offset)."""
    qoffs, phys, sizes = _queue_units(part)
    if not len(phys):
        return
    # one walk per batch when the columns allow; queue id and offset are read to check records against units
    fields, hint = _scan_fields(columns, "queue_id", "queue_offset"), 0
    if _filtered(part):
        fields = None  # the exact tag and SQL92 checks read the properties: the general decode
    seg = part.segment_size
    seg_base = (phys // seg) * seg
    # runs of units in one segment (a queue's units grow with the log, so a run is one stretch of it)
    cuts = np.flatnonzero(np.diff(seg_base)) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [len(phys)]])
    for a, b in zip(starts.tolist(), stops.tolist()):
        base = int(seg_base[a])
        path = os.path.join(part.commitlog, file_name(base))
        try:
            mf = map_segment(path, seg, base)
        except FileNotFoundError:
            _lost(part, int(qoffs[a]), int(qoffs[b - 1]) + 1, f"commit log segment {path} is gone")
            continue
        # this run's units; a lost unit (its message was lost to damage in the commit log) is taken out of them
        r_q, r_p, r_s = qoffs[a:b], phys[a:b], sizes[a:b]
        try:
            i, n_units = 0, len(r_q)
            while i < n_units:
                stop = min(n_units, i + batch_size)
                if fields is not None:
                    n, done, reason, out = _scan.scan_positions(
                        mf, r_p[i:stop] - base, r_s[i:stop], base, part.check_crc, fields, hint
                    )
                    if reason == Stop.FULL:  # 2 GiB of bodies: this batch ends early, the next starts there
                        stop, reason = i + n, Stop.END
                    got_offsets, got_ids = out["queue_offset"], out["queue_id"]
                else:
                    cols = _columns.RecordColumns(stop - i)
                    n, done, reason = _columns.decode_positions(
                        mf, cols, r_p[i:stop] - base, r_s[i:stop], base, part.check_crc
                    )
                    got_offsets, got_ids = cols["queue_offset"], cols["queue_id"]
                if reason != Stop.END:
                    k = i + done
                    at = int(r_p[k])
                    status, size = scan_record(mf, at - base) if 0 <= at - base < seg else ("torn", 0)
                    if status == RecordStatus.GAP and size == int(r_s[k]):
                        _lost(
                            part,
                            int(r_q[k]),
                            int(r_q[k]) + 1,
                            f"the message was lost to damage in the commit log: a gap record stands at offset {at}",
                        )
                        r_q, r_p, r_s = np.delete(r_q, k), np.delete(r_p, k), np.delete(r_s, k)
                        n_units -= 1
                        continue  # this batch again, without the lost unit
                    raise CorruptFrameError(
                        f"consume queue {part.cq_path} unit {int(r_q[k])} points at "
                        f"offset {at}, where there is no record of its size ({reason})",
                        offset=at,
                        path=path,
                    )
                if not (np.array_equal(got_offsets, r_q[i:stop]) and (got_ids == part.queue_id).all()):
                    raise CorruptStoreError(
                        f"consume queue {part.cq_path}: units {int(r_q[i])}.."
                        f"{int(r_q[stop - 1])} point at records of another queue or offset"
                    )
                if fields is not None:
                    if "body" in out:
                        hint = len(out["body"][1]) * batch_size // n + 4096
                    yield _scan_batch(n, out, columns, schema)
                else:
                    rows = _content_rows(cols, part, None)
                    if rows is None or len(rows):
                        yield record_batch(cols, rows, columns, schema)
                i = stop
        finally:
            mf.close()


def read_partition(
    part: Partition, columns: Iterable[str] | None = None, batch_size: int = 65536
) -> Iterator["pa.RecordBatch"]:
    """Decode one planned partition (SegmentRange, SegmentRanges or QueueRange) into pyarrow RecordBatches.

    :param columns: the column names to produce (default all of ``COLUMNS``, in that order).
    :param batch_size: rows per batch at most.
    :raises CorruptFrameError: a damaged record inside the planned range (offset and path set).
    :raises CorruptStoreError: ConsumeQueue units that do not match their records.
    :raises OffsetRangeError: planned offsets that retention removed meanwhile (``failOnDataLoss``).
    """
    names = [c for c, _ in COLUMNS] if columns is None else list(columns)
    schema = arrow_schema(names)
    if isinstance(part, SegmentRange):
        return _read_segment(part, names, schema, batch_size)
    if isinstance(part, SegmentRanges):
        return itertools.chain.from_iterable(_read_segment(r, names, schema, batch_size) for r in part.ranges)
    if isinstance(part, QueueRange):
        return _read_queue(part, names, schema, batch_size)
    raise TypeError(f"not a localmq partition: {part!r}")
