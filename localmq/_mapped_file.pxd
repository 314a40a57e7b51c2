# MappedFile: a segment file (Mapping) with its writer's side: positions, appends, reservation, flushes.
from libc.stdint cimport int64_t, uint8_t

from localmq._mapping cimport Mapping

cdef class WriteBuffer:
    cdef uint8_t *addr
    cdef readonly int64_t size
    cdef readonly bint locked
    cdef public object lock_error


cdef class MappedFile(Mapping):
    cdef int ensure_reserved(self, int64_t end) except -1
    cdef int reserve_range(self, int64_t start, int64_t end) except -1
    cdef int prepare_c(self, int64_t start, int64_t end) noexcept nogil
    cdef bint prepare_due(self, int64_t pos) noexcept nogil
    cdef int prepare_ahead_c(self, int64_t pos) noexcept nogil
