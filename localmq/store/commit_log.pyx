# cython: boundscheck=False, wraparound=False, cdivision=True
"""The CommitLog put path: encode records straight into the current segment under one put lock."""
import logging
import os
import weakref

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memset

from localmq._layout cimport (
    CTL_EVENT_OFF, CTL_FILE_SIZE, CTL_FLUSH_REQ_EVENT_OFF, CTL_FLUSHED_EVENT_OFF, CTL_I_CELL, CTL_I_END, CTL_I_POS,
    CTL_I_QEND, CTL_I_QOFF, CTL_I_STATE, CTL_S_FLUSH_REQ, CTL_S_FLUSHED, CTL_S_SYNC_ARRIVALS, CTL_S_SYNC_WANT,
    CTL_S_LAST_TS, CTL_S_PUTS, CTL_S_REPAIRS, CTL_S_WPOS, CTL_T_NAME_MAX, CTL_T_NEXT, CTL_TOPIC_QUEUES, CTL_TOPICS_OFF,
    END_FILE_MIN_BLANK_LENGTH, HOST_V4_SIZE, HOST_V6_SIZE, MAX_PROPERTIES_SIZE, MAX_QUEUE_ID,
    SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq._record cimport calc_msg_length, write_blank, write_record
from localmq._mapped_file cimport MappedFile
from localmq._os cimport (
    lmq_event_signal_if_waiting, lmq_fetch_add, lmq_load_acq, lmq_load_sc, lmq_now_ms, lmq_set_timer_slack_ns,
    lmq_store_max, lmq_store_rel, lmq_store_sc,
)
from localmq._native cimport Event, raise_errno
from localmq._shm cimport (
    ControlFile, LMQ_SHM_ACQUIRED, LMQ_SHM_OWNER_DIED, WriteLock, lmq_shm_event_notify, lmq_shm_lock_acquire,
    lmq_shm_event_seq, lmq_shm_event_wait, lmq_shm_lock_consistent, lmq_shm_lock_release, lmq_shm_monotonic_ns,
    topic_row_add, topic_row_c,
)
from localmq.store.put_result cimport PutResult, failed_result, new_result

from localmq._record import pack_host, properties_to_bytes
from localmq.config import (
    batch_bodies, body_length, body_type_error, check_queue_id, check_topic, message_properties,
)
from localmq.status import PutStatus
from localmq._shm import OWNER_DIED as _OWNER_DIED
from localmq.errors import (
    ArgumentOverflowError, ArgumentTypeError, ForkedStoreError, check_int_range, InvalidQueueIdError,
    InvalidTopicError, MessageSizeError,
    PropertiesSizeError, StoreClosedError, TopicTableFullError, store_io_error,
)

# Every CommitLog of this process. A forked child inherits them with their mappings but without the parent's put lock
# holder, dispatcher or later queue offsets: a put there would reuse the parent's offsets and overwrite its records,
# so after a fork every inherited CommitLog refuses puts (ForkedStoreError). The put path already tests ``closed``;
# the fork sets it too, so the check costs nothing extra.
_live_logs = weakref.WeakSet()


def _after_fork_in_child():
    for cl in list(_live_logs):
        (<CommitLog>cl).forked = True
        (<CommitLog>cl).closed = True


os.register_at_fork(after_in_child=_after_fork_in_child)

log = logging.getLogger("localmq.commitlog")

cdef extern from "pythread.h":
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock)
    int PyThread_acquire_lock(PyThread_type_lock, int) nogil
    void PyThread_release_lock(PyThread_type_lock) nogil

cdef object PUT_OK = PutStatus.PUT_OK
cdef object CREATE_FAILED = PutStatus.CREATE_MAPPED_FILE_FAILED
cdef object FLUSH_TIMEOUT = PutStatus.FLUSH_DISK_TIMEOUT
cdef object NOT_AVAILABLE = PutStatus.SERVICE_NOT_AVAILABLE


cdef inline void lock_acquire(PyThread_type_lock lk):
    # Fast path without releasing the GIL; when contended, wait with the GIL released so the holder (which
    # needs the GIL to finish its put) can run. Lock order: put lock -> MappedFileQueue.lock.
    if PyThread_acquire_lock(lk, 0):
        return
    with nogil:
        PyThread_acquire_lock(lk, 1)


cdef inline uint8_t *write_base(MappedFile mf) noexcept:
    # records go to the transient pool's buffer when the file has one, else straight into the mapping
    return mf.wbuf if mf.wbuf != NULL else mf.addr


cdef inline void publish(MappedFile mf, int64_t end) noexcept:
    # Called with the put lock held, after the record is complete. Direct mode: readers see it now (release
    # store of wrote_pos). Write-buffer mode: only the committer sees it; commit() publishes wrote_pos later.
    if mf.wbuf == NULL:
        mf.committed_pos = end
        lmq_store_rel(&mf.append_pos, end)
        lmq_store_rel(&mf.wrote_pos, end)
    else:
        lmq_store_rel(&mf.append_pos, end)


cdef inline int ctl_enter(CommitLog self) except -1:
    """Take the shared writer lock (the caller holds this process's put lock). Uncontended: one trylock with the
    GIL held; else WriteLock.acquire waits without the GIL (StoreBusyError after lock_timeout)."""
    cdef WriteLock wl = self.wlock
    cdef int rc = lmq_shm_lock_acquire(wl.p, 0)
    wl.holds += 1
    if rc == LMQ_SHM_ACQUIRED:
        return 0
    return ctl_enter_slow(self, rc)


cdef int ctl_enter_slow(CommitLog self, int rc) except -1:
    # out of line, so that the inline fast path above needs no Python temporaries (no register spills per put)
    cdef WriteLock wl = self.wlock
    cdef bint died
    if rc == LMQ_SHM_OWNER_DIED:
        died = True
    else:
        wl.holds -= 1
        died = wl.acquire(self.lock_timeout) == _OWNER_DIED
    if died:
        try:
            self._repair()
        finally:
            lmq_shm_lock_consistent(wl.p)
    return 0


cdef inline void ctl_exit(CommitLog self) noexcept:
    cdef WriteLock wl = self.wlock
    lmq_shm_lock_release(wl.p)
    wl.holds -= 1


cdef inline int64_t ctl_begin(CommitLog self, TopicEntry te, int qid) except -1:
    """Under the writer lock: move this process's view to the committed end and record the intent of the put
    that starts there. Returns the committed end."""
    cdef char *cb = self.cb
    cdef int64_t w = lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS))
    cdef MappedFile mf = self.cur
    cdef int64_t rel
    if mf is not None and mf.file_from_offset + mf.append_pos != w:
        # another process committed since our last put; mostly within the segment we write: move its positions in
        # C (CAS max, as sync_to does) and leave new segments to the Python path below
        rel = w - mf.file_from_offset
        if mf.wbuf == NULL and mf.append_pos < rel < self.file_size:
            lmq_store_max(&mf.append_pos, rel)
            lmq_store_max(&mf.committed_pos, rel)
            lmq_store_max(&mf.wrote_pos, rel)
    if mf is None or mf.file_from_offset + mf.append_pos != w:
        ctl_sync_view(self, w)
    (<int64_t *>(cb + CTL_I_POS))[0] = w
    (<int64_t *>(cb + CTL_I_END))[0] = w
    (<int64_t *>(cb + CTL_I_CELL))[0] = <char *>&te.next_offsets[qid] - cb
    (<int64_t *>(cb + CTL_I_QOFF))[0] = te.next_offsets[qid]
    lmq_store_rel(<int64_t *>(cb + CTL_I_STATE), 1)
    return w


