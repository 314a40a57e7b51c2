# cython: boundscheck=False, wraparound=False, cdivision=True
"""The single-pass Arrow scan of CommitLog records (segment ranges or ConsumeQueue units): the Spark reader's path."""
cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcmp, memcpy, memset

from localmq._columns cimport record_bytes, unit_arrays
from localmq._layout cimport (
    MAX_TOPIC_BYTES_V2, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq._record cimport *

import numpy as np

from localmq.errors import ArgumentRangeError
from localmq.status import Stop

cnp.import_array()

# ---------------------------------------------------------------------------------------------- single-pass scan
# ``scan_range`` (a segment range) and ``scan_positions`` (ConsumeQueue units) are the Spark reader's path for the
# cheap columns (body, topic and fixed-width header fields): one walk that validates each record exactly as
# ``decode_range`` / ``decode_positions`` do, applies the row filters and writes the kept rows straight into
# Arrow-layout buffers, where ``decode_range`` + the gathers fill seventeen columns (and hash every record's
# tags) and then copy the bodies in a second pass.

cdef enum:
    SCAN_BODY = 1
    SCAN_TOPIC = 2
    SCAN_QUEUE_ID = 4
    SCAN_QUEUE_OFFSET = 8
    SCAN_STORE_TIMESTAMP = 16
    SCAN_BORN_TIMESTAMP = 32
    SCAN_PHYSICAL_OFFSET = 64
    SCAN_RECONSUME_TIMES = 128
    SCAN_SYS_FLAG = 256

# scan_walk outcomes besides the REC_* ones
cdef enum:
    SCAN_FULL = -1          # capacity rows written
    SCAN_NEED_ROOM = -2     # the next kept body does not fit the data buffer
    SCAN_UNFILTERABLE = -3  # a record the C filter cannot judge as _segment_rows would (see RowFilter)

SCAN_FIELDS = {
    "body": SCAN_BODY, "topic": SCAN_TOPIC, "queue_id": SCAN_QUEUE_ID, "queue_offset": SCAN_QUEUE_OFFSET,
    "store_timestamp": SCAN_STORE_TIMESTAMP, "born_timestamp": SCAN_BORN_TIMESTAMP,
    "physical_offset": SCAN_PHYSICAL_OFFSET, "reconsume_times": SCAN_RECONSUME_TIMES, "sys_flag": SCAN_SYS_FLAG,
}
cdef int64_t I64_MAX = 0x7FFFFFFFFFFFFFFF
cdef int64_t ARROW_MAX_BYTES = 0x7FFFFFFF   # int32 Arrow offsets


cdef struct ScanFilter:
    bint active
    bint by_topic
    bint by_bounds
    bint by_min_ts
    bint by_max_ts
    int64_t min_ts
    int64_t max_ts
    Py_ssize_t ntopics
    const uint8_t *names        # the listed topics' bytes back to back
    const int64_t *name_pos
    const int32_t *name_len
    const uint8_t *wanted       # per listed topic: kept by the topic filter
    Py_ssize_t width            # queue ids [0, width) have a bound slot per listed topic
    const int64_t *lo           # [ntopics * width] first queue offset kept
    const int64_t *hi           # [ntopics * width] queue offset end (exclusive)


cdef class RowFilter:
    """The row filters of a segment scan, judged in C while ``scan_range`` walks.

    A row is kept when its topic is listed in ``topics`` (None: any topic), its queue offset lies in the bound
    of its (topic, queue id) from ``bounds`` (first, end) with end < 0 meaning no end, and its store time lies in
    [``min_ts``, ``max_ts``) (ms). Under ``bounds``, rows of other queues need 0 <= offset < 2**63 - 1 and a
    record with a negative queue id stops the scan with "fallback": the rules are those of the Spark reader's
    numpy filter, which indexes its bound table by queue id.

    :param topics: topic names as bytes, or None.
    :param bounds: {(topic bytes, queue id >= 0): (first offset, end offset)}, or None.
    :param min_ts: store time in ms of the first row kept, or None.
    :param max_ts: store time in ms past the last row kept, or None.
    :raises ValueError: a negative queue id in ``bounds``.
    :raises OverflowError: a bound or time outside int64.
    """

    cdef ScanFilter f
    cdef bytes _names
    cdef object _arrays

    def __init__(self, topics=None, bounds=None, min_ts=None, max_ts=None):
        listed = {}
        for t in (topics or ()):
            listed.setdefault(bytes(t), len(listed))
        for t, q in (bounds or {}):
            if q < 0:
                raise ValueError(f"negative queue id {q} in bounds")
            listed.setdefault(bytes(t), len(listed))
        names = list(listed)
        self._names = b"".join(names)
        name_pos = np.zeros(len(names) + 1, np.int64)
        name_pos[1:] = np.cumsum([len(t) for t in names], dtype=np.int64)
        name_len = np.array([len(t) for t in names] or [0], np.int32)
        wanted = np.zeros(len(names) + 1, np.uint8)
        for t in (topics or ()):
            wanted[listed[bytes(t)]] = 1
        width = max([q for _, q in (bounds or {})], default=-1) + 1
        lo = np.zeros(max(1, len(names) * width), np.int64)
        hi = np.full(max(1, len(names) * width), I64_MAX, np.int64)
        for (t, q), (s, e) in (bounds or {}).items():
            lo[listed[bytes(t)] * width + q] = s
            hi[listed[bytes(t)] * width + q] = I64_MAX if e < 0 else e
        self._arrays = (name_pos, name_len, wanted, lo, hi)
        self.f.by_topic = topics is not None
        self.f.by_bounds = bool(bounds)
        self.f.by_min_ts = min_ts is not None
        self.f.by_max_ts = max_ts is not None
        self.f.min_ts = min_ts if min_ts is not None else 0
        self.f.max_ts = max_ts if max_ts is not None else 0
        self.f.active = self.f.by_topic or self.f.by_bounds or self.f.by_min_ts or self.f.by_max_ts
        self.f.ntopics = len(names)
        self.f.names = <const uint8_t *>PyBytes_AS_STRING(self._names)
        self.f.name_pos = <const int64_t *>cnp.PyArray_DATA(name_pos)
        self.f.name_len = <const int32_t *>cnp.PyArray_DATA(name_len)
        self.f.wanted = <const uint8_t *>cnp.PyArray_DATA(wanted)
        self.f.width = width
        self.f.lo = <const int64_t *>cnp.PyArray_DATA(lo)
        self.f.hi = <const int64_t *>cnp.PyArray_DATA(hi)


cdef inline int filter_record(const ScanFilter *f, const RecordView *v, Py_ssize_t *last) noexcept nogil:
    """1 keep, 0 drop, SCAN_UNFILTERABLE; ``last`` caches the listed topic of the previous record (-1: none)."""
    cdef Py_ssize_t k
    cdef int64_t lo = 0, hi = I64_MAX
    if f.by_bounds and v.queue_id < 0:
        return SCAN_UNFILTERABLE
    if f.by_min_ts and v.store_timestamp < f.min_ts:
        return 0
    if f.by_max_ts and v.store_timestamp >= f.max_ts:
        return 0
    if not (f.by_topic or f.by_bounds):
        return 1
    # records of one topic come in runs: try the previous record's topic first
    k = last[0]
    if k < 0 or f.name_len[k] != v.topic_len or memcmp(f.names + f.name_pos[k], v.topic, v.topic_len) != 0:
        k = 0
        while k < f.ntopics:
            if f.name_len[k] == v.topic_len and memcmp(f.names + f.name_pos[k], v.topic, v.topic_len) == 0:
                break
            k += 1
        if k == f.ntopics:
            k = -1
        last[0] = k
    if f.by_topic and (k < 0 or not f.wanted[k]):
        return 0
    if f.by_bounds:
        if k >= 0 and v.queue_id < f.width:
            lo = f.lo[k * f.width + v.queue_id]
            hi = f.hi[k * f.width + v.queue_id]
        if v.queue_offset < lo or v.queue_offset >= hi:
            return 0
    return 1


cdef struct ScanOut:
    int fields                  # SCAN_* bits
    Py_ssize_t capacity
    Py_ssize_t rows
    int32_t *body_offs          # [capacity + 1]
    uint8_t *body_data
    int64_t body_cap
    int64_t body_used
    int64_t body_need           # set with SCAN_NEED_ROOM: bytes the data buffer must hold
    int32_t *topic_offs         # [capacity + 1]
    uint8_t *topic_data         # [min(capacity * MAX_TOPIC_BYTES_V2, bound)]: never short
    int64_t topic_used
    int32_t *queue_id
    int64_t *queue_offset
    int64_t *store_timestamp
    int64_t *born_timestamp
    int64_t *physical_offset
    int32_t *reconsume_times
    int32_t *sys_flag


cdef inline int write_row(ScanOut *o, const RecordView *v, int64_t phys) noexcept nogil:
    """Append the record ``v`` (at absolute offset ``phys``) as row ``o.rows``; SCAN_NEED_ROOM or REC_OK."""
    cdef Py_ssize_t row = o.rows
    cdef int fields = o.fields
    if fields & SCAN_BODY:
        if o.body_used + v.body_len > o.body_cap:
            o.body_need = o.body_used + v.body_len
            return SCAN_NEED_ROOM
        memcpy(o.body_data + o.body_used, v.body, v.body_len)
        o.body_used += v.body_len
        o.body_offs[row + 1] = <int32_t>o.body_used
    if fields & SCAN_TOPIC:
        memcpy(o.topic_data + o.topic_used, v.topic, v.topic_len)
        o.topic_used += v.topic_len
        o.topic_offs[row + 1] = <int32_t>o.topic_used
    if fields & SCAN_QUEUE_ID:
        o.queue_id[row] = v.queue_id
    if fields & SCAN_QUEUE_OFFSET:
        o.queue_offset[row] = v.queue_offset
    if fields & SCAN_STORE_TIMESTAMP:
        o.store_timestamp[row] = v.store_timestamp
    if fields & SCAN_BORN_TIMESTAMP:
        o.born_timestamp[row] = v.born_timestamp
    if fields & SCAN_PHYSICAL_OFFSET:
        o.physical_offset[row] = phys
    if fields & SCAN_RECONSUME_TIMES:
        o.reconsume_times[row] = v.reconsume_times
    if fields & SCAN_SYS_FLAG:
        o.sys_flag[row] = v.sys_flag
    o.rows = row + 1
    return REC_OK


cdef int scan_walk(const uint8_t *base, Py_ssize_t *pos_io, Py_ssize_t end, int64_t base_offset, bint check_crc,
                   const ScanFilter *flt, ScanOut *o) noexcept nogil:
    """Walk records from ``pos_io[0]`` to ``end`` writing kept rows after ``o.rows``; returns a REC_* / SCAN_* code.

    ``pos_io[0]`` is left at the first record not consumed (the one that stopped the walk).
    """
    cdef Py_ssize_t pos = pos_io[0], last = -1
    cdef int rc = REC_END, keep
    cdef int32_t txn
    cdef RecordView v
    while pos < end:
        if o.rows >= o.capacity:
            rc = SCAN_FULL
            break
        rc = parse_record(base + pos, end - pos, &v, check_crc)
        if rc == REC_GAP:  # damage recovery quarantined: the records after it are valid
            pos += v.total_size
            rc = REC_END
            continue
        if rc != REC_OK:
            break
        txn = v.sys_flag & SYSFLAG_TRANSACTION_MASK
        if txn == SYSFLAG_TRANSACTION_PREPARED or txn == SYSFLAG_TRANSACTION_ROLLBACK:
            # never dispatched (no queue offset of its own): not a row, as decode.py's _segment_rows rules
            pos += v.total_size
            rc = REC_END
            continue
        if flt.active:
            keep = filter_record(flt, &v, &last)
            if keep == SCAN_UNFILTERABLE:
                rc = SCAN_UNFILTERABLE
                break
            if keep == 0:
                pos += v.total_size
                rc = REC_END
                continue
        rc = write_row(o, &v, base_offset + pos)
        if rc != REC_OK:
            break
        pos += v.total_size
        rc = REC_END
    pos_io[0] = pos
    return rc


cdef int scan_units(const uint8_t *base, Py_ssize_t n, const int64_t *positions, const int32_t *sizes,
                    Py_ssize_t count, Py_ssize_t *i_io, int64_t base_offset, bint check_crc,
                    ScanOut *o) noexcept nogil:
    """Write the records at ``positions[i_io[0]:count]`` (each ``sizes[i]`` bytes) as rows; a REC_* / SCAN_* code.

    ``i_io[0]`` is left at the first unit not written. The checks are decode_positions' ones.
    """
    cdef Py_ssize_t i = i_io[0]
    cdef int64_t pos
    cdef int rc = REC_END
    cdef RecordView v
    while i < count:
        pos = positions[i]
        if pos < 0 or pos >= n:
            rc = REC_TORN
            break
        rc = parse_record(base + pos, n - pos, &v, check_crc)
        if rc != REC_OK:
            break
        if v.total_size != sizes[i]:
            rc = REC_BAD_LENGTH
            break
        rc = write_row(o, &v, base_offset + pos)
        if rc != REC_OK:
            break
        i += 1
        rc = REC_END
    i_io[0] = i
    return rc


cdef class _ScanBuffers:
    """The arrays a scan writes (owned here while the GIL is released) and their ScanOut view."""

    cdef ScanOut o
    cdef dict arrays
    cdef int64_t bound          # bytes the kept bodies (or topics) cannot exceed: the span walked

    def __cinit__(self, fields, Py_ssize_t capacity, int64_t bound, Py_ssize_t body_hint):
        cdef int bits = 0
        for name in fields:
            bits |= SCAN_FIELDS[name]
        memset(&self.o, 0, sizeof(ScanOut))
        self.o.fields = bits
        self.o.capacity = capacity
        self.bound = bound
        self.arrays = {}
        if bits & SCAN_BODY:
            self.o.body_offs = <int32_t *>self._new("body_offsets", capacity + 1, np.int32)
            self.o.body_offs[0] = 0
            self.o.body_cap = min(max(body_hint, 4096), bound, ARROW_MAX_BYTES)
            self.o.body_data = <uint8_t *>self._new("body_data", self.o.body_cap, np.uint8)
        if bits & SCAN_TOPIC:
            self.o.topic_offs = <int32_t *>self._new("topic_offsets", capacity + 1, np.int32)
            self.o.topic_offs[0] = 0
            # never short; pages past what is written are never faulted in
            self.o.topic_data = <uint8_t *>self._new("topic_data", min(capacity * MAX_TOPIC_BYTES_V2, bound), np.uint8)
        if bits & SCAN_QUEUE_ID:
            self.o.queue_id = <int32_t *>self._new("queue_id", capacity, np.int32)
        if bits & SCAN_QUEUE_OFFSET:
            self.o.queue_offset = <int64_t *>self._new("queue_offset", capacity, np.int64)
        if bits & SCAN_STORE_TIMESTAMP:
            self.o.store_timestamp = <int64_t *>self._new("store_timestamp", capacity, np.int64)
        if bits & SCAN_BORN_TIMESTAMP:
            self.o.born_timestamp = <int64_t *>self._new("born_timestamp", capacity, np.int64)
        if bits & SCAN_PHYSICAL_OFFSET:
            self.o.physical_offset = <int64_t *>self._new("physical_offset", capacity, np.int64)
        if bits & SCAN_RECONSUME_TIMES:
            self.o.reconsume_times = <int32_t *>self._new("reconsume_times", capacity, np.int32)
        if bits & SCAN_SYS_FLAG:
            self.o.sys_flag = <int32_t *>self._new("sys_flag", capacity, np.int32)

    cdef void *_new(self, str name, Py_ssize_t n, dtype) except NULL:
        arr = np.empty(max(n, 1), dtype)
        self.arrays[name] = arr
        return cnp.PyArray_DATA(arr)

    cdef int grow(self) except -1:
        """Make room for ``o.body_need`` body bytes; 0, or 1 when a batch may not hold that much (end it)."""
        cdef int64_t size
        if self.o.body_need > ARROW_MAX_BYTES:
            return 1  # rows were written before (one body is below 2 GiB): the batch ends here
        size = min(max(self.o.body_cap * 2, self.o.body_need), self.bound, ARROW_MAX_BYTES)
        bigger = np.empty(size, np.uint8)
        memcpy(cnp.PyArray_DATA(bigger), self.o.body_data, self.o.body_used)
        self.arrays["body_data"] = bigger
        self.o.body_data = <uint8_t *>cnp.PyArray_DATA(bigger)
        self.o.body_cap = size
        return 0

    cdef dict result(self):
        """The written rows: binary fields as (offsets, data), the others as arrays (views of the buffers)."""
        cdef Py_ssize_t rows = self.o.rows
        a = self.arrays
        out = {}
        for name in ("queue_id", "queue_offset", "store_timestamp", "born_timestamp", "physical_offset",
                     "reconsume_times", "sys_flag"):
            if name in a:
                out[name] = a[name][:rows]
        if "body_data" in a:
            out["body"] = (a["body_offsets"][:rows + 1], a["body_data"][:self.o.body_used])
        if "topic_data" in a:
            out["topic"] = (a["topic_offsets"][:rows + 1], a["topic_data"][:self.o.topic_used])
        return out


cdef object _scan_reason(int rc):
    if rc == SCAN_FULL:
        return Stop.FULL
    if rc == REC_END:
        return Stop.END
    if rc == REC_BLANK:
        return Stop.BLANK
    if rc == REC_TORN:
        return Stop.TORN
    if rc == SCAN_UNFILTERABLE:
        return Stop.FALLBACK
    return Stop.CORRUPT


def scan_range(data, Py_ssize_t start, Py_ssize_t end, long long base_offset=0, bint check_crc=False,
               Py_ssize_t capacity=65536, fields=("body",), RowFilter row_filter=None, Py_ssize_t body_hint=0):
    """Walk the records of ``data[start:end]`` once and return the kept rows' ``fields`` in Arrow layout.

    Records are checked as ``decode_range`` checks them (lengths, magic, CRC with ``check_crc``); rows that
    ``row_filter`` drops do not count against ``capacity``. ``fields`` are names of ``SCAN_FIELDS``: "body"
    and "topic" come back as (int32 offsets[rows+1], uint8 data), the others as numpy arrays of their header
    field (timestamps in ms; physical_offset = ``base_offset`` + position). ``body_hint``: expected body bytes
    (the data buffer grows past it when needed). A batch ends early rather than hold 2 GiB of bodies.

    Returns (rows, next position, stop reason, {field: array(s)}); reasons as ``decode_range`` ("end", "blank",
    "full", "torn", "corrupt") plus "fallback": a record at the next position that ``row_filter`` cannot judge.
    The GIL is released while walking.
    """
    cdef const uint8_t[::1] mv = record_bytes(data, start, &end)
    cdef Py_ssize_t n = mv.shape[0]
    if capacity <= 0:
        raise ArgumentRangeError("capacity must be positive", "capacity")
    cdef ScanFilter nofilter
    nofilter.active = False
    cdef const ScanFilter *flt = &row_filter.f if row_filter is not None else &nofilter
    cdef _ScanBuffers buf = _ScanBuffers(fields, capacity, end - start, body_hint)
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t pos = start
    cdef int rc
    while True:
        with nogil:  # a range may hold millions of records; the walk copies every kept body
            rc = scan_walk(base, &pos, end, base_offset, check_crc, flt, &buf.o)
        if rc != SCAN_NEED_ROOM:
            break
        if buf.grow():
            rc = SCAN_FULL
            break
    return buf.o.rows, pos, _scan_reason(rc), buf.result()


def scan_positions(data, positions, sizes, long long base_offset=0, bint check_crc=False, fields=("body",),
                   Py_ssize_t body_hint=0):
    """``scan_range`` for the records at ``positions`` of ``data`` (ConsumeQueue units), in the order given.

    ``positions``: int64 positions relative to ``data[0]``; ``sizes``: the int32 size each record must have.
    Checked as ``decode_positions`` checks them. Returns (rows, index of the first unit not written, stop
    reason, {field: array(s)}): "end" (all written), "full" (2 GiB of bodies), "torn" (a position outside
    ``data`` or a record past its end), "corrupt" (bad magic, lengths or CRC, zeros, a size that disagrees).
    The GIL is released while walking.
    """
    cdef const uint8_t[::1] mv = record_bytes(data, 0, NULL)
    cdef Py_ssize_t n = mv.shape[0]
    pos_arr, size_arr = unit_arrays(positions, sizes, True)
    cdef Py_ssize_t count = pos_arr.shape[0]
    # the kept bodies lie inside the records: their sizes bound the data buffer (a negative size, which no
    # record matches, must not shrink that bound below the records written before it)
    cdef _ScanBuffers buf = _ScanBuffers(fields, max(count, 1), int(np.maximum(size_arr, 0).sum(dtype=np.int64)),
                                         body_hint)
    cdef const int64_t *pp = <const int64_t *>cnp.PyArray_DATA(pos_arr)
    cdef const int32_t *sp = <const int32_t *>cnp.PyArray_DATA(size_arr)
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t i = 0
    cdef int rc
    while True:
        with nogil:  # a partition may hold millions of units; the walk copies every body
            rc = scan_units(base, n, pp, sp, count, &i, base_offset, check_crc, &buf.o)
        if rc != SCAN_NEED_ROOM:
            break
        if buf.grow():
            rc = SCAN_FULL
            break
    reason = _scan_reason(rc)
    if reason in (Stop.END, Stop.BLANK) and i < count:
        reason = Stop.CORRUPT  # zeros or a blank record where a unit says a record is
    return buf.o.rows, i, reason, buf.result()
