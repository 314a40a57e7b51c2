# cython: boundscheck=False, wraparound=False, cdivision=True
"""The commit protocol of a store shared between processes: repair, the topic table, the shared group commit."""
import logging

from libc.stdint cimport int64_t, uint32_t

from localmq._layout cimport (
    CTL_FILE_SIZE, CTL_FLUSH_REQ_EVENT_OFF, CTL_FLUSHED_EVENT_OFF, CTL_I_CELL, CTL_I_END, CTL_I_POS, CTL_I_QEND,
    CTL_I_QOFF, CTL_I_STATE, CTL_S_FLUSH_REQ, CTL_S_FLUSHED, CTL_S_REPAIRS, CTL_S_SYNC_ARRIVALS, CTL_S_SYNC_WANT,
    CTL_ROWS_OFF, CTL_S_WPOS, CTL_T_NAME_MAX,
)
from localmq._mapped_file cimport MappedFile
from localmq._native cimport raise_errno
from localmq._os cimport (
    lmq_fetch_add, lmq_load_acq, lmq_load_sc, lmq_set_timer_slack_ns, lmq_store_max, lmq_store_rel, lmq_store_sc,
)
from localmq._shm cimport (
    ControlFile, LMQ_SHM_ACQUIRED, LMQ_SHM_OWNER_DIED, WriteLock, lmq_shm_event_notify, lmq_shm_event_seq,
    lmq_shm_event_wait, lmq_shm_lock_acquire, lmq_shm_lock_consistent, lmq_shm_monotonic_ns, topic_row_add,
    topic_row_c,
)

from localmq._shm import OWNER_DIED as _OWNER_DIED
from localmq.errors import InvalidTopicError, StoreClosedError

log = logging.getLogger("localmq.commitlog")


