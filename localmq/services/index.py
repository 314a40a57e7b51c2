"""IndexDispatchService: the thread that follows the CommitLog and indexes KEYS and UNIQ_KEY into IndexFiles.

RocketMQ builds the index inside its dispatcher (CommitLogDispatcherBuildIndex). localmq keeps the index off the
ConsumeQueue dispatcher's hot path: this thread follows the commit log on its own from its own offset, reading
only the published part of each segment (``wrote_position``) through a buffer export of the segment (retention
cannot unmap it under the decoder), decoding a batch of records at a time with ``decode_range`` and indexing
the batch with a C loop (``IndexService.build``); both release the GIL. A put therefore never waits for the
index: the index trails the log by the time of one batch.

Progress: ``indexed_offset`` (every record below it is indexed). It is not persisted: on open it resumes at
the last index file's endPhyOffset (``IndexService.resume_offset``), so after a clean exit it re-reads only the
records after the last key indexed, and after an unclean exit whatever recovery deleted is indexed again.
The checkpoint's index timestamp moves when a full file is flushed (``IndexService.roll``), as in RocketMQ.

Idle: when caught up the thread waits 1 ms, doubling to 20 ms while nothing arrives; ``wait_for`` wakes it.
A record that cannot be decoded stops the service (``error``), as the ConsumeQueue dispatcher does; a file
that cannot be created (ENOSPC) is retried every 100 ms (``blocked``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from localmq._columns import RecordColumns, decode_range
from localmq._record import walk_records
from localmq.errors import CorruptFrameError, StoreClosedError
from localmq.services.service_thread import ServiceThread
from localmq.status import Stop

log = logging.getLogger("localmq.index")

BATCH_ROWS = 4096
_IDLE_MIN_MS = 1.0
_IDLE_MAX_MS = 20.0


class IndexDispatchService(ServiceThread):
    """Follow the commit log (``mapped_file_queue``) from ``start_offset`` and index every record into
    ``index_service`` (an IndexService).

    Counters: ``records`` decoded, ``keys`` added, ``indexed_offset``; ``error`` when it stopped on a bad record,
    ``blocked`` while an index file cannot be created.
    """

    def __init__(self, index_service, mapped_file_queue, start_offset: int, batch_rows: int = BATCH_ROWS):
        super().__init__("IndexDispatchService")
        self.index = index_service
        self.mfq = mapped_file_queue
        self._offset = start_offset
        self.start_offset = start_offset
        # the resume point (the last index file's endPhyOffset, a record's start when the file was written) is
        # checked once to be a record boundary still: an open may have replaced damage around it by a gap record
        self._resume_checked = False
        self.batch_rows = batch_rows
        self.records = 0
        self.keys = 0
        self.error: Optional[BaseException] = None
        self.blocked: Optional[BaseException] = None
        # notified after each batch; waiters (wait_for) hold it while checking indexed_offset
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0
        # called with indexed_offset after each batch that made progress (a shared store publishes it to the
        # other processes)
        self.on_progress: Optional[Callable[[int], None]] = None

    @property
    def indexed_offset(self) -> int:
        """Commit log offset below which every record has been indexed."""
        return self._offset

    def run(self) -> None:
        cols = RecordColumns(self.batch_rows)
        idle = _IDLE_MIN_MS
        try:
            while not self.stopped:
                try:
                    progressed = self.run_once(cols)
                except OSError as e:
                    # an index file cannot be created (disk full): nothing is lost, the log is re-read later
                    if self.blocked is None:
                        log.error("index blocked at commit log offset %d: %s; retrying every 100 ms", self._offset, e)
                    # kept without its traceback: the frames hold the segment's buffer, which close() must unmap
                    self.blocked = e.with_traceback(None)
                    del e
                    self.wait_for_running(100)
                    continue
                if self.blocked is not None:
                    log.warning("indexing resumed after: %s", self.blocked)
                    self.blocked = None
                if progressed:
                    idle = _IDLE_MIN_MS
                    if self.on_progress is not None:
                        self.on_progress(self._offset)
                    if self.waiters:
                        with self.cond:
                            self.cond.notify_all()
                    continue
                if self.waiters:
                    with self.cond:
                        self.cond.notify_all()
                self.wait_for_running(idle)
                idle = min(idle * 2, _IDLE_MAX_MS)
        except BaseException as e:
            self.error = e
            raise
        finally:
            with self.cond:
                self.cond.notify_all()

    def run_once(self, cols: RecordColumns) -> bool:
        """Index one batch (up to ``batch_rows`` records of one segment). Returns False when caught up.

        Raises CorruptFrameError on a record that cannot be decoded, OSError when an index file cannot be created.
        """
        mfq = self.mfq
        off = self._offset
        min_off = mfq.min_offset()
        if off < min_off:
            log.warning("index offset %d is below the commit log min offset %d; jumping forward", off, min_off)
            self._offset = min_off
            return True
        seg = mfq.find(off)
        if seg is None:
            return False
        base = seg.file_from_offset
        size = seg.file_size
        rel = off - base
        end = seg.wrote_position
        if mfq.committed_end is not None:  # a shared store: never past the committed end
            end = min(end, mfq.committed_end() - base)
        if rel >= end:
            if end >= size:
                self._offset = base + size
                return True
            return False
        try:
            view = memoryview(seg)
        except StoreClosedError:
            return True  # deleted by retention: the next round jumps to the new min offset
        with view:
            if not self._resume_checked:
                self._resume_checked = True
                if rel > 0:
                    # walk the segment's records from its start (gap records are stepped over) to the resume point:
                    # past it means the point lies inside a gap record, whose bytes after its header are whatever the
                    # damage left (zeros, garbage, something that looks like a blank record); go on after the gap
                    at, outcome, _, _, _ = walk_records(view, 0, rel, False)
                    if at > rel and outcome == "end":
                        log.warning(
                            "index offset %d lies inside a gap record; resuming after it at %d", base + rel, base + at
                        )
                        self._offset = base + at
                        return True
            n, pos, reason = decode_range(view, cols, rel, end, base)
            if n:
                self.keys += self.index.build(view, cols)
                self.records += n
        if n == 0 and reason == Stop.END and pos < end:
            reason = Stop.CORRUPT  # zeros at a record boundary below the published end: damage, not the log's end
        if reason == Stop.BLANK:
            self._offset = base + size
            return True
        if reason in (Stop.TORN, Stop.CORRUPT):
            raise CorruptFrameError(
                f"index service found a {reason} record at commit log offset {base + pos}",
                offset=base + pos,
                path=seg.path,
            )
        self._offset = base + pos
        return n > 0

    def wait_for(self, target: int, timeout: Optional[float]) -> bool:
        """Block until ``indexed_offset >= target``. True, or False after ``timeout`` s.

        Raises the service's error (as the cause of a RuntimeError subclass the caller chooses) via ``error``:
        the caller checks ``error`` / ``alive`` after a False. Returns False at once when the thread is not alive.
        """
        if self._offset >= target:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            self.waiters += 1
            try:
                self.wakeup()
                while self._offset < target:
                    if self.error is not None or not self.alive:
                        return False
                    wait = 0.05
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        wait = min(wait, left)
                    self.cond.wait(wait)
            finally:
                self.waiters -= 1
        return True

    def stats(self) -> dict:
        return {
            "indexed_offset": self._offset,
            "start_offset": self.start_offset,
            "records": self.records,
            "keys": self.keys,
            "error": repr(self.error) if self.error is not None else None,
            "blocked": str(self.blocked) if self.blocked is not None else None,
        }
