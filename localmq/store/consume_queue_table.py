"""ConsumeQueueTable: every ConsumeQueue of a store, loaded from ``consumequeue/`` and created on first dispatch."""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Set, Tuple

from localmq._mapping import MappingBudget
from localmq._native import fsync_dir
from localmq.config import check_topic
from localmq.errors import CorruptStoreError
from localmq.layout import CQ_BLANK_UNIT_SIZE, CQ_UNIT_SIZE, MAX_QUEUE_ID, TOPIC_RE, is_decimal
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.mapped_file_queue import DeferredDirSyncs
from localmq.store.queue_snapshot import NOT_VOUCHED, QueueEntry, QueueSnapshot

log = logging.getLogger("localmq.store")


def _stamp_of(path: str) -> Tuple[int, int]:
    st = os.lstat(path)  # a link in place of a directory is not the directory the snapshot saw
    return st.st_ctime_ns, st.st_ino


def _units_at(qdir: str, bases: List[int], file_size: int, pos: int, n: int) -> bytes:
    """``n`` bytes of the queue's files from logical position ``pos`` (within one file), read with pread: no
    mapping, no descriptor kept."""
    base = pos - (pos - bases[0]) % file_size
    fd = os.open(f"{qdir}/{base:020d}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        data = os.pread(fd, n, pos - base)
    finally:
        os.close(fd)
    if len(data) != n:
        raise OSError(f"{qdir}: {len(data)} of {n} bytes at {pos}")
    return data


def _row_agrees(qdir: str, bases: List[int], file_size: int, row: QueueEntry, log_min: int) -> bool:
    """True when the queue's units are where its snapshot row says: no file before the first or after the last the
    row lists, the unit before ``max_offset`` is a real one that ends at ``max_physic_offset``, the unit at
    ``max_offset`` (when a file holds it) is all zeros, and a ``min_offset`` past the first file's start follows a
    unit retention expired (blank, or its record below the log's min offset ``log_min``). A unit or two read with
    pread, an lstat for a queue retention trimmed or whose last file is full: a row that lies (a snapshot forged
    with a right CRC, or a bug of the close that wrote it) must never hide units that exist, nor let a put write
    over one. Raises OSError when a file cannot be read."""
    last = row.max_offset * CQ_UNIT_SIZE - CQ_UNIT_SIZE  # the last unit's logical position
    first = row.min_offset * CQ_UNIT_SIZE
    if last < bases[0] or not bases[0] <= first <= last + CQ_UNIT_SIZE:
        return False
    # the row lists every file: none before its first (offsets start at 0), none after a full last one
    for base in (
        bases[0] - file_size if bases[0] > 0 else -1,
        bases[-1] + file_size if last + CQ_UNIT_SIZE == bases[-1] + file_size else -1,
    ):
        if base >= 0 and os.path.lexists(f"{qdir}/{base:020d}"):
            return False
    tail_in_file = (last - bases[0]) % file_size + 2 * CQ_UNIT_SIZE <= file_size
    data = _units_at(qdir, bases, file_size, last, 2 * CQ_UNIT_SIZE if tail_in_file else CQ_UNIT_SIZE)
    if not tail_in_file and last + CQ_UNIT_SIZE < bases[-1] + file_size:
        data += _units_at(qdir, bases, file_size, last + CQ_UNIT_SIZE, CQ_UNIT_SIZE)
    phys = int.from_bytes(data[:8], "big", signed=True)
    size = int.from_bytes(data[8:12], "big", signed=True)
    if not (phys >= 0 and 0 < size < CQ_BLANK_UNIT_SIZE and phys + size == row.max_physic_offset):
        return False
    if any(data[CQ_UNIT_SIZE:]):
        return False
    if first > bases[0]:
        before = _units_at(qdir, bases, file_size, first - CQ_UNIT_SIZE, CQ_UNIT_SIZE)
        size = int.from_bytes(before[8:12], "big", signed=True)
        if size != CQ_BLANK_UNIT_SIZE and int.from_bytes(before[:8], "big", signed=True) >= log_min:
            return False
    return True


class ConsumeQueueTable:
    """RocketMQ's consumeQueueTable: ``queues`` maps (topic, queue id) to its ConsumeQueue.

    The dispatcher creates queues (``find_or_create``, under a lock); readers look them up in ``queues`` without
    one (a dict read is atomic). Directories that are not a valid topic or queue id are skipped and listed in
    ``skipped_dirs``.
    """

    def __init__(self, root: str, file_size: int, reserve_step: int = 0, max_mapped_files: int = 0) -> None:
        self.root = root
        # > 0: at most that many queue files stay mapped, the least recently used unmapped while idle (shared by every
        # queue of the table; StoreConfig.max_mapped_queue_files)
        self.budget: Optional[MappingBudget] = MappingBudget(max_mapped_files) if max_mapped_files > 0 else None
        self.file_size = file_size
        self.reserve_step = reserve_step  # > 0: queue files are sparse, their blocks reserved ahead step by step
        # the names of new queue files are made durable together, before a checkpoint vouches for them (sync_names)
        self.dir_syncs = DeferredDirSyncs()
        self.queues: Dict[Tuple[str, int], ConsumeQueue] = {}
        self.skipped_dirs: List[str] = []
        # (topic, queue id) -> why its files could not be loaded (wrong size, a missing file between others):
        # they were deleted, recovery rebuilds the queue from the commit log
        self.damaged: Dict[Tuple[str, int], str] = {}
        # the queues whose state a queue snapshot gave (load): their files are as a clean close left them
        self.vouched: Set[Tuple[str, int]] = set()
        self._lock = threading.Lock()
        # while an open that may fail runs: told (path, start, -1) before a queue file is cut or deleted
        # (OpenUndo.save_derived; see MappedFileQueue.before_rewrite)
        self.before_rewrite: Optional[Callable[[str, int, int], None]] = None
        # while an open that may fail runs: told (queue directory, whether a snapshot vouched for it) as ``load``
        # reaches each queue directory, before anything writes there (OpenUndo.take_queue_dir)
        self.list_queue_dir: Optional[Callable[[str, bool], None]] = None

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            topic,
            queue_id,
            self.root,
            self.file_size,
            reserve_step=self.reserve_step,
            dir_syncs=self.dir_syncs,
            budget=self.budget,
        )
        cq.mapped_file_queue.before_rewrite = self.before_rewrite
        return cq

    def watch_rewrites(self, before_rewrite: Optional[Callable[[str, int, int], None]]) -> None:
        """Tell ``before_rewrite`` of every cut or deletion of a queue file from now on (None: stop telling)."""
        self.before_rewrite = before_rewrite
        for cq in list(self.queues.values()):
            cq.mapped_file_queue.before_rewrite = before_rewrite

    def load(self, snapshot: Optional[QueueSnapshot] = None, log_min: int = 0) -> None:
        """Map every queue found under ``root`` (files as they are; ``ConsumeQueue.recover`` checks them). A queue
        whose files ``snapshot`` vouches for (store/queue_snapshot.py) takes its state from there instead, without
        a read of its directory or its units, and is entered in ``vouched`` (``log_min``: the commit log's min
        offset, which the min offset of a vouched queue must agree with)."""
        root = self.root
        if not os.path.isdir(root):
            return
        known = snapshot.topics if snapshot is not None else {}
        with os.scandir(root) as it:  # the entries' types (d_type): no stat per topic
            topics = sorted(e.name for e in it if e.is_dir())
        for topic in topics:
            tdir = os.path.join(root, topic)
            if TOPIC_RE.match(topic) is None:
                self.skipped_dirs.append(tdir)
                log.warning("ignoring consume queue directory %s: not a valid topic name", tdir)
                continue
            entry = known.get(topic)
            if (
                entry is not None
                and entry.dir_ctime != NOT_VOUCHED
                and _stamp_of(tdir)
                == (
                    entry.dir_ctime,
                    entry.dir_ino,
                )
            ):
                names = sorted(str(q) for q in entry.queues)  # the directory holds what it held at the close
            else:
                names = sorted(os.listdir(tdir))
            for q in names:
                if not is_decimal(q) or int(q) > MAX_QUEUE_ID:
                    self.skipped_dirs.append(os.path.join(tdir, q))
                    log.warning("ignoring consume queue directory %s: not a queue id", os.path.join(tdir, q))
                    continue
                row = entry.queues.get(int(q)) if entry is not None else None
                if row is not None and row.dir_ctime != NOT_VOUCHED:
                    vouched = self._restore(topic, int(q), row, log_min)
                    if vouched is not None:
                        self.queues[(topic, int(q))] = vouched
                        self.vouched.add((topic, int(q)))
                        continue
                if self.list_queue_dir is not None:
                    self.list_queue_dir(os.path.join(tdir, q), False)
                cq = self._new(topic, int(q))
                try:
                    cq.load()
                except CorruptStoreError as e:
                    # derived data: drop the files (never following a link) and let recovery rebuild the queue
                    log.error(
                        "consume queue %s-%s cannot be loaded (%s); deleting its files to rebuild it from "
                        "the commit log",
                        topic,
                        q,
                        e,
                    )
                    qdir = os.path.join(tdir, q)
                    for name in os.listdir(qdir):
                        path = os.path.join(qdir, name)
                        if len(name) == 20 and is_decimal(name) and os.path.isfile(path) and not os.path.islink(path):
                            if self.before_rewrite is not None:
                                self.before_rewrite(path, 0, -1)
                            os.unlink(path)
                    fsync_dir(qdir)
                    cq = self._new(topic, int(q))
                    self.damaged[(topic, int(q))] = str(e)
                self.queues[(topic, int(q))] = cq

    def _restore(self, topic: str, queue_id: int, row: QueueEntry, log_min: int) -> Optional[ConsumeQueue]:
        """The queue built from its snapshot row when its directory and files are still those of the row (inode,
        ctime, size) and its units are where the row says (``_row_agrees``), else None (then it is loaded and
        checked as usual)."""
        qdir = f"{self.root}/{topic}/{queue_id}"  # names checked by load (os.path.join costs here at 100,000 queues)
        try:
            if _stamp_of(qdir) != (row.dir_ctime, row.dir_ino):
                return None
            ids = []
            for base, ctime, ino in row.files:
                st = os.lstat(f"{qdir}/{base:020d}")
                if (st.st_ctime_ns, st.st_ino, st.st_size) != (ctime, ino, self.file_size):
                    return None
                ids.append((st.st_dev, st.st_ino))
        except FileNotFoundError:
            return None
        bases = [base for base, _, _ in row.files]
        size = self.file_size
        if not bases or bases != list(range(bases[0], bases[0] + len(bases) * size, size)):
            return None
        if not bases[-1] <= row.max_offset * CQ_UNIT_SIZE <= bases[-1] + size:
            return None  # not what a close writes: check the queue
        try:
            if not _row_agrees(qdir, bases, size, row, log_min):
                log.warning("consume queue %s-%d: its units are not where the queue snapshot says", topic, queue_id)
                return None
        except OSError:
            return None
        cq = self._new(topic, queue_id)
        try:
            cq.mapped_file_queue.load_known(bases, ids)
        except (OSError, CorruptStoreError):
            cq.close()
            return None
        cq.restore(row.max_offset, row.min_offset, row.max_physic_offset)
        if self.list_queue_dir is not None:  # its files are as the close left them: listed if the open writes there
            self.list_queue_dir(qdir, True)
        return cq

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The ConsumeQueue of (topic, queue), created (no file yet) when missing. Raises InvalidTopicError."""
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            with self._lock:
                cq = self.queues.get(key)
                if cq is None:
                    check_topic(topic)
                    cq = self._new(topic, queue_id)
                    self.queues[key] = cq
        return cq

    def find_or_load(self, topic: str, queue_id: int, adopt: Callable[[ConsumeQueue], None]) -> ConsumeQueue:
        """The ConsumeQueue of (topic, queue); when missing, one over the files already on disk (written by another
        process of a shared store), passed to ``adopt`` before anyone else sees it. Raises InvalidTopicError."""
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            with self._lock:
                cq = self.queues.get(key)
                if cq is None:
                    check_topic(topic)
                    cq = self._new(topic, queue_id)
                    cq.load()
                    adopt(cq)
                    self.queues[key] = cq
        return cq

    def mapping_stats(self) -> Dict[str, Optional[int]]:
        """``mapped_queue_files`` (queue files mapped now; with no budget, every file of every queue),
        ``queue_file_evictions`` and ``queue_file_remaps`` (None without a budget)."""
        b = self.budget
        if b is None:
            return {
                "mapped_queue_files": sum(len(cq.mapped_file_queue.files) for cq in list(self.queues.values())),
                "queue_file_evictions": None,
                "queue_file_remaps": None,
            }
        return {"mapped_queue_files": b.mapped, "queue_file_evictions": b.evictions, "queue_file_remaps": b.remaps}

    def sync_names(self) -> int:
        """Make the names of the queue files created since the last call durable (directory fsyncs); returns how many
        directories were synced. Called before the checkpoint's logical timestamp moves past what they hold."""
        return self.dir_syncs.sync()

    def destroy_all(self) -> None:
        """Delete every queue's files (a store whose commit log is gone: the units could point nowhere)."""
        for cq in self.queues.values():
            cq.destroy()
        self.queues.clear()

    def close(self) -> None:
        """Unmap every queue's files."""
        for cq in self.queues.values():
            cq.close()
