# cython: boundscheck=False, wraparound=False, cdivision=True
"""Columnar decode of CommitLog ranges into numpy columns (RecordColumns) and the gathers into Arrow buffers."""
cimport numpy as cnp
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from localmq._layout cimport HOST_V4_SIZE, HOST_V6_SIZE, SYSFLAG_STOREHOST_V6
from localmq._os cimport lmq_put64
from localmq._record cimport *

import numpy as np

from localmq._record import parse_properties
from localmq.errors import ArgumentRangeError, PositionOutOfRangeError
from localmq.status import Stop

cnp.import_array()

# ---------------------------------------------------------------------------------------------- arguments
# The checks every decoder and scan (here and in _scan.pyx) makes of its arguments, written once.

cdef const uint8_t[::1] record_bytes(data, Py_ssize_t start, Py_ssize_t *end):
    """``data`` as bytes; with ``end`` (not NULL) the range [start, end) checked: ``end`` below 0 or past the data
    becomes the data's end, a ``start`` outside 0..end raises PositionOutOfRangeError."""
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef Py_ssize_t n = mv.shape[0]
    if end != NULL:
        if end[0] < 0 or end[0] > n:
            end[0] = n
        if start < 0 or start > end[0]:
            raise PositionOutOfRangeError(f"start {start} outside 0..{end[0]}", "start")
    return mv


cdef tuple unit_arrays(positions, sizes, bint sizes_required):
    """(int64 positions, int32 sizes or None) as contiguous arrays of one length (ValueError otherwise); ``sizes``
    None stays None unless ``sizes_required``."""
    pos_arr = np.ascontiguousarray(positions, dtype=np.int64)
    size_arr = None
    if sizes is not None or sizes_required:
        size_arr = np.ascontiguousarray(sizes, dtype=np.int32)
        if size_arr.shape[0] != pos_arr.shape[0]:
            raise ValueError("sizes and positions differ in length")
    return pos_arr, size_arr


# ---------------------------------------------------------------------------------------------- range decode

COLUMN_DTYPES = (
    ("physical_offset", np.int64), ("store_size", np.int32), ("queue_id", np.int32), ("queue_offset", np.int64),
    ("store_timestamp", np.int64), ("born_timestamp", np.int64), ("sys_flag", np.int32), ("flag", np.int32),
    ("reconsume_times", np.int32), ("body_crc", np.uint32), ("tags_code", np.int64),
    ("body_pos", np.int64), ("body_len", np.int32), ("topic_pos", np.int64), ("topic_len", np.int32),
    ("props_pos", np.int64), ("props_len", np.int32),
)


