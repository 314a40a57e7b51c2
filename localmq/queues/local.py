"""LocalMessageQueue: the public face of a RocketMQ-compatible store (puts, gets, offsets, lookups, waits).

The store's life cycle (open, recovery, the services, close) is DefaultMessageStore's (queues/message_store.py);
the format, the put and get paths and recovery live in the store modules it calls.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from localmq._record import Message, decode_message_id, java_hash
from localmq.config import check_topic, parse_delay_levels
from localmq.errors import (
    ArgumentRangeError,
    ArgumentTypeError,
    DispatchError,
    IndexDisabledError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidQueueIdError,
    StoreClosedError,
    check_int_range,
)
from localmq.layout import (
    CONFIG_DIR,
    CQ_BLANK_UNIT_SIZE,
    MAX_QUEUE_ID,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
)
from localmq.queues.base import ProcessBoundMixin, QueueClientsMixin, tag_names
from localmq.queues.message_store import DefaultMessageStore
from localmq.status import GetBodiesResult, GetResult, GetStatus
from localmq.store import get
from localmq.store.commit_log import CommitLogFront, PutExtra
from localmq.store.consume_queue import ConsumeQueue
from localmq.store.index import IndexService
from localmq.store.put_result import PutResult

log = logging.getLogger("localmq.store")

MAX_GET_MESSAGES = (1 << 31) - 1  # the largest max_messages of get_message (an int32 in the compiled get path)

_MAX_TS = (1 << 63) - 1
_HEX_RE = re.compile(r"[0-9A-Fa-f]+")
_BAD_KEY_RE = re.compile("[ \x01\x02]")


class LocalMessageQueue(ProcessBoundMixin, QueueClientsMixin, DefaultMessageStore, CommitLogFront):
    """The default localmq store: every topic appends to one CommitLog; a dispatch thread builds a ConsumeQueue
    per (topic, queue id); consumers pull by queue offset. Files are RocketMQ 4.x compatible.

    Thread-safety: ``put``/``put_batch`` may be called from any number of threads (one put lock);
    ``get_message`` and the offset queries from any thread concurrently with puts. ``close`` must not race
    with calls still in progress on other threads (they get StoreClosedError once it has started).

    Producers and consumers: ``create_producer()``, ``create_consumer(group, topics)``, ``consumer_lag(group)``
    (localmq.client; committed offsets in ``config/consumerOffset.json``).

    Use ``localmq.open(path, **config)``; see StoreConfig for the settings. Keyword-only ``clock`` (() -> ms
    since the epoch) and ``disk_usage`` (path -> used ratio 0..1) replace the wall clock and statvfs for
    retention (``clean_service``, see localmq.services.clean), so tests can use a fake clock and a full disk.
    """

    # -- durability before the clients' offsets -----------------------------------------------------------------

    def flush_before_offsets(self) -> None:
        """Make every message a consumer may have read durable: commit and flush the commit log. The clients'
        ConsumerOffsetManager calls it before each write of ``consumerOffset.json``, so that after a power cut no
        committed offset is ahead of the messages that survived (ASYNC_FLUSH acknowledges, and the dispatcher
        hands out, messages before they are flushed). Raises OSError when the flush fails."""
        self._check_open()
        self._flush_log()

    # -- index (IndexService: query by key, look up by message id) ----------------------------------------------

    def _index_stats(self) -> Optional[Dict[str, Any]]:
        if self.index_service is None:
            return None
        out = self.index_service.stats()
        d = self._index_dispatch
        if d is not None:
            out.update(d.stats())
            out["behind_bytes"] = max(0, self._cl_mfq.max_offset() - d.indexed_offset) if not self._closed else 0
        return out

    def _require_index(self) -> IndexService:
        self._check_open()
        if self.index_service is None:
            raise IndexDisabledError("the message index is disabled (message_index_enable=False)")
        return self.index_service

    def wait_for_index(self, timeout: Optional[float] = None) -> bool:
        """Block until every message put before this call is indexed (its keys can be queried).

        Returns True, or False when ``timeout`` seconds passed first. Raises IndexDisabledError,
        DispatchError when the index thread stopped on an error, StoreClosedError.
        """
        self._require_index()
        d = self._index_dispatch
        if self._pool is not None:
            self._cl_mfq.commit_all()  # write-buffered records reach readers when committed
        if d.wait_for(self._cl_mfq.max_offset(), timeout):
            return True
        if d.error is not None:
            raise DispatchError.stopped(d.error, "the index service stopped") from d.error
        if not d.alive:
            raise DispatchError("the index service is not running")
        return False

    def query_message(
        self, topic: str, key: str, max_num: Optional[int] = None, begin_ms: int = 0, end_ms: Optional[int] = None
    ) -> List[Any]:
        """Messages of ``topic`` whose KEYS (space-separated) hold ``key`` or whose UNIQ_KEY is ``key``, stored
        within [begin_ms, end_ms] (ms; ``end_ms`` None: no upper bound).

        The index finds candidates by hash (RocketMQ's walk, newest first); each is read from the log and kept
        only on an exact match of topic, key and store time, so hash collisions never show. Returns at most
        ``max_num`` (default ``default_query_max_num``, 32) Messages, the newest matches, in log order. Messages
        put since the index last caught up are missing until it does (``wait_for_index``).
        Raises InvalidTopicError, InvalidPropertyError (an empty key, or one with a space), ValueError
        (max_num < 1, begin after end), IndexDisabledError, StoreClosedError.
        """
        self._require_index()
        check_topic(topic)
        if not isinstance(key, str) or not key or _BAD_KEY_RE.search(key) is not None:
            raise InvalidPropertyError(f"a key is a non-empty str without spaces or 0x01/0x02, not {key!r}")
        if max_num is None:
            max_num = self.config.default_query_max_num
        end = _MAX_TS if end_ms is None else int(end_ms)
        if max_num < 1:
            raise ValueError("max_num must be at least 1")
        if begin_ms > end:
            raise ValueError("begin_ms is after end_ms")
        return self._query_index(topic, key, max_num, int(begin_ms), end, False)

    def _query_index(self, topic: str, key: str, max_num: int, begin: int, end: int, uniq_only: bool) -> List[Any]:
        mfq = self._cl_mfq
        return self.index_service.query_messages(mfq.files, mfq.file_size, topic, key, max_num, begin, end, uniq_only)

    def look_message_by_id(self, msg_id: str, topic: Optional[str] = None):
        """The message with this id, or None.

        ``msg_id``: an offset message id (``PutResult.msg_id``, ``Message.msg_id``: store host + physical offset,
        32 or 56 hex digits), read at its offset and checked against the record; otherwise it is taken as a
        client UNIQ_KEY and looked up in the index, in ``topic`` or, when None, in every topic.
        Raises InvalidMessageIdError (not 32 or 56 hex digits), InvalidTopicError, StoreClosedError.
        """
        self._check_open()
        if not isinstance(msg_id, str) or len(msg_id) not in (32, 56) or _HEX_RE.fullmatch(msg_id) is None:
            raise InvalidMessageIdError(f"a message id is 32 or 56 hex digits, not {msg_id!r}")
        if topic is not None:
            check_topic(topic)
        mid = msg_id.upper()
        _, off = decode_message_id(mid)
        if 0 <= off:
            m = self.look_message_by_offset(off)
            if m is not None and m.physical_offset == off and m.msg_id == mid and (topic is None or m.topic == topic):
                return m
        if not self.config.message_index_enable:
            return None
        topics = [topic] if topic is not None else self._written_topics()
        for t in topics:
            for k in dict.fromkeys((msg_id, mid)):
                found = self._query_index(t, k, 1, 0, _MAX_TS, True)
                if found:
                    return found[0]
        return None

    def _find_transaction_commit(self, half: Message) -> Optional[Message]:
        """The committed record (sysflag COMMIT, in REAL_TOPIC) of the transaction of half record ``half`` or of
        any copy of it (they share its UNIQ_KEY), or None. Looks up ``<REAL_TOPIC>#<UNIQ_KEY>`` in the index once it
        has caught up with the log; with the index disabled, scans the real queue from the half's born time.
        Raises DispatchError when the index or the dispatcher cannot catch up (the caller must not guess)."""
        props = half.properties
        key, topic = half.uniq_key, props.get("REAL_TOPIC")
        if not key or not topic:
            return None

        def committed(m: Any) -> bool:
            return (
                m.topic == topic
                and m.uniq_key == key
                and (m.sys_flag & SYSFLAG_TRANSACTION_MASK) == SYSFLAG_TRANSACTION_COMMIT
            )

        if self.config.message_index_enable:
            if not self.wait_for_index(60.0):
                raise DispatchError("the index did not catch up within 60 s: a commit cannot be looked up")
            found = self._query_index(topic, key, self.config.default_query_max_num, 0, _MAX_TS, True)
            return next((m for m in found if committed(m)), None)
        if not self.wait_for_dispatch(60.0):
            raise DispatchError("dispatch did not catch up within 60 s: a commit cannot be looked up")
        try:
            qid = int(props.get("REAL_QID", ""))
        except ValueError:
            return None
        off = self.offset_by_time(topic, qid, half.born_timestamp)
        while True:
            r = self.get_message(topic, qid, off)
            if r.status is not GetStatus.FOUND:
                return None
            for m in r.messages:
                if committed(m):
                    return m
            off = r.next_begin_offset

    def _written_topics(self) -> List[str]:
        """Every topic written (the put path's table, filled from the ConsumeQueues at open), not only those the
        ConsumeQueue dispatcher has reached yet."""
        return sorted({t for t, _ in self.commit_log.topic_table()} | {t for t, _ in self._cqs})

    # -- context manager ----------------------------------------------------------------------------------------

    def __enter__(self) -> "LocalMessageQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    # -- put ----------------------------------------------------------------------------------------------------

    # put and put_batch: CommitLogFront's compiled methods (store/commit_log.pyx), which hand their arguments to
    # self.commit_log at C level

    # -- dispatch -----------------------------------------------------------------------------------------------

    def wait_for_dispatch(self, timeout: Optional[float] = None) -> bool:
        """Block until every message put before this call is in its ConsumeQueue.

        Returns True, or False when ``timeout`` seconds passed first. Raises DispatchError when the dispatcher
        stopped on an error, StoreClosedError when the store is closed.
        """
        self._check_open()
        if self._pool is not None:
            # write-buffered records reach readers when committed: commit them now rather than wait for the service
            self._cl_mfq.commit_all()
        target = self._cl_mfq.max_offset()
        return self._wait_dispatched(target, timeout)

    def _wait_dispatched(self, target: int, timeout: Optional[float], *, unless_blocked: bool = False) -> bool:
        """Wait until the dispatcher passed ``target``; False after ``timeout`` (or, with ``unless_blocked``, as soon
        as it waits for disk space: close() does not wait for space that may never come)."""
        core = self._reput
        if core.reput_offset >= target:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        cond = core.cond
        with cond:
            core.waiters += 1
            try:
                core.wake()
                while core.reput_offset < target:
                    if core.error is not None:
                        raise self._dispatch_stopped(core.error) from core.error
                    if self._closed:
                        raise StoreClosedError("the store was closed while waiting")
                    if not self._reput_service.alive and core.reput_offset < target:
                        raise self._dispatch_stopped(core.error, "the dispatch service is not running") from core.error
                    if unless_blocked and core.blocked is not None:
                        return False
                    wait = 0.05
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        wait = min(wait, left)
                    cond.wait(wait)
            finally:
                core.waiters -= 1
        return True

    # -- long polling (the clients' MessageStore interface) -------------------------------------------------------

    @property
    def progress(self) -> int:
        """The dispatched commit log offset: it grows whenever messages become readable in their ConsumeQueues."""
        return self._reput.reput_offset

    def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        """Long polling: block until the dispatcher has made messages readable past ``since`` (a ``progress``
        value; default its value now), ``timeout`` seconds pass or ``wake_waiters`` is called. Returns ``progress``.

        Wakes on the dispatcher's notification (ReputCore ``cond``, notified after progress while ``waiters`` > 0),
        so a message put while a consumer waits reaches it within milliseconds. Raises StoreClosedError when the
        store is (or gets) closed, DispatchError when the dispatcher stopped on an error.
        """
        self._check_open()
        core = self._reput
        if since is None:
            since = core.reput_offset
        cur = core.reput_offset
        if cur > since:
            return cur
        deadline = None if timeout is None else time.monotonic() + timeout
        cond = core.cond
        with cond:
            core.waiters += 1
            wakes = self._wakes
            try:
                while True:
                    cur = core.reput_offset
                    if cur > since or self._wakes != wakes:
                        break
                    if core.error is not None:
                        raise self._dispatch_stopped(core.error) from core.error
                    if self._closed:
                        raise StoreClosedError("the store was closed while waiting")
                    # bounded slices: the loop re-checks even if a notification raced with the waiter count
                    wait = 0.05
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        wait = min(wait, left)
                    cond.wait(wait)
            finally:
                core.waiters -= 1
        return cur

    _wakes = 0  # generation of wake_waiters() calls (guarded by the dispatcher's cond)

    def wake_waiters(self) -> None:
        """Make every thread in ``wait_for_new_messages`` return now (a consumer closed from another thread uses
        it to end its poll at once)."""
        core = self._reput
        with core.cond:
            self._wakes = self._wakes + 1
            core.cond.notify_all()

    @property
    def offset_store_path(self) -> str:
        """``<root>/config/consumerOffset.json``: committed consumer offsets (RocketMQ's format; retention reads it)."""
        return os.path.join(self.root, CONFIG_DIR, "consumerOffset.json")

    @property
    def dispatch_behind_bytes(self) -> int:
        return max(0, self._cl_mfq.max_offset() - self._reput.reput_offset)

    # -- get ----------------------------------------------------------------------------------------------------

    def _tag_filter(self, tags: Optional[str]):
        """(tag hash codes, exact names) of a subscription, cached; None for no expression, ((), {}) for all, ((0,),
        {}) for none."""
        if tags is None:
            return None
        f = self._tag_filters.get(tags)
        if f is None:
            names = tag_names(tags)
            if names is None:
                f = ((), frozenset())
            else:
                if len(names) > 64:
                    raise ValueError("at most 64 tags in a subscription")
                # no names (" || "): matches nothing; a hash filter is still needed (an empty one means "all"),
                # and the exact check then refuses every unit the placeholder hash lets through
                f = (tuple(sorted({java_hash(t) for t in names})) or (0,), names)
            if len(self._tag_filters) < 1024:
                self._tag_filters[tags] = f
        return f

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        *,
        tags: Optional[str] = None,
        zero_copy: bool = False,
    ) -> GetResult[Message]:
        """Pull up to ``max_messages`` from (topic, queue) starting at queue offset ``offset``.

        ``tags``: "*" / None for all, or "a || b": units are filtered by tag hash, then by the exact tag.
        Batches also stop at RocketMQ's transfer limits (32 messages / 256 KiB in memory, 8 / 64 KiB on disk).
        ``zero_copy``: bodies are memoryviews of the mapping (they keep it alive) instead of bytes.
        Returns GetResult; its status is one of GetStatus (see the README for next_begin_offset rules).
        Each message is checked against its unit (topic, queue id, queue offset, size) and, with
        ``check_crc_on_read`` (default), its body CRC: a batch ends before a bad unit, and the get that starts at it
        raises CorruptMessageError (its ``next_offset`` skips it; a Consumer does so and counts it).
        Raises StoreClosedError, InvalidQueueIdError, ValueError (max_messages < 1), ArgumentOverflowError
        (max_messages above MAX_GET_MESSAGES), CorruptMessageError.
        """
        # _pull's checks and bounds, inlined: the call costs ~50 instructions per message of a get of 32 (callgrind,
        # perf/read_instructions.py); keep the two in step
        if self._closed:
            raise self._closed_error()
        if type(queue_id) is not int or type(offset) is not int or type(max_messages) is not int:
            # a bad type is a typed error naming the argument, not a comparison failing deep inside
            for name, v in (("queue_id", queue_id), ("offset", offset), ("max_messages", max_messages)):
                if isinstance(v, bool) or getattr(v, "__index__", None) is None:
                    raise ArgumentTypeError(f"{name} must be an int, not {type(v).__name__} {v!r}", name)
        if not isinstance(topic, str):
            raise ArgumentTypeError(f"topic must be a str, not {type(topic).__name__} {topic!r}", "topic")
        if max_messages < 1:
            raise ArgumentRangeError("max_messages must be at least 1", "max_messages")
        check_int_range(max_messages, "max_messages", 1, MAX_GET_MESSAGES)  # a C int below (ArgumentOverflowError)
        cq = self._cq(topic, queue_id)
        if cq is None:
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        mn = cq.min_offset
        mx = cq.max_offset
        if mx == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, mn, mx)
        if offset < mn:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], mn, mn, mx)
        if offset == mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, mn, mx)
        if offset > mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], mx, mn, mx)
        f = self._tag_filter(tags)
        hashes, names = f if f is not None else ((), None)
        mfq = self._cl_mfq
        return get.get_message(
            cq,
            mfq.files,
            mfq.file_size,
            offset,
            max_messages,
            hashes,
            names,
            self._get_limits,
            mfq.max_offset(),
            not zero_copy,
            mn,
            mx,
            self._check_crc_on_read,
        )

    def get_bodies(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 1024,
        *,
        tags: Optional[str] = None,
        fields: Tuple[str, ...] = (),
        max_bytes: int = 4 << 20,
    ) -> GetBodiesResult:
        """``get_message`` for a consumer that wants bodies: up to ``max_messages`` bodies of (topic, queue) from
        queue offset ``offset`` as ``bytes`` (copies: they stay valid whatever happens to the store afterwards,
        retention and close included), and no Message objects.

        ``fields``: names of BODY_FIELDS (``localmq.store.get.BODY_FIELDS``: "queue_offset", "physical_offset",
        "store_timestamp", "born_timestamp", "store_size", "flag", "sys_flag", "reconsume_times", "body_crc",
        "raw_properties", "tags", "properties"); ``result.fields[name]`` is the list of that Message attribute's
        values, parallel to ``result.bodies``. Only what is asked for is built.
        RocketMQ's transfer limits do not apply: a batch stops at ``max_messages``, or before the record that would
        take the records read past ``max_bytes`` (the first message is always returned), or after the 800 units (at
        least ``max_messages``) one get scans. Everything else is ``get_message``'s, over the same arguments: the
        tag filter, the check of each unit against its record and (``check_crc_on_read``) its body CRC, statuses,
        ``next_begin_offset``, ``compressed`` (bodies are returned as stored).
        Returns GetBodiesResult. Raises StoreClosedError, InvalidQueueIdError, ArgumentRangeError (max_messages or
        max_bytes < 1, a name not in BODY_FIELDS), ArgumentOverflowError (max_messages above MAX_GET_MESSAGES),
        ArgumentTypeError, CorruptMessageError.
        """
        if type(fields) is not tuple:
            try:
                if isinstance(fields, (str, bytes)):
                    raise TypeError
                fields = tuple(fields)
            except TypeError:
                raise ArgumentTypeError(
                    f"fields must be a tuple of names, not {type(fields).__name__}", "fields"
                ) from None
        if type(max_bytes) is not int:
            if isinstance(max_bytes, bool) or getattr(max_bytes, "__index__", None) is None:
                raise ArgumentTypeError(f"max_bytes must be an int, not {type(max_bytes).__name__}", "max_bytes")
        if max_bytes < 1:
            raise ArgumentRangeError("max_bytes must be at least 1", "max_bytes")
        pull = self._pull(topic, queue_id, offset, max_messages, tags)
        if type(pull) is tuple:
            return GetBodiesResult(*pull)
        cq, mn, mx, hashes, names = pull
        limits = self._bodies_limits.get(max_bytes)
        if limits is None:
            big = min(max_bytes, 1 << 62)
            limits = get.GetLimits(MAX_GET_MESSAGES, big, MAX_GET_MESSAGES, big, self._get_limits.disk_threshold)
            if len(self._bodies_limits) < 64:
                self._bodies_limits[max_bytes] = limits
        mfq = self._cl_mfq
        return get.get_bodies(
            cq,
            mfq.files,
            mfq.file_size,
            offset,
            max_messages,
            hashes,
            names,
            limits,
            mfq.max_offset(),
            mn,
            mx,
            self._check_crc_on_read,
            fields,
        )

    def _pull(self, topic: str, queue_id: int, offset: int, max_messages: int, tags: Optional[str]):
        """The checks and bounds of a get (get_message has them inlined): (ConsumeQueue, min offset, max offset, tag
        hashes, tag names) when there is something to read at ``offset``, else the (status, [], next_begin_offset,
        min, max) of the answer. Raises as get_message."""
        if self._closed:
            raise self._closed_error()
        if type(queue_id) is not int or type(offset) is not int or type(max_messages) is not int:
            # a bad type is a typed error naming the argument, not a comparison failing deep inside
            for name, v in (("queue_id", queue_id), ("offset", offset), ("max_messages", max_messages)):
                if isinstance(v, bool) or getattr(v, "__index__", None) is None:
                    raise ArgumentTypeError(f"{name} must be an int, not {type(v).__name__} {v!r}", name)
        if not isinstance(topic, str):
            raise ArgumentTypeError(f"topic must be a str, not {type(topic).__name__} {topic!r}", "topic")
        if max_messages < 1:
            raise ArgumentRangeError("max_messages must be at least 1", "max_messages")
        check_int_range(max_messages, "max_messages", 1, MAX_GET_MESSAGES)  # a C int below (ArgumentOverflowError)
        cq = self._cq(topic, queue_id)
        if cq is None:
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
            return (GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        mn = cq.min_offset
        mx = cq.max_offset
        if mx == 0:
            return (GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, mn, mx)
        if offset < mn:
            return (GetStatus.OFFSET_TOO_SMALL, [], mn, mn, mx)
        if offset == mx:
            return (GetStatus.OFFSET_OVERFLOW_ONE, [], offset, mn, mx)
        if offset > mx:
            return (GetStatus.OFFSET_OVERFLOW_BADLY, [], mx, mn, mx)
        f = self._tag_filter(tags)
        hashes, names = f if f is not None else ((), None)
        return [cq, mn, mx, hashes, names]

    # -- offsets & lookups -------------------------------------------------------------------------------------

    def _cq(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        self._check_open()
        return self._cqs.get((topic, queue_id))

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be read in (topic, queue): one past the last dispatched message (0 if none)."""
        cq = self._cq(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        """First queue offset still readable (0 if the queue does not exist)."""
        cq = self._cq(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """Queue offset of the first message stored at or after ``ts_ms`` (by binary search on store times).

        Returns max_offset when every message is older, min_offset when every message is newer, 0 when the
        queue does not exist. (RocketMQ first picks a CQ file by mtime; searching every unit is exact.)
        """
        cq = self._cq(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        files, size = self._cl_mfq.files, self._cl_mfq.file_size
        while lo < hi:
            mid = (lo + hi) // 2
            u = cq.unit(mid)
            ts = -1
            if u is not None and u[1] != CQ_BLANK_UNIT_SIZE:
                ts = get.record_store_timestamp(files, size, u[0])
            if ts < 0 or ts < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    _delay_levels: Optional[Tuple[int, ...]] = None  # parsed on first use

    def delay_levels_ms(self) -> Tuple[int, ...]:
        """The delay of each delay level in ms, level 1 first (``message_delay_level``)."""
        levels = self._delay_levels
        if levels is None:
            levels = self._delay_levels = parse_delay_levels(self.config.message_delay_level)
        return levels

    def put_ext(
        self,
        topic: str,
        body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
        extra: PutExtra,
    ) -> PutResult:
        """A broker-side re-put (retry send-back, delayed delivery, transactions): ``put`` plus the record fields
        in ``extra`` (a PutExtra: sysflag, born timestamp and host, reconsume times, prepared transaction offset,
        optionally the exact properties bytes). Returns and raises as ``put``."""
        cl = self.commit_log
        if cl is None:
            raise StoreClosedError("the store is not open")
        return cl.put_ext(
            topic, body, queue_id=queue_id, tags=tags, keys=keys, properties=properties, flag=flag, extra=extra
        )

    def look_message_by_offset(self, physical_offset: int, *, zero_copy: bool = False):
        """The message stored at commit log offset ``physical_offset``, or None when there is none."""
        self._check_open()
        if physical_offset < 0 or physical_offset >= self._cl_mfq.max_offset():
            return None
        return get.read_record(self._cl_mfq.files, self._cl_mfq.file_size, physical_offset, not zero_copy)

    def consume_queue(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        """The ConsumeQueue of (topic, queue) (numpy scans via ``units()``), or None."""
        return self._cq(topic, queue_id)

    def topics(self) -> Dict[str, List[int]]:
        """{topic: sorted queue ids} of every queue that has a ConsumeQueue."""
        self._check_open()
        out: Dict[str, List[int]] = {}
        for t, q in list(self._cqs):
            out.setdefault(t, []).append(q)
        return {t: sorted(qs) for t, qs in sorted(out.items())}

    @property
    def commit_log_min_offset(self) -> int:
        return self._cl_mfq.min_offset()

    @property
    def commit_log_max_offset(self) -> int:
        return self._cl_mfq.max_offset()

    def commit_log_segments(self) -> List[Tuple[int, memoryview, int]]:
        """[(base offset, read-only memoryview of the whole segment, readable end)] for columnar decoding.

        The views keep their mappings alive until released."""
        self._check_open()
        out = []
        for mf in list(self._cl_mfq.files):
            try:
                out.append((mf.file_from_offset, memoryview(mf), mf.wrote_position))
            except StoreClosedError:
                continue  # retention deleted it after the list was taken
        return out

    def stats(self) -> Dict[str, Any]:
        """Counters of the store and its services."""
        core = self._reput
        return {
            "puts": self.commit_log.puts,
            "put_failures": self.commit_log.put_failures,
            "commit_log_min_offset": self._cl_mfq.min_offset(),
            "commit_log_max_offset": self._cl_mfq.max_offset(),
            "segments": len(self._cl_mfq.files),
            "consume_queues": len(self._cqs),
            # the queues made so far: a queue a queue snapshot vouched for is made on its first use
            "consume_queues_built": len(self._cq_table.built),
            **self._cq_table.mapping_stats(),
            "dispatched": core.dispatched,
            "dispatch_duplicates": core.duplicates,
            # ConsumeQueue file steps the dispatcher reserved in its loop, without a trip to Python (and the GIL)
            "dispatch_nogil_reserves": core.nogil_reserves,
            "dispatch_behind_bytes": self.dispatch_behind_bytes if not self._closed else 0,
            "dispatch_blocked": str(core.blocked) if core.blocked is not None else None,
            # new queues whose units wait in memory for their first file (made off the dispatcher's thread)
            "dispatch_waiting_queues": core.waiting_queues,
            "queue_file_maker": self._queue_file_maker.stats() if self._queue_file_maker is not None else None,
            "dispatch_gap_units": sum(cq.gap_units for cq in list(self._cq_table.built.values())),  # built: 0 else
            "service_errors": {
                **{s.name: s.errors for s in self._services},
                "CleanService": self.clean_service.errors if self.clean_service else 0,
            },
            "retention": self.clean_service.stats() if self.clean_service else {},
            "flush_disk_type": self.config.flush_disk_type.value,
            "flushed_offset": (
                max(self._group_commit.flushed, self._cl_mfq.flushed_where)
                if self._group_commit is not None
                else self._cl_mfq.flushed_where
            ),
            "committed_offset": self._cl_mfq.committed_where if self._pool is not None else self._cl_mfq.max_offset(),
            "flushes": getattr(self._flush_service, "flushes", 0),
            "allocate": self._allocate_service.stats() if self._allocate_service is not None else None,
            "transient_store_pool": (
                {"available": self._pool.available, "borrow_failures": self._pool.borrow_failures}
                if self._pool is not None
                else None
            ),
            "recovery": self.recovery.as_dict(),
            "index": self._index_stats(),
            "skipped_directories": list(self._cq_table.skipped_dirs),
        }

    # -- flush ------------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Force every written byte of the commit log and the consume queues to disk, then the checkpoint.

        Raises StoreIOError naming the file when a flush fails, and from then on (the commit log's first failed
        flush is never retried: the store takes no more puts until it is closed and opened again)."""
        self._check_open()
        self._flush_all()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<LocalMessageQueue {self.root!r} {state}>"
