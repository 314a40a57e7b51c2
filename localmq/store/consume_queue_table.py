"""ConsumeQueueTable: every ConsumeQueue of a store, loaded from ``consumequeue/`` and created on first dispatch."""

from __future__ import annotations

import logging
import os
import stat
import threading
from typing import Callable, Container, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from localmq._mapping import MappingBudget
from localmq._native import fsync_dir
from localmq._snapshot import ROW_DISAGREES, ROW_HOLDS, ROW_LINK, check_rows, dir_stamps
from localmq.config import check_topic
from localmq.errors import CorruptStoreError, LocalMQError, StoreClosedError, UnsafePathError, store_io_error
from localmq.layout import CQ_UNIT_SIZE, MAX_QUEUE_ID, TOPIC_RE, is_decimal
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.durable_names import DeferredDirSyncs, sync_each
from localmq.store.queue_snapshot import NOT_VOUCHED, QueueRow, QueueSnapshot, TopicRow

log = logging.getLogger("localmq.store")


def _stamp_of(path: str) -> Tuple[int, int]:
    st = os.lstat(path)  # a link in place of a directory is not the directory the snapshot saw
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink, which localmq never writes through", path=path)
    return st.st_ctime_ns, st.st_ino


def _stamps_of(root: str, names: List[str]) -> Dict[str, Tuple[int, int]]:
    """``_stamp_of`` of each ``root/name``, in one compiled pass (``_snapshot.dir_stamps``): an open of 25,000 topics
    stamps every topic directory the snapshot vouches for. Raises as ``_stamp_of`` would for the first that fails."""
    broot = os.fsencode(root)
    size = max(256, -(-len(names) // 64))  # 64 chunks or more, on sync_each's threads: each lstat is a lookup
    chunks = [names[i : i + size] for i in range(0, len(names), size)]
    found: Dict[int, List[Union[Tuple[int, int], int]]] = {}

    def stamp(i: int) -> None:
        found[i] = dir_stamps(broot, [os.fsencode(n) for n in chunks[i]])

    failed = sync_each(stamp, list(range(len(chunks))))
    if failed:
        raise failed[0][1]
    out: Dict[str, Tuple[int, int]] = {}
    for name, got in zip(names, (s for i in range(len(chunks)) for s in found[i])):
        if isinstance(got, tuple):
            out[name] = got
        elif got == ROW_LINK:
            path = f"{root}/{name}"
            raise UnsafePathError(f"{path} is a symlink, which localmq never writes through", path=path)
        else:
            raise OSError(-got, os.strerror(-got), f"{root}/{name}")
    return out


def _names_refusing_links(path: str) -> List[str]:
    """The entries of directory ``path``, sorted; UnsafePathError when it is a symlink or holds one (localmq never
    writes, truncates or deletes through one; the open's walk of the store, files.unsafe_entries, leaves what lies
    below the topic directories to the table, which looks at each directory as it lists or loads it)."""
    _stamp_of(path)
    names = []
    with os.scandir(path) as it:
        for e in it:
            if e.is_symlink():
                raise UnsafePathError(f"{e.path} is a symlink, which localmq never writes through", path=e.path)
            names.append(e.name)
    names.sort()
    return names


def refuse_links(qdir: str) -> None:
    """``_names_refusing_links`` for a queue directory, which may not exist (a queue without a file yet)."""
    try:
        _names_refusing_links(qdir)
    except FileNotFoundError:
        return


Key = Tuple[str, int]
# (key, directory, its files' base offsets, max offset, min offset, max physical offset, a file's deletion waiting
# for a reader, its row or None): ConsumeQueueTable.states
QueueState = Tuple[Key, str, List[int], int, int, int, bool, Optional[QueueRow]]


def _last_file_end(cq: ConsumeQueue) -> Optional[Tuple[str, int]]:
    """(path, position) of the queue's last file and where its units end in it; None without a file."""
    last = cq.mapped_file_queue.last()
    if last is None:
        return None
    return os.fspath(last.path), cq.max_offset * CQ_UNIT_SIZE - last.file_from_offset


class QueueView(Mapping[Key, ConsumeQueue]):
    """Every queue of a table, as a read-only mapping: a key is any queue, built or not; a look-up builds a queue
    a snapshot vouched for on its first use (``ConsumeQueueTable.get``); ``values()`` and ``items()`` build every
    queue (the few callers that need every object, such as retention's pass after the log's start moved)."""

    def __init__(self, table: "ConsumeQueueTable") -> None:
        self._table = table

    def __getitem__(self, key: Key) -> ConsumeQueue:
        cq = self._table.get(key)
        if cq is None:
            raise KeyError(key)
        return cq

    def get(self, key: Key, default: Optional[ConsumeQueue] = None) -> Optional[ConsumeQueue]:  # type: ignore[override]
        cq = self._table.get(key)
        return default if cq is None else cq

    def __contains__(self, key: object) -> bool:
        t = self._table
        return key in t.built or key in t.rows or key in t.built

    def __iter__(self) -> Iterator[Key]:
        return iter(self._table.keys())

    def __len__(self) -> int:
        return len(self._table)


class ConsumeQueueTable:
    """RocketMQ's consumeQueueTable: every (topic, queue id) of the store and its ConsumeQueue.

    A queue whose files a queue snapshot vouched for at the open (``load``) is kept as its row (``rows``), checked
    and built on its first use (``get``, ``find_or_create``, the put path's ``next_offsets``): an open of 100,000
    queues reads, checks and makes nothing for those nobody reads or writes. ``built`` maps the queues built so far
    (a dict read without a lock: a dict read is atomic; a queue enters ``built`` before it leaves ``rows``);
    ``queues`` is the view of all of them. The dispatcher creates queues (``find_or_create``); builds and creations
    hold the table's lock. Directories that are not a valid topic or queue id are skipped and listed in
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
        self.built: Dict[Key, ConsumeQueue] = {}
        # queues a snapshot vouched for (their stamps and units checked by ``load``), not built yet: their rows
        self.rows: Dict[Key, QueueRow] = {}
        self._dev = -1  # the device of the rows' files (a row's ids are (this, its inode))
        self._closed = False  # set by close: no queue is made after it (a reader that passed its open check)
        # the log's min offset the rows' min offsets are right for (the open sets it; -1: not known)
        self.rows_mins_at = -1
        # the commit log's min offset at the open: a row's min offset past its first file's start follows a unit that
        # retention expired below it (_row_agrees)
        self.log_min = 0
        self.queues = QueueView(self)
        self.skipped_dirs: List[str] = []
        # (topic, queue id) -> why its files could not be loaded (wrong size, a missing file between others):
        # they were deleted, recovery rebuilds the queue from the commit log
        self.damaged: Dict[Tuple[str, int], str] = {}
        # the queues whose state a queue snapshot gave (load): their files are as a clean close left them
        self.vouched: Set[Tuple[str, int]] = set()
        # an RLock: checking a row against the log may look at another queue (a record whose header names it)
        self._lock = threading.RLock()
        # while an open that may fail runs: told (path, start, -1) before a queue file is cut or deleted
        # (OpenUndo.save_derived; see MappedFileQueue.before_rewrite)
        self.before_rewrite: Optional[Callable[[str, int, int], None]] = None
        # while an open that may fail runs: told the queue directory as ``load`` loads a queue from its files, and
        # as the open creates a queue, before anything writes there (OpenUndo.take_queue_dir); and (topic directory,
        # queue ids) of the queues ``load`` keeps as their rows, once a topic (OpenUndo.vouch_queue_dirs)
        self.list_queue_dir: Optional[Callable[[str], None]] = None
        self.vouch_queue_dirs: Optional[Callable[[str, Sequence[int]], None]] = None
        # the commit log offset the rows' units reach at most (the snapshot's log end): a row's queue holds every
        # record of it below this, and the dispatcher meets none of its records past it before the queue is built
        self.rows_end = -1
        # (key, the queue loaded from its files) for a row whose queue's files no longer match it: check the queue
        # against the log, cut it where it stops matching and index its records again up to the log's end
        # (DefaultMessageStore._repair_queue: queue_recovery.repair_queue; None: the queue is taken as its files are)
        self.repair: Optional[Callable[[Key, ConsumeQueue, int], None]] = None  # (and the row's max offset)
        # the rows are a running store's cut (read after a crash): a queue written after the cut fails its row's
        # check on its first use, which the open's re-dispatch makes at its first record past the cut
        self.rows_running = False
        self._row_qids: Dict[str, Sequence[int]] = {}  # topic -> the queue ids of its rows (the put path's miss hook)
        # topic -> its snapshot row, for the topics whose queues were all taken as rows (whole_topics)
        self._spans: Dict[str, TopicRow] = {}
        self._rows_phys = (0, -1)  # rows_phys
        # while an open that may fail re-dispatches: told (path, position) of the last file of a row's queue as it is
        # built, before anything is appended there (OpenUndo.mark_derived_end; last_files for the others)
        self.on_row_built: Optional[Callable[[str, int], None]] = None
        # a store shared between processes, once its first opener published the rows: a row's queue is made and
        # handed to this (its unit count taken from the control file) before anyone sees it. While ``repair`` is set
        # (the first opener checks the rows on a thread, no other process attached) a row that no longer holds is
        # repaired; after (``end_repairs``) it was written by the process that dispatches (another one, maybe): its
        # queue is loaded from its files as they are, never repaired (only the dispatching process writes them)
        self.adopt: Optional[Callable[[ConsumeQueue], None]] = None

    def _queue_dir(self, topic: str, queue_id: int) -> str:
        # the names are checked by load or check_topic (os.path.join costs here at 100,000 queues)
        return f"{self.root}/{topic}/{queue_id}"

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
        with self._lock:  # (a queue made meanwhile takes the hook from _new, under the same lock)
            self.before_rewrite = before_rewrite
            for cq in list(self.built.values()):
                cq.mapped_file_queue.before_rewrite = before_rewrite

    # -- every queue, built or not ---------------------------------------------------------------------------

    def get(self, key: Key) -> Optional[ConsumeQueue]:
        """The ConsumeQueue of ``key``, built from its row on first use; None when the store has no such queue."""
        cq = self.built.get(key)
        if cq is None and key in self.rows:
            with self._lock:
                cq = self.built.get(key)
                if cq is None:
                    cq = self._build(key)
        return cq if cq is not None else self.built.get(key)  # built (and its row dropped) meanwhile

    def _build(self, key: Key) -> ConsumeQueue:
        """Make the queue of a row (under ``_lock``) on its first use. The row is checked first (``_row_holds``:
        stamps, a unit or two): when it holds, the queue is made from it without a read of its files; when its files
        changed behind the closed store, the queue is loaded from them and repaired from the log (``repair``)."""
        if self._closed:
            raise StoreClosedError(f"consume queue {key[0]}-{key[1]}: the store was closed")
        row = self.rows[key]
        qdir = self._queue_dir(*key)
        self._spans.pop(key[0], None)  # the topic is no longer written back whole: its rows go as they are built
        try:
            # (a link planted while the store ran is inside the directory's stamp: listed whether the row holds or not)
            refuse_links(qdir)
            holds = self._row_holds(key, row)
        except FileNotFoundError:
            holds = False
        except UnsafePathError:
            raise
        except OSError as e:
            raise store_io_error(e, "check", e.filename or qdir) from e
        if not holds and self.adopt is not None and self.repair is None:
            cq = self._new(key[0], key[1])
            try:
                cq.load()
                self.adopt(cq)
            except BaseException:
                cq.close()
                raise
            self.built[key] = cq
            del self.rows[key]
            self.vouched.discard(key)
            return cq
        if not holds:
            try:
                # the names in it may be in the page cache only (an open after a crash leaves a row's directory
                # unsynced, vouched_dirs): durable before the queue is loaded and repaired from them
                for d in (qdir, os.path.dirname(qdir)):
                    if os.path.isdir(d):
                        fsync_dir(d)
                cq = self._load_queue(key)
            except OSError as e:
                raise store_io_error(e, "load", e.filename or qdir) from e
            self.built[key] = cq
            del self.rows[key]
            self.vouched.discard(key)
            # (the repair tells on_row_built where its queue ends once checked: its units are not counted yet)
            if self.repair is not None:
                try:
                    self.repair(key, cq, row.max_offset)
                except BaseException as e:
                    # left a row: its next use checks the queue again (what the repair cut no longer matches the row)
                    del self.built[key]
                    cq.close()
                    self.rows[key] = row
                    self.vouched.add(key)
                    if isinstance(e, OSError) and not isinstance(e, LocalMQError):
                        raise store_io_error(e, "repair", e.filename or qdir) from e
                    raise
            return cq
        cq = self._new(key[0], key[1])
        dev = self._dev
        try:
            cq.mapped_file_queue.load_known([b for b, _, _ in row.files], [(dev, ino) for _, _, ino in row.files])
        except BaseException as e:
            cq.close()
            if isinstance(e, OSError):  # a file gone since the open (without a budget, files are mapped here)
                raise store_io_error(e, "map", e.filename or cq.mapped_file_queue.directory) from e
            raise
        cq.restore(row.max_offset, row.min_offset, row.max_physic_offset)
        if self.adopt is not None:
            self.adopt(cq)
        self.built[key] = cq
        del self.rows[key]
        self.tell_built(cq)
        return cq

    def tell_built(self, cq: ConsumeQueue) -> None:
        """Tell ``on_row_built`` where the queue of a row just built ends (re-dispatch appends from there): by
        ``_build`` for a row that holds, by the repair of one that does not once it checked the queue."""
        if self.on_row_built is not None:
            end = _last_file_end(cq)
            if end is not None:
                self.on_row_built(*end)

    def load_rows(self) -> List[Key]:
        """Load every row's queue from its files, unchecked by its row (the open found the log changed since the
        snapshot's close: every queue is checked as an open without a snapshot checks it). Returns their keys."""
        with self._lock:
            keys = sorted(self.rows)
            self._spans.clear()
            for key in keys:
                self.built[key] = self._load_queue(key)
                del self.rows[key]
                self.vouched.discard(key)
            self._rows_phys = (0, -1)  # no row left: re-dispatch starts from the queues' ends, not the rows'
        return keys

    def next_offsets(self, topic: str) -> List[Tuple[int, int]]:
        """(queue id, next queue offset) of the queues of ``topic`` that were rows at the open, each checked (built)
        now: the commit log's put path asks on its first put to a topic (a row is never trusted for a queue offset
        before its check: one short would hand out an offset already used)."""
        out = []
        for q in self._row_qids.get(topic, ()):
            cq = self.get((topic, q))
            if cq is not None:
                out.append((q, cq.max_offset))
        return out

    def for_retention(self, min_offset: int) -> List[ConsumeQueue]:
        """The queues retention's pass for the log's min offset ``min_offset`` must visit: the made ones, and the rows
        too (made now) unless their min offsets are already right for it (``rows_mins_at``, set by the open)."""
        if min_offset != self.rows_mins_at:
            return self.build_all()
        return list(self.built.values())

    def build_all(self) -> List[ConsumeQueue]:
        """Build every queue not built yet; returns all of them."""
        for key in list(self.rows):
            self.get(key)
        return list(self.built.values())

    def keys(self) -> List[Key]:
        """Every queue's key, built or not."""
        with self._lock:
            return list(self.built) + list(self.rows)

    def __len__(self) -> int:
        with self._lock:
            return len(self.built) + len(self.rows)

    def ends(self, rows: bool = True) -> List[Tuple[Key, int, int]]:
        """(key, max offset, max physical offset) of every queue (``rows`` False: of the built ones), without
        building one."""
        with self._lock:
            out = [(k, cq.max_offset, cq.max_physic_offset) for k, cq in self.built.items()]
            if rows:
                out += [(k, r.max_offset, r.max_physic_offset) for k, r in self.rows.items()]
        return out

    def row_holds_record(self, key: Key, position: int) -> bool:
        """Whether the record of ``key`` at log offset ``position`` (the dispatcher's) lies before the rows' end and
        ``key`` is still a row: its queue holds it (a re-dispatch after a crash starts before a running store's cut),
        so the dispatcher steps over it and the row stays unbuilt."""
        return bool(self.rows) and key in self.rows and position < self.rows_end

    def rows_phys(self) -> Tuple[int, int]:
        """(lowest, highest) max physical offset of the rows the open kept (bounds: rows only leave), (0, -1) for
        none; what recovery asks of the rows without a look at each (``ends`` lists every queue)."""
        return self._rows_phys

    def max_offset(self, key: Key) -> int:
        """The queue's max offset without building it; -1 when the store has no such queue."""
        cq = self.built.get(key)
        if cq is not None:
            return cq.max_offset
        row = self.rows.get(key)
        if row is not None:
            return row.max_offset
        cq = self.built.get(key)
        return -1 if cq is None else cq.max_offset

    def whole_topics(self) -> Dict[str, TopicRow]:
        """The snapshot rows of the topics none of whose queues was used since the open (all still rows, none made,
        none added): a close writes each back as it was read (``TopicRow.span``), without a look at each queue."""
        with self._lock:
            used = {topic for topic, _ in self.built}
            rows = self.rows
            return {
                topic: entry
                for topic, entry in self._spans.items()
                if topic not in used and all(k in rows for k in entry.keys)
            }

    def vouched_dirs(self) -> Set[str]:
        """The directories an open after a crash need not sync (queue_recovery.sync_directories): those of the topics
        taken whole (unchanged since the cut that vouched for them, their names synced before it was written) and of
        the rows (a row whose stamps fail its check has its directory synced then, ``_build``)."""
        with self._lock:
            spans = self._spans
            out = {f"{self.root}/{t}" for t in spans}
            out.update(self._queue_dir(*k) for k in self.rows if k[0] not in spans)
        return out

    def cut(self) -> Tuple[Dict[str, TopicRow], List[QueueState]]:
        """(``whole_topics()``, ``states(leave_out=those)``) of one view of the table, taken under the lock (no queue
        built or made between them) and read outside it: a running store's snapshot, taken while the dispatcher
        and readers go on (the lock held for two dict copies, not for 100,000 queues' states)."""
        with self._lock:
            built = list(self.built.items())
            rows = list(self.rows.items())
            spans = list(self._spans.items())
        used = {topic for (topic, _), _ in built}
        row_keys = {k for k, _ in rows}
        whole = {t: e for t, e in spans if t not in used and all(k in row_keys for k in e.keys)}
        return whole, self._states(built, rows, whole)

    def states(self, leave_out: Container[str] = ()) -> List[QueueState]:
        """(key, directory, its files' base offsets, max offset, min offset, max physical offset, whether a file's
        deletion waits for a reader, its row or None) of every queue but the rows of the topics in ``leave_out``,
        sorted, without building one: what a queue snapshot records. A row is written back as it is, its stamps those
        its check will compare (never the files' stamps now: a row not checked since the open would vouch for
        whatever its files became)."""
        with self._lock:
            built = list(self.built.items())
            rows = list(self.rows.items())
        return self._states(built, rows, leave_out)

    def _states(
        self,
        built: List[Tuple[Key, ConsumeQueue]],
        rows: List[Tuple[Key, QueueRow]],
        leave_out: Container[str],
    ) -> List[QueueState]:
        out: List[QueueState] = [_built_state(k, cq) for k, cq in built]
        for k, r in rows:
            if k[0] not in leave_out:
                bases = [b for b, _, _ in r.files]
                out.append((k, self._queue_dir(*k), bases, r.max_offset, r.min_offset, r.max_physic_offset, False, r))
        out.sort(key=lambda x: x[0])
        return out

    def last_files(self, rows: bool = True) -> List[Tuple[str, int]]:
        """(path, position) of every queue's last file and where its units end in it, without building one
        (``rows`` False: of the built queues only)."""
        with self._lock:
            out = [end for end in map(_last_file_end, self.built.values()) if end is not None]
            for (topic, qid), r in self.rows.items() if rows else ():
                base = r.files[-1][0]
                out.append((f"{self._queue_dir(topic, qid)}/{base:020d}", r.max_offset * CQ_UNIT_SIZE - base))
        return out

    def load(self, snapshot: Optional[QueueSnapshot] = None, log_min: int = 0) -> None:
        """Map every queue found under ``root`` (files as they are; ``ConsumeQueue.recover`` checks them). A queue
        whose row in ``snapshot`` (store/queue_snapshot.py) the snapshot vouches for (its topic directory unchanged
        since the close) is kept as that row, unread and unchecked, and entered in ``vouched``: the row is checked
        on the queue's first use (``_build``), so that an open costs nothing per queue nobody uses. ``log_min``: the
        commit log's min offset, which a row's min offset must agree with (``_row_agrees``)."""
        root = self.root
        self.log_min = log_min
        if not os.path.isdir(root):
            return
        self._dev = os.stat(root).st_dev  # a queue file on another file system is not one the snapshot saw
        known = snapshot.topics if snapshot is not None else {}
        self.rows_running = snapshot is not None and snapshot.running
        if snapshot is not None:
            self.rows_end = snapshot.log_end
        with os.scandir(root) as it:  # the entries' types (d_type): no stat per topic
            topics = sorted(e.name for e in it if e.is_dir(follow_symlinks=False) or e.is_symlink())
        rows, vouched, row_qids, vouch_dirs = self.rows, self.vouched, self._row_qids, self.vouch_queue_dirs
        stamps = _stamps_of(root, [t for t in topics if t in known and known[t].dir_ctime != NOT_VOUCHED])
        for topic in topics:
            tdir = f"{root}/{topic}"
            if TOPIC_RE.match(topic) is None:
                self.skipped_dirs.append(tdir)
                log.warning("ignoring consume queue directory %s: not a valid topic name", tdir)
                continue
            entry = known.get(topic)
            if entry is not None and stamps.get(topic) == (entry.dir_ctime, entry.dir_ino):
                # the directory holds what it held at the close: the snapshot's queues (ids as numbers, no names),
                # the vouched rows taken whole (checked and built on first use)
                if entry.keys:
                    rows.update(zip(entry.keys, entry.rows))
                    vouched.update(entry.keys)
                    row_qids[topic] = entry.qids
                    if vouch_dirs is not None:  # listed if the open writes there (a write is announced first)
                        vouch_dirs(tdir, entry.qids)
                    if not entry.others:
                        self._spans[topic] = entry
                for qid in entry.others:
                    if qid > MAX_QUEUE_ID:  # (no close writes one)
                        self.skipped_dirs.append(f"{tdir}/{qid}")
                        log.warning("ignoring consume queue directory %s: not a queue id", f"{tdir}/{qid}")
                    else:
                        self.built[(topic, qid)] = self._load_queue((topic, qid))
                continue
            listed: List[int] = []
            for q in _names_refusing_links(tdir):
                if not is_decimal(q) or int(q) > MAX_QUEUE_ID:
                    self.skipped_dirs.append(f"{tdir}/{q}")
                    log.warning("ignoring consume queue directory %s: not a queue id", f"{tdir}/{q}")
                    continue
                key = (topic, int(q))
                row = entry.row(key[1]) if entry is not None else None
                if row is not None:  # vouched for
                    rows[key] = row  # checked and built on first use
                    vouched.add(key)
                    listed.append(key[1])
                    continue
                self.built[key] = self._load_queue(key)
            if listed:
                row_qids[topic] = listed
                if vouch_dirs is not None:
                    vouch_dirs(tdir, listed)
        if rows:
            ends = [r.max_physic_offset for r in rows.values()]
            self._rows_phys = (min(ends), max(ends))

    def _load_queue(self, key: Key) -> ConsumeQueue:
        """The queue of ``key`` over its files as they are (``ConsumeQueue.recover`` checks them). Files that cannot
        be loaded (a wrong size, a missing file between others) are deleted, never through a link, and the queue is
        entered in ``damaged``: derived data, recovery rebuilds it from the commit log. Raises UnsafePathError for a
        link in its directory."""
        topic, q = key
        qdir = self._queue_dir(topic, q)
        refuse_links(qdir)
        if self.list_queue_dir is not None:
            self.list_queue_dir(qdir)
        cq = self._new(topic, q)
        try:
            cq.load()
        except CorruptStoreError as e:
            log.error(
                "consume queue %s-%s cannot be loaded (%s); deleting its files to rebuild it from the commit log",
                topic,
                q,
                e,
            )
            for name in os.listdir(qdir):
                path = os.path.join(qdir, name)
                if len(name) == 20 and is_decimal(name) and os.path.isfile(path) and not os.path.islink(path):
                    if self.before_rewrite is not None:
                        self.before_rewrite(path, 0, -1)
                    os.unlink(path)
            fsync_dir(qdir)
            cq = self._new(topic, q)
            self.damaged[key] = str(e)
        return cq

    def _row_holds(self, key: Key, row: QueueRow) -> bool:
        """True when the queue's directory and files are still those of its snapshot row (inode, ctime, size, on the
        table's device) and its units are where the row says: the queue can be made from the row. Else False (then it
        is loaded and checked against the log). Raises UnsafePathError for a link, OSError when a file cannot be
        read.

        A row holds when it has the shape a close writes (consecutive files, the end in the last one), the directory
        and every file are still those it stamped, no file lies before its first or after a full last one, the unit
        before its max offset is a real one ending at its max physical offset, the unit at its max offset (when a
        file holds it) is all zeros, and a min offset past the first file's start follows a unit retention expired
        (blank, or its record below the log's min offset of the open, ``log_min``). A row that lies (a snapshot forged
        with a right CRC, or a bug of the close that wrote it) must never hide units that exist, nor let a put write
        over one."""
        rc = self._codes([key], [row])[0]
        if rc == ROW_LINK:
            path = self._queue_dir(*key)
            raise UnsafePathError(f"{path} is a symlink, which localmq never writes through", path=path)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc), self._queue_dir(*key))
        if rc == ROW_DISAGREES:
            log.warning("consume queue %s-%d: its units are not where the queue snapshot says", key[0], key[1])
        return rc == ROW_HOLDS

    def _codes(self, keys: List[Key], rows: List[QueueRow]) -> List[int]:
        """What ``_snapshot.check_rows`` finds for each row (compiled: the files looked at without the GIL)."""
        qdirs = [os.fsencode(self._queue_dir(*key)) for key in keys]
        return check_rows(qdirs, rows, self.file_size, self._dev, self.log_min)

    def check_rows(self) -> List[Key]:
        """The rows that fail their check (``_row_holds``) now, every row looked at without building its queue, on
        a few threads (the files are looked at without the GIL). A store shared between processes checks them all at
        its first open: the other processes load a queue from its files as they are, so a file changed behind the
        closed store must be found before they attach. A row whose look fails is listed (``_build`` raises it)."""
        items = list(self.rows.items())
        size = max(256, -(-len(items) // 64))  # 64 chunks or more: sync_each's threads
        chunks = [items[i : i + size] for i in range(0, len(items), size)]

        bad: List[Key] = []

        def check(chunk: List[Tuple[Key, QueueRow]]) -> None:
            keys = [k for k, _ in chunk]
            bad.extend(k for k, rc in zip(keys, self._codes(keys, [r for _, r in chunk])) if rc != ROW_HOLDS)

        failed = sync_each(check, chunks)
        if failed:
            raise failed[0][1]
        return sorted(bad)

    def end_repairs(self) -> None:
        """No row is repaired from here on (``adopt``): no build is under way as it changes (the table's lock)."""
        with self._lock:
            self.repair = None

    def closing_view(self, handover: QueueSnapshot, unit_count: Callable[[str, int], int]) -> "ClosingView":
        """What a shared store's last closer writes ``queues.snapshot`` from (see ClosingView)."""
        with self._lock:
            built = dict(self.built)
            rows = dict(self.rows)
        return ClosingView(self.root, self.file_size, built, rows, handover, unit_count)

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The ConsumeQueue of (topic, queue), created (no file yet) when missing. Raises InvalidTopicError."""
        key = (topic, queue_id)
        cq = self.built.get(key)
        if cq is None:
            with self._lock:
                cq = self.built.get(key)
                if cq is None:
                    if key in self.rows:
                        return self._build(key)
                    if self._closed:
                        raise StoreClosedError(f"consume queue {topic}-{queue_id}: the store was closed")
                    check_topic(topic)
                    self._spans.pop(topic, None)
                    if self.list_queue_dir is not None:  # a new queue during an open: its topic directory listed
                        self.list_queue_dir(self._queue_dir(topic, queue_id))
                    cq = self._new(topic, queue_id)
                    self.built[key] = cq
        return cq

    def find_or_load(self, topic: str, queue_id: int, adopt: Callable[[ConsumeQueue], None]) -> ConsumeQueue:
        """The ConsumeQueue of (topic, queue); when missing, one over the files already on disk (written by another
        process of a shared store), passed to ``adopt`` before anyone else sees it; a row's, built from its row
        (``_build``, which hands it to ``self.adopt``). Raises InvalidTopicError."""
        key = (topic, queue_id)
        cq = self.built.get(key)
        if cq is None:
            with self._lock:
                cq = self.built.get(key)
                if cq is None and key in self.rows:
                    return self._build(key)
                if cq is None:
                    if self._closed:
                        raise StoreClosedError(f"consume queue {topic}-{queue_id}: the store was closed")
                    check_topic(topic)
                    cq = self._new(topic, queue_id)
                    cq.load()
                    adopt(cq)
                    self.built[key] = cq
        return cq

    def mapping_stats(self) -> Dict[str, Optional[int]]:
        """``mapped_queue_files`` (queue files mapped now; with no budget, every file of every queue),
        ``queue_file_evictions`` and ``queue_file_remaps`` (None without a budget)."""
        b = self.budget
        if b is None:
            return {
                "mapped_queue_files": sum(len(cq.mapped_file_queue.files) for cq in list(self.built.values())),
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
        for cq in self.build_all():
            cq.destroy()
        self.built.clear()
        self.vouched.clear()

    def close(self) -> None:
        """Unmap every queue's files (a queue never built has none mapped); no queue is made after this."""
        with self._lock:
            self._closed = True
        for cq in list(self.built.values()):
            cq.close()


class ClosingView:
    """Every queue on disk as the last process to close a shared store knows it, in the shape ``write_snapshot`` reads
    a table (``states``, ``whole_topics``, ``skipped_dirs``): the queues this process built, with their ends; the rows
    its first opener handed over (``config/queues.handover``, or this table's own) whose unit count in the control
    file (``unit_count``: -1 when it has none) is still the row's, as they were (the next open checks each like any
    row); any other queue (another process dispatched to it) listed, not vouched for, so that the next open checks it.
    A topic directory is listed when it is not the one the handover stamped (a queue was added to it since)."""

    def __init__(
        self,
        root: str,
        file_size: int,
        built: Dict[Key, ConsumeQueue],
        rows: Dict[Key, QueueRow],
        handover: QueueSnapshot,
        unit_count: Callable[[str, int], int],
    ) -> None:
        self.root = root
        self.file_size = file_size
        self.skipped_dirs: List[str] = []
        self._whole: Dict[str, TopicRow] = {}
        self._built: List[Tuple[Key, ConsumeQueue]] = []
        self._states: List[QueueState] = []
        with os.scandir(root) as it:
            topics = sorted(e.name for e in it if e.is_dir(follow_symlinks=False) or e.is_symlink())
        known = handover.topics
        stamps = _stamps_of(root, [t for t in topics if t in known and known[t].dir_ctime != NOT_VOUCHED])
        for topic in topics:
            tdir = f"{root}/{topic}"
            if TOPIC_RE.match(topic) is None:
                self.skipped_dirs.append(tdir)
                continue
            entry = known.get(topic)
            same = entry is not None and stamps.get(topic) == (entry.dir_ctime, entry.dir_ino)
            if same:  # (the handover's listing of it holds: no queue was added)
                qids: List[int] = list(entry.qids) + list(entry.others)  # type: ignore[union-attr]
            else:
                qids = [int(q) for q in _names_refusing_links(tdir) if is_decimal(q)]
            whole = same and not entry.others  # type: ignore[union-attr]
            if whole and all(_kept_row((topic, q), entry, built, rows, unit_count) for q in qids):
                self._whole[topic] = entry  # type: ignore[assignment]
                continue  # (written back as the handover's span: no state of its queues is needed)
            for qid in qids:
                key = (topic, qid)
                qdir = f"{tdir}/{qid}"
                row = _kept_row(key, entry, built, rows, unit_count)
                if row is not None:
                    bases = [b for b, _, _ in row.files]
                    self._states.append(
                        (key, qdir, bases, row.max_offset, row.min_offset, row.max_physic_offset, False, row)
                    )
                    continue
                whole = False
                cq = built.get(key)
                if qid > MAX_QUEUE_ID:
                    self.skipped_dirs.append(qdir)
                elif cq is not None:
                    self._built.append((key, cq))
                else:  # not vouched for (no files): the next open loads and checks it
                    units = max(unit_count(topic, qid), 0)
                    self._states.append((key, qdir, [], units, units, -1, False, None))
            if whole:
                self._whole[topic] = entry  # type: ignore[assignment]

    def whole_topics(self) -> Dict[str, TopicRow]:
        return dict(self._whole)

    def states(self, leave_out: Container[str] = ()) -> List[QueueState]:
        out = [st for st in self._states if st[0][0] not in leave_out]
        out += [_built_state(k, cq) for k, cq in self._built]
        out.sort(key=lambda x: x[0])
        return out

    def cut(self) -> Tuple[Dict[str, TopicRow], List[QueueState]]:
        """A shared store's housekeeper's running cut (``SnapshotWriter.take_cut``): as ConsumeQueueTable.cut."""
        whole = self.whole_topics()
        return whole, self.states(leave_out=whole)


def _kept_row(
    key: Key,
    entry: Optional[TopicRow],
    built: Dict[Key, ConsumeQueue],
    rows: Dict[Key, QueueRow],
    unit_count: Callable[[str, int], int],
) -> Optional[QueueRow]:
    """The row a closing view keeps for a queue as it was (the first opener's, or the handover's), or None: the queue
    was built by this process, its id is out of range, it has no row, or its unit count in the control file is no
    longer the row's (another process dispatched to it)."""
    if key[1] > MAX_QUEUE_ID or key in built:
        return None
    row = rows.get(key) or (entry.row(key[1]) if entry is not None else None)
    if row is None or unit_count(*key) != row.max_offset:
        return None
    return row


def _built_state(key: Key, cq: ConsumeQueue) -> QueueState:
    """A built queue's state (ConsumeQueueTable.states): the ends before the files (a file added after them makes a
    row its check refuses, the end not in the last file, never one that leaves a file out)."""
    ends = (cq.max_offset, cq.min_offset, cq.max_physic_offset)
    mfq = cq.mapped_file_queue
    bases = [mf.file_from_offset for mf in mfq.files]
    return (key, mfq.directory, bases, ends[0], ends[1], ends[2], bool(mfq.hanged), None)
