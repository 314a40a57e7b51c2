"""OpenUndo: what an open created or grew in a store directory, so that an open that fails can leave it as it was."""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from localmq._native import fsync_dir
from localmq.errors import ReadOnlyFilesystemError
from localmq.layout import (
    ABORT_FILE,
    CHECKPOINT_FILE,
    CHECKPOINT_FILE_SIZE,
    COMMITLOG_DIR,
    CONFIG_DIR,
    CONSUMEQUEUE_DIR,
    CONSUMEQUEUE_EXT_DIR,
    CTL_FILE,
    INDEX_DIR,
    LOCK_FILE,
    MAX_QUEUE_ID,
    RECOVERY_DIR,
    TOPIC_RE,
    is_decimal,
)

__all__ = ["OpenUndo", "missing_ancestor", "read_quarantine", "STORE_ENTRIES"]

log = logging.getLogger("localmq.store")

# the names of derived files an open set aside in recovery/ (OpenUndo.set_aside) start with it
UNDO_PREFIX = "undo-"

# Everything an open may create or change under a store's root; nothing else there is touched.
STORE_ENTRIES = (
    COMMITLOG_DIR,
    CONSUMEQUEUE_DIR,
    CONSUMEQUEUE_EXT_DIR,
    INDEX_DIR,
    CONFIG_DIR,
    RECOVERY_DIR,
    CHECKPOINT_FILE,
    ABORT_FILE,
    LOCK_FILE,
    CTL_FILE,
)


def check_writable_filesystem(root: str, created_root: Optional[str]) -> None:
    """Raise ReadOnlyFilesystemError when ``root`` (or, when it does not exist, the directory it would be made in)
    lies on a file system mounted read-only: a clear error before any write fails with a bare EROFS."""
    probe = root if created_root is None else os.path.dirname(created_root)
    try:
        readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        return  # the open itself reports what is wrong with the path
    if readonly:
        raise ReadOnlyFilesystemError(
            errno.EROFS,
            f"the store {root} is on a read-only file system: open it with "
            f"localmq.open(path, read_only=True) to read it",
            root,
        )


def read_quarantine(path: str) -> Iterator[Tuple[int, bytes]]:
    """The chunks of a quarantine copy in ``recovery/`` (commitlog-tail-*.bin, commitlog-gap-*.bin): (absolute
    commit log offset, bytes). Raises ValueError on a truncated file."""
    with open(path, "rb") as f:
        data = f.read()
    p = 0
    while p < len(data):
        if p + 16 > len(data):
            raise ValueError(f"{path}: truncated chunk header at {p}")
        off, n = int.from_bytes(data[p : p + 8], "big"), int.from_bytes(data[p + 8 : p + 16], "big")
        if p + 16 + n > len(data):
            raise ValueError(f"{path}: truncated chunk at {p}")
        yield off, data[p + 16 : p + 16 + n]
        p += 16 + n


def missing_ancestor(path: str) -> Optional[str]:
    """The topmost directory of ``path`` (itself included) that does not exist yet, or None when it exists."""
    top = None
    while not os.path.lexists(path):
        top = path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return top


