"""The queue snapshot: every ConsumeQueue's end, written at a clean close, so that the next open need not read them.

At 100,000 queues an open that reads every ConsumeQueue file (its end, then every unit against its record) takes
tens of seconds, almost all of it per queue. A clean close knows every queue's end already. It writes them to
``config/queues.snapshot`` (localmq's own file; RocketMQ ignores it) after the last flush and before ``abort``
goes, with what each file was then: inode and change time (ctime). The next open believes a row only for files
that are still exactly those, in a store that is exactly that: no ``abort``, the same checkpoint bytes, the same
segments (inode, ctime), the same file sizes. Any write to a file changes its ctime (a write through a mapping
too, at its first fault after the flush), and nobody can set a ctime back, so a queue file that was damaged, cut,
replaced or grown after the close is not vouched for and gets today's checks (``ConsumeQueue.recover``, the unit
check of ``store/queue_recovery.py``); so is every queue when the commit log's recovery finds anything to repair.

A file changed within the same clock tick (or timestamp granule) as the close's last write of it could keep its
ctime: what changed less than ``FRESH_NS``, or three granules of the file system's timestamps (1 s on ext3, ext4
with 128-byte inodes or HFS+, as the recorded ctimes show), before the close began, on the file system's own clock
(the ctime of the snapshot's temporary file, made first), is not vouched for. On Linux >= 6.13 ext4 and tmpfs
ctimes are fine-grained once read, which the close does. The open deletes the snapshot (durably)
before it writes anything, so a crash after it never meets a stale one; a failed open gives it back (OpenUndo).

A running store writes the same rows to ``config/queues.running`` at each thorough pass of the queue flush (every
``flush_consume_queue_thorough_interval`` ms, and at the first pass after an open): a cut at log offset ``E`` where
every record before ``E`` was dispatched before the rows were taken (``RunningCut``), the log was flushed past ``E``
and the queues' units were flushed after the rows were taken, before the file is written. A built queue whose units
reach past ``E`` is listed, not vouched for. Only an open after a crash reads it: a queue whose files are still
those of its row holds exactly its records before ``E`` (a unit written after the cut changes its file's ctime, and
where it does not, as through a mapping on tmpfs, the row's check at first use finds the unit at its max offset is
not zeros), so recovery re-dispatches from ``E`` at the latest and leaves the rows alone; every other queue is
checked as after any crash. Old segments must keep their inodes and ctimes (the one holding ``E`` its inode: the
log was appended to since), retention may have deleted the first ones.

A store shared between processes is closed by whichever process leaves last, which has built only the queues it
used. Its first opener therefore writes the rows it took or made to ``config/queues.handover`` once its open is done
(not durable: only a clean close reads it, and every open deletes it), and the last closer writes ``queues.snapshot``
from them (``ConsumeQueueTable.closing_view``): a row whose queue's unit count in the control file is still the row's
is written back as it was (its next open checks it like any row), a queue this process built is stamped as in a
single process, and any other queue is listed, not vouched for.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from localmq._native import fsync_dir
from localmq._snapshot import QueueRow, TopicRow, parse_topic_rows
from localmq.layout import (
    CHECKPOINT,
    CONFIG_DIR,
    QUEUE_SNAPSHOT_FILE,
    QUEUE_SNAPSHOT_FILE_ROW,
    QUEUE_SNAPSHOT_HANDOVER_FILE,
    QUEUE_SNAPSHOT_HANDOVER_MAGIC,
    QUEUE_SNAPSHOT_HEADER,
    QUEUE_SNAPSHOT_MAGIC,
    QUEUE_SNAPSHOT_META,
    QUEUE_SNAPSHOT_NOT_VOUCHED,
    QUEUE_SNAPSHOT_QUEUE_ROW,
    QUEUE_SNAPSHOT_RUNNING_FILE,
    QUEUE_SNAPSHOT_RUNNING_MAGIC,
    QUEUE_SNAPSHOT_TOPIC_ROW,
    QUEUE_SNAPSHOT_VERSION,
    SEGMENT_NAME_RE,
)

__all__ = [
    "QueueRow",
    "QueueSnapshot",
    "RunningCut",
    "SnapshotWriter",
    "TopicRow",
    "read_handover",
    "read_snapshot",
    "remove_handover",
    "remove_snapshot",
    "fs_clock",
    "handover_path",
    "keep_as_first_cut",
    "take_cut",
    "write_snapshot",
]

log = logging.getLogger("localmq.store")

FRESH_NS = 50_000_000  # what changed this recently before the snapshot is not vouched for (coarse ctimes)
NOT_VOUCHED = QUEUE_SNAPSHOT_NOT_VOUCHED  # a ctime field: the entry is listed, not vouched for
# the largest file read as a snapshot: about 60 bytes a queue and 24 a file, so millions of queues
MAX_SNAPSHOT_BYTES = 1 << 30
SEGMENTS_WALKED = 3  # the normal recovery walks the last three segments: their changes it finds itself


@dataclass
class QueueSnapshot:
    """A snapshot that matches the store's checkpoint, segments and sizes; rows still to be checked per queue."""

    mins_at: int  # the log's min offset the rows' min offsets are right for (-1: not known)
    log_end: int
    root_ctime: int
    root_ino: int
    topics: Dict[str, TopicRow]  # by topic name
    running: bool = False  # a running store's cut (queues.running), read after a crash; log_end is the cut
    raw: bytes = field(default=b"", repr=False)  # the file's bytes, until keep_as_first_cut