cdef class SharedCommit:
    """A CommitLog's side of a store shared between processes (``CommitLog.attach_control``): the control file
    ``ctl``, its robust writer lock (taken after the put lock, for ``lock_timeout`` seconds at most), the repair of
    a put torn by a writer that died holding it (``repairs`` counts them), the shared topic table, and the
    housekeeper's SYNC_FLUSH group commit. The put path's steps are the inline functions of shared_commit.pxd."""

    def __cinit__(self, ControlFile ctl not None, object mapped_file_queue, double lock_timeout):
        self.ctl = ctl
        self.wlock = ctl.lock
        self.cb = ctl.addr
        self.lock_timeout = lock_timeout
        self.mapped_file_queue = mapped_file_queue
        self.sync_gather_permille = 500

    def committed_end(self):
        """The committed end: every record below it is complete and stays (a repair zeroes only bytes past it)."""
        return lmq_load_acq(<int64_t *>(self.cb + CTL_S_WPOS))

    cdef int take_over(self, int rc) except -1:
        # ctl_enter's contended path, out of line so that the inline fast path needs no Python temporaries (no
        # register spills per put); 1 when the lock came from a writer that died (repaired), else 0
        cdef WriteLock wl = self.wlock
        cdef bint died
        if rc == LMQ_SHM_OWNER_DIED:
            died = True
        else:
            wl.holds -= 1
            died = wl.acquire(self.lock_timeout) == _OWNER_DIED
        if died:
            try:
                self.repair()
            finally:
                lmq_shm_lock_consistent(wl.p)
            return 1
        return 0

    cdef int repair(self) except -1:
        """With the writer lock just taken over from a process that died holding it: undo its uncommitted put
        (zero the bytes it may have written, restore the queue's next offset) or finish its committed one. The
        caller re-syncs its view of the log (its end may move)."""
        cdef char *cb = self.cb
        cdef int64_t pos, end, cell, qoff, qend, w
        if lmq_load_acq(<int64_t *>(cb + CTL_I_STATE)) != 1:
            return 0
        pos = lmq_load_acq(<int64_t *>(cb + CTL_I_POS))
        end = lmq_load_acq(<int64_t *>(cb + CTL_I_END))
        cell = lmq_load_acq(<int64_t *>(cb + CTL_I_CELL))
        qoff = lmq_load_acq(<int64_t *>(cb + CTL_I_QOFF))
        qend = lmq_load_acq(<int64_t *>(cb + CTL_I_QEND))
        w = lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS))
        cell_ok = CTL_ROWS_OFF <= cell <= CTL_FILE_SIZE - 8 and cell % 8 == 0
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

    cdef char *topic_row(self, bytes encoded, bint *repaired) except NULL:
        """The row of the shared topic table of the topic ``encoded`` (adding it under the writer lock when this is
        the store's first put to the topic); ``repaired`` is set when a dead writer's put was repaired meanwhile."""
        cdef char *row = topic_row_c(self.cb, encoded)
        cdef WriteLock wl
        if len(encoded) > CTL_T_NAME_MAX:
            raise InvalidTopicError(f"topic of {len(encoded)} bytes: a store shared between processes holds "
                                    f"topic names of at most {CTL_T_NAME_MAX} bytes")
        if row != NULL:
            return row
        wl = self.wlock
        # the writer lock alone (no put lock: this runs before it): the row is added once across processes
        if wl.acquire(self.lock_timeout) == _OWNER_DIED:
            repaired[0] = True
            try:
                self.repair()
            finally:
                wl.consistent()
        try:
            row = topic_row_add(self.ctl, encoded)
        finally:
            wl.release()
        return row

    cdef int check_writer(self) except -1:
        """Take the writer lock if it is free and repair a put torn by a holder that died (the caller holds the put
        lock). Returns 1 when a repair was made; a live holder is left alone (0)."""
        cdef WriteLock wl = self.wlock
        cdef int rc = lmq_shm_lock_acquire(wl.p, 0)
        cdef int repaired = 0
        if rc == LMQ_SHM_ACQUIRED or rc == LMQ_SHM_OWNER_DIED:
            wl.holds += 1
            try:
                if rc == LMQ_SHM_OWNER_DIED:
                    try:
                        self.repair()
                        repaired = 1
                    finally:
                        lmq_shm_lock_consistent(wl.p)
            finally:
                ctl_exit(self)
        return repaired

    cdef bint wait_flushed(self, int64_t end, int64_t timeout_us) noexcept:
        # SYNC_FLUSH: ask the housekeeper's group commit (one fdatasync covers the puts of every process) and sleep
        # on the "flushed" eventcount until the flushed end covers ``end``; False after ``timeout_us``. The arrivals
        # counter lets the group commit gather a group: it is woken by the put that completes the group it wants
        # (CTL_S_SYNC_WANT), not by every put.
        cdef char *cb = self.cb
        cdef int64_t deadline = lmq_shm_monotonic_ns() + timeout_us * 1000, left
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
        return ok

    cdef object serve_flush(self, MappedFile mf, long long idle_us):
        """CommitLog.serve_shared_flush (its docstring says what it answers). Gathering: a flush waits until as
        many puts have asked as the previous flush covered (the threads it woke are back with their next put), but
        never longer than half an fdatasync (moving average) after the previous publish; a lone putter is flushed
        at once."""
        cdef char *cb = self.cb
        cdef int64_t base = mf.file_from_offset, size = mf.file_size
        cdef int64_t a_start, a0, w, end, rel, t_pub, t0, covered
        cdef int status = 0, err = 0, step
        cdef long long rounds = 0
        if mf.addr == NULL:
            raise StoreClosedError(f"mapped file {mf.path} is closed")
        if mf.sync_error != 0:  # an earlier flush of it failed: never retried, nothing is published
            raise_errno(mf.sync_error, mf.path, "flush (an earlier msync or fdatasync of this file failed; "
                                                "it is never retried)")
        mf.exports += 1  # keeps the mapping and its descriptor alive through the nogil loop
        try:
            with nogil:  # the loop waits on other processes' puts and on fdatasync; the housekeeper's threads run
                lmq_set_timer_slack_ns(1000)  # this thread's gathering waits are tens of microseconds
                a_start = lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS))
                t_pub = lmq_shm_monotonic_ns()
                while True:
                    if self.flush_stop:
                        status = -1
                        break
                    # 1. wait for a request: the first put that asks wakes us
                    step = self._await_request(a_start, idle_us)
                    if step == 1:
                        status = 1
                        break
                    if step == 2:
                        t_pub = lmq_shm_monotonic_ns()  # idle: the gathering window starts with this request
                        continue
                    # 2. gather: wait for as many requests as the last flush covered, at most ewma/2 after it
                    if self.sync_group > 1:
                        self._gather(a_start, t_pub)
                    # 3. flush what is committed in mf; every request counted in a0 lies below w
                    t0 = lmq_shm_monotonic_ns()
                    self.sync_gather_ns += t0 - t_pub
                    a0 = lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS))
                    w = lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS))
                    end = w if w < base + size else base + size
                    rel = end - base
                    if rel > mf.flushed_pos:
                        err = self._flush_to(mf, rel)
                        if err != 0:
                            break
                        rounds += 1
                    lmq_store_max(<int64_t *>(cb + CTL_S_FLUSHED), end)
                    lmq_shm_event_notify(cb + CTL_FLUSHED_EVENT_OFF)
                    t_pub = lmq_shm_monotonic_ns()
                    covered = a0 - a_start
                    a_start = a0
                    if covered >= 1:
                        self.sync_group = covered if covered < 4096 else 4096
                    # 4. keep the next MiB ahead of the log written once (zeros) and on disk: a fallocated range is
                    # "unwritten" to ext4/xfs, and the first fdatasync over each new page of it must also commit
                    # the extent conversion to the journal (measured here: 190 -> 120 us per group commit)
                    if mf.prepare_due(rel):
                        t0 = lmq_shm_monotonic_ns()
                        if mf.prepare_ahead_c(rel) != 0 and mf.sync_error != 0:
                            err = mf.sync_error  # its fdatasync failed (and consumed the file's error)
                            break
                        self.sync_prepare_ns += lmq_shm_monotonic_ns() - t0
                    if w >= base + size:
                        status = 0  # mf is flushed to its end: the caller moves on to the next segment
                        break
        finally:
            mf.unpin()
        if err != 0:
            raise_errno(err, mf.path, "fdatasync")
        return base + mf.flushed_pos, status, rounds

    cdef int _await_request(self, int64_t a_start, long long idle_us) noexcept nogil:
        # serve_flush's step 1: 0 when a put waits for a flush, 1 after idle_us without one, 2 when one came
        cdef char *cb = self.cb
        cdef uint32_t seen
        lmq_store_sc(<int64_t *>(cb + CTL_S_SYNC_WANT), a_start + 1)
        seen = lmq_shm_event_seq(cb + CTL_FLUSH_REQ_EVENT_OFF)
        if lmq_load_sc(<int64_t *>(cb + CTL_S_FLUSH_REQ)) > lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)):
            return 0
        if lmq_shm_event_wait(cb + CTL_FLUSH_REQ_EVENT_OFF, seen, idle_us) == 0:
            if lmq_load_sc(<int64_t *>(cb + CTL_S_FLUSH_REQ)) <= lmq_load_acq(<int64_t *>(cb + CTL_S_FLUSHED)):
                return 1
        return 2

    cdef void _gather(self, int64_t a_start, int64_t t_pub) noexcept nogil:
        # serve_flush's step 2: until sync_group requests arrived, at most sync_gather_permille of an fdatasync
        # after the last publish
        cdef char *cb = self.cb
        cdef int64_t want = a_start + self.sync_group, left
        cdef uint32_t seen
        lmq_store_sc(<int64_t *>(cb + CTL_S_SYNC_WANT), want)
        while not self.flush_stop:
            seen = lmq_shm_event_seq(cb + CTL_FLUSH_REQ_EVENT_OFF)
            if lmq_load_sc(<int64_t *>(cb + CTL_S_SYNC_ARRIVALS)) >= want:
                break
            left = (t_pub + self.sync_fsync_ns * self.sync_gather_permille // 1000 - lmq_shm_monotonic_ns()) // 1000
            if left <= 0:
                break
            lmq_shm_event_wait(cb + CTL_FLUSH_REQ_EVENT_OFF, seen, left)

    cdef int _flush_to(self, MappedFile mf, int64_t rel) noexcept nogil:
        # serve_flush's step 3: fdatasync mf (the file's sync lock: see GroupCommit.serve), its flushed position
        # moved to ``rel`` and the fdatasync average updated; the errno of a failed flush, else 0
        cdef int64_t t0 = lmq_shm_monotonic_ns(), now, ewma = self.sync_fsync_ns
        cdef int err = mf.sync_c(True, 0, 0)
        if err != 0:
            return err
        now = lmq_shm_monotonic_ns()
        self.sync_fsync_total_ns += now - t0
        ewma = (ewma * 7 + (now - t0)) // 8 if ewma > 0 else now - t0
        if ewma > 2000000:
            ewma = 2000000  # a stalled disk does not stretch the gathering window past 1 ms
        self.sync_fsync_ns = ewma
        mf.flushed_pos = rel
        lmq_store_max(&mf.wrote_pos, rel)
        self.sync_flushes += 1
        return 0
