"""Checked, GIL-free wrappers over the C helpers in csrc/ (mmap, msync, fdatasync, fallocate, mlock, madvise,
mincore)."""
import os

from libc.errno cimport errno
from libc.stdint cimport int64_t
from libc.string cimport strerror

from localmq.errors import store_io_error

from localmq._os cimport (
    LMQ_ADV_DONTNEED, LMQ_ADV_NORMAL, LMQ_ADV_RANDOM, LMQ_ADV_SEQUENTIAL, LMQ_ADV_WILLNEED,
    lmq_fallocate, lmq_fdatasync, lmq_mkdirs, lmq_ftruncate, lmq_madvise, lmq_map, lmq_mincore, lmq_mlock, lmq_msync,
    lmq_munlock, lmq_now_ms, lmq_page_size, lmq_populate_write, lmq_unmap, lmq_event_free,
    lmq_event_new,
)

ADV_NORMAL = LMQ_ADV_NORMAL
ADV_RANDOM = LMQ_ADV_RANDOM
ADV_SEQUENTIAL = LMQ_ADV_SEQUENTIAL
ADV_WILLNEED = LMQ_ADV_WILLNEED
ADV_DONTNEED = LMQ_ADV_DONTNEED
PAGE_SIZE = lmq_page_size()


cdef class Event:
    """A wake-up event in C (mutex + condition variable) that threads signal and wait on without the GIL: puts
    signal the dispatcher's. Passed between the compiled modules as this object, never as an address."""

    def __cinit__(self):
        self.ev = lmq_event_new()
        if self.ev == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.ev != NULL:
            lmq_event_free(self.ev)


cdef object raise_errno(int err, object path, str operation=None):
    """Raise the error of a failed system call on ``path``: a StoreIOError (an OSError; with ENOENT, EEXIST...
    also the matching FileNotFoundError, FileExistsError...) naming the file and ``operation``; OSError(err,
    strerror) when there is no file (anonymous memory). The caller read errno while the GIL was released."""
    msg = strerror(err).decode("utf-8", "replace")
    if path is None:
        raise OSError(err, msg)
    raise store_io_error(OSError(err, msg), operation or "I/O", os.fspath(path))


# Each wrapper: rc and errno are kept in C locals inside the nogil block (another thread may run Python
# code that changes errno as soon as the GIL is released again) and turned into OSError afterwards.

cdef int c_map(int fd, size_t length, bint writable, void **out, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # mmap may block on the page table lock of a busy process
        rc = lmq_map(fd, length, writable, out)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "mmap")
    return 0


cdef int c_unmap(void *addr, size_t length, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # munmap of a large dirty mapping can take milliseconds
        rc = lmq_unmap(addr, length)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "munmap")
    return 0


cdef int c_msync(void *addr, size_t off, size_t length, bint sync, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # msync(MS_SYNC) waits for the disk
        rc = lmq_msync(addr, off, length, sync)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "msync" if sync else "msync(MS_ASYNC)")
    return 0


cdef int c_fdatasync(int fd, bint full, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # waits for the disk
        rc = lmq_fdatasync(fd, full)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "fsync" if full else "fdatasync")
    return 0


cdef int c_fallocate(int fd, int64_t off, int64_t length, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # block reservation; on tmpfs this zeroes memory
        rc = lmq_fallocate(fd, off, length)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "fallocate")
    return 0


cdef int c_ftruncate(int fd, int64_t length, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # metadata update on the file system
        rc = lmq_ftruncate(fd, length)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "ftruncate")
    return 0


cdef int c_mlock(void *addr, size_t off, size_t length, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # mlock faults every page in
        rc = lmq_mlock(addr, off, length)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "mlock")
    return 0


cdef int c_munlock(void *addr, size_t off, size_t length, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # walks the page tables of the range
        rc = lmq_munlock(addr, off, length)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "munlock")
    return 0


cdef int c_madvise(void *addr, size_t off, size_t length, int advice, object path) except -1:
    cdef int rc, err = 0
    with nogil:  # WILLNEED starts read-ahead, DONTNEED drops pages
        rc = lmq_madvise(addr, off, length, advice)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "madvise")
    return 0


cdef size_t c_mincore(void *addr, size_t off, size_t length, object path) except? 0:
    cdef int rc, err = 0
    cdef size_t resident = 0
    with nogil:  # walks the page tables of the range
        rc = lmq_mincore(addr, off, length, &resident)
        if rc != 0:
            err = errno
    if rc != 0:
        raise_errno(err, path, "mincore")
    return resident


cdef int c_populate_write(void *addr, size_t off, size_t length) noexcept nogil:
    """MADV_POPULATE_WRITE; returns 0, or the errno (the caller, already without the GIL, decides)."""
    cdef int rc = lmq_populate_write(addr, off, length)
    return 0 if rc == 0 else errno


def fdatasync(fd, *, full=False, path=None):
    """fdatasync (or fsync when ``full``) a file descriptor with the GIL released.

    Raises StoreIOError (an OSError: errno, strerror, path) on failure.
    """
    c_fdatasync(fd, full, path)


def fsync_dir(path):
    """fsync a directory so that a file created, renamed or deleted in it survives a power loss.

    Raises StoreIOError (an OSError naming the directory) when it cannot be opened or synced.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise store_io_error(e, "open", path) from None
    try:
        c_fdatasync(fd, True, path)
    finally:
        os.close(fd)


def mkdirs(path):
    """``os.makedirs(path, exist_ok=True)`` in one call without the GIL (a background thread would wait to take it
    back after each of its stat and mkdir calls). Returns (missing, made): how many levels of ``path`` were missing
    (the last ones) and how many of them it made, from the highest down. Raises StoreIOError (mkdir) naming ``path``,
    its ``made`` attribute that pair."""
    cdef bytes b = os.fsencode(path)
    cdef const char *p = b
    cdef int rc, made = 0, missing = 0, err = 0
    with nogil:  # stat and mkdir calls
        rc = lmq_mkdirs(p, &made, &missing)
        if rc < 0:
            err = errno
    if rc < 0:
        e = store_io_error(OSError(err, strerror(err).decode("utf-8", "replace")), "mkdir", os.fspath(path))
        e.made = (missing, made)
        raise e
    return missing, made


def fallocate(fd, offset, length, *, path=None):
    """Reserve the blocks of [offset, offset+length) of ``fd`` (posix_fallocate).

    Raises OSError(ENOSPC / EFBIG, ...) when the file system cannot reserve them.
    """
    c_fallocate(fd, offset, length, path)


def now_ms():
    """Wall-clock milliseconds since the epoch (CLOCK_REALTIME)."""
    return lmq_now_ms()
