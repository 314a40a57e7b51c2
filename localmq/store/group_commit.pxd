# GroupCommit: the SYNC_FLUSH rendezvous (lmq_gc) between putting threads and the GroupCommitService.
from libc.stdint cimport int64_t
from localmq._os cimport lmq_gc

cdef class GroupCommit:
    cdef lmq_gc *gc
    cdef int wait_c(self, int64_t target, int64_t timeout_us) noexcept nogil
