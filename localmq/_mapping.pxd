# Mapping: one pre-sized, memory-mapped segment file (creation, mapping under a budget, references, reads,
# lifetime); MappedFile (_mapped_file.pxd) adds the writer's side.
from cpython.pythread cimport PyThread_type_lock
from libc.stdint cimport int64_t, uint8_t


cdef class Mapping


cdef class MappingBudget:
    # The most mappings of the files that share it (ConsumeQueue files: a store may have 100,000 queues, the process
    # at most vm.max_map_count mappings); least recently used files beyond it are unmapped and mapped again on use.
    cdef readonly int limit
    cdef int64_t clock                # use counter: a file's last_use is the clock when it was last used
    cdef set live                     # files of this budget that are mapped now
    cdef readonly long long evictions
    cdef readonly long long remaps
    cdef int admit(self, Mapping mf, bint advised=*) except -1
    cpdef int trim(self, bint evict_current=*, Mapping keep=*) except -1


cdef class Mapping:
    cdef readonly object path
    cdef readonly int64_t file_from_offset
    cdef readonly int64_t file_size
    cdef uint8_t *addr
    # The file's descriptor while the file is open, or -1 for a file mapped with keep_fd=False (a ConsumeQueue
    # file: one per queue, so a store with many queues would hold as many descriptors): the mapping keeps the
    # file's open file description alive in the kernel (msync goes through it), and the few calls that need a
    # descriptor (fallocate, lseek SEEK_DATA) open the path for the call and check it is still the mapped inode.
    cdef int fd
    cdef readonly bint keeps_fd
    # False: a new file's size is not fdatasynced at creation; the owner makes it durable later, before the file's
    # name (DeferredDirSyncs: ConsumeQueue files, synced in a batch before the checkpoint vouches for them)
    cdef bint sync_size
    cdef object file_id               # (st_dev, st_ino) of the mapped file
    cdef bint writable
    # wrote_pos is published with a release store after a record is complete; readers on other threads
    # (the dispatcher) load it with acquire. Only the thread holding the owner's put lock stores it.
    cdef int64_t wrote_pos
    cdef int64_t committed_pos
    # The writer's cursor. Without a write buffer it equals wrote_pos. With one (transient store pool), records
    # go to wbuf up to append_pos (release store) and commit() copies them into the mapping, then publishes
    # wrote_pos: readers only ever see committed bytes.
    cdef int64_t append_pos
    cdef uint8_t *wbuf
    cdef object write_buffer
    cdef int64_t flushed_pos
    cdef readonly int64_t store_timestamp      # store time of the last record appended (checkpoint input)
    cdef readonly int64_t flushed_store_timestamp
    cdef int exports                  # live buffer exports (memoryviews, numpy arrays) of the mapping
    cdef int refs                     # hold() count of readers; the file's own reference is 1
    cdef bint available
    cdef bint unmap_pending           # close()/destroy() asked while exports were alive
    cdef bint delete_pending
    cdef bint locked
    cdef double shutdown_at
    # Blocks of [0, reserved) are known reserved (posix_fallocate): writes through the mapping below it never
    # SIGBUS. With a reserve step, a new file is sparse and reserved ahead of the writer step by step
    # (ensure_reserved); without one, the whole file is reserved when it is created.
    cdef readonly int64_t reserved
    cdef readonly int64_t reserve_step
    # > 0: a new file reserves this much first, then steps that double up to reserve_step (ConsumeQueue files)
    cdef readonly int64_t reserve_first
    # SYNC_FLUSH: [0, prepared_pos) has been written once (at least with zeros) and flushed, so its extents are no
    # longer "unwritten" and a later fdatasync there writes data pages only, without a journal commit.
    cdef readonly int64_t prepared_pos
    # errno of the first failed msync / fdatasync of this file (0: none). The kernel may have dropped the pages that
    # flush could not write (Linux marks them clean after reporting the error once), so a later flush that succeeds
    # proves nothing: once set, flush() and fsync() raise again without trying.
    cdef public int sync_error
    # Every msync / fdatasync of the file runs under this lock, with the check of ``sync_error`` before it and its
    # setting after a failure: a failed sync reports the file's error once (the kernel's errseq), so a sync running
    # beside it could return success for pages the failed one lost. Taken without the GIL (``sync_c``).
    cdef PyThread_type_lock sync_lock
    # With a budget: unmapped when least recently used (``evict``; no descriptor is kept either), and mapped again by
    # ``ensure_mapped`` (which every method that reads the mapping calls through ``_check_open``). cdef code that
    # reads ``addr`` itself calls ``ensure_mapped`` when it is NULL and ``evicted`` is set.
    cdef readonly MappingBudget budget
    cdef readonly bint evicted
    cdef int64_t last_use
    # The ConsumeQueue whose dispatcher writes this file through a raw pointer without the GIL (its CQState.addr), or
    # None: such a file is evicted only by ``trim(evict_current=True)``, which asks the owner to drop the pointer first
    cdef public object owner

    cdef int ensure_mapped(self) except -1
    cdef inline void touch(self) noexcept:
        if self.budget is not None:
            self.last_use = self.budget.clock
            self.budget.clock += 1

    cdef int _check_open(self) except -1
    cdef int64_t read_position(self) noexcept nogil
    cdef bint hold_c(self) noexcept
    cdef void release_c(self) noexcept
    cdef int _size_new(self, int fd, bint reserve, long long reserve_step) except -1
    cdef int _create_mapped(self, bint reserve, long long reserve_step, bint keep_fd, bint advise,
                            bint populate_first) except -1
    cdef int64_t _first_reserve(self, long long reserve_step) noexcept
    cdef int sync_c(self, bint data_sync, int64_t off, int64_t length) noexcept nogil
    cdef int _reopen(self) except -1
    cdef int _defer(self, MappingBudget budget, bint keep_fd, bint create, tuple file_id) except -1
    cdef int _open_same(self) except -1
    cdef int _sync_unmapped(self) except -1
    cdef int _close_borrowed(self, int fd) except -1
    cdef int _borrowed_close_error(self, int err) except -1
    cdef int unpin(self) except -1
