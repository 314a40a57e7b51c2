# The commit protocol of a store shared between processes (ARCHITECTURE.md "Many processes, one store"): the put path's
# inline steps (writer lock, intent, commit) and SharedCommit, which holds the control file and does the rest (repair
# after a writer died, the topic table, the housekeeper's group commit). CommitLog (store/commit_log.pyx) calls them.
from libc.stdint cimport int64_t
from localmq._layout cimport (
    CTL_I_CELL, CTL_I_END, CTL_I_POS, CTL_I_QEND, CTL_I_QOFF, CTL_I_STATE, CTL_S_PUTS, CTL_S_WPOS,
)
from localmq._mapped_file cimport MappedFile
from localmq._os cimport lmq_load_acq, lmq_store_max, lmq_store_rel
from localmq._shm cimport ControlFile, LMQ_SHM_ACQUIRED, WriteLock, lmq_shm_lock_acquire, lmq_shm_lock_release


cdef class SharedCommit:
    cdef readonly ControlFile ctl
    cdef char *cb                     # ctl's mapping
    cdef WriteLock wlock              # ctl.lock (the put path's writer lock)
    cdef public double lock_timeout   # seconds a put waits for the writer lock before StoreBusyError
    cdef readonly long long repairs
    cdef object mapped_file_queue     # the log's segments (a repair zeroes a dead writer's bytes there)
    cdef volatile int flush_stop      # serve_flush returns at its next step
    cdef int64_t sync_group           # requests the last group commit covered (its next gathering target)
    cdef int64_t sync_fsync_ns        # moving average of the group commit's fdatasync
    cdef int64_t sync_fsync_total_ns  # time in its fdatasyncs
    cdef int64_t sync_flushes         # and their number
    cdef int64_t sync_gather_ns       # time from a publish (or an idle request) to the next flush
    cdef int64_t sync_gather_permille  # gathering window, thousandths of the fdatasync average
    cdef int64_t sync_prepare_ns      # time spent doing that
    cdef int take_over(self, int rc) except -1
    cdef int repair(self) except -1
    cdef char *topic_row(self, bytes encoded, bint *repaired) except NULL
    cdef int check_writer(self) except -1
    cdef bint wait_flushed(self, int64_t end, int64_t timeout_us) noexcept
    cdef object serve_flush(self, MappedFile mf, long long idle_us)
    cdef int _await_request(self, int64_t a_start, long long idle_us) noexcept nogil
    cdef void _gather(self, int64_t a_start, int64_t t_pub) noexcept nogil
    cdef int _flush_to(self, MappedFile mf, int64_t rel) noexcept nogil


cdef inline int ctl_enter(SharedCommit sc) except -1:
    """Take the shared writer lock (the caller holds this process's put lock). Uncontended: one trylock with the
    GIL held; else ``take_over`` waits without the GIL (StoreBusyError after lock_timeout). Returns 1 when a
    writer that died holding the lock was repaired (the caller's view of the log must re-sync), else 0."""
    cdef int rc = lmq_shm_lock_acquire(sc.wlock.p, 0)
    sc.wlock.holds += 1
    if rc == LMQ_SHM_ACQUIRED:
        return 0
    return sc.take_over(rc)


cdef inline void ctl_exit(SharedCommit sc) noexcept:
    lmq_shm_lock_release(sc.wlock.p)
    sc.wlock.holds -= 1


cdef inline bint view_follows(MappedFile mf, int64_t w, int64_t file_size) noexcept:
    """Under the writer lock: whether this process's write segment ``mf`` ends at the committed end ``w``. Another
    process committed since our last put when not; mostly within the segment we write: move its positions here
    (CAS max, as sync_to does) and leave new segments to the caller's Python path (False)."""
    cdef int64_t rel
    if mf is None:
        return False
    if mf.file_from_offset + mf.append_pos == w:
        return True
    rel = w - mf.file_from_offset
    if mf.wbuf == NULL and mf.append_pos < rel < file_size:
        lmq_store_max(&mf.append_pos, rel)
        lmq_store_max(&mf.committed_pos, rel)
        lmq_store_max(&mf.wrote_pos, rel)
    return mf.file_from_offset + mf.append_pos == w


cdef inline void ctl_intent(char *cb, int64_t w, int64_t *cell) noexcept:
    """Record the intent of the put that starts at the committed end ``w`` and advances the queue offset ``cell``
    (a cell of the control file's topic table): what a taker-over repairs if this process dies mid-put."""
    (<int64_t *>(cb + CTL_I_POS))[0] = w
    (<int64_t *>(cb + CTL_I_END))[0] = w
    (<int64_t *>(cb + CTL_I_CELL))[0] = <char *>cell - cb
    (<int64_t *>(cb + CTL_I_QOFF))[0] = cell[0]
    lmq_store_rel(<int64_t *>(cb + CTL_I_STATE), 1)


cdef inline void intent_end(char *cb, int64_t end) noexcept:
    # before writing bytes up to `end`: a taker-over zeroes up to here when the put did not commit
    if end > (<int64_t *>(cb + CTL_I_END))[0]:
        lmq_store_rel(<int64_t *>(cb + CTL_I_END), end)


cdef inline void ctl_commit(char *cb, int64_t qend, int64_t end) noexcept:
    """Publish every complete record up to ``end`` (the release store of the committed end is the commit point)
    with the queue's next offset ``qend``, then clear the intent."""
    (<int64_t *>(cb + CTL_I_QEND))[0] = qend
    if end > lmq_load_acq(<int64_t *>(cb + CTL_S_WPOS)):
        lmq_store_rel(<int64_t *>(cb + CTL_S_WPOS), end)
        (<int64_t *>(cb + CTL_S_PUTS))[0] += 1
    lmq_store_rel(<int64_t *>(cb + CTL_I_STATE), 0)
