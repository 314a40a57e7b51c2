"""The one storage interface the clients need (MessageStore) and the client factories every queue shares."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Protocol, Tuple, runtime_checkable

from localmq._codec import properties_to_bytes
from localmq.config import MAX_QUEUE_ID
from localmq.errors import InvalidPropertyError, InvalidQueueIdError, StoreClosedError

log = logging.getLogger("localmq.queues")

__all__ = ["MessageStore", "QueueClientsMixin", "build_properties", "check_queue_id"]


@runtime_checkable
class MessageStore(Protocol):
    """What producers and consumers use of a queue; MemoryMessageQueue, EmbeddedMessageQueue and
    LocalMessageQueue implement it, so the clients (localmq.client) are written once.

    Offsets are logical: the n-th message of (topic, queue id) has queue offset n. Statuses are GetStatus /
    PutStatus; results are PutResult / GetResult.
    """

    closed: bool

    def put(self, topic: str, body: Any, *, queue_id: int = 0, tags: Optional[str] = None, keys: Any = None,
            properties: Optional[Dict[str, str]] = None, flag: int = 0) -> Any:
        """Append one message; returns PutResult."""

    def put_batch(self, topic: str, bodies: Iterable, *, queue_id: int = 0, tags: Optional[str] = None,
                  keys: Any = None, properties: Optional[Dict[str, str]] = None, flag: int = 0) -> Any:
        """Append several messages to one queue with consecutive queue offsets; returns one PutResult."""

    def get_message(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *,
                    tags: Optional[str] = None) -> Any:
        """Pull up to ``max_messages`` from ``offset``; returns GetResult (status, messages, next_begin_offset)."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last readable message (0 for an unknown queue)."""

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first readable offset (0 for an unknown queue)."""

    def offset_by_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """Offset of the first message stored at or after ``ts_ms``."""

    def topics(self) -> Dict[str, List[int]]:
        """{topic: sorted queue ids}."""

    @property
    def progress(self) -> int:
        """A number that grows whenever messages become readable (read it before pulling, then wait on it)."""

    def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        """Block until ``progress`` passes ``since`` (default: its value now), ``timeout`` s pass or
        ``wake_waiters`` is called; returns ``progress``."""

    def wake_waiters(self) -> None:
        """Make every ``wait_for_new_messages`` caller return now."""

    @property
    def offset_store_path(self) -> Optional[str]:
        """Where committed consumer offsets persist (``<root>/config/consumerOffset.json``), None in memory."""

    def close(self) -> None:
        """Close the queue (consumers and producers created from it first)."""


def check_queue_id(queue_id: int) -> None:
    """Raise InvalidQueueIdError unless ``queue_id`` is an int in 0..MAX_QUEUE_ID."""
    if type(queue_id) is not int or not 0 <= queue_id <= MAX_QUEUE_ID:
        raise InvalidQueueIdError(f"queue id {queue_id!r} outside 0..{MAX_QUEUE_ID}")


def build_properties(tags: Optional[str], keys: Any, properties: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The properties dict of a message (TAGS and KEYS folded in), validated as the CommitLog validates them.

    Raises InvalidPropertyError, PropertiesSizeError.
    """
    d = dict(properties) if properties else {}
    if tags is not None:
        if not isinstance(tags, str) or not tags:
            raise InvalidPropertyError(f"tags must be a non-empty str, not {tags!r}")
        d["TAGS"] = tags
    if keys is not None:
        ks = [keys] if isinstance(keys, str) else list(keys)
        for k in ks:
            if not isinstance(k, str) or not k or " " in k:
                raise InvalidPropertyError(f"keys must be non-empty str without spaces, not {k!r}")
        if ks:
            d["KEYS"] = " ".join(ks)
    if d:
        properties_to_bytes(d)  # raises on separators, empty values, more than 32767 bytes
    return d


class QueueClientsMixin:
    """``create_producer``, ``create_consumer`` and ``consumer_lag`` for a MessageStore.

    The client classes live one layer up (localmq.client) and are imported when first used; the state they share
    per queue object (ConsumerOffsetManager, ConsumerScheduler, producer numbering) is created on first use and
    closed by the queue's ``close()``. Thread-safe.
    """

    _clients: Any = None
    _clients_lock = threading.Lock()
    #: queues a topic is spread over by producers without an explicit queue id (RocketMQ defaultTopicQueueNums)
    default_queue_nums: int = 8

    def _client_state(self):
        st = self._clients
        if st is None:
            with QueueClientsMixin._clients_lock:
                st = self._clients
                if st is None:
                    self._check_open()
                    from localmq.client.state import ClientState  # the client layer sits above the queues

                    st = self._clients = ClientState(self, self._consumer_offset_flush_interval_ms())
        return st

    def _consumer_offset_flush_interval_ms(self) -> int:
        cfg = getattr(self, "config", None)
        return int(getattr(cfg, "flush_consumer_offset_interval", 5000))

    def create_producer(self, *, queue_id: Optional[int] = None, queue_selector=None,
                        queue_nums: Optional[int] = None):
        """A Producer (see localmq.client.producer.Producer for the parameters)."""
        from localmq.client.producer import Producer

        return Producer(self, queue_id=queue_id, queue_selector=queue_selector, queue_nums=queue_nums)

    def create_consumer(self, group: str, topics, *, tags: Optional[str] = None, broadcast: bool = False, **options):
        """A pull Consumer of ``group`` on ``topics`` (see localmq.client.consumer.Consumer for ``options``)."""
        from localmq.client.consumer import Consumer

        return Consumer(self, group, topics, tags=tags, broadcast=broadcast, **options)

    def consumer_lag(self, group: str) -> Dict[Tuple[str, int], Optional[int]]:
        """{(topic, queue id): messages not yet committed by ``group``} for every queue of the topics the group
        has committed offsets in or subscribes to now. A queue the group never committed is None (unknown),
        never 0; lag is never negative (max offset minus the larger of the commit and the min offset)."""
        return self._client_state().lag(group)

    @property
    def consumer_offsets(self):
        """The ConsumerOffsetManager of this queue (committed offsets; ``persist()`` writes them now)."""
        return self._client_state().offsets

    def _close_clients(self) -> None:
        """Close the consumers and producers of this queue and persist the offsets. A failure is logged, not
        raised: the queue must still close (offsets then stay at their last write: at-least-once holds)."""
        st = self._clients
        if st is not None:
            try:
                st.close()
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("closing the clients of %r", self)


class ProgressWaiterMixin:
    """Long polling for the in-process queues: puts bump ``_progress`` and notify ``_cond``.

    The class using it sets ``_cond`` (a Condition), ``_progress``, ``_wakes``, ``_waiters`` and ``_closed`` and
    has ``_check_open()``.
    """

    def wake_waiters(self) -> None:
        """Make every thread in ``wait_for_new_messages`` return now."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    @property
    def progress(self) -> int:
        """Messages put since the queue was opened (grows with every put)."""
        return self._progress

    def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        """Block until a message is put after ``since`` (a ``progress`` value; default now) or ``timeout`` s
        pass (or ``wake_waiters`` is called). Returns ``progress``. Raises StoreClosedError when the queue is (or gets)
        closed."""
        self._check_open()
        if since is None:
            since = self._progress
        if self._progress != since:
            return self._progress
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiters += 1
            wakes = self._wakes
            try:
                while self._progress == since and self._wakes == wakes:
                    if self._closed:
                        raise StoreClosedError("the queue was closed while waiting")
                    wait = 0.5
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        wait = min(wait, left)
                    self._cond.wait(wait)
            finally:
                self._waiters -= 1
        return self._progress