cdef int ctl_sync_view(CommitLog self, int64_t w) except -1:
    # ctl_begin's Python path (a new segment, or a first put), out of line for the same reason as ctl_enter_slow
    cdef MappedFile mf = self.mapped_file_queue.sync_to(w)
    self.cur = mf
    if mf is not None and self.group_commit is not None:
        self.group_commit.set_file(mf)
    return 0


cdef inline void intent_end(char *cb, int64_t end) noexcept:
    # before writing bytes up to `end`: a taker-over zeroes up to here when the put did not commit
    if end > (<int64_t *>(cb + CTL_I_END))[0]:
        lmq_store_rel(<int64_t *>(cb + CTL_I_END), end)


cdef inline void ctl_commit(CommitLog self, TopicEntry te, int qid, int64_t end) noexcept:
    """Publish every complete record up to ``end`` (the release store of the committed end is the commit point),
    then clear the intent."""
    cdef char *cb = self.cb
    (<int64_t *>(cb + CTL_I_QEND))[0] = te.next_offsets[qid]
    if end > lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS)):
        lmq_store_rel(<int64_t *>(cb + CTL_S_WPOS), end)
        (<int64_t *>(cb + CTL_S_PUTS))[0] += 1
    lmq_store_rel(<int64_t *>(cb + CTL_I_STATE), 0)


cdef inline int64_t store_time(CommitLog self) noexcept:
    # store times never go backwards within the log (across processes too when shared); under the put lock(s)
    cdef int64_t ts = lmq_now_ms()
    cdef int64_t *shared_ts
    if ts < self.last_store_ts:
        ts = self.last_store_ts
    if self.cb != NULL:
        shared_ts = <int64_t *>(self.cb + CTL_S_LAST_TS)
        if ts < shared_ts[0]:
            ts = shared_ts[0]
        shared_ts[0] = ts
    self.last_store_ts = ts
    return ts


