"""MappedFileQueue: the segment files of one directory seen as one logical file."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple

from localmq._mapped_file import MappedFile, offset_to_file_name
from localmq._mapping import MappingBudget
from localmq._native import fsync_dir
from localmq.errors import CorruptStoreError, StoreIOError
from localmq.layout import interrupted_creation, is_decimal
from localmq.store.durable_names import DeferredDirSyncs, makedirs_durable

log = logging.getLogger("localmq.mapped_file_queue")

# RocketMQ's DELETE_FILES_BATCH_MAX: files deleted by one retention pass at most.
DELETE_FILES_BATCH_MAX = 10
# "never force": the interval given to destroy() when a retry may only collect a file its readers released.
_NEVER_MS = 1 << 62


@dataclasses.dataclass
class DeleteResult:
    """What one ``delete_expired_files`` call did.

    ``deleted``: paths removed. ``held_back``: files that qualified (old enough, or cleaning at once) but end
    past ``max_end_offset``, oldest first (the caller reports why). ``hanged``: a deletion was deferred because
    a reader still holds the file (see ``hanged``); ``stopped``: ``between`` asked to stop.
    """

    deleted: List[str] = dataclasses.field(default_factory=list)
    held_back: List[MappedFile] = dataclasses.field(default_factory=list)
    hanged: bool = False
    stopped: bool = False


def earlier_sync_failure(error: BaseException) -> BaseException:
    """What a flush (or close()) raises after the log's flush failed with ``error`` earlier: a new StoreIOError with
    its errno and file, saying so."""
    if not isinstance(error, OSError) or error.errno is None:
        return error
    return StoreIOError(
        error.errno,
        error.strerror,
        error.filename,
        operation=f"an earlier {getattr(error, 'operation', None) or 'flush'} failed and is never "
        f"retried; the store takes no puts until it is closed and opened again:",
    )


def _collect(made: Iterator[MappedFile]) -> List[MappedFile]:
    """The files ``made`` yields; when making one fails, every one made before is closed again."""
    files: List[MappedFile] = []
    try:
        for mf in made:
            files.append(mf)
    except BaseException:
        for mf in files:
            mf.close()
        raise
    return files


class MappedFileQueue:
    """Fixed-size segments named by their 20-digit base offset, in one directory.

    ``files`` is the ordered list of MappedFile (readers index it by offset under the GIL). Creating,
    truncating and deleting files happen under ``lock``; the put path takes the owner's put lock first
    (ARCHITECTURE.md, Locks). Retention removes files from the head by assigning a new list
    (never by mutating the one a reader may be iterating); a file whose destroy a reader defers leaves
    ``files`` at once and waits in ``hanged`` (see ``retry_delete_hanged``).
    """

    def __init__(
        self,
        directory: str,
        file_size: int,
        *,
        reserve: bool = True,
        reserve_step: int = 0,
        allocator: Optional[Callable[[str, int, int], MappedFile]] = None,
        writable: bool = True,
        keep_fd: bool = True,
        dir_syncs: Optional[DeferredDirSyncs] = None,
        budget: Optional[MappingBudget] = None,
        reserve_first: int = 0,
    ):
        self.directory = os.fspath(directory)
        # > 0: a new file reserves this much first, then steps that double up to reserve_step (ConsumeQueue files:
        # a page, so that a queue with one message costs one block)
        self.reserve_first = reserve_first
        # set (ConsumeQueue files, keep_fd=False): the files are mapped within the store's budget of mappings and may
        # be unmapped while idle (MappedFile.evict), mapped again on use
        self.budget = budget
        # set: the directory fsyncs that make a new file's name durable are put off to dir_syncs.sync() (derived
        # files only: ConsumeQueues)
        self.dir_syncs = dir_syncs
        # False: each file's descriptor is closed once it is mapped (MappedFile keep_fd), so that a store with many
        # queues does not hold a descriptor per ConsumeQueue file
        self.keep_fd = keep_fd
        # False: a read-only view (files opened O_RDONLY and mapped PROT_READ; nothing is created or resized)
        self.writable = writable
        self.file_size = int(file_size)
        self.reserve = reserve
        self.reserve_step = reserve_step  # > 0: new files are sparse, reserved ahead of the writer step by step
        self.files: List[MappedFile] = []
        # files removed from ``files`` whose destroy was deferred by a reader; only retention touches it
        self.hanged: List[MappedFile] = []
        self.lock = threading.RLock()
        # Serialises flush() callers (the flush service, SYNC_FLUSH group commit, store.flush(), close());
        # taken alone, never while holding `lock` or a put lock (ARCHITECTURE.md, Locks).
        self.flush_lock = threading.Lock()
        # Serialises commit() callers (transient store pool); same rule.
        self.commit_lock = threading.Lock()
        # Called with each WriteBuffer that commit() finished with (the pool takes it back).
        self.on_buffer_released: Optional[Callable[[object], None]] = None
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0
        # Issue 3's AllocateMappedFileService plugs in here; by default files are created synchronously.
        self.allocator = allocator
        # The StoreIOError of the first failed flush of a segment (report_sync_failure), or None; a failed flush is
        # never retried (MappedFile.sync_error). ``on_sync_failure(error)`` is told once: the CommitLog refuses puts.
        self.sync_failure: Optional[BaseException] = None
        self.on_sync_failure: Optional[Callable[[BaseException], None]] = None
        # Called with the offset the files will start at, durably, before ``delete_files`` deletes any (the commit
        # log records it: a later open tells segments retention deleted from segments lost or deleted by hand).
        self.before_head_delete: Optional[Callable[[int], None]] = None
        # A store shared between processes: the committed end (the control file's; CommitLog.attach_control sets
        # it). This process's view may hold its own put past it until the put commits, and a writer that dies before
        # the commit has those bytes zeroed and written over by the next writer: a reader that follows the log (the
        # index service) stops there.
        self.committed_end: Optional[Callable[[], int]] = None
        # Called with (path, start, -1) before ``truncate_dirty_files``, ``delete_last`` or ``destroy`` zero a
        # file's bytes from ``start`` on or delete it: an open that may fail saves them (OpenUndo.save_derived).
        self.before_rewrite: Optional[Callable[[str, int, int], None]] = None

    # -- load ---------------------------------------------------------------------------------------------

    def load(self, *, fix_empty_tail: bool = True) -> int:
        """Map every segment in the directory, sorted by name; returns how many.

        Raises CorruptStoreError when a file has another size than ``file_size`` (except a trailing 0-byte
        file, an interrupted creation, which is sized again and reported, or left out with ``fix_empty_tail``
        False) or when names leave a gap.
        """
        if not os.path.isdir(self.directory):
            return 0
        names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and is_decimal(n))
        files: List[MappedFile] = []
        try:
            for i, name in enumerate(names):
                path = os.path.join(self.directory, name)
                size = os.path.getsize(path)
                if interrupted_creation(i, len(names), size):
                    if not fix_empty_tail:
                        continue  # a view leaves it as it is
                    log.warning(
                        "segment %s is empty (interrupted creation); sizing it to %d bytes", path, self.file_size
                    )
                    # (sized here: a file mapped later, as a ConsumeQueue's under a budget, is only checked then)
                    os.truncate(path, self.file_size)
                elif 0 < size < self.file_size and i == len(names) - 1 and i > 0 and fix_empty_tail:
                    # The last segment was cut short (a truncated copy, a file system that lost its tail) while
                    # every earlier one has the configured size, so the size setting is right: give it back its
                    # size (zeros) and let recovery cut the torn record and report it. A lone short file is
                    # refused below: it more likely means the wrong segment size was configured.
                    log.error(
                        "segment %s is %d bytes, shorter than %d: its tail is lost; extending it with "
                        "zeros so that recovery keeps every whole record before the cut",
                        path,
                        size,
                        self.file_size,
                    )
                    os.truncate(path, self.file_size)
                elif size != self.file_size:
                    raise CorruptStoreError(
                        f"segment {path} is {size} bytes but the configured size is {self.file_size}; "
                        f"open the store with the size it was written with"
                    )
                mf = self._existing(path)
                if files and mf.file_from_offset != files[-1].file_from_offset + self.file_size:
                    mf.close()
                    raise CorruptStoreError(
                        f"segment {path} does not follow {files[-1].path}: expected base "
                        f"{files[-1].file_from_offset + self.file_size}"
                    )
                # until recovery says otherwise, a loaded file counts as fully written (RocketMQ does the same)
                mf.set_positions(self.file_size)
                files.append(mf)
        except BaseException:
            for mf in files:
                mf.close()
            raise
        self.files = files
        return len(files)

    def _file(self, path: str, **kw: Any) -> MappedFile:
        """A MappedFile of this queue's settings (``kw``: what differs for this one)."""
        return MappedFile(
            path,
            self.file_size,
            reserve=self.reserve,
            reserve_step=self.reserve_step,
            writable=self.writable,
            keep_fd=self.keep_fd,
            budget=self.budget,
            reserve_first=self.reserve_first,
            **kw,
        )

    def _existing(
        self, path: str, map_now: Optional[bool] = None, file_id: Optional[Tuple[int, int]] = None, base: int = -1
    ) -> MappedFile:
        """An existing file of this queue; a budget's files are mapped on first use unless ``map_now``
        (``file_id``: its (st_dev, st_ino) from a stat the caller made, its size checked there; ``base``: its base
        offset when the caller knows it, else read from its name)."""
        if map_now is None:
            map_now = self.budget is None
        return self._file(
            path, file_from_offset=base, create=False, map_now=map_now, file_id=None if map_now else file_id
        )

    def load_known(self, bases: List[int], ids: Optional[List[Tuple[int, int]]] = None) -> None:
        """Take the files of these consecutive base offsets (checked by the caller: a queue snapshot vouches for
        their size and names; store/queue_snapshot.py) without listing the directory; each counts as fully
        written until the caller sets the last one's positions (``ConsumeQueue.restore``). ``ids``: each file's
        (st_dev, st_ino) from the caller's stat, which spares a budget's files another one."""

        def made() -> Iterator[MappedFile]:
            for i, base in enumerate(bases):
                mf = self._existing(
                    f"{self.directory}/{base:020d}", file_id=ids[i] if ids is not None else None, base=base
                )
                mf.set_positions(self.file_size)
                yield mf

        self.files = _collect(made())

    # -- lookup -------------------------------------------------------------------------------------------

    def first(self) -> Optional[MappedFile]:
        files = self.files
        return files[0] if files else None

    def last(self) -> Optional[MappedFile]:
        files = self.files
        return files[-1] if files else None

    def find(self, offset: int, return_first_on_not_found: bool = False) -> Optional[MappedFile]:
        """The segment holding absolute ``offset``, or None."""
        files = self.files
        if not files:
            return None
        first = files[0]
        idx = offset // self.file_size - first.file_from_offset // self.file_size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        for mf in files:  # fallback after deletions shifted the list
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        return first if return_first_on_not_found else None

    def min_offset(self) -> int:
        first = self.first()
        return first.file_from_offset if first is not None else 0

    def max_offset(self) -> int:
        last = self.last()
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def create_file(self, start_offset: int, populate_first: bool = False) -> MappedFile:
        """Create (or, with an allocator, obtain) the segment starting at ``start_offset`` and append it
        (``populate_first``: its first reserved page faulted in writable, see ``MappedFile``).

        Raises OSError (ENOSPC, EFBIG, ...) when the file cannot be created and reserved.
        """
        with self.lock:
            last = self.last()
            if last is not None and start_offset != last.file_from_offset + self.file_size:
                raise CorruptStoreError(f"new segment at {start_offset} does not follow {last.path}")
            path = os.path.join(self.directory, offset_to_file_name(start_offset))
            if self.dir_syncs is not None:
                self.dir_syncs.makedirs(self.directory)
            else:
                makedirs_durable(self.directory)  # also when an earlier call made it but could not sync its name
            if self.allocator is not None:
                mf = self.allocator(path, self.file_size, start_offset)
            else:
                mf = self._file(
                    path,
                    file_from_offset=start_offset,
                    create=True,
                    sync_size=self.dir_syncs is None,
                    populate_first=populate_first,
                )
                try:
                    if self.dir_syncs is not None:
                        self.dir_syncs.add(self.directory, path)
                    else:
                        fsync_dir(self.directory)
                except BaseException:
                    # its name may not survive a power cut: the file is not used, and a later call makes it again
                    mf.close()
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                    raise
            self.files.append(mf)
            return mf

    # -- a store shared between processes: another process moved the end ---------------------------------------

    def load_view(self, end: int) -> int:
        """Map the segments holding bytes below ``end`` (the committed end another process published), positions
        set there; nothing is resized, cut or repaired (the files belong to the processes writing them, and a
        segment past ``end`` may be in creation). Returns how many were mapped.

        Raises CorruptStoreError when a segment below ``end`` has the wrong size or is missing.
        """
        if not os.path.isdir(self.directory):
            return 0
        fs = self.file_size
        names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and is_decimal(n) and int(n) < end)

        def made() -> Iterator[MappedFile]:
            prev = None
            for name in names:
                base = int(name)
                if prev is not None and base != prev + fs:
                    raise CorruptStoreError(f"segment {name} does not follow {prev:020d} in {self.directory}")
                mf = self._existing(os.path.join(self.directory, name), map_now=True)
                mf.set_positions(min(fs, end - base))
                if self.writable:
                    # not known to be on disk (the process that wrote it may have died before flushing): the next
                    # flush of this view fdatasyncs it once
                    mf.flushed_position = 0
                prev = base
                yield mf

        files = _collect(made())
        if names and files[-1].file_from_offset + fs < end:
            for mf in files:
                mf.close()
            raise CorruptStoreError(
                f"{self.directory}: committed data up to {end} but the segments end at "
                f"{files[-1].file_from_offset + fs}"
            )
        self.files = files
        return len(files)

    def _map_next(self, base: int) -> MappedFile:
        """Map the existing segment at ``base`` (created by another process) and append it; called under ``lock``."""
        path = os.path.join(self.directory, offset_to_file_name(base))
        # create=True opens an existing file as it is and sizes one whose creator died before sizing it
        mf = self._file(path, file_from_offset=base, create=True)
        self.files.append(mf)
        return mf

    def sync_to(self, end: int) -> Optional[MappedFile]:
        """Make this view end at ``end``, the committed end published by another process: map the segments created
        since, mark earlier ones full and move the positions of the one holding ``end`` there (never back).
        Returns the segment ``end`` lies in, or None when ``end`` is a segment boundary (the next segment is the
        writer's to create or open).

        Raises CorruptStoreError when a segment below ``end`` is missing.
        """
        fs = self.file_size
        with self.lock:
            last = self.last()
            if last is None:
                if end == 0:
                    return None
                names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and is_decimal(n))
                if not names or int(names[0]) >= end:
                    raise CorruptStoreError(f"{self.directory}: committed data up to {end} but no segment below it")
                last = self._map_existing(int(names[0]))
            while last.file_from_offset + fs < end:
                last = self._map_existing(last.file_from_offset + fs)
            # positions: every segment wholly below `end` is full, the one holding it ends there. Walk back from the
            # newest (a repair may have mapped a later segment before earlier ones were moved up) to the first
            # segment already full.
            holder = None
            for mf in reversed(self.files):
                base = mf.file_from_offset
                if base >= end:
                    continue
                if base + fs <= end:
                    if mf.is_full():
                        break
                    mf.advance_to(fs)
                else:
                    mf.advance_to(end - base)
                    holder = mf
            if holder is None and end % fs != 0:
                raise CorruptStoreError(f"{self.directory}: no mapped segment holds committed offset {end}")
            return holder

    def _map_existing(self, base: int) -> MappedFile:
        path = os.path.join(self.directory, offset_to_file_name(base))
        if not os.path.exists(path):
            raise CorruptStoreError(f"segment {path} holds committed data but is missing")
        return self._map_next(base)

    def zero_range(self, start: int, end: int) -> None:
        """Zero [start, end) across segments (the torn put of a writer that died) and set their positions back to
        ``start``. Segments that were never created hold nothing to zero."""
        fs = self.file_size
        with self.lock:
            pos = start
            while pos < end:
                mf = self.find(pos)
                if mf is None:
                    last = self.last()
                    base = pos - pos % fs
                    path = os.path.join(self.directory, offset_to_file_name(base))
                    if (last is not None and base != last.file_from_offset + fs) or not os.path.exists(path):
                        break
                    mf = self._map_next(base)
                stop = min(end - mf.file_from_offset, fs)
                mf.zero(pos - mf.file_from_offset, stop)
                pos = mf.file_from_offset + stop
            # segments past the one holding `start` hold nothing committed: out of this view (the files stay for
            # the next writer to open), so that the view ends where the log does
            keep = [mf for mf in self.files if mf.file_from_offset <= start]
            if len(keep) < len(self.files):
                for mf in self.files[len(keep) :]:
                    mf.close()
                self.files = keep

    def last_or_create(self, start_offset: int = 0) -> MappedFile:
        """The last segment if it has room, else a new one after it (or at ``start_offset`` rounded down)."""
        last = self.last()
        if last is None:
            return self.create_file(start_offset - start_offset % self.file_size)
        if last.is_full():
            return self.create_file(last.file_from_offset + self.file_size)
        return last

    # -- truncate / delete ----------------------------------------------------------------------------------

    def truncate_dirty_files(self, offset: int, *, keep_names: bool = False) -> List[str]:
        """Cut the logical file at ``offset``: the segment holding it gets its positions set there (and its stale
        tail zeroed), segments after it are deleted, the newest first (a power cut during the deletions leaves the
        segments that remain contiguous, never a hole), and the directory is fsynced. With ``keep_names`` the
        segments after it only leave ``files`` (unmapped): the caller deletes them with ``delete_names`` once nothing
        durable points into them (recovery first cuts the ConsumeQueues). Returns their paths, oldest first."""
        with self.lock:
            keep, drop = [], []
            for mf in self.files:
                tail = mf.file_from_offset + self.file_size
                if tail > offset:
                    if offset >= mf.file_from_offset:
                        pos = offset - mf.file_from_offset
                        if self.before_rewrite is not None:
                            self.before_rewrite(os.fspath(mf.path), pos, -1)
                        mf.set_positions(pos)
                        mf.zero_tail(pos)
                        keep.append(mf)
                    else:
                        drop.append(mf)
                else:
                    keep.append(mf)
            if self.before_rewrite is not None:
                for mf in drop:
                    self.before_rewrite(os.fspath(mf.path), 0, -1)
            self.files = keep
            removed = [os.fspath(mf.path) for mf in drop]  # (a str: the stub types MappedFile.path wider)
            for mf in reversed(drop):
                if keep_names:
                    mf.close()
                else:
                    mf.destroy(1000)
            if removed and not keep_names:
                fsync_dir(self.directory)
        self.flushed_where = min(self.flushed_where, offset)
        self.committed_where = min(self.committed_where, offset)
        return removed

    def expired_files(
        self, expired_ms: int, now_ms: int, *, clean_immediately: bool = False, batch_max: int = DELETE_FILES_BATCH_MAX
    ) -> List[MappedFile]:
        """The leading run of files that retention may delete, oldest first (RocketMQ's deleteExpiredFileByTime
        selection): every file but the last, each qualifying when ``now_ms >= mtime + expired_ms`` or
        ``clean_immediately``; the run stops at the first file that does not qualify (nothing is deleted from
        the middle) and after ``batch_max`` files.

        :param expired_ms: reserved time in ms (``file_reserved_time`` hours * 3,600,000).
        :param now_ms: the current time in ms since the epoch, from the caller's clock.
        :returns: the qualifying files (not removed; see ``delete_files``).
        :raises OSError: when a file's mtime cannot be read.
        """
        files = self.files
        out: List[MappedFile] = []
        for mf in files[:-1]:  # the last file is the one being written
            if len(out) >= batch_max:
                break
            if not clean_immediately and now_ms < mf.last_modified() + expired_ms:
                break
            out.append(mf)
        return out

    def delete_files(
        self,
        files: List[MappedFile],
        *,
        forcibly_ms: int,
        now_ms: Optional[int] = None,
        between: Optional[Callable[[], bool]] = None,
    ) -> DeleteResult:
        """Delete ``files``, which must be the head of ``files`` in order (from ``expired_files``).

        Each file leaves ``files`` first (new readers no longer find it; a reader that already took the old
        list sees its mapping or a closed file, never freed memory), then is destroyed. A destroy deferred by a
        reader moves the file to ``hanged`` and ends the call, as RocketMQ stops at the first hung file: no
        later file is deleted while it is on disk, so a crash never leaves a gap between segment names. The
        directory is fsynced after the unlinks.

        :param forcibly_ms: ``destroy_mapped_file_interval_forcibly``.
        :param now_ms: the caller's clock (ms), passed to ``MappedFile.destroy``.
        :param between: called before each file after the first (the pause between deletions); returning
            False stops the call (the service is shutting down).
        :returns: DeleteResult.
        :raises OSError: when an unlink or the directory fsync fails.
        """
        res = DeleteResult()
        if files and self.before_head_delete is not None:
            self.before_head_delete(files[-1].file_from_offset + self.file_size)
        try:
            for i, mf in enumerate(files):
                if i > 0 and between is not None and not between():
                    res.stopped = True
                    break
                with self.lock:
                    cur = self.files
                    if len(cur) < 2 or cur[0] is not mf:
                        break  # the list changed under us (truncation): keep it as it is
                    self.files = cur[1:]
                if mf.destroy(forcibly_ms, now_ms):
                    res.deleted.append(os.fspath(mf.path))
                else:
                    self.hanged = self.hanged + [mf]
                    res.hanged = True
                    log.info("deletion of %s deferred: a reader still holds it", mf.path)
                    break
        finally:
            if res.deleted:
                fsync_dir(self.directory)
        return res

    def delete_expired_files(
        self,
        expired_ms: int,
        now_ms: int,
        *,
        forcibly_ms: int,
        clean_immediately: bool = False,
        max_end_offset: Optional[int] = None,
        batch_max: int = DELETE_FILES_BATCH_MAX,
        between: Optional[Callable[[], bool]] = None,
    ) -> DeleteResult:
        """Delete up to ``batch_max`` expired files from the head (``expired_files`` then ``delete_files``).

        Nothing is deleted while an earlier deletion hangs (``retry_delete_hanged`` first).

        :param max_end_offset: a file is deleted only if it ends at or before this absolute offset (the
            dispatcher's position, unconsumed messages); qualifying files past it are returned in ``held_back``.
        :returns: DeleteResult. Other params and errors as ``expired_files`` / ``delete_files``.
        """
        if self.hanged:
            return DeleteResult(hanged=True)
        candidates = self.expired_files(expired_ms, now_ms, clean_immediately=clean_immediately, batch_max=batch_max)
        n = len(candidates)
        if max_end_offset is not None:
            n = 0
            while n < len(candidates) and candidates[n].file_from_offset + self.file_size <= max_end_offset:
                n += 1
        res = self.delete_files(candidates[:n], forcibly_ms=forcibly_ms, now_ms=now_ms, between=between)
        res.held_back = candidates[n:]
        return res

    def retry_delete_hanged(self, forcibly_ms: Optional[int], now_ms: Optional[int] = None) -> List[str]:
        """Destroy again the files whose deletion a reader deferred (RocketMQ's retryDeleteFirstFile).

        :param forcibly_ms: readers still holding a file this long after its first destroy are released
            forcibly (see ``MappedFile.destroy``); None only collects files whose readers are done.
        :param now_ms: the caller's clock (ms), the same as for the first destroy.
        :returns: the paths now gone (the directory is fsynced when there are any).
        :raises OSError: when an unlink or the directory fsync fails.
        """
        hanged = self.hanged
        if not hanged:
            return []
        interval = _NEVER_MS if forcibly_ms is None else forcibly_ms
        gone: List[str] = []
        still: List[MappedFile] = []
        for mf in hanged:
            if mf.destroy(interval, now_ms):
                gone.append(os.fspath(mf.path))
            else:
                still.append(mf)
        self.hanged = still
        if gone:
            log.info("deferred deletion done: %s", gone)
            fsync_dir(self.directory)
        return gone

    def delete_names(self, paths: List[str]) -> None:
        """Delete files ``truncate_dirty_files(keep_names=True)`` left on disk, the newest first, then fsync the
        directory."""
        for path in sorted(paths, reverse=True):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if paths:
            fsync_dir(self.directory)

    def delete_last(self) -> None:
        """Delete the last file (its name durably: the directory is fsynced)."""
        with self.lock:
            if self.files:
                if self.before_rewrite is not None:
                    self.before_rewrite(os.fspath(self.files[-1].path), 0, -1)
                mf = self.files.pop()
                mf.destroy(1000)
                fsync_dir(self.directory)

    def destroy(self) -> None:
        """Delete every segment and the list."""
        with self.lock:
            if self.before_rewrite is not None:
                for mf in self.files:
                    self.before_rewrite(os.fspath(mf.path), 0, -1)
            for mf in self.files:
                mf.destroy(1000)
            self.files = []
            for mf in self.hanged:
                mf.close()
            self.hanged = []
            self.flushed_where = self.committed_where = 0

    # -- flush ----------------------------------------------------------------------------------------------

    def report_sync_failure(self, error: BaseException) -> None:
        """A flush of one of these segments failed (``error``): kept (the first one) and told to
        ``on_sync_failure``. Every flush path reports here: the flush services, the group commit, close()."""
        if self.sync_failure is not None:
            return
        self.sync_failure = error
        if self.on_sync_failure is not None:
            self.on_sync_failure(error)

    def flush(self, least_pages: int = 0) -> bool:
        """Flush the segment that holds ``flushed_where`` (one segment per call, as RocketMQ).

        Returns True when nothing was flushed. Raises StoreIOError when msync fails (flushed_where stays; reported
        to ``report_sync_failure``; that segment's flushes fail from then on without being retried).
        """
        with self.flush_lock:
            mf = self.find(self.flushed_where, return_first_on_not_found=self.flushed_where == 0)
            if mf is None:
                return True
            try:
                pos = mf.flush(least_pages)
            except OSError as e:
                self.report_sync_failure(e)
                raise
            where = mf.file_from_offset + pos
            result = where == self.flushed_where
            self.flushed_where = where
            if not result and mf.flushed_store_timestamp:
                # what the checkpoint may claim: the store time of the last record known to be on disk
                self.store_timestamp = mf.flushed_store_timestamp
            return result

    def flush_to(self, target: int) -> int:
        """Flush segment after segment until ``flushed_where`` >= ``target`` (or nothing is left to flush).

        Returns the new flushed_where. Raises OSError when msync fails.
        """
        while self.flushed_where < target:
            if self.flush(0):
                break
        return self.flushed_where

    def flush_all(self) -> int:
        """Flush every written byte; returns flushed_where."""
        while not self.flush(0):
            pass
        return self.flushed_where

    def commit(self, least_pages: int = 0) -> bool:
        """Copy write-buffered bytes into the segment holding ``committed_where`` (transient store pool).

        Returns True when nothing was committed. A segment committed to its end gives its buffer back through
        ``on_buffer_released``.
        """
        with self.commit_lock:
            mf = self.find(self.committed_where, return_first_on_not_found=self.committed_where == 0)
            if mf is None:
                return True
            pos, released = mf.commit(least_pages)
            where = mf.file_from_offset + pos
            result = where == self.committed_where
            self.committed_where = where
            if released is not None and self.on_buffer_released is not None:
                self.on_buffer_released(released)
            return result

    def commit_all(self) -> int:
        """Commit everything appended so far; returns committed_where."""
        while not self.commit(0):
            pass
        return self.committed_where

    def append_offset(self) -> int:
        """Absolute offset where the next record goes (ahead of max_offset() while a write buffer holds bytes)."""
        last = self.last()
        return last.file_from_offset + last.append_position if last is not None else 0

    def close(self) -> None:
        """Unmap every file (no delete). A file whose deletion hangs is unmapped and unlinked now (or with its
        last zero-copy view), whatever ``hold()`` references remain: the store is going away."""
        with self.lock:
            for mf in self.files:
                mf.close()
            self.files = []
            for mf in self.hanged:
                mf.close()
            self.hanged = []

    def __len__(self) -> int:
        return len(self.files)
