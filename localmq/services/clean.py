"""Retention: RocketMQ's CleanCommitLogService and CleanConsumeQueueService, run by one CleanService thread.

What is deleted, and when (RocketMQ 4.x DefaultMessageStore, see the spec 5.7 and 6 "Clean services"):

- A pass runs every ``clean_resource_interval`` ms (``CleanService.run_once`` runs one now).
- CommitLog segments are deleted oldest first, never the last (current) segment, at most
  ``DELETE_FILES_BATCH_MAX`` (10) per pass with ``delete_commit_log_files_interval`` ms between two deletions,
  and only in these cases:
  * time: the hour of the clock is one of ``delete_when`` ("04" or "04;05"): segments whose mtime is at least
    ``file_reserved_time`` hours old;
  * space: the disk of the commitlog or consumequeue directory is more than ``disk_max_used_space_ratio`` %
    used: the same age rule, at any hour;
  * at once: more than ``DISK_SPACE_CLEAN_FORCIBLY_RATIO`` (0.85) used and ``clean_file_forcibly_enable``:
    segments of any age.
  With ``disk_full_refuse_ratio`` set (RocketMQ: 90, always; localmq: 0, off, by default), more than that %
  used marks the disk full: every put answers SERVICE_NOT_AVAILABLE (``CommitLog.refuse_status``) until a pass
  sees less. Each transition is logged once. Without it a put is refused only when the blocks it needs cannot be
  reserved (CREATE_MAPPED_FILE_FAILED). Ratios are RocketMQ's: used / (used + available to unprivileged users),
  rounded up to 1 %.
  Note that, as in RocketMQ, passing ``disk_max_used_space_ratio`` alone only lifts the hour restriction:
  young segments go only past 0.85.
- A segment is deleted only once the dispatcher has indexed all of it (it would lose messages otherwise,
  and the dispatcher reads the mapping without a reference).
- Unconsumed messages (localmq's addition): for every ``topic@group`` and queue in
  ``<root>/config/consumerOffset.json`` whose committed offset N is below the queue's max offset, the
  physical offset of the first unit at or after N bounds deletion: a segment ending after it is kept. The
  queues of such a topic that the group has no offset for yet, and those of its retry topic ``%RETRY%group``,
  are kept from their start (the group reads them from there). Delayed messages and retries waiting for
  their delay are kept the same way: each level's queue of SCHEDULE_TOPIC_XXXX from its offset in
  ``<root>/config/delayOffset.json`` (reported under ``SCHEDULE_TOPIC_XXXX``; RocketMQ deletes them by age).
  ``clean_unconsumed=True``, or cleaning at once past 0.85 (which needs ``clean_file_forcibly_enable``),
  deletes such segments anyway; they are then counted per holder in ``deleted_unconsumed``. A missing file
  means no protection by it; an unusable one (and its ``.bak``) is logged and reported, and protects nothing
  (an unusable delayOffset.json protects every delayed message).
- A segment that a reader still holds (``MappedFile.hold()``, or a zero-copy view from
  ``get_message(zero_copy=True)``) leaves the segment list at once but is destroyed when released; the pass
  stops there (no later segment is deleted while it is on disk, so names never leave a gap). Each pass
  collects such files; every ``redelete_hanged_file_interval`` ms it retries them forcibly once
  ``destroy_mapped_file_interval_forcibly`` ms have passed since their first destroy (``hold()`` references
  are then dropped; a live view keeps the mapping, the file name goes).
- ConsumeQueues follow the CommitLog's min offset (RocketMQ's CleanConsumeQueueService): when it moved,
  every queue moves its ``min_offset`` to the first unit still in the log and deletes its files (never the
  last) whose units all point below it, with ``delete_consume_queue_files_interval`` ms after each queue that
  deleted something. RocketMQ destroys CQ files with a fixed 60 s forcible interval; this uses
  ``destroy_mapped_file_interval_forcibly`` for both.
- Index files (localmq.store.index): the hook is ``CleanService.index_service``, set by the store to its
  IndexService (None when the index is disabled); its ``delete_expired_file(min_offset)`` is called after the
  ConsumeQueues (as RocketMQ's ``indexService.deleteExpiredFile``); the int it returns is counted as deleted
  index files.

Time goes through an injectable clock (ms since the epoch; mtimes are compared with it and the
``delete_when`` hour is its local hour) and disk usage through an injectable callable, so tests use a fake
clock and simulate a full disk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from localmq.config import RETRY_PREFIX, SCHEDULE_TOPIC, StoreConfig
from localmq.errors import CorruptStoreError
from localmq.layout import CQ_BLANK_UNIT_SIZE, is_decimal
from localmq.services.schedule import DELAY_OFFSET_FILE, read_delay_offsets
from localmq.services.service_thread import ServiceThread
from localmq.status import PutStatus
from localmq.store.config_json import read_offset_table
from localmq.store.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileQueue

log = logging.getLogger("localmq.clean")

# RocketMQ 4.x system properties rocketmq.broker.diskSpaceCleanForciblyRatio / diskSpaceWarningLevelRatio
DISK_SPACE_CLEAN_FORCIBLY_RATIO = 0.85
DISK_SPACE_WARNING_LEVEL_RATIO = 0.90  # RocketMQ's refusal level: disk_full_refuse_ratio=90 reproduces it
_HOUR_MS = 3_600_000


def wall_clock_ms() -> int:
    """The default clock: ms since the epoch."""
    return int(time.time() * 1000)


def disk_used_ratio(path: str) -> float:
    """Used fraction of the partition holding ``path``, as RocketMQ's getDiskPartitionSpaceUsedPercent:
    used / (used + available to unprivileged users), rounded up to a whole percent.

    :returns: 0.0..1.0, or -1.0 when the partition reports no blocks.
    :raises OSError: when ``path`` cannot be examined.
    """
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if st.f_blocks <= 0 or entire <= 0:
        return -1.0
    return -(-used * 100 // entire) / 100.0


def is_delete_hour(delete_when: str, now_ms: int) -> bool:
    """True when the local hour of ``now_ms`` is one of the ``;``-separated hours of ``delete_when``
    (RocketMQ's UtilAll.isItTimeToDo; entries that are not integers are ignored, as there)."""
    hour = time.localtime(now_ms / 1000.0).tm_hour
    for part in delete_when.split(";"):
        part = part.strip()
        if is_decimal(part) and int(part) == hour:
            return True
    return False


def _first_unit_physical_offset(cq, start: int, end: int) -> Optional[int]:
    """Commit log offset of the first real unit (not blank padding) of ``cq`` in [start, end), or None."""
    u = cq.unit(start)
    if u is not None and 0 < u[1] != CQ_BLANK_UNIT_SIZE:
        return u[0]
    i = start
    while i < end:
        arr = cq.units(i, min(end, i + 4096))
        try:
            n = len(arr)
            if n == 0:
                return None
            sizes = arr["size"]
            idx = np.nonzero((sizes > 0) & (sizes != CQ_BLANK_UNIT_SIZE))[0]
            if len(idx):
                return int(arr["offset"][idx[0]])
        finally:
            del arr  # a view over the CQ mapping: release it before anything is destroyed
        i += n
    return None


class ConsumerBound:
    """The first unconsumed message of one ``topic@group``: where retention must stop for it."""

    __slots__ = ("group", "physical_offset", "queue_id", "queue_offset")

    def __init__(self, group: str, physical_offset: int, queue_id: int, queue_offset: int):
        self.group = group
        self.physical_offset = physical_offset
        self.queue_id = queue_id
        self.queue_offset = queue_offset


class CleanCommitLogService:
    """One pass = disk check, hanged-file retry, expired segment deletion (RocketMQ's CleanCommitLogService).

    Not thread-safe by itself: CleanService serialises passes.

    :param config: the store's StoreConfig.
    :param mapped_file_queue: the commit log's segments.
    :param commit_log: its ``refuse_status`` is set while the disk is full.
    :param dispatched_offset: () -> commit log offset up to which everything is in the ConsumeQueues.
    :param consume_queues: () -> {(topic, queue id): ConsumeQueue}.
    :param consumer_offset_path: ``<root>/config/consumerOffset.json``.
    :param logics_dir: the consumequeue directory (its partition is checked too).
    :param clock: () -> ms since the epoch.
    :param disk_usage: path -> used ratio (0..1, negative when unknown).
    :param sleep: (ms) -> bool, the pause between two deletions; False stops the pass.
    """

    def __init__(
        self,
        config: StoreConfig,
        mapped_file_queue: MappedFileQueue,
        commit_log,
        dispatched_offset: Callable[[], int],
        consume_queues: Callable[[], Dict[Tuple[str, int], Any]],
        consumer_offset_path: str,
        logics_dir: str,
        clock: Callable[[], int],
        disk_usage: Callable[[str], float],
        sleep: Callable[[int], bool],
    ):
        self.config = config
        self.mfq = mapped_file_queue
        self.commit_log = commit_log
        self.dispatched_offset = dispatched_offset
        self.consume_queues = consume_queues
        self.consumer_offset_path = consumer_offset_path
        self.delay_offset_path = os.path.join(os.path.dirname(consumer_offset_path), DELAY_OFFSET_FILE)
        self.logics_dir = logics_dir
        self.clock = clock
        self.disk_usage = disk_usage
        self.sleep = sleep
        self.last_redelete_ms = 0
        self.disk_full = False
        self.clean_immediately = False
        self.disk_ratio = 0.0
        self.deleted_files = 0
        self.deleted_segments: List[int] = []  # base offsets, newest last (the last 100)
        self.deleted_unconsumed: Dict[str, int] = {}
        self.kept_for_consumers: Dict[str, Dict[str, Any]] = {}
        self.kept_for_dispatch: List[int] = []
        self.consumer_offsets_error: Optional[str] = None
        self.delay_offsets_error: Optional[str] = None
        self.disk_usage_error: Optional[str] = None

    # -- disk -------------------------------------------------------------------------------------------------

    def _ratio_of(self, path: str) -> float:
        try:
            r = float(self.disk_usage(path))
        except OSError as e:
            if self.disk_usage_error is None:
                log.warning("cannot read the disk usage of %s: %s", path, e)
            self.disk_usage_error = f"{path}: {e}"
            return -1.0
        return r

    def check_disk(self) -> bool:
        """Read both partitions' usage, set ``clean_immediately`` and the disk-full flag (RocketMQ's
        isSpaceToDelete). Returns True when usage passes ``disk_max_used_space_ratio`` (or is unknown, as
        RocketMQ: then only expired segments go, at any hour)."""
        self.disk_usage_error = None
        ratios = [self._ratio_of(self.mfq.directory)]
        if os.path.isdir(self.logics_dir):
            ratios.append(self._ratio_of(self.logics_dir))
        known = [r for r in ratios if r >= 0]
        ratio = max(known) if known else -1.0
        self.disk_ratio = ratio
        self.clean_immediately = ratio > DISK_SPACE_CLEAN_FORCIBLY_RATIO
        refuse = self.config.disk_full_refuse_ratio / 100.0
        if refuse and ratio > refuse:
            if not self.disk_full:
                self.disk_full = True
                self.commit_log.refuse_status = PutStatus.SERVICE_NOT_AVAILABLE
                log.error(
                    "disk %.0f%% used (more than disk_full_refuse_ratio %.0f%%): marked full, puts answer "
                    "SERVICE_NOT_AVAILABLE until it drops",
                    ratio * 100,
                    refuse * 100,
                )
        elif self.disk_full:
            self.disk_full = False
            # only undo our own refusal: another component may have set a different status meanwhile
            if self.commit_log.refuse_status is PutStatus.SERVICE_NOT_AVAILABLE:
                self.commit_log.refuse_status = None
            log.warning("disk %.0f%% used: no longer full, puts accepted again", ratio * 100)
        return ratio < 0 or ratio > self.config.disk_max_used_space_ratio / 100.0

    # -- consumers ----------------------------------------------------------------------------------------------

    def consumer_bounds(self) -> List[ConsumerBound]:
        """The first message not yet consumed, or not yet delivered, of every holder that has one, lowest first.

        Holders (keys of the reports):
        - ``topic@group`` of consumerOffset.json: from the committed offset of each of its queues; a queue of that
          topic without an offset (new since the group's last commit) from its start, as the group reads it
          (``from_offset="earliest"``, the default);
        - ``%RETRY%group@group`` for every group there: the queues of its retry topic without an offset, from
          their start (a message sent back lands there before the group has ever committed on it);
        - ``SCHEDULE_TOPIC_XXXX`` (delayed messages and retries waiting for their delay): each level's queue
          from its offset in ``config/delayOffset.json`` (from its start when the file has none).

        An unusable consumerOffset.json and backup are logged (once per distinct error), reported in
        ``consumer_offsets_error`` and protect no consumer (delayed messages stay protected); an unusable
        delayOffset.json is logged and protects every delayed message.
        """
        cqs = self.consume_queues()
        bounds: Dict[str, ConsumerBound] = {}

        def bound(key: str, topic: str, qid: int, offset: int) -> None:
            cq = cqs.get((topic, qid))
            if cq is None:
                return
            mx = cq.max_offset
            start = max(offset, cq.min_offset)
            if start >= mx:
                return  # consumed up to the end (or everything it had not consumed is gone)
            phys = _first_unit_physical_offset(cq, start, mx)
            if phys is None:
                return
            b = bounds.get(key)
            if b is None or phys < b.physical_offset:
                bounds[key] = ConsumerBound(key, phys, qid, offset)

        queue_ids: Dict[str, List[int]] = {}
        for topic, qid in list(cqs):
            queue_ids.setdefault(topic, []).append(qid)
        try:
            table, _ = read_offset_table(self.consumer_offset_path)
        except (CorruptStoreError, OSError) as e:
            msg = str(e)
            if msg != self.consumer_offsets_error:
                log.error("consumer offsets unreadable, retention protects no unconsumed message: %s", msg)
            self.consumer_offsets_error = msg
            table = {}
        else:
            self.consumer_offsets_error = None
        groups = set()
        for key, queues in table.items():
            if "@" not in key:
                continue
            topic, group = key.split("@", 1)
            groups.add(group)
            for qid, offset in queues.items():
                bound(key, topic, qid, offset)
            for qid in queue_ids.get(topic, ()):
                if qid not in queues:
                    bound(key, topic, qid, 0)
        for group in groups:
            retry = RETRY_PREFIX + group
            key = f"{retry}@{group}"
            committed = table.get(key, {})
            for qid in queue_ids.get(retry, ()):
                if qid not in committed:
                    bound(key, retry, qid, 0)
        if SCHEDULE_TOPIC in queue_ids:
            for qid in queue_ids[SCHEDULE_TOPIC]:
                bound(SCHEDULE_TOPIC, SCHEDULE_TOPIC, qid, self._delay_offsets().get(qid + 1, 0))
        return sorted(bounds.values(), key=lambda b: b.physical_offset)

    def _delay_offsets(self) -> Dict[int, int]:
        """{delay level: next unit to deliver} from delayOffset.json (or its backup); {} when there is none or it
        is unusable (logged once per distinct error: every delayed message is then protected)."""
        try:
            out = read_delay_offsets(self.delay_offset_path)  # a bad entry: its level is protected from its start
        except (CorruptStoreError, OSError) as e:
            if str(e) != self.delay_offsets_error:
                log.error("delay offsets unreadable, retention keeps every delayed message: %s", e)
            self.delay_offsets_error = str(e)
            return {}
        self.delay_offsets_error = None
        return out

    # -- the pass -------------------------------------------------------------------------------------------------

    def run_once(self) -> List[str]:
        """One pass. Returns the paths of the segments deleted (a deferred deletion completed now included).

        :raises OSError: when an unlink, an mtime read or a directory fsync fails.
        """
        c = self.config
        now = self.clock()
        space = self.check_disk()
        # collect files whose readers are done; force every redelete interval (RocketMQ's redeleteHangedFile)
        force = now - self.last_redelete_ms > c.redelete_hanged_file_interval
        if force:
            self.last_redelete_ms = now
        gone = self.mfq.retry_delete_hanged(c.destroy_mapped_file_interval_forcibly if force else None, now)
        if gone:
            self.deleted_files += len(gone)
            self.deleted_segments = (self.deleted_segments + [int(os.path.basename(p)) for p in gone])[-100:]
        timeup = is_delete_hour(c.delete_when, now)
        if not (timeup or space):
            return gone
        at_once = c.clean_file_forcibly_enable and self.clean_immediately
        dispatched = self.dispatched_offset()
        bounds = self.consumer_bounds()
        override = at_once or c.clean_unconsumed
        limit = dispatched
        if bounds and not override:
            limit = min(limit, bounds[0].physical_offset)
        res = self.mfq.delete_expired_files(
            c.file_reserved_time * _HOUR_MS,
            now,
            forcibly_ms=c.destroy_mapped_file_interval_forcibly,
            clean_immediately=at_once,
            max_end_offset=limit,
            batch_max=DELETE_FILES_BATCH_MAX,
            between=lambda: self.sleep(c.delete_commit_log_files_interval),
        )
        size = self.mfq.file_size
        deleted_bases = [int(os.path.basename(p)) for p in res.deleted]
        self.deleted_files += len(res.deleted)
        self.deleted_segments = (self.deleted_segments + deleted_bases)[-100:]
        # reports are built aside and published by one assignment: stats() may read them from another thread
        if override and bounds and deleted_bases:
            unconsumed = dict(self.deleted_unconsumed)
            groups = []
            for b in bounds:
                n = sum(1 for base in deleted_bases if base + size > b.physical_offset)
                if n:
                    unconsumed[b.group] = unconsumed.get(b.group, 0) + n
                    groups.append(b.group)
            self.deleted_unconsumed = unconsumed
            if groups:
                log.warning(
                    "retention deleted segments holding messages not yet consumed by %s (%s)",
                    ", ".join(groups),
                    "clean_unconsumed" if c.clean_unconsumed else f"disk {self.disk_ratio:.0%} used",
                )
        kept: Dict[str, Dict[str, Any]] = {}
        kept_for_dispatch: List[int] = []
        for mf in res.held_back:
            end = mf.file_from_offset + size
            groups_of = [b for b in bounds if b.physical_offset < end] if not override else []
            if not groups_of:
                kept_for_dispatch.append(mf.file_from_offset)
            for b in groups_of:
                entry = kept.setdefault(
                    b.group,
                    {
                        "segments": [],
                        "queue_id": b.queue_id,
                        "queue_offset": b.queue_offset,
                        "physical_offset": b.physical_offset,
                    },
                )
                entry["segments"].append(mf.file_from_offset)
        self.kept_for_consumers = kept
        self.kept_for_dispatch = kept_for_dispatch
        if self.kept_for_consumers:
            log.info(
                "retention kept %d segment(s) for unconsumed messages of %s",
                len(res.held_back),
                ", ".join(sorted(self.kept_for_consumers)),
            )
        if res.deleted:
            log.info(
                "retention deleted %d segment(s) (%s): %s",
                len(res.deleted),
                "at once" if at_once else "time" if timeup else "space",
                deleted_bases,
            )
        return gone + res.deleted


class CleanConsumeQueueService:
    """ConsumeQueues (and, later, index files) follow the commit log's min offset (RocketMQ's
    CleanConsumeQueueService). Parameters as CleanCommitLogService."""

    def __init__(
        self,
        config: StoreConfig,
        mapped_file_queue: MappedFileQueue,
        consume_queues: Callable[[], Dict[Tuple[str, int], Any]],
        clock: Callable[[], int],
        sleep: Callable[[int], bool],
        retention_queues: Optional[Callable[[int], List[Any]]] = None,
    ):
        self.config = config
        self.mfq = mapped_file_queue
        self.consume_queues = consume_queues
        # (min offset) -> the queues a pass for it visits (ConsumeQueueTable.for_retention: not the queues a snapshot
        # vouched for that were never used, when their min offsets are right for it); None: every queue
        self.retention_queues = retention_queues
        self.clock = clock
        self.sleep = sleep
        self.last_physical_min_offset = 0
        self.index_service = None
        self.deleted_files = 0
        self.deleted_index_files = 0
        self.hanged_files = 0

    def run_once(self) -> List[str]:
        """One pass: when the commit log's min offset moved (or a CQ file deletion hangs), correct every
        queue's min offset and delete its expired files, then call the index hook. Returns deleted paths.

        :raises OSError: when an unlink or a directory fsync fails.
        """
        c = self.config
        min_offset = self.mfq.min_offset()
        if min_offset <= self.last_physical_min_offset and not self.hanged_files:
            return []
        now = self.clock()
        deleted: List[str] = []
        hanged = 0
        finished = True
        pick = self.retention_queues
        for cq in pick(min_offset) if pick is not None else list(self.consume_queues().values()):
            gone = cq.delete_expired_files(min_offset, c.destroy_mapped_file_interval_forcibly, now)
            hanged += len(cq.mapped_file_queue.hanged)
            if gone:
                deleted += gone
                if not self.sleep(c.delete_consume_queue_files_interval):
                    finished = False  # shutting down: the queues not visited yet are done by the next open
                    break
        self.hanged_files = hanged
        if finished:
            self.last_physical_min_offset = min_offset
        self.deleted_files += len(deleted)
        index = self.index_service
        if index is not None:
            n = index.delete_expired_file(min_offset)
            if isinstance(n, int):
                self.deleted_index_files += n
        if deleted:
            log.info("retention deleted %d consume queue file(s) below commit log offset %d", len(deleted), min_offset)
        return deleted


class CleanService(ServiceThread):
    """The "CleanService" thread: every ``clean_resource_interval`` ms, CleanCommitLogService then
    CleanConsumeQueueService. An exception in a pass is logged with the service name, counted in ``errors``
    (``last_error``) and the loop goes on.

    :param config: the store's StoreConfig.
    :param commit_log_queue: the commit log's MappedFileQueue.
    :param commit_log: the CommitLog (its ``refuse_status`` carries the disk-full flag).
    :param dispatched_offset: () -> the dispatcher's reput offset.
    :param consume_queues: () -> {(topic, queue id): ConsumeQueue} (a live mapping is fine; it is copied).
    :param root: the store directory (``config/consumerOffset.json``, ``consumequeue``).
    :param clock: () -> ms since the epoch; default the wall clock.
    :param disk_usage: path -> used ratio 0..1; default ``disk_used_ratio`` (statvfs).
    """

    def __init__(
        self,
        config: StoreConfig,
        commit_log_queue: MappedFileQueue,
        commit_log,
        dispatched_offset: Callable[[], int],
        consume_queues: Callable[[], Dict[Tuple[str, int], Any]],
        root: str,
        *,
        clock: Optional[Callable[[], int]] = None,
        disk_usage: Optional[Callable[[str], float]] = None,
        retention_queues: Optional[Callable[[int], List[Any]]] = None,
    ):
        super().__init__("CleanService")
        self.config = config
        self.clock = clock or wall_clock_ms
        self._pass_lock = threading.Lock()  # run_once from a caller and the thread never overlap
        self.passes = 0
        self.commit_log_service = CleanCommitLogService(
            config,
            commit_log_queue,
            commit_log,
            dispatched_offset,
            consume_queues,
            os.path.join(root, "config", "consumerOffset.json"),
            os.path.join(root, "consumequeue"),
            self.clock,
            disk_usage or disk_used_ratio,
            self._pause,
        )
        self.consume_queue_service = CleanConsumeQueueService(
            config, commit_log_queue, consume_queues, self.clock, self._pause, retention_queues
        )

    @property
    def index_service(self):
        """Hook for IndexService (a later issue): an object with ``delete_expired_file(min_offset)``."""
        return self.consume_queue_service.index_service

    @index_service.setter
    def index_service(self, value) -> None:
        self.consume_queue_service.index_service = value

    def _pause(self, ms: int) -> bool:
        """Sleep ``ms`` between deletions; False when the service is shutting down."""
        if ms > 0:
            return not self._stopped.wait(ms / 1000.0)
        return not self.stopped

    def run_once(self) -> Tuple[List[str], List[str]]:
        """One retention pass now (tests call it with a fake clock).

        :returns: (deleted commit log paths, deleted consume queue paths).
        :raises OSError: from the file operations (the thread logs and counts it instead).
        """
        with self._pass_lock:
            self.passes += 1
            segments = self.commit_log_service.run_once()
            cq_files = self.consume_queue_service.run_once()
            return segments, cq_files

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(self.config.clean_resource_interval)
            if self.stopped:
                break
            try:
                self.run_once()
            except Exception as e:  # noqa: BLE001 - logged and counted; the next pass retries
                self.errors += 1
                self.last_error = e
                log.exception("service %s: retention pass failed", self.name)

    def stats(self) -> Dict[str, Any]:
        """The ``retention`` entry of the store's stats() (see the README)."""
        cl = self.commit_log_service
        cq = self.consume_queue_service
        return {
            "passes": self.passes,
            "deleted_commit_log_files": cl.deleted_files,
            "deleted_segments": list(cl.deleted_segments),
            "deleted_consume_queue_files": cq.deleted_files,
            "deleted_index_files": cq.deleted_index_files,
            "hanged_files": len(cl.mfq.hanged) + cq.hanged_files,
            "disk_used_ratio": cl.disk_ratio,
            "disk_full": cl.disk_full,
            "clean_immediately": cl.clean_immediately,
            "kept_for_consumers": {
                g: dict(v, segments=list(v["segments"])) for g, v in cl.kept_for_consumers.items()
            },  # replaced whole, never mutated
            "kept_for_dispatch": list(cl.kept_for_dispatch),
            "deleted_unconsumed": dict(cl.deleted_unconsumed),
            "consumer_offsets_error": cl.consumer_offsets_error,
            "delay_offsets_error": cl.delay_offsets_error,
            "disk_usage_error": cl.disk_usage_error,
        }