cdef class RecordColumns:
    """Preallocated numpy columns that ``decode_range`` fills: one row per record.

    ``body_pos`` / ``topic_pos`` / ``props_pos`` are positions in the decoded buffer, so bodies stay zero-copy
    (``body(i)`` slices the buffer, ``gather_bodies`` packs them Arrow-style). Not thread-safe.

    The columns hold the decoded buffer (a buffer-protocol export, like a memoryview) until the next decode into
    them with another buffer, ``release()`` or their end: a bytearray cannot be resized nor an mmap closed under
    them (BufferError), so ``body``, ``topic_codes`` and the gathers never read memory the buffer gave back.
    """

    cdef readonly Py_ssize_t capacity
    cdef readonly Py_ssize_t count
    cdef readonly object buffer
    cdef readonly dict arrays
    cdef object _held               # memoryview of ``buffer``: its export pins the bytes the rows point into
    cdef Py_ssize_t _held_len
    cdef int64_t *c_phys
    cdef int32_t *c_size
    cdef int32_t *c_qid
    cdef int64_t *c_qoff
    cdef int64_t *c_sts
    cdef int64_t *c_bts
    cdef int32_t *c_sysflag
    cdef int32_t *c_flag
    cdef int32_t *c_recon
    cdef uint32_t *c_crc
    cdef int64_t *c_tags
    cdef int64_t *c_bpos
    cdef int32_t *c_blen
    cdef int64_t *c_tpos
    cdef int32_t *c_tlen
    cdef int64_t *c_ppos
    cdef int32_t *c_plen

    def __init__(self, Py_ssize_t capacity):
        if capacity <= 0:
            raise ArgumentRangeError("capacity must be positive", "capacity")
        self.capacity = capacity
        self.count = 0
        self.buffer = None
        self.arrays = {name: np.zeros(capacity, dtype=dt) for name, dt in COLUMN_DTYPES}
        a = self.arrays
        self.c_phys = <int64_t *>cnp.PyArray_DATA(a["physical_offset"])
        self.c_size = <int32_t *>cnp.PyArray_DATA(a["store_size"])
        self.c_qid = <int32_t *>cnp.PyArray_DATA(a["queue_id"])
        self.c_qoff = <int64_t *>cnp.PyArray_DATA(a["queue_offset"])
        self.c_sts = <int64_t *>cnp.PyArray_DATA(a["store_timestamp"])
        self.c_bts = <int64_t *>cnp.PyArray_DATA(a["born_timestamp"])
        self.c_sysflag = <int32_t *>cnp.PyArray_DATA(a["sys_flag"])
        self.c_flag = <int32_t *>cnp.PyArray_DATA(a["flag"])
        self.c_recon = <int32_t *>cnp.PyArray_DATA(a["reconsume_times"])
        self.c_crc = <uint32_t *>cnp.PyArray_DATA(a["body_crc"])
        self.c_tags = <int64_t *>cnp.PyArray_DATA(a["tags_code"])
        self.c_bpos = <int64_t *>cnp.PyArray_DATA(a["body_pos"])
        self.c_blen = <int32_t *>cnp.PyArray_DATA(a["body_len"])
        self.c_tpos = <int64_t *>cnp.PyArray_DATA(a["topic_pos"])
        self.c_tlen = <int32_t *>cnp.PyArray_DATA(a["topic_len"])
        self.c_ppos = <int64_t *>cnp.PyArray_DATA(a["props_pos"])
        self.c_plen = <int32_t *>cnp.PyArray_DATA(a["props_len"])

    def release(self):
        """Forget the decoded rows and release the buffer they point into (it may be resized or closed again)."""
        self.count = 0
        self.buffer = None
        self._held = None
        self._held_len = 0

    cdef int _hold(self, data, Py_ssize_t n) except -1:
        # keep an export of ``data`` for as long as rows point into it (a new view on an existing memoryview
        # shares its export, so the caller may still release its own view)
        if self.buffer is not data or self._held is None:
            self._held = memoryview(data)
            self.buffer = data
        self._held_len = n
        return 0

    def __getitem__(self, name):
        """The first ``count`` rows of column ``name`` (a view)."""
        return self.arrays[name][:self.count]

    def body(self, Py_ssize_t i):
        """Body of row i as a zero-copy memoryview of the decoded buffer."""
        if not 0 <= i < self.count:
            raise IndexError(i)
        _check_span(self.c_bpos[i], self.c_blen[i], 0, self._held_len, i, "body")
        p = self.c_bpos[i]
        return memoryview(self._held).cast("B")[p:p + self.c_blen[i]]

    def topic(self, Py_ssize_t i):
        if not 0 <= i < self.count:
            raise IndexError(i)
        _check_span(self.c_tpos[i], self.c_tlen[i], 0, self._held_len, i, "topic")
        p = self.c_tpos[i]
        return bytes(memoryview(self._held).cast("B")[p:p + self.c_tlen[i]]).decode("utf-8", "replace")

    def properties(self, Py_ssize_t i):
        if not 0 <= i < self.count:
            raise IndexError(i)
        _check_span(self.c_ppos[i], self.c_plen[i], 0, self._held_len, i, "properties")
        p = self.c_ppos[i]
        return parse_properties(bytes(memoryview(self._held).cast("B")[p:p + self.c_plen[i]]))

    def gather_bodies(self, data_out=None, offsets_out=None):
        """Copy the bodies of the decoded rows into one contiguous buffer with int32 offsets (Arrow binary layout).

        Returns (offsets int32[count+1], data uint8[total]); preallocated outputs are used when large enough.
        """
        cdef Py_ssize_t i, n = self.count
        cdef int64_t total = 0
        for i in range(n):
            total += self.c_blen[i]
        if total > 0x7FFFFFFF:
            raise OverflowError("bodies exceed 2 GiB: use a smaller batch")
        cdef const uint8_t[::1] src = _bytes_view(self) if n else None
        _check_spans(self, NULL, n, self.c_bpos, self.c_blen, 0, "body")
        offs = offsets_out if offsets_out is not None and len(offsets_out) >= n + 1 else np.empty(n + 1, np.int32)
        data = data_out if data_out is not None and len(data_out) >= total else np.empty(total, np.uint8)
        cdef int32_t[::1] o = offs
        cdef uint8_t[::1] d = data
        cdef int64_t pos = 0
        with nogil:  # a large copy
            o[0] = 0
            for i in range(n):
                if self.c_blen[i] > 0:
                    memcpy(&d[pos], &src[self.c_bpos[i]], self.c_blen[i])
                pos += self.c_blen[i]
                o[i + 1] = <int32_t>pos
        return offs[:n + 1], data[:total]


