"""Flush services: FlushRealTimeService (ASYNC_FLUSH), GroupCommitService (SYNC_FLUSH), CommitRealTimeService
(transient store pool) and FlushConsumeQueueService, with RocketMQ's intervals and least-pages rules."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Optional

from localmq.errors import StoreClosedError
from localmq.layout import CTL_S_FLUSH_REQ, CTL_S_FLUSHED
from localmq.services.service_thread import ServiceThread

log = logging.getLogger("localmq.flush")

# RocketMQ retries the last flush this many times when a service shuts down.
SHUTDOWN_FLUSH_RETRIES = 10


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class _Thorough:
    """RocketMQ's "least pages, but everything every N ms" rule shared by the flush and commit services."""

    def __init__(self, interval_ms: int):
        self.interval_ms = interval_ms
        self.last = _monotonic_ms()

    def least_pages(self, least: int) -> int:
        now = _monotonic_ms()
        if now >= self.last + self.interval_ms:
            self.last = now
            return 0
        return least


def _log_failure(service: ServiceThread, e: BaseException, what: str) -> None:
    """Count a failed pass; log it unless it repeats the last one (a segment whose flush failed fails every pass
    from then on: MappedFile.sync_error)."""
    service.errors += 1
    if str(e) != str(service.last_error):
        log.error("%s: %s failed: %s", service.name, what, e)
    service.last_error = e