cdef class TopicEntry:
    """Per-topic put state: the encoded name and the next queue offset of each queue id."""

    def __cinit__(self, str topic):
        self.topic = topic
        self.encoded = topic.encode("ascii")
        self.next_offsets = NULL
        self.n_queues = 0

    def __dealloc__(self):
        if not self.shared:
            PyMem_Free(self.next_offsets)

    cdef int ensure(self, int32_t queue_id) except -1:
        cdef int32_t n
        cdef int64_t *p
        if queue_id < self.n_queues:
            return 0
        if self.shared:
            raise InvalidQueueIdError(f"queue id {queue_id}: a store shared between processes has queue ids "
                                      f"0..{CTL_TOPIC_QUEUES - 1} per topic")
        n = queue_id + 1 if queue_id + 1 > self.n_queues * 2 else self.n_queues * 2
        if n < 8:
            n = 8
        if n > MAX_QUEUE_ID + 1:
            n = MAX_QUEUE_ID + 1
        p = <int64_t *>PyMem_Realloc(self.next_offsets, n * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        memset(p + self.n_queues, 0, (n - self.n_queues) * sizeof(int64_t))
        self.next_offsets = p
        self.n_queues = n
        return 0

    def next_offset(self, int queue_id):
        if queue_id < self.n_queues:
            return self.next_offsets[queue_id]
        return 0

    def queue_ids(self):
        return [q for q in range(self.n_queues) if self.next_offsets[q] > 0]


cdef inline str topic_arg(object topic):
    """``topic`` as a str, or a typed error naming it (the put path's one type check of a topic)."""
    if type(topic) is str:
        return <str>topic
    if isinstance(topic, str):
        return str(topic)
    raise ArgumentTypeError(f"topic must be a str, not {type(topic).__name__} {topic!r}", "topic")


cdef int get_body_buffer(object body, Py_buffer *view, str argument) except -1:
    """PyObject_GetBuffer for a message body, with a typed error naming ``argument`` when it is not bytes-like."""
    try:
        PyObject_GetBuffer(body, view, PyBUF_SIMPLE)
    except TypeError:
        raise body_type_error(body, argument) from None
    return 0


cdef object overflow_error(object queue_id, object flag):
    """The typed error for a queue id or flag too large for a C int (the conversion raised OverflowError)."""
    if not -(1 << 31) <= queue_id < (1 << 31):
        return InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
    return ArgumentOverflowError(f"flag {flag} does not fit an int32", argument="flag")


@cython.final
cdef class PutExtra:
    """The record fields of a broker-side re-put (``CommitLog.put_ext``): ``sys_flag`` (its host bits are
    recomputed from the hosts), ``born_timestamp`` (-1: the store time), ``born_host`` and ``store_host``
    ("ip:port" or packed bytes; None: this store's; a 4.9.8 broker's re-puts keep the record's store host),
    ``reconsume_times``, ``prepared_transaction_offset``, ``raw_properties`` (the exact stored properties bytes,
    RocketMQ's copy of a record's string; None: built from tags, keys and properties as ``put`` does)."""

    def __init__(self, *, int sys_flag=0, long long born_timestamp=-1, object born_host=None, object store_host=None,
                 int reconsume_times=0, long long prepared_transaction_offset=0, object raw_properties=None):
        """Raises ValueError (a negative reconsume count, a host of the wrong size), TypeError."""
        if reconsume_times < 0:
            raise ValueError("reconsume_times must be >= 0")
        if born_host is not None and not isinstance(born_host, bytes):
            born_host = pack_host(born_host)
        if born_host is not None and len(born_host) not in (HOST_V4_SIZE, HOST_V6_SIZE):
            raise ValueError(f"born_host must pack to {HOST_V4_SIZE} or {HOST_V6_SIZE} bytes, not {len(born_host)}")
        if store_host is not None and not isinstance(store_host, bytes):
            store_host = pack_host(store_host)
        if store_host is not None and len(store_host) not in (HOST_V4_SIZE, HOST_V6_SIZE):
            raise ValueError(f"store_host must pack to {HOST_V4_SIZE} or {HOST_V6_SIZE} bytes, not {len(store_host)}")
        if raw_properties is not None and not isinstance(raw_properties, bytes):
            raise TypeError("raw_properties must be bytes")
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.raw_properties = raw_properties

    def __repr__(self):
        return (f"PutExtra(sys_flag={self.sys_flag:#x}, born_timestamp={self.born_timestamp}, "
                f"reconsume_times={self.reconsume_times}, "
                f"prepared_transaction_offset={self.prepared_transaction_offset})")


cdef class CommitLog:
    """All topics' records in one log of fixed-size segments (RocketMQ's CommitLog).

    ``put`` and ``put_batch`` run under one put lock and are safe from any number of threads; each record is
    complete in the mapping before its end is published (release store), which is what readers and the
    dispatcher rely on. Invalid input raises before the lock is taken.
    """

    def __cinit__(self, mapped_file_queue, *, long long max_message_size, str store_host, str born_host):
        _live_logs.add(self)
        self.mapped_file_queue = mapped_file_queue
        self.file_size = mapped_file_queue.file_size
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError()
        self.topics = {}
        self.props_cache = {}
        self.max_message_size = max_message_size
        self.store_host = pack_host(store_host)
        self.born_host = pack_host(born_host)
        self.host_sys_flag = (SYSFLAG_BORNHOST_V6 if len(self.born_host) == HOST_V6_SIZE else 0) | \
                             (SYSFLAG_STOREHOST_V6 if len(self.store_host) == HOST_V6_SIZE else 0)
        self.cur = None
        self.dispatch_event = NULL
        self.group_commit = None
        self.refuse_status = None
        self.sync_failure = None
        self.sync_gather_permille = 500
        mapped_file_queue.on_sync_failure = self.fail_sync

    def __dealloc__(self):
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    def fail_sync(self, error):
        """A flush of the log failed (``error``, a StoreIOError naming the segment): from now on every put answers
        SERVICE_NOT_AVAILABLE without writing (``Producer.send`` raises SendError saying why), SYNC_FLUSH puts still
        waiting for their flush answer FLUSH_DISK_TIMEOUT, and the store's close() leaves ``abort`` so that the
        next open re-validates the log. A failed fsync is never retried into a success: Linux marks the pages it
        could not write clean after reporting the error once, so a retry that succeeds may have written nothing
        (PostgreSQL's "fsyncgate", 2018). The first failure is kept and logged; later ones are ignored."""
        if self.sync_failed:
            return
        self.sync_failure = error
        self.sync_failed = True
        self.mapped_file_queue.report_sync_failure(error)  # the flush services and close() stop flushing it
        if self.group_commit is not None:
            base = 0
            for mf in self.mapped_file_queue.files:
                if mf.path == getattr(error, "filename", None):
                    base = mf.file_from_offset
            self.group_commit.fail(getattr(error, "errno", None) or 5, base)
        log.error("commit log: %s; this store takes no more puts (SERVICE_NOT_AVAILABLE): a failed flush is never "
                  "retried. Close it and open it again (recovery re-validates the log)", error)

    def set_group_commit(self, GroupCommit gc, long long timeout_ms):
        """SYNC_FLUSH: make every put wait until ``gc`` reports its bytes flushed, at most ``timeout_ms``
        (then the put answers FLUSH_DISK_TIMEOUT; its message stays written). None turns it off."""
        self.group_commit = gc
        self.sync_flush_timeout_us = timeout_ms * 1000

    # -- a store shared between processes (the control file; see ARCHITECTURE.md "Many processes") -------------

    def attach_control(self, ControlFile ctl not None, double lock_timeout=10.0):
        """Share this log with the other processes attached to ``ctl``: every put takes the control file's robust
        writer lock (after this process's put lock), writes at the committed end published there, records an
        intent that lets a taker-over repair it if this process dies mid-put, and commits by a release store of
        the new end. Queue offsets live in the control file's topic table. Call before the first put."""
        self.ctl = ctl
        self.wlock = ctl.lock
        self.cb = ctl.addr
        self.lock_timeout = lock_timeout
        self.topics = {}
        self.last_topic = None
        self.last_te = None
        self.cur = None

    cdef int _bind_shared(self, TopicEntry te) except -1:
        """Point ``te``'s queue offsets at its row of the shared topic table (adding the row under the writer
        lock when this is the store's first put to the topic)."""
        cdef char *row = topic_row_c(self.cb, te.encoded)
        cdef WriteLock wl
        if len(te.encoded) > CTL_T_NAME_MAX:
            raise InvalidTopicError(f"topic of {len(te.encoded)} bytes: a store shared between processes holds "
                                    f"topic names of at most {CTL_T_NAME_MAX} bytes")
        if row == NULL:
            wl = self.ctl.lock
            if wl.acquire(self.lock_timeout) == _OWNER_DIED:
                try:
                    self._repair()
                finally:
                    wl.consistent()
            try:
                row = topic_row_c(self.cb, te.encoded)
                if row == NULL:
                    row = topic_row_add(self.cb, te.encoded)
            finally:
                wl.release()
            if row == NULL:
                raise TopicTableFullError(f"the shared topic table of {self.ctl.path} is full: a store shared "
                                          f"between processes holds at most {(CTL_FILE_SIZE - CTL_TOPICS_OFF)} "
                                          f"bytes of topic rows")
        te.next_offsets = <int64_t *>(row + CTL_T_NEXT)
        te.n_queues = CTL_TOPIC_QUEUES
        te.shared = True
        return 0

    cdef int _repair(self) except -1:
        """With the writer lock just taken over from a process that died holding it: undo its uncommitted put
        (zero the bytes it may have written, restore the queue's next offset) or finish its committed one."""
        cdef char *cb = self.cb
        cdef int64_t pos, end, cell, qoff, qend, w
        self.cur = None  # the log's end may move: every writer re-syncs its view
        if lmq_load_acq(<int64_t *>(cb + CTL_I_STATE)) != 1:
            return 0
        pos = lmq_load_acq(<int64_t *>(cb + CTL_I_POS))
        end = lmq_load_acq(<int64_t *>(cb + CTL_I_END))
        cell = lmq_load_acq(<int64_t *>(cb + CTL_I_CELL))
        qoff = lmq_load_acq(<int64_t *>(cb + CTL_I_QOFF))
        qend = lmq_load_acq(<int64_t *>(cb + CTL_I_QEND))
        w = lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS))
        cell_ok = CTL_TOPICS_OFF <= cell <= CTL_FILE_SIZE - 8 and cell % 8 == 0
        if w == pos:
            if end > pos:
                self.mapped_file_queue.zero_range(pos, end)
            if cell_ok:
                (<int64_t *>(cb + cell))[0] = qoff
            log.warning("%s: a process died in the middle of a put; its uncommitted bytes [%d, %d) were zeroed and "
                        "queue offset %d will be assigned again", self.ctl.path, pos, end, qoff)
        elif cell_ok:
            (<int64_t *>(cb + cell))[0] = qend
            log.warning("%s: a process died right after committing a put ending at %d; finished it",
                        self.ctl.path, w)
        lmq_store_rel(<int64_t *>(cb + CTL_S_REPAIRS), lmq_load_acq(<int64_t *>(cb + CTL_S_REPAIRS)) + 1)
        lmq_store_rel(<int64_t *>(cb + CTL_I_STATE), 0)
        self.repairs += 1
        return 0

    def set_dispatch_event(self, Event event):
        """Let puts wake the dispatcher: each put signals ``event`` (the dispatcher's ``wake_event``) when the
        dispatcher waits on it. None stops the signals."""
        self.dispatch_event_owner = event
        self.dispatch_event = event.ev if event is not None else NULL

    # -- topic / queue-offset table ---------------------------------------------------------------------------

    cdef TopicEntry _topic(self, str topic):
        # a producer mostly repeats one topic object: compare identities before hashing
        if topic is self.last_topic:
            return self.last_te
        cdef object e = self.topics.get(topic)
        if e is None:
            check_topic(topic)
            e = TopicEntry(topic)
            if self.cb != NULL:
                self._bind_shared(<TopicEntry>e)
            # this runs before the put lock and check_topic may let another thread in: the first entry stored wins
            # (an assignment let two threads' first puts to a new topic both take queue offset 0, and the loser's
            # later puts the offsets the winner had handed out: found by tests/test_power_loss.py)
            e = self.topics.setdefault(topic, e)
        self.last_topic = topic
        self.last_te = <TopicEntry>e
        return <TopicEntry>e

    def set_queue_offset(self, str topic, int queue_id, long long next_offset):
        """Set the next queue offset of (topic, queue) (recovery rebuilds the table from the ConsumeQueues)."""
        cdef TopicEntry te = self._topic(topic)
        if not 0 <= queue_id <= MAX_QUEUE_ID:
            raise InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
        te.ensure(queue_id)
        te.next_offsets[queue_id] = next_offset

    def queue_offset(self, str topic, int queue_id):
        """Next queue offset that (topic, queue) will assign (0 for an unknown queue)."""
        e = self.topics.get(topic)
        return (<TopicEntry>e).next_offset(queue_id) if e is not None else 0

    def topic_table(self):
        """{(topic, queue id): next queue offset} of every queue written so far."""
        out = {}
        for t, e in self.topics.items():
            for q in (<TopicEntry>e).queue_ids():
                out[(t, q)] = (<TopicEntry>e).next_offsets[q]
        return out

    # -- properties -------------------------------------------------------------------------------------------

    cdef bytes _properties(self, object tags, object keys, object properties):
        cdef object ck
        if properties is None:
            if keys is None or isinstance(keys, str):
                ck = (tags, keys)
            elif isinstance(keys, tuple):
                ck = (tags, keys)
            else:
                ck = None
            if ck is not None:
                cached = self.props_cache.get(ck)
                if cached is not None:
                    return <bytes>cached
        d = message_properties(tags, keys, properties)
        out = properties_to_bytes(d)
        if len(out) > MAX_PROPERTIES_SIZE:
            raise PropertiesSizeError(f"properties encode to {len(out)} bytes, more than {MAX_PROPERTIES_SIZE}",
                                      PutStatus.PROPERTIES_SIZE_EXCEEDED)
        if properties is None and ck is not None and len(self.props_cache) < 4096:
            self.props_cache[ck] = out
        return out

    # -- segments -----------------------------------------------------------------------------------------------

    cdef MappedFile _roll(self, int64_t start):
        """The segment to write at absolute offset `start` (creating it); None when creation failed."""
        try:
            mf = self.mapped_file_queue.last_or_create(start)
        except OSError as e:
            self.put_failures += 1
            self.last_failure = (f"cannot create commit log segment {start:020d} in {self.mapped_file_queue.directory} "
                                 f"({self.file_size} bytes, {self.mapped_file_queue.reserve_step or self.file_size} "
                                 f"of them reserved at once): {e.strerror or e}")
            if self._failure_is_new(("create", start, e.errno)):
                log.error("cannot create commit log segment at %d: %s; puts are refused (logged once until a "
                          "segment can be made)", start, e)
            if self.create_failed_hook is not None:
                self.create_failed_hook(e)
            return None
        self._failure_cleared()
        self.cur = mf
        if self.group_commit is not None:
            self.group_commit.set_file(mf)
        return mf

    cdef bint _reserve(self, MappedFile mf, int64_t end):
        """Reserve the segment's blocks below ``end`` (plus the blank record that may follow) before a record is
        written there; False (logged, counted, the create-failed hook told) when the disk cannot hold them."""
        try:
            mf.ensure_reserved(end)
        except OSError as e:
            self.put_failures += 1
            self.last_failure = (f"cannot reserve {end - mf.reserved + mf.reserve_step} more bytes of commit log "
                                 f"segment {mf.path}: {e.strerror or e}")
            if self._failure_is_new(("reserve", mf.path, e.errno)):
                log.error("cannot reserve %d more bytes of commit log segment %s (the disk is full?): %s; puts are "
                          "refused, nothing was written (logged once until blocks can be reserved)",
                          end - mf.reserved, mf.path, e)
            if self.create_failed_hook is not None:
                self.create_failed_hook(e)
            return False
        self._failure_cleared()
        return True

    cdef bint _failure_is_new(self, object cause):
        """Whether a refused put's cause differs from the one logged last (a full disk is logged once, not once
        per refused put); the repeats are counted in ``put_failures``."""
        if cause == self.failure_cause:
            return False
        self.failure_cause = cause
        return True

    cdef int _failure_cleared(self) except -1:
        if self.failure_cause is not None:
            log.warning("commit log: blocks could be reserved again after %d refused puts", self.put_failures)
            self.failure_cause = None
        return 0

    def reset_write_segment(self):
        """Forget the cached write segment (after recovery or truncation changed the files)."""
        self.cur = None

    @property
    def max_offset(self):
        return self.mapped_file_queue.max_offset()

    def check_writer(self):
        """Shared store: take the writer lock if it is free, and repair a put torn by a holder that died since the
        last writer (the housekeeper calls this periodically, so a torn put is repaired even when nobody writes
        again). Returns True when a repair was made; a live holder is left alone (False)."""
        cdef WriteLock wl
        cdef int rc
        cdef bint repaired = False
        if self.cb == NULL:
            return False
        wl = self.ctl.lock
        lock_acquire(self.lock)
        try:
            rc = lmq_shm_lock_acquire(wl.p, 0)
            if rc == LMQ_SHM_ACQUIRED or rc == LMQ_SHM_OWNER_DIED:
                wl.holds += 1
                try:
                    if rc == LMQ_SHM_OWNER_DIED:
                        try:
                            self._repair()
                            repaired = True
                        finally:
                            lmq_shm_lock_consistent(wl.p)
                finally:
                    ctl_exit(self)
        finally:
            PyThread_release_lock(self.lock)
        return repaired

    def sync_view(self):
        """Shared store: move this process's view of the log (mapped segments, positions) to the committed end
        published in the control file, without the writer lock (views only grow, by CAS). Returns that end;
        in a store this process alone writes, its own end."""
        cdef int64_t w
        if self.cb == NULL:
            return self.mapped_file_queue.max_offset()
        w = lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS))
        if w != self.synced_end:
            self.mapped_file_queue.sync_to(w)
            self.synced_end = w
        return w

    # -- put --------------------------------------------------------------------------------------------------

    def put(self, object topic, object body, *, object queue_id=0, object tags=None, object keys=None,
            object properties=None, object flag=0):
        """Append one message. Returns a PutResult (status PUT_OK, or CREATE_MAPPED_FILE_FAILED when a new
        segment could not be created, e.g. a full disk).

        Raises InvalidTopicError, InvalidQueueIdError, MessageSizeError (body over max_message_size),
        PropertiesSizeError, InvalidPropertyError, StoreClosedError, TypeError (body not bytes-like).
        """
        return self._put(topic_arg(topic), body, queue_id, tags, keys, properties, flag, None)

    def put_ext(self, object topic, object body, *, object queue_id=0, object tags=None, object keys=None,
                object properties=None, object flag=0, PutExtra extra not None):
        """Append one message whose record fields a broker-side re-put sets: sysflag (compression, multi-tags and
        transaction bits; the host bits follow the hosts), born timestamp and host, reconsume times, prepared
        transaction offset, and optionally the exact stored properties (``extra``, a PutExtra). Used by the
        retry send-back, the schedule service and transactions. A PREPARED or ROLLBACK record gets queue offset
        0 and does not advance its queue (RocketMQ: such records are not dispatched).

        Returns and raises as ``put``.
        """
        return self._put(topic_arg(topic), body, queue_id, tags, keys, properties, flag, extra)

    cdef object _put(self, str topic, object body, object queue_id, object tags, object keys, object properties,
                     object flag, PutExtra extra):
        # put's body, called at C level by put and by CommitLogFront.put (one argument parse per call); ``extra``
        # is None except for re-puts (put_ext)
        cdef TopicEntry te
        cdef bytes props
        cdef Py_buffer view
        cdef const uint8_t *bp
        cdef int64_t blen, total, pos, ts, qoff, phys
        cdef MappedFile mf
        cdef bint have_view = False
        cdef PutResult r
        cdef int qid = 0, fl = 0
        cdef char *cb = self.cb
        cdef bint entered = False
        cdef int64_t cend = 0
        cdef int32_t sys_flag = self.host_sys_flag
        cdef bytes born_host = self.born_host
        cdef bytes store_host = self.store_host
        cdef int64_t born_ts = -1
        cdef int32_t reconsume = 0
        cdef int64_t prepared = 0
        cdef bint counted = True
        te = begin_put(self, topic, queue_id, flag, &qid, &fl)
        if te is None:  # refused (retention's disk-full flag): nothing is written
            return failed_result(NOT_AVAILABLE if self.sync_failed else self.refuse_status)
        if extra is not None and extra.raw_properties is not None:
            props = extra.raw_properties
            if PyBytes_GET_SIZE(props) > MAX_PROPERTIES_SIZE:
                raise PropertiesSizeError(f"properties of {PyBytes_GET_SIZE(props)} bytes, more than "
                                          f"{MAX_PROPERTIES_SIZE}", PutStatus.PROPERTIES_SIZE_EXCEEDED)
        elif tags is None and keys is None and properties is None:
            props = b""
        else:
            props = self._properties(tags, keys, properties)
        if extra is not None:
            if extra.born_host is not None:
                born_host = extra.born_host
            if extra.store_host is not None:
                store_host = extra.store_host
            sys_flag = (extra.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)) | \
                (SYSFLAG_BORNHOST_V6 if PyBytes_GET_SIZE(born_host) == HOST_V6_SIZE else 0) | \
                (SYSFLAG_STOREHOST_V6 if PyBytes_GET_SIZE(store_host) == HOST_V6_SIZE else 0)
            born_ts = extra.born_timestamp
            reconsume = extra.reconsume_times
            prepared = extra.prepared_transaction_offset
            counted = (sys_flag & SYSFLAG_TRANSACTION_MASK) != SYSFLAG_TRANSACTION_PREPARED and \
                (sys_flag & SYSFLAG_TRANSACTION_MASK) != SYSFLAG_TRANSACTION_ROLLBACK
        if type(body) is bytes:
            bp = <const uint8_t *>PyBytes_AS_STRING(body)
            blen = PyBytes_GET_SIZE(body)
        else:
            get_body_buffer(body, &view, "body")
            have_view = True
            bp = <const uint8_t *>view.buf
            blen = view.len
        try:
            if blen > self.max_message_size:
                raise MessageSizeError(f"body of {blen} bytes exceeds max_message_size {self.max_message_size}",
                                       PutStatus.MESSAGE_ILLEGAL)
            total = calc_msg_length(sys_flag, blen, PyBytes_GET_SIZE(te.encoded), PyBytes_GET_SIZE(props))
            if total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                raise MessageSizeError(f"a record of {total} bytes cannot fit a segment of {self.file_size}",
                                       PutStatus.MESSAGE_ILLEGAL)
            lock_acquire(self.lock)
            try:
                if self.closed:
                    raise self._closed_error()
                if cb != NULL:
                    ctl_enter(self)
                    entered = True
                    cend = ctl_begin(self, te, qid)
                ts = store_time(self)
                mf = self.cur
                while True:
                    if mf is None:
                        mf = self._roll(self.mapped_file_queue.max_offset())
                        if mf is None:
                            return failed_result(CREATE_FAILED)
                    pos = mf.append_pos
                    if pos >= self.file_size:
                        mf = self._roll(mf.file_from_offset + self.file_size)
                        if mf is None:
                            return failed_result(CREATE_FAILED)
                        continue
                    if total + END_FILE_MIN_BLANK_LENGTH > self.file_size - pos:
                        # END_OF_FILE: leave the 8-byte blank announcing the rest of the file, then roll
                        if cb != NULL:
                            intent_end(cb, mf.file_from_offset + self.file_size)
                        write_blank(write_base(mf) + pos, <int32_t>(self.file_size - pos))
                        publish(mf, self.file_size)
                        cend = mf.file_from_offset + self.file_size
                        mf = self._roll(mf.file_from_offset + self.file_size)
                        if mf is None:
                            return failed_result(CREATE_FAILED)
                        continue
                    break
                if pos + total + END_FILE_MIN_BLANK_LENGTH > mf.reserved:
                    if not self._reserve(mf, pos + total + END_FILE_MIN_BLANK_LENGTH):
                        return failed_result(CREATE_FAILED)
                phys = mf.file_from_offset + pos
                qoff = te.next_offsets[qid] if counted else 0
                if cb != NULL:
                    intent_end(cb, phys + total)
                write_record(write_base(mf) + pos, <int32_t>total, qid, fl, qoff, phys,
                             sys_flag, ts if born_ts < 0 else born_ts,
                             <const uint8_t *>PyBytes_AS_STRING(born_host), PyBytes_GET_SIZE(born_host),
                             ts, <const uint8_t *>PyBytes_AS_STRING(store_host),
                             PyBytes_GET_SIZE(store_host), reconsume, prepared, bp, <int32_t>blen,
                             <const uint8_t *>PyBytes_AS_STRING(te.encoded), PyBytes_GET_SIZE(te.encoded),
                             <const uint8_t *>PyBytes_AS_STRING(props), PyBytes_GET_SIZE(props))
                mf.store_timestamp = ts
                publish(mf, pos + total)
                if counted:
                    te.next_offsets[qid] = qoff + 1
                cend = phys + total
                self.puts += 1
            finally:
                if entered:
                    ctl_commit(self, te, qid, cend)
                    ctl_exit(self)
                PyThread_release_lock(self.lock)
        finally:
            if have_view:
                PyBuffer_Release(&view)
        if cb != NULL:
            lmq_shm_event_notify(cb + CTL_EVENT_OFF)
        if self.dispatch_event != NULL:
            lmq_event_signal_if_waiting(self.dispatch_event)
        r = new_result()
        r.status = PUT_OK
        r.physical_offset = phys
        r.queue_offset = qoff
        r.wrote_bytes = total
        r.store_timestamp = ts
        r.msg_num = 1
        r._host = store_host
        if self.group_commit is not None:
            self._await_flush(r, phys + total)
        elif self.shared_sync:
            self._await_shared_flush(r, phys + total)
        return r

    def put_batch(self, object topic, object bodies, *, object queue_id=0, object tags=None, object keys=None,
                  object properties=None, object flag=0):
        """Append a batch to one queue under one lock: consecutive queue offsets, one store timestamp.

        Records roll into the next segment as needed (each record stays whole in one segment). Returns one
        PutResult (first offsets, total bytes, msg_num). Every body is validated before anything is written.
        Raises as ``put``; an empty batch raises ValueError.
        """
        return self._put_batch(topic_arg(topic), bodies, queue_id, tags, keys, properties, flag)

    cdef object _put_batch(self, str topic, object bodies, object queue_id, object tags, object keys,
                           object properties, object flag):
        # put_batch's body, called at C level by put_batch and by CommitLogFront.put_batch
        cdef TopicEntry te
        cdef bytes props
        cdef list blist
        cdef Py_ssize_t i, n
        cdef object b
        cdef int64_t blen, total, pos, ts, qoff, first_phys = -1, first_qoff = -1, wrote = 0, tlen, plen, end_off = 0
        cdef MappedFile mf
        cdef PutResult r
        cdef const uint8_t *tp
        cdef const uint8_t *pp
        cdef const uint8_t *bh
        cdef const uint8_t *sh
        cdef int32_t bhl, shl
        cdef Py_buffer view
        cdef bint have_view
        cdef const uint8_t *bp
        cdef object offsets = None      # bytes: the physical offset (int64) of each message written, for msg_id
        cdef int64_t *offs = NULL
        cdef int qid = 0, fl = 0
        cdef char *cb = self.cb
        cdef bint entered = False
        cdef int64_t cend = 0
        te = begin_put(self, topic, queue_id, flag, &qid, &fl)
        if te is None:  # refused (retention's disk-full flag): nothing is written
            return failed_result(NOT_AVAILABLE if self.sync_failed else self.refuse_status)
        if tags is None and keys is None and properties is None:
            props = b""
        else:
            props = self._properties(tags, keys, properties)
        blist = batch_bodies(bodies)
        n = PyList_GET_SIZE(blist)
        tlen = PyBytes_GET_SIZE(te.encoded)
        plen = PyBytes_GET_SIZE(props)
        # validate everything first: a batch is refused whole, never half-written because of bad input
        for i in range(n):
            b = <object>PyList_GET_ITEM(blist, i)
            if type(b) is bytes:
                blen = PyBytes_GET_SIZE(b)
            else:
                blen = body_length(b, f"bodies[{i}]")
            if blen > self.max_message_size:
                raise MessageSizeError(f"body {i} of {blen} bytes exceeds max_message_size {self.max_message_size}",
                                       PutStatus.MESSAGE_ILLEGAL)
            if calc_msg_length(self.host_sys_flag, blen, tlen, plen) + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                raise MessageSizeError(f"body {i} cannot fit a segment of {self.file_size}", PutStatus.MESSAGE_ILLEGAL)
        tp = <const uint8_t *>PyBytes_AS_STRING(te.encoded)
        pp = <const uint8_t *>PyBytes_AS_STRING(props)
        bh = <const uint8_t *>PyBytes_AS_STRING(self.born_host)
        bhl = PyBytes_GET_SIZE(self.born_host)
        sh = <const uint8_t *>PyBytes_AS_STRING(self.store_host)
        shl = PyBytes_GET_SIZE(self.store_host)
        if n <= 4096:
            offsets = PyBytes_FromStringAndSize(NULL, n * sizeof(int64_t))
            offs = <int64_t *>PyBytes_AS_STRING(offsets)
        lock_acquire(self.lock)
        try:
            if self.closed:
                raise self._closed_error()
            if cb != NULL:
                ctl_enter(self)
                entered = True
                cend = ctl_begin(self, te, qid)
            ts = store_time(self)
            mf = self.cur
            qoff = te.next_offsets[qid]
            for i in range(n):
                b = <object>PyList_GET_ITEM(blist, i)
                if type(b) is bytes:
                    have_view = False
                    bp = <const uint8_t *>PyBytes_AS_STRING(b)
                    blen = PyBytes_GET_SIZE(b)
                else:
                    PyObject_GetBuffer(b, &view, PyBUF_SIMPLE)
                    have_view = True
                    bp = <const uint8_t *>view.buf
                    blen = view.len
                try:
                    total = calc_msg_length(self.host_sys_flag, blen, tlen, plen)
                    while True:
                        if mf is None:
                            mf = self._roll(self.mapped_file_queue.max_offset())
                            if mf is None:
                                break
                        pos = mf.append_pos
                        if pos >= self.file_size:
                            mf = self._roll(mf.file_from_offset + self.file_size)
                            if mf is None:
                                break
                            continue
                        if total + END_FILE_MIN_BLANK_LENGTH > self.file_size - pos:
                            if cb != NULL:
                                intent_end(cb, mf.file_from_offset + self.file_size)
                            write_blank(write_base(mf) + pos, <int32_t>(self.file_size - pos))
                            publish(mf, self.file_size)
                            cend = mf.file_from_offset + self.file_size
                            mf = self._roll(mf.file_from_offset + self.file_size)
                            if mf is None:
                                break
                            continue
                        break
                    if mf is None:
                        break
                    if pos + total + END_FILE_MIN_BLANK_LENGTH > mf.reserved:
                        if not self._reserve(mf, pos + total + END_FILE_MIN_BLANK_LENGTH):
                            mf = None  # what was written before stays and is reported (CREATE_FAILED, msg_num)
                            break
                    if cb != NULL:
                        intent_end(cb, mf.file_from_offset + pos + total)
                    write_record(write_base(mf) + pos, <int32_t>total, qid, fl, qoff, mf.file_from_offset + pos,
                                 self.host_sys_flag, ts, bh, bhl, ts, sh, shl, 0, 0,
                                 bp, <int32_t>blen, tp, <int32_t>tlen, pp, <int32_t>plen)
                    if first_phys < 0:
                        first_phys = mf.file_from_offset + pos
                        first_qoff = qoff
                    if offs != NULL:
                        offs[i] = mf.file_from_offset + pos
                    mf.store_timestamp = ts
                    publish(mf, pos + total)
                    end_off = mf.file_from_offset + pos + total
                    qoff += 1
                    wrote += total
                    if cb != NULL:
                        # each record is complete: the queue's cell and the commit move together in ctl_commit
                        te.next_offsets[qid] = qoff
                        cend = end_off
                finally:
                    if have_view:
                        PyBuffer_Release(&view)
            te.next_offsets[qid] = qoff
            self.puts += qoff - (first_qoff if first_qoff >= 0 else qoff)
        finally:
            if entered:
                ctl_commit(self, te, qid, cend)
                ctl_exit(self)
            PyThread_release_lock(self.lock)
        if cb != NULL:
            lmq_shm_event_notify(cb + CTL_EVENT_OFF)
        if self.dispatch_event != NULL:
            lmq_event_signal_if_waiting(self.dispatch_event)
        r = new_result()
        r.physical_offset = first_phys
        r.queue_offset = first_qoff
        r.wrote_bytes = wrote
        r.store_timestamp = ts
        r.msg_num = <int>(qoff - first_qoff) if first_qoff >= 0 else 0
        r._host = self.store_host
        if offsets is not None and r.msg_num < n:
            offsets = offsets[:r.msg_num * sizeof(int64_t)]  # a segment could not be created part-way
        r._offsets = offsets
        if mf is None:
            # a segment could not be created part-way: what was written stays (and is reported), the rest is not
            r.status = CREATE_FAILED
            return r
        r.status = PUT_OK
        if self.group_commit is not None:
            self._await_flush(r, end_off)
        elif self.shared_sync:
            self._await_shared_flush(r, end_off)
        return r

    cdef _await_flush(self, object r, int64_t end):
        cdef int rc
        cdef GroupCommit gc = self.group_commit
        cdef int64_t us = self.sync_flush_timeout_us
        with nogil:  # until the GroupCommitService's next flush covers `end`
            rc = gc.wait_c(end, us)
        if rc != 0:
            # the message is in the log but not known to be on disk: RocketMQ's FLUSH_DISK_TIMEOUT
            (<PutResult>r).status = FLUSH_TIMEOUT
            failure = gc.failure()
            if failure is not None and not self.sync_failed:  # a group leader's fdatasync failed
                mf = self.mapped_file_queue.find(failure[1])
                self.fail_sync(store_io_error(failure[0], "fdatasync",
                                              mf.path if mf is not None else self.mapped_file_queue.directory))

    cdef _await_shared_flush(self, object r, int64_t end):
        # SYNC_FLUSH in a shared store: ask the housekeeper's group commit (one fdatasync covers the puts of every
        # process) and sleep on the "flushed" eventcount until the flushed end covers ours. The arrivals counter
        # lets the group commit gather a group: it is woken by the put that completes the group it wants
        # (CTL_S_SYNC_WANT), not by every put.
        cdef char *cb = self.cb
        cdef int64_t deadline = lmq_shm_monotonic_ns() + self.sync_flush_timeout_us * 1000, left
        cdef uint32_t seen
        cdef bint ok = False
        with nogil:  # a disk round trip
            if lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)) < end:
                lmq_store_max(<int64_t *>(cb + CTL_S_FLUSH_REQ), end)
                if lmq_fetch_add(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS), 1) + 1 >= \
                        lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_WANT)):
                    lmq_shm_event_notify(cb + CTL_FLUSH_REQ_EVENT_OFF)
            while True:
                seen = lmq_shm_event_seq(cb + CTL_FLUSHED_EVENT_OFF)
                if lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)) >= end:
                    ok = True
                    break
                left = (deadline - lmq_shm_monotonic_ns()) // 1000
                if left <= 0:
                    break
                lmq_shm_event_wait(cb + CTL_FLUSHED_EVENT_OFF, seen, left if left < 10000 else 10000)
        if not ok:
            (<PutResult>r).status = FLUSH_TIMEOUT

    def serve_shared_flush(self, MappedFile mf not None, long long idle_us):
        """The housekeeper's SYNC_FLUSH group commit for a shared store, without the GIL: wait for puts of any
        process that wait for their flush (``CTL_S_FLUSH_REQ`` beyond ``CTL_S_FLUSHED``), gather a group, fdatasync
        ``mf`` once for everything committed in it, publish the flushed end and wake the waiting puts of every
        process; repeat.

        Gathering: a flush waits until as many puts have asked as the previous flush covered (the threads it
        woke are back with their next put), but never longer than half an fdatasync (moving average) after the
        previous publish; a lone putter is flushed at once. The caller has flushed every segment below ``mf``
        and holds the queue's flush lock.

        Returns (flushed end, status, fdatasyncs): status 0 once the committed end lies beyond ``mf`` (``mf`` is
        flushed to its end: move on), 1 after ``idle_us`` without a request, -1 when ``stop_shared_flush`` was
        called. Raises OSError when fdatasync fails (nothing is published for the failed range).
        """
        cdef char *cb = self.cb
        cdef int64_t base = mf.file_from_offset, size = mf.file_size
        cdef int64_t a_start, a0, want, w, end, rel, now, t_pub, t0, left, covered
        cdef int64_t group = self.sync_group
        cdef int64_t ewma = self.sync_fsync_ns
        cdef uint32_t seen
        cdef int status = 0, rc = 0, err = 0
        cdef long long rounds = 0
        if cb == NULL:
            raise ValueError("serve_shared_flush needs attach_control first")
        if mf.addr == NULL:
            raise StoreClosedError(f"mapped file {mf.path} is closed")
        if mf.sync_error != 0:  # an earlier flush of it failed: never retried, nothing is published
            raise_errno(mf.sync_error, mf.path, "flush (an earlier msync or fdatasync of this file failed; "
                                                "it is never retried)")
        mf.exports += 1  # keeps the mapping and its descriptor alive through the nogil loop
        try:
            with nogil:
                lmq_set_timer_slack_ns(1000)  # this thread's gathering waits are tens of microseconds
                a_start = lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS))
                t_pub = lmq_shm_monotonic_ns()
                while True:
                    if self.shared_flush_stop:
                        status = -1
                        break
                    # 1. wait for a request: the first put that asks wakes us
                    lmq_store_sc(<int64_t *>(cb + CTL_S_SYNC_WANT), a_start + 1)
                    seen = lmq_shm_event_seq(cb + CTL_FLUSH_REQ_EVENT_OFF)
                    if lmq_load_sc(<int64_t *>(cb + CTL_S_FLUSH_REQ)) <= lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)):
                        if lmq_shm_event_wait(cb + CTL_FLUSH_REQ_EVENT_OFF, seen, idle_us) == 0:
                            if lmq_load_sc(<int64_t *>(cb + CTL_S_FLUSH_REQ)) <= \
                                    lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)):
                                status = 1
                                break
                        t_pub = lmq_shm_monotonic_ns()  # idle: the gathering window starts with this request
                        continue
                    # 2. gather: wait for as many requests as the last flush covered, at most ewma/2 after it
                    if group > 1:
                        want = a_start + group
                        lmq_store_sc(<int64_t *>(cb + CTL_S_SYNC_WANT), want)
                        while not self.shared_flush_stop:
                            seen = lmq_shm_event_seq(cb + CTL_FLUSH_REQ_EVENT_OFF)
                            if lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS)) >= want:
                                break
                            left = (t_pub + ewma * self.sync_gather_permille // 1000 - lmq_shm_monotonic_ns()) // 1000
                            if left <= 0:
                                break
                            lmq_shm_event_wait(cb + CTL_FLUSH_REQ_EVENT_OFF, seen, left)
                    # 3. flush what is committed in mf; every request counted in a0 lies below w
                    t0 = lmq_shm_monotonic_ns()
                    self.sync_gather_ns += t0 - t_pub
                    a0 = lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS))
                    w = lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS))
                    end = w if w < base + size else base + size
                    rel = end - base
                    if rel > mf.flushed_pos:
                        t0 = lmq_shm_monotonic_ns()
                        err = mf.sync_c(True, 0, 0)  # (the file's sync lock: see serve)
                        if err != 0:
                            rc = -1
                            break
                        now = lmq_shm_monotonic_ns()
                        self.sync_fsync_total_ns += now - t0
                        ewma = (ewma * 7 + (now - t0)) // 8 if ewma > 0 else now - t0
                        if ewma > 2000000:
                            ewma = 2000000  # a stalled disk does not stretch the gathering window past 1 ms
                        mf.flushed_pos = rel
                        lmq_store_max(&mf.wrote_pos, rel)
                        rounds += 1
                        self.sync_flushes += 1
                    lmq_store_max(<int64_t *>(cb + CTL_S_FLUSHED), end)
                    lmq_shm_event_notify(cb + CTL_FLUSHED_EVENT_OFF)
                    t_pub = lmq_shm_monotonic_ns()
                    covered = a0 - a_start
                    a_start = a0
                    if covered >= 1:
                        group = covered if covered < 4096 else 4096
                    # 4. keep the next MiB ahead of the log written once (zeros) and on disk: a fallocated range is
                    # "unwritten" to ext4/xfs, and the first fdatasync over each new page of it must also commit
                    # the extent conversion to the journal (measured here: 190 -> 120 us per group commit)
                    if mf.prepare_due(rel):
                        t0 = lmq_shm_monotonic_ns()
                        if mf.prepare_ahead_c(rel) != 0 and mf.sync_error != 0:
                            rc = -1  # its fdatasync failed (and consumed the file's error)
                            err = mf.sync_error
                            break
                        self.sync_prepare_ns += lmq_shm_monotonic_ns() - t0
                    if w >= base + size:
                        status = 0  # mf is flushed to its end: the caller moves on to the next segment
                        break
        finally:
            self.sync_group = group
            self.sync_fsync_ns = ewma
            mf.unpin()
        if rc != 0:
            raise_errno(err, mf.path, "fdatasync")
        return base + mf.flushed_pos, status, rounds

    def tune_shared_flush(self, int gather_permille):
        """The gathering window of ``serve_shared_flush`` in thousandths of its fdatasync average (500 by default;
        0 flushes as soon as a request is there)."""
        self.sync_gather_permille = gather_permille

    def shared_flush_stats(self):
        """This process's shared group commit so far (``serve_shared_flush``): fdatasyncs, nanoseconds spent in
        them, gathering requests before them and preparing the range ahead of the log, the moving average of one
        fdatasync, and how many waiting puts the last flush covered."""
        return {"flushes": self.sync_flushes, "fsync_ns": self.sync_fsync_total_ns, "gather_ns": self.sync_gather_ns,
                "prepare_ns": self.sync_prepare_ns, "fsync_avg_ns": self.sync_fsync_ns, "last_group": self.sync_group}

    def stop_shared_flush(self, bint stop=True):
        """Make ``serve_shared_flush`` return (status -1) at its next step (``stop=False`` allows it again)."""
        self.shared_flush_stop = stop
        if stop and self.cb != NULL:
            lmq_shm_event_notify(self.cb + CTL_FLUSH_REQ_EVENT_OFF)

    def set_shared_sync_flush(self, long long timeout_ms):
        """SYNC_FLUSH in a shared store: every put waits (at most ``timeout_ms``) until the housekeeper's group
        commit has the committed end on disk (``CTL_S_FLUSHED``), then answers PUT_OK, else FLUSH_DISK_TIMEOUT."""
        if self.cb == NULL:
            raise ValueError("set_shared_sync_flush needs attach_control first")
        self.shared_sync = True
        self.sync_flush_timeout_us = timeout_ms * 1000

    cdef object _closed_error(self):
        if self.forked:
            return ForkedStoreError("this store was opened by the process that forked this one "
                                    f"(pid {os.getpid()} is the child): open the store in this process instead "
                                    "(localmq.open(path, shared=True) in both processes lets them share it), "
                                    "or open it only after forking")
        return StoreClosedError("the store is closed")

    def close(self):
        """Refuse further puts (waits for a put in progress to finish)."""
        lock_acquire(self.lock)
        self.closed = True
        self.cur = None
        PyThread_release_lock(self.lock)


