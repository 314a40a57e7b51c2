"""ScheduleMessageService: delivers delayed messages from SCHEDULE_TOPIC_XXXX to their real topic when due."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from localmq.config import SCHEDULE_TOPIC
from localmq.errors import InvalidDelayError
from localmq.layout import CONFIG_DIR
from localmq.services.service_thread import ServiceThread
from localmq.status import PutStatus
from localmq.store.commit_log import PutExtra
from localmq.store.config_json import read_config_json, write_config_json

log = logging.getLogger("localmq.services")

DELAY_OFFSET_FILE = "delayOffset.json"
POLL_MS = 100  # RocketMQ's DELAY_FOR_A_WHILE: a level is looked at again after 100 ms when nothing is due
# after an open: how many units of a real queue past a schedule record are looked at for its earlier re-put
SCAN_UNITS = 65536


def read_delay_offsets(path: str, on_bad_entry: Optional[Callable[[Any, Any], None]] = None) -> Dict[int, int]:
    """{delay level: next unit of SCHEDULE_TOPIC_XXXX to deliver} of delayOffset.json (or its backup); {} when there
    is none. An entry that is not a pair of integers is skipped (``on_bad_entry(key, value)`` is told of it): its
    level then starts from the beginning of its queue. Raises CorruptStoreError or OSError when the file is unusable."""
    doc = read_config_json(path, default=None)
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    out: Dict[int, int] = {}
    for k, v in (table if isinstance(table, dict) else {}).items():
        try:
            out[int(k)] = int(v)
        except (TypeError, ValueError):
            if on_bad_entry is not None:
                on_bad_entry(k, v)
    return out


def level_for_delay(levels_ms: Tuple[int, ...], seconds: float) -> int:
    """The smallest level whose delay is >= ``seconds`` (so a message is never delivered before it asked).

    :raises InvalidDelayError: for a negative or non-numeric delay, or one longer than the largest level.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise InvalidDelayError(f"delay must be a number of seconds >= 0, not {seconds!r}")
    want = seconds * 1000.0
    for i, ms in enumerate(levels_ms):
        if ms >= want:
            return i + 1
    raise InvalidDelayError(
        f"delay {seconds} s is longer than the largest delay level ({len(levels_ms)}: {levels_ms[-1] / 1000} s)"
    )


def delay_rewrite(
    topic: str, queue_id: int, properties: Optional[Dict[str, str]], level: Any, max_level: int
) -> Tuple[str, int, Dict[str, str]]:
    """RocketMQ's store-side delay rewrite (CommitLog.asyncPutMessage): clamp the level to ``max_level``, add
    DELAY (the clamped level), REAL_TOPIC and REAL_QID to the properties, and send to SCHEDULE_TOPIC_XXXX queue
    level - 1. Returns (topic, queue id, properties); ``properties`` is not modified.

    :raises InvalidDelayError: for a level that is not an int >= 1.
    """
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise InvalidDelayError(f"delay_level must be an int >= 1, not {level!r}")
    level = min(level, max_level)
    props = dict(properties or ())
    props["DELAY"] = str(level)
    props["REAL_TOPIC"] = topic
    props["REAL_QID"] = str(queue_id)
    return SCHEDULE_TOPIC, level - 1, props