def prepare_ahead(mf, service: ServiceThread, mfq=None) -> None:
    """Keep the range ahead of the log's end in ``mf`` written once and flushed (``MappedFile.prepare_ahead``, the
    step the group commit loops take in C). Errors (a full disk, a kernel without MADV_POPULATE_WRITE) stop the
    preparing of this segment; flushes go on without it. A failed fdatasync is a failed flush of the segment (it
    may have consumed the error of a page a put wrote): reported to ``mfq.report_sync_failure``."""
    if mf is None:
        return
    try:
        mf.prepare_ahead(mf.wrote_position)
    except (OSError, StoreClosedError) as e:
        service.last_error = e
        log.info("%s: not preparing %s ahead of the log any more: %s", service.name, mf.path, e)
        if isinstance(e, OSError) and mf.sync_error and mfq is not None:
            mfq.report_sync_failure(e)


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: every ``flush_interval_commit_log`` ms, msync the CommitLog when at least
    ``flush_commit_log_least_pages`` pages are dirty, and everything every ``flush_commit_log_thorough_interval``
    ms. After each flush the checkpoint's physical timestamp moves to the last record known on disk.

    ``flush_commit_log_timed`` (default True) sleeps the interval; False waits on ``wakeup()`` (which the
    commit service calls after each commit) or the interval, whichever is first.
    """

    def __init__(self, mfq, config, checkpoint):
        super().__init__("FlushRealTimeService")
        self.mfq = mfq
        self.config = config
        self.checkpoint = checkpoint
        self.flushes = 0
        self._thorough = _Thorough(config.flush_commit_log_thorough_interval)

    def run(self) -> None:
        c = self.config
        while not self.stopped:
            if c.flush_commit_log_timed:
                self._stopped.wait(c.flush_interval_commit_log / 1000.0)
            else:
                self.wait_for_running(c.flush_interval_commit_log)
            if self.stopped:
                break
            self.flush_once(self._thorough.least_pages(c.flush_commit_log_least_pages))
        # RocketMQ retries the final flush: a full segment and the next one may both hold unflushed bytes
        try:
            for _ in range(SHUTDOWN_FLUSH_RETRIES):
                if self.mfq.sync_failure is not None or self.mfq.flush(0):
                    break
        except OSError as e:  # reported by mfq.flush: the store's close() raises it
            _log_failure(self, e, "flushing the commit log")

    def flush_once(self, least_pages: int) -> None:
        """One pass. A failure is logged, counted and reported (``MappedFileQueue.report_sync_failure``: the store
        refuses puts from then on); a failed flush is never retried."""
        if self.mfq.sync_failure is not None:
            return
        try:
            if not self.mfq.flush(least_pages):
                self.flushes += 1
                ts = self.mfq.store_timestamp
                if ts > 0:
                    self.checkpoint.physic_msg_timestamp = ts
        except OSError as e:
            _log_failure(self, e, "flushing the commit log")


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: putting threads wait on ``group_commit`` (a C rendezvous, GIL released) until their last
    byte is flushed. When no flush is running and all unflushed bytes are in the current segment, the first
    waiter flushes for everyone (leader/follower group commit, no thread hand-off); otherwise (a segment just
    rolled, or a leader's flush failed) this thread takes the highest requested offset, flushes every written
    byte, publishes the new flushed offset and so wakes every covered put at once. A put whose flush does not finish
    within ``sync_flush_timeout`` ms answers
    FLUSH_DISK_TIMEOUT (checked by the put itself).
    """

    def __init__(self, mfq, group_commit, checkpoint):
        super().__init__("GroupCommitService")
        self.mfq = mfq
        self.gc = group_commit
        self.checkpoint = checkpoint
        self.flushes = 0

    def run(self) -> None:
        gc = self.gc
        mfq = self.mfq
        while not self.stopped:
            target = gc.next_request(10_000)  # 10 ms, as RocketMQ's waitForRunning(10); > 0 claims the flush
            if target < 0:
                break
            if target == 0:
                self._idle()
                continue
            released = False
            try:
                with mfq.flush_lock:
                    where = mfq.flushed_where
                    mf = mfq.find(where, return_first_on_not_found=where == 0)
                    if mf is None:
                        # nothing written past `where`: the request is already covered
                        released = True
                        gc.done(max(where, gc.flushed))
                        continue
                    # The C loop flushes this segment for this and every later request it covers, without the
                    # GIL, releasing the claim after each flush; it returns when a request needs the next
                    # segment, after 10 ms idle, or once closed.
                    released = True
                    flushed, status, rounds = gc.serve(mf, target, 10_000)
                    mfq.flushed_where = flushed
                    if mf.flushed_store_timestamp:
                        mfq.store_timestamp = mf.flushed_store_timestamp
            except OSError as e:
                # serve failed the group commit (its waiters answer FLUSH_DISK_TIMEOUT at once, no request is
                # handed out again); the commit log refuses puts from now on
                mfq.report_sync_failure(e)
                _log_failure(self, e, "flushing the commit log")
                self._stopped.wait(0.01)
                continue
            except StoreClosedError:
                break  # the segment was closed under us: the store is closing (serve gave the claim back)
            finally:
                if not released:
                    gc.done(gc.flushed)
            self.flushes += rounds
            ts = mfq.store_timestamp
            if ts > 0:
                self.checkpoint.physic_msg_timestamp = ts
            if status < 0:
                break

    def _idle(self) -> None:
        """Puts that flushed for themselves (group leaders) leave the queue's flushed position and the
        checkpoint behind: catch up (their pages are clean, so the msync is cheap). Also keeps the range ahead of
        the log written and flushed (``prepare_ahead``)."""
        mfq = self.mfq
        if mfq.sync_failure is not None:
            return
        # both sync the segment a group leader may be fdatasyncing: they claim the group commit first (no leader
        # runs meanwhile), and a failure fails it before the claim is given back. A sync beside a leader's could
        # report (and so consume) the error of pages a put wrote while the leader's succeeded and acknowledged
        # them (tests/test_fault_sweep.py: SYNC_FLUSH EIO, acknowledged messages lost)
        gc = self.gc
        gc.pause()
        try:
            prepare_ahead(mfq.last(), self, mfq)
            if mfq.flushed_where >= mfq.max_offset():
                return
            try:
                mfq.flush_to(gc.flushed)
            except OSError as e:
                _log_failure(self, e, "flushing the commit log")
                return
        finally:
            gc.done(gc.flushed)
        ts = mfq.store_timestamp
        if ts > 0:
            self.checkpoint.physic_msg_timestamp = ts

    def on_shutdown(self) -> None:
        # the store flushes and publishes before it stops this service; close() releases any waiter left
        if not self.gc.close():
            self.errors += 1
            log.error("%s: a flush was still running 10 s after close began", self.name)


