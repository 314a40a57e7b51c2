# Checked wrappers over csrc/: each drops the GIL around its syscall and raises StoreIOError (an OSError) after.
from libc.stdint cimport int64_t

from localmq._os cimport lmq_event


cdef class Event:
    cdef lmq_event *ev


cdef int c_map(int fd, size_t length, bint writable, void **out, object path) except -1
cdef int c_unmap(void *addr, size_t length, object path) except -1
cdef int c_msync(void *addr, size_t off, size_t length, bint sync, object path) except -1
cdef int c_fdatasync(int fd, bint full, object path) except -1
cdef int c_fallocate(int fd, int64_t off, int64_t length, object path) except -1
cdef int c_ftruncate(int fd, int64_t length, object path) except -1
cdef int c_mlock(void *addr, size_t off, size_t length, object path) except -1
cdef int c_munlock(void *addr, size_t off, size_t length, object path) except -1
cdef int c_madvise(void *addr, size_t off, size_t length, int advice, object path) except -1
cdef int c_populate_write(void *addr, size_t off, size_t length) noexcept nogil
cdef size_t c_mincore(void *addr, size_t off, size_t length, object path) except? 0
cdef object raise_errno(int err, object path, str operation=*)
