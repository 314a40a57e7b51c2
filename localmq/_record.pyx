# cython: boundscheck=False, wraparound=False, cdivision=True
"""RocketMQ CommitLog records (4.x V1, 5.x V2): encode and decode one record, properties, hashes, Message."""
import zlib

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from localmq._layout cimport (
    BLANK_MAGIC_CODE, BODY_CRC_MASK, GAP_RECORD_SIZE, GAP_SIGNATURE, HOST_V4_SIZE, HOST_V6_SIZE, MAX_PROPERTIES_SIZE,
    MAX_TOPIC_BYTES, MAX_TOPIC_NAME_BYTES, MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, REC_BODY_CRC, REC_BORN_HOST,
    REC_BORN_TIMESTAMP, REC_FLAG, REC_MIN_SIZE,
    REC_PHYSICAL_OFFSET, REC_QUEUE_ID, REC_QUEUE_OFFSET, REC_SYS_FLAG, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
)
from localmq._os cimport lmq_be16, lmq_be32, lmq_be64, lmq_put16, lmq_put32, lmq_put64
from localmq._os cimport lmq_crc32, lmq_crc32_accelerated, lmq_crc32_portable
from localmq._msg_id cimport host_text, msg_id_of

from localmq.errors import (
    AckError, CorruptFrameError, InvalidPropertyError, PositionOutOfRangeError, PropertiesSizeError,
)
from localmq.status import RecordStatus
# their home before _msg_id.pyx: importable from here as before
from localmq._msg_id import create_message_id, decode_message_id, pack_host  # no-cython-lint

# RocketMQ's default messageDelayLevel, in ms (SCHEDULE_TOPIC_XXXX tagsCode = store time + delay of the level).
cdef int64_t DELAY_LEVELS_MS[18]
_levels = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
for _i, _s in enumerate(_levels):
    DELAY_LEVELS_MS[_i] = _s * 1000


cdef int64_t calc_msg_length(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len) noexcept nogil:
    """TOTALSIZE of the record written for a topic of ``topic_len`` bytes: V1 up to MAX_TOPIC_BYTES, V2 above (as
    RocketMQ 5.x chooses with autoMessageVersionOnTopicLen; layout.record_size)."""
    return calc_msg_length_v(sys_flag, body_len, topic_len, props_len, 1 if topic_len <= MAX_TOPIC_BYTES else 2)


cdef int64_t calc_msg_length_v(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len,
                               int32_t topic_len_size) noexcept nogil:
    # REC_MIN_SIZE is the V1 record with IPv4 hosts and empty body, topic and properties (a 1-byte topic length);
    # a V2 record's topic length takes 2 (``topic_len_size``)
    cdef int64_t extra = topic_len_size - 1
    if sys_flag & SYSFLAG_BORNHOST_V6:
        extra += HOST_V6_SIZE - HOST_V4_SIZE
    if sys_flag & SYSFLAG_STOREHOST_V6:
        extra += HOST_V6_SIZE - HOST_V4_SIZE
    if body_len < 0:
        body_len = 0
    if props_len < 0:
        props_len = 0
    return REC_MIN_SIZE + extra + body_len + topic_len + props_len


cdef uint32_t body_crc32(const uint8_t *p, int64_t n) noexcept nogil:
    # zlib's CRC-32 (csrc/lmq_crc.c: PCLMULQDQ folding or slice-by-8), masked like RocketMQ's UtilAll.crc32
    if n <= 0:
        return 0
    return lmq_crc32(0, p, <size_t>n) & BODY_CRC_MASK