@dataclass
class RunningCut:
    """The queues of a running store at a cut (``take_cut``), before the flush pass that makes their units durable."""

    fs_now: int  # the file system's clock before the cut: a file or directory changed since is not vouched for
    dispatched: int  # every record before this offset was dispatched before the states were taken
    mins_at: int  # the log's min offset the states' min offsets are right for (-1: not known)
    whole: Dict[str, TopicRow]  # topics written back whole (ConsumeQueueTable.whole_topics)
    states: List[Any]  # ConsumeQueueTable.states(leave_out=whole)
    # (topic, queue id) -> (its state's ends and files, its vouched row's bytes) of the writer's last cut: a queue
    # whose state is the same is written with those stamps, without an lstat (a change since moved its ctime)
    rows: Dict[Tuple[str, int], Tuple[Any, bytes]] = field(default_factory=dict)
    table: Any = None  # what the states were taken from (a ConsumeQueueTable, or a shared store's ClosingView)


def take_cut(
    root: str, view: Callable[[], Any], dispatched: Callable[[], int], mins_at: Callable[[], int]
) -> RunningCut:
    """The states of every queue, under the table's lock (no queue built or made between the topics written back
    whole and the others), after the dispatcher's position was read, after the file system's clock was read (the
    change time a touch of the temporary file gets): a queue directory made, or a unit written, after the states
    were taken is changed after that time, and is not vouched for (a topic directory holding a queue the cut does
    not know must not be vouched for: its queues would be taken from the rows). ``mins_at`` is asked before and
    after the states are taken: a retention pass between them leaves it unknown. ``view()`` gives what the states
    are taken from (``cut()``), after the dispatcher's position was read: the ConsumeQueueTable, or a shared
    store's ``ClosingView`` (whose unit counts are read then)."""
    fs_now = fs_clock(snapshot_path(root, True) + ".tmp")
    at = dispatched()
    mins_before = mins_at()
    table = view()
    whole, states = table.cut()
    mins = mins_before if mins_at() == mins_before else -1
    return RunningCut(fs_now, at, mins, whole, states, table=table)