class OpenUndo:
    """A listing of a store's own entries (STORE_ENTRIES, walked without following links: path -> size of each
    file, and the directories) taken when the opener holds the store alone, before it writes.

    ``restore()`` undoes what an open did up to its failure: the commit log's bytes that recovery rewrote (a gap
    record over damage, a torn tail zeroed, segments past the end deleted; ``repaired_log``) get their bytes back
    from the quarantine copies recovery made first, entries that were not listed are removed (files, then their
    directories, deepest first; the quarantine copies too), files that grew are cut back to their listed size
    (growing only appends zeros: a segment sized at load, a checkpoint extended to 4 KiB), files saved with
    ``keep()`` get their bytes back, and the root and the parents the open created are removed. Derived files
    (ConsumeQueues, index files) that the open rewrote in place or deleted get their bytes back too: each change
    is announced first (``save_derived`` saves the bytes it replaces, ``mark_derived_end`` where re-dispatch starts
    appending, ``set_aside`` moves a file away instead of deleting it), and they are undone newest first.

    Only the process that holds the store alone may restore: another writer's files would look new.

    ``defer_queues``: the topic directories (``consumequeue/<topic>`` with a valid name) and the files of each queue
    directory in them are not listed now (at 100,000 queues the walk of every queue directory was a second of the
    open) but when the open's ConsumeQueueTable loads a queue there unvouched or creates one, before anything writes
    there (``take_queue_dir``), or, for a queue a snapshot vouched for (which the open does not write), when a write
    into it is first announced (``save_derived``, ``mark_derived_end``). A deferred directory nobody took was never
    written, and ``restore`` leaves it as it is.
    """

    def __init__(
        self,
        root: str,
        created_root: Optional[str] = None,
        created: tuple[str, ...] = (),
        listing: bool = True,
        defer_queues: bool = False,
    ) -> None:
        self.root = root
        self.created_root = created_root
        self.created = tuple(created)
        self.listing = listing  # False: undo only ``created`` (the store may have other writers right now)
        self.defer_queues = defer_queues
        self.deferred: Set[str] = set()  # queue directories whose files are not listed yet (take_queue_dir)
        # topic directories (in ``deferred`` too) whose entries are not listed yet: listed when a queue directory in
        # one is taken unvouched, or a write there is announced (a vouched queue's directory needs no listing)
        self.deferred_topics: Set[str] = set()
        # topic directory -> ids of its queues a queue snapshot vouched for (their directories are listed on a first
        # announced write): one entry a topic, not one a queue (100,000 queues)
        self.vouched_topics: Dict[str, Sequence[int]] = {}
        self.files: Dict[str, int] = {}
        self.dirs: Set[str] = set()
        self.kept: Dict[str, bytes] = {}
        # commit log regions recovery rewrote: (segment directory, segment size, start, end, quarantine copy)
        self.log_repairs: List[Tuple[str, int, int, int, Optional[str]]] = []
        # derived files' regions the open rewrote, oldest first: (path, start, end or -1 for the file's end, the
        # non-zero chunks they held as (offset, bytes))
        self.derived: List[Tuple[str, int, int, List[Tuple[int, bytes]]]] = []
        self.set_aside_files: List[Tuple[str, str]] = []  # (path, where it was moved), oldest first
        if listing:
            self._take(self.created)

    def _take(self, created: tuple[str, ...]) -> None:
        for name in STORE_ENTRIES:
            top = os.path.join(self.root, name)
            if not os.path.lexists(top) or top in created:
                continue
            if os.path.isdir(top) and not os.path.islink(top):
                self.dirs.add(top)
                queues_of = os.path.join(top, "") if self.defer_queues and name == CONSUMEQUEUE_DIR else None
                self._walk(top, queues_of)
            else:
                self.files[top] = os.lstat(top).st_size
                if name == CHECKPOINT_FILE and self.files[top] <= CHECKPOINT_FILE_SIZE:
                    # the flush service writes the checkpoint while an open that fails later is being undone.
                    # Never the lock file: closing any descriptor of it drops this process's POSIX byte lock (the
                    # one RocketMQ and other processes test), and a failed open writes no byte there anyway.
                    self.keep(top)

    def _walk(self, top: str, queues_of: Optional[str] = None, strict: bool = False) -> None:
        """List the directories and files below ``top``; queue directories are deferred when ``queues_of`` is the
        consumequeue directory (with its separator). ``strict``: a directory that cannot be read raises (os.walk
        skips it otherwise, and it would count as empty)."""
        for dirpath, dirnames, filenames in os.walk(top, onerror=_raise if strict else None):
            prefix = dirpath + os.sep  # (not os.path.join: 100,000 topic directories)
            self.dirs.update([prefix + d for d in dirnames])
            for n in filenames:
                p = prefix + n
                self.files[p] = os.lstat(p).st_size
            if queues_of is not None and prefix == queues_of:
                topics = [prefix + d for d in dirnames if TOPIC_RE.match(d) is not None]
                self.deferred.update(topics)
                self.deferred_topics.update(topics)
                dirnames[:] = [] if len(topics) == len(dirnames) else [d for d in dirnames if TOPIC_RE.match(d) is None]

    def _take_topic(self, tdir: str) -> None:
        """List a deferred topic directory: its queue directories are deferred in turn, anything else walked. When a
        read fails the directory stays deferred (``restore`` leaves it alone: nothing was written there yet) and the
        error is raised."""
        with os.scandir(tdir) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        files = {}
        for name, is_dir in entries:
            if not is_dir:
                p = os.path.join(tdir, name)
                files[p] = os.lstat(p).st_size
        self.deferred.discard(tdir)
        self.deferred_topics.discard(tdir)
        self.files.update(files)
        try:
            for name, is_dir in entries:
                p = os.path.join(tdir, name)
                if not is_dir:
                    continue
                self.dirs.add(p)
                if is_decimal(name) and int(name) <= MAX_QUEUE_ID:
                    self.deferred.add(p)
                else:
                    self._walk(p, strict=True)
        except BaseException:
            self.deferred.add(tdir)
            self.deferred_topics.add(tdir)
            raise

    def take_queue_dir(self, qdir: str) -> None:
        """The open is about to load the queue of a deferred directory, or create one: list it now (a walk). A
        directory that is not deferred needs nothing."""
        tdir = qdir.rpartition(os.sep)[0]  # (not os.path.dirname: this runs for every queue loaded)
        if tdir in self.deferred_topics:
            self._take_topic(tdir)
        if qdir not in self.deferred:
            return
        self._walk(qdir, strict=True)  # a read that fails raises, and the directory stays deferred (left alone)
        self.deferred.discard(qdir)

    def vouch_queue_dirs(self, tdir: str, qids: Sequence[int]) -> None:
        """The open keeps the queues ``qids`` of topic directory ``tdir`` as a queue snapshot's rows: it writes
        nothing there unless it announces it first, so their directories are listed then (``_announced``), not now.
        ``qids`` is kept, not copied."""
        self.vouched_topics[tdir] = qids

    def take_deferred(self) -> None:
        """List every deferred queue directory but the vouched ones (those the ConsumeQueueTable did not load), and
        every deferred topic directory that holds none of those."""
        for tdir in sorted(self.deferred_topics - self.vouched_topics.keys()):
            self._take_topic(tdir)
        # the vouched queue directories of topics listed meanwhile (a topic of vouched and unvouched queues)
        vouched = {
            f"{tdir}{os.sep}{q}"
            for tdir, qids in self.vouched_topics.items()
            if tdir not in self.deferred_topics
            for q in qids
        }
        for qdir in sorted(self.deferred - vouched - self.deferred_topics):
            self.take_queue_dir(qdir)

    def _announced(self, path: str) -> None:
        # a write into a queue directory still deferred: its files are listed before it
        qdir = os.path.dirname(path)
        if os.path.dirname(qdir) in self.deferred_topics:
            self._take_topic(os.path.dirname(qdir))
        if qdir in self.deferred:
            self.take_queue_dir(qdir)

    def retake(self, created: tuple[str, ...] = ()) -> None:
        """List the entries now (the opener holds the store alone from here on); ``created`` are more paths this
        open made."""
        self.created += tuple(created)
        self.listing = True
        self.files.clear()
        self.dirs.clear()
        self.deferred.clear()
        self.deferred_topics.clear()
        self.vouched_topics.clear()
        self._take(self.created)

    def keep(self, path: str) -> None:
        """Save the bytes of a small file the open is about to replace (a checkpoint shorter than 40 bytes)."""
        with open(path, "rb") as f:
            self.kept[path] = f.read()

    def repaired_log(self, directory: str, file_size: int, start: int, end: int, copy: Optional[str]) -> None:
        """Recovery is about to rewrite the commit log's bytes [start, end) (zeros, a gap or blank record, segments
        deleted); ``copy`` holds their non-zero bytes (recovery's quarantine format: chunks of offset, length,
        bytes), or None when they are all zeros. Call it once the copy is durable, before the first write."""
        if self.listing:
            self.log_repairs.append((directory, file_size, start, end, copy))

    def save_derived(self, path: str, start: int, length: int = -1) -> None:
        """The open is about to rewrite the derived file ``path`` (a ConsumeQueue file) from ``start`` on: ``length``
        bytes, or to its end (zeroed or deleted) when -1. Its non-zero bytes there are kept (in memory: a queue's
        cut tail, a unit) for ``restore``. A file the listing does not know (made by this open) needs nothing."""
        self._announced(path)
        if not self.listing or path not in self.files:
            return
        end = -1 if length < 0 else start + length
        self.derived.append((path, start, end, list(_data_chunks(path, start, end))))

    def mark_derived_end(self, path: str, pos: int) -> None:
        """Re-dispatch is about to append units to ``path`` from ``pos`` on, where it holds only zeros (recovery
        found or made it so): ``restore`` zeroes the file from there again."""
        self._announced(path)
        if self.listing and path in self.files:
            self.derived.append((path, pos, -1, []))

    def set_aside(self, path: str) -> None:
        """Move the derived file ``path`` (an index file recovery drops) into ``recovery/`` instead of deleting
        it: ``restore`` moves it back, ``done`` deletes it. Without a listing (another writer may be at work) it is
        deleted at once."""
        if not self.listing or path not in self.files:
            os.unlink(path)
            return
        aside = os.path.join(self.root, RECOVERY_DIR)
        os.makedirs(aside, exist_ok=True)
        dest = os.path.join(aside, f"{UNDO_PREFIX}{len(self.set_aside_files)}-{os.path.basename(path)}")
        os.rename(path, dest)
        self.set_aside_files.append((path, dest))

    def done(self) -> None:
        """The open succeeded: delete what ``set_aside`` kept (and what an open that died left there)."""
        self.derived.clear()
        if not self.listing:
            return
        aside = os.path.join(self.root, RECOVERY_DIR)
        try:
            names = [n for n in os.listdir(aside) if n.startswith(UNDO_PREFIX)]
        except FileNotFoundError:
            return
        for n in names:
            try:
                os.unlink(os.path.join(aside, n))
            except OSError:
                log.warning(
                    "cannot delete %s (a derived file a failed open kept)", os.path.join(aside, n), exc_info=True
                )
        if names:
            try:
                fsync_dir(aside)
            except OSError:
                log.warning("cannot fsync %s after deleting the files a failed open kept", aside, exc_info=True)
        self.set_aside_files.clear()

    def _restore_derived(self, undone: List[str], touched: Set[str]) -> None:
        """Undo the derived files' changes, the newest first: files set aside move back, rewritten regions get
        their bytes back (zeros, then the saved chunks), each file at its listed size."""
        for path, dest in reversed(self.set_aside_files):
            os.replace(dest, path)
            undone.append(path)
            touched.update((os.path.dirname(path), os.path.dirname(dest)))
        self.set_aside_files.clear()
        synced: Set[str] = set()
        for path, start, end, chunks in reversed(self.derived):
            size = self.files[path]
            created = not os.path.lexists(path)
            _write_back(path, size, start, size if end < 0 else min(end, size), chunks, sync=path not in synced)
            synced.add(path)
            undone.append(path)
            if created:
                touched.add(os.path.dirname(path))
        self.derived.clear()

    def _restore_log(self, undone: List[str], touched: Set[str]) -> None:
        """Write back the commit log bytes recovery rewrote, the last repair first: every listed segment in the
        region exists again with its listed size, the region is zeroed, then the copy's chunks are written."""
        for directory, file_size, start, end, copy in reversed(self.log_repairs):
            chunks = list(read_quarantine(copy)) if copy is not None else []
            base = start - start % file_size
            while base < end:
                path = os.path.join(directory, f"{base:020d}")
                size = self.files.get(path)
                if size is not None:
                    if _write_back(path, size, max(start, base), min(end, base + file_size), chunks, base=base):
                        touched.add(directory)
                    undone.append(path)
                base += file_size
        self.log_repairs.clear()

    def restore(self) -> List[str]:
        """Put the store's entries back as listed; returns what was changed back. Errors are logged (the error
        that made the open fail is the one that matters)."""
        undone: List[str] = []
        if self.created_root is not None:
            try:
                _remove_tree(self.created_root)
                undone.append(self.created_root)
                fsync_dir(os.path.dirname(self.created_root))
            except OSError:
                log.exception("removing %s after a failed open", self.created_root)
            return undone
        touched: Set[str] = set()
        try:
            self._restore_log(undone, touched)
        except (OSError, ValueError):
            log.exception("writing back the commit log bytes recovery had rewritten in %s", self.root)
        try:
            self._restore_derived(undone, touched)
        except OSError:
            log.exception("writing back the derived files (ConsumeQueues, index) the open had changed in %s", self.root)
        if not self.listing:
            for path in self.created:
                try:
                    if os.path.lexists(path):
                        _remove_tree(path)
                        undone.append(path)
                        touched.add(os.path.dirname(path))
                except OSError:
                    log.exception("removing %s after a failed open", path)
            names: tuple[str, ...] = ()
        else:
            names = STORE_ENTRIES
        for name in names:
            top = os.path.join(self.root, name)
            if not os.path.lexists(top):
                continue
            try:
                if top not in self.dirs and top not in self.files:
                    _remove_tree(top)
                    undone.append(top)
                    touched.add(self.root)
                    continue
                if top in self.files:
                    self._restore_file(top, undone, touched)
                    continue
                for dirpath, dirnames, filenames in os.walk(top):
                    for n in filenames:
                        self._restore_file(os.path.join(dirpath, n), undone, touched)
                    kept = []
                    for d in dirnames:
                        p = os.path.join(dirpath, d)
                        if p not in self.dirs:
                            _remove_tree(p)
                            undone.append(p)
                            touched.add(dirpath)
                        elif p not in self.deferred:  # a deferred directory nobody took was never written
                            kept.append(d)
                    dirnames[:] = kept
            except OSError:
                log.exception("undoing the changes of a failed open in %s", top)
        for path, data in self.kept.items():
            try:
                with open(path, "wb") as f:
                    f.write(data)
                undone.append(path)
                touched.add(os.path.dirname(path))
            except OSError:
                log.exception("restoring %s after a failed open", path)
        for d in touched:
            try:
                fsync_dir(d)
            except OSError:
                pass
        return undone

    def _restore_file(self, path: str, undone: List[str], touched: Set[str]) -> None:
        size = self.files.get(path)
        if size is None:
            if path not in self.kept:
                os.unlink(path)
                undone.append(path)
                touched.add(os.path.dirname(path))
            return
        st = os.lstat(path)
        if st.st_size > size and not os.path.islink(path):
            os.truncate(path, size)
            undone.append(path)
        elif st.st_size < size:
            log.error("%s shrank from %d to %d bytes during a failed open", path, size, st.st_size)


