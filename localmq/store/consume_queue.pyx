# cython: boundscheck=False, wraparound=False, cdivision=True
"""ConsumeQueue: the 20-byte units of one (topic, queue): recovery, the dispatcher's appends and numpy views over the
mapping. Reading messages through a queue is localmq.store.get."""
import logging
import os

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

from localmq._layout cimport CQ_BLANK_UNIT_SIZE, CQ_UNIT_SIZE, CTL_T_DISPATCHED, CTL_TOPIC_QUEUES
from localmq._mapped_file cimport MappedFile
from localmq._mapping cimport MappingBudget
from localmq._shm cimport ControlFile, topic_row_c
from localmq._os cimport lmq_be32, lmq_be64, lmq_load_acq, lmq_put32, lmq_put64, lmq_store_rel

import numpy as np

from localmq.errors import InvalidQueueIdError, PositionOutOfRangeError, StoreClosedError
from localmq.layout import CQ_DTYPE
from localmq.store.mapped_file_queue import MappedFileQueue

cnp.import_array()

log = logging.getLogger("localmq.consume_queue")


def _valid_prefix(mf, long long unit_per_file, ranges):
    """(n, (offset, size) of unit n - 1) for the leading run of valid units (offset >= 0, size > 0) of a ConsumeQueue
    file whose data ranges are ``ranges`` (``MappedFile.data_ranges``). Only its first run of data is read through the
    mapping: the unit after it lies in a hole, which reads as zeros and ends the run; a unit across the run's end is
    read by ``MappedFile.read``. A sparse file's holes are never read (a 6,000,000-byte file with one unit costs one
    page)."""
    cdef long long data_hi = ranges[0][1] if ranges and ranges[0][0] == 0 else 0
    cdef long long whole = min(unit_per_file, data_hi // CQ_UNIT_SIZE)
    cdef long long n
    arr = np.frombuffer(mf, dtype=CQ_DTYPE, count=whole)
    try:
        valid = (arr["offset"] >= 0) & (arr["size"] > 0)
        n = whole if bool(valid.all()) else int(np.argmin(valid))
        last = (int(arr["offset"][n - 1]), int(arr["size"][n - 1])) if n > 0 else (-1, 0)
    finally:
        del arr
    if n == whole and whole < unit_per_file and data_hi > whole * CQ_UNIT_SIZE:
        unit = np.frombuffer(mf.read(whole * CQ_UNIT_SIZE, CQ_UNIT_SIZE, ranges), dtype=CQ_DTYPE)[0]
        if int(unit["offset"]) >= 0 and int(unit["size"]) > 0:
            n += 1
            last = (int(unit["offset"]), int(unit["size"]))
    return n, last


def _starts_below(mf, long long min_commit_log_offset):
    """True when the first unit of ``mf`` is a pre-blank unit or points at or below ``min_commit_log_offset``
    (no record of the queue before it can then be in the log)."""
    arr = np.frombuffer(mf, dtype=CQ_DTYPE, count=1)
    try:
        size, off = int(arr["size"][0]), int(arr["offset"][0])
    finally:
        del arr
    return size == CQ_BLANK_UNIT_SIZE or (size > 0 and off <= min_commit_log_offset)


cdef class ConsumeQueue:
    """The units of one (topic, queue id): ``<root>/consumequeue/<topic>/<queueId>/<20-digit logical offset>``.

    The dispatcher (one thread) appends units; any thread may read up to ``max_offset`` (published with a
    release store after the unit is complete). ``units()`` gives numpy structured arrays laid on the mapping.
    """

    def __cinit__(self, str topic, int queue_id, root, long long file_size, *, bint writable=True,
                  long long reserve_step=0, object dir_syncs=None, MappingBudget budget=None):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(os.fspath(root), topic, str(queue_id))
        # no descriptor per queue file kept open: a store holds as many queues as its users make
        # dir_syncs (a DeferredDirSyncs): the fsyncs that make a new file's name durable wait for the next
        # checkpoint instead of running on the dispatcher's thread
        # budget (a MappingBudget the store's queues share): idle files are unmapped, mapped again on use
        self.budget = budget
        self.mapped_file_queue = MappedFileQueue(self.directory, file_size, writable=writable,
                                                 reserve_step=reserve_step, keep_fd=False, dir_syncs=dir_syncs,
                                                 budget=budget, reserve_first=4096)
        self.st.addr = NULL
        self.st.reserved = 0
        self.st.file_size = file_size
        self.st.file_from = 0
        self.st.max_offset = 0
        self.st.min_offset = 0
        self.st.max_physic_offset = -1
        self.st.shared_max = NULL
        self.st.waiting = 0
        self.st.rsv.path = NULL
        self.made_ahead = False
        self.cur = None

    cdef CQState *state_ptr(self) noexcept:
        return &self.st

    # -- offsets ----------------------------------------------------------------------------------------------

    @property
    def max_offset(self):
        """Next unit index (one past the last unit)."""
        return lmq_load_acq(&self.st.max_offset)

    @property
    def min_offset(self):
        return self.st.min_offset

    @property
    def max_physic_offset(self):
        """Commit log end of the last unit (offset + size), -1 when empty."""
        return self.st.max_physic_offset

    @property
    def last_store_timestamp(self):
        return self.st.last_store_ts

    @property
    def file_size(self):
        return self.st.file_size

    # -- a store shared between processes ------------------------------------------------------------------

    def bind_shared(self, ControlFile ctl not None):
        """Tie this queue to its unit count in ``ctl``'s topic table: the dispatcher (in whichever process runs
        it) publishes there, readers in every process adopt it with ``sync_shared``. Returns False when the topic
        has no row yet (nothing was ever put to it while shared)."""
        cdef char *row = topic_row_c(ctl.addr, self.topic.encode("ascii"))
        if row == NULL:
            return False
        if self.queue_id >= CTL_TOPIC_QUEUES:
            raise InvalidQueueIdError(f"queue id {self.queue_id}: a store shared between processes has queue ids "
                                      f"0..{CTL_TOPIC_QUEUES - 1} per topic")
        self.ctl = ctl
        self.st.shared_max = <int64_t *>(row + CTL_T_DISPATCHED) + self.queue_id
        return True

    def publish_shared(self):
        """Publish this process's unit count as the shared one (the first opener, after recovery)."""
        if self.st.shared_max != NULL:
            lmq_store_rel(self.st.shared_max, lmq_load_acq(&self.st.max_offset))

    def sync_shared(self):
        """Adopt the unit count the dispatcher of another process published: map the files written since and
        move ``max_offset`` up (never down). Returns the max offset."""
        cdef int64_t m
        if self.st.shared_max == NULL:
            return lmq_load_acq(&self.st.max_offset)
        m = lmq_load_acq(self.st.shared_max)
        if m > lmq_load_acq(&self.st.max_offset):
            mfq = self.mapped_file_queue
            if not mfq.files:
                names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and n.isascii() and n.isdigit()) \
                    if os.path.isdir(self.directory) else []
                if names:
                    self.st.min_offset = int(names[0]) // CQ_UNIT_SIZE
            mfq.sync_to(m * CQ_UNIT_SIZE)
            lmq_store_rel(&self.st.max_offset, m)
            # the end of the last real unit too: a process that takes the dispatch over tells the records already
            # in the queue (duplicates) from new ones by it
            for i in range(m - 1, max(self.st.min_offset, m - 64) - 1, -1):
                u = self.unit(i)
                if u is not None and u[1] > 0 and u[1] != CQ_BLANK_UNIT_SIZE:
                    self.st.max_physic_offset = u[0] + u[1]
                    break
        return m

    # -- load / recover ----------------------------------------------------------------------------------------

    def load(self):
        """Map the existing files. Raises CorruptStoreError on a wrong file size or a gap."""
        return self.mapped_file_queue.load()

    def recover(self):
        """Find the end of valid units (from the third-last file, as RocketMQ), set positions there and cut the
        files past it. Returns True when non-zero units were found after that end (damage in the middle of the
        queue, e.g. a zeroed page): those units are cut too and the caller rebuilds the queue from the log."""
        mfq = self.mapped_file_queue
        files = mfq.files
        cdef int64_t unit_per_file = self.st.file_size // CQ_UNIT_SIZE
        if not files:
            self._reset_state(0)
            return False
        start = max(0, len(files) - 3)
        end_offset = files[start].file_from_offset
        max_phys = -1
        damaged = False
        for i in range(start, len(files)):
            mf = files[i]
            # the file's data extents, asked once (SEEK_DATA / SEEK_HOLE): the valid prefix and the check for units
            # after it read only those
            ranges = mf.data_ranges()
            n_valid, last = _valid_prefix(mf, unit_per_file, ranges)
            if n_valid > 0 and last[1] != CQ_BLANK_UNIT_SIZE:
                max_phys = last[0] + last[1]
            end_offset = mf.file_from_offset + n_valid * CQ_UNIT_SIZE
            if n_valid < unit_per_file:
                # holes are skipped, not read: a sparse queue file is mostly holes (and on a full tmpfs reading
                # one through the mapping is a SIGBUS)
                damaged = (mf.has_data(n_valid * CQ_UNIT_SIZE, -1, ranges)
                           or any(later.has_data() for later in files[i + 1:]))
                break
        if damaged:
            log.error("consume queue %s-%d: invalid unit at logical offset %d with units after it; cutting there "
                      "and rebuilding from the commit log", self.topic, self.queue_id, end_offset)
        last_file = files[len(files) - 1]
        if not damaged and last_file.file_from_offset <= end_offset < last_file.file_from_offset + self.st.file_size:
            # the usual end: inside the last file, nothing but zeros after it there (has_data above), so cutting
            # would zero nothing and drop no file
            last_file.set_positions(end_offset - last_file.file_from_offset)
            mfq.flushed_where = min(mfq.flushed_where, end_offset)
            mfq.committed_where = min(mfq.committed_where, end_offset)
            dropped = []
        else:
            dropped = mfq.truncate_dirty_files(end_offset)
        if dropped:
            log.warning("consume queue %s-%d: dropped files past logical offset %d: %s", self.topic,
                        self.queue_id, end_offset, dropped)
        # the blank padding units at the start don't carry a physical offset; look back for a real one
        if max_phys < 0 and end_offset > 0:
            max_phys = self._last_physic_end(end_offset // CQ_UNIT_SIZE)
        self._reset_state(end_offset // CQ_UNIT_SIZE)
        self.st.max_physic_offset = max_phys
        return damaged

    def _last_physic_end(self, long long upto):
        """offset+size of the last real unit before unit index `upto` (-1 if none)."""
        found = -1
        for _base, arr in self._views(self._first_index(), upto):
            real = np.nonzero(arr["size"] != CQ_BLANK_UNIT_SIZE)[0]
            if len(real):
                j = int(real[-1])
                found = int(arr["offset"][j]) + int(arr["size"][j])
            del arr
        return found

    def _first_index(self):
        first = self.mapped_file_queue.first()
        return first.file_from_offset // CQ_UNIT_SIZE if first is not None else 0

    def _reset_state(self, long long max_offset):
        mfq = self.mapped_file_queue
        # no write target: the dispatcher's first unit takes the slow path (prepare_write), which maps the file it
        # falls in. A store opened with many queues keeps none of them pinned mapped for a writer that may never come
        self._clear_target()
        lmq_store_rel(&self.st.max_offset, max_offset)
        first = mfq.first()
        if first is not None:
            if self.st.min_offset * CQ_UNIT_SIZE < first.file_from_offset or self.st.min_offset > max_offset:
                self.st.min_offset = first.file_from_offset // CQ_UNIT_SIZE
        else:
            self.st.min_offset = max_offset

    def restore(self, long long max_offset, long long min_offset, long long max_physic_offset):
        """Set the queue's state from a queue snapshot that vouches for its files (store/queue_snapshot.py), without
        reading a unit: what ``recover`` and ``correct_min_offset`` would find in them. The files are loaded
        (``MappedFileQueue.load_known``) and the last one holds unit ``max_offset``."""
        mfq = self.mapped_file_queue
        last = mfq.last()
        if last is not None:
            end = max_offset * CQ_UNIT_SIZE
            last.set_positions(end - last.file_from_offset)
            mfq.flushed_where = min(mfq.flushed_where, end)
            mfq.committed_where = min(mfq.committed_where, end)
        self.st.min_offset = min_offset
        self._reset_state(max_offset)
        self.st.max_physic_offset = max_physic_offset

    def truncate_dirty(self, long long phy_offset):
        """Drop the units of the records at or past ``phy_offset`` (the log was cut there): the queue's tail after
        its last unit that points below it.

        Returns the number of units removed.
        """
        mfq = self.mapped_file_queue
        before = lmq_load_acq(&self.st.max_offset)
        cdef int64_t new_end = -1
        while mfq.files:
            mf = mfq.last()
            arr = offs = sizes = None
            arr = np.frombuffer(mf, dtype=CQ_DTYPE)
            try:
                limit = min(len(arr), max(0, (before * CQ_UNIT_SIZE - mf.file_from_offset) // CQ_UNIT_SIZE))
                arr = arr[:limit]
                valid = (arr["offset"] >= 0) & (arr["size"] > 0)
                n_valid = len(arr) if bool(valid.all()) else int(np.argmin(valid))
                offs = arr["offset"][:n_valid]
                sizes = arr["size"][:n_valid]
                keep = (offs < phy_offset) | (sizes == CQ_BLANK_UNIT_SIZE)
                # the units of records past the cut are the queue's tail (a queue's records lie in log order): cut
                # after the last unit that points below it. One damaged unit in the middle that points past the end
                # stays, for the unit check to rebuild it from the log, instead of taking every later unit with it
                kept_at = np.flatnonzero(keep)
                n_keep = int(kept_at[-1]) + 1 if len(kept_at) else 0
            finally:
                # every view of the file goes before it may be deleted: a view alive defers the unlink to its
                # release, after delete_last's directory fsync, so the deletion was not durable (a power cut
                # brought the file back with units past the log's end: tests/test_power_loss.py)
                del arr, offs, sizes
            if n_keep == 0 and mf.file_from_offset > 0 and len(mfq.files) > 1:
                mfq.delete_last()
                continue
            new_end = mf.file_from_offset + n_keep * CQ_UNIT_SIZE
            mfq.truncate_dirty_files(new_end)
            break
        if new_end < 0:
            new_end = 0
        self._reset_state(new_end // CQ_UNIT_SIZE)
        if new_end // CQ_UNIT_SIZE < before:
            self.st.max_physic_offset = self._last_physic_end(new_end // CQ_UNIT_SIZE)
        return before - new_end // CQ_UNIT_SIZE

    def truncate_to(self, long long index):
        """Keep the units before ``index`` only (a unit there failed verification against the log): files after it
        are deleted and the rest of its file zeroed; the dispatcher then rebuilds the queue from the log.
        Returns the number of units removed."""
        before = lmq_load_acq(&self.st.max_offset)
        self.mapped_file_queue.truncate_dirty_files(index * CQ_UNIT_SIZE)
        self._reset_state(index)
        if self.st.min_offset > index:
            self.st.min_offset = index
        self.st.max_physic_offset = self._last_physic_end(index)
        return max(0, before - index)

    def correct_min_offset(self, long long min_commit_log_offset):
        """Set min_offset to the first unit whose record is still in the commit log (>= the log's min offset)."""
        mx = lmq_load_acq(&self.st.max_offset)
        for base, arr in self._views(self._first_index(), mx):
            offs = arr["offset"]
            idx = np.nonzero((offs >= min_commit_log_offset) & (arr["size"] != CQ_BLANK_UNIT_SIZE))[0]
            if len(idx):
                self.st.min_offset = base + int(idx[0])
                return self.st.min_offset
        self.st.min_offset = mx
        return mx

    def delete_expired_files(self, long long min_commit_log_offset, long long forcibly_ms=60000, now_ms=None):
        """Retention: move ``min_offset`` to the first unit still in the commit log, then delete the files
        (never the last, which the dispatcher writes) whose units all point below ``min_commit_log_offset``,
        oldest first, stopping at the first file that still points at kept records, and keeping the one before a
        file whose first unit is a message past the log's min offset: the queue's first file then always starts
        at or below the log's min offset (or with pre-blank units), which is how recovery (``_verify_queues``)
        tells files retention deleted from lost ones without reading the log (RocketMQ's
        deleteExpiredFileByOffset + correctMinOffset; it reads only a file's last unit, this takes the largest
        real unit so a blank padding unit at a file's end cannot make it look expired).

        :param min_commit_log_offset: the commit log's new min offset.
        :param forcibly_ms: release readers that still hold a file this long after its first destroy.
        :param now_ms: the caller's clock in ms.
        :returns: the deleted paths (a file a reader holds is deleted by a later call or on its release).
        :raises OSError: when an unlink or the directory fsync fails.
        """
        mfq = self.mapped_file_queue
        # min first, so that readers stop asking for units before they vanish
        self.correct_min_offset(min_commit_log_offset)
        gone = mfq.retry_delete_hanged(forcibly_ms, now_ms)
        if mfq.hanged:
            return gone
        doomed = []
        files = mfq.files
        for i in range(len(files) - 1):
            mf = files[i]
            arr = np.frombuffer(mf, dtype=CQ_DTYPE)
            try:
                sizes = arr["size"]
                real = arr["offset"][(sizes > 0) & (sizes != CQ_BLANK_UNIT_SIZE)]
                last = int(real.max()) if len(real) else -1
            finally:
                del arr, sizes
            if last >= min_commit_log_offset or not _starts_below(files[i + 1], min_commit_log_offset):
                break
            doomed.append(mf)
        if doomed:
            gone += mfq.delete_files(doomed, forcibly_ms=forcibly_ms, now_ms=now_ms).deleted
        return gone

    # -- views ---------------------------------------------------------------------------------------------------

    def _views(self, long long start, long long end):
        """Yield (first unit index, structured array view) covering units [start, end), one per file."""
        mfq = self.mapped_file_queue
        cdef int64_t fs = self.st.file_size
        cdef int64_t upf = fs // CQ_UNIT_SIZE
        pos = start
        while pos < end:
            mf = mfq.find(pos * CQ_UNIT_SIZE)
            if mf is None:
                return
            base = mf.file_from_offset // CQ_UNIT_SIZE
            hi = min(end, base + upf)
            arr = np.frombuffer(mf, dtype=CQ_DTYPE, count=hi - base)[pos - base:]
            yield pos, arr
            pos = hi

    def units(self, long long start=-1, long long end=-1):
        """Units [start, end) as one structured array (layout.CQ_DTYPE: offset >i8, size >i4, tags_code >i8, also
        named tags).

        Zero-copy when the range lies in one file, a copy otherwise. Defaults to [min_offset, max_offset).
        """
        if start < 0:
            start = self.st.min_offset
        mx = lmq_load_acq(&self.st.max_offset)
        if end < 0 or end > mx:
            end = mx
        if start >= end:
            return np.empty(0, dtype=CQ_DTYPE)
        parts = [arr for _, arr in self._views(start, end)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts)

    def unit(self, long long index):
        """(offset, size, tags_code) of one unit, or None when out of range / file gone."""
        if index < self.st.min_offset or index >= lmq_load_acq(&self.st.max_offset):
            return None
        mf = self.mapped_file_queue.find(index * CQ_UNIT_SIZE)
        if mf is None:
            return None
        cdef MappedFile mfc = mf
        cdef int64_t rel = index * CQ_UNIT_SIZE - mfc.file_from_offset
        if mfc.addr == NULL and mfc.evicted:
            mfc.ensure_mapped()
        if mfc.addr == NULL:
            return None  # retention deleted it after the lookup
        cdef const uint8_t *p = mfc.addr + rel
        return (<int64_t>lmq_be64(p), <int32_t>lmq_be32(p + 8), <int64_t>lmq_be64(p + 12))

    # -- writes (dispatcher slow path; the fast path writes through CQState in _dispatch) ---------------

    def prepare_write(self, long long queue_offset):
        """Make the file holding unit ``queue_offset`` the write target (create it; pad a first file that starts
        mid-file with blank units, as RocketMQ's fillPreBlank). Raises OSError when the file cannot be created."""
        mfq = self.mapped_file_queue
        cdef int64_t fs = self.st.file_size
        cdef int64_t logical = queue_offset * CQ_UNIT_SIZE
        mf = mfq.find(logical)
        if mf is not None and self.made_ahead:
            # the first file, made ahead by the QueueFileMaker at this unit's base: padded as one made below
            self.made_ahead = False
            (<MappedFile>mf).ensure_reserved(logical - mf.file_from_offset + CQ_UNIT_SIZE)
            self._fill_pre_blank(mf, logical - mf.file_from_offset)
            self.st.min_offset = queue_offset
        if mf is None:
            last = mfq.last()
            if last is None:
                mf = mfq.create_file(logical - logical % fs)
                (<MappedFile>mf).ensure_reserved(logical - mf.file_from_offset + CQ_UNIT_SIZE)
                self._fill_pre_blank(mf, logical - mf.file_from_offset)
                self.st.min_offset = queue_offset
            else:
                while last.file_from_offset + fs <= logical:
                    last.wrote_position = fs
                    last = mfq.create_file(last.file_from_offset + fs)
                mf = last
        # the unit's blocks (and a step ahead) before the fast path may write there; OSError on a full disk
        (<MappedFile>mf).ensure_reserved(logical - mf.file_from_offset + CQ_UNIT_SIZE)
        self._set_target(<MappedFile>mf)

    def make_first_file(self, long long base):
        """Make the queue's first file, at ``base`` (QueueFileMaker's thread: its directories, the file sized and
        reserved, its mapping); the dispatcher pads it and writes its units (``prepare_write``). Nothing when the
        queue has a file already. Raises OSError when the file cannot be made."""
        mfq = self.mapped_file_queue
        with mfq.lock:
            if mfq.last() is not None:
                return
            # its first reserved page faulted in writable: the dispatcher's first unit write would otherwise wait for
            # the file system's page fault (a journal handle for the unwritten extent)
            mf = mfq.create_file(base, populate_first=True)
            (<MappedFile>mf).ensure_reserved(CQ_UNIT_SIZE)
            self.made_ahead = True

    cdef int _set_target(self, MappedFile mf) except -1:
        # mf becomes the file the dispatcher writes through st.addr without the GIL: mapped, and owned by this queue
        # so that a budget's trim leaves it mapped (or asks drop_write_target first)
        if self.cur is not mf:
            self._clear_target()
        if mf.ensure_mapped() == 0:
            raise StoreClosedError(f"consume queue file {mf.path} was deleted under its writer")
        mf.owner = self
        self.cur = mf
        self.st.addr = mf.addr
        self.st.reserved = mf.reserved
        self.st.file_from = mf.file_from_offset
        mf.nogil_reserve(&self.st.rsv)
        return 0

    cdef int _clear_target(self) except -1:
        self.st.addr = NULL
        self.st.reserved = 0
        self.st.rsv.path = NULL
        if self.cur is not None:
            (<MappedFile>self.cur).owner = None
        self.cur = None
        return 0

    def drop_write_target(self, MappedFile mf not None):
        """Stop writing ``mf`` through the raw pointer (a budget is about to unmap it): its written position is
        brought up to date first, and the next unit takes the slow path. Only the dispatcher's thread, or code that
        runs while no dispatcher does, may call it."""
        if self.cur is mf:
            self.sync_write_position()
            self._clear_target()

    def trim_mappings(self):
        """The dispatcher's turn to bound the store's mappings (its own write targets included). Returns how many
        files were unmapped."""
        if self.budget is None:
            return 0
        return self.budget.trim(True)

    def _fill_pre_blank(self, mf, long long upto):
        cdef bytes blank = ((0).to_bytes(8, "big") + (<object>CQ_BLANK_UNIT_SIZE).to_bytes(4, "big")
                            + (0).to_bytes(8, "big"))
        cdef int64_t p = 0
        while p < upto:
            mf.write_at(p, blank)
            p += CQ_UNIT_SIZE
        mf.wrote_position = upto

    def put_unit(self, long long queue_offset, long long phys, int size, long long tags_code, long long store_ts=0,
                 long long lost_at=-1, int lost_size=0):
        """Write one unit at ``queue_offset`` (slow path: recovery, gaps). Returns False for a duplicate.

        A unit ahead of max_offset fills the missing units and logs an error (they are counted in ``gap_units``);
        it never leaves zero units that would end the queue early. With ``lost_at`` (a gap record of ``lost_size``
        bytes: damaged records recovery quarantined) the missing units point at it, so a get there raises
        CorruptMessageError naming the loss, also before an empty queue's first unit; otherwise they are blank
        padding units (an empty queue then starts at ``queue_offset``, as RocketMQ's pre-blank does).
        """
        mx = lmq_load_acq(&self.st.max_offset)
        if queue_offset < mx or phys + size <= self.st.max_physic_offset:
            return False
        if queue_offset > mx and (mx > 0 or lost_at >= 0):
            if lost_at >= 0:
                log.error("consume queue %s-%d: units %d..%d were lost to damage in the commit log (gap record at "
                          "offset %d); a get there raises CorruptMessageError", self.topic, self.queue_id, mx,
                          queue_offset - 1, lost_at)
            else:
                log.error("consume queue %s-%d: unit %d arrives with %d missing before it; padding with blank "
                          "units", self.topic, self.queue_id, queue_offset, queue_offset - mx)
            self.gap_units += queue_offset - mx
            for q in range(mx, queue_offset):
                if lost_at >= 0:
                    self._write(q, lost_at, lost_size, 0)
                else:
                    self._write(q, 0, CQ_BLANK_UNIT_SIZE, 0)
        self._write(queue_offset, phys, size, tags_code)
        self.st.max_physic_offset = phys + size
        if store_ts:
            self.st.last_store_ts = store_ts
        lmq_store_rel(&self.st.max_offset, queue_offset + 1)
        if self.st.shared_max != NULL:
            lmq_store_rel(self.st.shared_max, queue_offset + 1)
        return True

    def mark_lost(self, long long index, long long phys, int size):
        """Rewrite unit ``index`` (below max_offset) as a lost unit: it points at the gap record at ``phys`` of
        ``size`` bytes that replaced its damaged message, so a get there raises CorruptMessageError. Returns False
        when the unit's file is gone."""
        if index < 0 or index >= lmq_load_acq(&self.st.max_offset):
            raise PositionOutOfRangeError(f"unit {index} outside 0..{lmq_load_acq(&self.st.max_offset)}", "index")
        mf = self.mapped_file_queue.find(index * CQ_UNIT_SIZE)
        if mf is None:
            return False
        mf.write_at(index * CQ_UNIT_SIZE - mf.file_from_offset,
                    (<object>phys).to_bytes(8, "big") + (<object>size).to_bytes(4, "big") + bytes(8))
        return True

    def _write(self, long long q, long long phys, int size, long long tags):
        cdef int64_t rel = q * CQ_UNIT_SIZE - self.st.file_from
        if self.st.addr == NULL or rel < 0 or rel + CQ_UNIT_SIZE > self.st.reserved:
            self.prepare_write(q)
            rel = q * CQ_UNIT_SIZE - self.st.file_from
        cdef uint8_t *p = self.st.addr + rel
        lmq_put64(p, <uint64_t>phys)
        lmq_put32(p + 8, <uint32_t>size)
        lmq_put64(p + 12, <uint64_t>tags)
        self.cur.wrote_position = rel + CQ_UNIT_SIZE

    def sync_write_position(self):
        """Copy the published max offset into the current file's wrote position (before a flush)."""
        cur = self.cur
        if cur is not None:
            rel = lmq_load_acq(&self.st.max_offset) * CQ_UNIT_SIZE - cur.file_from_offset
            if 0 <= rel <= self.st.file_size and rel > cur.wrote_position:
                cur.wrote_position = rel

    def flush(self, int least_pages=0):
        """Flush written units (one file per call). Returns True when nothing was flushed."""
        self.sync_write_position()
        return self.mapped_file_queue.flush(least_pages)

    def close(self):
        self._clear_target()
        self.mapped_file_queue.close()

    def destroy(self):
        self._clear_target()
        self.mapped_file_queue.destroy()
        lmq_store_rel(&self.st.max_offset, 0)
        self.st.min_offset = 0
        self.st.max_physic_offset = -1

    def __repr__(self):
        return f"ConsumeQueue({self.topic!r}, {self.queue_id}, min={self.st.min_offset}, max={self.st.max_offset})"