def fs_clock(tmp: str) -> int:
    """The file system's clock (ns): the change time a touch of the temporary file ``tmp`` gets (made if missing; an
    entry there that is not a regular file raises OSError). A file or directory changed after this has a later ctime."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EEXIST, "not a regular file", tmp)
        os.utime(fd)  # its change time is now, on the file system's clock
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)


class SnapshotWriter:
    """Writes a store's snapshots: a clean close's (``write_closed``), a running store's cuts (``take_cut`` before
    the queues' thorough flush pass, ``write_cut`` after it). A failure costs the next open its shortcut only:
    logged, never raised."""

    def __init__(self, root: str, table: Any, log_files: Any, checkpoint_path: str, mins_at: Callable[[], int]):
        self.root = root
        self.table = table  # the ConsumeQueueTable
        self.log_files = log_files  # the commit log's MappedFileQueue
        self.checkpoint_path = checkpoint_path
        self.mins_at = mins_at  # the log's min offset the queues' min offsets are right for now (-1: not known)
        self.dispatched: Callable[[], int] = lambda: -1  # the dispatcher's position (a running store's)
        # a shared store's housekeeper: its cuts hold the first opener's handed-over rows as its last closer writes
        # them (ClosingView), this callable giving a queue's unit count in the control file (-1: none)
        self.unit_count: Optional[Callable[[str, int], int]] = None
        self._awaits_handover = False  # a shared cut found no handover yet (``cut_due``)
        self._rows: Dict[Tuple[str, int], Tuple[Any, bytes]] = {}  # the last cut's vouched rows (RunningCut.rows)

    def write_closed(self) -> None:
        """After the last flush of a clean close, before ``abort`` goes."""
        mfq = self.log_files
        try:
            end = mfq.max_offset()
            if not write_snapshot(
                self.root, self.table, mfq.directory, self.checkpoint_path, mfq.file_size, end, self.mins_at()
            ):
                log.debug("%s: no queue snapshot: old segments changed within the last moments", self.root)
        except OSError as e:
            log.warning("%s: no queue snapshot written (%s); the next open checks every queue", self.root, e)

    def write_handover(self, fs_now: int, mins_at: int) -> None:
        """A shared store's first opener, on a thread of its own once open: the queues' rows for the last process
        to close the store (queues.handover, stamped against ``fs_now``, the file system's clock read before any
        other process came in; not durable: a failure costs the next close its snapshot only). The dispatcher may
        write meanwhile: a queue changed since its ends were taken has a ctime after ``fs_now`` (not vouched for),
        and the closer keeps a row only where the control file's unit count is still the row's."""
        mfq = self.log_files
        try:
            if not write_snapshot(
                self.root,
                self.table,
                mfq.directory,
                self.checkpoint_path,
                mfq.file_size,
                mfq.max_offset(),
                mins_at,
                handover=True,
                fs_now=fs_now,
            ):
                log.debug("%s: no rows handed over: old segments changed within the last moments", self.root)
        except Exception as e:  # noqa: BLE001 - a thread of its own: nothing above it would say
            log.warning("%s: no rows handed over (%s); the last close writes no queue snapshot", self.root, e)

    def write_from_handover(self, cq_file_size: int, unit_count: Callable[[str, int], int], fix_mins: bool) -> None:
        """A shared store's last closer, dispatch caught up and everything flushed: queues.snapshot from the first
        opener's handover and this process's queues (``ConsumeQueueTable.closing_view``); the handover goes after
        it. ``fix_mins``: this process's queues' min offsets are made right for the log's start first (when it has
        not moved since the handover), as an open does."""
        mfq = self.log_files
        handover = read_handover(self.root, cq_file_size, mfq.file_size)
        try:
            if handover is None:
                return
            cl_min = mfq.min_offset()
            mins_at = cl_min if handover.mins_at == cl_min else -1
            if mins_at >= 0 and fix_mins:
                for cq in list(self.table.built.values()):
                    cq.correct_min_offset(cl_min)
            try:
                view = self.table.closing_view(handover, unit_count)
            except OSError as e:  # (UnsafePathError is one)
                log.warning("%s: no queue snapshot written (%s); the next open checks every queue", self.root, e)
                return
            SnapshotWriter(self.root, view, mfq, self.checkpoint_path, lambda: mins_at).write_closed()
        finally:
            remove_handover(self.root)

    def take_cut(self) -> Optional[RunningCut]:
        """A running store's cut (``take_cut``); None when none can be taken (logged). A shared store's housekeeper
        takes it from the first opener's handover (none without one) and this process's queues, the way its last
        closer writes the clean close's snapshot (``ConsumeQueueTable.closing_view``): a handed-over row whose unit
        count in the control file is still the row's holds exactly its queue's records before the cut (a record of
        it before the cut was dispatched, into a queue this process built or into one whose count moved), and its
        next open checks it against its files like any row."""
        unit_count = self.unit_count
        try:
            if unit_count is None:
                cut = take_cut(self.root, lambda: self.table, self.dispatched, self.mins_at)
            else:
                handover = read_handover(self.root, self.table.file_size, self.log_files.file_size)
                self._awaits_handover = handover is None
                if handover is None:
                    return None
                cut = take_cut(
                    self.root, lambda: self.table.closing_view(handover, unit_count), self.dispatched, self.mins_at
                )
                if cut.mins_at != handover.mins_at:  # the rows' min offsets are right for the handover's start
                    cut.mins_at = -1
            cut.rows = self._rows  # replaced by the rows this cut vouches for once it is encoded
            return cut
        except OSError as e:  # (UnsafePathError is one)
            log.warning("%s: no running queue snapshot (%s)", self.root, e)
            return None

    def cut_due(self) -> bool:
        """True once the handover a shared cut found missing is there (a stat each call until then): the first
        opener (this process or another) wrote it after this housekeeper's first thorough pass, whose next comes only
        after ``flush_consume_queue_thorough_interval``."""
        if not self._awaits_handover or not os.path.exists(handover_path(self.root)):
            return False
        self._awaits_handover = False
        return True

    def write_cut(self, cut: Optional[RunningCut]) -> bool:
        """queues.running at the cut's dispatch position, after the pass that flushed the cut's units, once the log
        is flushed that far (False until then: the cut waits; a change after the cut has a later ctime than the
        cut's clock, so the stamps taken now vouch for nothing written after it). True when done with the cut."""
        if cut is None:
            return True
        mfq = self.log_files
        end = cut.dispatched
        if end > mfq.flushed_where:
            return False
        try:
            if write_snapshot(
                self.root, cut.table, mfq.directory, self.checkpoint_path, mfq.file_size, end, cut.mins_at, cut
            ):
                self._rows = cut.rows  # the stamps this cut vouched with, for the next one
            else:
                log.debug("%s: no running queue snapshot: a segment changed within the last moments", self.root)
        except OSError as e:
            log.warning("%s: no running queue snapshot written (%s)", self.root, e)
        return True


def snapshot_path(root: str, running: bool = False) -> str:
    return os.path.join(root, CONFIG_DIR, QUEUE_SNAPSHOT_RUNNING_FILE if running else QUEUE_SNAPSHOT_FILE)


def handover_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, QUEUE_SNAPSHOT_HANDOVER_FILE)


