# cython: boundscheck=False, wraparound=False, cdivision=True
"""Mapping: one fixed-size segment file mapped MAP_SHARED: its creation (sized, reserved, named only once whole), the
mapping under a ``MappingBudget`` (evicted and mapped again), reference-counted zero-copy reads and its lifetime
(close, destroy). ``MappedFile`` (``_mapped_file``) adds the writer's side: positions, appends, reservation ahead,
flushes."""
import logging
import os
import errno as _errno  # the name errno is libc's (cimported below)
import time

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from cpython.pythread cimport (
    WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_release_lock,
)
from libc.errno cimport errno
from libc.stdint cimport int64_t, uint8_t

from localmq._layout cimport FILE_NAME_DIGITS
from localmq._native cimport c_fallocate, c_fdatasync, c_ftruncate, c_madvise, c_map, c_munlock, c_unmap, raise_errno
from localmq._os cimport (
    LMQ_ADV_RANDOM, LMQ_CR_ADVISE_RANDOM, LMQ_CR_CLOSE, LMQ_CR_FALLBACK, LMQ_CR_FALLOCATE, LMQ_CR_FDATASYNC,
    LMQ_CR_FSTAT, LMQ_CR_FTRUNCATE, LMQ_CR_LINK, LMQ_CR_MMAP, LMQ_CR_POPULATE_FIRST, lmq_create_mapped, lmq_created,
    lmq_fdatasync, lmq_is_zero, lmq_load_acq, lmq_msync, lmq_populate_write,
)

from localmq.errors import CorruptStoreError, StoreClosedError, UnsafePathError, io_operation, store_io_error

# the call of lmq_create_mapped that failed, as the StoreIOError names it (MappedFile._create_mapped)
_CREATE_STAGES = {
    LMQ_CR_FTRUNCATE: "ftruncate", LMQ_CR_FALLOCATE: "fallocate", LMQ_CR_FDATASYNC: "fdatasync", LMQ_CR_LINK: "link",
    LMQ_CR_FSTAT: "fstat", LMQ_CR_MMAP: "mmap",
}

log = logging.getLogger("localmq.mapped_file")

_HAVE_SEEK_DATA = hasattr(os, "SEEK_DATA")

cdef class MappingBudget:
    """At most ``limit`` of the files that share this budget stay mapped: the least recently used beyond it are
    unmapped (``MappedFile.evict``) and mapped again when next used. A store's ConsumeQueue files share one, so that
    the mappings a store holds (and the RSS of idle queues) are bounded by a setting, not by its queue count.

    Eviction is by batches: when a file is mapped past the limit, the least recently used files are unmapped until an
    eighth of the limit is free, so that sorting by last use is paid once per ``limit // 8`` mappings. A file is not
    evicted while anything holds its mapping (an export: a numpy view, a flush in progress; a reader reference) or
    while a dispatcher writes it without the GIL (``owner``; only ``trim(evict_current=True)`` on the dispatcher's own
    thread, or before it runs, takes those). Everything here runs with the GIL held.
    """

    def __cinit__(self, int limit):
        if limit < 16:
            raise ValueError("a mapping budget needs at least 16 files")
        self.limit = limit
        self.clock = 1
        self.live = set()
        self.evictions = 0
        self.remaps = 0

    cdef int admit(self, Mapping mf, bint advised=False) except -1:
        if mf.budget is None:
            mf.budget = self
        if mf.addr != NULL and not advised:
            # no read-around: a fault on a queue file (20-byte units, mostly one page in use) would otherwise read
            # 128 KiB around it into the page cache (zeros, for a sparse file) and map 16 pages of it, 64 KiB of RSS
            # per idle queue
            try:
                c_madvise(mf.addr, 0, mf.file_size, LMQ_ADV_RANDOM, mf.path)
            except OSError:
                pass
        mf.touch()
        self.live.add(mf)
        if len(self.live) > self.limit:
            self.trim(False, mf)
        return 0

    cpdef int trim(self, bint evict_current=False, Mapping keep=None) except -1:
        """Unmap least recently used files until at most 7/8 of ``limit`` are mapped (when more than ``limit`` are).
        ``evict_current``: also files a dispatcher writes through a raw pointer (their owner drops it first); only
        the thread that runs that dispatcher, or code that runs before it starts, may ask it. ``keep`` is never
        evicted (the file its caller is about to use). Returns how many were unmapped; a file whose eviction fails
        (its owner could not sync its position) stays mapped and the error is logged."""
        cdef Mapping mf
        cdef Py_ssize_t target = self.limit - self.limit // 8
        cdef int n = 0
        if len(self.live) <= self.limit:
            return 0
        for mf in sorted(self.live, key=_last_use):
            if len(self.live) <= target:
                break
            if mf is keep or mf.addr == NULL:
                continue
            if mf.owner is not None:
                if not evict_current:
                    continue
                mf.owner.drop_write_target(mf)
                if mf.owner is not None:
                    continue
            if mf.evict():
                n += 1
        return n

    @property
    def mapped(self):
        """How many files of this budget are mapped now."""
        return len(self.live)


