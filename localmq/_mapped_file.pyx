# cython: boundscheck=False, wraparound=False, cdivision=True
"""MappedFile: the writer's side of a segment (``Mapping``, ``_mapping``): positions published to readers, appends,
blocks reserved ahead of writes, the transient store pool's ``WriteBuffer``, flushes, SYNC_FLUSH's prepared range and
the page-cache helpers of warm-up."""
import os

from libc.errno cimport errno
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy, memset

from localmq._native cimport (
    c_fallocate, c_madvise, c_mincore, c_mlock, c_msync, c_munlock, c_populate_write, c_unmap, raise_errno,
)
from localmq._os cimport (
    lmq_fallocate, lmq_fallocate_path, lmq_is_zero, lmq_load_acq, lmq_map_anon, lmq_populate_write, lmq_pretouch,
    lmq_store_max, lmq_store_rel,
)
from localmq._layout cimport OS_PAGE_SIZE
from localmq._mapping cimport Mapping


# the operation a flush of a file whose earlier msync / fdatasync failed reports (MappedFile.sync_error)
SYNC_FAILED_BEFORE = "flush (an earlier msync or fdatasync of this file failed; it is never retried)"

# SYNC_FLUSH (prepare_ahead_c): the range ahead of the log's end kept written once (zeros) and flushed, and how little
# of it may be left before it is extended
cdef enum:
    PREPARE_CHUNK = 1 << 20
    PREPARE_LOW = 1 << 19


def offset_to_file_name(long long offset):
    """20-digit zero-padded decimal name of a file starting at ``offset``."""
    return "%020d" % offset


cdef inline int64_t reserve_upto(int64_t reserved, int64_t end, int64_t step, int64_t first,
                                 int64_t file_size) noexcept nogil:
    # where a reservation for a write below ``end`` ends: the whole file without a step; else the next step boundary
    # past ``end`` plus one step, the steps starting at ``first`` and doubling up to ``step`` (disk grows with the data
    # for a file that gets little, and a busy one reaches whole steps after a few calls)
    if step == 0:
        return file_size
    if reserved < step and first > 0:
        step = max(first, reserved)
    return min(file_size, (end + step - 1) // step * step + step)


cdef int reserve_nogil(NogilReserve *r, int64_t end, int *stage) noexcept nogil:
    """``ensure_reserved`` without the GIL, for a file ``MappedFile.nogil_reserve`` described: 0 when the blocks below
    ``end`` are reserved (``r.reserved`` moved), -1 when the caller must take ``ensure_reserved`` with the GIL (``end``
    is past the file, or no description), or -2 with errno and ``stage`` when a call failed
    (``lmq_fallocate_path``; stage 4, a failed close, after the blocks were reserved: the caller reports it through
    ``Mapping._borrowed_close_error``)."""
    cdef int64_t upto
    if r.path == NULL or end > r.file_size:
        return -1
    if end <= r.reserved[0]:
        return 0
    upto = reserve_upto(r.reserved[0], end, r.reserve_step, r.reserve_first, r.file_size)
    if lmq_fallocate_path(r.path, r.dev, r.ino, r.reserved[0], upto - r.reserved[0], stage) != 0:
        if stage[0] == 4:
            r.reserved[0] = upto
        return -2
    r.reserved[0] = upto
    return 0


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


cdef class MappedFile(Mapping):
    """A segment file with its writer's side (``Mapping`` is the file, its mapping, reads and lifetime).

    With ``reserve_step`` > 0, writers call ``ensure_reserved(end)`` before writing below ``end``, which reserves the
    next step (or raises OSError on a full disk), so disk use grows with the data. Positions: ``wrote_position``
    (appended), ``committed_position`` (equal to wrote without a transient pool), ``flushed_position`` (forced to
    disk). Thread-safety: one writer (the owner's put lock); readers may run concurrently up to ``read_position``.
    """

    cdef int ensure_reserved(self, int64_t end) except -1:
        """Reserve the blocks below ``end`` (and a step beyond it) before anything is written there. Raises
        OSError (ENOSPC, EFBIG) when the file system cannot: nothing was written, the caller refuses the write."""
        if end <= self.reserved:
            return 0
        cdef int64_t upto = reserve_upto(self.reserved, end, self.reserve_step, self.reserve_first, self.file_size)
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

    cdef int nogil_reserve(self, NogilReserve *r) except -1:
        """Describe this file for ``reserve_nogil`` (the dispatcher reserves its ConsumeQueue file's next step without
        the GIL: a trip back to Python waits for the GIL, up to the 5 ms switch interval while a producer thread
        runs). ``r.path`` stays NULL for a file that keeps its descriptor, has no reserve step or is not writable:
        those go through ``ensure_reserved``. Valid while the file stays mapped and this object alive."""
        r.path = NULL
        if self.keeps_fd or self.reserve_step == 0 or not self.writable or self.file_id is None:
            return 0
        if self.path_b is None:
            self.path_b = os.fsencode(self.path)
        r.dev, r.ino = self.file_id
        r.reserved = &self.reserved
        r.reserve_step = self.reserve_step
        r.reserve_first = self.reserve_first
        r.file_size = self.file_size
        r.path = self.path_b
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

    def give_up_prepare(self):
        """Mark the whole file prepared: ``prepare`` failed here and is not to be tried again."""
        self.prepared_pos = self.file_size

    def reserve_to(self, long long end):
        """Reserve the blocks below ``end`` (see ``ensure_reserved``); raises OSError on a full disk."""
        self.ensure_reserved(end)

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
