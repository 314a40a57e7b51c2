"""The Protocols the clients (localmq.client) are written against, so that they import no queue: every queue
(MemoryMessageQueue, EmbeddedMessageQueue, LocalMessageQueue) implements MessageStore."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Protocol, runtime_checkable

__all__ = ["MessageStore"]


@runtime_checkable
class MessageStore(Protocol):
    """What producers and consumers use of a queue; MemoryMessageQueue, EmbeddedMessageQueue and
    LocalMessageQueue implement it, so the clients (localmq.client) are written once.

    Offsets are logical: the n-th message of (topic, queue id) has queue offset n. Statuses are GetStatus /
    PutStatus; results are PutResult / GetResult.
    """

    closed: bool

    def put(
        self,
        topic: str,
        body: Any,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: Any = None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ) -> Any:
        """Append one message; returns PutResult."""

    def put_batch(
        self,
        topic: str,
        bodies: Iterable[Any],
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: Any = None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ) -> Any:
        """Append several messages to one queue with consecutive queue offsets; returns one PutResult."""

    def get_message(
        self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *, tags: Optional[str] = None
    ) -> Any:
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


class QueueFileMakerLike(Protocol):
    """What the dispatcher (``store.dispatch.ReputCore.maker``) asks of the service that makes new queues' first
    files off its thread (``services.allocate.QueueFileMaker``)."""

    def request(self, cq: Any, base: int) -> bool:
        """Make the first file of queue ``cq`` at logical offset ``base``; False when the service is not running."""
        ...

    def claim(self, cq: Any) -> None:
        """Take ``cq`` back: forget a request not started, wait for a file being made."""
        ...
