# cython: boundscheck=False, wraparound=False, cdivision=True
"""IndexFile hot paths: RocketMQ's key hash, one key insert, a slot chain walk, and indexing decoded record rows.

Every function works on a buffer over a whole index file (a MappedFile export, so the mapping cannot be unmapped
while the function runs) laid out as in RocketMQ 4.x ``store/index/IndexFile.java`` (big-endian):

    header (40 bytes)   beginTimestamp i64, endTimestamp i64, beginPhyOffset i64, endPhyOffset i64,
                        hashSlotCount i32, indexCount i32
    slots (4 bytes)     hash_slot_num int32 item numbers (0: empty)
    items (20 bytes)    index_num items: keyHash i32, physical offset i64, timeDiff i32 (seconds), prev item i32

The header is kept in the mapping only (RocketMQ's IndexHeader also writes every change through to the
buffer), so a reader in another thread, or a broker after a crash, sees the counts the writer last stored.
One thread writes a file; readers may walk it concurrently: an item is complete before its slot points at it,
and the slot before indexCount counts it (x86 keeps store order; a reader that sees a stale or torn value gets
a candidate that the caller's check of the record rejects, and every walk is bounded by indexCount).
"""
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from localmq._layout cimport (
    INDEX_H_BEGIN_PHY, INDEX_H_BEGIN_TS, INDEX_H_END_PHY, INDEX_H_END_TS, INDEX_H_INDEX_COUNT, INDEX_H_SLOT_COUNT,
    INDEX_HEADER_SIZE, INDEX_ITEM_SIZE, INDEX_MAX_KEY_BYTES, INDEX_SLOT_SIZE, MAX_PROPERTIES_SIZE, MAX_TOPIC_NAME_BYTES,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq._record cimport find_property, java_hash_utf8
from localmq._os cimport lmq_be32, lmq_be64, lmq_fallocate, lmq_put32, lmq_put64
from libc.errno cimport errno

import os

import numpy as np

from localmq.errors import ArgumentRangeError, PositionOutOfRangeError
from localmq.status import Stop

cnp.import_array()

# index_rows outcomes
cdef enum:
    R_DONE = 0
    R_FULL = 1   # the file is full (or there is none): roll, then call again from (row, key)
    R_NOSPACE = 2  # a page could not be reserved (ENOSPC...): nothing of the key written; call again later

# Sparse files (RocketMQ's default geometry is a 420 MB file, mostly holes): every page an insert writes is
# reserved first (posix_fallocate), so that a full disk is an error and never a SIGBUS. ``pages`` has one byte per
# page of the file, 1 when its blocks are known to be reserved.
cdef enum:
    PAGE_SHIFT = 12
    PAGE = 4096


cdef struct Reserve:
    int fd                 # -1: the whole file is reserved (nothing to do)
    uint8_t *pages
    int64_t npages
    int64_t file_size
    int err                # the errno of a reservation that failed


cdef int reserve_c(Reserve *rv, int64_t lo, int64_t hi) noexcept nogil:
    """Reserve the pages holding [lo, hi) not yet marked in ``rv.pages``. 0, or -1 with ``rv.err`` set."""
    cdef int64_t p, last, off, n
    if rv == NULL or rv.fd < 0 or rv.pages == NULL:
        return 0
    p = lo >> PAGE_SHIFT
    last = (hi - 1) >> PAGE_SHIFT
    while p <= last:
        if p < rv.npages and rv.pages[p] == 0:
            off = p << PAGE_SHIFT
            n = PAGE if off + PAGE <= rv.file_size else rv.file_size - off
            if lmq_fallocate(rv.fd, off, n) != 0:
                rv.err = errno
                return -1
            rv.pages[p] = 1
        p += 1
    return 0


cdef int _reserve_of(Reserve *rv, Py_ssize_t size, int fd, uint8_t[::1] pages) except -1:
    rv.fd = -1
    rv.pages = NULL
    rv.npages = 0
    rv.file_size = size
    rv.err = 0
    if fd >= 0 and pages is not None:
        if pages.shape[0] < (size + PAGE - 1) // PAGE:
            raise ArgumentRangeError("pages must have a byte for every 4 KiB page of the file", "pages")
        rv.fd = fd
        rv.pages = &pages[0]
        rv.npages = pages.shape[0]
    return 0


cdef inline int32_t positive_hash(int32_t h) noexcept nogil:
    # IndexFile.indexKeyHashMethod: Math.abs(hashCode), and abs(MIN_VALUE) (still negative in Java) becomes 0
    if h == INT32_MIN:
        return 0
    return -h if h < 0 else h


cdef inline int32_t index_count_of(const uint8_t *base) noexcept nogil:
    # IndexHeader.load: a count of 0 (a file never flushed since its creation) means 1: item 0 is never used
    cdef int32_t c = <int32_t>lmq_be32(base + INDEX_H_INDEX_COUNT)
    return 1 if c <= 0 else c


cdef int put_key_c(uint8_t *base, int64_t slot_num, int64_t index_num, int32_t key_hash, int64_t phy,
                   int64_t ts, Reserve *rv=NULL) noexcept nogil:
    """IndexFile.putKey: returns 1, 0 when the file is full, -1 when a page it writes could not be reserved
    (``rv.err``; nothing written). ``key_hash`` is already positive."""
    cdef int32_t count = index_count_of(base)
    cdef int64_t slot_pos, diff, begin_ts
    cdef int32_t slot_value
    cdef uint8_t *slot
    cdef uint8_t *item
    if count >= index_num:
        return 0
    slot_pos = key_hash % slot_num
    slot = base + INDEX_HEADER_SIZE + slot_pos * INDEX_SLOT_SIZE
    item = base + INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + <int64_t>count * INDEX_ITEM_SIZE
    # every page read or written below is reserved first (on tmpfs even a read of a hole allocates a page)
    if rv != NULL and (reserve_c(rv, 0, INDEX_HEADER_SIZE) != 0
                       or reserve_c(rv, slot - base, slot - base + INDEX_SLOT_SIZE) != 0
                       or reserve_c(rv, item - base, item - base + INDEX_ITEM_SIZE) != 0):
        return -1
    slot_value = <int32_t>lmq_be32(slot)
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    begin_ts = <int64_t>lmq_be64(base + INDEX_H_BEGIN_TS)
    if begin_ts <= 0:
        diff = 0
    else:
        diff = (ts - begin_ts) / 1000  # truncates toward zero, as Java's long division
        if diff > INT32_MAX:
            diff = INT32_MAX
        elif diff < 0:
            diff = 0
    lmq_put32(item, <uint32_t>key_hash)
    lmq_put64(item + 4, <uint64_t>phy)
    lmq_put32(item + 12, <uint32_t>diff)
    lmq_put32(item + 16, <uint32_t>slot_value)
    lmq_put32(slot, <uint32_t>count)
    if count <= 1:
        # the first item of a file sets its begin values (after its timeDiff was computed, as RocketMQ does)
        lmq_put64(base + INDEX_H_BEGIN_PHY, <uint64_t>phy)
        lmq_put64(base + INDEX_H_BEGIN_TS, <uint64_t>ts)
    if slot_value == 0:
        lmq_put32(base + INDEX_H_SLOT_COUNT, lmq_be32(base + INDEX_H_SLOT_COUNT) + 1)
    lmq_put32(base + INDEX_H_INDEX_COUNT, <uint32_t>(count + 1))
    lmq_put64(base + INDEX_H_END_PHY, <uint64_t>phy)
    lmq_put64(base + INDEX_H_END_TS, <uint64_t>ts)
    return 1


cdef bint has_item_c(const uint8_t *base, int64_t slot_num, int64_t index_num, int32_t key_hash,
                     int64_t phy, Reserve *rv=NULL) noexcept nogil:
    """True when the newest items of the key's slot already hold (key_hash, phy) (items of older records end
    the look: phy is the file's endPhyOffset, so it only ever meets the record being indexed). A slot in a page
    not reserved is a hole: empty, never read."""
    cdef int64_t slot_at = INDEX_HEADER_SIZE + (key_hash % slot_num) * INDEX_SLOT_SIZE
    if rv != NULL and rv.pages != NULL and (slot_at >> PAGE_SHIFT) < rv.npages and rv.pages[slot_at >> PAGE_SHIFT] == 0:
        return False
    cdef int32_t count = index_count_of(base)
    cdef int32_t cur = <int32_t>lmq_be32(base + INDEX_HEADER_SIZE + (key_hash % slot_num) * INDEX_SLOT_SIZE)
    cdef int32_t steps = 0
    cdef const uint8_t *item
    cdef int64_t item_phy
    while 0 < cur < count and cur < index_num and steps < count:  # (a damaged header may count past the file)
        item = base + INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + <int64_t>cur * INDEX_ITEM_SIZE
        item_phy = <int64_t>lmq_be64(item + 4)
        if item_phy < phy:
            return False
        if item_phy == phy and <int32_t>lmq_be32(item) == key_hash:
            return True
        cur = <int32_t>lmq_be32(item + 16)
        steps += 1
    return False


cdef Py_ssize_t select_c(const uint8_t *base, int64_t slot_num, int64_t items, int32_t key_hash, int64_t begin,
                         int64_t end, int64_t *out, Py_ssize_t max_out) noexcept nogil:
    """IndexFile.selectPhyOffset: offsets of items with ``key_hash`` whose time is in [begin, end], newest first."""
    cdef int32_t count = index_count_of(base)
    cdef int32_t nxt, prev, h, steps = 0
    cdef int64_t begin_ts, diff, t, phy
    cdef Py_ssize_t n = 0
    cdef const uint8_t *item
    if count <= 1:
        return 0
    nxt = <int32_t>lmq_be32(base + INDEX_HEADER_SIZE + (key_hash % slot_num) * INDEX_SLOT_SIZE)
    if nxt <= 0 or nxt > count or nxt >= items:  # (items: the file's item capacity, whatever the header says)
        return 0
    begin_ts = <int64_t>lmq_be64(base + INDEX_H_BEGIN_TS)
    while n < max_out and steps <= count:
        item = base + INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + <int64_t>nxt * INDEX_ITEM_SIZE
        h = <int32_t>lmq_be32(item)
        phy = <int64_t>lmq_be64(item + 4)
        diff = <int32_t>lmq_be32(item + 12)
        prev = <int32_t>lmq_be32(item + 16)
        if diff < 0:
            break
        t = begin_ts + diff * 1000
        if h == key_hash and begin <= t <= end:
            out[n] = phy
            n += 1
        if prev <= 0 or prev > count or prev >= items or prev == nxt or t < begin:
            break
        nxt = prev
        steps += 1
    return n


# ---------------------------------------------------------------------------------------------- Python API

def key_hash(key):
    """RocketMQ's index hash of a full index key (``"<topic>#<key>"``): abs(String.hashCode), MIN_VALUE -> 0."""
    b = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else bytes(key)
    return positive_hash(java_hash_utf8(<const uint8_t *>b, len(b)))


def put_key(uint8_t[::1] buf, long long slot_num, long long index_num, int key_hash, long long phy, long long ts,
            int fd=-1, uint8_t[::1] pages=None):
    """Insert one item (``key_hash`` from ``key_hash()``). Returns True, or False when the file is full. With
    ``fd`` and ``pages`` (a byte per 4 KiB page of the file, 1: reserved) every page written is reserved first;
    raises OSError (ENOSPC...) when one cannot be, with nothing written."""
    _check_geometry(buf.shape[0], slot_num, index_num)
    if key_hash < 0:
        raise ArgumentRangeError("key_hash must be positive (use key_hash())", "key_hash")
    cdef Reserve rv
    _reserve_of(&rv, buf.shape[0], fd, pages)
    cdef int rc = put_key_c(&buf[0], slot_num, index_num, key_hash, phy, ts, &rv)
    if rc < 0:
        raise OSError(rv.err, os.strerror(rv.err))
    return rc == 1


def select_offsets(const uint8_t[::1] buf, long long slot_num, int key_hash, long long begin, long long end,
                   Py_ssize_t max_num, const uint8_t[::1] pages=None):
    """Physical offsets of the items of ``key_hash`` stored within [begin, end] (second precision: an item's time
    is the file's begin time plus whole seconds), newest first, at most ``max_num``. An int64 numpy array.
    ``pages`` (see ``put_key``): a slot in a page not marked is a hole, empty, and is not read."""
    # (Python ints: a huge slot_num must not wrap around in C arithmetic)
    if slot_num <= 0 or buf.shape[0] < INDEX_HEADER_SIZE + <object>slot_num * INDEX_SLOT_SIZE:
        raise ArgumentRangeError("buffer smaller than the slot table", "slot_num")
    if key_hash < 0:
        raise ArgumentRangeError("key_hash must be positive (use key_hash())", "key_hash")
    cdef int64_t items = (buf.shape[0] - INDEX_HEADER_SIZE - slot_num * INDEX_SLOT_SIZE) // INDEX_ITEM_SIZE
    cdef const uint8_t *base = &buf[0]
    cdef int32_t count = index_count_of(base)
    if max_num <= 0 or count > items:
        return np.empty(0, np.int64)  # (a header that does not fit this geometry: nothing can be read safely)
    if max_num > count:
        max_num = count  # a chain holds fewer items than the file
    cdef int64_t slot_page = (INDEX_HEADER_SIZE + (key_hash % slot_num) * INDEX_SLOT_SIZE) >> PAGE_SHIFT
    if pages is not None and slot_page < pages.shape[0] and pages[slot_page] == 0:
        return np.empty(0, np.int64)
    out = np.empty(max_num, np.int64)
    cdef int64_t *op = <int64_t *>cnp.PyArray_DATA(out)
    cdef Py_ssize_t n
    with nogil:  # a chain may run through a large file
        n = select_c(base, slot_num, items, key_hash, begin, end, op, max_num)
    return out[:n]


cdef int _check_geometry(Py_ssize_t size, long long slot_num, long long index_num) except -1:
    if slot_num <= 0 or index_num <= 1:
        raise ArgumentRangeError("slot_num must be >= 1 and index_num >= 2", "slot_num")
    # (Python ints: huge counts must not wrap around in C arithmetic and match the size by accident). A buffer may
    # be longer than the geometry: a file a broker extended in place past what it was written with
    if size < INDEX_HEADER_SIZE + <object>slot_num * INDEX_SLOT_SIZE + <object>index_num * INDEX_ITEM_SIZE:
        raise ArgumentRangeError("buffer smaller than the geometry", "slot_num")
    return 0


cdef int _check_rows(Py_ssize_t nbuf, const int64_t[::1] phys, const int64_t[::1] store_ts,
                     const int32_t[::1] sys_flag, const int64_t[::1] topic_pos, const int32_t[::1] topic_len,
                     const int64_t[::1] props_pos, const int32_t[::1] props_len, Py_ssize_t row, Py_ssize_t key,
                     Py_ssize_t count) except -1:
    """index_rows' arguments: rows [row, count) inside every column, each topic and properties span inside
    ``data`` and no longer than a record allows (the key scratch buffer is sized by them)."""
    cdef Py_ssize_t r
    if row < 0 or key < 0 or count < 0:
        raise PositionOutOfRangeError(f"row {row}, key {key} and count {count} must not be negative", "row")
    if count > min(phys.shape[0], store_ts.shape[0], sys_flag.shape[0], topic_pos.shape[0], topic_len.shape[0],
                   props_pos.shape[0], props_len.shape[0]):
        raise ArgumentRangeError("count exceeds the columns", "count")
    for r in range(row, count):
        if (topic_len[r] < 0 or topic_len[r] > MAX_TOPIC_NAME_BYTES or topic_pos[r] < 0
                or topic_pos[r] > nbuf - topic_len[r]):
            raise PositionOutOfRangeError(f"row {r}: topic span outside the data or too long", "topic_pos")
        if (props_len[r] < 0 or props_len[r] > MAX_PROPERTIES_SIZE or props_pos[r] < 0
                or props_pos[r] > nbuf - props_len[r]):
            raise PositionOutOfRangeError(f"row {r}: properties span outside the data or too long", "props_pos")
    return 0


def index_rows(uint8_t[::1] buf, long long slot_num, long long index_num, const uint8_t[::1] data,
               const int64_t[::1] phys, const int64_t[::1] store_ts, const int32_t[::1] sys_flag,
               const int64_t[::1] topic_pos, const int32_t[::1] topic_len, const int64_t[::1] props_pos,
               const int32_t[::1] props_len, Py_ssize_t row, Py_ssize_t key, Py_ssize_t count, int fd=-1,
               uint8_t[::1] pages=None):
    """Index rows [row, count) of decoded records (``RecordColumns`` columns over ``data``) into the index file
    ``buf`` (None: no file yet), as RocketMQ's CommitLogDispatcherBuildIndex: ``<topic>#<UNIQ_KEY>`` first, then
    ``<topic>#<k>`` for every non-empty space-separated ``k`` of KEYS; ROLLBACK records and records below the
    file's endPhyOffset are skipped. A key of the record at endPhyOffset that the file already holds is not
    added twice (the resumed record after a restart). ``key`` is the number of keys of ``row`` already indexed.

    Returns (outcome, row, key, keys added): Stop.END, or Stop.FULL when the file is full or absent; call again
    with the returned row and key after rolling. With ``fd`` and ``pages`` (see ``put_key``) every page written is
    reserved first; when one cannot be, OSError (ENOSPC...) is raised: the keys before it stay indexed, and a call
    again with the same rows (row 0) goes on where it stopped, since rows below the file's endPhyOffset are skipped
    and the keys the record at endPhyOffset already has are not added twice. The GIL is released.
    """
    cdef Py_ssize_t n = count
    if n > phys.shape[0]:
        raise ArgumentRangeError("count exceeds the columns", "count")
    _check_rows(data.shape[0], phys, store_ts, sys_flag, topic_pos, topic_len, props_pos, props_len, row, key, count)
    cdef uint8_t *base = NULL
    cdef Reserve rv
    _reserve_of(&rv, buf.shape[0] if buf is not None else 0, fd, pages)
    if buf is not None:
        _check_geometry(buf.shape[0], slot_num, index_num)
        base = &buf[0]
    cdef const uint8_t *d = &data[0] if data.shape[0] else NULL
    cdef uint8_t *scratch = <uint8_t *>PyMem_Malloc(INDEX_MAX_KEY_BYTES)
    if scratch == NULL:
        raise MemoryError()
    cdef Py_ssize_t r = row, k = key, done = key, added = 0
    cdef int outcome = R_DONE
    cdef int32_t tl, pl, vlen, h, s, e
    cdef int rc
    cdef const uint8_t *props
    cdef const uint8_t *val
    cdef int64_t end_phy, ph
    try:
        with nogil:  # a batch of thousands of records and their keys
            while r < n:
                ph = phys[r]
                end_phy = <int64_t>lmq_be64(base + INDEX_H_END_PHY) if base != NULL else -1
                if (sys_flag[r] & SYSFLAG_TRANSACTION_MASK) == SYSFLAG_TRANSACTION_ROLLBACK or ph < end_phy:
                    r += 1
                    k = 0
                    continue
                tl = topic_len[r]
                memcpy(scratch, d + topic_pos[r], tl)
                scratch[tl] = 35  # '#'
                props = d + props_pos[r]
                pl = props_len[r]
                done = 0  # keys of this record seen so far; the first k were indexed by an earlier call
                if find_property(props, pl, "UNIQ_KEY", 8, &val, &vlen):
                    if done >= k:
                        if base == NULL:
                            outcome = R_FULL
                            break
                        memcpy(scratch + tl + 1, val, vlen)
                        h = positive_hash(java_hash_utf8(scratch, tl + 1 + vlen))
                        if not (ph == end_phy and has_item_c(base, slot_num, index_num, h, ph, &rv)):
                            rc = put_key_c(base, slot_num, index_num, h, ph, store_ts[r], &rv)
                            if rc <= 0:
                                outcome = R_FULL if rc == 0 else R_NOSPACE
                                break
                            added += 1
                    done += 1
                if find_property(props, pl, "KEYS", 4, &val, &vlen):
                    s = 0
                    while s < vlen:
                        e = s
                        while e < vlen and val[e] != 32:
                            e += 1
                        if e > s:
                            if done >= k:
                                if base == NULL:
                                    outcome = R_FULL
                                    break
                                memcpy(scratch + tl + 1, val + s, e - s)
                                h = positive_hash(java_hash_utf8(scratch, tl + 1 + e - s))
                                if not (ph == end_phy and has_item_c(base, slot_num, index_num, h, ph, &rv)):
                                    rc = put_key_c(base, slot_num, index_num, h, ph, store_ts[r], &rv)
                                    if rc <= 0:
                                        outcome = R_FULL if rc == 0 else R_NOSPACE
                                        break
                                    added += 1
                            done += 1
                        s = e + 1
                    if outcome != R_DONE:
                        break
                r += 1
                k = 0
            if outcome == R_FULL:
                k = done
    finally:
        PyMem_Free(scratch)
    if outcome == R_NOSPACE:
        # the keys before it are indexed; a call again indexes from the file's endPhyOffset on, its record's keys
        # already there not twice (the rule above)
        raise OSError(rv.err, os.strerror(rv.err))
    return (Stop.FULL if outcome == R_FULL else Stop.END), r, k, added