def _last_use(Mapping mf):
    return mf.last_use


cdef class Mapping:
    """One segment file of exactly ``file_size`` bytes mapped shared, named by its base offset (the base of
    ``MappedFile``, which every store file is; see there for the writer's side).

    Creating a file reserves its blocks (posix_fallocate) so writes through the mapping never SIGBUS on a full
    disk; ENOSPC / EFBIG surface here as OSError. With ``reserve_step`` > 0 a new file is created sparse and only
    its first ``reserve_step`` bytes are reserved (the writer reserves the rest step by step).

    Reads are zero-copy: ``view(pos, size)`` (or ``memoryview(mf)``) exports the mapping; while any export is
    alive the mapping is never unmapped, ``close()``/``destroy()`` defer it to the release of the last export.

    ``keep_fd=False`` closes the file's descriptor once it is mapped (ConsumeQueue files: a store holds one per
    queue). Flushes then go through the mapping (msync, also for ``fsync``), and a reservation or a hole lookup
    opens the file for that call only, refusing a path that no longer names the mapped inode (StoreIOError ESTALE).
    ``sync_size=False`` leaves a new file's size to the owner to make durable (an fdatasync) before its name.
    ``map_now=False`` (an existing file of a ``budget``) checks the file and leaves it unmapped until its first use;
    ``file_id`` ((st_dev, st_ino) of a stat the caller just made and checked the size of) spares that check.
    """

    def __cinit__(self, path, long long file_size, long long file_from_offset=-1, *, bint create=True,
                  bint reserve=True, bint writable=True, long long reserve_step=0, bint keep_fd=True,
                  bint sync_size=True, MappingBudget budget=None, long long reserve_first=0, bint map_now=True,
                  tuple file_id=None, bint populate_first=False):
        cdef void *p = NULL
        self.fd = -1
        self.keeps_fd = keep_fd
        self.sync_size = sync_size
        self.addr = NULL
        # the file's own reference; positions, wbuf and the rest start zeroed (a cdef class is allocated zeroed)
        self.refs = 1
        self.available = True
        self.sync_lock = PyThread_allocate_lock()
        if self.sync_lock == NULL:
            raise MemoryError()
        self.path = os.fspath(path)
        if file_size <= 0:
            raise ValueError("file_size must be positive")
        self.file_size = file_size
        if file_from_offset < 0:
            name = os.path.basename(self.path)
            if len(name) != FILE_NAME_DIGITS or not (name.isascii() and name.isdigit()):
                raise ValueError(f"cannot derive a base offset from file name {name!r}")
            file_from_offset = int(name)
        self.file_from_offset = file_from_offset
        self.writable = writable
        if reserve_step < 0:
            raise ValueError("reserve_step must not be negative")
        self.reserve_step = reserve_step if reserve else 0
        self.reserve_first = reserve_first
        # an existing file: its blocks are reserved as far as it was written (and beyond: ensure_reserved asks
        # again, which costs nothing where blocks exist); a file created without reservation has none
        self.reserved = file_size if (reserve and reserve_step == 0) else 0
        flags = os.O_RDWR if writable else os.O_RDONLY
        if not map_now:
            self._defer(budget, keep_fd, create, file_id)
            return
        if budget is not None and keep_fd:
            raise ValueError("a file with a mapping budget keeps no descriptor (keep_fd=False)")
        if create and writable and self._create_mapped(reserve, reserve_step, keep_fd, budget is not None,
                                                       populate_first):
            if budget is not None:
                budget.admit(self, True)
            return
        existed = os.path.exists(self.path)
        if not existed and not create:
            raise FileNotFoundError(2, "No such file", self.path)
        # (a new file is made sized before it is named by _create_mapped above where the file system has O_TMPFILE;
        # here, where it has not, or when the name exists, it is opened by name)
        if create and writable:
            flags |= os.O_CREAT
        if writable:
            flags |= os.O_NOFOLLOW  # never written through a link, even one planted while the store runs
        try:
            fd = os.open(self.path, flags | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == _errno.ELOOP and writable:
                raise UnsafePathError(f"{self.path} is a symlink, which localmq never writes through",
                                      path=self.path) from e
            raise store_io_error(e, "open", self.path) from e
        self.fd = fd
        try:
            with io_operation("fstat", self.path):
                stat = os.fstat(fd)
            size = stat.st_size
            self.file_id = (stat.st_dev, stat.st_ino)
            if size == 0 and writable and (create or reserve):
                # a new file (where O_TMPFILE is not supported), or one whose creation was interrupted before it
                # was sized
                self._size_new(fd, reserve, reserve_step)
            elif size != file_size:
                raise CorruptStoreError(
                    f"{self.path} is {size} bytes, expected {file_size} (mapped file size setting)")
            c_map(fd, <size_t>file_size, writable, &p, self.path)
        except BaseException:
            os.close(fd)
            self.fd = -1
            if not existed and create:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            raise
        self.addr = <uint8_t *>p
        if not existed and create and populate_first and self.reserved > 0:
            with nogil:  # a hint, as _create_mapped gives it: the first reserved page faulted in writable
                lmq_populate_write(p, 0, <size_t>min(self.reserved, 4096))
        if not keep_fd:
            # the mapping holds the open file description: msync and write-back go on without the descriptor. A
            # new file's size was made durable above (_size_new) or is its owner's to sync (sync_size=False): a
            # write-back error of it would reach the owner's fdatasync or the next msync
            self.fd = -1
            try:
                os.close(fd)
            except OSError as e:  # Linux releases the descriptor even then
                raise store_io_error(e, "close", self.path) from e
        if budget is not None:
            budget.admit(self)

    cdef int _defer(self, MappingBudget budget, bint keep_fd, bint create, tuple file_id) except -1:
        """``map_now=False``: an existing file of ``budget`` is checked (its size, by one stat of its name) and left
        unmapped, as an evicted file is, until ensure_mapped maps it on first use: a store of more queues than its
        budget maps would otherwise open and map every file at open only to unmap most of them again."""
        if budget is None or keep_fd or create:
            raise ValueError("map_now=False is for an existing file (create=False) of a budget (keep_fd=False)")
        if file_id is not None:  # the caller's stat: the size checked there (a queue snapshot's restore)
            self.file_id = file_id
            self.budget = budget
            self.evicted = True
            return 0
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise  # as for map_now=True with create=False
        except OSError as e:
            raise store_io_error(e, "stat", self.path) from e
        if stat.st_size != self.file_size:
            raise CorruptStoreError(
                f"{self.path} is {stat.st_size} bytes, expected {self.file_size} (mapped file size setting)")
        self.file_id = (stat.st_dev, stat.st_ino)
        self.budget = budget
        self.evicted = True
        return 0

    cdef int _reopen(self) except -1:
        """A new descriptor of the mapped file, for one call of a file mapped with keep_fd=False; the caller closes
        it. Raises StoreClosedError when the file is closed, StoreIOError when the open fails or when the path now
        names another inode than the mapped one (ESTALE: the file was deleted and another took its name)."""
        if not (self.evicted and self.available):
            self._check_open()
        return self._open_same()

    cdef int _open_same(self) except -1:
        # a descriptor of the path, checked to be the inode that was mapped (see _reopen)
        with io_operation("open", self.path):
            fd = os.open(self.path, (os.O_RDWR if self.writable else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            with io_operation("fstat", self.path):
                stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) != self.file_id:
                raise store_io_error(_errno.ESTALE, "open (the name no longer holds the mapped file)", self.path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    cdef int _close_borrowed(self, int fd) except -1:
        """Close a descriptor from ``_reopen``. A close can report a failed write-back of the file (FUSE and NFS write
        dirty pages back on close): that is a failed flush of this file, kept in ``sync_error`` and never retried
        into a success. An msync through the mapping's own file description first takes the kernel's record of the
        error (Linux reports it once per open file), as the flush that would have met it did when the file kept its
        descriptor; a later opener of the file then does not meet it again. Raises StoreIOError (close)."""
        try:
            os.close(fd)
        except OSError as e:  # Linux released the descriptor anyway
            self._borrowed_close_error(e.errno or _errno.EIO)
        return 0

    cdef int _borrowed_close_error(self, int err) except -1:
        # a failed close of a borrowed descriptor (_close_borrowed, or one a nogil caller opened): kept as the file's
        # failed flush, then raised
        if self.addr != NULL and not self.unmap_pending:
            self.exports += 1
            try:
                with nogil:  # waits for the disk
                    self.sync_c(True, 0, 0)
            finally:
                self.unpin()
        with nogil:  # sync_lock is held only by nogil code
            PyThread_acquire_lock(self.sync_lock, WAIT_LOCK)
            if self.sync_error == 0:
                self.sync_error = err
            PyThread_release_lock(self.sync_lock)
        raise store_io_error(err, "close", self.path)

    cdef int _size_new(self, int fd, bint reserve, long long reserve_step) except -1:
        """Give a new, empty file its size: reserved whole, or sparse with the first step reserved; then make the
        size durable (fdatasync) before the caller makes the name durable (linkat + fsync of the directory). Without
        it a power cut could keep the name of a segment created ahead and lose its size: a 0-byte segment before
        the last one, which load() refuses (tests/test_power_loss.py); and a later flush that fails cannot leave the
        file shorter than its segment size on disk, only with zeros where its data did not get written."""
        if reserve and reserve_step == 0:
            c_fallocate(fd, 0, self.file_size, self.path)
        else:
            c_ftruncate(fd, self.file_size, self.path)
            if reserve:
                self.reserved = self._first_reserve(reserve_step)
                c_fallocate(fd, 0, self.reserved, self.path)
        if self.sync_size:
            c_fdatasync(fd, False, self.path)
        return 0

    cdef int64_t _first_reserve(self, long long reserve_step) noexcept:
        # a new sparse file's first reservation: reserve_first (ConsumeQueue files: a page), so that a queue that gets
        # one message costs one block, and the steps then double up to reserve_step (ensure_reserved)
        return min(self.file_size, reserve_step, self.reserve_first or reserve_step)

    cdef int _create_mapped(self, bint reserve, long long reserve_step, bint keep_fd, bint advise,
                            bint populate_first) except -1:
        """A new file made sized before it is named (an unnamed O_TMPFILE inode sized, reserved, its size synced when
        ``sync_size``, linked, mapped, its descriptor closed unless ``keep_fd``), in one call
        without the GIL: a background thread (the allocator, the QueueFileMaker) waits to take the GIL back after
        each call that releases it, up to the 5 ms switch interval while another thread runs Python (the producer),
        and a file made call by call released it a dozen times. ``advise``: the mapping is advised MADV_RANDOM, as
        ``MappingBudget.admit`` does. ``populate_first``: its first reserved page is faulted in writable (a new
        queue's file made ahead: the first unit's write would otherwise wait for the file system's page fault, a
        journal handle for the unwritten extent, on the dispatcher's thread). Returns 1 when made, 0 when it was not (no
        O_TMPFILE, the name exists): the caller then takes the path by name. Raises StoreIOError naming the call that
        failed, with nothing left behind (a failed close: the file is made and mapped, the error raised)."""
        cdef lmq_created out
        cdef int rc, err = 0
        cdef int64_t res = 0
        if reserve and reserve_step == 0:
            res = -1
        elif reserve:
            res = self._first_reserve(reserve_step)
        cdef bytes directory = os.fsencode(os.path.dirname(self.path) or "."), path = os.fsencode(self.path)
        cdef const char *dp = directory
        cdef const char *pp = path
        cdef int flags = (LMQ_CR_ADVISE_RANDOM if advise else 0) | (LMQ_CR_POPULATE_FIRST if populate_first else 0)
        with nogil:  # the whole creation: directory entry, size, blocks, mapping
            rc = lmq_create_mapped(dp, pp, self.file_size, res, self.sync_size, keep_fd, flags, &out)
            if rc != 0:
                err = errno
        if rc != 0 and out.stage == LMQ_CR_FALLBACK:
            return 0
        if rc != 0 and out.stage != LMQ_CR_CLOSE:
            raise_errno(err, self.path, _CREATE_STAGES[out.stage])
        if res > 0:
            self.reserved = res
        self.file_id = (out.dev, out.ino)
        self.addr = <uint8_t *>out.addr
        self.fd = out.fd
        if rc != 0:
            raise_errno(err, self.path, "close")  # mapped: __dealloc__ unmaps it
        return 1

    def __dealloc__(self):
        if self.addr != NULL and self.exports == 0:
            c_unmap(self.addr, <size_t>self.file_size, self.path)
            self.addr = NULL
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.sync_lock != NULL:
            PyThread_free_lock(self.sync_lock)
            self.sync_lock = NULL

    cdef int sync_c(self, bint data_sync, int64_t off, int64_t length) noexcept nogil:
        """fdatasync the file (``data_sync``) or msync(MS_SYNC) [off, off + length) of the mapping, under
        ``sync_lock``: 0, or the errno of this sync or of an earlier one that failed (``sync_error``, set here
        before the lock is released, so no other sync of the file can meanwhile take the reported error's place
        for a success). A file without its descriptor (keep_fd=False) is fdatasynced by an msync(MS_SYNC) of the
        whole mapping: Linux runs the same range sync (vfs_fsync_range, datasync) on the file description the
        mapping holds, which has seen every write-back error since the file was opened; a descriptor opened later
        might not report an error the kernel already reported elsewhere."""
        cdef int rc, err = 0
        PyThread_acquire_lock(self.sync_lock, WAIT_LOCK)
        if self.sync_error != 0:
            err = self.sync_error
        elif data_sync and self.fd < 0:
            rc = lmq_msync(self.addr, 0, <size_t>self.file_size, 1)
            if rc != 0:
                err = errno
                self.sync_error = err
        else:
            rc = lmq_fdatasync(self.fd, 0) if data_sync else lmq_msync(self.addr, <size_t>off, <size_t>length, 1)
            if rc != 0:
                err = errno
                self.sync_error = err
        PyThread_release_lock(self.sync_lock)
        return err

    cdef int unpin(self) except -1:
        # the end of an export taken for a nogil section (exports += 1): the unmap that close() deferred runs now
        self.exports -= 1
        if self.exports == 0 and self.unmap_pending:
            self._do_unmap()
        return 0

    cdef int _check_open(self) except -1:
        if self.addr == NULL and self.evicted:
            self.ensure_mapped()
        if self.addr == NULL or self.unmap_pending:
            raise StoreClosedError(f"mapped file {self.path} is closed")
        return 0

    cdef int ensure_mapped(self) except -1:
        """Map again a file its budget evicted (a no-op for a mapped one; the file counts as used now). Returns 1,
        or 0 when the file is gone: its name was deleted (another process's retention of a shared store) or names
        another file now; it is then closed (``addr`` stays NULL), as a file retention deleted under a reader is.
        Raises StoreClosedError for a closed file, StoreIOError when the open or map fails (ENOMEM:
        vm.max_map_count)."""
        cdef void *p
        # every call below that releases the GIL (open, mmap, close, munmap) lets other threads map, evict or close
        # this file meanwhile: the state is looked at again after each of them, and the loop ends only when the file
        # is mapped at the moment of returning, with the GIL held (the caller takes its reference before releasing it)
        while True:
            if self.addr != NULL:
                self.touch()
                return 1
            if not self.evicted or not self.available:
                raise StoreClosedError(f"mapped file {self.path} is closed")
            try:
                fd = self._open_same()
            except OSError as e:
                if e.errno not in (_errno.ENOENT, _errno.ESTALE):
                    raise
                if self.addr != NULL or not self.evicted:
                    continue  # mapped (or closed) by another thread meanwhile: judged again above
                self.evicted = False
                self.available = False
                return 0
            p = NULL
            try:
                c_map(fd, <size_t>self.file_size, self.writable, &p, self.path)
            except BaseException:
                os.close(fd)
                raise
            if self.addr != NULL or not self.evicted or not self.available:
                # another thread mapped the file (or closed it) while this one did: this mapping is not needed, and
                # kept it would leak (nothing would ever unmap it)
                try:
                    c_unmap(p, <size_t>self.file_size, self.path)
                finally:
                    self._close_borrowed(fd)
                continue
            self.addr = <uint8_t *>p
            self.evicted = False
            self.budget.remaps += 1
            self.budget.admit(self)
            self._close_borrowed(fd)

    def evict(self):
        """Unmap the file to save a mapping, keeping its state (positions, reservation, flush error); it is mapped
        again on its next use. Only a file of a budget with nothing holding its mapping (no export, no reader
        reference, no dispatcher writing it: ``owner``) is evicted. Its dirty pages stay in the page cache, where a
        later ``flush``/``fsync`` makes them durable through a descriptor. Returns True when unmapped."""
        if (self.budget is None or self.addr == NULL or self.unmap_pending or not self.available or self.keeps_fd
                or self.exports > 0 or self.refs != 1 or self.wbuf != NULL or self.locked or self.owner is not None):
            return False
        self.evicted = True
        self.budget.evictions += 1
        self._do_unmap()
        return True

    cdef int _sync_unmapped(self) except -1:
        """fdatasync an evicted file through a descriptor opened for the call. Its failure is kept in ``sync_error``
        (never retried into a success), as a failed msync's is. Raises StoreIOError."""
        cdef int err = 0, rc
        cdef int fd = self._open_same()
        try:
            with nogil:  # sync_lock is held only by nogil code; the fdatasync waits for the disk
                PyThread_acquire_lock(self.sync_lock, WAIT_LOCK)
                if self.sync_error != 0:
                    err = self.sync_error
                else:
                    rc = lmq_fdatasync(fd, 0)
                    if rc != 0:
                        err = errno
                        self.sync_error = err
                PyThread_release_lock(self.sync_lock)
        finally:
            self._close_borrowed(fd)
        if err != 0:
            raise_errno(err, self.path, "fdatasync")
        return 0

    cdef int64_t read_position(self) noexcept nogil:
        return lmq_load_acq(&self.wrote_pos)

    @property
    def closed(self):
        return self.addr == NULL or self.unmap_pending

    @property
    def exported(self):
        """Number of live buffer exports (zero-copy views) of the mapping."""
        return self.exports

    @property
    def references(self):
        return self.refs

    @property
    def is_available(self):
        return self.available

    @property
    def fileno(self):
        return self.fd

    def data_ranges(self, long long start=0, long long end=-1):
        """The [lo, hi) ranges of [start, end) (end -1: the file's end) that may hold data, in order: the file's
        data extents as SEEK_DATA / SEEK_HOLE report them (page cache included). The rest are holes, which read as
        zeros and are never read through the mapping here: on tmpfs a read fault on a hole allocates a page, and on
        a full tmpfs that is a SIGBUS. A file system that cannot tell gives the whole range."""
        if not self.evicted:  # an evicted file is asked through a descriptor, not mapped again for it
            self._check_open()
        if end < 0 or end > self.file_size:
            end = self.file_size
        out = []
        if start >= end:
            return out
        if (self.fd < 0 and self.keeps_fd) or not _HAVE_SEEK_DATA:
            return [(start, end)]
        cdef long long pos = start, lo, hi
        cdef bint borrowed = self.fd < 0
        cdef int fd = self._reopen() if borrowed else self.fd
        try:
            while pos < end:
                try:
                    lo = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == _errno.ENXIO:  # nothing but holes from pos to the end of the file
                        break
                    if e.errno in (_errno.EINVAL, _errno.EOPNOTSUPP):  # the file system cannot tell
                        out.append((pos, end))
                        break
                    raise
                if lo >= end:
                    break
                hi = min(os.lseek(fd, lo, os.SEEK_HOLE), end)
                out.append((lo, hi))
                pos = hi
        finally:
            if borrowed:
                self._close_borrowed(fd)
        return out

    def data_end(self, long long start):
        """Where the run of data that ``start`` lies in ends (``start`` itself when it lies in a hole): a walk from
        ``start`` may read up to there through the mapping."""
        ranges = self.data_ranges(start, self.file_size)
        if not ranges or ranges[0][0] > start:
            return start
        return ranges[0][1]

    def _clip_ranges(self, ranges, long long start, long long end):
        # the parts of ranges (a data_ranges answer the caller kept) inside [start, end)
        return [(max(lo, start), min(hi, end)) for lo, hi in ranges if lo < end and hi > start]

    def has_data(self, long long start=0, long long end=-1, ranges=None):
        """Whether any byte of [start, end) is non-zero; holes are skipped without being read (GIL released).
        ``ranges``: this file's ``data_ranges`` as the caller already asked them (covering [start, end)), so that
        the file is not asked again."""
        cdef long long lo, hi
        cdef int zero
        if end < 0 or end > self.file_size:
            end = self.file_size
        ranges = self.data_ranges(start, end) if ranges is None else self._clip_ranges(ranges, start, end)
        if not ranges:
            return False
        self._check_open()
        self.exports += 1  # a budget's eviction waits (the mapping outlives the nogil blocks)
        try:
            for lo, hi in ranges:
                with nogil:  # up to a whole segment
                    zero = lmq_is_zero(self.addr + lo, <size_t>(hi - lo))
                if not zero:
                    return True
        finally:
            self.unpin()
        return False

    # -- zero-copy reads ------------------------------------------------------------------------------------

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self.addr == NULL and self.evicted:
            self.ensure_mapped()
        if self.addr == NULL or self.unmap_pending:
            raise StoreClosedError(f"mapped file {self.path} is closed")
        if (flags & PyBUF_WRITABLE) and not self.writable:
            raise BufferError("mapped file is read-only")
        self.touch()
        # readonly=0 only when asked, so numpy views of units stay read-only by default
        PyBuffer_FillInfo(buffer, self, self.addr, self.file_size, 0 if (flags & PyBUF_WRITABLE) else 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self.unpin()

    def view(self, long long pos, long long size):
        """A read-only memoryview of [pos, pos+size); keeps the mapping alive until it is released."""
        if pos < 0 or size < 0 or pos + size > self.file_size:
            raise ValueError("range outside the file")
        return memoryview(self)[pos:pos + size]

    def read(self, long long pos, long long size, ranges=None):
        """A bytes copy of [pos, pos+size); holes read as zeros without touching the mapping (``data_ranges``;
        ``ranges``: as the caller already asked them, see ``has_data``)."""
        self._check_open()
        if pos < 0 or size < 0 or pos + size > self.file_size:
            raise ValueError("range outside the file")
        ranges = self.data_ranges(pos, pos + size) if ranges is None else self._clip_ranges(ranges, pos, pos + size)
        if ranges == [(pos, pos + size)]:
            return (<char *>self.addr)[pos:pos + size]
        out = bytearray(size)
        cdef long long lo, hi
        for lo, hi in ranges:
            out[lo - pos:hi - pos] = (<char *>self.addr)[lo:hi]
        return bytes(out)

    # -- lifetime (RocketMQ ReferenceResource) ------------------------------------------------------------

    cdef bint hold_c(self) noexcept:
        if self.available and self.addr != NULL:
            self.refs += 1
            return True
        return False

    cdef void release_c(self) noexcept:
        self.refs -= 1
        if self.refs <= 0 and not self.available and self.delete_pending and not self.unmap_pending:
            # with exports alive this only marks the unmap pending: the last export's release completes it
            self._finish_destroy()

    def hold(self):
        """Take a reader reference; False when the file is being destroyed."""
        return self.hold_c()

    def release(self):
        self.release_c()

    def _do_unmap(self):
        cdef uint8_t *p = self.addr
        if self.budget is not None:
            self.budget.live.discard(self)
        if p != NULL:
            # addr is cleared before munlock/munmap release the GIL: readers test addr with the GIL held, so none
            # of them (nor a second _do_unmap) can start on the mapping while it is being torn down
            self.addr = NULL
            if self.locked:
                try:
                    c_munlock(p, 0, self.file_size, self.path)
                except OSError:
                    pass
                self.locked = False
            c_unmap(p, <size_t>self.file_size, self.path)
        fd = self.fd
        if fd >= 0:
            # cleared before close() releases the GIL: a second _do_unmap (a reader releasing the last reference
            # while retention retries the destroy) must not close the number again, maybe reused by then
            self.fd = -1
            os.close(fd)
        self.unmap_pending = False
        if self.delete_pending:
            self._unlink()

    def _unlink(self):
        self.delete_pending = False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise store_io_error(e, "unlink", self.path) from e

    def _finish_destroy(self):
        if self.exports > 0:
            self.unmap_pending = True
            return
        self._do_unmap()

    def close(self):
        """Unmap and close (no delete). With live exports the unmap waits for the last one to be released."""
        if self.addr == NULL:
            if self.evicted:
                self.evicted = False
                self.available = False
            return
        self.available = False
        if self.exports > 0:
            self.unmap_pending = True
            return
        self._do_unmap()

    def destroy(self, long long interval_forcibly_ms=0, now_ms=None):
        """Mark unavailable and delete the file once no reader holds it (RocketMQ's destroy).

        :param interval_forcibly_ms: readers holding references (``hold()``) this long after the first call are
            released forcibly and the file is unmapped under them, as RocketMQ does. Zero-copy exports (views)
            are never unmapped under their owner, which would crash it: once forced, the file's name is
            unlinked at once and the mapping (whose blocks the kernel frees then) goes with the last view.
        :param now_ms: the caller's clock in ms (retention passes its injectable clock); default monotonic.
            Use the same clock for every call on one file.
        :returns: True when the file is gone from the directory, False when deletion is deferred (call again,
            or it completes in whichever thread releases the last reference / export).
        """
        cdef double now = time.monotonic() if now_ms is None else now_ms / 1000.0
        cdef bint forced = False
        self.evicted = False  # never mapped again; _do_unmap below unlinks it
        if self.available:
            self.available = False
            self.shutdown_at = now
            self.refs -= 1  # drop the file's own reference
        elif (now - self.shutdown_at) * 1000 >= interval_forcibly_ms:
            forced = True
            if self.refs > 0:
                self.refs = -1000 - self.refs
        self.delete_pending = True
        if self.refs <= 0:
            if self.exports > 0:
                self.unmap_pending = True
                if forced:
                    self._unlink()
                    return True
                return False
            self._do_unmap()
            return True
        return False

    @property
    def destroy_pending(self):
        """True between a deferred ``destroy()`` and the moment the file is actually unlinked."""
        return self.delete_pending

    def __repr__(self):
        return (f"MappedFile({self.path!r}, from={self.file_from_offset}, size={self.file_size}, "
                f"wrote={self.wrote_pos}, flushed={self.flushed_pos})")
