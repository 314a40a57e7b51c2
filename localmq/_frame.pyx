# cython: boundscheck=False, wraparound=False, cdivision=True
"""The Embedded queue's simple frame and the builders of stored Messages for the Memory and Embedded queues.

Frame (big-endian), the LocalMQ layout::

    TOTALSIZE int32 | MAGIC int32 | BODY int32 + bytes | HEADERS int16 + bytes | PROPERTIES int16 + bytes

HEADERS is 24 bytes here: store timestamp int64, born timestamp int64, flag int32, and a CRC-32 (masked to
31 bits) of the body followed by the properties. The writer fills a frame from byte 4 on and stores TOTALSIZE
last, so a writer killed mid-frame leaves TOTALSIZE 0 (the end of the data); the CRC catches a frame that
reached the disk only in part (a power loss between flushes). A TOTALSIZE of 0 ends a partition's data.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from localmq._record cimport Message
from localmq._layout cimport FRAME_HEADERS_SIZE, FRAME_MAGIC, FRAME_OVERHEAD
from localmq._mapped_file cimport MappedFile
from localmq._os cimport lmq_crc32, lmq_be16, lmq_be32, lmq_be64, lmq_put16, lmq_put32, lmq_put64, lmq_store_rel

from localmq._record import parse_properties

cdef extern from *:
    """
    #define lmq_frame_fence() __atomic_thread_fence(__ATOMIC_RELEASE)
    """
    void lmq_frame_fence() noexcept nogil
from localmq.errors import CorruptFrameError, PositionOutOfRangeError, StoreClosedError
from localmq.status import Stop


# walk outcomes


def frame_size(Py_ssize_t body_len, Py_ssize_t props_len):
    """Bytes a frame with these body and properties lengths takes."""
    return FRAME_OVERHEAD + body_len + props_len


cdef inline uint32_t frame_crc(const uint8_t *body, int64_t body_len,
                               const uint8_t *props, int64_t props_len) noexcept nogil:
    # zlib's CRC-32 of body then properties (csrc/lmq_crc.c), masked to 31 bits
    cdef uint32_t c = 0
    if body_len > 0:
        c = lmq_crc32(c, body, <size_t>body_len)
    if props_len > 0:
        c = lmq_crc32(c, props, <size_t>props_len)
    return c & 0x7FFFFFFF


def write_frame(MappedFile mf, long long pos, body, bytes props, long long store_ts, long long born_ts, int flag=0):
    """Write one frame at ``pos`` of the writable mapping ``mf`` and publish it (the wrote position moves to its
    end). Returns the end position, or -1 when the frame does not fit before the end of the file.

    The caller holds the bucket's write lock (one writer per partition). Raises StoreClosedError when ``mf`` is
    closed, ValueError for properties longer than 32767 bytes.
    """
    cdef Py_buffer bv
    cdef int64_t body_len, props_len, total
    cdef uint8_t *p
    cdef uint32_t crc
    if mf.addr == NULL:
        raise StoreClosedError("the partition file is closed")
    props_len = PyBytes_GET_SIZE(props)
    if props_len > 32767:
        raise ValueError("properties longer than 32767 bytes")
    PyObject_GetBuffer(body, &bv, PyBUF_SIMPLE)
    try:
        body_len = bv.len
        total = FRAME_OVERHEAD + body_len + props_len
        if total > 0x7FFFFFFF or pos < 0 or pos + total > mf.file_size:
            return -1
        p = mf.addr + pos
        crc = frame_crc(<const uint8_t *>bv.buf, body_len, <const uint8_t *>PyBytes_AS_STRING(props), props_len)
        lmq_put32(p + 4, <uint32_t>FRAME_MAGIC)
        lmq_put32(p + 8, <uint32_t>body_len)
        if body_len:
            memcpy(p + 12, bv.buf, body_len)
        p += 12 + body_len
        lmq_put16(p, <uint16_t>FRAME_HEADERS_SIZE)
        lmq_put64(p + 2, <uint64_t>store_ts)
        lmq_put64(p + 10, <uint64_t>born_ts)
        lmq_put32(p + 18, <uint32_t>flag)
        lmq_put32(p + 22, crc)
        lmq_put16(p + 26, <uint16_t>props_len)
        if props_len:
            memcpy(p + 28, PyBytes_AS_STRING(props), props_len)
        # TOTALSIZE last: a frame is never seen whole before it is
        lmq_frame_fence()
        lmq_put32(mf.addr + pos, <uint32_t>total)
        lmq_store_rel(&mf.append_pos, pos + total)
        lmq_store_rel(&mf.wrote_pos, pos + total)
        mf.committed_pos = pos + total
        mf.store_timestamp = store_ts
    finally:
        PyBuffer_Release(&bv)
    return pos + total


cdef inline int check_frame(const uint8_t *p, int64_t avail, bint check_crc, int64_t *total_out) noexcept nogil:
    """0: a valid frame of *total_out bytes; 1: end of data (TOTALSIZE 0 or fewer than 4 bytes left); 2: torn."""
    cdef int64_t total, body_len, hdr_len, props_len
    if avail < 4:
        return 1
    total = <int32_t>lmq_be32(p)
    if total == 0:
        return 1
    if total < FRAME_OVERHEAD or total > avail:
        return 2
    if <int32_t>lmq_be32(p + 4) != <int32_t>FRAME_MAGIC:
        return 2
    body_len = <int32_t>lmq_be32(p + 8)
    if body_len < 0 or 12 + body_len + 2 > total:
        return 2
    hdr_len = <int16_t>lmq_be16(p + 12 + body_len)
    if hdr_len != FRAME_HEADERS_SIZE or 12 + body_len + 2 + hdr_len + 2 > total:
        return 2
    props_len = <int16_t>lmq_be16(p + 12 + body_len + 2 + hdr_len)
    if props_len < 0 or 12 + body_len + 2 + hdr_len + 2 + props_len != total:
        return 2
    if check_crc:
        if frame_crc(p + 12, body_len, p + total - props_len, props_len) != lmq_be32(p + 12 + body_len + 2 + 20):
            return 2
    total_out[0] = total
    return 0


def walk_frames(data, long long start=0, long long end=-1, bint check_crc=True):
    """Walk whole valid frames of ``data`` (a buffer: a mapping or bytes) from ``start`` to ``end``.

    Returns (positions, stop, outcome): the start position of every valid frame (a list of ints), where the walk
    stopped (the end of the last valid frame), and Stop.END (zero TOTALSIZE or the end of the range after the last
    whole frame) or Stop.TORN (bytes that are not a whole valid frame: torn write or corruption; cut there).
    Raises PositionOutOfRangeError when ``start`` lies outside ``data`` (``end`` < 0 or past the data means its end).
    """
    cdef Py_buffer bv
    cdef int64_t pos = start, total = 0, stop
    cdef int rc = 1
    cdef const uint8_t *base
    out = []
    PyObject_GetBuffer(data, &bv, PyBUF_SIMPLE)
    try:
        if start < 0 or start > bv.len:
            raise PositionOutOfRangeError(f"start {start} outside the buffer (0..{bv.len})", "start")
        stop = bv.len if end < 0 or end > bv.len else end
        base = <const uint8_t *>bv.buf
        while pos < stop:
            with nogil:  # CRC of large frames
                rc = check_frame(base + pos, stop - pos, check_crc, &total)
            if rc != 0:
                break
            out.append(pos)
            pos += total
        if pos >= stop:
            rc = 1
    finally:
        PyBuffer_Release(&bv)
    return out, pos, Stop.END if rc == 1 else Stop.TORN


cdef Message _new_message(str topic, object body, int queue_id, long long queue_offset, long long physical_offset,
                          long long store_ts, long long born_ts, int flag, int store_size):
    cdef Message m = Message.__new__(Message)
    m.topic = topic
    m.body = body
    m.queue_id = queue_id
    m.queue_offset = queue_offset
    m.physical_offset = physical_offset
    m.store_timestamp = store_ts
    m.born_timestamp = born_ts
    m.flag = flag
    m.store_size = store_size
    return m


def read_frames(data, str topic, int queue_id, long long first_index, long long base_offset, int max_messages,
                tag_names=None, long long max_frames=-1, bint check_crc=False):
    """Decode up to ``max_messages`` messages from the frames at the start of ``data`` (bytes of one partition).

    ``first_index`` is the queue offset of the first frame and ``base_offset`` its byte offset in the bucket.
    ``tag_names``: None for every message, else a set of tags: other messages are skipped. At most
    ``max_frames`` frames are looked at (-1: until the data ends). Returns (messages, frames_scanned); the next
    read starts at ``first_index + frames_scanned``. Raises CorruptFrameError for a frame that is not whole and
    valid.
    """
    cdef Py_buffer bv
    cdef int64_t pos = 0, total = 0, body_len, props_len, n = 0, matched = 0
    cdef int rc
    cdef const uint8_t *p
    cdef Message m
    out = []
    PyObject_GetBuffer(data, &bv, PyBUF_SIMPLE)
    try:
        p = <const uint8_t *>bv.buf
        while matched < max_messages and (max_frames < 0 or n < max_frames) and pos < bv.len:
            rc = check_frame(p + pos, bv.len - pos, check_crc, &total)
            if rc != 0:
                if rc == 1 and n > 0:
                    break
                raise CorruptFrameError(f"no valid frame at bucket offset {base_offset + pos}",
                                        offset=base_offset + pos)
            body_len = <int32_t>lmq_be32(p + pos + 8)
            props_len = total - (FRAME_OVERHEAD + body_len)
            props = PyBytes_FromStringAndSize(<const char *>(p + pos + total - props_len), props_len)
            if tag_names is not None:
                if parse_properties(props).get("TAGS") not in tag_names:
                    n += 1
                    pos += total
                    continue
            m = _new_message(topic, PyBytes_FromStringAndSize(<const char *>(p + pos + 12), body_len), queue_id,
                             first_index + n, base_offset + pos,
                             <int64_t>lmq_be64(p + pos + 12 + body_len + 2),
                             <int64_t>lmq_be64(p + pos + 12 + body_len + 10),
                             <int32_t>lmq_be32(p + pos + 12 + body_len + 18), <int>total)
            m._props_raw = props
            m.body_crc = lmq_be32(p + pos + 12 + body_len + 22)
            out.append(m)
            matched += 1
            n += 1
            pos += total
    finally:
        PyBuffer_Release(&bv)
    return out, n


def stored_message(str topic, body, dict props, int queue_id, long long queue_offset, long long store_ts,
                   long long born_ts, int flag=0, bytes raw=None):
    """A Message as the Memory queue stores it: ``props`` (a dict, not copied: the caller gives it away) holds the
    properties as a reader sees them; ``raw``, when given, the properties string as stored (it may hold pairs a
    reader drops, such as an empty value). There is no physical offset (-1) and no message id."""
    cdef Message m = _new_message(topic, body, queue_id, queue_offset, -1, store_ts, born_ts, flag, len(body))
    m._props = props
    m._props_raw = raw
    return m