def _stamp(st: os.stat_result, fresh_after: int) -> Tuple[int, int]:
    """(ctime ns, inode), the ctime NOT_VOUCHED when it is too recent to tell a later change from it."""
    return (st.st_ctime_ns if st.st_ctime_ns < fresh_after else NOT_VOUCHED), st.st_ino


def _segment_rows(commitlog_dir: str) -> List[Tuple[int, int, int, int]]:
    """(base, ctime ns, inode, size) of every segment, by name."""
    rows = []
    for name in sorted(os.listdir(commitlog_dir)):
        if SEGMENT_NAME_RE.fullmatch(name):
            st = os.stat(os.path.join(commitlog_dir, name))
            rows.append((int(name), st.st_ctime_ns, st.st_ino, st.st_size))
    return rows


def _granularity(ctimes: List[int]) -> int:
    """The file system's timestamp granularity as the ctimes show it (ns): the largest power of ten, up to 10 s,
    that divides every one (1 s on ext4 with 128-byte inodes, ext3 or HFS+; 2 s on FAT gives 1 s here)."""
    g = 10**10
    for c in ctimes:
        while g > 1 and c % g:
            g //= 10
        if g == 1:
            break
    return g


def write_snapshot(
    root: str,
    table: Any,  # a ConsumeQueueTable (which imports this module)
    commitlog_dir: str,
    checkpoint_path: str,
    log_file_size: int,
    log_end: int,
    mins_at: int,
    cut: Optional[RunningCut] = None,
    handover: bool = False,
    fs_now: Optional[int] = None,
) -> bool:
    """Write the snapshot of a store closed cleanly: after every file was flushed, before ``abort`` is removed
    (tmp, fsync, rename, directory fsync). Returns False (and writes nothing) when an old segment changed too
    recently to be vouched for. Raises OSError; the caller logs it and closes without a snapshot.

    With ``cut``: the running store's snapshot (queues.running) of the states the cut took, ``log_end`` the cut's
    offset (at most ``cut.dispatched`` and where the log is flushed), written after the queues' flush pass.
    ``handover``: a shared store's first opener's rows for its last closer (queues.handover: tmp, rename), with
    ``fs_now`` the file system's clock (``fs_clock``) taken while no other process could change the store."""
    path = handover_path(root) if handover else snapshot_path(root, cut is not None)
    tmp = path + ".tmp"
    fd = _open_tmp(tmp)
    try:
        # the file system's own "now", before the first stat: a change after a file's stat gets a ctime at or after
        # it on that file system's clock (a network file system's server may lag this host's clock)
        if fs_now is None:
            fs_now = os.fstat(fd).st_ctime_ns if cut is None else cut.fs_now
        magic = QUEUE_SNAPSHOT_HANDOVER_MAGIC if handover else None
        data = _encode(table, commitlog_dir, checkpoint_path, log_file_size, log_end, mins_at, fs_now, cut, magic)
        if data is None:
            os.close(fd)
            fd = -1
            os.unlink(tmp)
            return False
        fd, mine = -1, fd
        _replace_with(mine, tmp, path, (memoryview(data),), sync=not handover)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    if not handover:
        fsync_dir(os.path.dirname(path))
    return True