cdef int parse_record(const uint8_t *p, int64_t avail, RecordView *v, bint check_crc) noexcept nogil:
    """Parse the record at p with `avail` readable bytes. Fills v; returns a REC_* outcome (never reads past avail)."""
    cdef int64_t pos, need
    cdef int32_t total, magic
    if avail < 8:
        if avail <= 0:
            return REC_END
        for pos in range(avail):
            if p[pos] != 0:
                return REC_TORN
        return REC_END
    total = <int32_t>lmq_be32(p)
    magic = <int32_t>lmq_be32(p + 4)
    v.total_size = total
    v.magic = magic
    if magic == BLANK_MAGIC_CODE:
        # a RocketMQ blank runs to the segment's end; a gap record (same magic, so RocketMQ reads it as a blank)
        # carries localmq's signature and its own length, which may reach past ``avail`` (a caller's range end)
        if total >= GAP_RECORD_SIZE and avail >= GAP_RECORD_SIZE and lmq_be64(p + 8) == <uint64_t>GAP_SIGNATURE:
            return REC_GAP
        return REC_BLANK
    if magic == MESSAGE_MAGIC_CODE:
        v.topic_len_size = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        v.topic_len_size = 2
    else:
        if total == 0 and magic == 0:
            return REC_END
        return REC_BAD_MAGIC
    if total < REC_MIN_SIZE:
        return REC_BAD_LENGTH
    if total > avail:
        return REC_TORN
    v.body_crc = lmq_be32(p + REC_BODY_CRC)
    v.queue_id = <int32_t>lmq_be32(p + REC_QUEUE_ID)
    v.flag = <int32_t>lmq_be32(p + REC_FLAG)
    v.queue_offset = <int64_t>lmq_be64(p + REC_QUEUE_OFFSET)
    v.physical_offset = <int64_t>lmq_be64(p + REC_PHYSICAL_OFFSET)
    v.sys_flag = <int32_t>lmq_be32(p + REC_SYS_FLAG)
    v.born_timestamp = <int64_t>lmq_be64(p + REC_BORN_TIMESTAMP)
    pos = REC_BORN_HOST
    v.born_host = p + pos
    v.born_host_len = HOST_V4_SIZE if (v.sys_flag & SYSFLAG_BORNHOST_V6) == 0 else HOST_V6_SIZE
    pos += v.born_host_len
    v.store_timestamp = <int64_t>lmq_be64(p + pos)
    pos += 8
    v.store_host = p + pos
    v.store_host_len = HOST_V4_SIZE if (v.sys_flag & SYSFLAG_STOREHOST_V6) == 0 else HOST_V6_SIZE
    pos += v.store_host_len
    # fixed part left: reconsume 4, prepared 8, body length 4, topic length 1 (V2: 2)
    if pos + 16 + v.topic_len_size > total:
        return REC_BAD_LENGTH
    v.reconsume_times = <int32_t>lmq_be32(p + pos)
    v.prepared_transaction_offset = <int64_t>lmq_be64(p + pos + 4)
    v.body_len = <int32_t>lmq_be32(p + pos + 12)
    pos += 16
    if v.body_len < 0 or pos + v.body_len + v.topic_len_size + 2 > total:
        return REC_BAD_LENGTH
    v.body = p + pos
    pos += v.body_len
    if v.topic_len_size == 1:
        v.topic_len = <int32_t>(<signed char>p[pos])
    else:
        v.topic_len = <int32_t>(<int16_t>lmq_be16(p + pos))
    pos += v.topic_len_size
    if v.topic_len < 0 or pos + v.topic_len + 2 > total:
        return REC_BAD_LENGTH
    v.topic = p + pos
    pos += v.topic_len
    v.props_len = <int32_t>(<int16_t>lmq_be16(p + pos))
    pos += 2
    if v.props_len < 0 or pos + v.props_len != total:
        return REC_BAD_LENGTH
    v.props = p + pos
    need = calc_msg_length_v(v.sys_flag, v.body_len, v.topic_len, v.props_len, v.topic_len_size)
    if need != total:
        return REC_BAD_LENGTH
    if check_crc and body_crc32(v.body, v.body_len) != v.body_crc:
        return REC_BAD_CRC
    return REC_OK


cdef bint topic_ok(const RecordView *v) noexcept nogil:
    """Whether the record's topic matches [%|a-zA-Z0-9_-] (RocketMQ's TopicValidator) and fits its version: 1..127
    bytes in a V1 record, 1..MAX_TOPIC_NAME_BYTES (a ConsumeQueue directory name) in a V2 record. Every writer checks
    it, so any other byte there is a damaged header, which the body CRC does not cover."""
    cdef int32_t i
    cdef uint8_t c
    if v.topic_len <= 0 or v.topic_len > MAX_TOPIC_NAME_BYTES:
        return False
    for i in range(v.topic_len):
        c = v.topic[i]
        if not ((c >= 97 and c <= 122) or (c >= 65 and c <= 90) or (c >= 48 and c <= 57) or c == 37 or c == 124
                or c == 95 or c == 45):
            return False
    return True


# The smallest unit a disk writes atomically: a power cut during a write keeps or loses whole sectors.
cdef int64_t SECTOR_SIZE = 512


cdef bint props_torn(const uint8_t *base, const RecordView *v) noexcept nogil:
    """Whether the record's properties hold a sector of zeros (``base``: the start of the segment file, which is
    sector aligned): what a torn write of the record's tail leaves on a file written once over zeros. Every other
    field is protected (the body by its CRC, the topic by ``topic_ok``, the lengths by their sum), but a torn
    properties string is still a well-formed record, and without this check recovery kept it with its keys, tags
    and user properties cut short (tests/test_power_loss.py). A sector is torn when every byte of the properties
    inside it is zero; no writer puts a zero byte in a property, unless a value holds NUL characters that fill
    such a sector exactly."""
    cdef int64_t at = v.props - base
    cdef int64_t i = 0, stop, j
    cdef bint zero
    while i < v.props_len:
        stop = (at + i) // SECTOR_SIZE * SECTOR_SIZE + SECTOR_SIZE - at
        if stop > v.props_len:
            stop = v.props_len
        zero = True
        for j in range(i, stop):
            if v.props[j] != 0:
                zero = False
                break
        if zero:
            return True
        i = stop
    return False


