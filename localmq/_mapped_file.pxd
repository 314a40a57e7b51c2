# MappedFile: a segment file (Mapping) with its writer's side: positions, appends, reservation, flushes.
from libc.stdint cimport int64_t, uint8_t, uint64_t

from localmq._mapping cimport Mapping

# What a writer without the GIL needs to reserve more blocks of a file whose descriptor is not kept (the dispatcher
# for its ConsumeQueue files): filled by MappedFile.nogil_reserve; path NULL when the file cannot be reserved so.
cdef struct NogilReserve:
    const char *path           # the file's name (bytes held by the MappedFile)
    uint64_t dev, ino          # the mapped inode: a name that now holds another is not reserved (ESTALE)
    int64_t *reserved          # the MappedFile's ``reserved``
    int64_t reserve_step, reserve_first, file_size

cdef int reserve_nogil(NogilReserve *r, int64_t end, int *stage) noexcept nogil


cdef class WriteBuffer:
    cdef uint8_t *addr
    cdef readonly int64_t size
    cdef readonly bint locked
    cdef public object lock_error


cdef class MappedFile(Mapping):
    cdef bytes path_b                 # the path, file-system encoded (NogilReserve.path)
    cdef int ensure_reserved(self, int64_t end) except -1
    cdef int nogil_reserve(self, NogilReserve *r) except -1
    cdef int reserve_range(self, int64_t start, int64_t end) except -1
    cdef int prepare_c(self, int64_t start, int64_t end) noexcept nogil
    cdef bint prepare_due(self, int64_t pos) noexcept nogil
    cdef int prepare_ahead_c(self, int64_t pos) noexcept nogil
