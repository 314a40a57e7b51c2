"""New files' names and sizes made durable: directories made and their parents fsynced at once
(``makedirs_durable``) or gathered for the next checkpoint (``DeferredDirSyncs``), and many syncs run on several
threads (``sync_each``)."""

from __future__ import annotations

import os
import threading
from typing import Callable, List, Optional, Set, Tuple, TypeVar

from localmq._native import fsync_dir, mkdirs
from localmq.errors import io_operation, store_io_error

T = TypeVar("T")


# Directories this process created whose entry is not known durable yet (the fsync of their parent failed): the
# next makedirs_durable of them, or of a directory below, fsyncs their parent again instead of seeing them exist.
_unsynced_dirs: Set[str] = set()
_unsynced_lock = threading.Lock()


def _not_made(directory: str) -> List[str]:
    """``directory`` and each of its parents that does not exist yet (deepest first)."""
    out = []
    d = directory
    while not os.path.isdir(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def makedirs_durable(directory: str) -> None:
    """makedirs, then fsync the parent of every directory created so the new entries survive a power loss. A failed
    fsync (StoreIOError) is tried again by the next call for that directory or one below it."""
    directory = os.path.abspath(directory)
    with _unsynced_lock:
        missing = [d for d in _unsynced_dirs if directory == d or directory.startswith(d + os.sep)]
    missing += _not_made(directory)
    if not missing:
        return
    missing = sorted(set(missing), key=len)  # parents first
    with _unsynced_lock:  # before makedirs: one that fails half way has made some of them
        _unsynced_dirs.update(missing)
    with io_operation("mkdir", directory):
        os.makedirs(directory, exist_ok=True)
    for m in missing:
        fsync_dir(os.path.dirname(m))
        with _unsynced_lock:
            _unsynced_dirs.discard(m)


# Syncs of many files at once (a close after writes to thousands of queues) run on this many threads: each fsync
# waits for a journal commit and a cache flush, and concurrent ones share them (ext4 here: 2,000 one-page files
# take 0.44 s one after the other, 0.11 s on 8 threads, 0.07 s on 32).
SYNC_THREADS = 16
# below this many, the calling thread does them alone
SYNC_PARALLEL_MIN = 64


def sync_each(fn: Callable[[T], object], items: List[T]) -> List[Tuple[T, BaseException]]:
    """Call ``fn(item)`` for every item (on up to SYNC_THREADS threads when there are SYNC_PARALLEL_MIN or more),
    every one of them even when some fail; when a thread cannot be started (none left, or a close at interpreter
    shutdown) the calling thread works too. Returns the (item, exception) of each failure, in the order of
    ``items``."""
    failures: List[Tuple[int, T, BaseException]] = []
    if len(items) < SYNC_PARALLEL_MIN:
        for i, item in enumerate(items):
            try:
                fn(item)
            except BaseException as e:  # noqa: BLE001 - returned to the caller, which raises the first
                failures.append((i, item, e))
        return [(item, e) for _, item, e in failures]
    lock = threading.Lock()
    it = iter(enumerate(items))

    def work() -> None:
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            try:
                fn(nxt[1])
            except BaseException as e:  # noqa: BLE001 - returned to the caller, which raises the first
                with lock:
                    failures.append((nxt[0], nxt[1], e))

    threads = [
        threading.Thread(target=work, name="localmq-sync", daemon=True) for _ in range(min(SYNC_THREADS, len(items)))
    ]
    started = []
    for t in threads:
        try:
            t.start()
        except RuntimeError:  # no thread left, or at interpreter shutdown (3.12+): this one does the rest
            break
        started.append(t)
    if len(started) < len(threads):
        work()
    for t in started:
        t.join()
    failures.sort(key=lambda f: f[0])
    return [(item, e) for _, item, e in failures]


class DeferredDirSyncs:
    """The fdatasyncs of new derived files' sizes and the directory fsyncs that make their names durable
    (ConsumeQueue files: recovery rebuilds them from the commit log), gathered and done at once by ``sync`` before
    the checkpoint vouches for what those files hold, instead of three or four syncs on the dispatcher's thread for
    each new queue. Until then a power cut may lose a new queue's file or its size (a file of the wrong size is
    dropped and rebuilt), which is what the checkpoint (not moved yet) tells recovery to rebuild."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: Set[str] = set()
        self._files: Set[str] = set()

    def makedirs(self, directory: str) -> None:
        """makedirs; the parent of every directory it makes is queued, also when it fails half way (some are made
        then), before any file below them is linked."""
        directory = os.path.abspath(directory)
        missing = made = 0
        try:
            missing, made = mkdirs(directory)  # one call without the GIL (each call is a wait behind a busy thread)
        except OSError as e:
            missing, made = getattr(e, "made", (0, 0))
            raise
        finally:
            # the parents of the directories made (the ``made`` highest of the ``missing`` last levels)
            levels = [directory]
            for _ in range(missing):
                levels.append(os.path.dirname(levels[-1]))
            with self._lock:
                self._dirs.update(levels[missing - made + 1 : missing + 1])

    def add(self, directory: str, new_file: Optional[str] = None) -> None:
        """Queue an fsync of ``directory`` (a file was linked into it), and an fdatasync of ``new_file`` (created
        with ``sync_size=False``) to run before it."""
        with self._lock:
            self._dirs.add(os.path.abspath(directory))
            if new_file is not None:
                self._files.add(new_file)

    def sync(self) -> int:
        """fdatasync every queued new file (its size), then fsync every queued directory (one removed since, with the
        files in it, needs none); returns how many directories. On a failure the directories not synced stay queued
        and StoreIOError is raised (a file whose fdatasync failed is not queued again: a retry could succeed
        without its pages; the checkpoint does not move past it, and a wrong size found at open is rebuilt). Many
        files and directories are synced on several threads (``sync_each``); each is tried even when another fails,
        and the first failure is raised."""
        with self._lock:
            files, self._files = sorted(self._files), set()
            dirs, self._dirs = sorted(self._dirs), set()

        not_opened: List[str] = []

        def sync_file(path: str) -> None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return  # deleted since (retention, a failed open's undo): nothing to make durable
            except BaseException:
                not_opened.append(path)  # its pages were not touched: queued again
                raise
            try:
                os.fdatasync(fd)
            except OSError as e:
                raise store_io_error(e, "fdatasync", path) from e
            finally:
                os.close(fd)

        def sync_dir(d: str) -> None:
            try:
                fsync_dir(d)
            except FileNotFoundError:
                pass

        failed = sync_each(sync_file, files)
        if failed:
            # a file whose fdatasync failed is not queued again (a retry could succeed without its pages); one that
            # could not be opened is, and every directory
            self._requeue(not_opened, dirs)
            raise failed[0][1]
        failed = sync_each(sync_dir, dirs)
        if failed:
            with self._lock:
                self._dirs.update(d for d, _ in failed)
            raise failed[0][1]
        return len(dirs)

    def _requeue(self, files: List[str], dirs: List[str]) -> None:
        with self._lock:
            self._files.update(files)
            self._dirs.update(dirs)