cdef inline void fill_row(RecordColumns cols, Py_ssize_t row, RecordView *v, const uint8_t *base,
                          int64_t phys) noexcept nogil:
    # one decoded record into row `row` of the columns (positions are relative to `base`)
    cols.c_phys[row] = phys
    cols.c_size[row] = v.total_size
    cols.c_qid[row] = v.queue_id
    cols.c_qoff[row] = v.queue_offset
    cols.c_sts[row] = v.store_timestamp
    cols.c_bts[row] = v.born_timestamp
    cols.c_sysflag[row] = v.sys_flag
    cols.c_flag[row] = v.flag
    cols.c_recon[row] = v.reconsume_times
    cols.c_crc[row] = v.body_crc
    cols.c_tags[row] = tags_code_of(v, NULL, 0)  # RocketMQ's default delay levels
    cols.c_bpos[row] = v.body - base
    cols.c_blen[row] = v.body_len
    cols.c_tpos[row] = v.topic - base
    cols.c_tlen[row] = v.topic_len
    cols.c_ppos[row] = v.props - base
    cols.c_plen[row] = v.props_len


def decode_range(data, RecordColumns cols, Py_ssize_t start=0, Py_ssize_t end=-1, long long base_offset=0,
                 bint check_crc=False, bint append=False):
    """Decode consecutive records of ``data[start:end]`` into ``cols`` (from row 0, or after its rows with ``append``).

    ``base_offset`` is the absolute offset of ``data[0]`` (a segment's base). Returns (rows added, next position,
    stop reason): "end" (zero bytes or the end of the range), "blank" (end-of-file record at next position),
    "full" (capacity reached), "torn" (a record runs past ``end``) or "corrupt" (bad magic, lengths or CRC).
    The GIL is released while decoding.
    """
    cdef const uint8_t[::1] mv = record_bytes(data, start, &end)
    cdef Py_ssize_t n = mv.shape[0]
    if not append or cols.buffer is not data:
        if append and cols.count and cols.buffer is not data:
            raise ValueError("append needs the same buffer as the rows already decoded")
        cols.count = 0 if not append else cols.count
    cols._hold(data, n)
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t pos = start, row = cols.count, cap = cols.capacity, first = cols.count
    cdef RecordView v
    cdef int rc = REC_END
    with nogil:  # a range may hold millions of records
        while pos < end:
            if row >= cap:
                rc = -1
                break
            rc = parse_record(base + pos, end - pos, &v, check_crc)
            if rc == REC_GAP:  # damage recovery quarantined: the records after it are valid
                pos += v.total_size
                rc = REC_END
                continue
            if rc != REC_OK:
                break
            fill_row(cols, row, &v, base, base_offset + pos)
            row += 1
            pos += v.total_size
            rc = REC_END
    cols.count = row
    if rc == -1:
        reason = Stop.FULL
    elif rc == REC_END:
        reason = Stop.END
    elif rc == REC_BLANK:
        reason = Stop.BLANK
    elif rc == REC_TORN:
        reason = Stop.TORN
    else:
        reason = Stop.CORRUPT
    return row - first, pos, reason


