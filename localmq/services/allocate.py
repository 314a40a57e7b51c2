"""AllocateMappedFileService: creates the next CommitLog segments ahead of need, reserved and optionally warm."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from localmq._mapped_file import MappedFile, offset_to_file_name
from localmq._native import fsync_dir
from localmq.services.service_thread import ServiceThread

log = logging.getLogger("localmq.allocate")


class _Request:
    __slots__ = ("path", "offset", "created", "done", "mf", "error", "taken")

    def __init__(self, path: str, offset: int):
        self.path = path
        self.offset = offset
        self.created = threading.Event()  # the file exists, sized and reserved (warm-up may still run)
        self.done = threading.Event()  # creation and warm-up finished (or failed)
        self.mf: Optional[MappedFile] = None
        self.error: Optional[BaseException] = None
        self.taken = False


class AllocateMappedFileService(ServiceThread):
    """Serves ``MappedFileQueue.allocator``: when the CommitLog asks for segment N it gets the file this thread
    created ahead (or, if that is not ready, one created on the spot), and segments N+1 and N+2 are queued.

    Each file is created at its full size with its blocks reserved (posix_fallocate), so writing into it can
    never SIGBUS on a full disk, and its directory is fsynced. With ``warm`` (warm_mapped_file_enable) the
    thread also prefaults every page writable (MADV_POPULATE_WRITE, GIL released; in SYNC_FLUSH the warmed
    range is msynced every ``warm_flush_pages`` pages as RocketMQ does), mlocks the file and advises
    MADV_WILLNEED. A refused mlock (no privilege, RLIMIT_MEMLOCK) is one warning, then files are not locked.
    A warmed file is unlocked once the writer has moved past it, so at most three segments are locked.

    Pre-created files that were never handed out are deleted by ``shutdown()`` (the newest first); after a crash,
    recovery cuts them (they hold only zeros). A failed pre-creation (ENOSPC) is retried synchronously when the file
    is actually needed; that error then reaches the put as CREATE_MAPPED_FILE_FAILED. A file is created ahead only
    when the one before it exists, so that the names never have a hole.

    Thread-safety: ``allocate`` is called with the CommitLog's put lock and the queue's lock held; it waits
    for this thread only when the very file it needs is being created right now.
    """

    AHEAD = 2

    def __init__(
        self,
        mfq,
        *,
        warm: bool = False,
        warm_flush_pages: int = 0,
        pool=None,
        reserve: bool = True,
        wait_timeout_s: float = 5.0,
    ):
        super().__init__("AllocateMappedFileService")
        self.mfq = mfq
        self.directory = mfq.directory
        self.file_size = mfq.file_size
        self.warm = warm
        self.warm_flush_pages = warm_flush_pages
        self.pool = pool
        self.reserve = reserve
        self.wait_timeout_s = wait_timeout_s
        self._cond = threading.Condition()
        self._requests: Dict[str, _Request] = {}
        self._queue: List[_Request] = []
        self._unlock: List[MappedFile] = []
        self._mlock_ok = True
        self.created_ahead = 0
        self.served_ready = 0
        self.served_sync = 0
        self.warm_seconds = 0.0

    # -- the allocator hook (put path) ---------------------------------------------------------------------

    def allocate(self, path: str, file_size: int, start_offset: int) -> MappedFile:
        """Return the mapped segment for ``path`` (raises OSError when it cannot be created)."""
        with self._cond:
            req = self._requests.get(path)
            if req is not None:
                req.taken = True
        mf = None
        if req is not None:
            # Being created or ready: wait for it (bounded), then take it. In ASYNC_FLUSH a file still being
            # warmed is taken at once (prefaulting is safe while the writer appends: the warm-up simply goes
            # on ahead of it); the SYNC_FLUSH warm-up flushes the file as it goes, so that one is waited for.
            ready = req.created if self.warm_flush_pages == 0 else req.done
            if ready.wait(self.wait_timeout_s) and req.mf is not None:
                mf = req.mf
                self.served_ready += 1
            with self._cond:
                self._requests.pop(path, None)
            if mf is None and ready.is_set() is False:
                log.warning(
                    "%s: %s not ready after %.1f s; creating it synchronously", self.name, path, self.wait_timeout_s
                )
        if mf is None:
            mf = MappedFile(
                path, file_size, start_offset, create=True, reserve=self.reserve, reserve_step=self.mfq.reserve_step
            )
            try:
                fsync_dir(self.directory)
            except BaseException:
                # its name may not survive a power cut: not used, unmapped now (not when the exception is freed),
                # deleted; the put that asked fails and the next one makes it again (as MappedFileQueue.create_file)
                mf.close()
                try:
                    os.unlink(path)
                except OSError:
                    pass
                raise
            self.served_sync += 1
        if self.pool is not None:
            buf = self.pool.borrow()
            if buf is not None:
                mf.attach_write_buffer(buf)
        prev = self.mfq.last()  # create_file appends `mf` after this returns
        if prev is not None:
            self.release_previous(prev)
        self._request_ahead(start_offset)
        return mf

    def prime(self) -> None:
        """Queue the segments after the current last one (at open, so the first roll finds them ready)."""
        last = self.mfq.last()
        if last is not None:
            self._request_ahead(last.file_from_offset)

    def _request_ahead(self, start_offset: int) -> None:
        with self._cond:
            if self.stopped:
                return
            for i in range(1, self.AHEAD + 1):
                off = start_offset + i * self.file_size
                p = os.path.join(self.directory, offset_to_file_name(off))
                if p not in self._requests:
                    r = _Request(p, off)
                    self._requests[p] = r
                    self._queue.append(r)
            self._cond.notify()

    def release_previous(self, mf: MappedFile) -> None:
        """The writer left ``mf``: unlock its pages in this thread (not on the put path)."""
        if self.warm:
            with self._cond:
                self._unlock.append(mf)
                self._cond.notify()

    # -- the thread ------------------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._unlock and not self.stopped:
                    self._cond.wait(1.0)
                if self.stopped:
                    return
                unlock, self._unlock = self._unlock, []
                req = self._queue.pop(0) if self._queue else None
            for mf in unlock:
                try:
                    if not mf.closed:
                        mf.munlock()
                except OSError:
                    pass
            if req is not None:
                self._create(req)

    def _create(self, req: _Request) -> None:
        import time

        mf = None
        try:
            if os.path.exists(req.path):
                raise FileExistsError(17, "segment already exists", req.path)
            before = os.path.join(self.directory, offset_to_file_name(req.offset - self.file_size))
            if req.offset >= self.file_size and not os.path.exists(before):
                # the one before it could not be created: creating this one would leave a hole in the names,
                # which the next open refuses ("missing segments between others") if the process dies before the
                # put path creates the missing one (tests/test_power_loss.py)
                raise FileNotFoundError(2, "the segment before it does not exist", before)
            mf = MappedFile(
                req.path,
                self.file_size,
                req.offset,
                create=True,
                reserve=self.reserve,
                reserve_step=self.mfq.reserve_step,
            )
            fsync_dir(self.directory)
            req.mf = mf
            req.created.set()
            if self.warm:
                t0 = time.monotonic()
                self._warm(mf)
                self.warm_seconds += time.monotonic() - t0
            self.created_ahead += 1
        except OSError as e:
            mf = self._discard(req, mf)
            req.error = e
            log.warning("%s: cannot create or warm %s ahead of need: %s", self.name, req.path, e)
        except BaseException as e:  # noqa: BLE001 - counted, and the put path creates it itself
            mf = self._discard(req, mf)
            req.error = e
            self.errors += 1
            self.last_error = e
            log.exception("%s: creating %s failed", self.name, req.path)
        req.mf = mf
        req.created.set()
        req.done.set()
        # a file finished after the service was stopped, or one no put will claim, is deleted at shutdown

    def _discard(self, req: _Request, mf: Optional[MappedFile]) -> Optional[MappedFile]:
        """After a failure: delete the file unless a put already took it (then it stays in use, unwarmed)."""
        if mf is None:
            return None
        with self._cond:  # `taken` is set under the same lock
            if req.taken:
                return mf
            req.mf = None
        mf.destroy(0)
        return None

    def _warm(self, mf: MappedFile) -> None:
        from localmq._native import ADV_WILLNEED

        size = self.file_size
        # a warm file is wanted whole: its blocks first (a sparse file's prefault would allocate them unreserved)
        mf.reserve_to(size)
        step = self.warm_flush_pages * 4096 if self.warm_flush_pages > 0 else size
        pos = 0
        while pos < size and not self.stopped:
            n = min(step, size - pos)
            mf.populate(pos, n)
            if self.warm_flush_pages > 0:
                # SYNC_FLUSH: write the prefaulted (dirty) pages back now, not in the puts' flushes
                mf.wrote_position = pos + n
                mf.flush(0)
            pos += n
        if self.warm_flush_pages > 0:
            mf.set_positions(0)
        if self._mlock_ok:
            try:
                mf.mlock()
            except OSError as e:
                self._mlock_ok = False
                log.warning("%s: mlock refused (%s); warmed segments will not be locked in memory", self.name, e)
        mf.madvise(ADV_WILLNEED)

    def on_shutdown(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread, then delete every file created ahead that no put took: the last one first, so that a
        deletion that fails (logged) leaves the directory without a hole between segments, only unused segments
        at its end (recovery cuts them)."""
        super().shutdown(timeout)
        removed = False
        with self._cond:
            reqs = list(self._requests.values())
            self._requests.clear()
            self._queue.clear()
        unused = sorted((r for r in reqs if r.mf is not None and not r.taken), key=lambda r: r.offset, reverse=True)
        for i, r in enumerate(unused):
            try:
                r.mf.destroy(0)
            except OSError as e:
                log.error(
                    "%s: cannot delete %s, created ahead and never used: %s; it stays (and %d more before it) "
                    "as an empty segment at the end of the log",
                    self.name,
                    r.path,
                    e,
                    len(unused) - 1 - i,
                )
                for rest in unused[i + 1 :]:
                    rest.mf.close()
                break
            removed = True
        if removed:
            try:
                fsync_dir(self.directory)
            except OSError as e:
                log.error("%s: %s", self.name, e)

    def stats(self) -> dict:
        return {
            "created_ahead": self.created_ahead,
            "served_ready": self.served_ready,
            "served_sync": self.served_sync,
            "warm_seconds": round(self.warm_seconds, 3),
            "mlock": self._mlock_ok,
        }


