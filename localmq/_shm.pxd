# Multi-process primitives on the control file (csrc/lmq_shm.h): the cdef extern block for lmq_shm.h (all nogil;
# kept beside its only user rather than in _os.pxd) and the classes of _shm.pyx.
from libc.stdint cimport int32_t, int64_t, uint32_t

cdef extern from "lmq_shm.h" nogil:
    enum:
        LMQ_SHM_LOCK_BYTES
        LMQ_SHM_EVENT_BYTES
        LMQ_SHM_ACQUIRED
        LMQ_SHM_OWNER_DIED
        LMQ_SHM_TIMED_OUT
        LMQ_SHM_NOT_RECOVERABLE
    size_t lmq_shm_lock_size()
    int lmq_shm_lock_init(void *p)
    int lmq_shm_lock_acquire(void *p, int64_t timeout_us)
    int lmq_shm_lock_consistent(void *p)
    int lmq_shm_lock_release(void *p)
    int32_t lmq_shm_lock_owner(const void *p)
    int32_t lmq_shm_lock_owner_tid(const void *p)
    uint32_t lmq_shm_lock_recoveries(const void *p)
    void lmq_shm_event_init(void *p)
    uint32_t lmq_shm_event_seq(const void *p)
    int lmq_shm_event_has_waiters(const void *p)
    int lmq_shm_event_notify(void *p)
    int lmq_shm_event_wait(void *p, uint32_t seen, int64_t timeout_us)
    int lmq_shm_slot_claim(int fd, int64_t base, int count)
    int lmq_shm_slot_release(int fd, int64_t base, int slot)
    int lmq_shm_slot_held(int fd, int64_t base, int slot, int32_t *pid)
    int lmq_shm_range_lock(int fd, int64_t off, int64_t length, int kind)
    int32_t lmq_shm_pid()
    int64_t lmq_shm_monotonic_ns()
    uint32_t lmq_shm_load_u32_acq(const void *p)
    void lmq_shm_store_u32_rel(void *p, uint32_t v)


cdef class ControlFile:
    cdef readonly object path
    cdef readonly bint initialised      # this process initialised the file (it was the first to attach)
    cdef readonly WriteLock lock
    cdef readonly WriteLock group_lock   # guards the clients' table (consumer groups, committed offsets)
    cdef readonly EventCount events
    cdef readonly EventCount dispatched_events
    cdef readonly EventCount flushed_events     # SYNC_FLUSH puts wait here for the group commit
    cdef readonly EventCount flush_requests     # the housekeeper's group commit waits here for requests
    cdef readonly Slots slots
    cdef char *addr
    cdef int fd
    cdef object key                     # (st_dev, st_ino) in the per-process registry
    cdef int busy                       # calls in flight without the GIL (close refuses while > 0)
    cdef bint inherited                 # in a forked child: the parent's object (its descriptor is forgotten)
    cdef object __weakref__

    cdef int _check(self) except -1
    cdef int _open(self, double timeout) except -1
    cdef int _initialise(self) except -1
    cdef long long _row(self, str topic, bint create, int64_t reserved) except -2


cdef char *topic_row_c(char *base, bytes name) noexcept
cdef char *topic_row_add(ControlFile ctl, bytes name, int64_t reserved=*) except NULL


cdef class WriteLock:
    cdef ControlFile ctl
    cdef void *p
    cdef int holds                      # acquisitions by this process not yet released
    cdef int _owner(self) except? -1


cdef class EventCount:
    cdef ControlFile ctl
    cdef void *p


cdef class Slots:
    cdef ControlFile ctl
    cdef int mine_slot
    cdef int32_t mine_pid               # the process that claimed mine_slot (a forked child holds nothing)
