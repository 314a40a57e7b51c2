# cython: boundscheck=False, wraparound=False, cdivision=True
"""MappedFile: one fixed-size segment file mapped MAP_SHARED, with reference-counted, zero-copy reads."""
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
from libc.string cimport memcpy, memset

from localmq._native cimport (
    c_fallocate, c_fdatasync, c_ftruncate, c_madvise, c_map, c_mincore, c_mlock, c_msync, c_munlock,
    c_populate_write, c_pretouch, c_unmap, raise_errno,
)
from localmq._os cimport (
    LMQ_ADV_RANDOM, lmq_fallocate, lmq_fdatasync, lmq_is_zero, lmq_load_acq, lmq_map_anon, lmq_msync,
    lmq_populate_write, lmq_pretouch, lmq_store_max, lmq_store_rel,
)

from localmq.errors import CorruptStoreError, StoreClosedError, io_operation, store_io_error

log = logging.getLogger("localmq.mapped_file")

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20
# the operation a flush of a file whose earlier msync / fdatasync failed reports (MappedFile.sync_error)
SYNC_FAILED_BEFORE = "flush (an earlier msync or fdatasync of this file failed; it is never retried)"
_HAVE_SEEK_DATA = hasattr(os, "SEEK_DATA")

# SYNC_FLUSH (prepare_ahead_c): the range ahead of the log's end kept written once (zeros) and flushed, and how little
# of it may be left before it is extended
cdef enum:
    PREPARE_CHUNK = 1 << 20
    PREPARE_LOW = 1 << 19


def offset_to_file_name(long long offset):
    """20-digit zero-padded decimal name of a file starting at ``offset``."""
    return "%020d" % offset


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

    cdef int admit(self, MappedFile mf) except -1:
        if mf.budget is None:
            mf.budget = self
        if mf.addr != NULL:
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

    cpdef int trim(self, bint evict_current=False, MappedFile keep=None) except -1:
        """Unmap least recently used files until at most 7/8 of ``limit`` are mapped (when more than ``limit`` are).
        ``evict_current``: also files a dispatcher writes through a raw pointer (their owner drops it first); only
        the thread that runs that dispatcher, or code that runs before it starts, may ask it. ``keep`` is never
        evicted (the file its caller is about to use). Returns how many were unmapped; a file whose eviction fails
        (its owner could not sync its position) stays mapped and the error is logged."""
        cdef MappedFile mf
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


def _last_use(MappedFile mf):
    return mf.last_use


cdef class WriteBuffer:
    """An anonymous memory buffer of one segment's size for the transient store pool, mlocked when allowed.

    ``WriteBuffer(size, lock=True)``; ``locked`` says whether mlock succeeded (a refusal is not an error: the
    caller warns once). Raises OSError (ENOMEM) when the memory cannot be mapped.
    """

    def __cinit__(self, long long size, bint lock=True):
        cdef void *p = NULL
        cdef int rc, err = 0
        if size <= 0:
            raise ValueError("size must be positive")
        with nogil:  # mmap of a large region
            rc = lmq_map_anon(<size_t>size, &p)
            if rc != 0:
                err = errno
        if rc != 0:
            raise_errno(err, None)
        self.addr = <uint8_t *>p
        self.size = size
        self.locked = False
        if lock:
            try:
                c_mlock(self.addr, 0, <size_t>size, None)  # faults every page in: done once per buffer
                self.locked = True
            except OSError as e:
                self.lock_error = e

    def __dealloc__(self):
        if self.addr != NULL:
            try:
                c_unmap(self.addr, <size_t>self.size, None)
            except OSError:
                pass
            self.addr = NULL