def _open_tmp(tmp: str) -> int:
    """A snapshot's temporary file, opened for writing (truncated). No link followed, no wait on a FIFO (ENXIO): an
    entry there that is not localmq's is an error (OSError), left alone."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EEXIST, "not a regular file", tmp)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replace_with(fd: int, tmp: str, path: str, parts: Tuple[memoryview, ...], sync: bool) -> None:
    """Write ``parts`` to ``tmp`` (open as ``fd``, which this closes whatever happens), fsync it when ``sync``, and
    rename it over ``path`` unless an entry there is not a regular file (OSError: left as it is)."""
    try:
        for view in parts:
            while view:
                view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise OSError(errno.EEXIST, "not a regular file, left as it is", path)
    except FileNotFoundError:
        pass
    os.replace(tmp, path)


def _encode(
    table: Any,
    commitlog_dir: str,
    checkpoint_path: str,
    log_file_size: int,
    log_end: int,
    mins_at: int,
    fs_now: int,
    cut: Optional[RunningCut] = None,
    magic: Optional[int] = None,
) -> Optional[bytes]:
    with open(checkpoint_path, "rb") as f:
        cp = f.read(CHECKPOINT.size)
    # the segments made ahead, past the end, are deleted by the close after this
    segments = [row for row in _segment_rows(commitlog_dir) if row[0] < log_end]
    cq_root = table.root
    if cut is None:
        whole: Dict[str, TopicRow] = table.whole_topics()  # topics none of whose queues was used: written back whole
        topic_stats, queue_stats, states, unlisted = _stat_queues(table, whole, table.states(leave_out=whole))
    else:
        whole = cut.whole
        topic_stats, queue_stats, states, unlisted = _stat_queues(table, whole, cut.states, cut.rows)
        known, cut.rows = cut.rows, {}
    root_st = os.lstat(cq_root)
    ctimes = [ctime for _, ctime, _, _ in segments] + [fs_now, root_st.st_ctime_ns]
    for dst, fsts in queue_stats.values():
        ctimes.append(dst.st_ctime_ns)
        ctimes += [fst.st_ctime_ns for fst in fsts]
    # what changed this recently may share its ctime with a later change (a coarse clock or coarse timestamps)
    fresh_after = fs_now - max(FRESH_NS, 3 * _granularity(ctimes))
    # a running store's segment holding the cut is appended to after it: its ctime is not compared (_parse)
    if any(ctime >= fresh_after for _, ctime, _, _ in segments[: -1 if cut is not None else -SEGMENTS_WALKED]):
        return None
    parts = [b""]
    root_ctime, root_ino = _stamp(root_st, fresh_after)
    parts.append(
        QUEUE_SNAPSHOT_META.pack(
            table.file_size,
            log_file_size,
            mins_at,
            log_end,
            root_ctime,
            root_ino,
            len(segments),
            sum(1 for st in topic_stats.values() if st is not None),
        )
    )
    parts.append(cp)
    for base, ctime, ino, _ in segments:
        parts.append(QUEUE_SNAPSHOT_FILE_ROW.pack(base, ctime, ino))
    # a topic directory that held an entry the open skipped (not a queue id) is listed again by the next open, which
    # reports it again (stats()["skipped_directories"]) instead of taking the queue names from here
    odd = {
        os.path.basename(os.path.dirname(p))
        for p in table.skipped_dirs
        if os.path.dirname(os.path.dirname(p)) == cq_root
    }
    by_topic: Dict[str, List[int]] = {}
    for topic, qid in states:  # sorted
        by_topic.setdefault(topic, []).append(qid)
    for topic, tst in sorted(topic_stats.items()):  # by name, whole topics among the others
        if tst is None:
            continue
        name = topic.encode()
        qids = by_topic.get(topic, [])
        ctime, ino = _stamp(tst, fresh_after) if stat.S_ISDIR(tst.st_mode) else (NOT_VOUCHED, tst.st_ino)
        if topic in odd or topic in unlisted:
            ctime = NOT_VOUCHED
        if topic in whole:
            entry = whole[topic]
            parts.append(QUEUE_SNAPSHOT_TOPIC_ROW.pack(len(name), ctime, ino, len(entry.qids)) + name + entry.span)
            continue
        parts.append(QUEUE_SNAPSHOT_TOPIC_ROW.pack(len(name), ctime, ino, len(qids)) + name)
        for qid in qids:
            key, state = (topic, qid), states[(topic, qid)]
            if cut is not None and state[7] is None:
                sig = state[2:7]
                last = known.get(key)
                if last is not None and last[0] == sig:
                    cut.rows[key] = last
                    parts.append(last[1])
                    continue
                rows = _queue_rows(qid, state, queue_stats[key], fresh_after, table.file_size, log_end)
                if len(rows) > 1:  # vouched (its files' rows follow): its stamps kept for the next cut
                    cut.rows[key] = (sig, b"".join(rows))
                parts += rows
                continue
            parts += _queue_rows(qid, state, queue_stats.get(key), fresh_after, table.file_size, log_end)
    body = b"".join(parts)
    if magic is None:
        magic = QUEUE_SNAPSHOT_MAGIC if cut is None else QUEUE_SNAPSHOT_RUNNING_MAGIC
    return _header(magic, body) + body


def _header(magic: int, body: Any) -> bytes:
    return QUEUE_SNAPSHOT_HEADER.pack(magic, QUEUE_SNAPSHOT_VERSION, zlib.crc32(body), len(body))


_TopicStats = Dict[str, Optional[os.stat_result]]
_QueueStats = Dict[Tuple[str, int], Tuple[os.stat_result, List[os.stat_result]]]


def _stat_queues(
    table: Any, whole: Dict[str, TopicRow], all_states: List[Any], known: Optional[Dict[Any, Any]] = None
) -> Tuple[_TopicStats, _QueueStats, Dict[Tuple[str, int], Any], Set[str]]:
    """(topic -> lstat of its directory (None: not a directory any more), (topic, qid) -> (lstat of its directory,
    lstats of its files) for the queues built since the open, (topic, qid) -> its state, the topics holding a queue
    left out: its directory is there, a file of it was not) for every queue a snapshot
    can hold: those of ``whole`` topics by their topic's stat only, the rest by ``all_states`` (``table.states``
    leaving ``whole`` out). A queue in ``known`` with the same state (a running store's last cut) is not looked at:
    its row is written with the stamps that cut saw."""
    cq_root = table.root
    topic_stats: _TopicStats = {}
    queue_stats: _QueueStats = {}
    states = {}
    unlisted: Set[str] = set()
    for topic in whole:
        try:
            topic_stats[topic] = os.lstat(os.path.join(cq_root, topic))
        except FileNotFoundError:
            continue
    for state in all_states:  # every other queue, built or not
        (topic, qid), qdir, bases, row = state[0], state[1], state[2], state[7]
        try:
            if topic not in topic_stats:
                topic_stats[topic] = None
                topic_stats[topic] = os.lstat(os.path.join(cq_root, topic))
            if row is None and not (known and (topic, qid) in known and known[(topic, qid)][0] == state[2:7]):
                queue_stats[(topic, qid)] = (os.lstat(qdir), [os.lstat(f"{qdir}/{base:020d}") for base in bases])
        except FileNotFoundError:
            # a queue without a directory (never written): the open finds nothing there either; one whose file went
            # while its directory stays (retention, while a running store's cut is written) is not in the topic's
            # list, so the topic's directory is not vouched for: the open lists it
            if os.path.lexists(qdir):
                unlisted.add(topic)
            continue
        states[(topic, qid)] = state
    return topic_stats, queue_stats, states, unlisted


def _queue_rows(qid: int, state: Any, stats: Any, fresh_after: int, file_size: int, log_end: int) -> List[bytes]:
    """The row of one queue and its file rows: a queue kept as its row since the open is written back as it was;
    a built one is vouched for (its stamps) when its directory and files changed before ``fresh_after`` and its
    units end at ``log_end`` at the latest (a running store's cut: units past it may not be flushed)."""
    _, _, bases, max_offset, min_offset, max_phys, hanged, row = state
    if row is not None:
        # its check at its first use compares these stamps (and its units) with its files
        ends = (max_offset, min_offset, max_phys)
        return [QUEUE_SNAPSHOT_QUEUE_ROW.pack(qid, row.dir_ctime, row.dir_ino, *ends, row.n_files), row.file_rows]
    dst, fsts = stats
    dctime, dino = _stamp(dst, fresh_after)
    vouched = (
        dctime != NOT_VOUCHED
        and stat.S_ISDIR(dst.st_mode)
        and bool(fsts)
        and not hanged  # a file whose deletion waits for a reader: the next open must list the directory
        and max_phys <= log_end
        and all(
            stat.S_ISREG(fst.st_mode) and fst.st_ctime_ns < fresh_after and fst.st_size == file_size for fst in fsts
        )
    )
    parts = [
        QUEUE_SNAPSHOT_QUEUE_ROW.pack(
            qid,
            dctime if vouched else NOT_VOUCHED,
            dino,
            max_offset,
            min_offset,
            max_phys,
            len(bases) if vouched else 0,
        )
    ]
    if vouched:
        parts += [QUEUE_SNAPSHOT_FILE_ROW.pack(base, fst.st_ctime_ns, fst.st_ino) for base, fst in zip(bases, fsts)]
    return parts


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, st: struct.Struct) -> Tuple[Any, ...]:
        out: Tuple[Any, ...] = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return out

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _read_regular(path: str) -> bytes:
    """The bytes of a regular file of at most MAX_SNAPSHOT_BYTES; ValueError for anything else (a directory, a
    FIFO, which a plain open would wait on forever, a link, a huge file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_SNAPSHOT_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a snapshot holds")
        chunks: List[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_snapshot(
    root: str, checkpoint_path: str, commitlog_dir: str, cq_file_size: int, log_file_size: int, running: bool = False
) -> Optional[QueueSnapshot]:
    """The store's snapshot when it matches the store (see the module's docstring), else None (logged: the open then
    checks every queue). Never raises for what the file holds; a file that cannot be read is no snapshot.
    ``running``: the running store's cut (queues.running), for an open after a crash."""
    path = snapshot_path(root, running)
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("queue snapshot %s cannot be read (%s): every queue is checked", path, e)
        return None
    try:
        snap = _parse(data, checkpoint_path, commitlog_dir, cq_file_size, log_file_size, running)
    except (ValueError, struct.error, OSError) as e:  # a UnicodeDecodeError is a ValueError
        log.warning("queue snapshot %s not used (%s): every queue is checked", path, e)
        return None
    snap.raw = data
    return snap