def _data_chunks(path: str, start: int, end: int) -> Iterator[Tuple[int, bytes]]:
    """The non-zero data of ``path`` in [start, end) (end -1: the file's end) as (offset, bytes) chunks of at most
    1 MiB; holes are skipped without reading them."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        end = size if end < 0 else min(end, size)
        pos = start
        while pos < end:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
                stop = min(end, os.lseek(fd, pos, os.SEEK_HOLE))
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after pos
                    return
                if e.errno != errno.EINVAL:
                    raise
                stop = end  # a file system without SEEK_DATA: read it all
            while pos < min(stop, end):
                data = os.pread(fd, min(1 << 20, min(stop, end) - pos), pos)
                if not data:
                    return
                if data.strip(b"\0"):
                    yield pos, data
                pos += len(data)
    finally:
        os.close(fd)


def _write_back(
    path: str, size: int, lo: int, hi: int, chunks: List[Tuple[int, bytes]], base: int = 0, sync: bool = True
) -> bool:
    """Give ``path`` (created if missing, grown to ``size`` if shorter) back the bytes of [lo, hi): zeros where it
    holds data there, then the parts of ``chunks`` ((offset, bytes), saved before the open changed them) inside the
    range; offsets are the file's plus ``base`` (a commit log segment's base offset). fsync it when ``sync``.
    Returns True when the file was created or grown (its directory needs a sync)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        grown = os.fstat(fd).st_size < size
        if grown:
            os.ftruncate(fd, size)
        _zero_data(fd, lo - base, hi - base)
        for off, data in chunks:
            a, b = max(off, lo), min(off + len(data), hi)
            if a < b:
                os.pwrite(fd, data[a - off : b - off], a - base)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return grown


