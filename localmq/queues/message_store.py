"""DefaultMessageStore: a store's life cycle (open, recover, start and stop the services, close) and its state."""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from localmq._native import fsync_dir
from localmq._record import Message
from localmq.config import FlushDiskType, StoreConfig
from localmq.errors import (
    CorruptStoreError,
    DispatchError,
    LocalMQError,
    StoreClosedError,
    StorePathError,
    UnsafePathError,
    io_operation,
    store_io_error,
)
from localmq.layout import ABORT_FILE, CHECKPOINT_FILE, COMMITLOG_DIR, CONSUMEQUEUE_DIR, LOCK_FILE
from localmq.services.allocate import AllocateMappedFileService, QueueFileMaker
from localmq.services.clean import CleanService
from localmq.services.flush import (
    CommitRealTimeService,
    FlushConsumeQueueService,
    FlushRealTimeService,
    GroupCommitService,
)
from localmq.services.index import IndexDispatchService
from localmq.services.reput import ReputMessageService
from localmq.services.schedule import ScheduleMessageService
from localmq.services.transaction import TRANS_CHECK_GROUP, TransactionalMessageCheckService
from localmq.status import PutStatus
from localmq.store import get
from localmq.store.checkpoint import StoreCheckpoint
from localmq.store.commit_log import CommitLog
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.consume_queue_table import ConsumeQueueTable
from localmq.store.dispatch import ReputCore
from localmq.store.durable_names import makedirs_durable, sync_each
from localmq.store.files import unsafe_entries
from localmq.store.group_commit import GroupCommit
from localmq.store.index import IndexService
from localmq.store.lock import StoreLock
from localmq.store.mapped_file_queue import MappedFileQueue, earlier_sync_failure
from localmq.store.queue_recovery import (
    MinCorrected,
    RecoveryReport,
    next_queue_offsets,
    repair_queue,
    sync_directories,
)
from localmq.store.queue_snapshot import SnapshotWriter, keep_as_first_cut, read_snapshot, remove_snapshot
from localmq.store.recovery import check_log_start, check_segments, recover_store
from localmq.store.settings import (
    explicit_settings,
    resolve_settings,
    settings_path,
    write_log_start,
    write_settings,
)
from localmq.store.transient_store_pool import TransientStorePool
from localmq.store.undo import OpenUndo, check_writable_filesystem, missing_ancestor

log = logging.getLogger("localmq.store")


def _total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 24 * 1024**3