cdef int32_t java_hash_utf8(const uint8_t *s, int64_t n) noexcept nogil:
    """Java String.hashCode over the UTF-16 code units of UTF-8 text (malformed bytes count as U+FFFD)."""
    cdef uint32_t h = 0
    cdef int64_t i = 0
    cdef uint32_t c, cp
    cdef int extra, k
    cdef bint ok
    while i < n:
        c = s[i]
        if c < 0x80:
            h = 31 * h + c
            i += 1
            continue
        if c >= 0xF0 and c < 0xF5:
            extra = 3
            cp = c & 0x07
        elif c >= 0xE0 and c < 0xF0:
            extra = 2
            cp = c & 0x0F
        elif c >= 0xC2 and c < 0xE0:
            extra = 1
            cp = c & 0x1F
        else:
            h = 31 * h + 0xFFFD
            i += 1
            continue
        if i + extra >= n:
            h = 31 * h + 0xFFFD
            i += 1
            continue
        ok = True
        for k in range(1, extra + 1):
            if (s[i + k] & 0xC0) != 0x80:
                ok = False
                break
            cp = (cp << 6) | (s[i + k] & 0x3F)
        if not ok or (extra == 2 and cp < 0x800) or (extra == 3 and (cp < 0x10000 or cp > 0x10FFFF)):
            h = 31 * h + 0xFFFD
            i += 1
            continue
        i += extra + 1
        if cp >= 0x10000:
            cp -= 0x10000
            h = 31 * h + (0xD800 + (cp >> 10))
            h = 31 * h + (0xDC00 + (cp & 0x3FF))
        else:
            h = 31 * h + cp
    return <int32_t>h


cdef bint find_property(const uint8_t *props, int32_t n, const char *key, int32_t keylen,
                        const uint8_t **val, int32_t *vlen) noexcept nogil:
    """Find `key` in a 0x01/0x02 properties string by RocketMQ's parsing rules; sets val/vlen when found."""
    cdef int32_t start = 0, end, sep, j
    while start < n:
        end = start
        while end < n and props[end] != 2:
            end += 1
        # segment [start, end): skip those shorter than 3 chars or with an empty key / value
        if end - start >= 3:
            sep = start
            while sep < end and props[sep] != 1:
                sep += 1
            if sep > start and sep < end - 1 and sep - start == keylen:
                j = 0
                while j < keylen and props[start + j] == <uint8_t>key[j]:
                    j += 1
                if j == keylen:
                    val[0] = props + sep + 1
                    vlen[0] = end - sep - 1
                    return True
        start = end + 1
    return False


cdef bint is_schedule_record(const RecordView *v) noexcept nogil:
    """Whether the record is in SCHEDULE_TOPIC_XXXX (its tagsCode is a delivery time, from the store's levels)."""
    return v.topic_len == 19 and memcmp(v.topic, b"SCHEDULE_TOPIC_XXXX", 19) == 0


cdef int64_t tags_code_of(const RecordView *v, const int64_t *levels, int32_t n_levels) noexcept nogil:
    """The ConsumeQueue tagsCode of a record: hash of TAGS, or for SCHEDULE_TOPIC_XXXX the delivery time, store
    time + the delay of its DELAY level in ``levels`` (``n_levels`` of them, ms; NULL: RocketMQ's default
    table), the level clamped to the largest one as RocketMQ's store does."""
    cdef const uint8_t *val
    cdef int32_t vlen, i
    cdef int64_t level
    if levels == NULL or n_levels <= 0:
        levels = DELAY_LEVELS_MS
        n_levels = 18
    if is_schedule_record(v):
        if find_property(v.props, v.props_len, "DELAY", 5, &val, &vlen):
            level = 0
            for i in range(vlen):
                if val[i] < 48 or val[i] > 57:
                    level = -1
                    break
                level = level * 10 + (val[i] - 48)
            if level > 0:
                if level > n_levels:
                    level = n_levels
                return v.store_timestamp + levels[level - 1]
    if find_property(v.props, v.props_len, "TAGS", 4, &val, &vlen):
        return <int64_t>java_hash_utf8(val, vlen)
    return 0


cdef int32_t encode_head(uint8_t *p, bint v2, int32_t queue_id, int32_t flag, int32_t sys_flag,
                         int64_t born_timestamp, const uint8_t *born_host, int32_t born_host_len,
                         int64_t store_timestamp, const uint8_t *store_host, int32_t store_host_len,
                         int32_t reconsume_times, int64_t prepared_transaction_offset) noexcept nogil:
    """The header fields up to the body that the records of one put share (a batch encodes them once, copies them to
    each record and adds its own with encode_own); returns the head's length, at most REC_HEAD_MAX (hosts of 8 or
    20 bytes, as their sysflag bits say). TOTALSIZE, BODYCRC, QUEUEOFFSET, PHYSICALOFFSET and BODYLENGTH (the head's
    last 4 bytes) are each record's own. ``v2``: a topic longer than MAX_TOPIC_BYTES (RocketMQ 5.x's V2 record)."""
    cdef int32_t q
    lmq_put32(p + 4, <uint32_t>(MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE))
    lmq_put32(p + REC_QUEUE_ID, <uint32_t>queue_id)
    lmq_put32(p + REC_FLAG, <uint32_t>flag)
    lmq_put32(p + REC_SYS_FLAG, <uint32_t>sys_flag)
    lmq_put64(p + REC_BORN_TIMESTAMP, <uint64_t>born_timestamp)
    memcpy(p + REC_BORN_HOST, born_host, born_host_len)
    q = REC_BORN_HOST + born_host_len
    lmq_put64(p + q, <uint64_t>store_timestamp)
    memcpy(p + q + 8, store_host, store_host_len)
    q += 8 + store_host_len
    lmq_put32(p + q, <uint32_t>reconsume_times)
    lmq_put64(p + q + 4, <uint64_t>prepared_transaction_offset)
    return q + 16


