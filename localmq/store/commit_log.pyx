# cython: boundscheck=False, wraparound=False, cdivision=True
"""The CommitLog put path: encode records straight into the current segment under one put lock."""
import logging
import os
import weakref

cimport cython
from cpython.buffer cimport PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

from localmq._layout cimport (
    CTL_EVENT_OFF, CTL_FLUSH_REQ_EVENT_OFF, CTL_S_LAST_TS, CTL_S_WPOS, CTL_T_NEXT, CTL_TOPIC_QUEUES,
    END_FILE_MIN_BLANK_LENGTH, HOST_V6_SIZE, MAX_PROPERTIES_SIZE, MAX_QUEUE_ID, MAX_TOPIC_BYTES,
    SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq._record cimport REC_HEAD_MAX, calc_msg_length, encode_head, encode_own, write_blank, write_record
from localmq._mapped_file cimport MappedFile
from localmq._os cimport lmq_event_signal_if_waiting, lmq_load_acq, lmq_now_ms, lmq_store_rel
from localmq._native cimport Event
from localmq._shm cimport ControlFile, lmq_shm_event_notify
from localmq.store.put_args cimport PutExtra, TopicEntry, check_batch, get_body_buffer, overflow_error
from localmq.store.put_result cimport PutResult, failed_result, new_result
from localmq.store.shared_commit cimport (
    SharedCommit, ctl_commit, ctl_enter, ctl_exit, ctl_intent, intent_end, view_follows,
)

from localmq._record import pack_host, properties_to_bytes
from localmq.config import (
    batch_bodies, check_queue_id, check_topic, message_properties,
)
from localmq.status import PutStatus
from localmq.errors import (
    ArgumentTypeError, ForkedStoreError, check_int_range, InvalidQueueIdError,
    MessageSizeError, PropertiesSizeError, StoreClosedError, store_io_error,
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
# importable from here as before they moved to put_args.pyx (a cimported class is no module attribute by itself)
globals().update(PutExtra=PutExtra, TopicEntry=TopicEntry)

cdef object PUT_OK = PutStatus.PUT_OK
cdef object CREATE_FAILED = PutStatus.CREATE_MAPPED_FILE_FAILED
cdef object FLUSH_TIMEOUT = PutStatus.FLUSH_DISK_TIMEOUT
cdef object NOT_AVAILABLE = PutStatus.SERVICE_NOT_AVAILABLE


cdef inline void lock_acquire(pthread_mutex_t *lk):
    # Fast path without releasing the GIL; when contended, wait with the GIL released so the holder (which
    # needs the GIL to finish its put) can run. Lock order: put lock -> MappedFileQueue.lock. Released
    # (pthread_mutex_unlock) by the thread that took it, in the same function.
    if pthread_mutex_trylock(lk) == 0:
        return
    with nogil:
        pthread_mutex_lock(lk)


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


cdef inline int64_t ctl_begin(CommitLog self, TopicEntry te, int qid) except -1:
    """Under the writer lock: move this process's view to the committed end and record the intent of the put
    that starts there (store/shared_commit.pxd). Returns the committed end."""
    cdef int64_t w = lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS))
    if not view_follows(self.cur, w, self.file_size):
        sync_view_to(self, w)
    ctl_intent(self.cb, w, &te.next_offsets[qid])
    return w


cdef int sync_view_to(CommitLog self, int64_t w) except -1:
    # ctl_begin's Python path (a new segment, or a first put), out of line so that the inline path needs no Python
    # temporaries (no register spills per put)
    cdef MappedFile mf = self.mapped_file_queue.sync_to(w)
    self.cur = mf
    if mf is not None and self.group_commit is not None:
        self.group_commit.set_file(mf)
    return 0


cdef inline int begin_locked(CommitLog self, TopicEntry te, int qid, bint *entered, int64_t *cend) except -1:
    """What a put does first under the put lock: refuse a closed log; in a shared store take the writer lock
    (``entered``) and record the put's intent at the committed end (``cend``). ``end_locked`` undoes both."""
    if self.closed:
        raise_closed(self)
    if self.cb != NULL:
        enter_shared(self, te, qid, entered, cend)
    return 0