class ScheduleMessageService(ServiceThread):
    """RocketMQ's ScheduleMessageService (4.9, sync delivery) in one thread for every level.

    For each level it reads the units of SCHEDULE_TOPIC_XXXX queue level - 1 from the level's offset; a unit is
    due at its record's store time + the level's delay (the ConsumeQueue tags code holds the same value for
    RocketMQ's default levels; the record is used so that any ``message_delay_level`` is honoured). A due
    message is put again to REAL_TOPIC / REAL_QID with the schedule record's properties unchanged (DELAY,
    REAL_TOPIC and REAL_QID stay, as in RocketMQ), then the offset moves past it. Levels are FIFO, so the first
    unit not yet due ends a level's pass. The thread sleeps until the next due time, at most POLL_MS.

    Offsets persist in ``<root>/config/delayOffset.json`` (``{"offsetTable":{1:N,...}}``, N the next unit to
    examine) when an offset moved and ``flush_interval_ms`` have passed on ``clock`` since the previous write:
    checked before each re-put and at the end of each pass (the thread wakes for a write held back; 0: a write
    after every re-put), and at shutdown. Each write first flushes the commit log
    (``flush_log``), so an offset on disk never covers a re-put that is not: nothing is lost, after a power cut too.
    What was re-put after the last completed write (the deliveries of one ``flush_interval_ms``) is not delivered
    again: after an open, each due unit of a level is first looked for in its real queue (``_delivered_before``:
    a record after it in the log with its body, flag, born timestamp and host and properties), until the first
    one that is not there (RocketMQ delivers them again). RocketMQ writes the file every 10 s
    (``flushDelayOffsetInterval``); localmq's default is 100 ms (StoreConfig.flush_delay_offset_interval), so that
    the look-up after an open covers 100 ms of deliveries, not 10 s, at a cost of at most 10 writes (a commit log
    flush and 3 fsyncs) a second while deliveries flow and none while they do not. A re-put more than
    ``SCAN_UNITS`` units past its schedule record in a busy real queue is not found: that message comes twice.

    Params: ``levels_ms`` the delay of each level; ``find_cq(topic, queue_id)`` -> ConsumeQueue or None;
    ``read(physical_offset)`` -> Message or None; ``put(topic, body, queue_id=, flag=, extra=)`` (the store's
    ``put_ext``) -> PutResult; ``flush_log()``; ``clock()`` -> ms since the epoch.
    """

    def __init__(
        self,
        root: str,
        levels_ms: Tuple[int, ...],
        find_cq: Callable[[str, int], Any],
        read: Callable[[int], Any],
        put: Callable[..., Any],
        flush_log: Callable[[], None],
        flush_interval_ms: int = 100,
        clock: Optional[Callable[[], int]] = None,
    ):
        super().__init__("ScheduleMessageService")
        self.path = os.path.join(root, CONFIG_DIR, DELAY_OFFSET_FILE)
        self.levels_ms = tuple(levels_ms)
        self.max_level = len(self.levels_ms)
        self._find_cq = find_cq
        self._read = read
        self._put = put
        self._flush_log = flush_log
        self._flush_interval_ms = flush_interval_ms
        self._clock = clock or (lambda: int(time.time() * 1000))
        # offsets: touched by the service thread; persist() may also run from close() after the thread ended
        self._lock = threading.Lock()
        self.offsets: Dict[int, int] = self._load()
        self._dirty = False
        self._last_persist = self._clock()  # on ``clock``, as the due times: a test's fake clock drives both
        self._persist_every_ms = flush_interval_ms  # 10 s after a failed write (RocketMQ's back-off)
        self.persists = 0
        # levels whose offset came from delayOffset.json and whose next units may have been re-put already (after
        # the file's last write, before a crash): each due unit is first looked for in its real queue
        self._unconfirmed = set(range(1, self.max_level + 1))
        self._found_after: Dict[Tuple[str, int], int] = {}  # real queue -> index after the last re-put found
        self.redeliveries_avoided = 0
        self.delivered = 0
        self.skipped = 0
        self.put_failures = 0

    def _load(self) -> Dict[int, int]:
        return read_delay_offsets(self.path, lambda k, v: log.warning("%s: ignoring entry %r: %r", self.path, k, v))

    def run(self) -> None:
        while not self.stopped:
            wait_ms = POLL_MS
            try:
                next_due = self.deliver_due()
                if next_due is not None:
                    wait_ms = max(1, min(POLL_MS, next_due - self._clock()))
                hold = self._persist_if_due()
                if hold > 0:
                    wait_ms = max(1, min(wait_ms, hold))  # wake for the write held back
            except Exception as e:  # noqa: BLE001 - logged, counted, retried after RocketMQ's 10 s back-off
                self.errors += 1
                self.last_error = e
                log.exception("service %s: delivery failed", self.name)
                wait_ms = 10_000
            self.wait_for_running(wait_ms)

    def deliver_due(self) -> Optional[int]:
        """One pass over every level: deliver what is due. Returns the earliest deliver time (ms) not yet due,
        or None when no level holds a pending message."""
        next_due: Optional[int] = None
        for level in range(1, self.max_level + 1):
            if self.stopped:
                break
            due = self._deliver_level(level)
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        return next_due

    def _deliver_level(self, level: int) -> Optional[int]:
        cq = self._find_cq(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return None
        delay = self.levels_ms[level - 1]
        off = min(max(self.offsets.get(level, 0), cq.min_offset), cq.max_offset)
        while off < cq.max_offset and not self.stopped:
            unit = cq.unit(off)
            m = self._read(unit[0]) if unit is not None else None
            if m is None or m.topic != SCHEDULE_TOPIC:
                log.warning("%s: no schedule record for unit %d of level %d; skipped", self.name, off, level)
                self.skipped += 1
                off += 1
                self._advance(level, off)
                continue
            now = self._clock()
            deliver = m.store_timestamp + delay
            if deliver > now + delay:  # the clock went back: RocketMQ delivers now rather than wait a long time
                deliver = now
            if deliver > now:
                return deliver
            self._persist_if_due()  # a long pass (a backlog) writes every interval too, before its next re-put
            if level in self._unconfirmed:
                if self._delivered_before(m, unit[0]):
                    self.redeliveries_avoided += 1
                    off += 1
                    self._advance(level, off)
                    continue
                # not re-put: neither was any later unit of this level (a level's re-puts go to the log in order,
                # and recovery keeps a prefix of the log)
                self._unconfirmed.discard(level)
            if not self._deliver(m, level, off):
                return now + POLL_MS  # the put failed (a full disk): this unit again later
            off += 1
            self._advance(level, off)
        return None

    def _delivered_before(self, m: Any, sched_offset: int) -> bool:
        """Whether the schedule record ``m`` (at commit log offset ``sched_offset``) was re-put before the store was
        last closed or cut: a record in its real queue after it in the log, with its body, flag, born timestamp,
        born host and properties, and after the last re-put found there (one re-put per schedule record, also for
        identical messages). Looks at most ``SCAN_UNITS`` units of the real queue."""
        props = m.properties
        topic = props.get("REAL_TOPIC")
        try:
            qid = int(props.get("REAL_QID", ""))
        except ValueError:
            return False
        cq = self._find_cq(topic, qid) if topic else None
        if cq is None:
            return False
        lo, hi = max(cq.min_offset, self._found_after.get((topic, qid), 0)), cq.max_offset
        while lo < hi:  # the first unit past the schedule record: a queue's units go up the log
            mid = (lo + hi) // 2
            u = cq.unit(mid)
            if u is not None and u[0] <= sched_offset:
                lo = mid + 1
            else:
                hi = mid
        for i in range(lo, min(cq.max_offset, lo + SCAN_UNITS)):
            u = cq.unit(i)
            r = self._read(u[0]) if u is not None else None
            if (
                r is not None
                and r.body == m.body
                and r.born_timestamp == m.born_timestamp
                and r.flag == m.flag
                and r.born_host == m.born_host
                and r.raw_properties == m.raw_properties
            ):
                self._found_after[(topic, qid)] = i + 1
                return True
        return False

    def _deliver(self, m: Any, level: int, off: int) -> bool:
        props = m.properties
        real_topic = props.get("REAL_TOPIC")
        try:
            real_qid = int(props.get("REAL_QID", ""))
        except ValueError:
            real_qid = -1
        if not real_topic or real_qid < 0:
            log.warning("%s: unit %d of level %d has no REAL_TOPIC/REAL_QID; skipped", self.name, off, level)
            self.skipped += 1
            return True
        # RocketMQ's messageTimeup: body, flag, sysflag, born timestamp and host and reconsume times copied, and
        # the schedule record's properties string unchanged (DELAY, REAL_TOPIC, REAL_QID, WAIT stay); a DELAY on a
        # topic other than SCHEDULE_TOPIC_XXXX is inert here
        extra = PutExtra(
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
            raw_properties=m.raw_properties,
        )
        r = self._put(real_topic, m.body if m.body is not None else b"", queue_id=real_qid, flag=m.flag, extra=extra)
        if r.status is not PutStatus.PUT_OK:
            self.put_failures += 1
            log.warning("%s: re-put of level %d unit %d answered %s; retrying", self.name, level, off, r.status.name)
            return False
        self.delivered += 1
        return True

    def _advance(self, level: int, off: int) -> None:
        with self._lock:
            self.offsets[level] = off
            self._dirty = True

    def _persist_if_due(self) -> int:
        """Write the offsets if they moved and the interval has passed since the previous write (a clock that went
        back allows it). Returns the ms until a write held back is due, 0 when none is. A failed write is logged
        and counted and tried again 10 s later; deliveries go on meanwhile (nothing is lost; the window an open
        looks up for re-puts, ``_delivered_before``, widens until a write succeeds)."""
        if not self._dirty:
            return 0
        elapsed = self._clock() - self._last_persist
        if 0 <= elapsed < self._persist_every_ms:
            return self._persist_every_ms - elapsed
        try:
            self.persist()
        except Exception as e:  # noqa: BLE001 - logged and counted; the offsets stay dirty for the next try
            self.errors += 1
            self.last_error = e
            log.exception("service %s: writing %s; tried again in 10 s", self.name, self.path)
            self._persist_every_ms = max(self._flush_interval_ms, 10_000)
            return self._persist_every_ms
        self._persist_every_ms = self._flush_interval_ms
        return 0

    def persist(self) -> None:
        """Flush the commit log (the re-puts), then write delayOffset.json (RocketMQ's format).

        :raises OSError: when the flush or the write fails (the offsets stay marked as not written).
        """
        with self._lock:
            table = dict(sorted(self.offsets.items()))
            self._dirty = False
        self._last_persist = self._clock()
        try:
            self._flush_log()
            write_config_json(self.path, {"offsetTable": table})
        except BaseException:
            with self._lock:
                self._dirty = True
            raise
        self.persists += 1

    def on_exit(self) -> None:
        if self._dirty and not self._forked:
            try:
                self.persist()
            except Exception as e:  # noqa: BLE001 - logged and counted; the next open looks the re-puts up
                self.errors += 1
                self.last_error = e
                log.exception("service %s: writing %s", self.name, self.path)

    def stats(self) -> Dict[str, Any]:
        return {
            "delivered": self.delivered,
            "skipped": self.skipped,
            "put_failures": self.put_failures,
            "redeliveries_avoided": self.redeliveries_avoided,
            "offsets": dict(self.offsets),
            "persists": self.persists,
            "errors": self.errors,
        }