cdef void encode_own(uint8_t *p, int32_t head_len, int32_t total, int64_t queue_offset, int64_t physical_offset,
                     const uint8_t *body, int32_t body_len, bint v2, const uint8_t *topic, int32_t topic_len,
                     const uint8_t *props, int32_t props_len) noexcept nogil:
    """A record's own fields, its body, topic and properties, after the head of head_len bytes at p (encode_head's);
    ``total`` as calc_msg_length gives it."""
    lmq_put32(p, <uint32_t>total)
    lmq_put32(p + REC_BODY_CRC, body_crc32(body, body_len))
    lmq_put64(p + REC_QUEUE_OFFSET, <uint64_t>queue_offset)
    lmq_put64(p + REC_PHYSICAL_OFFSET, <uint64_t>physical_offset)
    lmq_put32(p + head_len - 4, <uint32_t>body_len)
    p += head_len
    if body_len > 0:
        memcpy(p, body, body_len)
        p += body_len
    if v2:
        lmq_put16(p, <uint16_t>topic_len)
        p += 2
    else:
        p[0] = <uint8_t>topic_len
        p += 1
    memcpy(p, topic, topic_len)
    p += topic_len
    lmq_put16(p, <uint16_t>props_len)
    if props_len > 0:
        memcpy(p + 2, props, props_len)


cdef void write_record(uint8_t *dst, int32_t total, int32_t queue_id, int32_t flag, int64_t queue_offset,
                       int64_t physical_offset, int32_t sys_flag, int64_t born_timestamp,
                       const uint8_t *born_host, int32_t born_host_len, int64_t store_timestamp,
                       const uint8_t *store_host, int32_t store_host_len, int32_t reconsume_times,
                       int64_t prepared_transaction_offset, const uint8_t *body, int32_t body_len,
                       const uint8_t *topic, int32_t topic_len, const uint8_t *props, int32_t props_len) noexcept nogil:
    """Write one complete record at dst (total bytes, already computed by calc_msg_length): V1, or V2 (int16 topic
    length) for a topic longer than MAX_TOPIC_BYTES, as RocketMQ 5.x does."""
    cdef bint v2 = topic_len > MAX_TOPIC_BYTES
    cdef int32_t head_len = encode_head(dst, v2, queue_id, flag, sys_flag, born_timestamp, born_host, born_host_len,
                                        store_timestamp, store_host, store_host_len, reconsume_times,
                                        prepared_transaction_offset)
    encode_own(dst, head_len, total, queue_offset, physical_offset, body, body_len, v2, topic, topic_len, props,
               props_len)


cdef void write_blank(uint8_t *dst, int32_t size) noexcept nogil:
    lmq_put32(dst, <uint32_t>size)
    lmq_put32(dst + 4, <uint32_t>BLANK_MAGIC_CODE)


# ---------------------------------------------------------------------------------------------- properties

def properties_to_bytes(props):
    """Serialise a mapping as RocketMQ's properties string (``k\\x01v\\x02...``, no trailing 0x02), UTF-8, as
    ``MessageDecoder.messageProperties2String`` does: a None value is left out, an empty value is written
    (``k\\x01``), and a reader (``parse_properties``, RocketMQ's ``string2messageProperties``) then drops it.

    Raises InvalidPropertyError for an empty name, a name or value that is not a str or contains 0x01/0x02
    (none of those could be read back), and PropertiesSizeError when the result exceeds 32767 bytes.
    """
    if not props:
        return b""
    parts = []
    for k, v in props.items():
        if v is None:
            continue
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidPropertyError(f"property names and values must be str: {k!r}={v!r}")
        if not k:
            raise InvalidPropertyError(f"a property name must not be empty (value {v!r})")
        if "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
            raise InvalidPropertyError(f"property {k!r}={v!r} contains a 0x01/0x02 separator")
        parts.append(f"{k}\x01{v}")
    out = "\x02".join(parts).encode("utf-8")
    if len(out) > MAX_PROPERTIES_SIZE:
        raise PropertiesSizeError(f"properties encode to {len(out)} bytes, more than {MAX_PROPERTIES_SIZE}")
    return out


