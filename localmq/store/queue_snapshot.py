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

A file changed within the same clock tick as the close's last write of it could keep its ctime on a kernel with
coarse timestamps: what was written in the last ``FRESH_NS`` before the snapshot is not vouched for (on Linux >= 6.13
ext4 and tmpfs ctimes are fine-grained once read, which the close does). The open deletes the snapshot (durably)
before it writes anything, so a crash after it never meets a stale one; a failed open gives it back (OpenUndo).
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from localmq._native import fsync_dir
from localmq.layout import (
    CHECKPOINT,
    CONFIG_DIR,
    QUEUE_SNAPSHOT_FILE,
    QUEUE_SNAPSHOT_FILE_ROW,
    QUEUE_SNAPSHOT_HEADER,
    QUEUE_SNAPSHOT_MAGIC,
    QUEUE_SNAPSHOT_META,
    QUEUE_SNAPSHOT_QUEUE_ROW,
    QUEUE_SNAPSHOT_TOPIC_ROW,
    QUEUE_SNAPSHOT_VERSION,
    SEGMENT_NAME_RE,
)

__all__ = ["QueueEntry", "QueueSnapshot", "TopicEntry", "read_snapshot", "remove_snapshot", "write_snapshot"]

log = logging.getLogger("localmq.store")

FRESH_NS = 50_000_000  # what changed this recently before the snapshot is not vouched for (coarse ctimes)
NOT_VOUCHED = -1  # a ctime field: the entry is listed, not vouched for
SEGMENTS_WALKED = 3  # the normal recovery walks the last three segments: their changes it finds itself


@dataclass
class QueueEntry:
    """One queue's row: its directory and files as the close left them, and its ends."""

    dir_ctime: int
    dir_ino: int
    max_offset: int
    min_offset: int
    max_physic_offset: int
    files: List[Tuple[int, int, int]]  # (base offset, ctime ns, inode)


@dataclass
class TopicEntry:
    dir_ctime: int
    dir_ino: int
    queues: Dict[int, QueueEntry] = field(default_factory=dict)


@dataclass
class QueueSnapshot:
    """A snapshot that matches the store's checkpoint, segments and sizes; rows still to be checked per queue."""

    mins_at: int  # the log's min offset the rows' min offsets are right for (-1: not known)
    log_end: int
    root_ctime: int
    root_ino: int
    topics: Dict[str, TopicEntry]


def snapshot_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, QUEUE_SNAPSHOT_FILE)


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


def write_snapshot(
    root: str,
    table: Any,  # a ConsumeQueueTable (which imports this module)
    commitlog_dir: str,
    checkpoint_path: str,
    log_file_size: int,
    log_end: int,
    mins_at: int,
) -> bool:
    """Write the snapshot of a store closed cleanly: after every file was flushed, before ``abort`` is removed
    (tmp, fsync, rename, directory fsync). Returns False (and writes nothing) when an old segment changed too
    recently to be vouched for. Raises OSError; the caller logs it and closes without a snapshot."""
    with open(checkpoint_path, "rb") as f:
        cp = f.read(CHECKPOINT.size)
    # the segments made ahead, past the end, are deleted by the close after this
    segments = [row for row in _segment_rows(commitlog_dir) if row[0] < log_end]
    cq_root = table.root
    topic_stats: Dict[str, os.stat_result] = {}
    queue_stats: Dict[Tuple[str, int], Tuple[os.stat_result, List[os.stat_result]]] = {}
    for (topic, qid), cq in sorted(table.queues.items()):
        if topic not in topic_stats:
            topic_stats[topic] = os.stat(os.path.join(cq_root, topic))
        files = cq.mapped_file_queue.files
        try:
            queue_stats[(topic, qid)] = (os.stat(cq.mapped_file_queue.directory), [os.stat(mf.path) for mf in files])
        except FileNotFoundError:
            continue  # a queue without a directory (never written): the open finds nothing there either
    root_st = os.stat(cq_root)
    fresh_after = time.time_ns() - FRESH_NS  # after every stat: a change from here on gets a later ctime
    if any(ctime >= fresh_after for _, ctime, _, _ in segments[:-SEGMENTS_WALKED]):
        return False
    parts = [b""]
    root_ctime, root_ino = _stamp(root_st, fresh_after)
    parts.append(
        QUEUE_SNAPSHOT_META.pack(
            table.file_size, log_file_size, mins_at, log_end, root_ctime, root_ino, len(segments), len(topic_stats)
        )
    )
    parts.append(cp)
    for base, ctime, ino, _ in segments:
        parts.append(QUEUE_SNAPSHOT_FILE_ROW.pack(base, ctime, ino))
    by_topic: Dict[str, List[int]] = {}
    for topic, qid in queue_stats:
        by_topic.setdefault(topic, []).append(qid)
    for topic, tst in topic_stats.items():
        name = topic.encode()
        qids = by_topic.get(topic, [])
        ctime, ino = _stamp(tst, fresh_after)
        parts.append(QUEUE_SNAPSHOT_TOPIC_ROW.pack(len(name), ctime, ino, len(qids)) + name)
        for qid in qids:
            cq = table.queues[(topic, qid)]
            dst, fsts = queue_stats[(topic, qid)]
            dctime, dino = _stamp(dst, fresh_after)
            vouched = (
                dctime != NOT_VOUCHED
                and bool(fsts)
                and all(fst.st_ctime_ns < fresh_after and fst.st_size == table.file_size for fst in fsts)
            )
            files = cq.mapped_file_queue.files
            parts.append(
                QUEUE_SNAPSHOT_QUEUE_ROW.pack(
                    qid,
                    dctime if vouched else NOT_VOUCHED,
                    dino,
                    cq.max_offset,
                    cq.min_offset,
                    cq.max_physic_offset,
                    len(files) if vouched else 0,
                )
            )
            if vouched:
                parts += [
                    QUEUE_SNAPSHOT_FILE_ROW.pack(mf.file_from_offset, fst.st_ctime_ns, fst.st_ino)
                    for mf, fst in zip(files, fsts)
                ]
    body = b"".join(parts)
    data = QUEUE_SNAPSHOT_HEADER.pack(QUEUE_SNAPSHOT_MAGIC, QUEUE_SNAPSHOT_VERSION, zlib.crc32(body), len(body)) + body
    path = snapshot_path(root)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    return True


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


