# cython: boundscheck=False, wraparound=False, cdivision=True
"""The reput / dispatch loop: walk new CommitLog bytes without the GIL and append ConsumeQueue units."""
import logging
import threading
from collections import deque

cimport cython
from libc.errno cimport errno
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memset

from localmq._layout cimport (
    CQ_UNIT_SIZE, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq._record cimport (
    REC_BLANK, REC_GAP, REC_OK, RecordView, parse_record, tags_code_of,
)
from localmq.store.consume_queue cimport ConsumeQueue, CQState
from localmq._mapped_file cimport MappedFile, reserve_nogil
from localmq._native cimport Event
from localmq._layout cimport (
    CTL_DISPATCH_EVENT_OFF, CTL_EVENT_OFF, CTL_S_REPUT, CTL_S_WPOS, REC_MIN_SIZE,
)
from localmq._shm cimport ControlFile, lmq_shm_event_notify, lmq_shm_event_seq, lmq_shm_event_wait
from localmq._os cimport (
    lmq_event, lmq_event_signal, lmq_event_wait, lmq_load_acq, lmq_put32,
    lmq_put64, lmq_sleep_us, lmq_store_max, lmq_store_rel,
)

from localmq.errors import CorruptFrameError
from localmq.status import RecordStatus

log = logging.getLogger("localmq.dispatch")

cdef enum:
    R_CAUGHT_UP = 0
    R_PROGRESS = 1      # returned early so that waiters get notified
    R_NEED_SEGMENT = 2
    R_NEED_CQ = 3
    R_NEED_CQ_FILE = 4
    R_GAP = 5
    R_BAD_RECORD = 6
    R_STOP = 7
    R_NEED_SYNC = 8     # shared store: another process committed beyond this process's view of the log
    R_INSTALL = 9       # new queues' first files were made (QueueFileMaker): write their waiting units there
    # a new queue keeps at most this many units in memory while its first file is made; more waits for the file
    WAITING_UNITS_MAX = 1024

cdef struct Slot:
    uint64_t hash
    int32_t queue_id
    int32_t topic_len
    # the name's bytes, held by ReputCore.topic_names as long as the slot is (out of line: a slot is 32 bytes, not
    # the 280 of a name of the longest length, and the table is twice the queue count)
    const uint8_t *topic
    CQState *st


cdef inline uint64_t key_hash(const uint8_t *t, int32_t n, int32_t qid) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef int32_t i
    for i in range(n):
        h = (h ^ t[i]) * 1099511628211ULL
    h = (h ^ <uint64_t>qid) * 1099511628211ULL
    return h | 1  # 0 marks an empty slot


cdef class ReputCore:
    """State of the dispatcher: the reput offset, the current segment and a C hash table (topic, queue) ->
    ConsumeQueue state, so that the loop appends units without touching Python objects.

    One thread runs ``run``; ``reput_from`` (the dispatched offset) is published with release stores and may be
    read from any thread. ``waiters`` is incremented by threads blocked in ``wait_for`` (under ``cond``).
    """

    cdef Slot *table
    cdef int64_t cap
    cdef int64_t used
    cdef list keep_alive
    cdef dict topic_names                  # topic -> its UTF-8 bytes, which the slots point into
    cdef MappedFile seg
    cdef uint8_t *seg_addr
    cdef int64_t seg_base
    cdef int64_t seg_size
    cdef int64_t *seg_wrote
    cdef int64_t reput_from
    cdef lmq_event *event                  # wake_event.ev
    cdef readonly Event wake_event         # puts signal it (CommitLog.set_dispatch_event)
    cdef public int waiters
    cdef bint stop_flag
    cdef readonly object cond
    cdef object commit_log_files_owner    # MappedFileQueue of the commit log
    cdef object cq_factory                 # (topic, queue id) -> ConsumeQueue
    cdef RecordView pending
    cdef int pending_rc
    cdef int64_t *levels                   # the store's delay levels in ms (SCHEDULE_TOPIC_XXXX tags codes); NULL:
    cdef int32_t n_levels                  # RocketMQ's default table
    cdef readonly long long dispatched
    cdef readonly long long duplicates
    cdef readonly long long skipped_transactions
    cdef readonly long long bad_records
    cdef readonly long long rounds
    cdef public object error
    cdef public object blocked             # the OSError (e.g. ENOSPC) that stops a ConsumeQueue file, or None
    # on_blocked(error) when the dispatcher starts waiting for space, on_blocked(None) once the file it waited for
    # could be made (called from the dispatch thread; the store pauses puts meanwhile, so that the space that
    # returns goes to indexing what was acknowledged, not to the log)
    cdef public object on_blocked
    cdef readonly long long blocked_count
    cdef public bint paused                # on_blocked(error) was called, on_blocked(None) not yet
    # commit log offsets of records whose header recovery found damaged (a queue's unit outvoted one field): never
    # indexed into the queue they name; None when there are none
    cdef public object skip_offsets
    cdef public int idle_wait_us
    cdef char *cb                          # shared store: the control file's mapping (else NULL)
    cdef object ctl
    cdef object sync_view                  # shared store: () -> None, moves this process's view to the commit
    cdef int64_t published                 # reput offset last published to the control file
    cdef readonly int64_t gap_at           # the last gap record walked over (damage recovery quarantined), or -1
    cdef readonly int64_t gap_size
    cdef readonly long long gaps           # gap records walked over
    cdef bint jumped                       # reput_from jumped past records retention removed undispatched
    # New queues' first files are made off this thread (maker: a QueueFileMaker, or None: made here). Meanwhile a
    # new queue's units wait in ``waiting_units`` (queue -> [(queue offset, commit log offset, size, tags code,
    # store time)], in the order the queues got their first waiting unit, which is commit log order). The maker
    # reports a made file through ``ready`` (under ready_lock) and ``ready_flag``, which the loop checks between
    # records; this thread then writes the units (it stays the only writer of units).
    cdef public object maker
    cdef dict waiting_units
    cdef object waiting_order              # deque of (queue, its first waiting unit): oldest first, stale ones too
    cdef object ready_lock
    cdef list ready
    cdef int64_t ready_flag
    # the commit log offset of the first record whose unit waits in memory (-1: none): reput_offset, the offset
    # readers, waiters and the checkpoint see, stays there until that unit is written
    cdef int64_t pending_from
    cdef readonly int64_t pending_store_ts  # that record's store time (0: none): the checkpoint claims less
    cdef bint in_service                   # run() is the loop (new queues' files may then be made by the maker)
    # queue file steps reserved in the loop without the GIL (_reserve); the errno of a close that failed there after
    # reserving (0: none), which the slow path reports as that file's failed flush
    cdef readonly long long nogil_reserves
    cdef int reserve_close_errno

    def __cinit__(self, commit_log_mfq, cq_factory, long long reput_from, int idle_wait_us=1000):
        self.cap = 1024
        self.table = <Slot *>PyMem_Malloc(self.cap * sizeof(Slot))
        if self.table == NULL:
            raise MemoryError()
        memset(self.table, 0, self.cap * sizeof(Slot))
        self.used = 0
        self.keep_alive = []
        self.topic_names = {}
        self.seg = None
        self.seg_addr = NULL
        self.seg_wrote = NULL
        self.commit_log_files_owner = commit_log_mfq
        self.seg_size = commit_log_mfq.file_size
        self.cq_factory = cq_factory
        self.reput_from = reput_from
        self.wake_event = Event()
        self.event = self.wake_event.ev
        self.cond = threading.Condition(threading.Lock())
        self.idle_wait_us = idle_wait_us
        self.gap_at = -1
        self.maker = None
        self.waiting_units = {}
        self.waiting_order = deque()
        self.ready_lock = threading.Lock()
        self.ready = []
        self.pending_from = -1

    def __dealloc__(self):
        PyMem_Free(self.table)
        PyMem_Free(self.levels)

    def set_delay_levels(self, levels):
        """The store's ``message_delay_level`` in ms, level 1 first: a SCHEDULE_TOPIC_XXXX unit's tags code is the
        record's store time + its level's delay (RocketMQ's deliver time). Call before dispatch starts."""
        cdef Py_ssize_t n = len(levels), k
        cdef int64_t *p = <int64_t *>PyMem_Malloc(max(n, 1) * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        for k in range(n):
            p[k] = levels[k]
        PyMem_Free(self.levels)
        self.levels = p
        self.n_levels = <int32_t>n

    def attach_control(self, ControlFile ctl not None, sync_view):
        """Dispatch for every process sharing the store (this one is the housekeeper): follow the committed end in
        ``ctl`` (calling ``sync_view`` to map what other processes wrote), sleep on its "committed" eventcount,
        publish the dispatched offset there and notify its "dispatched" eventcount for consumers everywhere."""
        self.ctl = ctl
        self.cb = ctl.addr
        self.sync_view = sync_view
        self.published = -1

    @property
    def reput_offset(self):
        """Commit log offset up to which every record has been dispatched (its unit readable in its queue)."""
        # reput_from first: pending_from is set before reput_from passes its record (release stores)
        cdef int64_t r = lmq_load_acq(&self.reput_from)
        cdef int64_t p = lmq_load_acq(&self.pending_from)
        return p if 0 <= p < r else r

    @property
    def position(self):
        """Commit log offset of the next record to dispatch (the one a factory call is made for), past records whose
        units may still wait in memory for their queue's first file (``reput_offset`` stops at the first of those)."""
        return lmq_load_acq(&self.reput_from)

    @property
    def waiting_queues(self):
        """New queues whose units wait in memory for their first file."""
        return len(self.waiting_units)

    def note_ready(self, cq):
        """The maker's report (any thread): the first file of ``cq`` was made, or could not be; the loop writes its
        waiting units at its next step."""
        with self.ready_lock:
            self.ready.append(cq)
            lmq_store_rel(&self.ready_flag, 1)
        lmq_event_signal(self.event)

    def set_reput_offset(self, long long offset):
        """Move the reput offset (only while the loop is not running)."""
        lmq_store_rel(&self.reput_from, offset)
        self._drop_segment()

    def _drop_segment(self):
        self.seg = None
        self.seg_addr = NULL
        self.seg_wrote = NULL

    # -- the C hash table --------------------------------------------------------------------------------------

    cdef Slot *lookup(self, const uint8_t *t, int32_t n, int32_t qid) noexcept nogil:
        cdef uint64_t h = key_hash(t, n, qid)
        cdef int64_t mask = self.cap - 1
        cdef int64_t i = <int64_t>(h & <uint64_t>mask)
        cdef Slot *s
        while True:
            s = &self.table[i]
            if s.hash == 0:
                return NULL
            if s.hash == h and s.queue_id == qid and s.topic_len == n and memcmp(s.topic, t, n) == 0:
                return s
            i = (i + 1) & mask

    cdef int insert(self, const uint8_t *t, int32_t n, int32_t qid, CQState *st) except -1:
        cdef Slot *old
        cdef int64_t oldcap, i, j, mask
        cdef uint64_t h
        if (self.used + 1) * 2 > self.cap:
            old = self.table
            oldcap = self.cap
            self.table = <Slot *>PyMem_Malloc(oldcap * 2 * sizeof(Slot))
            if self.table == NULL:
                self.table = old
                raise MemoryError()
            memset(self.table, 0, oldcap * 2 * sizeof(Slot))
            self.cap = oldcap * 2
            mask = self.cap - 1
            for i in range(oldcap):
                if old[i].hash != 0:
                    j = <int64_t>(old[i].hash & <uint64_t>mask)
                    while self.table[j].hash != 0:
                        j = (j + 1) & mask
                    self.table[j] = old[i]
            PyMem_Free(old)
        h = key_hash(t, n, qid)
        mask = self.cap - 1
        j = <int64_t>(h & <uint64_t>mask)
        while self.table[j].hash != 0:
            j = (j + 1) & mask
        self.table[j].hash = h
        self.table[j].queue_id = qid
        self.table[j].topic_len = n
        self.table[j].topic = t
        self.table[j].st = st
        self.used += 1
        return 0

    def register(self, ConsumeQueue cq):
        """Make the loop write (cq.topic, cq.queue_id) units straight into ``cq``."""
        tb = self.topic_names.get(cq.topic)
        if tb is None:
            tb = self.topic_names[cq.topic] = cq.topic.encode("utf-8")
        if self.lookup(tb, len(tb), cq.queue_id) != NULL:
            return
        self.keep_alive.append(cq)
        self.insert(tb, len(tb), cq.queue_id, cq.state_ptr())  # the slot points into tb, kept in topic_names

    def clear(self):
        memset(self.table, 0, self.cap * sizeof(Slot))
        self.used = 0
        self.keep_alive = []
        self.topic_names = {}

    # -- the loop --------------------------------------------------------------------------------------------

    @cython.final
    cdef inline void _advance(self, int64_t size) noexcept nogil:
        """Step reput_from over a record of ``size`` bytes (release store: readers of ``reput_offset`` see it)."""
        lmq_store_rel(&self.reput_from, self.reput_from + size)

    @cython.final
    cdef inline int _follow_shared(self, int64_t end) noexcept nogil:
        """Caught up in a shared store: publish the dispatched offset to the control file, then follow the committed
        end. Returns -1 when this view's segment moved (walk on), R_NEED_SYNC for a trip to Python, else 0."""
        cdef int64_t w
        if self.published != self.reput_from:
            # consumers in every process: the units up to here are complete
            self.published = self.reput_from
            lmq_store_rel(<int64_t *>(self.cb + CTL_S_REPUT), self.reput_from)
            lmq_shm_event_notify(self.cb + CTL_DISPATCH_EVENT_OFF)
        w = lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS))
        if w > self.seg_base + end:
            if w < self.seg_base + self.seg_size and self.seg.wbuf == NULL:
                # another process committed within this segment (the common case): move this view's
                # positions here (CAS max, as CommitLog.sync_view does) instead of a trip to Python
                lmq_store_max(&self.seg.append_pos, w - self.seg_base)
                lmq_store_max(&self.seg.committed_pos, w - self.seg_base)
                lmq_store_max(&self.seg.wrote_pos, w - self.seg_base)
                return -1
            return R_NEED_SYNC
        return 0

    @cython.final
    cdef inline void _idle(self, int64_t end, int *idle_polls) noexcept nogil:
        """Caught up with nothing to return for: poll every 20 us for about 1 ms, then sleep on the put event.

        ``idle_polls`` stays at 50 after a wait: a store with nothing to dispatch sleeps on the event (its timeout
        only covers a wake-up lost between the caller's check and the sleep) instead of polling again for 1 ms
        after every timeout; a record dispatched starts the polling anew."""
        cdef uint32_t seen
        if idle_polls[0] < 50:
            idle_polls[0] += 1
            lmq_sleep_us(20)
        elif self.cb != NULL:
            seen = lmq_shm_event_seq(self.cb + CTL_EVENT_OFF)
            if lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS)) <= self.seg_base + end:
                lmq_shm_event_wait(self.cb + CTL_EVENT_OFF, seen, self.idle_wait_us)
        else:
            lmq_event_wait(self.event, self.idle_wait_us)

    @cython.final
    cdef inline void _write_unit(self, CQState *st, RecordView *v, uint8_t *u) noexcept nogil:
        """Write the 20-byte unit of record ``v`` (at reput_from) at ``u`` and publish it: the queue's max offset
        (release store, after the unit's bytes), the shared copy, then reput_from past the record."""
        cdef int64_t qo = v.queue_offset
        lmq_put64(u, <uint64_t>self.reput_from)
        lmq_put32(u + 8, <uint32_t>v.total_size)
        lmq_put64(u + 12, <uint64_t>tags_code_of(v, self.levels, self.n_levels))
        st.max_physic_offset = self.reput_from + v.total_size
        st.last_store_ts = v.store_timestamp
        lmq_store_rel(&st.max_offset, qo + 1)
        if st.shared_max != NULL:
            lmq_store_rel(st.shared_max, qo + 1)
        self._advance(v.total_size)

    cdef int _run_nogil(self, int64_t max_records, bint idle_wait) noexcept nogil:
        """Dispatch without the GIL. With ``idle_wait`` it stays here when caught up: after it dispatched something
        it polls every 20 us for about 1 ms (a busy producer then never pays for a wake-up), then sleeps on the
        event that puts signal, waking every ``idle_wait_us`` only to look for a put whose signal it missed.
        It returns to Python only for a slow path, to notify waiters after progress, or to stop."""
        cdef int64_t n = 0, rel, end, r, committed = -1
        cdef int rc, idle_polls = 0
        cdef RecordView v
        cdef Slot *slot
        cdef CQState *st
        cdef int32_t txn
        while True:
            if self.stop_flag:
                return R_STOP
            if lmq_load_acq(&self.ready_flag) != 0:
                return R_INSTALL
            if self.seg_addr == NULL:
                return R_NEED_SEGMENT
            rel = self.reput_from - self.seg_base
            end = lmq_load_acq(self.seg_wrote)
            if self.cb != NULL:
                # a shared store: never past the committed end. A put of this process publishes its record (or the
                # blank closing a full segment) in this view before it commits; if the process dies between the
                # two, the next writer's repair zeroes those bytes and writes over them, and a dispatch position
                # published past them would make the next housekeeper skip what is written there
                if self.reput_from >= committed:
                    committed = lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS))
                if committed - self.seg_base < end:
                    end = committed - self.seg_base
            if rel >= end:
                if self.cb != NULL:
                    rc = self._follow_shared(end)
                    if rc < 0:
                        continue
                    if rc != 0:
                        return rc
                if end >= self.seg_size:
                    return R_NEED_SEGMENT
                if not idle_wait or (n > 0 and self.waiters > 0):
                    return R_PROGRESS if n > 0 else R_CAUGHT_UP
                self._idle(end, &idle_polls)
                continue
            idle_polls = 0
            rc = parse_record(self.seg_addr + rel, end - rel, &v, False)
            if rc == REC_BLANK:
                lmq_store_rel(&self.reput_from, self.seg_base + self.seg_size)
                return R_NEED_SEGMENT
            if rc == REC_GAP:
                # damaged records recovery quarantined: a queue whose next record comes after it lost its units
                # here, and R_GAP points them at this record (a typed error on get, never a silent skip)
                self.gap_at = self.reput_from
                self.gap_size = v.total_size
                self.gaps += 1
                self._advance(v.total_size)
                continue
            if rc != REC_OK:
                self.pending = v
                self.pending_rc = rc
                return R_BAD_RECORD
            txn = v.sys_flag & SYSFLAG_TRANSACTION_MASK
            if txn == SYSFLAG_TRANSACTION_PREPARED or txn == SYSFLAG_TRANSACTION_ROLLBACK:
                self.skipped_transactions += 1
                self._advance(v.total_size)
                continue
            slot = self.lookup(v.topic, v.topic_len, v.queue_id)
            if slot == NULL:
                self.pending = v
                return R_NEED_CQ
            st = slot.st
            if self.reput_from + v.total_size <= st.max_physic_offset:
                # already in the queue (re-dispatch after recovery): CQ writes are idempotent
                self.duplicates += 1
                self._advance(v.total_size)
                continue
            if v.queue_offset != st.max_offset + st.waiting:
                # missing units before it, or a queue offset the queue is already past (a damaged header)
                self.pending = v
                return R_GAP
            r = v.queue_offset * CQ_UNIT_SIZE - st.file_from
            if st.addr == NULL or r < 0 or (r + CQ_UNIT_SIZE > st.reserved and self._reserve(st, r + CQ_UNIT_SIZE)):
                self.pending = v
                return R_NEED_CQ_FILE
            self._write_unit(st, &v, st.addr + r)
            self.dispatched += 1
            n += 1
            if n >= max_records:
                return R_PROGRESS

    cdef inline bint _reserve(self, CQState *st, int64_t end) noexcept nogil:
        # The write target's next step reserved here, without the GIL (a trip to Python waits for the GIL, up to the
        # 5 ms switch interval while a producer's thread runs Python: a busy queue asked every 3,276 units). True
        # when the slow path must do it: another file, or a call that failed (the slow path tries again with the GIL
        # and raises what it meets; a close that failed after reserving is reported there as a failed flush).
        cdef int stage = 0
        cdef int rc = reserve_nogil(&st.rsv, end, &stage)
        st.reserved = st.rsv.reserved[0] if st.rsv.path != NULL else st.reserved
        if rc == 0:
            self.nogil_reserves += 1
            return False
        if rc == -2 and stage == 4:
            self.reserve_close_errno = errno
        return True

    cdef int _next_segment(self) except -1:
        """Point the loop at the segment holding reput_from. Returns 1 when switched, 0 when it is not there yet."""
        mfq = self.commit_log_files_owner
        cdef int64_t off = lmq_load_acq(&self.reput_from)
        min_off = mfq.min_offset()
        if off < min_off:
            # retention removed what was not dispatched yet: jump forward (RocketMQ does the same)
            log.warning("reput offset %d is below the commit log min offset %d; jumping forward", off, min_off)
            self.jumped = True  # queues may miss the units of what was removed: their next records are not damaged
            lmq_store_rel(&self.reput_from, min_off)
            off = min_off
        seg = mfq.find(off)
        if seg is None:
            self._drop_segment()
            return 0
        if self.seg is seg and off >= self.seg_base + self.seg_size:
            return 0
        self.seg = <MappedFile>seg
        self.seg_addr = self.seg.addr
        self.seg_base = self.seg.file_from_offset
        self.seg_wrote = &self.seg.wrote_pos
        return 1

    cdef int _slow(self, int code) except -1:
        cdef RecordView *v = &self.pending
        cdef ConsumeQueue cq
        if code == R_NEED_SYNC or (code == R_NEED_SEGMENT and self.sync_view is not None):
            self.sync_view()  # maps what other processes committed, moves this view's positions
            return self._next_segment()
        if code == R_NEED_SEGMENT:
            return self._next_segment()
        if code == R_INSTALL:  # (before the record checks below: ``pending`` is not the record at reput_from here)
            return self._install_ready()
        if self.skip_offsets is not None:
            off = lmq_load_acq(&self.reput_from)
            if off in self.skip_offsets:
                # recovery found this record's header damaged (its queue's unit outvoted it): the queue it names
                # must not get it
                self.bad_records += 1
                lmq_store_rel(&self.reput_from, off + v.total_size)
                return 1
        topic = (<bytes>v.topic[:v.topic_len]).decode("utf-8", "replace")
        if code == R_NEED_CQ:
            cq = self.cq_factory(topic, v.queue_id)
            if cq is None:
                # a dispatcher that indexes one queue (queue_recovery.repair_queue): another queue's record
                self.duplicates += 1
                lmq_store_rel(&self.reput_from, lmq_load_acq(&self.reput_from) + v.total_size)
                return 1
            self.register(cq)
            # a new queue's first record: its unit waits for the maker from here, not after one more trip through
            # the loop and back (the checks the loop would make first: not already in the queue, no gap before it)
            if (lmq_load_acq(&self.reput_from) + v.total_size > cq.st.max_physic_offset
                    and v.queue_offset == cq.st.max_offset + cq.st.waiting):
                self._wait_for_file(cq, v)
            return 1
        cq = self.cq_factory(topic, v.queue_id)
        if cq.st.waiting > 0 and code == R_GAP:
            self._settle(cq)  # the gap is handled with the queue's units in its file
            return 1
        if code == R_NEED_CQ_FILE:
            if self.reserve_close_errno != 0:
                err, self.reserve_close_errno = self.reserve_close_errno, 0
                cq.cur._borrowed_close_error(err)  # the file's failed flush, raised
            if self._wait_for_file(cq, v):
                return 1
            if cq.st.waiting > 0:
                self._settle(cq)
                return 1
            cq.prepare_write(v.queue_offset)
            # here, on the dispatcher's thread with the GIL, other queues' write targets may be unmapped too
            cq.trim_mappings()
            return 1
        if code == R_GAP:
            off = lmq_load_acq(&self.reput_from)
            mx = cq.max_offset
            qo = v.queue_offset
            # the queue's records lie in the log in queue-offset order, each at least REC_MIN_SIZE bytes: no more of
            # them fit between the queue's last unit (or the log's start) and this record
            last_end = max(0, cq.max_physic_offset)
            if 0 <= self.gap_at < last_end <= self.gap_at + self.gap_size:
                # the queue's last unit is a lost unit of this very gap (its queue was cut there, or its files lost
                # after it): the gap's other lost messages lie in the gap too, not only after it
                last_end = self.gap_at
            room = (off - last_end) // REC_MIN_SIZE if mx > 0 else off // REC_MIN_SIZE
            # an empty queue (a new one, or one whose file a power cut lost) whose first record comes after a gap:
            # its missing first units may lie in the gap too, and are lost units, not padding that moves its start
            lost = self.gap_at if 0 <= self.gap_at and last_end <= self.gap_at else -1
            # Units go missing only where a gap record lies since the queue's last unit, where retention removed
            # records before they were dispatched (jumped), or before a queue's first unit; any other jump ahead is
            # a damaged QUEUEOFFSET (trusting it would index every later record of the queue one place off)
            if qo < mx or qo - mx > room or (qo > mx > 0 and lost < 0 and not self.jumped):
                # a queue offset no writer can have given it: its header is damaged (the body CRC does not cover
                # it). Indexed at the queue's next offset, where it lies; a get there reports the mismatch.
                self.bad_records += 1
                log.error("commit log offset %d: record of %s-%d claims queue offset %d, but the queue is at %d "
                          "(at most %d records fit before it): a damaged header; indexed at %d, where a get "
                          "raises CorruptMessageError", off, topic, v.queue_id, qo, mx, room, mx)
                qo = mx
            cq.put_unit(qo, off, v.total_size, tags_code_of(v, self.levels, self.n_levels), v.store_timestamp,
                        lost_at=lost, lost_size=self.gap_size if lost >= 0 else 0)
            self.dispatched += 1
            lmq_store_rel(&self.reput_from, off + v.total_size)
            return 1
        raise AssertionError(code)

    cdef bint _wait_for_file(self, ConsumeQueue cq, RecordView *v) except -1:
        """Keep the unit of ``v`` (at reput_from) in memory while the maker makes its new queue's first file, and
        step over the record. False when the queue has a file (or the file is made here: no maker, a shared store,
        recovery's dispatch, too many waiting units)."""
        cdef int64_t off, fs
        if self.maker is None or not self.in_service or cq.st.shared_max != NULL:
            return False
        if cq.st.waiting == 0:
            if cq.st.addr != NULL or v.queue_offset != cq.st.max_offset or cq.mapped_file_queue.last() is not None:
                return False
        elif cq.st.waiting >= WAITING_UNITS_MAX:
            return False
        off = lmq_load_acq(&self.reput_from)
        units = self.waiting_units.get(cq)
        if units is None:
            fs = cq.st.file_size
            if not self.maker.request(cq, v.queue_offset * CQ_UNIT_SIZE - (v.queue_offset * CQ_UNIT_SIZE) % fs):
                return False
            units = self.waiting_units[cq] = []
        units.append((v.queue_offset, off, v.total_size, tags_code_of(v, self.levels, self.n_levels),
                      v.store_timestamp))
        if len(units) == 1:
            self.waiting_order.append((cq, units))
        cq.st.waiting += 1
        if self.pending_from < 0:
            self.pending_store_ts = v.store_timestamp
            lmq_store_rel(&self.pending_from, off)  # before reput_from passes it (see reput_offset)
        self.dispatched += 1
        self._advance(v.total_size)
        return True

    cdef int _settle(self, ConsumeQueue cq, bint made=False) except -1:
        """Write the waiting units of ``cq`` into its first file, made by the maker (``made``: it said so) or, when it
        could not, here (OSError: the units keep waiting, and the loop retries as for any queue file)."""
        units = self.waiting_units.get(cq)
        if units is None:
            return 0
        if self.maker is not None and not made:
            self.maker.claim(cq)  # a file being made is waited for; a request not started is forgotten
        cq.prepare_write(units[0][0])
        for qo, phys, size, tags, ts in units:
            cq.put_unit(qo, phys, size, tags, ts)
        del self.waiting_units[cq]
        cq.st.waiting = 0
        # the queue that got its first waiting unit earliest holds the earliest waiting record (queues settled since
        # are dropped from the front; a queue may wait again later, with a new list)
        order = self.waiting_order
        while order and self.waiting_units.get(order[0][0]) is not order[0][1]:
            order.popleft()
        if order:
            first = order[0][1][0]
            self.pending_store_ts = first[4]
            lmq_store_rel(&self.pending_from, first[1])
        else:
            lmq_store_rel(&self.pending_from, -1)
            self.pending_store_ts = 0
        cq.trim_mappings()
        return 1

    cdef int _install_ready(self) except -1:
        """Write the units of every queue whose first file the maker reported, then wake waiters."""
        cdef ConsumeQueue cq
        cdef Py_ssize_t i
        with self.ready_lock:
            ready, self.ready = self.ready, []
            lmq_store_rel(&self.ready_flag, 0)
        for i in range(len(ready)):
            cq = ready[i]
            try:
                self._settle(cq, True)  # the maker is done with it
            except BaseException:
                with self.ready_lock:  # the rest are tried again with it
                    self.ready[:0] = ready[i:]
                    lmq_store_rel(&self.ready_flag, 1)
                raise
        if self.waiters > 0:
            with self.cond:
                self.cond.notify_all()
        return 1

    def run_until_caught_up(self, long long limit=-1):
        """Dispatch in the calling thread until every readable record (or up to ``limit``) is dispatched.

        Returns the number of units written. Raises CorruptFrameError on an invalid record.
        """
        cdef long long before = self.dispatched
        cdef int code
        while True:
            with nogil:  # pure C over the mapping
                code = self._run_nogil(1 << 30, False)
            if code in (R_CAUGHT_UP, R_PROGRESS, R_STOP):
                if code == R_PROGRESS:
                    continue
                return self.dispatched - before
            if code == R_BAD_RECORD:
                self._bad_record()
            if self._slow(code) == 0:
                return self.dispatched - before

    cdef int _bad_record(self) except -1:
        cdef long long off = lmq_load_acq(&self.reput_from)
        self.bad_records += 1
        name = RecordStatus.of(self.pending_rc)
        raise CorruptFrameError(f"dispatch found a {name} record at commit log offset {off}", offset=off,
                                path=self.seg.path if self.seg is not None else None)

    def run(self):
        """Thread body: dispatch until ``stop()``. Exceptions are stored in ``error`` (waiters raise them) and
        re-raised for the service thread to log."""
        cdef int code
        cdef int64_t wait_us
        self.in_service = True
        try:
            while not self.stop_flag:
                with nogil:  # walks the log, writes units and idles; never touches Python objects
                    code = self._run_nogil(4096 if self.waiters > 0 else (1 << 20), True)
                self.rounds += 1
                if code == R_STOP:
                    break
                if code == R_PROGRESS or code == R_CAUGHT_UP:
                    if self.waiters > 0:
                        with self.cond:
                            self.cond.notify_all()
                    continue
                if code == R_BAD_RECORD:
                    self._bad_record()
                try:
                    code = self._slow(code)
                except OSError as e:
                    # e.g. ENOSPC creating a ConsumeQueue file: nothing is lost (the record stays in the log and
                    # is dispatched again); retry until space returns, saying so once
                    if self.blocked is None:
                        log.error("dispatch blocked at commit log offset %d: %s; retrying every 100 ms",
                                  lmq_load_acq(&self.reput_from), e)
                    self.blocked = e
                    self.blocked_count += 1
                    if not self.paused and self.on_blocked is not None:
                        self.paused = True
                        self.on_blocked(e)
                    with nogil:  # back off; a put or close() wakes it early
                        lmq_event_wait(self.event, 100000)
                    continue
                if self.blocked is not None:
                    log.warning("dispatch resumed after: %s", self.blocked)
                    self.blocked = None
                if self.paused:
                    # the file it waited for exists now, and the record's unit is not written yet: puts are taken
                    # again before any waiter can see the dispatcher pass the record
                    self.paused = False
                    if self.on_blocked is not None:
                        self.on_blocked(None)
                if code == 0:
                    wait_us = self.idle_wait_us
                    with nogil:  # the next segment does not exist yet
                        lmq_event_wait(self.event, wait_us)
        except BaseException as e:
            self.error = e
            with self.cond:
                self.cond.notify_all()
            raise
        finally:
            self.in_service = False
            with self.cond:
                self.cond.notify_all()

    def stop(self):
        self.stop_flag = True
        lmq_event_signal(self.event)

    def reset_stop(self):
        self.stop_flag = False

    def wake(self):
        lmq_event_signal(self.event)