# ---------------------------------------------------------------------------------------------- Arrow layout
# Gathers that turn decoded rows into Arrow buffers (the Spark reader wraps them with pyarrow, zero-copy):
# binary / string = int32 offsets[n+1] + data bytes; validity = LSB-first bitmap; list = int32 offsets over a
# child string array; map = int32 offsets over (key string, value string) entries. ``rows`` selects and orders
# the rows gathered (int64 indices < count); None means every decoded row.

def _rows_array(rows, Py_ssize_t count):
    """``rows`` as validated contiguous int64 indices below ``count``, or None for all rows."""
    if rows is None:
        return None
    arr = np.ascontiguousarray(rows, dtype=np.int64)
    if arr.ndim != 1:
        raise ArgumentRangeError("rows must be one-dimensional", "rows")
    if arr.shape[0] and (arr.min() < 0 or arr.max() >= count):
        raise PositionOutOfRangeError(f"row index outside 0..{count - 1}", "rows")
    return arr


cdef inline Py_ssize_t _row(const int64_t *rows, Py_ssize_t i) noexcept nogil:
    return rows[i] if rows != NULL else i


cdef const uint8_t[::1] _bytes_view(RecordColumns cols):
    """The held decoded buffer as bytes (its length is the one decoded: the export keeps it from resizing)."""
    if cols._held is None:
        raise ValueError("no rows decoded yet")
    cdef const uint8_t[::1] view = memoryview(cols._held).cast("B")
    if view.shape[0] != cols._held_len:
        raise PositionOutOfRangeError("the decoded buffer changed size since the decode", "buffer")
    return view


cdef int _check_span(int64_t pos, int64_t length, int64_t lead, Py_ssize_t nbuf, Py_ssize_t row,
                     str what) except -1:
    # the bytes [pos - lead, pos + length) of a row must lie in the decoded buffer: the columns are writable
    # numpy arrays, so a row changed after the decode must not send a gather outside the buffer
    if pos - lead < 0 or length < 0 or pos > nbuf - length:
        raise PositionOutOfRangeError(
            f"row {row}: {what} at {pos} ({length} bytes) outside the decoded buffer of {nbuf} bytes "
            f"(columns changed after the decode)", "rows")
    return 0


cdef int _check_spans(RecordColumns cols, const int64_t *rp, Py_ssize_t n, const int64_t *pos_col,
                      const int32_t *len_col, int64_t lead, str what) except -1:
    """Raise PositionOutOfRangeError unless every selected row's span lies in the held buffer."""
    cdef Py_ssize_t i, r, bad = -1
    cdef Py_ssize_t nbuf = cols._held_len
    with nogil:
        for i in range(n):
            r = _row(rp, i)
            if pos_col[r] - lead < 0 or len_col[r] < 0 or pos_col[r] > nbuf - len_col[r]:
                bad = r
                break
    if bad >= 0:
        _check_span(pos_col[bad], len_col[bad], lead, nbuf, bad, what)
    return 0


def decode_positions(data, RecordColumns cols, positions, sizes=None, long long base_offset=0,
                     bint check_crc=False, bint append=False):
    """Decode the records that start at ``positions`` of ``data`` (ConsumeQueue units) into ``cols``.

    ``positions``: int64 positions relative to ``data[0]`` (physical offset - ``base_offset``); ``sizes``:
    optional int32 sizes each record must have (the units' sizes). Rows are added in the order given, from
    row 0 or after the rows already in ``cols`` with ``append`` (same buffer only).
    Returns (rows added, index of the first position not decoded, stop reason): "end" (all decoded), "full"
    (capacity reached), "torn" (a record runs past ``data``), "corrupt" (bad magic, lengths, CRC, a blank or
    zero bytes where a record must be, or a size that disagrees with ``sizes``). The GIL is released.
    """
    cdef const uint8_t[::1] mv = record_bytes(data, 0, NULL)
    cdef Py_ssize_t n = mv.shape[0]
    pos_arr, size_arr = unit_arrays(positions, sizes, False)
    cdef const int64_t *pp = <const int64_t *>cnp.PyArray_DATA(pos_arr)
    cdef Py_ssize_t npos = pos_arr.shape[0]
    cdef const int32_t *sp = <const int32_t *>cnp.PyArray_DATA(size_arr) if size_arr is not None else NULL
    if append and cols.count and cols.buffer is not data:
        raise ValueError("append needs the same buffer as the rows already decoded")
    if not append:
        cols.count = 0
    cols._hold(data, n)
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t i = 0, row = cols.count, cap = cols.capacity, first = cols.count
    cdef int64_t pos
    cdef RecordView v
    cdef int rc = REC_END
    with nogil:  # a partition may hold millions of units
        while i < npos:
            if row >= cap:
                rc = -1
                break
            pos = pp[i]
            if pos < 0 or pos >= n:
                rc = REC_TORN
                break
            rc = parse_record(base + pos, n - pos, &v, check_crc)
            if rc != REC_OK:
                break
            if sp != NULL and sp[i] != v.total_size:
                rc = REC_BAD_LENGTH
                break
            fill_row(cols, row, &v, base, base_offset + pos)
            row += 1
            i += 1
            rc = REC_END
    cols.count = row
    if rc == -1:
        reason = Stop.FULL
    elif rc == REC_END and i == npos:
        reason = Stop.END
    elif rc == REC_TORN:
        reason = Stop.TORN
    else:
        reason = Stop.CORRUPT
    return row - first, i, reason