def read_snapshot(
    root: str, checkpoint_path: str, commitlog_dir: str, cq_file_size: int, log_file_size: int
) -> Optional[QueueSnapshot]:
    """The store's snapshot when it matches the store (see the module's docstring), else None (logged: the open then
    checks every queue). Never raises for what the file holds; a file that cannot be read is no snapshot."""
    path = snapshot_path(root)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("queue snapshot %s cannot be read (%s): every queue is checked", path, e)
        return None
    try:
        snap = _parse(data, checkpoint_path, commitlog_dir, cq_file_size, log_file_size)
    except (ValueError, struct.error, OSError) as e:  # a UnicodeDecodeError is a ValueError
        log.warning("queue snapshot %s not used (%s): every queue is checked", path, e)
        return None
    return snap


def _parse(
    data: bytes, checkpoint_path: str, commitlog_dir: str, cq_file_size: int, log_file_size: int
) -> QueueSnapshot:
    magic, version, crc, length = QUEUE_SNAPSHOT_HEADER.unpack_from(data, 0)
    if magic != QUEUE_SNAPSHOT_MAGIC:
        raise ValueError("not a queue snapshot")
    if version != QUEUE_SNAPSHOT_VERSION:
        raise ValueError(f"version {version}, this localmq reads {QUEUE_SNAPSHOT_VERSION}")
    body = data[QUEUE_SNAPSHOT_HEADER.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise ValueError("damaged (length or CRC-32)")
    r = _Reader(body)
    cq_size, log_size, mins_at, log_end, root_ctime, root_ino, n_segments, n_topics = r.take(QUEUE_SNAPSHOT_META)
    if (cq_size, log_size) != (cq_file_size, log_file_size):
        raise ValueError("written with other file sizes")
    with open(checkpoint_path, "rb") as f:
        if f.read(CHECKPOINT.size) != r.raw(CHECKPOINT.size):
            raise ValueError("the checkpoint changed since (another program ran the store)")
    segments = [r.take(QUEUE_SNAPSHOT_FILE_ROW) for _ in range(n_segments)]
    now = [
        (base, ctime, ino)
        for base, ctime, ino, size in _segment_rows(commitlog_dir)
        if size == log_file_size and base < log_end  # one past the end holds nothing: recovery's walk checks it
    ]
    if now != segments:
        raise ValueError("the commit log's segments changed since")
    topics: Dict[str, TopicEntry] = {}
    for _ in range(n_topics):
        name_len, tctime, tino, n_queues = r.take(QUEUE_SNAPSHOT_TOPIC_ROW)
        topic = r.raw(name_len).decode()
        entry = topics[topic] = TopicEntry(tctime, tino)
        for _ in range(n_queues):
            qid, dctime, dino, max_offset, min_offset, max_phys, n_files = r.take(QUEUE_SNAPSHOT_QUEUE_ROW)
            files = [r.take(QUEUE_SNAPSHOT_FILE_ROW) for _ in range(n_files)]
            entry.queues[qid] = QueueEntry(dctime, dino, max_offset, min_offset, max_phys, files)
    if r.pos != len(body):
        raise ValueError("trailing bytes")
    return QueueSnapshot(mins_at, log_end, root_ctime, root_ino, topics)


def remove_snapshot(root: str, undo: Any) -> None:
    """Delete the snapshot (and a temporary one a failed close left) durably, before the open writes anything: a
    failed open gets it back (``undo``: the open's OpenUndo, or None)."""
    path = snapshot_path(root)
    removed = False
    for p in (path, path + ".tmp"):
        if os.path.lexists(p):
            if undo is not None:
                undo.keep(p)
            os.unlink(p)
            removed = True
    if removed:
        fsync_dir(os.path.dirname(path))