def _zero_data(fd: int, start: int, end: int) -> None:
    """Zero [start, end) of the open file ``fd`` where it holds data (a hole reads as zeros already)."""
    pos = start
    while pos < end:
        n = min(1 << 20, end - pos)
        data = os.pread(fd, n, pos)
        if not data:
            return
        if data.strip(b"\0"):
            os.pwrite(fd, bytes(len(data)), pos)
        pos += len(data)


# How long _rmdir waits for a directory that lists empty but cannot be removed yet (ENOTEMPTY) to become removable.
RMDIR_SETTLE_S = 5.0


def _rmdir(path: str) -> None:
    """rmdir, waiting up to RMDIR_SETTLE_S while the directory lists empty and still is not empty. On a FUSE file
    system served by libfuse's high-level API (sshfs, tests/powerfs) a file unlinked while open is kept under a
    hidden name until its last close reaches the file system, and the kernel sends that close (RELEASE)
    asynchronously after close(2): a quarantine copy the open has just written and closed can hold its directory
    for a moment. A directory that lists an entry raises at once."""
    deadline = None
    delay = 0.005
    while True:
        try:
            os.rmdir(path)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or os.listdir(path):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + RMDIR_SETTLE_S
            elif now >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for n in filenames:
                os.unlink(os.path.join(dirpath, n))
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if os.path.islink(p):
                    os.unlink(p)
                else:
                    _rmdir(p)
        _rmdir(path)
    else:
        os.unlink(path)


def _raise(error: OSError) -> None:
    raise error