def topic_codes(RecordColumns cols):
    """Intern the topics of the decoded rows: (int32 codes[count], list of distinct topic str in code order).

    Distinct topics are compared by their bytes in C while they are few; past 16 a dict of their bytes finds each
    (a store of 25,000 topics made a linear search quadratic: 0.7 s for one range of 65,536 records).
    """
    cdef Py_ssize_t n = cols.count, i, k, nd = 0
    codes = np.empty(n, np.int32)
    if n == 0:
        return codes, []
    cdef const uint8_t[::1] buf = _bytes_view(cols)
    _check_spans(cols, NULL, n, cols.c_tpos, cols.c_tlen, 0, "topic")
    cdef const uint8_t *base = &buf[0]
    cdef int32_t[::1] c = codes
    cdef list names = []
    cdef dict index = {}  # a distinct topic's bytes -> its code
    cdef object key, found
    # first occurrence of each distinct topic: its position and length in the buffer
    cdef int64_t[::1] dpos = np.empty(256, np.int64)
    cdef int32_t[::1] dlen = np.empty(256, np.int32)
    cdef int64_t p, prev_pos = -1
    cdef int32_t ln, prev_code = -1, prev_len = -1
    i = 0
    while i < n:
        p = cols.c_tpos[i]
        ln = cols.c_tlen[i]
        if prev_code >= 0 and ln == prev_len and memcmp(base + p, base + prev_pos, ln) == 0:
            c[i] = prev_code
            i += 1
            continue
        key = None
        if nd < 16:
            k = 0
            while k < nd:
                if dlen[k] == ln and memcmp(base + dpos[k], base + p, ln) == 0:
                    break
                k += 1
        else:
            key = PyBytes_FromStringAndSize(<const char *>(base + p), ln)
            found = index.get(key)
            k = nd if found is None else <Py_ssize_t>found
        if k == nd:
            if nd == dpos.shape[0]:
                dpos = np.concatenate([np.asarray(dpos), np.empty(nd, np.int64)])
                dlen = np.concatenate([np.asarray(dlen), np.empty(nd, np.int32)])
            dpos[nd] = p
            dlen[nd] = ln
            if key is None:
                key = PyBytes_FromStringAndSize(<const char *>(base + p), ln)
            index[key] = nd
            names.append(key.decode("utf-8", "replace"))
            nd += 1
        c[i] = <int32_t>k
        prev_code = <int32_t>k
        prev_pos = p
        prev_len = ln
        i += 1
    return codes, names