cdef int raise_closed(CommitLog self) except -1:
    # out of line, as the other rare paths, so that the inline put steps stay small enough to be inlined
    raise self._closed_error()


cdef int enter_shared(CommitLog self, TopicEntry te, int qid, bint *entered, int64_t *cend) except -1:
    # begin_locked's shared-store half (a call more for a shared put, none for an exclusive one)
    if ctl_enter(self.shared):
        self.cur = None  # a put torn by a dead writer was repaired: the log's end may have moved
    entered[0] = True
    cend[0] = ctl_begin(self, te, qid)
    return 0


cdef inline void end_locked(CommitLog self, TopicEntry te, int qid, bint entered, int64_t cend) noexcept:
    # the put's last step, also after an error: commit what is complete up to cend, leave the locks
    if entered:
        ctl_commit(self.cb, te.next_offsets[qid], cend)
        ctl_exit(self.shared)
    pthread_mutex_unlock(&self.lock)


cdef inline MappedFile room_for(CommitLog self, MappedFile mf, int64_t total, int64_t *cend):
    # the segment of the next record: mostly ``mf``, the current one, with room and blocks reserved for it
    cdef int64_t need
    if mf is not None:
        need = mf.append_pos + total + END_FILE_MIN_BLANK_LENGTH
        if need <= self.file_size and need <= mf.reserved:
            return mf
    return roll_to_room(self, mf, total, cend)


cdef MappedFile roll_to_room(CommitLog self, MappedFile mf, int64_t total, int64_t *cend):
    """The segment with room for a record of ``total`` bytes at its append position and its blocks reserved: ``mf``
    or the next ones, created as needed (the one place the log rolls). A segment without room is closed by the
    END_OF_FILE blank announcing the rest of it (published; ``cend`` moves past it). None when no segment could be
    created or reserved (logged; the put answers CREATE_MAPPED_FILE_FAILED). Under the put lock."""
    cdef int64_t pos = 0, start
    while True:
        if mf is None:
            start = self.mapped_file_queue.max_offset()
        else:
            pos = mf.append_pos
            if pos + total + END_FILE_MIN_BLANK_LENGTH <= self.file_size:
                break
            start = mf.file_from_offset + self.file_size
            if pos < self.file_size:
                if self.cb != NULL:
                    intent_end(self.cb, start)
                write_blank(write_base(mf) + pos, <int32_t>(self.file_size - pos))
                publish(mf, self.file_size)
                cend[0] = start
        mf = self._roll(start)
        if mf is None:
            return None
    if pos + total + END_FILE_MIN_BLANK_LENGTH > mf.reserved:
        if not self._reserve(mf, pos + total + END_FILE_MIN_BLANK_LENGTH):
            return None
    return mf


cdef inline void wake_readers(CommitLog self) noexcept:
    # after the put lock: this process's dispatcher, or (shared) the housekeeper's, has new records to index
    if self.cb != NULL:
        lmq_shm_event_notify(self.cb + CTL_EVENT_OFF)
    if self.dispatch_event != NULL:
        lmq_event_signal_if_waiting(self.dispatch_event)


cdef inline object flushed(CommitLog self, PutResult r, int64_t end):
    # SYNC_FLUSH: the put answers once its bytes below ``end`` are on disk (else FLUSH_DISK_TIMEOUT)
    if self.group_commit is not None:
        self._await_flush(r, end)
    elif self.shared_sync:
        if not self.shared.wait_flushed(end, self.sync_flush_timeout_us):
            r.status = FLUSH_TIMEOUT
    return r


cdef inline bytes put_properties(CommitLog self, object tags, object keys, object properties, PutExtra extra):
    # the stored properties: a re-put's exact string, none, or built (and cached) from tags, keys and properties
    if extra is not None and extra.raw_properties is not None:
        return raw_properties(extra.raw_properties)
    if tags is None and keys is None and properties is None:
        return b""
    return self._properties(tags, keys, properties)


cdef bytes raw_properties(bytes props):
    # a re-put's properties are copied as stored: only their size is checked
    if PyBytes_GET_SIZE(props) > MAX_PROPERTIES_SIZE:
        raise PropertiesSizeError(f"properties of {PyBytes_GET_SIZE(props)} bytes, more than "
                                  f"{MAX_PROPERTIES_SIZE}", PutStatus.PROPERTIES_SIZE_EXCEEDED)
    return props