def _make_first_file(cq: Any, base: int) -> None:
    cq.make_first_file(base)


# a queue's state at the maker (QueueFileMaker._state)
_REQUESTED = 0
_MAKING = 1


class QueueFileMaker(ServiceThread):
    """Makes the first file of a new ConsumeQueue (its directories, the file sized and reserved, its mapping) off the
    dispatcher's thread. The dispatcher keeps the new queue's units in memory meanwhile (``ReputCore``: they are not
    readable yet, and the dispatched offset that consumers, ``wait_for_dispatch`` and the checkpoint see stays
    before the first of them) and goes on with every other queue: a burst of new queues costs the dispatcher a
    request each instead of the file system's metadata work (1-2 ms per queue when the journal is busy). Once the
    file exists, ``on_made(cq)`` tells the dispatcher, which writes the units there on its own thread (the only
    writer of units). A file that could not be made (a full disk, an I/O error) is reported the same way: the
    dispatcher then makes it itself, and blocks and retries as it does for any queue file.

    Lock order: ``_cond`` (this service's state) before nothing; ``create_file`` takes the queue's file lock
    outside it."""

    def __init__(self, on_made: Callable[[Any], None], make: Optional[Callable[[Any, int], None]] = None) -> None:
        super().__init__("QueueFileMaker")
        self.on_made = on_made
        # (queue, base offset) -> None: makes the file (default ConsumeQueue.make_first_file; tests slow it down)
        self.make = make if make is not None else _make_first_file
        self._cond = threading.Condition(threading.Lock())
        self._todo: Deque[Tuple[Any, int]] = deque()
        self._state: Dict[Any, int] = {}  # queue -> _REQUESTED / _MAKING; absent once made, failed or claimed
        self.made = 0
        self.failed = 0

    def request(self, cq: Any, base: int) -> bool:
        """Ask for the file of ``cq`` at ``base`` (its first unit's file). False when the service is not running:
        the caller makes the file itself."""
        with self._cond:
            if self.stopped or not self.alive:
                return False
            self._state[cq] = _REQUESTED
            self._todo.append((cq, base))
        self.wakeup()
        return True

    def claim(self, cq: Any) -> None:
        """Take ``cq`` back (the dispatcher makes its file itself from here): a request not started is forgotten; one
        being made is waited for."""
        with self._cond:
            while self._state.get(cq) == _MAKING:
                self._cond.wait(0.1)
            self._state.pop(cq, None)

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(1000)
            while not self.stopped:
                with self._cond:
                    if not self._todo:
                        break
                    cq, base = self._todo.popleft()
                    if self._state.get(cq) != _REQUESTED:
                        continue  # claimed meanwhile
                    self._state[cq] = _MAKING
                try:
                    self.make(cq, base)
                    self.made += 1
                except Exception as e:  # noqa: BLE001 - the dispatcher makes it again and reports what it meets
                    self.failed += 1
                    log.debug("consume queue %s-%d: its first file was not made ahead: %s", cq.topic, cq.queue_id, e)
                finally:
                    with self._cond:
                        self._state.pop(cq, None)
                        self._cond.notify_all()
                self.on_made(cq)

    def on_shutdown(self) -> None:
        # requests not started are dropped (their units stay with the dispatcher); a file being made is finished
        # first (claim waits for it), so that nobody makes it a second time
        with self._cond:
            self._todo.clear()
            for cq in [q for q, s in self._state.items() if s == _REQUESTED]:
                del self._state[cq]
            self._cond.notify_all()

    def stats(self) -> dict:
        return {"queue_files_made_ahead": self.made, "queue_files_not_made_ahead": self.failed}