def gather_binary(RecordColumns cols, str field, rows=None):
    """Arrow binary layout of the ``field`` ("body" or "topic") of the selected rows: (int32 offsets[n+1],
    uint8 data)."""
    cdef int64_t *pos_col
    cdef int32_t *len_col
    if field == "body":
        pos_col, len_col = cols.c_bpos, cols.c_blen
    elif field == "topic":
        pos_col, len_col = cols.c_tpos, cols.c_tlen
    else:
        raise ValueError(f"unknown field {field!r}")
    cdef Py_ssize_t n, i, r
    rows = _rows_array(rows, cols.count)
    cdef const int64_t *rp = NULL if rows is None else <const int64_t *>cnp.PyArray_DATA(rows)
    n = cols.count if rows is None else len(rows)
    cdef const uint8_t[::1] buf = _bytes_view(cols) if n else None
    _check_spans(cols, rp, n, pos_col, len_col, 0, field)
    cdef int64_t total = 0, at = 0
    for i in range(n):
        total += len_col[_row(rp, i)]
    if total > 0x7FFFFFFF:
        raise OverflowError("more than 2 GiB in one batch: use smaller batches")
    offs = np.empty(n + 1, np.int32)
    data = np.empty(total, np.uint8)
    cdef int32_t *o = <int32_t *>cnp.PyArray_DATA(offs)
    cdef uint8_t *d = <uint8_t *>cnp.PyArray_DATA(data)
    cdef const uint8_t *base = &buf[0] if n and buf.shape[0] else NULL
    with nogil:  # a batch copies megabytes
        o[0] = 0
        for i in range(n):
            r = _row(rp, i)
            if len_col[r] > 0:
                memcpy(d + at, base + pos_col[r], len_col[r])
            at += len_col[r]
            o[i + 1] = <int32_t>at
    return offs, data


cdef inline int64_t _props_total(RecordColumns cols, const int64_t *rp, Py_ssize_t n) noexcept nogil:
    cdef int64_t total = 0
    cdef Py_ssize_t i
    for i in range(n):
        total += cols.c_plen[_row(rp, i)]
    return total


