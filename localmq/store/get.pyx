# cython: boundscheck=False, wraparound=False, cdivision=True
"""The get path (RocketMQ's DefaultMessageStore.getMessage): ConsumeQueue units -> CommitLog records -> Messages.

Each unit's record is checked against the unit (a valid record of the unit's size) before it becomes a Message. Cold
record pages are faulted in with the GIL released (a read-ahead window of READ_AHEAD bytes), so a get that reads
from disk does not stall the other threads of the process.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcmp

from localmq._layout cimport CQ_BLANK_UNIT_SIZE, CQ_EXT_ADDRESS_MAX, CQ_UNIT_SIZE, SYSFLAG_COMPRESSED
from localmq._mapped_file cimport MappedFile
from localmq._os cimport lmq_be32, lmq_be64, lmq_load_acq, lmq_pretouch
from localmq._record cimport (
    REC_BAD_MAGIC, REC_GAP, REC_OK, RecordView, find_property, is_schedule_record, message_from_view, parse_record,
    props_torn, tags_code_of,
)
from localmq.store.consume_queue cimport ConsumeQueue

from localmq._record import parse_properties
from localmq.errors import ArgumentRangeError, CorruptMessageError, StoreClosedError
from localmq.status import GetBodiesResult, GetResult, GetStatus, RecordStatus

cdef enum:
    READ_AHEAD = 64 * 1024     # bytes of a segment faulted in (GIL released) ahead of the record being read
    MIN_SCAN_UNITS = 800       # units one get looks at, at least (RocketMQ: 16000 bytes of units)

# get_bodies fields: the names of Message's attributes they equal
cdef enum:
    F_QUEUE_OFFSET, F_PHYSICAL_OFFSET, F_STORE_TIMESTAMP, F_BORN_TIMESTAMP, F_STORE_SIZE, F_FLAG, F_SYS_FLAG,
    F_RECONSUME_TIMES, F_BODY_CRC, F_RAW_PROPERTIES, F_TAGS, F_PROPERTIES, N_FIELDS

#: the names get_bodies takes in ``fields``; each list holds what the Message's attribute of that name would
BODY_FIELDS = ("queue_offset", "physical_offset", "store_timestamp", "born_timestamp", "store_size", "flag",
               "sys_flag", "reconsume_times", "body_crc", "raw_properties", "tags", "properties")
cdef dict _FIELD_CODES = {name: code for code, name in enumerate(BODY_FIELDS)}

cdef object FOUND = GetStatus.FOUND
cdef object NO_MATCHED = GetStatus.NO_MATCHED_MESSAGE
cdef object REMOVING = GetStatus.MESSAGE_WAS_REMOVING
cdef object FOUND_NULL = GetStatus.OFFSET_FOUND_NULL


cdef class GetLimits:
    """RocketMQ's transfer limits of one get: counts and bytes for records in memory and on disk, and where "on disk"
    begins (bytes behind the log's end; ``access_message_in_memory_max_ratio`` of RAM)."""

    cdef readonly int max_count_mem
    cdef readonly long long max_bytes_mem
    cdef readonly int max_count_disk
    cdef readonly long long max_bytes_disk
    cdef readonly long long disk_threshold

    def __cinit__(self, int max_count_mem, long long max_bytes_mem, int max_count_disk, long long max_bytes_disk,
                  long long disk_threshold):
        self.max_count_mem = max_count_mem
        self.max_bytes_mem = max_bytes_mem
        self.max_count_disk = max_count_disk
        self.max_bytes_disk = max_bytes_disk
        self.disk_threshold = disk_threshold


cdef inline MappedFile segment_of(list files, int64_t seg_size, int64_t phys):
    """The commit log segment holding ``phys`` (files are consecutive, sorted by base), or None."""
    cdef Py_ssize_t nfiles = PyList_GET_SIZE(files)
    if nfiles == 0:
        return None
    cdef int64_t first_base = (<MappedFile>PyList_GET_ITEM(files, 0)).file_from_offset
    cdef int64_t idx = phys // seg_size - first_base // seg_size
    if idx < 0 or idx >= nfiles:
        return None
    return <MappedFile>PyList_GET_ITEM(files, idx)


cdef MappedFile unit_file(object mfq, int64_t index):
    # the ConsumeQueue file of unit ``index`` (None: none), counted as used by its budget, which unmaps the least
    # recently used, and mapped again if the budget had unmapped it; a closed or deleted file keeps addr NULL
    cdef MappedFile mf = mfq.find(index * CQ_UNIT_SIZE)
    if mf is not None and (mf.addr != NULL or mf.evicted):
        mf.ensure_mapped()
    return mf


cdef object pin(MappedFile seg):
    """A buffer export (memoryview) of the whole of ``seg``, or None when it is unmapped or being unmapped.

    Readers touch a segment only while they hold its pin: close()/destroy() defer the unmap while an export is alive
    and never force it (a hold() reference is forced after ``destroy_mapped_file_interval_forcibly``), so the
    mapping stays valid across GIL releases (fault_in, a collection run by an allocation letting retention run).
    Zero-copy bodies are slices of the pin. Dropping the last reference to it may complete a deferred unmap.
    """
    if seg.addr == NULL or seg.unmap_pending:
        return None
    try:
        return memoryview(seg)
    except StoreClosedError:  # unmapped meanwhile: the allocation above may have let retention run
        return None


cdef int64_t fault_in(MappedFile seg, int64_t rel, int64_t upto) noexcept:
    """Touch the pages of ``seg`` from ``rel`` to ``rel + READ_AHEAD`` (at most ``upto``) without the GIL; returns
    where the touched window ends. The caller holds a pin of ``seg``."""
    cdef int64_t end = rel + READ_AHEAD
    cdef uint8_t *addr = seg.addr
    if end > upto:
        end = upto
    if end <= rel:
        return rel
    with nogil:  # page faults of a cold segment; the caller's pin keeps retention from unmapping it meanwhile
        lmq_pretouch(addr, <size_t>rel, <size_t>(end - rel), 0)
    return end


cdef str unit_mismatch(const RecordView *v, int rc, int32_t size, bytes topic_b, int queue_id, int64_t index):
    """Why the record ``v`` (parse outcome ``rc``) is not the message of unit ``index`` of (topic, queue_id), or
    None when it is."""
    if rc == REC_GAP:
        return (f"the message was lost to damage in the commit log (a gap record of {v.total_size} bytes stands "
                f"where it was; recovery copied the damaged bytes to recovery/)")
    if rc == REC_BAD_MAGIC and v.total_size == size:
        # a ConsumeQueue unit whose size is the record's TOTALSIZE frames it: it may be a record of a later format
        # (README, Recovery; a writable open refuses such a log), so the message says both
        return (f"bad magic record (0x{<uint32_t>v.magic:08X}, {v.total_size} bytes as the unit says: a record of "
                f"a format localmq does not know, or a damaged one)")
    if rc != REC_OK:
        return f"{RecordStatus.of(rc)} record"
    if v.total_size != size:
        return f"record size {v.total_size} is not the unit's size {size}"
    if (v.topic_len != len(topic_b) or memcmp(v.topic, <const char *>topic_b, v.topic_len) != 0
            or v.queue_id != queue_id or v.queue_offset != index):
        return (f"the record belongs to {(<bytes>v.topic[:v.topic_len]).decode('utf-8', 'replace')}-{v.queue_id} "
                f"queue offset {v.queue_offset}")
    return None


def check_unit(ConsumeQueue cq, list commit_log_files, long long seg_size, long long index, long long phys,
               int size):
    """None when the record at ``phys`` is the message of unit ``index`` of ``cq`` (a valid record of ``size``
    bytes, same topic, queue id and queue offset; CRC not checked), else why not."""
    cdef RecordView v
    cdef MappedFile seg
    cdef int64_t rel
    if size <= 0 or phys < 0:
        return f"invalid unit (offset {phys}, size {size})"
    seg = segment_of(commit_log_files, seg_size, phys)
    pinned = pin(seg) if seg is not None else None  # v points into the mapping until unit_mismatch is done
    if pinned is None:
        return f"offset {phys} is outside the commit log"
    rel = phys - seg.file_from_offset
    if rel < 0 or rel + size > seg.read_position():
        return f"offset {phys} + {size} runs past the written log"
    rc = parse_record(seg.addr + rel, size, &v, False)
    return unit_mismatch(&v, rc, size, cq.topic.encode("utf-8"), cq.queue_id, index)


def get_message(ConsumeQueue cq, list commit_log_files, long long seg_size, long long offset, int max_messages,
                tuple tag_hashes, object tag_names, GetLimits limits not None, long long commit_log_max,
                bint copy_body, long long min_offset, long long max_offset, bint check_crc=False):
    """Read up to ``max_messages`` messages of ``cq`` from queue offset ``offset`` (the caller checked
    min_offset <= offset < max_offset, the queue's bounds it read; the result reports them).

    ``commit_log_files``: the commit log's MappedFiles (consecutive, ``seg_size`` bytes each). ``tag_hashes`` is ()
    for no filter, else at most 64 tag hash codes; ``tag_names`` the exact tag strings of the second check.
    ``check_crc``: verify each body's CRC.
    Every unit is checked against its record: a valid record of the unit's size (and CRC) carrying the queue's
    topic, queue id and the unit's queue offset. A unit that fails ends the batch before it: the messages read
    so far are returned (FOUND, ``next_begin_offset`` the bad unit); a get that starts at the bad unit raises
    CorruptMessageError (naming it; ``next_offset`` skips it). A unit pointing below the log's first segment is
    a removed message (MESSAGE_WAS_REMOVING), as before.
    Returns GetResult (status FOUND, NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING or OFFSET_FOUND_NULL). Raises
    CorruptMessageError, ValueError for > 64 tags.
    """
    return _get(cq, commit_log_files, seg_size, offset, max_messages, tag_hashes, tag_names, limits, commit_log_max,
                copy_body, min_offset, max_offset, check_crc, None)


def get_bodies(ConsumeQueue cq, list commit_log_files, long long seg_size, long long offset, int max_messages,
               tuple tag_hashes, object tag_names, GetLimits limits not None, long long commit_log_max,
               long long min_offset, long long max_offset, bint check_crc, tuple fields):
    """``get_message`` that hands out each message's body as ``bytes`` (a copy: nothing refers to the mapping
    once it returns) and, per name in ``fields`` (BODY_FIELDS), a list of that field, instead of Message objects.

    The same units, the same checks of each unit against its record (and CRC with ``check_crc``), the same stops,
    statuses and CorruptMessageError as ``get_message`` over the same arguments. Returns GetBodiesResult. Raises
    CorruptMessageError, ArgumentRangeError for a name not in BODY_FIELDS, ValueError for > 64 tags.
    """
    cdef list codes = []
    for name in fields:
        code = _FIELD_CODES.get(name) if isinstance(name, str) else None
        if code is None:
            raise ArgumentRangeError(f"unknown field {name!r} (one of {', '.join(BODY_FIELDS)})", "fields")
        codes.append(code)
    return _get(cq, commit_log_files, seg_size, offset, max_messages, tag_hashes, tag_names, limits, commit_log_max,
                True, min_offset, max_offset, check_crc, (fields, codes))


cdef inline bint over_limits(GetLimits limits, int count, int max_messages, bint in_disk, int64_t bytes_total,
                             int32_t size) noexcept:
    # RocketMQ's transfer limits: the first message is always taken; then counts and bytes, in memory or on disk
    if count == 0:
        return False
    if count >= max_messages:
        return True
    if in_disk:
        return bytes_total + size > limits.max_bytes_disk or count >= limits.max_count_disk
    return bytes_total + size > limits.max_bytes_mem or count >= limits.max_count_mem


cdef inline bint hash_passes(const int64_t *hashes, int nh, int64_t tags) noexcept:
    # the first tag check (the unit's tags hash against the subscription's); a unit without a hash code passes
    cdef int k
    if nh == 0 or tags <= CQ_EXT_ADDRESS_MAX:
        return True
    for k in range(nh):
        if <int32_t>hashes[k] == <int32_t>tags:
            return True
    return False


cdef inline bint tag_passes(const RecordView *v, object tag_names):
    # the second tag check: the record's TAGS property is one of the subscription's tags (hashes collide)
    cdef const uint8_t *tv
    cdef int32_t tvlen
    if not find_property(v.props, v.props_len, "TAGS", 4, &tv, &tvlen):
        return False
    return (<bytes>tv[:tvlen]).decode("utf-8", "replace") in tag_names


cdef inline bint record_is_unit(const RecordView *v, int rc, int32_t size, int64_t i, int qid,
                                bytes topic_b) noexcept:
    # the record is the unit's message: valid, of the unit's size, its topic, queue id and queue offset
    return (rc == REC_OK and v.total_size == size and v.queue_offset == i and v.queue_id == qid
            and v.topic_len == len(topic_b) and memcmp(v.topic, <const char *>topic_b, v.topic_len) == 0)


cdef int body_fields(tuple bodies_of, int *fcodes) except -1:
    # get_bodies: the asked fields' codes into fcodes; returns how many
    cdef list codes = bodies_of[1]
    cdef int k, nf = len(codes)
    if nf > N_FIELDS:
        raise ArgumentRangeError(f"at most {N_FIELDS} fields", "fields")
    for k in range(nf):
        fcodes[k] = codes[k]
    return nf


cdef int load_hashes(tuple tag_hashes, int64_t *hashes) except -1:
    # the subscription's tag hash codes into hashes (room for 64); returns how many
    cdef int k, nh = len(tag_hashes)
    if nh > 64:
        raise ValueError("at most 64 tags in a subscription")
    for k in range(nh):
        hashes[k] = tag_hashes[k]
    return nh


cdef inline int add_message(list out, list cols, const RecordView *v, tuple bodies_of, const int *fcodes, int nf,
                            str topic, bint copy_body, object pinned) except -1:
    cdef int k
    if bodies_of is None:
        # a zero-copy body is a slice of the pin: it keeps the mapping alive without a new export, which
        # __getbuffer__ would refuse once a destroy() is pending
        out.append(message_from_view(v, topic, copy_body, pinned))
        return 0
    # get_bodies: a copy of the body (it outlives the pin: the caller may hold it across a segment's deletion)
    out.append(PyBytes_FromStringAndSize(<const char *>v.body, v.body_len))
    for k in range(nf):
        (<list>PyList_GET_ITEM(cols, k)).append(_field(v, fcodes[k]))
    return 0


cdef object corrupt_error(str topic, int qid, int64_t i, int64_t phys, int32_t size, object bad, object path):
    return CorruptMessageError(f"consume queue {topic}-{qid} unit {i} (commit log offset {phys}, size {size}): {bad}",
                               offset=phys, path=path, topic=topic, queue_id=qid, queue_offset=i, reason=bad)


cdef object _get(ConsumeQueue cq, list commit_log_files, int64_t seg_size, int64_t offset, int max_messages,
                 tuple tag_hashes, object tag_names, GetLimits limits, int64_t commit_log_max, bint copy_body,
                 int64_t min_offset, int64_t max_offset, bint check_crc, tuple bodies_of):
    """The loop of get_message (``bodies_of`` None: Message objects into a GetResult) and get_bodies (``bodies_of``
    (names, field codes): bytes bodies and the fields' lists into a GetBodiesResult)."""
    cdef int64_t end = offset + max(MIN_SCAN_UNITS, max_messages)
    cdef int64_t i = offset, phys, tags, rel, fs = cq.st.file_size, bytes_total = 0
    cdef int64_t touched_end = 0, cq_base = -1, cq_end = -1, log_min = -1
    cdef int32_t size
    cdef int nh, count = 0, compressed = 0, qid = cq.queue_id, nf = 0, rc
    cdef int64_t hashes[64]
    cdef bint removing = False
    cdef MappedFile cqf = None, seg, pinned_seg = None
    cdef const uint8_t *u
    cdef RecordView v
    cdef str topic = cq.topic
    cdef bytes topic_b = topic.encode("utf-8")
    cdef object bad = None, bad_path = None, mfq = cq.mapped_file_queue, pinned = None  # pinned: pin() of pinned_seg
    cdef list out = [], cols = None   # cols (get_bodies): one list per asked field, in the order of ``fcodes``
    cdef int fcodes[N_FIELDS]
    if bodies_of is not None:
        nf = body_fields(bodies_of, fcodes)
        cols = [[] for _ in range(nf)]
    if PyList_GET_SIZE(commit_log_files) > 0:
        log_min = (<MappedFile>PyList_GET_ITEM(commit_log_files, 0)).file_from_offset
    nh = load_hashes(tag_hashes, hashes)
    end = min(end, lmq_load_acq(&cq.st.max_offset))
    while i < end:
        # re-checked per unit: building a message may run a finalizer that lets retention unmap the file
        if i * CQ_UNIT_SIZE >= cq_end or cqf is None or cqf.addr == NULL:
            cqf = unit_file(mfq, i)
            if cqf is None or cqf.addr == NULL:
                if count == 0:  # the unit's file is gone: the next pull starts at the next file
                    i = (offset // (fs // CQ_UNIT_SIZE) + 1) * (fs // CQ_UNIT_SIZE)
                    return _result(bodies_of, FOUND_NULL, out, cols, i, min_offset, max_offset, 0)
                break
            cq_base = cqf.file_from_offset
            cq_end = cq_base + fs
        u = cqf.addr + (i * CQ_UNIT_SIZE - cq_base)
        phys = <int64_t>lmq_be64(u)
        size = <int32_t>lmq_be32(u + 8)
        tags = <int64_t>lmq_be64(u + 12)
        if size == CQ_BLANK_UNIT_SIZE:
            i += 1  # blank padding unit
            continue
        if size <= 0 or phys < 0:
            bad = f"invalid unit (offset {phys}, size {size})"
            break
        if over_limits(limits, count, max_messages, (commit_log_max - phys) > limits.disk_threshold, bytes_total,
                       size):
            break
        if not hash_passes(hashes, nh, tags):
            i += 1
            continue
        seg = segment_of(commit_log_files, seg_size, phys)
        if seg is None:
            if phys >= log_min >= 0:
                bad = f"offset {phys} is past the commit log"
                break
            removing = True
            i += 1
            continue
        if seg is not pinned_seg:
            # the previous segment's pin goes first (its release may unmap it, here); seg.addr is read only
            # while seg is pinned
            pinned = pinned_seg = None
            pinned = pin(seg)
            if pinned is None:
                removing = True
                i += 1
                continue
            pinned_seg = seg
            touched_end = 0
        rel = phys - seg.file_from_offset
        if rel < 0 or rel + size > seg.read_position():
            bad = f"offset {phys} + {size} runs past the written log"
            break
        if rel + size > touched_end or rel < touched_end - READ_AHEAD:
            touched_end = fault_in(seg, rel, seg.read_position())
        rc = parse_record(seg.addr + rel, size, &v, check_crc)
        if not record_is_unit(&v, rc, size, i, qid, topic_b):
            bad = unit_mismatch(&v, rc, size, topic_b, qid, i)
            bad_path = seg.path
            break
        if nh > 0 and not tag_passes(&v, tag_names):
            i += 1
            continue
        add_message(out, cols, &v, bodies_of, fcodes, nf, topic, copy_body, pinned)
        if v.sys_flag & SYSFLAG_COMPRESSED:
            compressed += 1
        count += 1
        bytes_total += size
        i += 1
    if count > 0:
        return _result(bodies_of, FOUND, out, cols, i, min_offset, max_offset, compressed)
    if bad is not None:
        raise corrupt_error(topic, qid, i, phys, size, bad, bad_path)
    return _result(bodies_of, REMOVING if removing else NO_MATCHED, out, cols, i, min_offset, max_offset, 0)


cdef object _result(tuple bodies_of, object status, list out, list cols, int64_t next_begin, int64_t min_offset,
                    int64_t max_offset, int compressed):
    if bodies_of is None:
        return GetResult(status, out, next_begin, min_offset, max_offset, compressed)
    return GetBodiesResult(status, out, next_begin, min_offset, max_offset, compressed,
                           dict(zip(bodies_of[0], cols)))


cdef object _field(const RecordView *v, int code):
    """Field ``code`` (F_*) of the parsed record ``v``, as Message has it."""
    if code == F_QUEUE_OFFSET:
        return v.queue_offset
    if code == F_PHYSICAL_OFFSET:
        return v.physical_offset
    if code == F_STORE_TIMESTAMP:
        return v.store_timestamp
    if code == F_BORN_TIMESTAMP:
        return v.born_timestamp
    if code == F_STORE_SIZE:
        return v.total_size
    if code == F_FLAG:
        return v.flag
    if code == F_SYS_FLAG:
        return v.sys_flag
    if code == F_RECONSUME_TIMES:
        return v.reconsume_times
    if code == F_BODY_CRC:
        return v.body_crc
    raw = PyBytes_FromStringAndSize(<const char *>v.props, v.props_len) if v.props_len > 0 else b""
    if code == F_RAW_PROPERTIES:
        return raw
    props = parse_properties(raw) if raw else {}
    if code == F_TAGS:
        return props.get("TAGS")
    return props


def read_record(list commit_log_files, long long seg_size, long long phys, bint copy_body=True):
    """Decode the record at commit log offset ``phys``; None when its segment is gone or it is not a record."""
    cdef RecordView v
    cdef int64_t rel, avail
    cdef MappedFile seg = segment_of(commit_log_files, seg_size, phys)
    if seg is None:
        return None
    pinned = pin(seg)  # v points into the mapping until the message is built (its allocations may switch threads)
    if pinned is None:
        return None
    rel = phys - seg.file_from_offset
    avail = seg.read_position() - rel
    if rel < 0 or avail <= 0:
        return None
    if parse_record(seg.addr + rel, avail, &v, False) != REC_OK:
        return None
    return message_from_view(&v, None, copy_body, pinned)


def record_store_timestamp(list commit_log_files, long long seg_size, long long phys):
    """Store timestamp of the record at ``phys`` (-1 when unavailable)."""
    cdef RecordView v
    cdef int64_t rel, avail
    cdef MappedFile seg = segment_of(commit_log_files, seg_size, phys)
    if seg is None:
        return -1
    rel = phys - seg.file_from_offset
    avail = seg.read_position() - rel
    if seg.addr == NULL or rel < 0 or avail <= 0:
        return -1
    if parse_record(seg.addr + rel, avail, &v, False) != REC_OK:
        return -1
    return v.store_timestamp


def first_bad_unit(ConsumeQueue cq, list commit_log_files, long long seg_size, long long start, long long end,
                   long long log_end):
    """Verify units [start, end) of ``cq`` against the commit log; returns (index, reason) of the first unit that is
    not the message it claims, or (-1, None).

    A unit is good when it is a blank padding unit, a lost unit (it points at a gap record of its size: a message
    lost to damage that recovery quarantined), or it points at or after the previous real unit's record and
    within the log's written end, at a valid record of its size (CRC not checked, properties not torn) carrying the
    queue's topic, queue id and the unit's index as queue offset. Units pointing below the log's first segment
    (retention) are checked for order only. A missing unit file in the range is reported at its first unit.
    """
    cdef int64_t i = start, phys, rel, prev_end = -1, fs = cq.st.file_size, cq_base = -1, cq_end = -1
    cdef int64_t log_min = -1, tags
    cdef int32_t size
    cdef int rc
    cdef RecordView v
    cdef MappedFile cqf = None
    cdef MappedFile seg
    cdef MappedFile pinned_seg = None
    cdef object pinned = None
    cdef const uint8_t *u
    cdef bytes topic_b = cq.topic.encode("utf-8")
    cdef int qid = cq.queue_id
    mfq = cq.mapped_file_queue
    if PyList_GET_SIZE(commit_log_files) > 0:
        log_min = (<MappedFile>PyList_GET_ITEM(commit_log_files, 0)).file_from_offset
    while i < end:
        if i * CQ_UNIT_SIZE >= cq_end or cqf is None or cqf.addr == NULL:
            cqf = unit_file(mfq, i)
            if cqf is None or cqf.addr == NULL:
                return i, "no unit file"
            cq_base = cqf.file_from_offset
            cq_end = cq_base + fs
        u = cqf.addr + (i * CQ_UNIT_SIZE - cq_base)
        phys = <int64_t>lmq_be64(u)
        size = <int32_t>lmq_be32(u + 8)
        if size == CQ_BLANK_UNIT_SIZE:
            i += 1
            continue
        if size <= 0 or phys < 0:
            return i, f"invalid unit (offset {phys}, size {size})"
        if phys < prev_end:
            return i, f"offset {phys} is before the previous unit's record end {prev_end}"
        if phys + size > log_end:
            return i, f"offset {phys} + {size} runs past the log's end {log_end}"
        prev_end = phys + size
        if log_min < 0 or phys < log_min:
            i += 1
            continue
        seg = segment_of(commit_log_files, seg_size, phys)
        if seg is not pinned_seg:
            pinned = pinned_seg = None
            pinned = pin(seg) if seg is not None else None  # v points into seg until the reasons are built
            if pinned is None:
                return i, f"offset {phys} is in no segment"
            pinned_seg = seg
        rel = phys - seg.file_from_offset
        if rel < 0 or rel + size > seg.file_size:
            return i, f"offset {phys} + {size} crosses its segment's end"
        rc = parse_record(seg.addr + rel, size, &v, False)
        if rc == REC_GAP and v.total_size == size:
            # a unit whose message was lost to damage (the dispatcher points such units at the gap record, several
            # units may share one): kept, so the loss stays visible where it happened
            prev_end = phys
            i += 1
            continue
        if (rc != REC_OK or v.total_size != size or v.queue_offset != i or v.queue_id != qid
                or v.topic_len != len(topic_b) or memcmp(v.topic, <const char *>topic_b, v.topic_len) != 0):
            return i, unit_mismatch(&v, rc, size, topic_b, qid, i)
        if props_torn(seg.addr, &v):
            # recovery's walk refuses such a record (a torn write of its tail): neither may a unit point at it
            return i, "torn record (its properties hold a sector of zeros)"
        tags = <int64_t>lmq_be64(u + 12)
        # a SCHEDULE_TOPIC_XXXX unit's code is a delivery time from the store's delay levels, not the record's own
        if tags > CQ_EXT_ADDRESS_MAX and not is_schedule_record(&v) and tags != tags_code_of(&v, NULL, 0):
            return i, f"tags code {tags} is not the record's {tags_code_of(&v, NULL, 0)}"
        i += 1
    return -1, None