def read_handover(root: str, cq_file_size: int, log_file_size: int) -> Optional[QueueSnapshot]:
    """The rows a shared store's first opener handed to its last closer (``config/queues.handover``), unchecked
    against the store (the closer checks each against the control file, the next open every one it writes back);
    None when there are none or they cannot be read (logged: the close then writes no snapshot)."""
    path = handover_path(root)
    try:
        data = _read_regular(path)
        return _parse(data, "", "", cq_file_size, log_file_size, False, QUEUE_SNAPSHOT_HANDOVER_MAGIC)
    except FileNotFoundError:
        log.info("%s: no rows handed over by the first opener; no queue snapshot is written", root)
    except (ValueError, struct.error, OSError) as e:
        log.warning("%s not used (%s); no queue snapshot is written", path, e)
    return None


def _parse(
    data: bytes,
    checkpoint_path: str,
    commitlog_dir: str,
    cq_file_size: int,
    log_file_size: int,
    running: bool,
    handover_magic: Optional[int] = None,
) -> QueueSnapshot:
    """``handover_magic``: a shared store's handover, whose store-wide fields are not checked."""
    magic, version, crc, length = QUEUE_SNAPSHOT_HEADER.unpack_from(data, 0)
    if handover_magic is not None:
        if magic != handover_magic:
            raise ValueError("not a shared store's handed-over rows")
    elif magic != (QUEUE_SNAPSHOT_RUNNING_MAGIC if running else QUEUE_SNAPSHOT_MAGIC):
        raise ValueError("not a running store's queue snapshot" if running else "not a queue snapshot")
    if version != QUEUE_SNAPSHOT_VERSION:
        raise ValueError(f"version {version}, this localmq reads {QUEUE_SNAPSHOT_VERSION}")
    body = data[QUEUE_SNAPSHOT_HEADER.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise ValueError("damaged (length or CRC-32)")
    r = _Reader(body)
    cq_size, log_size, mins_at, log_end, root_ctime, root_ino, n_segments, n_topics = r.take(QUEUE_SNAPSHOT_META)
    if (cq_size, log_size) != (cq_file_size, log_file_size):
        raise ValueError("written with other file sizes")
    cp = r.raw(CHECKPOINT.size)
    segments = [r.take(QUEUE_SNAPSHOT_FILE_ROW) for _ in range(n_segments)]
    if handover_magic is not None:
        return QueueSnapshot(mins_at, log_end, root_ctime, root_ino, parse_topic_rows(body, r.pos, n_topics))
    if not running:
        with open(checkpoint_path, "rb") as f:
            if f.read(CHECKPOINT.size) != cp:
                raise ValueError("the checkpoint changed since (another program ran the store)")
    now = [
        (base, ctime, ino)
        for base, ctime, ino, size in _segment_rows(commitlog_dir)
        if size == log_file_size and base < log_end  # one past the end holds nothing: recovery's walk checks it
    ]
    if running:
        _check_running_segments(segments, now)
    elif now != segments:
        raise ValueError("the commit log's segments changed since")
    # the rows of every queue in one compiled pass (100,000 queues)
    topics = parse_topic_rows(body, r.pos, n_topics)
    return QueueSnapshot(mins_at, log_end, root_ctime, root_ino, topics, running)


def _check_running_segments(recorded: List[Tuple[int, int, int]], now: List[Tuple[int, int, int]]) -> None:
    """A running store's segments before its cut: the recorded ones, less those retention deleted at the start, the
    same files (inode), unchanged (ctime) but the one holding the cut, which was appended to since."""
    if not now or len(now) > len(recorded) or recorded[-1][0] != now[-1][0]:
        raise ValueError("the commit log's segments changed since")
    kept = recorded[len(recorded) - len(now) :]
    for i, ((base, ctime, ino), (nbase, nctime, nino)) in enumerate(zip(kept, now)):
        if base != nbase or ino != nino or (ctime != nctime and i < len(now) - 1):
            raise ValueError(f"commit log segment {base:020d} changed since")


def remove_snapshot(root: str, undo: Any) -> None:
    """Delete the snapshots (a closed and a running store's, a shared store's handover, and temporary ones a failed
    write left) durably,
    before the open writes anything: a failed open gets them back (``undo``: the open's OpenUndo, or None). Never
    raises: what cannot be deleted is logged and left (a snapshot that stays is checked against the store like any
    other); an entry that is not a regular file is not localmq's and is left as it is."""
    path = snapshot_path(root)
    running = snapshot_path(root, True)
    handover = handover_path(root)
    removed = False
    for p in (path, path + ".tmp", running, running + ".tmp", handover, handover + ".tmp"):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning("queue snapshot %s: %s", p, e)
            continue
        if not stat.S_ISREG(st.st_mode):
            log.warning("%s is not a regular file: left as it is, no queue snapshot is written or used", p)
            continue
        try:
            if undo is not None and st.st_size <= MAX_SNAPSHOT_BYTES:
                undo.keep(p)
            os.unlink(p)
            removed = True
        except OSError as e:
            log.warning("queue snapshot %s could not be removed (%s)", p, e)
    if removed:
        try:
            fsync_dir(os.path.dirname(path))
        except OSError as e:
            log.warning("queue snapshot %s: directory sync after its removal failed (%s)", path, e)


def keep_as_first_cut(root: str, snapshot: Optional["QueueSnapshot"], report: Any) -> None:
    """After an open's recovery: the snapshot it took its queues from (``snapshot``, read with its bytes) written as
    the running store's first cut (queues.running), so that a crash before the queue flush's first cut finds one.

    - A clean close's snapshot, with the cut's magic, when recovery (``report``) left the log as the close did (its
      end the snapshot's, nothing cut, no gap, nothing re-dispatched) and the rows vouched for: what it holds is
      what a cut taken now would hold, every queue's ends at the log's end, stamped with its files' state then,
      which any later change moves.
    - A running store's cut read after a crash, as it was, when recovery reached the cut's end without a gap or a
      damaged header and the rows stayed vouched for: the open's re-dispatch and repairs are writes after the cut
      like those of the session that wrote it (a queue they changed has a later ctime, or fails its row's check at
      its first record past the cut), so the next open after a crash reads it as this one did. Without it, a crash
      before this session's first cut (a crash loop) made the next open check every queue.

    Not synced: a power cut that loses it leaves no cut, never a wrong one. A failed open deletes it (its listing
    does not know it). Never raises: a cut that cannot be written is logged."""
    if snapshot is None or not snapshot.raw:
        return
    data, snapshot.raw = snapshot.raw, b""
    r = report
    if not r.cq_vouched or r.gaps or r.damaged_headers:
        return
    if snapshot.running:
        if r.end_offset < snapshot.log_end:
            return
        parts: Tuple[memoryview, ...] = (memoryview(data),)
    else:
        if r.end_offset != snapshot.log_end or r.dropped_at is not None:
            return
        if r.redispatched or r.deleted_segments or r.cq_units_truncated:
            return
        body = memoryview(data)[QUEUE_SNAPSHOT_HEADER.size :]
        parts = (memoryview(_header(QUEUE_SNAPSHOT_RUNNING_MAGIC, body)), body)
    path = snapshot_path(root, True)
    tmp = path + ".tmp"
    what = "crash's running cut" if snapshot.running else "close's snapshot"
    try:
        fd = _open_tmp(tmp)
    except OSError as e:
        log.warning("%s: the %s not kept as the first running cut (%s)", root, what, e)
        return
    try:
        _replace_with(fd, tmp, path, parts, sync=False)
    except OSError as e:
        log.warning("%s: the %s not kept as the first running cut (%s)", root, what, e)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def remove_handover(root: str) -> None:
    """Delete a shared store's handover once its last closer used it (not durably: an open deletes one left)."""
    try:
        os.unlink(handover_path(root))
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("%s could not be removed (%s)", handover_path(root), e)