cdef inline TopicEntry begin_put(CommitLog self, str topic, object queue_id, object flag, int *qid, int *fl):
    """What put and put_batch start with: the log is open, puts are not refused (None: the caller answers
    ``refuse_status``, or SERVICE_NOT_AVAILABLE after a failed flush), queue id and flag fit their C ints (typed
    errors otherwise), the topic's entry."""
    if self.closed:
        raise self._closed_error()
    if self.refuse_status is not None or self.sync_failed:
        self.put_failures += 1
        return None
    # what is not an int gets a typed error naming it (the C conversion would truncate a float: 1.5 was queue 1)
    if type(queue_id) is not int:
        check_queue_id(queue_id)
    if type(flag) is not int:
        check_int_range(flag, "flag", -(1 << 31), (1 << 31) - 1)
    try:  # the C conversion; a Python int past a C int gets a typed error instead of a bare OverflowError
        qid[0] = queue_id
        fl[0] = flag
    except OverflowError:
        raise overflow_error(queue_id, flag) from None
    cdef TopicEntry te = self._topic(topic)
    if qid[0] < 0 or qid[0] > MAX_QUEUE_ID:
        raise InvalidQueueIdError(f"queue id {qid[0]} outside 0..{MAX_QUEUE_ID}")
    te.ensure(qid[0])
    return te