class DefaultMessageStore:
    """RocketMQ's DefaultMessageStore: the life cycle of one store directory, under the queue that serves it.

    The open runs the checks that need no write, takes the lock, lists what a failed open must undo, resolves the
    settings, recovers the files (``_recover``), then goes live (``_go_live``: ``abort``, the index, the
    dispatcher and every service, in start order in ``_services``); a failed open stops what started and undoes
    what it wrote (``_abandon``). ``close`` stops the services, flushes everything and removes ``abort``.
    ``LocalMessageQueue`` (queues/local.py) is the public face over this state; ``SharedMessageQueue`` and
    ``ReadOnlyMessageQueue`` replace ``_open`` / ``close`` / ``_abandon`` and the lock and undo choices.
    The put path is CommitLogFront's (store/commit_log.pyx); a queue class lists it after this one. The services
    get the face's own calls (``put``, ``put_ext``, ``look_message_by_offset``, ``_find_transaction_commit``, the
    waits, the clients' offsets), so this class is a base of a queue, never used alone.
    """

    _writes = True  # a read-only view says False: it opens on a read-only file system
    # a clean close writes the queues' ends, the next open takes the queues it vouches for from there
    # (store/queue_snapshot.py; a shared store's last closer writes it from its first opener's handover)
    _reads_queue_snapshot = True
    # the queue flush takes running cuts (queues.running), which an open after a crash reads (a shared store's too)
    _reads_running_cut = True
    _mins_at = -1  # the log's min offset every queue's min offset was last corrected for (the open's)
    _early_repairs: Optional[List[RecoveryReport]] = None  # repairs of queues used before ``recovery`` is set
    # what a half-built open holds (set as the open builds it; None or empty until then)
    _cl_mfq: Optional[MappedFileQueue] = None
    _cq_table: Optional[ConsumeQueueTable] = None
    checkpoint: Optional[StoreCheckpoint] = None

    def __init__(
        self,
        path: str | os.PathLike,
        config: Optional[StoreConfig] = None,
        *,
        progress: Optional[Callable[[int, int], None]] = None,
        clock: Optional[Callable[[], int]] = None,
        disk_usage: Optional[Callable[[str], float]] = None,
        **kwargs: Any,
    ):
        if config is not None and kwargs:
            raise TypeError("pass either a StoreConfig or keyword settings, not both")
        # the settings that shape the files which the caller chose: they must agree with the store's record
        self._explicit = explicit_settings(config, kwargs)
        if config is None:
            config = StoreConfig.from_kwargs(kwargs)
        self.config = config
        self.root = os.path.abspath(os.fspath(path))
        self._undo: Optional[OpenUndo] = None
        self._log_start: Optional[int] = None  # commit_log_start to record once the open succeeds (None: keep)
        self._closed = True
        self._lock = None
        self._reput_service: Optional[ReputMessageService] = None
        self._services: List[Any] = []  # every background service, in start order
        # (topic, queue id) -> ConsumeQueue, read without a lock: every queue, a look-up builds a vouched one on first
        # use (ConsumeQueueTable.queues)
        self._cqs: Mapping[Tuple[str, int], ConsumeQueue] = {}
        self._group_commit: Optional[GroupCommit] = None
        self._pool: Optional[TransientStorePool] = None
        self._allocate_service: Optional[AllocateMappedFileService] = None
        self._queue_file_maker: Optional[QueueFileMaker] = None
        self._flush_service = None
        self._commit_service: Optional[CommitRealTimeService] = None
        # retention: ``clock`` () -> ms since the epoch and ``disk_usage`` path -> used ratio 0..1, injectable
        # for tests (default wall clock and statvfs); see localmq.services.clean
        self._clock = clock
        self._disk_usage = disk_usage
        self.clean_service: Optional[CleanService] = None
        self.index_service: Optional[IndexService] = None  # None when message_index_enable is False
        self._index_dispatch: Optional[IndexDispatchService] = None
        # delayed messages (SCHEDULE_TOPIC_XXXX); None in a shared store, which refuses delayed sends
        self.schedule_service: Optional[ScheduleMessageService] = None
        # transactional messages (ends and check-backs); None in a shared store, which refuses transaction producers
        self.transaction_service: Optional[TransactionalMessageCheckService] = None
        # Every check that needs no write comes before the first write; what an open creates or grows after it is
        # listed (OpenUndo) and undone when it fails, so a failed open leaves the directory as it found it.
        created_root = missing_ancestor(self.root)
        if self._writes:
            check_writable_filesystem(self.root, created_root)
        if created_root is None:
            unsafe = unsafe_entries(self.root, queue_dirs=False)  # the ConsumeQueueTable looks at each as it loads
            if unsafe:
                raise UnsafePathError(
                    f"store {self.root} holds symlinks or entries outside it, which localmq "
                    f"never writes through: {unsafe[:5]}",
                    path=unsafe[0],
                )
        try:
            # the new directories' names made durable too (an fsync of each one's parent): without it a power cut
            # after SYNC_FLUSH acknowledgements could take the whole store away (tests/test_power_loss.py)
            makedirs_durable(self.root)
        except (FileExistsError, NotADirectoryError) as e:  # a file there, or on the way there: nothing created
            raise StorePathError(
                errno.ENOTDIR, f"a store is a directory; {e.filename or self.root} is not one", self.root
            ) from None
        except BaseException:
            if created_root is not None and os.path.lexists(created_root):
                OpenUndo(self.root, created_root).restore()
            raise
        try:
            if created_root is not None:
                # the names of the new directories made durable (fsync of each parent): without it a power cut
                # could take the whole store, synced files and all, with the directory entry
                d = self.root
                while True:
                    fsync_dir(os.path.dirname(d))
                    if d == created_root:
                        break
                    d = os.path.dirname(d)
            self._lock = self._make_lock()
        except BaseException:
            if created_root is not None:
                OpenUndo(self.root, created_root).restore()
            raise
        try:
            self._undo = self._list_for_undo(created_root)
            self.config, self._write_record = self._resolve_settings()
            self._open(progress)
        except BaseException as e:
            self._abandon()
            if isinstance(e, OSError) and not isinstance(e, LocalMQError) and e.errno is not None:
                # a system call the open made on one of the store's files: typed, naming its file and errno
                raise store_io_error(e, "open the store: a file operation", e.filename or self.root) from e
            raise
        if self._undo is not None:
            self._undo.done()
            if self._cq_table is not None:
                self._cq_table.watch_rewrites(None)
                self._cq_table.on_row_built = None
                self._cq_table.list_queue_dir = None
                self._cq_table.vouch_queue_dirs = None
        self._undo = None
        self._lock.stamp()
        self._closed = False
        self._bind_to_process()

    def _list_for_undo(self, created_root: Optional[str]) -> Optional[OpenUndo]:
        """What a failed open must undo: listed now that this process holds the store alone."""
        lock_path = os.path.join(self.root, LOCK_FILE)
        # the queue directories are listed as the ConsumeQueueTable loads them (_recover), most from the snapshot
        return OpenUndo(self.root, created_root, (lock_path,) if self._lock.created else (), defer_queues=True)

    def _resolve_settings(self) -> Tuple[StoreConfig, bool]:
        """The config with the settings that shape the files taken from the store's record (or its files), and
        whether the record must be written. Raises StoreSettingsError for a passed setting that contradicts it."""
        return resolve_settings(self.root, self.config, self._explicit)

    def _record_settings(self) -> None:
        """Write ``config/localmq.json`` when the store has none (a new store, a RocketMQ broker's), or when it
        contradicts the files (its old bytes come back if the open fails later)."""
        if self._write_record or self._log_start is not None:
            path = settings_path(self.root)
            if self._undo is not None and os.path.isfile(path):
                self._undo.keep(path)
            write_settings(self.root, self.config, self._log_start)
            self._write_record = False
            self._log_start = None

    def _make_lock(self) -> StoreLock:
        return StoreLock(self.root)

    def _cq_factory(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        """(topic, queue id) -> its ConsumeQueue, created when missing (the dispatcher's factory). None for a row's
        record (at the dispatcher's position) before the rows' end: its queue holds it (a re-dispatch after a crash
        starts before a running store's cut), the dispatcher steps over it and the row stays unbuilt."""
        table = self._cq_table
        if table.row_holds_record((topic, queue_id), self._reput.position):
            return None
        return table.find_or_create(topic, queue_id)

    # -- open / recover -------------------------------------------------------------------------------------------

    def _recover(self, progress) -> bool:
        """Load the files and recover them (today's single-process recovery); returns whether the last exit was
        clean. Builds the CommitLog, the ReputCore and the queue offsets."""
        c = self.config
        t0 = time.monotonic()
        self._abort_path = os.path.join(self.root, ABORT_FILE)
        last_exit_ok = not os.path.exists(self._abort_path)
        rebuilt: List[str] = []
        cp_path = os.path.join(self.root, CHECKPOINT_FILE)
        snapshot = None
        if self._reads_queue_snapshot and (last_exit_ok or self._reads_running_cut):
            # after a clean close its snapshot; after a crash the running store's last cut (queues.running)
            snapshot = read_snapshot(
                self.root,
                cp_path,
                os.path.join(self.root, COMMITLOG_DIR),
                c.mapped_file_size_consume_queue,
                c.mapped_file_size_commit_log,
                running=not last_exit_ok,
            )
        # gone before anything is written: an open that fails after this gets it back (a clean close's: below)
        remove_snapshot(self.root, self._undo)
        try:
            self.checkpoint = StoreCheckpoint(cp_path)
        except CorruptStoreError as e:
            # derived data: a fresh (zero) checkpoint only makes recovery start earlier
            log.error("%s; replacing it with a new one", e)
            if self._undo is not None:
                self._undo.keep(cp_path)
            os.unlink(cp_path)
            self.checkpoint = StoreCheckpoint(cp_path)
            rebuilt.append(f"checkpoint: {e}")
        self._cq_root = os.path.join(self.root, CONSUMEQUEUE_DIR)
        self._cl_mfq = MappedFileQueue(
            os.path.join(self.root, COMMITLOG_DIR),
            c.mapped_file_size_commit_log,
            reserve_step=c.reserve_step_commit_log,
        )
        for d in (self._cl_mfq.directory, self._cq_root):
            makedirs_durable(d)
        salvaged = check_segments(self.root, self._cl_mfq.directory, self._cl_mfq.file_size, self._cq_root, c.salvage)
        self._cl_mfq.load()
        self._cq_table = ConsumeQueueTable(
            self._cq_root, c.mapped_file_size_consume_queue, c.reserve_step_consume_queue, c.max_mapped_queue_files
        )
        self._cqs = self._cq_table.queues
        self._cq_table.repair = self._repair_queue
        if self._undo is not None:
            # a failed open gives the queue files it cut or deleted their bytes back
            self._cq_table.watch_rewrites(self._undo.save_derived)
            self._cq_table.list_queue_dir = self._undo.take_queue_dir
            self._cq_table.vouch_queue_dirs = self._undo.vouch_queue_dirs
        self._cq_table.load(snapshot, self._cl_mfq.min_offset())
        if self._undo is not None:
            # (list_queue_dir stays set until the open ends: a queue the open creates has its topic listed first)
            # what the table did not load (nothing, unless a directory changed meanwhile); the queue directories a
            # snapshot vouched for stay deferred: listed when a write into one is announced
            self._undo.take_deferred()
        min_corrected: MinCorrected = {}
        report = recover_store(
            self.root,
            self._cl_mfq,
            self._cq_table,
            abnormal=not last_exit_ok,
            check_crc=c.check_crc_on_recover,
            checkpoint_min_ts=self.checkpoint.min_timestamp,
            progress=progress,
            verify_queues=c.check_consume_queue_on_open,
            salvage=c.salvage,
            undo=self._undo,
            min_corrected=min_corrected,
            vouched_end=snapshot.log_end if snapshot is not None else -1,
            vouched_running=snapshot is not None and snapshot.running,
        )
        report.rebuilt += rebuilt
        report.salvaged += salvaged
        keep_as_first_cut(self.root, snapshot, report)  # (when recovery left the log as the snapshot saw it)
        if not last_exit_ok:
            # a queue directory a running cut vouched for was synced before the cut was written, unchanged since
            sync_directories(self.root, self._cq_table.vouched_dirs())
        cl_min = self._cl_mfq.min_offset()
        if snapshot is not None and snapshot.mins_at == cl_min:
            table = self._cq_table
            for key in [k for k in table.built if k in table.vouched]:  # (a row is never visited below)
                # their min offsets were right for this log's start at the close
                min_corrected.setdefault(key, (cl_min, table.max_offset(key)))
            # a retention pass for this start leaves the rows alone (else it would make every queue 10 s after an
            # open); their expired files, if any, go at the next pass, when the log's start moves
            self._cq_table.rows_mins_at = cl_min
        start = check_log_start(self.root, self._cl_mfq, cl_min, report)
        if start is not None:
            self._log_start = start
        self._cl_mfq.before_head_delete = functools.partial(write_log_start, self.root)
        self.commit_log = CommitLog(
            self._cl_mfq, max_message_size=c.max_message_size, store_host=c.store_host, born_host=c.born_host
        )
        if self._cq_table.rows:
            self.commit_log.topic_miss = self._cq_table.next_offsets
        self._reput = ReputCore(self._cl_mfq, self._cq_factory, report.reput_from, c.dispatch_idle_wait_us)
        self._reput.set_delay_levels(self.delay_levels_ms())
        self._reput.on_blocked = self._dispatch_blocked
        self._reput.skip_offsets = set(report.damaged_headers) or None
        for cq in list(self._cq_table.built.values()):  # the dispatcher registers the others on their first record
            self._reput.register(cq)
        if self._undo is not None and report.reput_from < report.end_offset:  # re-dispatch will append units
            self._mark_queue_ends(self._undo)
        undispatched: Dict[Tuple[str, int], int] = {}
        try:
            report.redispatched = self._reput.run_until_caught_up()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            # A full disk: a ConsumeQueue file could not be created. The records are in the log, so the open goes
            # on: what is indexed is readable, the dispatcher retries every 100 ms once running (stats()
            # "dispatch_blocked"), and the put path continues from the queue offsets the log itself holds.
            report.dispatch_blocked = f"re-dispatch stopped at commit log offset {self._reput.reput_offset}: {e}"
            self._reput.blocked = e
            self._reput.paused = True
            self._dispatch_blocked(e)
            log.error(
                "recovery of %s: %s; the store opens, the rest is indexed once space returns",
                self.root,
                report.dispatch_blocked,
            )
            undispatched = next_queue_offsets(self._cl_mfq.directory, self._cl_mfq.file_size, self._reput.reput_offset)
        table = self._cq_table
        if table.rows_mins_at != cl_min:
            table.build_all()  # the rows' min offsets are not right for this log's start: every queue's is corrected
        # the put path's next queue offsets: a row's are asked for on its topic's first put, or here when another
        # queue of its topic is set (CommitLog.topic_miss: ConsumeQueueTable.next_offsets checks the row first)
        for key, cq in list(table.built.items()):
            max_offset = cq.max_offset
            if min_corrected.get(key) != (cl_min, max_offset):  # not yet, or re-dispatch added units
                cq.correct_min_offset(cl_min)
            self.commit_log.set_queue_offset(key[0], key[1], max(max_offset, undispatched.pop(key, 0)))
        for (topic, qid), nxt in undispatched.items():  # queues whose first file could not be created
            self.commit_log.set_queue_offset(topic, qid, nxt)
        self._mins_at = cl_min  # every queue's min offset is right for this log's start
        report.seconds = time.monotonic() - t0
        for early in self._early_repairs or ():
            report.add_repair(early)
        self.recovery = report
        if report.repaired:
            log.warning("recovery of %s: %s", self.root, report)
        else:
            log.info(
                "recovered %s (%s) in %.3f s: end offset %d", self.root, report.mode, report.seconds, report.end_offset
            )
        return last_exit_ok

    def _repair_queue(self, key: Tuple[str, int], cq: ConsumeQueue, row_max: int) -> None:
        """ConsumeQueueTable.repair: a queue whose snapshot row no longer holds, checked and repaired from the log on
        its first use (queue_recovery.repair_queue); what was done is added to ``recovery``. After a crash, with
        the dispatcher past the running store's cut, its position is where the queue's records may start again."""
        reput = getattr(self, "_reput", None)
        skip = reput.skip_offsets if reput is not None else None
        table = self._cq_table
        at = reput.position if reput is not None and table.rows_running else -1
        at = at if at >= table.rows_end >= 0 else -1
        report = repair_queue(self._cl_mfq, table, key, cq, self.delay_levels_ms(), skip, at, row_max)
        done = getattr(self, "recovery", None)
        if done is not None:
            done.add_repair(report)
        else:  # a queue used by the open itself (recovery's checks of the queues' ends): added to its report
            self._early_repairs = (self._early_repairs or []) + [report]

    def _mark_queue_ends(self, undo: OpenUndo) -> None:
        """Where re-dispatch starts appending to each queue's last file (zeros from there on): a failed open zeroes
        them again (OpenUndo.mark_derived_end)."""
        size = self._cq_table.file_size

        def mark(path: str, pos: int) -> None:
            undo.mark_derived_end(path, min(size, max(0, pos)))

        for path, pos in self._cq_table.last_files(rows=False):
            mark(path, pos)
        self._cq_table.on_row_built = mark  # a row as re-dispatch (or a reader) builds it: until the open ends

    def _check_log_on_disk(self) -> None:
        """The dispatcher stopped on an invalid record in the log this store wrote: a flush of the whole log tells
        whether a write-back failed (then ``sync_failure`` is set and DispatchError names it). Its own error is
        kept there, not raised: the dispatcher's error stays the one waiters see first."""
        mfq = self._cl_mfq
        # under the flush lock and the group commit's claim, as every flush of the log: no group leader may
        # fdatasync a file while this one reports (and consumes) its error, and take its own success for one
        gc = self._group_commit
        if gc is not None:
            gc.pause()  # the claim first, then the flush lock: the GroupCommitService's order
        try:
            with mfq.flush_lock:
                for mf in list(mfq.files):  # fdatasync of each segment, dirty or not: a failed write-back reports
                    try:
                        mf.fsync()
                    except OSError as e:
                        mfq.report_sync_failure(e)
                        return
                    except StoreClosedError:  # deleted meanwhile by retention
                        continue
        finally:
            if gc is not None:
                gc.done(gc.flushed)

    def _dispatch_stopped(
        self, error: Optional[BaseException], what: str = "the dispatch service stopped"
    ) -> DispatchError:
        """The DispatchError for a dispatcher stopped on ``error``; on an invalid record, once the dispatch thread
        has asked the disk (``_check_log_on_disk``, at most 5 s), so that a failed write-back is named."""
        svc = self._reput_service
        if error is not None and not isinstance(error, OSError) and svc is not None:
            deadline = time.monotonic() + 5.0
            while svc.alive and time.monotonic() < deadline:
                time.sleep(0.005)
        return DispatchError.stopped(error, what, io_failure=self._cl_mfq.sync_failure)

    def _dispatch_blocked(self, error: Optional[OSError]) -> None:
        """The dispatcher waits for disk space (``error``) or made the file it waited for (None): meanwhile puts answer
        CREATE_MAPPED_FILE_FAILED, so that the space that returns goes to indexing what was acknowledged, not to new
        segments. Called from the dispatch thread (or the open)."""
        cl = self.commit_log
        if error is not None:
            if cl.refuse_status is None:
                cl.refuse_status = PutStatus.CREATE_MAPPED_FILE_FAILED
                cl.last_failure = f"puts wait for the dispatcher, which cannot index what the log holds: {error}"
                log.error("%s: puts are refused until the dispatcher has indexed the log (%s)", self.root, error)
        elif cl.refuse_status is PutStatus.CREATE_MAPPED_FILE_FAILED:
            cl.refuse_status = None
            log.warning("%s: the dispatcher caught up; puts are taken again", self.root)

    def _open(self, progress) -> None:
        last_exit_ok = self._recover(progress)
        self._record_settings()
        self._go_live(last_exit_ok)

    def _mark_running(self) -> None:
        """``abort`` marks "running": present at the next open unless close() completes."""
        with io_operation("create", self._abort_path), open(self._abort_path, "wb") as f:
            f.flush()
        fsync_dir(self.root)

    def _setup_reads(self) -> None:
        c = self.config
        self._tag_filters: Dict[str, Tuple[tuple, frozenset]] = {}
        self._check_crc_on_read = bool(c.check_crc_on_read)
        self._bodies_limits: Dict[int, get.GetLimits] = {}  # get_bodies: GetLimits per max_bytes
        self._get_limits = get.GetLimits(
            c.max_transfer_count_on_message_in_memory,
            c.max_transfer_bytes_on_message_in_memory,
            c.max_transfer_count_on_message_in_disk,
            c.max_transfer_bytes_on_message_in_disk,
            _total_ram() * c.access_message_in_memory_max_ratio // 100,
        )
        self._opened_at = time.time()

    def _go_live(self, last_exit_ok: bool) -> None:
        """Mark the store running (``abort``), load the index, start the dispatcher and the services, set up
        reads. What reads or drops files comes before the threads that write into them (the index dispatcher, the
        delayed-message service, which puts) start: an open that fails before them has changed nothing it cannot
        undo."""
        self._mark_running()
        self._load_index(last_exit_ok)
        schedule = self._make_schedule_service()
        self.commit_log.set_dispatch_event(self._reput.wake_event)
        # new queues' first files are made off the dispatcher's thread (the dispatcher keeps their units meanwhile)
        self._queue_file_maker = QueueFileMaker(self._reput.note_ready)
        self._queue_file_maker.start()
        self._services.append(self._queue_file_maker)
        self._reput.maker = self._queue_file_maker
        self._reput_service = ReputMessageService(self._reput, check_disk=self._check_log_on_disk)
        self._reput_service.start()
        self._services.append(self._reput_service)
        self._start_services()
        self._setup_reads()
        self._start_clean_service()
        self._start_index_dispatch()
        schedule.start()
        self._services.append(schedule)
        self._start_transaction_service()

    def _start_services(self) -> None:
        """Allocation ahead, the flush mode's services and the ConsumeQueue flusher (see the README's table)."""
        c = self.config
        mfq = self._cl_mfq
        sync = c.flush_disk_type is FlushDiskType.SYNC_FLUSH
        if c.transient_store_pool_enable:
            self._pool = TransientStorePool(c.transient_store_pool_size, c.mapped_file_size_commit_log)
            mfq.on_buffer_released = self._pool.give_back
        if c.preallocate_mapped_file or self._pool is not None:
            svc = AllocateMappedFileService(
                mfq,
                warm=c.warm_mapped_file_enable,
                warm_flush_pages=c.flush_least_pages_when_warm_mapped_file if sync else 0,
                pool=self._pool,
            )
            self._allocate_service = svc
            mfq.allocator = svc.allocate
            svc.start()
            self._services.append(svc)
            svc.prime()
        if sync:
            gc = GroupCommit(mfq.flushed_where)
            self._group_commit = gc
            self._flush_service = GroupCommitService(mfq, gc, self.checkpoint)
            self.commit_log.set_group_commit(gc, c.sync_flush_timeout)
        else:
            self._flush_service = FlushRealTimeService(mfq, c, self.checkpoint)
        self._flush_service.start()
        self._services.append(self._flush_service)
        if self._pool is not None:
            flush_svc = self._flush_service
            reput = self._reput

            def committed() -> None:
                reput.wake()
                flush_svc.wakeup()

            self._commit_service = CommitRealTimeService(mfq, c, committed)
            self._commit_service.start()
            self._services.append(self._commit_service)
        snapshots = self._snapshots()
        reput = self._reput
        snapshots.dispatched = lambda: reput.reput_offset
        self._cq_flush_service = FlushConsumeQueueService(
            lambda: self._cq_table.built.values(),
            c,
            self.checkpoint,
            self.checkpoint.flush,
            self._cq_table.sync_names,
            logics_floor=lambda: self._reput.pending_store_ts,
            take_cut=snapshots.take_cut if self._reads_running_cut else None,
            write_cut=snapshots.write_cut,
        )
        self._cq_flush_service.start()
        self._services.append(self._cq_flush_service)

    def _stop_service(self, svc) -> None:
        if svc is None:
            return
        try:
            svc.shutdown()
        except Exception:  # noqa: BLE001 - close() must go on; the failure is logged and counted
            svc.errors += 1
            log.exception("stopping %s", svc.name)

    def _abandon(self) -> None:
        """Undo a failed open: stop what started, unmap, release the lock (files stay as they were)."""
        self._stop_clean_service()
        for svc in reversed(self._services):
            try:
                svc.shutdown()
            except Exception:  # noqa: BLE001 - the original error is what matters
                log.exception("stopping %s after a failed open", svc.name)
        if self._cl_mfq is not None:
            self._cl_mfq.close()
        if self._cq_table is not None:
            self._cq_table.close()
        if self.index_service is not None:
            self.index_service.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
        undo = self._undo
        self._undo = None
        if undo is not None and self._lock is not None and self._lock.exclusive():
            undone = undo.restore()
            if undone:
                log.info("failed open of %s: removed or cut back %s", self.root, undone)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- delayed messages (ScheduleMessageService) ------------------------------------------------------------------

    def _make_schedule_service(self) -> ScheduleMessageService:
        """The service that moves due delayed messages to their real topic (services/schedule.py), its offsets
        loaded (``delayOffset.json``), not started."""
        c = self.config
        svc = ScheduleMessageService(
            self.root,
            self.delay_levels_ms(),
            self._schedule_cq,
            self._schedule_read,
            self.put_ext,
            self._flush_log,
            c.flush_delay_offset_interval,
            self._clock,
        )
        self.schedule_service = svc
        return svc

    def _start_schedule_service(self) -> ScheduleMessageService:
        """Start the thread that moves due delayed messages to their real topic."""
        svc = self._make_schedule_service()
        svc.start()
        self._services.append(svc)
        return svc

    def _schedule_cq(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        """The ScheduleMessageService's view of a ConsumeQueue (no open check: it runs from before the open ends
        until close stops it)."""
        return self._cqs.get((topic, queue_id))

    def _schedule_read(self, physical_offset: int):
        """The ScheduleMessageService's read of one record (no open check, as ``_schedule_cq``)."""
        mfq = self._cl_mfq
        if physical_offset < 0 or physical_offset >= mfq.max_offset():
            return None
        return get.read_record(mfq.files, mfq.file_size, physical_offset, True)

    def _flush_log(self) -> None:
        """Commit and flush the commit log (before delayOffset.json records re-puts as done, before a consumer's
        offsets are written). In a shared store the view moves to the committed end first: the records of every
        process are flushed, not only this one's (a consumer reads them all; the power cuts of
        tests/test_power_loss_shared.py found offsets written ahead of the records that survived)."""
        self.commit_log.sync_view()
        if self._pool is not None:
            self._cl_mfq.commit_all()
        self._cl_mfq.flush_all()

    # -- transactional messages (TransactionalMessageCheckService) ------------------------------------------------

    def _start_transaction_service(self) -> None:
        """Start the thread that checks unresolved half messages back (services/transaction.py); its offsets are
        CID_RMQ_SYS_TRANS's in the clients' ConsumerOffsetManager (config/consumerOffset.json)."""
        c = self.config

        def query_offset(topic: str) -> Optional[int]:
            return self._client_state().offsets.query(TRANS_CHECK_GROUP, topic, 0)

        def commit_offsets(offsets: Dict[str, int]) -> None:
            self._client_state().offsets.commit(TRANS_CHECK_GROUP, {(t, 0): o for t, o in offsets.items()})

        def read(physical_offset: int) -> Optional[Message]:
            if self._pool is not None:
                self._cl_mfq.commit_all()  # write-buffered records reach the mapping when committed
            return self.look_message_by_offset(physical_offset)

        svc = TransactionalMessageCheckService(
            read=read,
            put=self.put,
            put_ext=self.put_ext,
            find_cq=lambda t, q: self._cqs.get((t, q)),
            find_commit=self._find_transaction_commit,
            query_offset=query_offset,
            commit_offsets=commit_offsets,
            flush_log=self._flush_log,
            store_host=c.store_host,
            timeout_ms=c.transaction_timeout,
            check_max=c.transaction_check_max,
            interval_ms=c.transaction_check_interval,
            file_reserved_ms=c.file_reserved_time * 3_600_000,
            clock=self._clock,
            before_pass=lambda: self.wait_for_dispatch(10.0),
        )
        self.transaction_service = svc
        svc.start()
        self._services.append(svc)

    # -- retention (CleanService) --------------------------------------------------------------------------------

    def _start_clean_service(self) -> None:
        """Start the retention thread (CleanCommitLogService + CleanConsumeQueueService, every
        ``clean_resource_interval`` ms); ``clean_service.run_once()`` runs a pass at once."""
        self.clean_service = CleanService(
            self.config,
            self._cl_mfq,
            self.commit_log,
            lambda: self._reput.reput_offset,
            lambda: self._cqs,
            self.root,
            clock=self._clock,
            disk_usage=self._disk_usage,
            retention_queues=self._cq_table.for_retention,
        )
        self.clean_service.index_service = self.index_service
        self.clean_service.start()

    def _stop_clean_service(self) -> None:
        """Stop and join the retention thread (a pass in progress finishes its current file first)."""
        svc = self.clean_service
        if svc is not None:
            try:
                svc.shutdown()
            except Exception:  # noqa: BLE001 - closing goes on; the error is in the log
                log.exception("stopping the clean service")

    # -- index (IndexService: loaded, its thread started and stopped) ------------------------------------------

    def _start_index_service(self, last_exit_ok: bool) -> None:
        """Load the index files and start the thread that indexes them (``_load_index``, ``_start_index_dispatch``)."""
        self._load_index(last_exit_ok)
        self._start_index_dispatch()

    def _load_index(self, last_exit_ok: bool) -> None:
        """Load the index files, dropping those an unclean exit may have torn (set aside while an open that may
        fail runs: OpenUndo.set_aside)."""
        c = self.config
        if not c.message_index_enable:
            return
        svc = IndexService(self.root, c.max_hash_slot_num, c.max_index_num, self.checkpoint, grow=c.grow_index_files)
        undo = self._undo
        svc.load(last_exit_ok, self._cl_mfq.max_offset(), undo.set_aside if undo is not None else os.unlink)
        self.index_service = svc

    def _start_index_dispatch(self) -> None:
        """Start the thread that indexes KEYS and UNIQ_KEY from where the index ends (see localmq.store.index)."""
        svc = self.index_service
        if svc is None:
            return
        self._index_dispatch = IndexDispatchService(svc, self._cl_mfq, svc.resume_offset(self._cl_mfq.min_offset()))
        self._index_dispatch.start()
        self._services.append(self._index_dispatch)

    def _close_index(self) -> bool:
        """Let the index catch up with the log (60 s at most), stop its thread, flush and unmap the files.

        Returns False only when a flush failed (``abort`` then stays, so the next open drops the file being
        written). A lag is not unclean: the next open resumes indexing where the files end."""
        svc = self.index_service
        if svc is None:
            return True
        d = self._index_dispatch
        ok = True
        if d is not None:
            if d.alive and d.error is None and d.blocked is None:
                d.wait_for(self._cl_mfq.max_offset(), 60.0)
            self._stop_service(d)
        try:
            svc.flush()
        except OSError:
            log.exception("flushing the index files of %s", self.root)
            ok = False
        svc.close()
        return ok

    # -- flush / close ------------------------------------------------------------------------------------------

    def _flush_all(self) -> None:
        failure = self._cl_mfq.sync_failure
        if failure is None:
            self.commit_log.sync_view()  # a shared store: every process's records (see _flush_log)
            if self._pool is not None:
                self._cl_mfq.commit_all()
            self._cl_mfq.flush_all()
        # after a failed flush of the log the queues and the checkpoint are still flushed (the checkpoint's log time
        # stays where the last good flush left it), and the failure is raised again
        cqs = list(self._cq_table.built.values())  # a queue never built has nothing to flush
        # the store time each queue had before its flush: what the checkpoint may claim once all of them are flushed
        logics_ts = max((cq.last_store_timestamp for cq in cqs), default=0)
        floor = self._reput.pending_store_ts  # the dispatcher is stopped here
        if floor > 0:  # units that wait in memory for their queue's file (a close that could not wait for them)
            logics_ts = min(logics_ts, floor - 1)

        def flush_queue(cq: Any) -> None:
            while not cq.flush(0):
                pass

        # thousands of dirty queues (a close after writes to many) are flushed on several threads (sync_each)
        failed = sync_each(flush_queue, cqs)
        if failed:
            raise failed[0][1]
        self._cq_table.sync_names()
        cp = self.checkpoint
        if self._cl_mfq.store_timestamp and failure is None:
            cp.physic_msg_timestamp = self._cl_mfq.store_timestamp
        if logics_ts:
            cp.logics_msg_timestamp = logics_ts
        cp.flush()
        if failure is not None:
            raise earlier_sync_failure(failure)

    def _queue_mins_at(self) -> int:
        """The log's min offset the queues' min offsets are right for now, -1 when not known: when no segment was
        deleted since the open corrected them, or when retention's last pass over every queue was for this start."""
        cl_min = self._cl_mfq.min_offset()
        svc = self.clean_service
        mins_ok = cl_min == self._mins_at or (
            svc is not None and svc.consume_queue_service.last_physical_min_offset == cl_min
        )
        return cl_min if mins_ok else -1

    def _snapshots(self) -> SnapshotWriter:
        cp = os.path.join(self.root, CHECKPOINT_FILE)
        return SnapshotWriter(self.root, self._cq_table, self._cl_mfq, cp, self._queue_mins_at)

    def close(self) -> None:
        """Stop accepting puts, commit write-buffered records, let the dispatcher catch up, stop every service,
        flush the commit log, the consume queues and the checkpoint, remove ``abort``, release the lock.
        Idempotent. A store that is never closed (or whose close fails part-way) recovers on the next open.
        """
        if self._closed:
            return
        # the transaction checker commits CID_RMQ_SYS_TRANS offsets and puts: it stops before the clients' offsets
        # are persisted and while the commit log still takes puts
        self._stop_service(self.transaction_service)
        self._close_clients()  # consumers commit and offsets persist while the store still reads
        # the scheduler puts: it stops (and writes delayOffset.json) while the commit log still takes puts
        self._stop_service(self.schedule_service)
        self._stop_clean_service()  # no file is deleted while the store flushes and unmaps
        self.commit_log.close()  # no put can start from here on; one in progress has finished writing
        clean = True
        try:
            if self._commit_service is not None:
                self._stop_service(self._commit_service)
                self._cl_mfq.commit_all()
            if self._reput.blocked is not None:
                # the dispatcher cannot write a ConsumeQueue file (disk full): leave `abort` so that the next
                # open re-dispatches the tail from the log instead of waiting here for space
                clean = False
            elif self._reput.error is None and self._reput_service.alive:
                try:
                    self._wait_dispatched(self._cl_mfq.max_offset(), 60.0, unless_blocked=True)
                except DispatchError:
                    clean = False
        finally:
            self._closed = True
            self._stop_service(self._reput_service)
            self._stop_service(self._queue_file_maker)  # after the dispatcher: no queue file is made from here
            self._stop_service(self._cq_flush_service)
            if not isinstance(self._flush_service, GroupCommitService):
                self._stop_service(self._flush_service)
        if self._reput.error is not None or self.dispatch_behind_bytes > 0:
            clean = False
        if not self._close_index():
            clean = False
        try:
            self._flush_all()  # raises the commit log's failed flush, if one failed: `abort` stays
            if clean:
                self._snapshots().write_closed()
        except OSError:
            clean = False
            raise
        finally:
            if self._group_commit is not None:
                # SYNC_FLUSH puts still waiting are covered by the flush above (or, if it failed, time out)
                self._group_commit.publish(self._cl_mfq.flushed_where)
                self._stop_service(self._flush_service)
            self._stop_service(self._allocate_service)
            if self._pool is not None:
                self._pool.close()
            self._cq_table.close()  # no queue is made after it
            self._cl_mfq.close()
            self.checkpoint.close()
            try:
                if clean:
                    try:
                        with io_operation("unlink", self._abort_path):
                            os.unlink(self._abort_path)
                        fsync_dir(self.root)
                    except FileNotFoundError:
                        pass
            finally:
                self._lock.release()
                self._lock = None
