"""MemoryMessageQueue: buckets of messages in memory, no persistence (the first of LocalMQ's three queues)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from localmq._frame import stored_message
from localmq._record import properties_to_bytes
from localmq.config import batch_bodies, body_length, check_topic
from localmq.errors import ArgumentRangeError, InvalidQueueIdError, MessageSizeError, StoreClosedError, check_int_range
from localmq.layout import MAX_QUEUE_ID
from localmq.queues.base import ProgressWaiterMixin, QueueClientsMixin, build_properties, check_queue_id, tag_names
from localmq.status import GetResult, GetStatus, PutStatus
from localmq.store.put_result import make_put_result

MAX_GET_MESSAGES = (1 << 31) - 1  # the largest max_messages of get_message (an int32 in the compiled get path)

_PUT_OK = PutStatus.PUT_OK
# how many messages one get_message looks at when a tag filter skips them (as the ConsumeQueue scan's bound)
_SCAN_LIMIT = 4096


def _stored_properties(props: Dict[str, Any]) -> Tuple[Dict[str, str], Optional[bytes]]:
    """(properties as a reader sees them, the stored string or None) of a put: a pair with an empty (or None) value
    is dropped from what the message reads back, as RocketMQ's reader and the other queues drop it, while the
    string (``raw_properties``) keeps an empty one, as they store it."""
    if all(props.values()):
        return props, None
    return {k: v for k, v in props.items() if v}, properties_to_bytes(props)


class _Bucket:
    __slots__ = ("topic", "queue_id", "messages", "lock", "last_ts")

    def __init__(self, topic: str, queue_id: int):
        self.topic = topic
        self.queue_id = queue_id
        self.messages: List[Any] = []
        self.lock = threading.Lock()
        self.last_ts = 0


class MemoryMessageQueue(ProgressWaiterMixin, QueueClientsMixin):
    """Messages in a dict of (topic, queue id) -> list, offsets per consumer group in memory; nothing persists.

    The same interface as the Local and Embedded queues (put / put_batch / get_message / offsets / long polling /
    producers and consumers), so it is the reference for them and the upper bound of an in-process queue. Bodies
    are kept as given when they are ``bytes`` (copied otherwise); store timestamps never go backwards within a
    queue, so ``offset_by_time`` can search them.

    Thread-safety: every method may be called from any thread; puts to one queue are ordered by its lock.
    """

    def __init__(self, *, max_message_size: int = 4 * 1024 * 1024, flush_consumer_offset_interval: int = 5000):
        self.max_message_size = max_message_size
        self.flush_consumer_offset_interval = flush_consumer_offset_interval
        self._buckets: Dict[Tuple[str, int], _Bucket] = {}
        self._lock = threading.Lock()  # creating buckets
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0
        self._progress = 0
        self._wakes = 0
        self._closed = False

    def _consumer_offset_flush_interval_ms(self) -> int:
        return self.flush_consumer_offset_interval

    # -- state ----------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the queue is closed")

    @property
    def offset_store_path(self) -> Optional[str]:
        return None

    def _bucket(self, topic: str, queue_id: int) -> _Bucket:
        key = (topic, queue_id)
        b = self._buckets.get(key)
        if b is None:
            check_topic(topic)
            check_queue_id(queue_id)
            with self._lock:
                b = self._buckets.get(key)
                if b is None:
                    b = self._buckets[key] = _Bucket(topic, queue_id)
        return b

    # -- put ------------------------------------------------------------------------------------------------

    def _body(self, body, argument: str = "body") -> bytes:
        if type(body) is not bytes:
            body_length(body, argument)  # a typed error for what is not bytes-like
            body = bytes(memoryview(body))
        if len(body) > self.max_message_size:
            raise MessageSizeError(f"body of {len(body)} bytes exceeds max_message_size {self.max_message_size}")
        return body

    def _published(self, n: int) -> None:
        self._progress += n
        if self._waiters:
            with self._cond:
                self._cond.notify_all()

    def put(
        self,
        topic: str,
        body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ):
        """Append one message. Returns PutResult (``physical_offset`` -1, ``msg_id`` None).

        Raises InvalidTopicError, InvalidQueueIdError, MessageSizeError, InvalidPropertyError, PropertiesSizeError,
        StoreClosedError.
        """
        if self._closed:
            raise StoreClosedError("the queue is closed")
        b = self._bucket(topic, queue_id)
        check_int_range(flag, "flag", -(1 << 31), (1 << 31) - 1)
        body = self._body(body)
        props, raw = _stored_properties(build_properties(tags, keys, properties))
        now = int(time.time() * 1000)
        with b.lock:
            ts = b.last_ts = now if now > b.last_ts else b.last_ts
            off = len(b.messages)
            b.messages.append(stored_message(b.topic, body, props, queue_id, off, ts, now, flag, raw))
        self._published(1)
        return make_put_result(_PUT_OK, -1, off, len(body), ts, 1)

    def put_batch(
        self,
        topic: str,
        bodies: Iterable,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ):
        """Append several messages to one queue with consecutive offsets and one store time; one PutResult."""
        if self._closed:
            raise StoreClosedError("the queue is closed")
        b = self._bucket(topic, queue_id)
        check_int_range(flag, "flag", -(1 << 31), (1 << 31) - 1)
        bodies = [self._body(x, f"bodies[{i}]") for i, x in enumerate(batch_bodies(bodies))]
        props, raw = _stored_properties(build_properties(tags, keys, properties))
        now = int(time.time() * 1000)
        with b.lock:
            ts = b.last_ts = now if now > b.last_ts else b.last_ts
            first = len(b.messages)
            t = b.topic
            b.messages.extend(
                [
                    stored_message(t, body, props, queue_id, first + i, ts, now, flag, raw)
                    for i, body in enumerate(bodies)
                ]
            )
        self._published(len(bodies))
        return make_put_result(_PUT_OK, -1, first, sum(map(len, bodies)), ts, len(bodies))

    # -- get ------------------------------------------------------------------------------------------------

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        *,
        tags: Optional[str] = None,
        zero_copy: bool = False,
    ) -> GetResult:
        """Pull up to ``max_messages`` from ``offset``; statuses and ``next_begin_offset`` as the Local queue's.

        ``tags`` "a || b" keeps messages whose tag is one of them (a scan looks at most 4096 messages).
        Raises StoreClosedError, InvalidQueueIdError, ValueError (max_messages < 1), ArgumentOverflowError
        (max_messages above MAX_GET_MESSAGES).
        """
        if self._closed:
            raise StoreClosedError("the queue is closed")
        if max_messages < 1:
            raise ArgumentRangeError("max_messages must be at least 1", "max_messages")
        check_int_range(max_messages, "max_messages", 1, MAX_GET_MESSAGES)  # a C int below (ArgumentOverflowError)
        b = self._buckets.get((topic, queue_id))
        if b is None:
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        msgs = b.messages
        mx = len(msgs)
        if mx == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
        if offset < 0:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], 0, 0, mx)
        if offset == mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, 0, mx)
        if offset > mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], mx, 0, mx)
        names = tag_names(tags)
        if names is None:
            out = msgs[offset : offset + max_messages]
            return GetResult(GetStatus.FOUND, out, offset + len(out), 0, mx)
        out = []
        end = min(mx, offset + _SCAN_LIMIT)
        i = offset
        while i < end and len(out) < max_messages:
            m = msgs[i]
            if m.tags in names:
                out.append(m)
            i += 1
        return GetResult(GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE, out, i, 0, mx)

    def max_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        b = self._buckets.get((topic, queue_id))
        return len(b.messages) if b is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        return 0

    def offset_by_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """Offset of the first message stored at or after ``ts_ms`` (max offset when all are older)."""
        self._check_open()
        b = self._buckets.get((topic, queue_id))
        if b is None:
            return 0
        msgs = b.messages
        lo, hi = 0, len(msgs)
        while lo < hi:
            mid = (lo + hi) // 2
            if msgs[mid].store_timestamp < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def topics(self) -> Dict[str, List[int]]:
        self._check_open()
        out: Dict[str, List[int]] = {}
        for t, q in list(self._buckets):
            out.setdefault(t, []).append(q)
        return {t: sorted(qs) for t, qs in sorted(out.items())}

    # -- close ----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close consumers and producers created from it, then drop every message. Idempotent."""
        if self._closed:
            return
        self._close_clients()
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        self._buckets = {}

    def __enter__(self) -> "MemoryMessageQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> Dict[str, Any]:
        return {"queues": len(self._buckets), "messages": self._progress}

    def __repr__(self) -> str:
        return f"<MemoryMessageQueue queues={len(self._buckets)} {'closed' if self._closed else 'open'}>"
