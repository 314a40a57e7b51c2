"""SharedMessageQueue: one store opened by many processes at once, through the control file ``<root>/mpctl``.

How it works (ARCHITECTURE.md, "Many processes, one store"): every process maps the same segments. A put takes
this process's put lock, then the control file's robust writer lock, moves its view to the committed end
published there, records an intent, writes, and commits with a release store of the new end. One elected
process, the housekeeper (whoever holds an fcntl lock on a byte of the control file), runs what must run once
per store: dispatch into the ConsumeQueues, the IndexFile, flushing, retention and the checkpoint. Readers in
every process adopt the unit counts it publishes and sleep on a shared eventcount.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from localmq._mapped_file import MappedFile, offset_to_file_name
from localmq._native import fsync_dir
from localmq._shm import ControlFile
from localmq.client.shared import SharedClientTable, SharedConsumerScheduler, SharedOffsetManager
from localmq.config import FlushDiskType
from localmq.errors import (
    ConfigError,
    ControlFileError,
    CorruptStoreError,
    DispatchError,
    IndexDisabledError,
    StoreBusyError,
    StoreLockedError,
    UnsupportedFilesystemError,
    io_operation,
)
from localmq.layout import (
    ABORT_FILE,
    CHECKPOINT_FILE,
    COMMITLOG_DIR,
    CONSUMEQUEUE_DIR,
    CTL_FILE,
    CTL_I_STATE,
    CTL_LOCK_BYTE_HOUSEKEEPER,
    CTL_LOCK_BYTE_STORE,
    CTL_S_CQ_SIZE,
    CTL_S_DISK_FULL,
    CTL_S_FLUSHED,
    CTL_S_HOUSEKEEPER,
    CTL_S_INDEXED,
    CTL_S_PUTS,
    CTL_S_READY,
    CTL_S_REPAIRS,
    CTL_S_REPUT,
    CTL_S_ROWS_UNCHECKED,
    CTL_S_SEG_SIZE,
    CTL_S_WPOS,
    CTL_T_DISPATCHED,
    CTL_TOPIC_QUEUES,
    LOCK_FILE,
    SEGMENT_NAME_RE,
    is_decimal,
)
from localmq.queues.local import LocalMessageQueue
from localmq.services.flush import FlushConsumeQueueService, FlushRealTimeService, SharedGroupCommitService
from localmq.services.reput import ReputMessageService
from localmq.services.service_thread import ServiceThread
from localmq.status import PutStatus
from localmq.store.checkpoint import StoreCheckpoint
from localmq.store.commit_log import CommitLog
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.consume_queue_table import ConsumeQueueTable
from localmq.store.dispatch import ReputCore
from localmq.store.index import IndexReader
from localmq.store.lock import StoreLock
from localmq.store.mapped_file_queue import MappedFileQueue
from localmq.store.queue_recovery import RecoveryReport
from localmq.store.queue_snapshot import FRESH_NS, fs_clock, handover_path
from localmq.store.settings import write_log_start
from localmq.store.undo import OpenUndo

log = logging.getLogger("localmq.shared")

# How often a process that is not the housekeeper tries to become it (the takeover time after the housekeeper
# dies or closes is at most this plus the start of its services).
ELECTION_INTERVAL_MS = 100
# Filesystems (/proc/mounts types) where a robust mutex in a shared mapping and fcntl locks cannot be trusted: the
# processes sharing a store may run on other hosts, or the locks are emulated.
NETWORK_FILESYSTEMS = frozenset("nfs nfs4 cifs smb3 smbfs 9p ceph glusterfs lustre afs gfs2 ocfs2 fuse fuseblk".split())


def filesystem_type(path: str) -> str:
    """The type of the filesystem holding ``path`` (longest mount point prefix in /proc/mounts), "" if unknown."""
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return ""
    return kind


# Seconds an opener waits for another process's open (a first opener's recovery can take a while on a big log).
OPEN_WAIT_S = 300.0


def segment_ahead(committed_end: int, segment_size: int) -> Optional[int]:
    """Base of the segment to create ahead of a log committed up to ``committed_end``: the one after the segment
    holding the last committed byte (None for an empty log). At a segment boundary (a roll whose new segment could
    not be created commits the blank record alone) that is the boundary's own segment, never the one after it, so
    the files never have a hole in the middle, not even for a moment (file readers refuse one)."""
    if committed_end <= 0:
        return None
    return ((committed_end - 1) // segment_size + 1) * segment_size


class _Election(ServiceThread):
    """Tries every ELECTION_INTERVAL_MS to take the housekeeper's byte; the kernel frees it when its holder dies."""

    def __init__(self, queue: "SharedMessageQueue") -> None:
        super().__init__("HousekeeperElection")
        self.queue = queue

    def run(self) -> None:
        while not self.stopped:
            try:
                q = self.queue
                q._try_become_housekeeper()
                if q._housekeeper:
                    # a writer that died holding the lock leaves a torn put until the next put: repair it now
                    q.commit_log.check_writer()
                    q._allocate_ahead()
                q._share_disk_full()
            except Exception:  # noqa: BLE001 - logged and counted; the next round tries again
                self.errors += 1
                log.exception("becoming the housekeeper of %s", self.queue.root)
            self.wait_for_running(ELECTION_INTERVAL_MS)