class CommitRealTimeService(ServiceThread):
    """Transient store pool: every ``commit_interval_commit_log`` ms copy at least
    ``commit_commit_log_least_pages`` pages of write-buffered records into the file (everything every
    ``commit_commit_log_thorough_interval`` ms), make them visible to readers and the dispatcher, and wake the
    flush service. Until committed, records exist only in process memory (see the durability table).
    """

    def __init__(self, mfq, config, on_committed: Callable[[], None]):
        super().__init__("CommitRealTimeService")
        self.mfq = mfq
        self.config = config
        self.on_committed = on_committed
        self.commits = 0
        self._thorough = _Thorough(config.commit_commit_log_thorough_interval)

    def run(self) -> None:
        c = self.config
        while not self.stopped:
            self.wait_for_running(c.commit_interval_commit_log)
            if self.stopped:
                break
            self.commit_once(self._thorough.least_pages(c.commit_commit_log_least_pages))
        for _ in range(SHUTDOWN_FLUSH_RETRIES):
            if self.mfq.commit(0):
                break

    def commit_once(self, least_pages: int) -> bool:
        """One pass; returns True when something was committed."""
        did = False
        try:
            while not self.mfq.commit(least_pages):
                did = True
                # a full segment was finished: continue into the next one in the same pass
                if self.mfq.committed_where % self.mfq.file_size:
                    break
        except OSError as e:
            self.errors += 1
            self.last_error = e
            log.error("%s: commit failed: %s", self.name, e)
        if did:
            self.commits += 1
            self.on_committed()
        return did


class FlushConsumeQueueService(ServiceThread):
    """Flushes every ConsumeQueue each ``flush_interval_consume_queue`` ms (at least
    ``flush_consume_queue_least_pages`` dirty pages), everything every ``flush_consume_queue_thorough_interval``
    ms; after a thorough pass the checkpoint's logical timestamp moves and the checkpoint file is synced.

    With ``take_cut`` and ``write_cut`` (an exclusive store: its running queue snapshot, store/queue_snapshot.py),
    a thorough pass takes a cut of the queues before it flushes them and writes it once everything the cut holds is
    flushed: its units by that pass, its records in the commit log by the log's flush (``write_cut`` returns False
    while the log is not flushed that far: the cut is kept and offered again after each later pass). The first pass
    after the start is a thorough one, so that a crash soon after an open finds a cut.
    """

    def __init__(
        self,
        queues: Callable[[], Iterable],
        config,
        checkpoint,
        flush_checkpoint: Callable[[], None],
        sync_names: Callable[[], int] = lambda: 0,
        logics_floor: Callable[[], int] = lambda: 0,
        take_cut: Optional[Callable[[], Any]] = None,
        write_cut: Optional[Callable[[Any], bool]] = None,
        cut_due: Callable[[], bool] = lambda: False,
    ):
        super().__init__("FlushConsumeQueueService")
        # the store time of the first record whose unit waits in memory for its queue's first file (0: none,
        # ReputCore.pending_store_ts): the checkpoint claims only what is before it
        self.logics_floor = logics_floor
        self.queues = queues
        # makes the names of queue files created since the last pass durable (ConsumeQueueTable.sync_names)
        self.sync_names = sync_names
        self.config = config
        self.checkpoint = checkpoint
        self.flush_checkpoint = flush_checkpoint
        self.flushes = 0
        self.take_cut = take_cut
        self.write_cut = write_cut
        self.cut_due = cut_due  # asked before each pass: True makes it a thorough one (its cut taken)
        self._cut: Any = None  # a cut whose units are flushed, waiting for the log's flush to pass it
        self._thorough = _Thorough(config.flush_consume_queue_thorough_interval)
        if take_cut is not None:
            self._thorough.last -= config.flush_consume_queue_thorough_interval  # the first pass is thorough

    def run(self) -> None:
        c = self.config
        while not self.stopped:
            self.wait_for_running(c.flush_interval_consume_queue)
            if self.stopped:
                break
            if self.cut_due():
                self._thorough.last = -c.flush_consume_queue_thorough_interval
            self.flush_once(self._thorough.least_pages(c.flush_consume_queue_least_pages))

    def flush_once(self, least_pages: int) -> None:
        logics_ts = 0
        try:
            # taken before the pass: the pass flushes every unit the cut's states count
            cut = self.take_cut() if least_pages == 0 and self.take_cut is not None else None
            if cut is not None:
                self._cut = None  # replaced by this one once the pass below flushed its units
            floor = self.logics_floor()
            for cq in list(self.queues()):
                if self.stopped:
                    # a close stops the service and flushes every queue itself (_flush_all): a pass over 100,000
                    # dirty queues (an fdatasync each for files the budget unmapped) took longer than the stop waits
                    return
                ts = cq.last_store_timestamp  # read before the flush: only what the flush covers may be claimed
                cq.flush(least_pages)
                if cut is not None:  # every file the cut counts units in, not only the one the flush was at
                    for _ in range(len(cq.mapped_file_queue.files)):
                        if cq.flush(0):
                            break
                if ts > logics_ts:
                    logics_ts = ts
            self.flushes += 1
            if least_pages == 0:
                # the files whose times were claimed above existed before this: their names are durable after it
                self.sync_names()
                # waiting units before the pass and after it (a unit that started waiting during the pass may be
                # older than a time read from a queue after it)
                floors = [f for f in (floor, self.logics_floor()) if f > 0]
                if floors:
                    logics_ts = min(logics_ts, min(floors) - 1)
                if logics_ts:
                    self.checkpoint.logics_msg_timestamp = logics_ts
                self.flush_checkpoint()
                if cut is not None:
                    self._cut = cut
            if self._cut is not None and self.write_cut is not None and self.write_cut(self._cut):
                self._cut = None
        except OSError as e:
            _log_failure(self, e, "flushing consume queues")


class SharedGroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit of a store shared between processes, run by the housekeeper. The loop is
    ``CommitLog.serve_shared_flush`` (C, without the GIL, so the housekeeper's other Python threads cannot delay
    a flush): it sleeps on the control file's "flush requested" eventcount, gathers the puts of every process that
    wait for their flush, fdatasyncs the segment once for all of them, publishes the flushed end
    (``CTL_S_FLUSHED``) and wakes them through the "flushed" eventcount. This thread only steps from one segment
    to the next (moving its view to the committed end and flushing the full segments below)."""

    def __init__(self, mfq, ctl, commit_log):
        super().__init__("SharedGroupCommitService")
        self.mfq = mfq
        self.ctl = ctl
        self.commit_log = commit_log
        self.flushes = 0

    def run(self) -> None:
        ctl = self.ctl
        cl = self.commit_log
        mfq = self.mfq
        cl.stop_shared_flush(False)
        while not self.stopped:
            try:
                end = cl.sync_view()
                start = max(ctl.load(CTL_S_FLUSHED), mfq.flushed_where)
                mf = mfq.find(min(start, end))
                if mf is None or mf.file_from_offset + mf.file_size <= start:
                    # the committed end is a segment boundary whose next segment is not written yet (or nothing
                    # is written at all): wait for a request, then look again
                    seen = ctl.flush_requests.seq()
                    if ctl.load(CTL_S_FLUSH_REQ) <= ctl.load(CTL_S_FLUSHED):
                        ctl.flush_requests.wait(seen, 0.05)
                    else:
                        self._publish(mfq.flush_to(end))
                        self._stopped.wait(0.0005)
                    continue
                if mfq.flushed_where < mf.file_from_offset:
                    mfq.flush_to(mf.file_from_offset)  # full segments below (after a roll or a takeover)
                with mfq.flush_lock:
                    try:
                        flushed, status, rounds = cl.serve_shared_flush(mf, 50_000)
                    except OSError as e:
                        if mf.sync_error:  # never retried: nothing is published from it again
                            mfq.report_sync_failure(e)
                        raise
                    if flushed > mfq.flushed_where:
                        mfq.flushed_where = flushed
                self.flushes += rounds
            except OSError as e:
                _log_failure(self, e, "flushing the commit log (waiting puts will time out)")
                self._stopped.wait(0.01 if self.mfq.sync_failure is None else 0.1)
                continue
            except StoreClosedError:
                break
            if status < 0:
                break

    def _publish(self, flushed: int) -> None:
        ctl = self.ctl
        if flushed > ctl.load(CTL_S_FLUSHED):
            ctl.store(CTL_S_FLUSHED, flushed)
        ctl.flushed_events.notify()

    def on_shutdown(self) -> None:
        self.commit_log.stop_shared_flush(True)  # also wakes the loop
