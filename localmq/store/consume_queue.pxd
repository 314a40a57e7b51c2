from libc.stdint cimport int64_t, uint8_t
from localmq._mapped_file cimport MappedFile, NogilReserve
from localmq._mapping cimport MappingBudget

cdef struct CQState:
    uint8_t *addr            # mapping of the file the dispatcher writes (NULL: none yet)
    int64_t file_from        # logical byte offset of that file
    int64_t file_size
    int64_t reserved         # bytes of that file whose blocks are reserved: the fast path writes below it only
    int64_t max_offset       # next unit index; published with a release store after the unit is written
    int64_t min_offset       # first readable unit index
    int64_t max_physic_offset  # commit log end (offset + size) of the last unit written
    int64_t last_store_ts
    int64_t *shared_max      # a store shared between processes: the unit count in the control file, else NULL
    int64_t waiting          # units the dispatcher keeps in memory until the queue's first file is made (ReputCore)
    NogilReserve rsv         # the write target's next steps, reserved by the dispatcher without the GIL

cdef class ConsumeQueue:
    cdef readonly str topic
    cdef readonly int queue_id
    cdef readonly object mapped_file_queue
    cdef readonly object directory
    cdef CQState st
    cdef MappedFile cur
    cdef readonly long long gap_units
    cdef object ctl                   # the ControlFile shared_max points into (kept mapped while bound)
    cdef readonly MappingBudget budget
    cdef bint made_ahead              # the first file was made by the QueueFileMaker and is not padded yet
    cdef CQState *state_ptr(self) noexcept
    cdef int _set_target(self, MappedFile mf) except -1
    cdef int _clear_target(self) except -1