def parse_properties(raw):
    """Parse a properties string (bytes or str) by RocketMQ's rules: split on 0x02, keep ``k\\x01v`` with both
    non-empty."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw).decode("utf-8", "replace")
    out = {}
    for seg in raw.split("\x02"):
        if len(seg) < 3:
            continue
        i = seg.find("\x01")
        if 0 < i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1:]
    return out


def java_hash(text):
    """Java ``String.hashCode()`` of ``text`` (int32, UTF-16 code units)."""
    b = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return java_hash_utf8(<const uint8_t *>PyBytes_AS_STRING(b), len(b))


def tags_hash(tags):
    """ConsumeQueue tagsCode of a tag string (0 for None or empty)."""
    if not tags:
        return 0
    return java_hash(tags)


def body_crc(data):
    """``zlib.crc32(body) & 0x7FFFFFFF``: the BODYCRC field."""
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if mv.shape[0] == 0:
        return 0
    return body_crc32(&mv[0], mv.shape[0])


def _crc32(data, unsigned int crc=0, bint portable=False):
    """Unmasked ``zlib.crc32(data, crc)`` computed by csrc/lmq_crc.c (tests): the dispatched implementation, or
    the portable slice-by-8 one with ``portable``."""
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef const uint8_t *p = NULL
    cdef size_t n = mv.shape[0]
    if n:
        p = &mv[0]
    with nogil:
        crc = lmq_crc32_portable(crc, p, n) if portable else lmq_crc32(crc, p, n)
    return crc


def _crc32_accelerated():
    """True when the CRC runs on PCLMULQDQ (False on CPUs without it or with LOCALMQ_CRC=portable)."""
    return lmq_crc32_accelerated() != 0


# ---------------------------------------------------------------------------------------------- Message

@cython.freelist(512)
cdef class Message:
    """One stored message (read back from a CommitLog), or one to send.

    Numeric fields are filled when decoded; ``tags``, ``keys``, ``properties`` and ``msg_id`` are computed on
    first access. Immutable once created. Safe to share between threads.
    """

    def __init__(self, topic, body, *, tags=None, keys=None, properties=None, flag=0, queue_id=0):
        self.topic = topic
        self.body = body
        self.flag = flag
        self.queue_id = queue_id
        d = dict(properties) if properties else {}
        if tags is not None:
            d["TAGS"] = tags
        if keys is not None:
            d["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
        self._props = d
        self._props_raw = None
        self.queue_offset = -1
        self.physical_offset = -1
        self.store_size = 0

    @property
    def properties(self):
        """All properties as a dict (a copy). A stored pair with an empty value is not in it: RocketMQ's reader
        (``string2messageProperties``) drops it too; ``raw_properties`` keeps it."""
        if self._props is None:
            self._props = parse_properties(self._props_raw) if self._props_raw else {}
        return dict(self._props)

    @property
    def tags(self):
        """The TAGS property, or None (also for a stored empty tag, which RocketMQ reads as no tag)."""
        if self._props is None:
            self._props = parse_properties(self._props_raw) if self._props_raw else {}
        return self._props.get("TAGS")

    @property
    def keys(self):
        """The KEYS property split on spaces (a tuple, empty when absent)."""
        if self._props is None:
            self._props = parse_properties(self._props_raw) if self._props_raw else {}
        k = self._props.get("KEYS")
        if not k:
            return ()
        return tuple(x for x in k.split(" ") if x)

    @property
    def raw_properties(self):
        """The stored properties bytes."""
        return self._props_raw if self._props_raw is not None else properties_to_bytes(self._props)

    @property
    def msg_id(self):
        """Offset message id (store host + physical offset), or None for a message not read from a store."""
        if self._store_host_len == 0:
            return None
        return msg_id_of(self._store_host, self._store_host_len, self.physical_offset)

    @property
    def store_host(self):
        return host_text(self._store_host, self._store_host_len) if self._store_host_len else None

    @property
    def born_host(self):
        return host_text(self._born_host, self._born_host_len) if self._born_host_len else None

    @property
    def uniq_key(self):
        return self.properties.get("UNIQ_KEY")

    def ack(self):
        """Acknowledge this message (handed out by a ``manual_ack`` consumer): it is done, and the group's
        committed offset may move past it. Acking twice, or after ``nack``, does nothing; neither does acking a
        message whose queue passed to another consumer meanwhile (that consumer delivers it again).

        Raises AckError for a message no ``manual_ack`` consumer handed out.
        """
        a = self._acker
        if a is None:
            raise AckError("this message was not handed out by a consumer created with manual_ack=True")
        a.ack(self)

    def nack(self, *, delay=None, delay_level=None):
        """Fail this message (handed out by a ``manual_ack`` consumer): it is sent back to the group's retry topic
        ``%RETRY%<group>`` and delivered again after a delay (``delay_level``, else the smallest level of at least
        ``delay`` seconds, else RocketMQ's 3 + reconsume times); after ``max_reconsume_times`` failures it goes to
        the dead-letter topic ``%DLQ%<group>`` instead. ``delay_level=-1`` sends it to the dead letters at once.

        Raises AckError (not from a ``manual_ack`` consumer), SendError (the send-back was refused: the message
        stays unacknowledged), InvalidDelayError.
        """
        a = self._acker
        if a is None:
            raise AckError("this message was not handed out by a consumer created with manual_ack=True")
        a.nack(self, delay, delay_level)

    def __repr__(self):
        b = self.body
        shown = bytes(b[:32]) if b is not None else None
        return (f"Message(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"physical_offset={self.physical_offset}, tags={self.tags!r}, body={shown!r}"
                f"{'...' if b is not None and len(b) > 32 else ''})")

    def __reduce__(self):
        return (_rebuild_message, (self.topic, bytes(self.body) if self.body is not None else None,
                                   self.raw_properties, self.queue_id, self.queue_offset, self.physical_offset,
                                   self.store_timestamp, self.born_timestamp, self.prepared_transaction_offset,
                                   self.flag, self.sys_flag, self.reconsume_times, self.store_size, self.body_crc,
                                   PyBytes_FromStringAndSize(<char *>self._store_host, self._store_host_len),
                                   PyBytes_FromStringAndSize(<char *>self._born_host, self._born_host_len)))


def bind_delivery(Message m, object acker, object topic=None, int reconsume_times=-1):
    """A consumer's hand-out of ``m``: ``m.ack()`` / ``m.nack()`` go to ``acker``; ``topic`` (when given)
    replaces the stored topic, as RocketMQ's client shows a retried message under its original topic;
    ``reconsume_times`` (when >= 0) replaces the count, as an orderly consumer counts failures in memory."""
    m._acker = acker
    if topic is not None:
        m.topic = topic
    if reconsume_times >= 0:
        m.reconsume_times = reconsume_times


def inflate_body(Message m):
    """Replace the body of ``m`` (sysflag COMPRESSED: zlib, as RocketMQ 4.x producers compress bodies over 4 KiB)
    with its inflated bytes, as RocketMQ's client does on delivery; the sysflag is left as stored. Returns False
    (body untouched) when it does not inflate."""
    try:
        m.body = zlib.decompress(bytes(m.body))
    except zlib.error:
        return False
    return True


def _rebuild_message(topic, body, props_raw, queue_id, queue_offset, physical_offset, store_timestamp,
                     born_timestamp, prepared, flag, sys_flag, reconsume, store_size, body_crc_v, store_host,
                     born_host):
    cdef Message m = Message.__new__(Message)
    m.topic = topic
    m.body = body
    m._props_raw = props_raw
    m.queue_id = queue_id
    m.queue_offset = queue_offset
    m.physical_offset = physical_offset
    m.store_timestamp = store_timestamp
    m.born_timestamp = born_timestamp
    m.prepared_transaction_offset = prepared
    m.flag = flag
    m.sys_flag = sys_flag
    m.reconsume_times = reconsume
    m.store_size = store_size
    m.body_crc = body_crc_v
    m._store_host_len = len(store_host)
    memcpy(m._store_host, PyBytes_AS_STRING(store_host), len(store_host))
    m._born_host_len = len(born_host)
    memcpy(m._born_host, PyBytes_AS_STRING(born_host), len(born_host))
    return m


cdef Message message_from_view(const RecordView *v, str topic, bint copy_body, object owner):
    """Build a Message from a parsed record. `topic` may be passed to reuse an interned str; the body is
    copied to bytes, or (copy_body False) a memoryview slice of `owner`, which keeps the mapping alive."""
    cdef Message m = Message.__new__(Message)
    cdef Py_ssize_t start
    if topic is None:
        topic = PyBytes_FromStringAndSize(<const char *>v.topic, v.topic_len).decode("utf-8", "replace")
    m.topic = topic
    m.queue_id = v.queue_id
    m.queue_offset = v.queue_offset
    m.physical_offset = v.physical_offset
    m.store_timestamp = v.store_timestamp
    m.born_timestamp = v.born_timestamp
    m.prepared_transaction_offset = v.prepared_transaction_offset
    m.flag = v.flag
    m.sys_flag = v.sys_flag
    m.reconsume_times = v.reconsume_times
    m.store_size = v.total_size
    m.body_crc = v.body_crc
    if copy_body or owner is None:
        m.body = PyBytes_FromStringAndSize(<const char *>v.body, v.body_len)
    else:
        start = <Py_ssize_t>(<const char *>v.body - <const char *>(<const uint8_t *>_buffer_address(owner)))
        m.body = memoryview(owner)[start:start + v.body_len]
    if v.props_len > 0:
        m._props_raw = PyBytes_FromStringAndSize(<const char *>v.props, v.props_len)
    else:
        m._props_raw = b""
    m._store_host_len = v.store_host_len
    memcpy(m._store_host, v.store_host, v.store_host_len)
    m._born_host_len = v.born_host_len
    memcpy(m._born_host, v.born_host, v.born_host_len)
    return m


cdef const void *_buffer_address(object obj) except NULL:
    cdef Py_buffer view
    cdef const void *addr
    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
    addr = view.buf
    PyBuffer_Release(&view)
    return addr


# ---------------------------------------------------------------------------------------------- Python-level codec

def encode_message(topic, body, *, int queue_id=0, int flag=0, long long queue_offset=0,
                   long long physical_offset=0, int sys_flag=0, long long born_timestamp=0,
                   born_host="127.0.0.1:0", long long store_timestamp=0, store_host="127.0.0.1:10911",
                   int reconsume_times=0, long long prepared_transaction_offset=0, properties=None):
    """Encode one record to bytes: V1, or V2 for a topic over 127 bytes (as RocketMQ 5.x writes it; the IPv6 sysflag
    bits follow the hosts). ``properties`` is a mapping or bytes.

    Raises ValueError for a topic outside 1..255 bytes, PropertiesSizeError for properties over 32767 bytes.
    """
    tb = topic.encode("utf-8") if isinstance(topic, str) else bytes(topic)
    if not 0 < len(tb) <= MAX_TOPIC_NAME_BYTES:
        raise ValueError(f"topic must be 1..{MAX_TOPIC_NAME_BYTES} bytes, got {len(tb)}")
    pb = properties if isinstance(properties, bytes) else properties_to_bytes(properties)
    if len(pb) > MAX_PROPERTIES_SIZE:
        raise PropertiesSizeError(f"properties are {len(pb)} bytes, more than {MAX_PROPERTIES_SIZE}")
    bb = bytes(body) if body is not None else b""
    bh = born_host if isinstance(born_host, bytes) else pack_host(born_host)
    sh = store_host if isinstance(store_host, bytes) else pack_host(store_host)
    sys_flag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if len(bh) == HOST_V6_SIZE:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(sh) == HOST_V6_SIZE:
        sys_flag |= SYSFLAG_STOREHOST_V6
    total = calc_msg_length(sys_flag, len(bb), len(tb), len(pb))
    out = bytearray(total)
    cdef uint8_t[::1] o = out
    write_record(&o[0], <int32_t>total, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
                 <const uint8_t *>PyBytes_AS_STRING(bh), len(bh), store_timestamp,
                 <const uint8_t *>PyBytes_AS_STRING(sh), len(sh), reconsume_times, prepared_transaction_offset,
                 <const uint8_t *>PyBytes_AS_STRING(bb), len(bb), <const uint8_t *>PyBytes_AS_STRING(tb), len(tb),
                 <const uint8_t *>PyBytes_AS_STRING(pb), len(pb))
    return bytes(out)


def encode_blank(int size):
    """The 8-byte end-of-file blank record announcing ``size`` bytes to the end of the segment."""
    cdef uint8_t b[8]
    write_blank(b, size)
    return PyBytes_FromStringAndSize(<char *>b, 8)


def encode_gap(int size):
    """The 16-byte header of a gap record covering ``size`` damaged bytes (recovery writes it over them after
    copying them aside): a blank record's TOTALSIZE and magic, then localmq's signature. Raises ValueError when
    ``size`` is below 16."""
    cdef uint8_t b[GAP_RECORD_SIZE]
    if size < GAP_RECORD_SIZE:
        raise ValueError(f"a gap record needs at least {GAP_RECORD_SIZE} bytes, not {size}")
    write_blank(b, size)
    lmq_put64(b + 8, <uint64_t>GAP_SIGNATURE)
    return PyBytes_FromStringAndSize(<char *>b, GAP_RECORD_SIZE)


def find_record(data, Py_ssize_t start, Py_ssize_t end, long long delta):
    """The first position ``q`` in ``data[start:end]`` that holds a whole, valid V1 or V2 record (magic, length, body
    CRC, topic name, properties not torn) whose PHYSICALOFFSET field is ``q + delta`` (``delta``: the segment's base
    offset), or -1.

    Recovery uses it to resynchronise after a damaged region: a record copied into another record's body carries
    the wrong physical offset, so only a record written at this place qualifies. The GIL is released."""
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef Py_ssize_t n = mv.shape[0]
    check_position(start, n, "start")
    if end < 0 or end > n:
        end = n
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t q = start, found = -1
    cdef RecordView v
    cdef uint32_t want = <uint32_t>MESSAGE_MAGIC_CODE, want_v2 = <uint32_t>MESSAGE_MAGIC_CODE_V2
    cdef uint32_t magic
    cdef const uint8_t *hit
    # V1 and V2 magics share their first byte (0xDA)
    with nogil:  # a scan over up to a whole segment: memchr for the magic's first byte, then the checks
        while q + REC_MIN_SIZE <= end:
            hit = <const uint8_t *>memchr(base + q + 4, (want >> 24) & 0xFF, <size_t>(end - q - 4))
            if hit == NULL:
                break
            q = (hit - base) - 4
            if q + REC_MIN_SIZE > end:
                break
            magic = lmq_be32(base + q + 4)
            if ((magic == want or magic == want_v2) and parse_record(base + q, end - q, &v, True) == REC_OK
                    and v.physical_offset == <int64_t>q + delta and topic_ok(&v) and not props_torn(base, &v)):
                found = q
                break
            q += 1
    return found


cdef int check_position(Py_ssize_t pos, Py_ssize_t n, str name) except -1:
    """Raise PositionOutOfRangeError unless 0 <= pos <= n (a position in, or at the end of, n bytes)."""
    if pos < 0 or pos > n:
        raise PositionOutOfRangeError(f"{name} {pos} outside the buffer (0..{n})", name)
    return 0


def unknown_format(data, Py_ssize_t pos=0, Py_ssize_t end=-1):
    """The magic (unsigned) of the record at ``data[pos:]`` when it is a record of a format localmq does not know,
    else None (a known record, zeros, or damage). ``data`` is a segment from its start; ``end`` the end of its
    written data (default: its size). Nothing past ``end`` is read.

    The rule (README, Recovery), for a position where the previous record ended exactly:
    1. the magic is none of V1, V2, blank, and none of its 4 bytes is zero (zeros are the end of the data, or what a
       lost or zeroed sector leaves; RocketMQ's magics have no zero byte);
    2. it is no known record with a damaged magic: with the V1 or the V2 magic put back, the bytes do not make a
       well-formed record (its lengths add up to TOTALSIZE; the body CRC is not asked, the damage may reach the
       body too) -- a flipped byte of a V1 magic is damage, one record;
    3. its TOTALSIZE frames it: the record ends inside the data, exactly where a valid V1 / V2 record, a blank or
       gap record, another record with the same magic, the segment's end, or zeros up to ``end`` (the end of the
       data: a zeroed region with records after it does not frame anything) begins.
    Random bytes (a page of garbage) fail 3: a length read from them lands on a record boundary by chance only.
    """
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef Py_ssize_t n = mv.shape[0]
    check_position(pos, n, "pos")
    if end < 0 or end > n:
        end = n
    if pos + 8 > end:
        return None
    cdef const uint8_t *p = &mv[0] + pos
    cdef int32_t total = <int32_t>lmq_be32(p)
    cdef uint32_t magic = lmq_be32(p + 4)
    cdef RecordView v
    cdef int rc
    cdef Py_ssize_t k
    if (magic == <uint32_t>MESSAGE_MAGIC_CODE or magic == <uint32_t>MESSAGE_MAGIC_CODE_V2
            or magic == <uint32_t>BLANK_MAGIC_CODE):
        return None
    if (magic & 0xFF) == 0 or (magic & 0xFF00) == 0 or (magic & 0xFF0000) == 0 or (magic & 0xFF000000) == 0:
        return None
    if total < 8 or total > end - pos:
        return None
    buf = bytearray(mv[pos:pos + total])
    cdef uint8_t[::1] b = buf
    for known in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        lmq_put32(&b[0] + 4, <uint32_t>known)
        if parse_record(&b[0], total, &v, False) == REC_OK:
            return None
    cdef Py_ssize_t nxt = pos + total
    if nxt == end:
        return magic
    rc = parse_record(&mv[0] + nxt, end - nxt, &v, True)
    if rc in (REC_OK, REC_BLANK, REC_GAP):
        return magic
    if rc == REC_END:
        for k in range(nxt, end):
            if mv[k] != 0:
                return None
        return magic
    if end - nxt >= 8 and lmq_be32(&mv[0] + nxt + 4) == magic:
        return magic
    return None


def decode_message(data, Py_ssize_t pos=0, *, bint check_crc=True, long long base_offset=-1, bint copy=True):
    """Decode the record at ``data[pos:]``.

    Returns a Message, or None for a blank (end-of-file) record. Raises CorruptFrameError for a torn,
    malformed or (with ``check_crc``) corrupted record. ``base_offset`` (the file's base) only feeds error reports.
    """
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef RecordView v
    cdef Py_ssize_t n = mv.shape[0]
    check_position(pos, n, "pos")
    rc = parse_record(&mv[0] + pos if n else NULL, n - pos, &v, check_crc)
    if rc == REC_BLANK:
        return None
    if rc != REC_OK:
        where = base_offset + pos if base_offset >= 0 else pos
        if rc == REC_GAP:
            raise CorruptFrameError(f"gap record at offset {where}: {v.total_size} damaged bytes that recovery "
                                    f"quarantined (the records after it are valid)", offset=where)
        raise CorruptFrameError(f"{RecordStatus.of(rc)} record at offset {where}", offset=where)
    return message_from_view(&v, None, copy, data)


def scan_record(data, Py_ssize_t pos=0, bint check_crc=False):
    """Check the record at ``data[pos:]`` without building a Message.

    Returns (status name, size): ("ok", TOTALSIZE), ("blank", TOTALSIZE), ("end", 0), ("torn", 0),
    ("bad magic", 0), ("bad length", TOTALSIZE), ("bad crc", TOTALSIZE) or ("gap", TOTALSIZE: skip that much).
    """
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef RecordView v
    cdef Py_ssize_t n = mv.shape[0]
    check_position(pos, n, "pos")
    v.total_size = 0
    rc = parse_record(&mv[0] + pos if n else NULL, n - pos, &v, check_crc)
    size = v.total_size if rc in (REC_OK, REC_BLANK, REC_BAD_LENGTH, REC_BAD_CRC, REC_GAP) else 0
    return RecordStatus.of(rc), size


def walk_records(data, Py_ssize_t start=0, Py_ssize_t end=-1, bint check_crc=True, bint check_topic=False):
    """Walk consecutive records of ``data[start:end]`` without building anything (recovery).

    Returns (next position, outcome name, records walked, last store timestamp, size reported by the
    failing record or 0). Outcomes: "end", "blank" (blank record at next position), "torn", "bad magic",
    "bad length", "bad crc", "bad topic" (with ``check_topic``: a topic name outside [%|a-zA-Z0-9_-]; and "torn" for
    properties holding a sector of zeros, a torn write of the record's tail). ``data`` is a segment from its start
    (sectors are counted from there). Gap records
    (damage that recovery quarantined) are stepped over, not counted. With ``check_crc`` every body's CRC is
    verified. The GIL is released.
    """
    cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    cdef Py_ssize_t n = mv.shape[0]
    check_position(start, n, "start")
    if end < 0 or end > n:
        end = n
    cdef const uint8_t *base = &mv[0] if n else NULL
    cdef Py_ssize_t pos = start
    cdef long long count = 0
    cdef int64_t last_ts = 0
    cdef int rc = REC_END
    cdef RecordView v
    v.total_size = 0
    with nogil:  # recovery walks whole segments, CRC included
        while pos < end:
            rc = parse_record(base + pos, end - pos, &v, check_crc)
            if rc == REC_GAP:
                pos += v.total_size
                rc = REC_END
                continue
            if rc != REC_OK:
                break
            if check_topic and not topic_ok(&v):
                rc = REC_BAD_TOPIC
                break
            if check_topic and props_torn(base, &v):
                rc = REC_TORN
                break
            last_ts = v.store_timestamp
            pos += v.total_size
            count += 1
            rc = REC_END
    reported = v.total_size if rc in (REC_BLANK, REC_BAD_LENGTH, REC_BAD_CRC, REC_BAD_TOPIC) else 0
    return pos, RecordStatus.of(rc), count, last_ts, reported