cdef inline int64_t body_view(object body, Py_buffer *view, const uint8_t **bp, bint *have_view,
                              str argument) except -1:
    # a body's length and bytes: a bytes object's own, else a buffer view (the caller releases it when have_view)
    if type(body) is bytes:
        bp[0] = <const uint8_t *>PyBytes_AS_STRING(body)
        return PyBytes_GET_SIZE(body)
    get_body_buffer(body, view, argument)
    have_view[0] = True
    bp[0] = <const uint8_t *>view.buf
    return view.len


cdef inline int32_t shared_head(CommitLog self, uint8_t *head, int qid, int fl, int64_t ts, int64_t tlen) noexcept:
    # the header fields the records of a put_batch share (encode_head), encoded once for the batch
    return encode_head(head, tlen > MAX_TOPIC_BYTES, qid, fl, self.host_sys_flag, ts,
                       <const uint8_t *>PyBytes_AS_STRING(self.born_host), PyBytes_GET_SIZE(self.born_host), ts,
                       <const uint8_t *>PyBytes_AS_STRING(self.store_host), PyBytes_GET_SIZE(self.store_host), 0, 0)


cdef inline PutResult put_result(int64_t phys, int64_t qoff, int64_t wrote, int64_t ts, int msg_num, bytes host):
    # PUT_OK (a batch cut short by a failed segment answers CREATE_MAPPED_FILE_FAILED instead)
    cdef PutResult r = new_result()
    r.status = PUT_OK
    r.physical_offset = phys
    r.queue_offset = qoff
    r.wrote_bytes = wrote
    r.store_timestamp = ts
    r.msg_num = msg_num
    r._host = host
    return r


cdef int bind_shared(CommitLog self, TopicEntry te) except -1:
    # point te's queue offsets at its row of the shared topic table (SharedCommit.topic_row adds it if needed)
    cdef bint repaired = False
    cdef char *row
    try:
        row = self.shared.topic_row(te.encoded, &repaired)
    finally:
        if repaired:
            self.cur = None  # a put torn by a dead writer was repaired: every writer re-syncs its view
    te.next_offsets = <int64_t *>(row + CTL_T_NEXT)
    te.n_queues = CTL_TOPIC_QUEUES
    te.shared = True
    return 0


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