def gather_property(RecordColumns cols, str name, rows=None):
    """Arrow nullable binary/string layout of property ``name`` of the selected rows (RocketMQ parsing rules).

    Returns (validity bitmap uint8 or None when every row has it, null count, int32 offsets[n+1], uint8 data).
    """
    nb = name.encode("utf-8")
    cdef const char *key = nb
    cdef int32_t keylen = len(nb)
    cdef Py_ssize_t n, i, r
    rows = _rows_array(rows, cols.count)
    cdef const int64_t *rp = NULL if rows is None else <const int64_t *>cnp.PyArray_DATA(rows)
    n = cols.count if rows is None else len(rows)
    cdef const uint8_t[::1] buf = _bytes_view(cols) if n else None
    _check_spans(cols, rp, n, cols.c_ppos, cols.c_plen, 0, "properties")
    cdef int64_t total = _props_total(cols, rp, n), at = 0, nulls = 0
    if total > 0x7FFFFFFF:
        raise OverflowError("more than 2 GiB of properties in one batch: use smaller batches")
    offs = np.empty(n + 1, np.int32)
    data = np.empty(total, np.uint8)
    valid = np.zeros((n + 7) // 8, np.uint8)
    cdef int32_t *o = <int32_t *>cnp.PyArray_DATA(offs)
    cdef uint8_t *d = <uint8_t *>cnp.PyArray_DATA(data)
    cdef uint8_t *vb = <uint8_t *>cnp.PyArray_DATA(valid)
    cdef const uint8_t *base = &buf[0] if n and buf.shape[0] else NULL
    cdef const uint8_t *val
    cdef int32_t vlen
    with nogil:  # a scan of every properties string of the batch
        o[0] = 0
        for i in range(n):
            r = _row(rp, i)
            if find_property(base + cols.c_ppos[r], cols.c_plen[r], key, keylen, &val, &vlen):
                memcpy(d + at, val, vlen)
                at += vlen
                vb[i >> 3] |= <uint8_t>(1 << (i & 7))
            else:
                nulls += 1
            o[i + 1] = <int32_t>at
    return (valid if nulls else None), nulls, offs, data[:at]


cdef inline bint _next_property(const uint8_t *props, int32_t n, int32_t *start, int32_t *ks, int32_t *kl,
                                int32_t *vs, int32_t *vl) noexcept nogil:
    """The next kept ``key\\x01value`` segment at or after ``start[0]`` (RocketMQ's rules); advances ``start``."""
    cdef int32_t s = start[0], end, sep
    while s < n:
        end = s
        while end < n and props[end] != 2:
            end += 1
        if end - s >= 3:
            sep = s
            while sep < end and props[sep] != 1:
                sep += 1
            if sep > s and sep < end - 1:
                ks[0] = s
                kl[0] = sep - s
                vs[0] = sep + 1
                vl[0] = end - sep - 1
                start[0] = end + 1
                return True
        s = end + 1
    start[0] = n
    return False


def gather_keys(RecordColumns cols, rows=None):
    """Arrow list<string> layout of the KEYS property split on spaces (empty keys dropped; no KEYS: empty list).

    Returns (int32 list offsets[n+1], int32 child offsets[k+1], uint8 child data).
    """
    cdef Py_ssize_t n, i, r
    rows = _rows_array(rows, cols.count)
    cdef const int64_t *rp = NULL if rows is None else <const int64_t *>cnp.PyArray_DATA(rows)
    n = cols.count if rows is None else len(rows)
    cdef const uint8_t[::1] buf = _bytes_view(cols) if n else None
    _check_spans(cols, rp, n, cols.c_ppos, cols.c_plen, 0, "properties")
    cdef const uint8_t *base = &buf[0] if n and buf.shape[0] else NULL
    cdef const uint8_t *val
    cdef int32_t vlen, j, s
    cdef int64_t nkeys = 0, nbytes = 0, k = 0, at = 0
    with nogil:  # sizing pass
        for i in range(n):
            r = _row(rp, i)
            if find_property(base + cols.c_ppos[r], cols.c_plen[r], "KEYS", 4, &val, &vlen):
                j = 0
                while j < vlen:
                    while j < vlen and val[j] == 32:
                        j += 1
                    if j < vlen:
                        nkeys += 1
                        while j < vlen and val[j] != 32:
                            j += 1
                            nbytes += 1
    if nbytes > 0x7FFFFFFF or nkeys > 0x7FFFFFFF:
        raise OverflowError("more than 2 GiB of keys in one batch: use smaller batches")
    loffs = np.empty(n + 1, np.int32)
    coffs = np.empty(nkeys + 1, np.int32)
    data = np.empty(nbytes, np.uint8)
    cdef int32_t *lo = <int32_t *>cnp.PyArray_DATA(loffs)
    cdef int32_t *co = <int32_t *>cnp.PyArray_DATA(coffs)
    cdef uint8_t *d = <uint8_t *>cnp.PyArray_DATA(data)
    with nogil:  # fill pass
        lo[0] = 0
        co[0] = 0
        for i in range(n):
            r = _row(rp, i)
            if find_property(base + cols.c_ppos[r], cols.c_plen[r], "KEYS", 4, &val, &vlen):
                j = 0
                while j < vlen:
                    while j < vlen and val[j] == 32:
                        j += 1
                    if j < vlen:
                        s = j
                        while j < vlen and val[j] != 32:
                            j += 1
                        memcpy(d + at, val + s, j - s)
                        at += j - s
                        k += 1
                        co[k] = <int32_t>at
            lo[i + 1] = <int32_t>k
    return loffs, coffs, data


def gather_properties(RecordColumns cols, rows=None):
    """Arrow map<string,string> layout of every kept property of the selected rows, in stored order.

    Returns (int32 map offsets[n+1], int32 key offsets[k+1], uint8 key data, int32 value offsets[k+1],
    uint8 value data).
    """
    cdef Py_ssize_t n, i, r
    rows = _rows_array(rows, cols.count)
    cdef const int64_t *rp = NULL if rows is None else <const int64_t *>cnp.PyArray_DATA(rows)
    n = cols.count if rows is None else len(rows)
    cdef const uint8_t[::1] buf = _bytes_view(cols) if n else None
    _check_spans(cols, rp, n, cols.c_ppos, cols.c_plen, 0, "properties")
    cdef const uint8_t *base = &buf[0] if n and buf.shape[0] else NULL
    cdef const uint8_t *pr
    cdef int32_t plen, s, ks, kl, vs, vl
    cdef int64_t npairs = 0, kbytes = 0, vbytes = 0, k = 0, kat = 0, vat = 0
    with nogil:  # sizing pass
        for i in range(n):
            r = _row(rp, i)
            pr = base + cols.c_ppos[r]
            plen = cols.c_plen[r]
            s = 0
            while _next_property(pr, plen, &s, &ks, &kl, &vs, &vl):
                npairs += 1
                kbytes += kl
                vbytes += vl
    if max(npairs, kbytes, vbytes) > 0x7FFFFFFF:
        raise OverflowError("more than 2 GiB of properties in one batch: use smaller batches")
    moffs = np.empty(n + 1, np.int32)
    koffs = np.empty(npairs + 1, np.int32)
    kdata = np.empty(kbytes, np.uint8)
    voffs = np.empty(npairs + 1, np.int32)
    vdata = np.empty(vbytes, np.uint8)
    cdef int32_t *mo = <int32_t *>cnp.PyArray_DATA(moffs)
    cdef int32_t *ko = <int32_t *>cnp.PyArray_DATA(koffs)
    cdef int32_t *vo = <int32_t *>cnp.PyArray_DATA(voffs)
    cdef uint8_t *kd = <uint8_t *>cnp.PyArray_DATA(kdata)
    cdef uint8_t *vd = <uint8_t *>cnp.PyArray_DATA(vdata)
    with nogil:  # fill pass
        mo[0] = 0
        ko[0] = 0
        vo[0] = 0
        for i in range(n):
            r = _row(rp, i)
            pr = base + cols.c_ppos[r]
            plen = cols.c_plen[r]
            s = 0
            while _next_property(pr, plen, &s, &ks, &kl, &vs, &vl):
                memcpy(kd + kat, pr + ks, kl)
                memcpy(vd + vat, pr + vs, vl)
                kat += kl
                vat += vl
                k += 1
                ko[k] = <int32_t>kat
                vo[k] = <int32_t>vat
            mo[i + 1] = <int32_t>k
    return moffs, koffs, kdata, voffs, vdata


def gather_msg_ids(RecordColumns cols, rows=None):
    """Arrow string layout of the offset message ids (store host + physical offset, uppercase hex) of the rows.

    Returns (int32 offsets[n+1], uint8 data): 32 characters per IPv4 store host, 56 per IPv6 one.
    """
    cdef Py_ssize_t n, i, r
    rows = _rows_array(rows, cols.count)
    cdef const int64_t *rp = NULL if rows is None else <const int64_t *>cnp.PyArray_DATA(rows)
    n = cols.count if rows is None else len(rows)
    cdef const uint8_t[::1] buf = _bytes_view(cols) if n else None
    cdef const uint8_t *base = &buf[0] if n and buf.shape[0] else NULL
    cdef int64_t total = 0, at = 0, phys
    cdef int32_t hl, j
    cdef const uint8_t *host
    cdef const char *hexd = b"0123456789ABCDEF"
    cdef uint8_t raw[28]
    for i in range(n):
        r = _row(rp, i)
        total += 56 if cols.c_sysflag[r] & SYSFLAG_STOREHOST_V6 else 32
        # the store host lies 16 + its size bytes before the body
        _check_span(cols.c_bpos[r], 0,
                    16 + (HOST_V6_SIZE if cols.c_sysflag[r] & SYSFLAG_STOREHOST_V6 else HOST_V4_SIZE),
                    cols._held_len, r, "store host")
    offs = np.empty(n + 1, np.int32)
    data = np.empty(total, np.uint8)
    cdef int32_t *o = <int32_t *>cnp.PyArray_DATA(offs)
    cdef uint8_t *d = <uint8_t *>cnp.PyArray_DATA(data)
    with nogil:  # formatting a batch of ids
        o[0] = 0
        for i in range(n):
            r = _row(rp, i)
            hl = HOST_V6_SIZE if cols.c_sysflag[r] & SYSFLAG_STOREHOST_V6 else HOST_V4_SIZE
            # the store host ends 16 bytes (reconsume 4, prepared offset 8, body length 4) before the body
            host = base + cols.c_bpos[r] - 16 - hl
            memcpy(raw, host, hl)
            phys = cols.c_phys[r]
            lmq_put64(raw + hl, <uint64_t>phys)
            for j in range(hl + 8):
                d[at] = hexd[raw[j] >> 4]
                d[at + 1] = hexd[raw[j] & 15]
                at += 2
            o[i + 1] = <int32_t>at
    return offs, data