class SharedMessageQueue(LocalMessageQueue):
    """A LocalMessageQueue that other processes may open at the same time (``localmq.open(path, shared=True)``).

    Every process can put, get and consume. One total order in the CommitLog, dense queue offsets per queue,
    every committed put dispatched once by the housekeeper. A process killed at any moment (even holding the
    writer lock halfway through a record) leaves the others running: the next writer repairs the torn put, and
    another process takes over the housekeeping within ELECTION_INTERVAL_MS. The last process to close closes
    the store cleanly.

    Differences from a store opened by one process (``shared=False``): queue ids 0..63 per topic and at most
    131,072 topics (the control file's table); no transient store pool; the housekeeper creates one segment ahead
    (the exclusive store two, warmed if asked); key lookups (``query_message``) answer in the housekeeper process
    only; transactional producers are refused (TransactionNotSupportedError). The queue snapshot of a clean close
    is written by the last process to leave, and the running cuts (``queues.running``) by the housekeeper, from the
    rows the first opener handed over (``config/queues.handover``) and the queues the writer built itself: a queue
    another process's dispatcher wrote to since the handover is listed, not vouched for, and the open after a crash
    checks it (without a handover, from a first opener that died before writing it, there is no cut).
    """

    # the dispatcher moves between processes, none of which holds every queue: the housekeeper's running cuts and
    # the last closer's snapshot hold the first opener's handed-over rows (SnapshotWriter.take_cut,
    # _write_closed_snapshot), and an open after a crash reads the last cut as a single process's open does
    _reads_running_cut = True

    _ctl: Optional[ControlFile] = None
    _election: Optional[_Election] = None
    _housekeeper = False
    _hk_flush: Optional[ServiceThread] = None
    _allocated_ahead = -1  # base offset of the last segment the housekeeper created ahead (or found)
    allocated_ahead = 0  # segments this process created ahead of need as the housekeeper
    first_opener = False
    _first_exit_ok = False  # the first opener found the last exit clean (its index files are whole)

    def _make_lock(self) -> StoreLock:
        return StoreLock(self.root, shared=True)

    def _list_for_undo(self, created_root: Optional[str]) -> Optional[OpenUndo]:
        """Other processes may be writing the store: until this one recovers it as the first opener (when they
        all wait), a failed open undoes only what it created itself."""
        lock_path = os.path.join(self.root, LOCK_FILE)
        return OpenUndo(
            self.root, created_root, (lock_path,) if self._lock.created else (), listing=False, defer_queues=True
        )

    # -- open ---------------------------------------------------------------------------------------------------

    def _open(self, progress) -> None:
        c = self.config
        if c.transient_store_pool_enable:
            raise ConfigError(
                "transient_store_pool_enable writes through a buffer of one process; a store shared "
                "between processes writes straight into the shared mapping (use shared=False)"
            )
        fs_type = filesystem_type(self.root)
        if fs_type.split(".")[0] in NETWORK_FILESYSTEMS:
            raise UnsupportedFilesystemError(
                f"{self.root} is on a {fs_type} filesystem: a store shared between processes needs a local one "
                f"(its robust mutex and fcntl locks do not hold across hosts); open it with shared=False"
            )
        self._hk_lock = threading.RLock()
        self._hk_services: List[Any] = []
        self._reput_attached = False
        ctl_path = os.path.join(self.root, CTL_FILE)
        ctl_created = () if os.path.lexists(ctl_path) else (ctl_path,)
        self._ctl = ctl = ControlFile(ctl_path)
        ctl.slots.claim()
        self._take_byte(CTL_LOCK_BYTE_STORE, OPEN_WAIT_S, "another process's open", refuse=self._refuse_unchecked)
        try:
            if ctl.load(CTL_S_READY) == 1:
                self._attach()
            else:
                # the first process of a run (or the one after a first opener died mid-recovery): recover as a
                # single process would, with every other opener waiting on the store byte
                if self._undo is not None:
                    self._undo.retake(ctl_created)  # nobody else writes until this open ends
                ctl.store(CTL_S_ROWS_UNCHECKED, 0)  # (a first opener whose check failed has closed)
                last_exit_ok = self._recover(progress)
                self._check_recovered_rows()
                self._record_settings()
                self._publish_first()
                self._mark_running()
                self.first_opener = True
                self._first_exit_ok = last_exit_ok
                # every other row checked on a thread, the store byte held until it ends (close waits for it); then
                # the rows for the last closer, written beside the running store
                self._handover = threading.Thread(
                    target=self._check_rows, args=(self._queue_mins_at(),), name="localmq-row-check", daemon=True
                )  # (started once the open is done: _bind_to_process)
        finally:
            if self._handover is None:
                ctl.range_lock(CTL_LOCK_BYTE_STORE, 0)
        self._setup_reads()
        if c.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            # puts of every process wait for the housekeeper's group commit (SharedGroupCommitService)
            self.commit_log.set_shared_sync_flush(c.sync_flush_timeout)
        self._try_become_housekeeper()
        self._election = _Election(self)
        self._election.start()

    def _take_byte(self, byte: int, timeout: float, what: str, refuse: Optional[Callable[[], None]] = None) -> None:
        deadline = time.monotonic() + timeout
        assert self._ctl is not None
        while not self._ctl.range_lock(byte, 2):
            if refuse is not None:
                refuse()
            if time.monotonic() >= deadline:
                raise StoreBusyError(f"{self.root}: {what} did not end within {timeout} s", timeout=timeout)
            time.sleep(0.002)

    def _publish_first(self) -> None:
        """First opener: fill the control file from the recovered files (committed end, queue offsets, unit
        counts, dispatched offset); the row check marks it ready (_check_rows)."""
        ctl, c, table = self._ctl, self.config, self.commit_log.topic_table()
        assert ctl is not None
        # a first opener killed during its row check may have died in a put: recovery undid it from the files
        ctl.store(CTL_I_STATE, 0)
        for topic, qid in list(table) + list(self._cqs):
            if qid >= CTL_TOPIC_QUEUES:
                raise ConfigError(
                    f"queue {topic}-{qid}: a store shared between processes has queue ids "
                    f"0..{CTL_TOPIC_QUEUES - 1}; open this store with shared=False"
                )
        self.commit_log.attach_control(ctl, c.shared_lock_timeout)
        ctl.store(CTL_S_SEG_SIZE, self._cl_mfq.file_size)
        ctl.store(CTL_S_CQ_SIZE, c.mapped_file_size_consume_queue)
        for (topic, qid), nxt in table.items():
            self.commit_log.set_queue_offset(topic, qid, nxt)
        for (topic, qid), cq in self._cq_table.built.items():
            self.commit_log.set_queue_offset(topic, qid, max(cq.max_offset, table.get((topic, qid), 0)))
            cq.bind_shared(ctl)
            cq.publish_shared()
        # the queues kept as their snapshot rows (checked later: _check_rows), published without being built: their
        # cells written straight into the topic table (no other process is attached: no writer lock needed)
        ctl.publish_queues(self._cq_table.rows, table)
        # the rows' cells are published unchecked: a row is checked as it is built (the put path builds a topic's
        # rows before it binds the topic: CommitLog.topic_miss), repaired when it fails, its cells published again
        self._recovered_next = table
        self._cq_table.adopt = self._adopt
        self._cq_table.repair = functools.partial(self._repair_and_publish, self._cq_table.repair)
        ctl.store(CTL_S_REPUT, self._reput.reput_offset)
        ctl.store(CTL_S_WPOS, self._cl_mfq.max_offset())
        self._shared_live = True  # (CTL_S_READY once the rows are checked: one killed before leaves it 0)

    def _check_recovered_rows(self) -> None:
        """First opener, before it publishes: the rows of the topics recovery wrote to or built a queue of (bound at
        once by _publish_first) checked (built) now, a failed one repaired from the log."""
        for topic in {t for t, _ in self.commit_log.topic_table()} | {t for t, _ in self._cq_table.built}:
            self._cq_table.next_offsets(topic)

    def _repair_and_publish(self, repair: Callable[..., None], key: Tuple[str, int], cq: ConsumeQueue, row_max: int):
        """First opener, while it checks the rows: a row that failed, repaired; its cells published again (no other
        process is attached, and this one binds the topic only after its rows are built: nobody read them)."""
        repair(key, cq, row_max)
        assert self._ctl is not None
        cq.bind_shared(self._ctl)
        self._ctl.publish_queues({key: cq}, self._recovered_next)

    _recovered_next: Dict[Tuple[str, int], int] = {}
    rows_check_error: Optional[BaseException] = None  # why the first opener's check of the rows failed

    def _check_rows(self, mins_at: int) -> None:
        """First opener, on a thread once open, the store byte held (other openers wait): check every queue the snapshot
        kept as its row (other processes load queues from their files unchecked), repair those that fail, let the
        others in, then hand the rows over for the last closer (SnapshotWriter.write_handover), stamped against the
        file system's clock read before they came in. A failure (an I/O error, a failed repair) keeps the byte until
        this process closes: the rows it could not check raise on their use here, other openers are refused
        (StoreLockedError) rather than trusting them, and the next open checks them again."""
        table, ctl = self._cq_table, self._ctl
        assert table is not None and ctl is not None
        try:
            for key in table.check_rows():
                table.get(key)  # repaired (unless a use built it meanwhile)
        except BaseException as e:  # noqa: BLE001 - kept, logged, and shown to every other opener
            self.rows_check_error = e
            ctl.store(CTL_S_ROWS_UNCHECKED, os.getpid())
            log.error("%s: the check of the snapshot's queues failed (%s): no other process opens it", self.root, e)
            return
        table.end_repairs()
        self.commit_log.topic_miss = None  # every row checked: the cells hold
        fs_now = self._handover_clock()
        ctl.store(CTL_S_READY, 1)  # the next opener attaches (until now it would recover the store as its first)
        ctl.range_lock(CTL_LOCK_BYTE_STORE, 0)
        if fs_now is not None:
            self._snapshots().write_handover(fs_now, mins_at)

    def _refuse_unchecked(self) -> None:
        """An opener waiting on the store byte: the first opener's check of its rows failed (_check_rows)."""
        assert self._ctl is not None
        pid = self._ctl.load(CTL_S_ROWS_UNCHECKED)
        if pid:
            raise StoreLockedError(
                f"{self.root}: the first process to open it (pid {pid}) could not check the queues "
                f"of its snapshot (its log says why): it keeps the store until it closes"
            )

    _handover: Optional[threading.Thread] = None

    def _handover_clock(self) -> Optional[int]:
        """The file system's clock for the handover, read by the first opener before it lets other processes in: a
        topic directory one of them changes later is not vouched for by the handover (the closer lists it)."""
        if self.recovery.mode == "abnormal" or self.recovery.repaired:
            # queue files this open wrote are vouched for once older than what a change could share a ctime with
            time.sleep(FRESH_NS / 1e9)
        try:
            return fs_clock(handover_path(self.root) + ".tmp")
        except OSError as e:
            log.warning("%s: no rows handed over (%s); the last close writes no queue snapshot", self.root, e)
            return None

    def _unit_count(self, topic: str, queue_id: int) -> int:
        """The queue's unit count in the control file; -1 when it has none."""
        ctl = self._ctl
        assert ctl is not None
        row = ctl.topic_row(topic) if 0 <= queue_id < CTL_TOPIC_QUEUES else -1
        return -1 if row < 0 else ctl.load(row + CTL_T_DISPATCHED + 8 * queue_id)

    def _delete_segments_ahead(self) -> None:
        """The last closer: the segment the housekeeper made ahead of the committed end (the newest, after the one
        holding the end) holds nothing; it is deleted, as the exclusive store's allocator deletes one no put took,
        so that the next open finds the log as this close left it (recovery would delete it, and its snapshot would
        not be used). Any other file past the end is left to the next open's checks."""
        assert self._ctl is not None
        directory = self._cl_mfq.directory
        end = self._ctl.load(CTL_S_WPOS)
        nxt = segment_ahead(end, self._cl_mfq.file_size)
        if nxt is None or nxt <= end:
            return
        try:
            newest = max((int(n) for n in os.listdir(directory) if SEGMENT_NAME_RE.fullmatch(n)), default=-1)
            if newest == nxt:
                os.unlink(os.path.join(directory, offset_to_file_name(nxt)))
                fsync_dir(directory)
        except OSError as e:
            log.warning("%s: the segment made ahead could not be deleted (%s); the next open deletes it", self.root, e)

    def _write_closed_snapshot(self) -> None:
        """The last closer, dispatch caught up and everything flushed (SnapshotWriter.write_from_handover); a process
        that did not open the store first loaded its queues from their files: their min offsets are made right."""
        fix_mins = self._queue_mins_at() != self._cl_mfq.min_offset()
        self._snapshots().write_from_handover(self.config.mapped_file_size_consume_queue, self._unit_count, fix_mins)

    def _attach(self) -> None:
        """A later opener: map the files as they are (no recovery, nothing written) up to the committed end."""
        ctl = self._ctl
        assert ctl is not None
        c = self.config
        for word, mine, name in (
            (CTL_S_SEG_SIZE, c.mapped_file_size_commit_log, "mapped_file_size_commit_log"),
            (CTL_S_CQ_SIZE, c.mapped_file_size_consume_queue, "mapped_file_size_consume_queue"),
        ):
            theirs = ctl.load(word)
            if theirs != mine:
                raise ConfigError(f"{name}={mine}, but the processes that have {self.root} open use {theirs}")
        self._abort_path = os.path.join(self.root, ABORT_FILE)
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, CHECKPOINT_FILE))
        self._cq_root = os.path.join(self.root, CONSUMEQUEUE_DIR)
        self._cl_mfq = MappedFileQueue(
            os.path.join(self.root, COMMITLOG_DIR),
            c.mapped_file_size_commit_log,
            reserve_step=c.reserve_step_commit_log,
        )
        self._cl_mfq.load_view(ctl.load(CTL_S_WPOS))
        # the housekeeper's retention records where the log starts before it deletes segments
        self._cl_mfq.before_head_delete = functools.partial(write_log_start, self.root)
        self._cq_table = ConsumeQueueTable(
            self._cq_root, c.mapped_file_size_consume_queue, c.reserve_step_consume_queue, c.max_mapped_queue_files
        )
        self._cqs = self._cq_table.built  # an attached process takes queues from their files, as it uses them
        self.commit_log = CommitLog(
            self._cl_mfq, max_message_size=c.max_message_size, store_host=c.store_host, born_host=c.born_host
        )
        self.commit_log.attach_control(ctl, c.shared_lock_timeout)
        self._reput = ReputCore(self._cl_mfq, self._cq_factory, ctl.load(CTL_S_REPUT), c.dispatch_idle_wait_us)
        self._reput.set_delay_levels(self.delay_levels_ms())
        self._mins_at = self._cl_mfq.min_offset()  # every queue it loads gets its min offset right for it (_adopt)
        self._shared_live = True
        self.recovery = RecoveryReport(
            mode="attached", end_offset=ctl.load(CTL_S_WPOS), reput_from=ctl.load(CTL_S_REPUT)
        )

    def _adopt(self, cq: ConsumeQueue) -> None:
        """A ConsumeQueue loaded from files another process's dispatcher wrote, or built from a row
        (ConsumeQueueTable.adopt; a row whose check failed is loaded from its files, which that dispatcher may have
        written to): take its unit count from the control file, set the write position after it, and make its min
        offset right for the log's start this process's queues are right for (``_mins_at``), as an open makes
        every queue's (a housekeeper's running cut vouches for it with that start)."""
        assert self._ctl is not None
        if cq.bind_shared(self._ctl):
            cq._reset_state(cq.sync_shared())
        if self._mins_at >= 0:
            cq.correct_min_offset(self._mins_at)

    def _schedule_cq(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        """The housekeeper's ScheduleMessageService reads the dispatcher's queues, loading one another housekeeper
        created before this one took over."""
        cq = self._cqs.get((topic, queue_id))
        ctl = self._ctl
        if cq is None and ctl is not None and not ctl.closed and ctl.topic_row(topic) >= 0:
            cq = self._cq_table.find_or_load(topic, queue_id, self._adopt)
        return cq

    def _schedule_read(self, physical_offset: int):
        self.commit_log.sync_view()
        return super()._schedule_read(physical_offset)

    _shared_live = False  # the control file describes the store (after _publish_first or _attach)

    def _cq_factory(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        if self._cq_table.row_holds_record((topic, queue_id), self._reput.position):
            return None  # (as in a single process)
        if not self._shared_live:
            return self._cq_table.find_or_create(topic, queue_id)  # first opener's recovery: the files are its own
        assert self._ctl is not None
        cq = self._cq_table.find_or_load(topic, queue_id, self._adopt)
        if not cq.bind_shared(self._ctl):
            raise CorruptStoreError(
                f"{self._ctl.path}: a record of {topic}-{queue_id} was committed but the topic "
                f"has no row in the shared topic table"
            )
        return cq

    # -- housekeeping: the work done once per store ----------------------------------------------------------------

    @property
    def housekeeper(self) -> bool:
        """True while this process runs the store's dispatch, index, flush and retention."""
        return self._housekeeper

    def _try_become_housekeeper(self) -> bool:
        ctl = self._ctl
        with self._hk_lock:
            if self._housekeeper or self._closed_for_housekeeping or ctl is None:
                return False
            if not ctl.range_lock(CTL_LOCK_BYTE_HOUSEKEEPER, 2):
                return False
            try:
                self._start_housekeeping()
            except BaseException:
                self._stop_housekeeping(flush=False)
                raise
            return True

    _closed_for_housekeeping = False

    def _start_housekeeping(self) -> None:
        ctl = self._ctl
        assert ctl is not None
        c = self.config
        self._housekeeper = True
        ctl.store(CTL_S_HOUSEKEEPER, os.getpid())
        self.commit_log.sync_view()
        # this process's queues may lag what the previous housekeeper dispatched: adopt its counts (a row's queue
        # adopts them as it is built: ConsumeQueueTable.adopt)
        for cq in list(self._cq_table.built.values()):
            if cq.bind_shared(ctl):
                cq._reset_state(cq.sync_shared())
            self._reput.register(cq)
        self._reput.set_reput_offset(ctl.load(CTL_S_REPUT))
        if not self._reput_attached:
            self._reput.attach_control(ctl, self.commit_log.sync_view)
            self._reput_attached = True
        self._reput.reset_stop()
        self._reput.error = None
        svc = ReputMessageService(self._reput, check_disk=self._check_log_on_disk)
        self._reput_service = svc
        svc.start()
        self._hk_services.append(svc)
        if c.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self._hk_flush = SharedGroupCommitService(self._cl_mfq, ctl, self.commit_log)
        else:
            self._hk_flush = FlushRealTimeService(self._cl_mfq, c, self.checkpoint)
        self._hk_flush.start()
        self._hk_services.append(self._hk_flush)
        # its running cuts (queues.running) for an open after a crash, from the first opener's handover
        snapshots = self._snapshots()
        snapshots.unit_count = self._unit_count
        reput = self._reput
        snapshots.dispatched = lambda: reput.reput_offset
        self._cq_flush_service = FlushConsumeQueueService(
            lambda: self._cq_table.built.values(),
            c,
            self.checkpoint,
            self.checkpoint.flush,
            self._cq_table.sync_names,
            take_cut=snapshots.take_cut,
            write_cut=snapshots.write_cut,
            cut_due=snapshots.cut_due,
        )
        self._cq_flush_service.start()
        self._hk_services.append(self._cq_flush_service)
        before = len(self._services)
        self._start_index_service(self._first_exit_ok and self.first_opener)
        self._hk_services.extend(self._services[before:])
        if self._index_dispatch is not None:
            ctl.store(CTL_S_INDEXED, self._index_dispatch.indexed_offset)
            self._index_dispatch.on_progress = lambda off: ctl.store(CTL_S_INDEXED, off)
        self._start_clean_service()
        # delayed messages and retries: delayOffset.json has one writer, the housekeeper
        self._hk_services.append(self._start_schedule_service())
        log.info(
            "pid %d is the housekeeper of %s from commit log offset %d",
            os.getpid(),
            self.root,
            self._reput.reput_offset,
        )

    def _stop_housekeeping(self, flush: bool) -> None:
        """Stop this process's housekeeping services and hand the role on (the byte is released last)."""
        with self._hk_lock:
            if self.schedule_service is not None:
                self._stop_service(self.schedule_service)  # it puts: stopped first, its offsets written
                self.schedule_service = None
            self._stop_clean_service()
            self.clean_service = None
            for svc in reversed(self._hk_services):
                self._stop_service(svc)
            self._hk_services = []
            if self.index_service is not None:
                try:
                    if flush:
                        self.index_service.flush()
                finally:
                    self.index_service.close()
                    self.index_service = None
                    self._index_dispatch = None
            if flush:
                self._flush_all()
            if self._ctl is not None and self._housekeeper:
                self._ctl.range_lock(CTL_LOCK_BYTE_HOUSEKEEPER, 0)
            self._housekeeper = False

    # -- consumer groups and offsets across processes ----------------------------------------------------------

    def client_backends(self, flush_interval_ms: int):
        """(offset manager, scheduler) of this queue's clients: both over the control file's clients' table, so
        that consumer groups span processes and every process's commits land in the one consumerOffset.json."""
        assert self._ctl is not None
        table = SharedClientTable(self._ctl, self.config.shared_lock_timeout)
        scheduler = SharedConsumerScheduler(table)
        # the commit log flushed (every process's records: _flush_log moves the view first) before each write of
        # consumerOffset.json, as an exclusive store's manager does (tests/test_power_loss_shared.py)
        offsets = SharedOffsetManager(
            table, self.offset_store_path, flush_interval_ms, before_write=self.flush_before_offsets
        )
        return offsets, scheduler

    def _allocate_ahead(self) -> None:
        """Housekeeper, every election round: create the segment after the one being written, sized and its first
        step reserved (MappedFile's O_TMPFILE + link: it appears only once sized), so that the put that rolls maps
        it instead of creating it (RocketMQ's AllocateMappedFileService, one segment ahead). A put that rolls first
        creates it itself, as before; both at once is safe (the second link finds the name and opens it). A file
        past the committed end is cut by recovery after a crash, as the exclusive store's allocation ahead is."""
        ctl = self._ctl
        c = self.config
        if ctl is None or ctl.closed or not c.preallocate_mapped_file or ctl.load(CTL_S_DISK_FULL):
            return
        mfq = self._cl_mfq
        fs = mfq.file_size
        nxt = segment_ahead(ctl.load(CTL_S_WPOS), fs)
        if nxt is None or nxt == self._allocated_ahead:
            return
        path = os.path.join(mfq.directory, offset_to_file_name(nxt))
        if os.path.exists(path) or not os.path.exists(os.path.join(mfq.directory, offset_to_file_name(nxt - fs))):
            self._allocated_ahead = nxt
            return
        self._allocated_ahead = nxt
        try:
            mf = MappedFile(path, fs, nxt, create=True, reserve=mfq.reserve, reserve_step=mfq.reserve_step)
            mf.close()
            fsync_dir(mfq.directory)
        except OSError as e:  # a full disk: the put that rolls meets it with a typed error; not retried for this one
            log.warning("cannot create commit log segment %s ahead of need: %s", path, e)
            return
        self.allocated_ahead += 1

    def _share_disk_full(self) -> None:
        """Retention runs in the housekeeper; its disk-full refusal (SERVICE_NOT_AVAILABLE) reaches the puts of
        every process through CTL_S_DISK_FULL, within one election round."""
        ctl = self._ctl
        if ctl is None or ctl.closed:
            return
        cl = self.commit_log
        if self._housekeeper:
            ctl.store(CTL_S_DISK_FULL, 1 if cl.refuse_status is PutStatus.SERVICE_NOT_AVAILABLE else 0)
        elif ctl.load(CTL_S_DISK_FULL):
            if cl.refuse_status is None:
                cl.refuse_status = PutStatus.SERVICE_NOT_AVAILABLE
        elif cl.refuse_status is PutStatus.SERVICE_NOT_AVAILABLE:
            cl.refuse_status = None

    # -- reads in every process ----------------------------------------------------------------------------------

    def _cq(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        self._check_open()
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            assert self._ctl is not None
            if not 0 <= queue_id < CTL_TOPIC_QUEUES or self._ctl.topic_row(topic) < 0:
                return None
            cq = self._cq_table.find_or_load(topic, queue_id, self._adopt)
        if not self._housekeeper:
            cq.sync_shared()
        self.commit_log.sync_view()  # the records its units point at are mapped
        return cq

    def look_message_by_offset(self, physical_offset: int, *, zero_copy: bool = False):
        self._check_open()
        self.commit_log.sync_view()
        return super().look_message_by_offset(physical_offset, zero_copy=zero_copy)

    def topics(self) -> Dict[str, List[int]]:
        """{topic: sorted queue ids} of every queue with a ConsumeQueue (on disk or in this process)."""
        self._check_open()
        out: Dict[str, set] = {}
        for t, q in list(self._cqs):
            out.setdefault(t, set()).add(q)
        if os.path.isdir(self._cq_root):
            for t in os.listdir(self._cq_root):
                tdir = os.path.join(self._cq_root, t)
                if os.path.isdir(tdir):
                    for q in os.listdir(tdir):
                        if is_decimal(q):
                            out.setdefault(t, set()).add(int(q))
        return {t: sorted(qs) for t, qs in sorted(out.items())}

    # -- key lookups: the housekeeper's index files, read by every process ---------------------------------

    _index_reader: Optional[IndexReader] = None

    def _require_index(self):
        self._check_open()
        if not self.config.message_index_enable:
            raise IndexDisabledError("the message index is disabled (message_index_enable=False)")
        return self.index_service

    def _query_index(self, topic: str, key: str, max_num: int, begin: int, end: int, uniq_only: bool) -> List[Any]:
        self.commit_log.sync_view()  # the records the index points at are mapped
        with self._hk_lock:
            svc = self.index_service if self._housekeeper else None
            if svc is None:
                if self._index_reader is None:
                    self._index_reader = IndexReader(self.root)
                self._index_reader.refresh()
                svc = self._index_reader
        mfq = self._cl_mfq
        return svc.query_messages(mfq.files, mfq.file_size, topic, key, max_num, begin, end, uniq_only)

    def wait_for_index(self, timeout: Optional[float] = None) -> bool:
        """Block until every message committed (by any process) before this call is indexed by the housekeeper."""
        self._require_index()
        ctl = self._ctl
        assert ctl is not None
        target = self.commit_log.sync_view()
        deadline = None if timeout is None else time.monotonic() + timeout
        while ctl.load(CTL_S_INDEXED) < target:
            if self._closed:
                raise self._closed_error()
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.002)  # the index has no eventcount: lookups wait rarely
        return True

    @property
    def progress(self) -> int:
        """The dispatched commit log offset of the store (every process's messages)."""
        assert self._ctl is not None
        return self._ctl.load(CTL_S_REPUT)

    @property
    def dispatch_behind_bytes(self) -> int:
        assert self._ctl is not None
        return max(0, self._ctl.load(CTL_S_WPOS) - self._ctl.load(CTL_S_REPUT))

    def wait_for_dispatch(self, timeout: Optional[float] = None) -> bool:
        """Block until every message committed (by any process) before this call is in its ConsumeQueue."""
        self._check_open()
        return self._wait_dispatched(self.commit_log.sync_view(), timeout)

    def _wait_dispatched(self, target: int, timeout: Optional[float]) -> bool:
        ctl = self._ctl
        assert ctl is not None
        ev = ctl.dispatched_events
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = ev.seq()
            if ctl.load(CTL_S_REPUT) >= target:
                return True
            if self._housekeeper and self._reput.error is not None:
                err = self._reput.error
                raise self._dispatch_stopped(err) from err
            if self._closed:
                raise self._closed_error()
            wait = 0.05
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = min(wait, left)
            ev.wait(seen, wait)

    def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        """Long polling across processes: block until the housekeeper (in any process) has dispatched past
        ``since`` (default: now), ``timeout`` passed or ``wake_waiters`` was called; returns ``progress``. The
        wait sleeps on the control file's "dispatched" eventcount (a shared futex), never polls."""
        self._check_open()
        ctl = self._ctl
        assert ctl is not None
        ev = ctl.dispatched_events
        if since is None:
            since = ctl.load(CTL_S_REPUT)
        deadline = None if timeout is None else time.monotonic() + timeout
        wakes = self._wakes
        while True:
            seen = ev.seq()
            cur = ctl.load(CTL_S_REPUT)
            if cur > since or self._wakes != wakes:
                return cur
            if self._closed:
                raise self._closed_error()
            wait = 0.05  # slices: close() and wake_waiters() are seen within one
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return cur
                wait = min(wait, left)
            ev.wait(seen, wait)

    def wake_waiters(self) -> None:
        self._wakes = self._wakes + 1
        if self._ctl is not None and not self._ctl.closed:
            self._ctl.dispatched_events.notify()

    def stats(self) -> Dict[str, Any]:
        out = super().stats()
        ctl = self._ctl
        if ctl is not None and not ctl.closed:
            out["shared"] = {
                "housekeeper": self._housekeeper,
                "housekeeper_pid": ctl.load(CTL_S_HOUSEKEEPER),
                "committed_end": ctl.load(CTL_S_WPOS),
                "dispatched_end": ctl.load(CTL_S_REPUT),
                "store_puts": ctl.load(CTL_S_PUTS),
                "sync_flushed_end": ctl.load(CTL_S_FLUSHED),
                "torn_puts_repaired": ctl.load(CTL_S_REPAIRS),
                "writer_lock_recoveries": ctl.lock.recoveries,
                "segments_allocated_ahead": self.allocated_ahead,
                "rows_check_failed": None if self.rows_check_error is None else str(self.rows_check_error),
            }
            hk_flush = self._hk_flush
            if self._housekeeper and isinstance(hk_flush, SharedGroupCommitService):
                out["shared"]["group_commit"] = self.commit_log.shared_flush_stats()
        return out

    # -- close -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the store. The last process attached closes it as a single process would (dispatch caught up,
        everything flushed, ``abort`` removed); any other one hands the housekeeping on and detaches."""
        if self._closed:
            return
        ctl = self._ctl
        assert ctl is not None
        self._join_handover()
        self._close_clients()
        if self._election is not None:
            self._stop_service(self._election)
        if self.schedule_service is not None:
            self._stop_service(self.schedule_service)  # it puts: stopped while the commit log takes puts
        self.commit_log.close()  # no put of this process starts from here on
        # Closes (and opens) take turns on the store byte: two processes closing at the same moment each saw the
        # other still attached, and neither removed `abort` (17 of 20 runs). The byte is released with this
        # process's locks when it detaches, so the next closer sees it gone.
        try:
            self._take_byte(CTL_LOCK_BYTE_STORE, OPEN_WAIT_S, "another process's open or close")
        except StoreBusyError as e:
            log.warning(
                "%s: closing without waiting for the other process (%s); the last one may leave `abort`", self.root, e
            )
        last = ctl.last_attached()
        clean = last
        if last:
            self.commit_log.check_writer()  # nobody else will: repair a put torn by a writer that died
        with self._hk_lock:
            if last and not self._housekeeper:
                self._try_become_housekeeper()
            self._closed_for_housekeeping = True
        try:
            if self._housekeeper and last:
                try:
                    if not self._wait_dispatched(ctl.load(CTL_S_WPOS), 60.0):
                        clean = False
                except DispatchError:
                    clean = False
            if self._housekeeper:
                self._stop_housekeeping(flush=True)
                if clean:
                    self._delete_segments_ahead()
                    self._write_closed_snapshot()
        finally:
            self._closed = True
            if self._cq_table is not None:
                self._cq_table.close()
            self._cl_mfq.close()
            self.checkpoint.close()
            try:
                if clean:
                    try:
                        with io_operation("unlink", self._abort_path):
                            os.unlink(self._abort_path)
                    except FileNotFoundError:
                        pass
            finally:
                if self._index_reader is not None:
                    self._index_reader.close()
                self._detach_control()
                if self._lock is not None:
                    self._lock.release()
                    self._lock = None

    def _detach_control(self) -> None:
        ctl = self._ctl
        if ctl is None:
            return
        for _ in range(200):  # a thread of ours may still be leaving a wait (at most one 50 ms slice)
            try:
                ctl.close()
                break
            except ControlFileError:
                time.sleep(0.005)
        else:
            ctl.close()

    def _bind_to_process(self) -> None:
        super()._bind_to_process()
        if self._handover is not None:
            self._handover.start()  # after the open's undo is done: a repair it makes is the store's, not the open's

    def _join_handover(self) -> None:
        if self._handover is not None and self._handover.ident is not None:
            self._handover.join()  # bounded: a look at each row, the repairs of those that fail, one write of rows
        self._handover = None

    def _abandon(self) -> None:
        self._join_handover()  # its file is undone with the rest of the open
        if self._election is not None:
            self._election.shutdown()
        if self._housekeeper:
            self._stop_housekeeping(flush=False)
        super()._abandon()
        self._detach_control()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        role = ", housekeeper" if self._housekeeper else ""
        return f"<SharedMessageQueue {self.root!r} {state}{role}>"