cdef inline str topic_arg(object topic):
    """``topic`` as a str, or a typed error naming it (the put path's one type check of a topic)."""
    if type(topic) is str:
        return <str>topic
    if isinstance(topic, str):
        return str(topic)
    raise ArgumentTypeError(f"topic must be a str, not {type(topic).__name__} {topic!r}", "topic")


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
        if pthread_mutex_init(&self.lock, NULL) != 0:
            raise MemoryError()
        self.lock_ready = True
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
        mapped_file_queue.on_sync_failure = self.fail_sync

    def __dealloc__(self):
        if self.lock_ready:
            pthread_mutex_destroy(&self.lock)

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
        the new end (store/shared_commit.pyx). Queue offsets live in the control file's topic table. Call before
        the first put."""
        self.shared = SharedCommit(ctl, self.mapped_file_queue, lock_timeout)
        self.cb = ctl.addr
        self.topics = {}
        self.last_topic = None
        self.last_te = None
        self.cur = None
        self.mapped_file_queue.committed_end = self.shared.committed_end

    @property
    def ctl(self):
        """The control file of a store shared between processes (``attach_control``), else None."""
        return self.shared.ctl if self.shared is not None else None

    @property
    def repairs(self):
        """Puts torn by a writer that died holding the writer lock, repaired by this process."""
        return self.shared.repairs if self.shared is not None else 0

    @property
    def lock_timeout(self):
        """Seconds a put waits for the shared writer lock before StoreBusyError (set by ``attach_control``)."""
        return self.shared.lock_timeout if self.shared is not None else 0.0

    @lock_timeout.setter
    def lock_timeout(self, double value):
        if self.shared is not None:
            self.shared.lock_timeout = value

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
            # queues of the topic the open has not checked yet (shared: checked before their cells are trusted)
            for qid, nxt in (self.topic_miss(topic) if self.topic_miss is not None else ()):
                if self.cb == NULL:
                    (<TopicEntry>e).ensure(qid)
                    (<TopicEntry>e).next_offsets[qid] = nxt
            if self.cb != NULL:
                bind_shared(self, <TopicEntry>e)
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
        if e is None and self.topic_miss is not None:
            return dict(self.topic_miss(topic)).get(queue_id, 0)
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
        cdef bint repaired = False
        if self.cb == NULL:
            return False
        lock_acquire(&self.lock)
        try:
            repaired = self.shared.check_writer()
            if repaired:
                self.cur = None  # the log's end may have moved: every writer re-syncs its view
        finally:
            pthread_mutex_unlock(&self.lock)
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
        cdef int qid = 0, fl = 0
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
        props = put_properties(self, tags, keys, properties, extra)
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
        blen = body_view(body, &view, &bp, &have_view, "body")
        try:
            if blen > self.max_message_size:
                raise MessageSizeError(f"body of {blen} bytes exceeds max_message_size {self.max_message_size}",
                                       PutStatus.MESSAGE_ILLEGAL)
            total = calc_msg_length(sys_flag, blen, PyBytes_GET_SIZE(te.encoded), PyBytes_GET_SIZE(props))
            if total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                raise MessageSizeError(f"a record of {total} bytes cannot fit a segment of {self.file_size}",
                                       PutStatus.MESSAGE_ILLEGAL)
            lock_acquire(&self.lock)
            try:
                begin_locked(self, te, qid, &entered, &cend)
                ts = store_time(self)
                mf = room_for(self, self.cur, total, &cend)
                if mf is None:
                    return failed_result(CREATE_FAILED)
                pos = mf.append_pos
                phys = mf.file_from_offset + pos
                qoff = te.next_offsets[qid] if counted else 0
                if self.cb != NULL:
                    intent_end(self.cb, phys + total)
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
                end_locked(self, te, qid, entered, cend)
        finally:
            if have_view:
                PyBuffer_Release(&view)
        wake_readers(self)
        return flushed(self, put_result(phys, qoff, total, ts, 1, store_host), phys + total)

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
        cdef int64_t blen, total, pos, phys, ts, qoff, first_phys = -1, first_qoff = -1, wrote = 0, end_off = 0
        cdef int64_t tlen, plen
        cdef MappedFile mf
        cdef PutResult r
        cdef const uint8_t *tp
        cdef const uint8_t *pp
        cdef Py_buffer view
        cdef bint have_view
        cdef const uint8_t *bp
        cdef object offsets = None      # bytes: the physical offset (int64) of each message written, for msg_id
        cdef int64_t *offs = NULL
        cdef int qid = 0, fl = 0
        cdef char *cb = self.cb
        cdef bint entered = False
        cdef int64_t cend = 0
        cdef uint8_t head[REC_HEAD_MAX]
        cdef int32_t head_len = 0
        cdef int64_t fixed = 0
        te = begin_put(self, topic, queue_id, flag, &qid, &fl)
        if te is None:  # refused (retention's disk-full flag): nothing is written
            return failed_result(NOT_AVAILABLE if self.sync_failed else self.refuse_status)
        props = put_properties(self, tags, keys, properties, None)
        blist = batch_bodies(bodies)
        n = PyList_GET_SIZE(blist)
        tlen = PyBytes_GET_SIZE(te.encoded)
        plen = PyBytes_GET_SIZE(props)
        check_batch(blist, tlen, plen, self.host_sys_flag, self.max_message_size, self.file_size)
        tp = <const uint8_t *>PyBytes_AS_STRING(te.encoded)
        pp = <const uint8_t *>PyBytes_AS_STRING(props)
        if n <= 4096:
            offsets = PyBytes_FromStringAndSize(NULL, n * sizeof(int64_t))
            offs = <int64_t *>PyBytes_AS_STRING(offsets)
        lock_acquire(&self.lock)
        try:
            begin_locked(self, te, qid, &entered, &cend)
            ts = store_time(self)
            head_len = shared_head(self, head, qid, fl, ts, tlen)  # each record copies it and adds its own
            fixed = calc_msg_length(self.host_sys_flag, 0, tlen, plen)
            mf = self.cur
            qoff = te.next_offsets[qid]
            for i in range(n):
                have_view = False
                blen = body_view(<object>PyList_GET_ITEM(blist, i), &view, &bp, &have_view, "bodies")
                try:
                    total = fixed + blen
                    mf = room_for(self, mf, total, &cend)
                    if mf is None:
                        break  # what was written before stays and is reported (CREATE_FAILED, msg_num)
                    pos = mf.append_pos
                    phys = mf.file_from_offset + pos
                    if cb != NULL:
                        intent_end(cb, phys + total)
                    memcpy(write_base(mf) + pos, head, head_len)
                    encode_own(write_base(mf) + pos, head_len, <int32_t>total, qoff, phys, bp, <int32_t>blen,
                               tlen > MAX_TOPIC_BYTES, tp, <int32_t>tlen, pp, <int32_t>plen)
                    if first_phys < 0:
                        first_phys = phys
                        first_qoff = qoff
                    if offs != NULL:
                        offs[i] = phys
                    mf.store_timestamp = ts
                    publish(mf, pos + total)
                    end_off = phys + total
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
            end_locked(self, te, qid, entered, cend)
        wake_readers(self)
        r = put_result(first_phys, first_qoff, wrote, ts, <int>(qoff - first_qoff) if first_qoff >= 0 else 0,
                       self.store_host)
        if offsets is not None and r.msg_num < n:
            offsets = offsets[:r.msg_num * sizeof(int64_t)]  # a segment could not be created part-way
        r._offsets = offsets
        if mf is None:
            # a segment could not be created part-way: what was written stays (and is reported), the rest is not
            r.status = CREATE_FAILED
            return r
        return flushed(self, r, end_off)

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

    def serve_shared_flush(self, MappedFile mf not None, long long idle_us):
        """The housekeeper's SYNC_FLUSH group commit for a shared store, without the GIL: wait for puts of any
        process that wait for their flush (``CTL_S_FLUSH_REQ`` beyond ``CTL_S_FLUSHED``), gather a group, fdatasync
        ``mf`` once for everything committed in it, publish the flushed end and wake the waiting puts of every
        process; repeat (``SharedCommit.serve_flush`` in store/shared_commit.pyx, which says how it gathers). The
        caller has flushed every segment below ``mf`` and holds the queue's flush lock.

        Returns (flushed end, status, fdatasyncs): status 0 once the committed end lies beyond ``mf`` (``mf`` is
        flushed to its end: move on), 1 after ``idle_us`` without a request, -1 when ``stop_shared_flush`` was
        called. Raises OSError when fdatasync fails (nothing is published for the failed range).
        """
        if self.shared is None:
            raise ValueError("serve_shared_flush needs attach_control first")
        return self.shared.serve_flush(mf, idle_us)

    def tune_shared_flush(self, int gather_permille):
        """The gathering window of ``serve_shared_flush`` in thousandths of its fdatasync average (500 by default;
        0 flushes as soon as a request is there). A store shared between processes only (after attach_control)."""
        if self.shared is not None:
            self.shared.sync_gather_permille = gather_permille

    def shared_flush_stats(self):
        """This process's shared group commit so far (``serve_shared_flush``): fdatasyncs, nanoseconds spent in
        them, gathering requests before them and preparing the range ahead of the log, the moving average of one
        fdatasync, and how many waiting puts the last flush covered."""
        cdef SharedCommit s = self.shared
        if s is None:
            return {"flushes": 0, "fsync_ns": 0, "gather_ns": 0, "prepare_ns": 0, "fsync_avg_ns": 0, "last_group": 0}
        return {"flushes": s.sync_flushes, "fsync_ns": s.sync_fsync_total_ns, "gather_ns": s.sync_gather_ns,
                "prepare_ns": s.sync_prepare_ns, "fsync_avg_ns": s.sync_fsync_ns, "last_group": s.sync_group}

    def stop_shared_flush(self, bint stop=True):
        """Make ``serve_shared_flush`` return (status -1) at its next step (``stop=False`` allows it again)."""
        if self.shared is not None:
            self.shared.flush_stop = stop
            if stop:
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
        lock_acquire(&self.lock)
        self.closed = True
        self.cur = None
        pthread_mutex_unlock(&self.lock)


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