@cython.auto_pickle(False)
cdef class CommitLogFront:
    """Base class of LocalMessageQueue: ``put`` and ``put_batch`` are compiled methods that hand their arguments to
    ``commit_log`` (a CommitLog) at C level, so a put through the queue pays one argument parse and no Python frame.
    ``commit_log`` is None until the store is open (then a put raises StoreClosedError)."""

    cdef public CommitLog commit_log

    def put(self, object topic, object body, *, object queue_id=0, object tags=None, object keys=None,
            object properties=None, object flag=0):
        """Append one message to ``topic``/``queue_id`` (CommitLog.put).

        Params: ``body`` bytes-like; ``tags`` a string (hashed into the ConsumeQueue); ``keys`` a string or
        iterable of strings (no spaces); ``properties`` extra str -> str; ``flag`` an opaque int32.
        Returns PutResult (status PUT_OK, or CREATE_MAPPED_FILE_FAILED when no segment could be created).
        Raises InvalidTopicError, InvalidQueueIdError, MessageSizeError, PropertiesSizeError,
        InvalidPropertyError, StoreClosedError, ForkedStoreError (in a process forked after the open).
        """
        cdef CommitLog cl = self.commit_log
        if cl is None:
            raise StoreClosedError("the store is not open")
        return cl._put(topic_arg(topic), body, queue_id, tags, keys, properties, flag, None)

    def put_batch(self, object topic, object bodies, *, object queue_id=0, object tags=None, object keys=None,
                  object properties=None, object flag=0):
        """Append several messages to one queue under one lock (consecutive queue offsets, one store time;
        CommitLog.put_batch). Returns one PutResult describing the first message, the total bytes and ``msg_num``.
        Raises as ``put`` (every body is checked before anything is written); an empty batch raises ValueError.
        """
        cdef CommitLog cl = self.commit_log
        if cl is None:
            raise StoreClosedError("the store is not open")
        return cl._put_batch(topic_arg(topic), bodies, queue_id, tags, keys, properties, flag)