cdef class MappedFile:
    """One segment: a file of exactly ``file_size`` bytes mapped shared, named by its base offset.

    Creating a file reserves its blocks (posix_fallocate) so writes through the mapping never SIGBUS on a full
    disk; ENOSPC / EFBIG surface here as OSError. With ``reserve_step`` > 0 a new file is created sparse and only
    its first ``reserve_step`` bytes are reserved: writers call ``ensure_reserved(end)`` before writing below
    ``end``, which reserves the next step (or raises OSError on a full disk), so disk use grows with the data.
    Positions: ``wrote_position`` (appended), ``committed_position`` (equal to wrote without a transient pool),
    ``flushed_position`` (forced to disk).

    Reads are zero-copy: ``view(pos, size)`` (or ``memoryview(mf)``) exports the mapping; while any export is
    alive the mapping is never unmapped, ``close()``/``destroy()`` defer it to the release of the last export.
    Thread-safety: one writer (the owner's put lock); readers may run concurrently up to ``read_position``.

    ``keep_fd=False`` closes the file's descriptor once it is mapped (ConsumeQueue files: a store holds one per
    queue). Flushes then go through the mapping (msync, also for ``fsync``), and a reservation or a hole lookup
    opens the file for that call only, refusing a path that no longer names the mapped inode (StoreIOError ESTALE).
    ``sync_size=False`` leaves a new file's size to the owner to make durable (an fdatasync) before its name.
    ``map_now=False`` (an existing file of a ``budget``) checks the file and leaves it unmapped until its first use.
    """

    def __cinit__(self, path, long long file_size, long long file_from_offset=-1, *, bint create=True,
                  bint reserve=True, bint writable=True, long long reserve_step=0, bint keep_fd=True,
                  bint sync_size=True, MappingBudget budget=None, long long reserve_first=0, bint map_now=True):
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
        name = os.path.basename(self.path)
        if file_from_offset < 0:
            if len(name) != FILE_NAME_DIGITS or not name.isdigit():
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
            self._defer(budget, keep_fd, create)
            return
        existed = os.path.exists(self.path)
        if not existed and not create:
            raise FileNotFoundError(2, "No such file", self.path)
        fd = -1
        if create and writable and not existed:
            # the file appears under its name only once sized: a process killed while creating it leaves no
            # 0-byte or short segment (which RocketMQ's load() refuses), and nothing at all when the disk is full
            fd = self._create_sized(reserve, reserve_step)
        if fd < 0:
            if create and writable:
                flags |= os.O_CREAT
            with io_operation("open", self.path):
                fd = os.open(self.path, flags | os.O_CLOEXEC, 0o644)
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
            if keep_fd:
                raise ValueError("a file with a mapping budget keeps no descriptor (keep_fd=False)")
            budget.admit(self)

    cdef int _defer(self, MappingBudget budget, bint keep_fd, bint create) except -1:
        """``map_now=False``: an existing file of ``budget`` is checked (its size, by one stat of its name) and left
        unmapped, as an evicted file is, until ensure_mapped maps it on first use: a store of more queues than its
        budget maps would otherwise open and map every file at open only to unmap most of them again."""
        if budget is None or keep_fd or create:
            raise ValueError("map_now=False is for an existing file (create=False) of a budget (keep_fd=False)")
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
        cdef int err
        try:
            os.close(fd)
        except OSError as e:  # Linux released the descriptor anyway
            err = e.errno or _errno.EIO
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
            raise store_io_error(e, "close", self.path) from e
        return 0

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
                # reserve_first (ConsumeQueue files: a page): a queue that gets one message costs one block, and the
                # steps then double up to reserve_step (ensure_reserved)
                self.reserved = min(self.file_size, reserve_step, self.reserve_first or reserve_step)
                c_fallocate(fd, 0, self.reserved, self.path)
        if self.sync_size:
            c_fdatasync(fd, False, self.path)
        return 0

    cdef int _create_sized(self, bint reserve, long long reserve_step) except? -2:
        """Create the file sized and reserved as an unnamed inode in its directory (O_TMPFILE), then give it its
        name (linkat through /proc/self/fd). Returns its descriptor, or -1 where that is not possible (a file
        system or kernel without O_TMPFILE, no /proc, the name taken meanwhile by another process): the caller
        then opens the name. A failure to size it (a full disk) raises, and leaves nothing behind."""
        tmpfile = getattr(os, "O_TMPFILE", 0)
        if not tmpfile:
            return -1
        directory = os.path.dirname(self.path) or "."
        try:
            fd = os.open(directory, tmpfile | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError:
            return -1  # EOPNOTSUPP, EISDIR (kernels before 3.11), EINVAL...
        dfd = -1
        try:
            self._size_new(fd, reserve, reserve_step)
            # a directory descriptor makes os.link call linkat with AT_SYMLINK_FOLLOW (plain link() would link the
            # /proc symlink itself); the source path is absolute, so the descriptor only selects the call
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.link(f"/proc/self/fd/{fd}", self.path, src_dir_fd=dfd, follow_symlinks=True)
        except FileExistsError:
            os.close(fd)
            return -1
        except OSError as e:
            os.close(fd)
            if e.errno in (_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG, _errno.EIO):
                raise store_io_error(e, "link", self.path) from e
            return -1
        except BaseException:
            os.close(fd)
            raise
        finally:
            if dfd >= 0:
                os.close(dfd)
        return fd

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

    cdef int ensure_reserved(self, int64_t end) except -1:
        """Reserve the blocks below ``end`` (and a step beyond it) before anything is written there. Raises
        OSError (ENOSPC, EFBIG) when the file system cannot: nothing was written, the caller refuses the write."""
        cdef int64_t upto, step = self.reserve_step
        if end <= self.reserved:
            return 0
        if step == 0:
            upto = self.file_size
        else:
            if self.reserved < step and self.reserve_first > 0:
                # the steps start at reserve_first and double: disk grows with the data for a file that gets
                # little, and a busy one reaches whole steps after a few calls
                step = max(self.reserve_first, self.reserved)
            upto = min(self.file_size, (end + step - 1) // step * step + step)
        if end > self.file_size or (self.addr == NULL and not self.evicted) or (self.fd < 0 and self.keeps_fd):
            raise ValueError(f"cannot reserve up to {end} in {self.path} ({self.file_size} bytes)")
        cdef bint borrowed = self.fd < 0
        cdef int fd = self._reopen() if borrowed else self.fd
        try:
            c_fallocate(fd, self.reserved, upto - self.reserved, self.path)
        finally:
            if borrowed:
                self._close_borrowed(fd)
        self.reserved = upto
        return 0

    cdef int prepare_c(self, int64_t start, int64_t end) noexcept nogil:
        # Reserve [start, end) (a no-op where blocks exist), prefault it writable (marks its pages dirty without
        # changing a byte) and fdatasync: ext4/xfs convert the range's unwritten extents once, here, instead of in
        # the journal commit of each later SYNC_FLUSH fdatasync that reaches a new page. Returns 0 or an errno;
        # the caller pins the mapping. Zeros are only ever written where no record is (start >= the log's end).
        if start >= end:
            return 0
        if lmq_fallocate(self.fd, start, end - start) != 0:
            return errno
        if lmq_populate_write(self.addr, start, end - start) != 0:
            return errno
        cdef int err = self.sync_c(True, 0, 0)
        if err != 0:
            return err  # sync_error is set: the caller tells a failed sync (poisoning the file) by it
        if end > self.prepared_pos:
            self.prepared_pos = end
        return 0

    def prepare(self, long long start, long long end):
        """SYNC_FLUSH helper: write [start, end) once and flush it (see ``prepared_pos``), GIL released. Safe while
        the writer appends: the prefault changes no byte. Raises OSError (ENOSPC; EINVAL on a kernel without
        MADV_POPULATE_WRITE)."""
        cdef int err
        self._check_open()
        if not 0 <= start <= end <= self.file_size:
            raise ValueError("range outside the file")
        self.exports += 1
        try:
            with nogil:
                err = self.prepare_c(start, end)
        finally:
            self.unpin()
        if err != 0:
            raise_errno(err, self.path, "fdatasync" if self.sync_error == err else "prepare")
        return self.prepared_pos

    cdef bint prepare_due(self, int64_t pos) noexcept nogil:
        # less than PREPARE_LOW prepared beyond the log's end ``pos``, and the file not prepared to its end
        return self.prepared_pos < pos + PREPARE_LOW and self.prepared_pos < self.file_size

    cdef int prepare_ahead_c(self, int64_t pos) noexcept nogil:
        """The step every SYNC_FLUSH flusher takes between flushes (the group commit loops in C, the
        GroupCommitService when idle): when less than PREPARE_LOW bytes beyond the log's end ``pos`` are prepared,
        prepare the next PREPARE_CHUNK (``prepare_c``). A fallocated range is "unwritten" to ext4 and xfs: without
        this, each fdatasync that reaches a new page must also commit the extent conversion to the journal
        (measured: 190 -> 120 us per fdatasync of 3 KiB). The caller pins the mapping.

        Returns 0, or the errno of a failed prepare: the file is then not prepared again (a full disk, a kernel
        without MADV_POPULATE_WRITE: flushes go on without it). When that errno is the file's ``sync_error``, the
        fdatasync failed: a failed flush of the file (it may have consumed the error of a page a put wrote), which
        the caller reports as one."""
        cdef int64_t start, end
        cdef int err
        if not self.prepare_due(pos):
            return 0
        start = self.prepared_pos if self.prepared_pos > pos else pos
        end = start + PREPARE_CHUNK
        err = self.prepare_c(start, end if end < self.file_size else self.file_size)
        if err != 0:
            self.prepared_pos = self.file_size
        return err

    def prepare_ahead(self, long long pos):
        """``prepare_ahead_c`` with the GIL released, for a flusher in Python; returns ``prepared_pos``. Raises
        OSError (``sync_error`` is set when the fdatasync failed), or StoreClosedError; either way the file is not
        prepared again."""
        cdef int err
        if not self.prepare_due(pos):
            return self.prepared_pos
        if self.addr == NULL or self.unmap_pending:
            self.prepared_pos = self.file_size
            self._check_open()
        self.exports += 1
        try:
            with nogil:
                err = self.prepare_ahead_c(pos)
        finally:
            self.unpin()
        if err != 0:
            raise_errno(err, self.path, "fdatasync" if self.sync_error == err else "prepare")
        return self.prepared_pos

    cdef int unpin(self) except -1:
        # the end of an export taken for a nogil section (exports += 1): the unmap that close() deferred runs now
        self.exports -= 1
        if self.exports == 0 and self.unmap_pending:
            self._do_unmap()
        return 0

    def give_up_prepare(self):
        """Mark the whole file prepared: ``prepare`` failed here and is not to be tried again."""
        self.prepared_pos = self.file_size

    def reserve_to(self, long long end):
        """Reserve the blocks below ``end`` (see ``ensure_reserved``); raises OSError on a full disk."""
        self.ensure_reserved(end)

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

    # -- positions ---------------------------------------------------------------------------------------

    @property
    def wrote_position(self):
        return lmq_load_acq(&self.wrote_pos)

    @wrote_position.setter
    def wrote_position(self, long long v):
        if not 0 <= v <= self.file_size:
            raise ValueError("position out of range")
        if self.wbuf != NULL:
            raise ValueError("positions of a file with a write buffer move by commit()")
        lmq_store_rel(&self.append_pos, v)
        lmq_store_rel(&self.wrote_pos, v)

    @property
    def append_position(self):
        """Where the next record goes (ahead of wrote_position while a write buffer holds uncommitted bytes)."""
        return lmq_load_acq(&self.append_pos)

    @property
    def has_write_buffer(self):
        return self.wbuf != NULL

    @property
    def committed_position(self):
        return self.committed_pos

    @committed_position.setter
    def committed_position(self, long long v):
        if not 0 <= v <= self.file_size:
            raise ValueError("position out of range")
        self.committed_pos = v

    @property
    def flushed_position(self):
        return self.flushed_pos

    @flushed_position.setter
    def flushed_position(self, long long v):
        if not 0 <= v <= self.file_size:
            raise ValueError("position out of range")
        self.flushed_pos = v

    def set_positions(self, long long pos):
        """Set wrote, committed and flushed positions to ``pos`` (after recovery found the valid end)."""
        if not 0 <= pos <= self.file_size:
            raise ValueError("position out of range")
        if self.wbuf != NULL:
            raise ValueError("positions of a file with a write buffer move by commit()")
        lmq_store_rel(&self.append_pos, pos)
        lmq_store_rel(&self.wrote_pos, pos)
        self.committed_pos = pos
        self.flushed_pos = pos

    def advance_to(self, long long pos):
        """Move the append, wrote and committed positions up to ``pos`` (never down; flushed stays): another
        process committed bytes up to there (a store shared between processes)."""
        if not 0 <= pos <= self.file_size:
            raise ValueError("position out of range")
        if self.wbuf != NULL:
            raise ValueError("positions of a file with a write buffer move by commit()")
        # CAS-max: a put of this process may publish a larger position at the same time
        lmq_store_max(&self.append_pos, pos)
        lmq_store_max(&self.committed_pos, pos)
        lmq_store_max(&self.wrote_pos, pos)

    def zero(self, long long start, long long end):
        """Zero bytes [start, end) of the mapping (repairing a torn write) and set the positions back to ``start``
        when they lie beyond it."""
        self._check_open()
        if not 0 <= start <= end <= self.file_size:
            raise ValueError("range out of the file")
        if self.wbuf != NULL:
            raise ValueError("a file with a write buffer is repaired by commit()")
        cdef long long lo, hi
        for lo, hi in self.data_ranges(start, end):  # holes are zeros already; data has its blocks
            self.reserve_range(lo, hi)
            memset(self.addr + lo, 0, hi - lo)
        if self.append_pos > start:
            lmq_store_rel(&self.append_pos, start)
        if self.committed_pos > start:
            self.committed_pos = start
        if lmq_load_acq(&self.wrote_pos) > start:
            lmq_store_rel(&self.wrote_pos, start)

    def is_full(self):
        return lmq_load_acq(&self.append_pos) >= self.file_size

    # -- transient store pool ------------------------------------------------------------------------------

    def attach_write_buffer(self, WriteBuffer buf not None):
        """Route appends of this fresh file through ``buf`` until commit() has copied the whole file."""
        if buf.size < self.file_size:
            raise ValueError("write buffer smaller than the file")
        if lmq_load_acq(&self.append_pos) != 0 or self.wbuf != NULL:
            raise ValueError("a write buffer can only be attached to an empty file")
        self.write_buffer = buf
        self.wbuf = buf.addr

    def commit(self, int least_pages=0):
        """Copy appended bytes from the write buffer into the mapping and publish them to readers.

        Copies when at least ``least_pages`` pages are pending (0: any byte) or the file is full. Returns
        (committed position, buffer released: the WriteBuffer once the whole file is committed, else None).
        Without a write buffer it only reports the wrote position.
        """
        self._check_open()
        cdef int64_t app, w
        cdef uint8_t *src = self.wbuf
        if src == NULL:
            return lmq_load_acq(&self.wrote_pos), None
        app = lmq_load_acq(&self.append_pos)
        w = self.wrote_pos
        if app > w:
            if app < self.file_size and least_pages > 0 and (app // OS_PAGE_SIZE) - (w // OS_PAGE_SIZE) < least_pages:
                return w, None
            with nogil:  # up to a whole segment of copying; the writer keeps appending past app
                memcpy(self.addr + w, src + w, <size_t>(app - w))
            self.committed_pos = app
            lmq_store_rel(&self.wrote_pos, app)
        if app >= self.file_size:
            buf = self.write_buffer
            self.wbuf = NULL
            self.write_buffer = None
            return app, buf
        return app, None

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

    def last_modified(self):
        """mtime of the file in ms (retention)."""
        return int(os.stat(self.path).st_mtime * 1000)

    # -- writes (slow paths from Python; the put path writes through addr in Cython) ------------------------

    def append(self, data):
        """Append bytes at the wrote position. Returns True, or False when they do not fit.

        Raises StoreClosedError when the file is closed.
        """
        self._check_open()
        cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        cdef int64_t n = mv.shape[0]
        cdef int64_t pos = self.wrote_pos
        if self.wbuf != NULL:
            raise ValueError("append() does not go through a write buffer")
        if pos + n > self.file_size:
            return False
        if n:
            memcpy(self.addr + pos, &mv[0], n)
        lmq_store_rel(&self.append_pos, pos + n)
        lmq_store_rel(&self.wrote_pos, pos + n)
        return True

    def write_at(self, long long pos, data):
        """Write bytes at ``pos`` without moving positions (CQ padding, recovery repairs). Their blocks are reserved
        first (``reserve_range``): OSError (ENOSPC) instead of a SIGBUS on a full disk."""
        self._check_open()
        cdef const uint8_t[::1] mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        cdef int64_t n = mv.shape[0]
        if pos < 0 or pos + n > self.file_size:
            raise ValueError("write outside the file")
        if n:
            self.reserve_range(pos, pos + n)
            memcpy(self.addr + pos, &mv[0], n)

    cdef int reserve_range(self, int64_t start, int64_t end) except -1:
        """Reserve the blocks of [start, end) before a write through the mapping lands there (a no-op where blocks
        exist). Every write of this class goes through here or through ``ensure_reserved``: a store on a full disk
        gets OSError (ENOSPC, EFBIG) from the write, never a SIGBUS from the page fault."""
        if end <= self.reserved or start >= end:
            return 0
        if self.fd < 0 and (self.keeps_fd or self.addr == NULL):
            raise ValueError(f"{self.path}: no descriptor to reserve blocks through")
        cdef bint borrowed = self.fd < 0
        cdef int fd = self._reopen() if borrowed else self.fd
        try:
            c_fallocate(fd, start, end - start, self.path)
        finally:
            if borrowed:
                self._close_borrowed(fd)
        return 0

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

    def zero_tail(self, long long pos, long long chunk=65536):
        """Zero from ``pos`` until the first all-zero chunk (or the file end), so that stale records past a
        truncation point can never be read back as valid by a later recovery. Returns bytes zeroed."""
        self._check_open()
        cdef int64_t p, n, hi, done = 0
        if pos < 0 or pos > self.file_size:
            raise ValueError("position out of range")
        # a hole is an all-zero chunk: only data is read (a hole read through the mapping allocates on tmpfs) and
        # written (its blocks exist)
        ranges = self.data_ranges(pos, self.file_size)
        if not ranges or ranges[0][0] > pos:
            return 0
        p, hi = ranges[0]
        self.exports += 1  # a budget's eviction waits (the mapping outlives the nogil block)
        try:
            with nogil:  # may touch many pages of a large segment
                while p < hi:
                    n = chunk if p + chunk <= hi else hi - p
                    if lmq_is_zero(self.addr + p, n):
                        break
                    memset(self.addr + p, 0, n)
                    done += n
                    p += n
            if done:
                c_msync(self.addr, pos, done, True, self.path)
        finally:
            self.unpin()
        return done

    # -- flush ----------------------------------------------------------------------------------------------

    def flush(self, int least_pages=0):
        """msync [flushed, wrote) when the file is full, or at least ``least_pages`` dirty pages (0: any byte).

        Returns the new flushed position. Raises StoreIOError when msync fails, and from then on at every call
        without trying again (``sync_error``): the pages that flush could not write may be lost while a retry
        would succeed.
        """
        if not self.evicted:
            self._check_open()
        cdef int64_t wrote = lmq_load_acq(&self.wrote_pos)
        cdef int64_t flushed = self.flushed_pos
        cdef int64_t ts = self.store_timestamp
        if self.sync_error != 0:
            raise_errno(self.sync_error, self.path, SYNC_FAILED_BEFORE)
        if wrote <= flushed:
            return flushed
        if wrote < self.file_size:
            if least_pages > 0 and (wrote // OS_PAGE_SIZE) - (flushed // OS_PAGE_SIZE) < least_pages:
                return flushed
        if self.addr == NULL:
            # evicted with dirty pages: they are in the page cache, and an fdatasync of the file writes them
            self._sync_unmapped()
            self.flushed_pos = wrote
            self.flushed_store_timestamp = ts
            return wrote
        cdef int err
        self.exports += 1  # a budget's eviction waits (the mapping outlives the nogil block)
        try:
            with nogil:  # msync(MS_SYNC) waits for the disk
                err = self.sync_c(False, flushed, wrote - flushed)
        finally:
            self.unpin()
        if err != 0:
            raise_errno(err, self.path, "msync")
        self.flushed_pos = wrote
        self.flushed_store_timestamp = ts
        return wrote

    def fsync(self):
        """fdatasync the file descriptor (metadata-light flush of everything written; without a kept descriptor an
        msync(MS_SYNC) of the whole mapping, see ``sync_c``). Raises StoreIOError as ``flush`` does, and from then
        on at every call."""
        if not self.evicted:
            self._check_open()
        if self.sync_error != 0:
            raise_errno(self.sync_error, self.path, SYNC_FAILED_BEFORE)
        if self.addr == NULL:
            self._sync_unmapped()
            return
        cdef int err
        cdef bint mapped = self.fd < 0
        self.exports += 1  # the mapping outlives the nogil block (close() defers the unmap)
        try:
            with nogil:  # waits for the disk
                err = self.sync_c(True, 0, 0)
        finally:
            self.unpin()
        if err != 0:
            raise_errno(err, self.path, "msync" if mapped else "fdatasync")

    # -- page cache helpers (warm-up, residency) ---------------------------------------------------------

    def pretouch(self, long long off=0, long long length=-1, bint write=False):
        """Touch one byte per page of [off, off+length) with the GIL released (write=True writes a 0, only for
        never-written ranges). Returns pages touched."""
        self._check_open()
        if length < 0:
            length = self.file_size - off
        if off < 0 or off + length > self.file_size:
            raise ValueError("range outside the file")
        return c_pretouch(self.addr, off, length, write)

    def populate(self, long long off, long long length):
        """Prefault [off, off+length) writable without changing any byte, with the GIL released, so that the
        writer does not take first-touch page faults there. Safe while the writer appends concurrently.

        Uses MADV_POPULATE_WRITE; on kernels without it falls back to reading one byte per page (which maps
        the pages; the first write then costs only a write-protect fault). Returns bytes populated.
        """
        cdef int err = 0
        cdef int64_t o = off, n = length
        if self.addr == NULL or self.unmap_pending:
            return 0
        if off < 0 or length < 0 or off + length > self.file_size:
            raise ValueError("range outside the file")
        # an export for the duration: close()/destroy() defer the unmap until it is released
        self.exports += 1
        try:
            with nogil:  # page faults for the whole range; the writer keeps running
                err = c_populate_write(self.addr, o, n)
                if err == 22:  # EINVAL: MADV_POPULATE_WRITE unknown to this kernel
                    lmq_pretouch(self.addr, o, n, 0)
                    err = 0
        finally:
            self.unpin()
        if err != 0:
            raise_errno(err, self.path)
        return length

    def mlock(self, long long off=0, long long length=-1):
        """mlock a range; raises OSError (EPERM, ENOMEM, EAGAIN) when refused."""
        self._check_open()
        if length < 0:
            length = self.file_size - off
        c_mlock(self.addr, off, length, self.path)
        self.locked = True

    def munlock(self, long long off=0, long long length=-1):
        self._check_open()
        if length < 0:
            length = self.file_size - off
        c_munlock(self.addr, off, length, self.path)
        self.locked = False

    def madvise(self, int advice, long long off=0, long long length=-1):
        """madvise a range with one of localmq._native.ADV_*."""
        self._check_open()
        if length < 0:
            length = self.file_size - off
        c_madvise(self.addr, off, length, advice, self.path)

    def resident_pages(self, long long off=0, long long length=-1):
        """Pages of the range in the page cache (mincore)."""
        self._check_open()
        if length < 0:
            length = self.file_size - off
        return c_mincore(self.addr, off, length, self.path)

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
