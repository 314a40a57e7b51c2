"""ReadOnlyMessageQueue: ``localmq.open(path, read_only=True)``, a view that writes nothing and locks nothing."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from typing import Any, Dict, List, Optional

import numpy as np

from localmq._mapping import MappingBudget
from localmq.config import check_topic
from localmq.errors import IndexDisabledError, NotAStoreError, ReadOnlyStoreError, StoreLockedError
from localmq.layout import (
    COMMITLOG_DIR,
    CONSUMEQUEUE_DIR,
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    CTL_S_REPUT,
    CTL_S_WPOS,
    LOCK_FILE,
    MAX_QUEUE_ID,
    interrupted_creation,
    is_decimal,
)
from localmq.queues.local import LocalMessageQueue
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.control_view import ControlView
from localmq.store.files import numbered_files
from localmq.store.index import IndexReader
from localmq.store.lock import StoreLock
from localmq.store.mapped_file_queue import MappedFileQueue
from localmq.store.queue_recovery import RecoveryReport

_FLOCK = struct.Struct("hh4xqqi4x")


def _lock_holder(root: str) -> Optional[str]:
    """ "exclusive", "shared" or None: how the store's ``lock`` file is held by other processes (F_GETLK on byte 0,
    which RocketMQ and localmq both lock; asking takes no lock)."""
    path = os.path.join(root, LOCK_FILE)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if (st.st_dev, st.st_ino) in StoreLock.held:
        # this process holds it (F_GETLK would not report our own lock either), and opening the file here
        # would drop that lock when the descriptor is closed
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
        kind = _FLOCK.unpack(got)[0]
    finally:
        os.close(fd)
    return None if kind == fcntl.F_UNLCK else "exclusive" if kind == fcntl.F_WRLCK else "shared"


class _NoLock:
    created = False

    def release(self) -> None:
        pass

    def stamp(self) -> None:
        pass

    def exclusive(self) -> bool:
        return False


class ReadOnlyMessageQueue(LocalMessageQueue):
    """A read-only view of a store: closed, or open in any number of processes with ``shared=True``.

    Opens every file O_RDONLY and maps it PROT_READ, takes no lock, writes nothing (not even ``lock``, ``abort``
    or the checkpoint), so it needs no write permission and never blocks or disturbs a writer. On a live shared
    store it reads what the housekeeper has dispatched (from the control file, mapped read-only): always a
    prefix of what the writers acknowledged. Gets, offsets, topics, lookups by offset, key and id (through the
    index files, mapped read-only: what the housekeeper has indexed) and consumer lag work;
    puts, consumers and producers raise ReadOnlyStoreError; ``wait_for_new_messages`` polls every 10 ms (a
    read-only mapping cannot announce a sleeper on the shared futex). A store held by one live process alone
    (``shared=False``) is refused: its end is in that process's memory, not on disk.
    """

    def __init__(self, path: str | os.PathLike, config=None, **kwargs: Any):
        root = os.path.abspath(os.fspath(path))
        if not os.path.isdir(os.path.join(root, COMMITLOG_DIR)):
            raise NotAStoreError(errno.ENOENT, f"{root} holds no store (no {COMMITLOG_DIR}/ directory)", root)
        super().__init__(root, config, **kwargs)

    _writes = False
    _view: Optional[ControlView] = None  # the live shared store's control file, read-only (None: closed store)

    def _make_lock(self):
        return _NoLock()

    def _list_for_undo(self, created_root):
        return None  # nothing is written, and a live writer's files must never look like this open's

    def _record_settings(self) -> None:
        pass  # the settings come from the record or the files, but a view writes nothing

    def _open(self, progress) -> None:
        c = self.config
        self._view = ControlView.open(self.root)
        if self._view is None and _lock_holder(self.root) == "exclusive":
            err = StoreLockedError(
                errno.EAGAIN,
                f"store {self.root} is held by one live process alone (opened with "
                "shared=False, or a broker): its committed end is in that process's memory; "
                "open it with shared=True there to read it live from other processes",
                os.path.join(self.root, LOCK_FILE),
            )
            raise err
        self._cq_root = os.path.join(self.root, CONSUMEQUEUE_DIR)
        self._cl_mfq = MappedFileQueue(
            os.path.join(self.root, COMMITLOG_DIR), c.mapped_file_size_commit_log, writable=False
        )
        if self._view is not None:
            end = self._view.load(CTL_S_WPOS)
        else:
            files = numbered_files(self._cl_mfq.directory)
            if files and interrupted_creation(len(files) - 1, len(files), files[-1].size):
                files.pop()
            end = files[-1].base + c.mapped_file_size_commit_log if files else 0
        self._cl_mfq.load_view(end)
        # the queue files it maps are bounded as a writer's are (StoreConfig.max_mapped_queue_files)
        n = c.max_mapped_queue_files
        self._cq_budget: Optional[MappingBudget] = MappingBudget(n) if n > 0 else None
        self.commit_log = None  # type: ignore[assignment]
        self.checkpoint = None  # type: ignore[assignment]
        self.recovery = RecoveryReport(mode="read-only", end_offset=end)
        self._setup_reads()

    # -- what a view refuses ------------------------------------------------------------------------------------

    def _refuse(self, what: str) -> ReadOnlyStoreError:
        return ReadOnlyStoreError(f"{what}: {self.root} is open read-only (localmq.open(path, read_only=True))")

    def put(self, topic, body, **kwargs):  # type: ignore[override]
        raise self._refuse("put")

    def put_batch(self, topic, bodies, **kwargs):  # type: ignore[override]
        raise self._refuse("put_batch")

    def create_producer(self, *args, **kwargs):
        raise self._refuse("a producer")

    def create_consumer(self, *args, **kwargs):
        raise self._refuse("a consumer (it commits offsets)")

    def flush(self) -> None:
        self._check_open()

    _index_reader: Optional[IndexReader] = None

    def _require_index(self):
        self._check_open()
        if not self.config.message_index_enable:
            raise IndexDisabledError("the message index is disabled (message_index_enable=False)")
        if self._index_reader is None:
            self._index_reader = IndexReader(self.root)
        return self._index_reader

    def wait_for_index(self, timeout: Optional[float] = None) -> bool:
        """A view cannot know what the index covers on a live store: returns True at once (lookups answer from
        what the housekeeper has indexed so far)."""
        self._require_index()
        return True

    def _query_index(self, topic: str, key: str, max_num: int, begin: int, end: int, uniq_only: bool) -> List[Any]:
        reader = self._require_index()
        reader.refresh()  # index files created since the last lookup
        if self._view is not None:
            end_cl = self._view.load(CTL_S_WPOS)
            if end_cl > self._cl_mfq.max_offset():
                self._cl_mfq.sync_to(end_cl)  # the records the index points at are mapped
        mfq = self._cl_mfq
        return reader.query_messages(mfq.files, mfq.file_size, topic, key, max_num, begin, end, uniq_only)

    def _written_topics(self) -> List[str]:
        return sorted(self.topics())

    # -- reads --------------------------------------------------------------------------------------------------

    def _units_end(self, cq: ConsumeQueue) -> int:
        """A closed store: the index after the last valid unit (what recovery would keep), read without cutting."""
        end = 0
        for mf in cq.mapped_file_queue.files:
            arr = np.frombuffer(mf, dtype=CQ_DTYPE)
            try:
                valid = (arr["offset"] >= 0) & (arr["size"] > 0)
                n = len(valid) if bool(valid.all()) else int(np.argmin(valid))
            finally:
                del arr
            end = mf.file_from_offset // CQ_UNIT_SIZE + n
            if n < len(valid):
                break
        return end

    def _cq(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        self._check_open()
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        view = self._view
        if cq is None:
            check_topic(topic)  # never a path outside consumequeue/
            if not 0 <= queue_id <= MAX_QUEUE_ID or not os.path.isdir(
                os.path.join(self._cq_root, topic, str(queue_id))
            ):
                return None
            cq = ConsumeQueue(
                topic,
                queue_id,
                self._cq_root,
                self.config.mapped_file_size_consume_queue,
                writable=False,
                budget=self._cq_budget,
            )
            if view is None:
                cq.mapped_file_queue.load(fix_empty_tail=False)
                cq._reset_state(self._units_end(cq))
            self._cqs[key] = cq
        if view is not None:
            m = view.dispatched(topic, queue_id) or 0
            if m > cq.max_offset:
                mfq = cq.mapped_file_queue
                if mfq.files:
                    mfq.sync_to(m * CQ_UNIT_SIZE)
                else:
                    mfq.load_view(m * CQ_UNIT_SIZE)
                cq._reset_state(m)
            end = view.load(CTL_S_WPOS)
            if end > self._cl_mfq.max_offset():
                self._cl_mfq.sync_to(end)
        return cq

    def look_message_by_offset(self, physical_offset: int, *, zero_copy: bool = False):
        self._check_open()
        if self._view is not None:
            end = self._view.load(CTL_S_WPOS)
            if end > self._cl_mfq.max_offset():
                self._cl_mfq.sync_to(end)
        return super().look_message_by_offset(physical_offset, zero_copy=zero_copy)

    def topics(self) -> Dict[str, List[int]]:
        self._check_open()
        out: Dict[str, List[int]] = {}
        if os.path.isdir(self._cq_root):
            for t in sorted(os.listdir(self._cq_root)):
                tdir = os.path.join(self._cq_root, t)
                if os.path.isdir(tdir):
                    qs = sorted(int(q) for q in os.listdir(tdir) if is_decimal(q) and int(q) <= MAX_QUEUE_ID)
                    if qs:
                        out[t] = qs
        return out

    @property
    def progress(self) -> int:
        return self._view.load(CTL_S_REPUT) if self._view is not None else self._cl_mfq.max_offset()

    @property
    def dispatch_behind_bytes(self) -> int:
        if self._view is None:
            return 0
        return max(0, self._view.load(CTL_S_WPOS) - self._view.load(CTL_S_REPUT))

    def wait_for_dispatch(self, timeout: Optional[float] = None) -> bool:
        self._check_open()
        if self._view is None:
            return True
        target = self._view.load(CTL_S_WPOS)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._view.load(CTL_S_REPUT) < target:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        self._check_open()
        if since is None:
            since = self.progress
        deadline = None if timeout is None else time.monotonic() + timeout
        wakes = self._wakes
        while True:
            cur = self.progress
            if cur > since or self._wakes != wakes or self._view is None:
                return cur
            if deadline is not None and time.monotonic() >= deadline:
                return cur
            time.sleep(0.01)
            if self._closed:
                raise self._closed_error()

    def wake_waiters(self) -> None:
        self._wakes = self._wakes + 1

    def stats(self) -> Dict[str, Any]:
        return {
            "read_only": True,
            "live": self._view is not None,
            "commit_log_max_offset": self._cl_mfq.max_offset(),
            "segments": len(self._cl_mfq.files),
            "consume_queues": len(self._cqs),
        }

    def close(self) -> None:
        """Unmap everything. Writes nothing."""
        if self._closed:
            return
        self._closed = True
        self._close_clients()
        for cq in list(self._cqs.values()):
            cq.close()
        if self._index_reader is not None:
            self._index_reader.close()
        self._cl_mfq.close()
        if self._view is not None:
            self._view.close()

    def _abandon(self) -> None:
        for cq in list(self._cqs.values()):
            cq.close()
        if self._cl_mfq is not None:
            self._cl_mfq.close()
        if self._view is not None:
            self._view.close()

    def __repr__(self) -> str:
        return f"<ReadOnlyMessageQueue {self.root!r} {'closed' if self._closed else 'open'}>"
