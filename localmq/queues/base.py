"""What the three queues share: the client factories (QueueClientsMixin), long polling, property building."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

from localmq._record import Message
from localmq.client import retry
from localmq.client.consumer import Consumer
from localmq.client.producer import Producer, build_properties
from localmq.client.state import ClientState
from localmq.client.transaction import TransactionProducer
from localmq.config import check_queue_id
from localmq.errors import ForkedStoreError, StoreClosedError
from localmq.filter import tag_names  # re-exported: the queues import it from here
from localmq.interface import MessageStore

log = logging.getLogger("localmq.queues")

# Queues whose files belong to the process that opened them (LocalMessageQueue, EmbeddedMessageQueue).
_PROCESS_BOUND: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child inherits the parent's open queues: the same mappings and files, but none of its threads (dispatch,
    # flush) and a put lock and queue offsets that no longer agree with the parent's. A put here would take queue
    # offsets the parent takes too and overwrite its messages, so every inherited queue refuses all use
    # (ForkedStoreError). Nothing is written or unlocked in the child: its close() leaves the parent's files and
    # locks alone (a flock is shared with the parent; unlocking it would unlock the parent).
    for q in list(_PROCESS_BOUND):
        q._forked = True
        q._closed = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# How long the exit hook waits for one store left open to close (its services flush and stop) before giving up.
EXIT_CLOSE_TIMEOUT_S = 30.0


def _close_at_exit() -> None:
    # A store still open when the interpreter exits is closed here, as Python flushes a file left open: dispatch
    # catches up, files are flushed and ``abort`` removed, so the next open needs no crash recovery. It is a
    # mistake all the same (a ResourceWarning says so, shown with -W default or -X dev). Each close runs in a thread
    # joined with a timeout, so a store that cannot close never hangs the interpreter's exit.
    for q in list(_PROCESS_BOUND):
        if q._closed or q._forked:
            continue
        warnings.warn(
            f"{type(q).__name__} {getattr(q, 'root', '')!r} was never closed: closing it at exit (use "
            f"`with localmq.open(...) as st:` or st.close())",
            ResourceWarning,
            stacklevel=1,
        )
        t = threading.Thread(target=_close_logged, args=(q,), name="localmq-close-at-exit", daemon=True)
        t.start()
        t.join(EXIT_CLOSE_TIMEOUT_S)
        if t.is_alive():
            log.error(
                "%s %r did not close within %.0f s at exit; the next open recovers it",
                type(q).__name__,
                getattr(q, "root", ""),
                EXIT_CLOSE_TIMEOUT_S,
            )


def _close_logged(q: Any) -> None:
    try:
        q.close()
    except Exception:  # noqa: BLE001 - at exit there is no caller to raise to
        log.exception("closing %s %r at exit failed", type(q).__name__, getattr(q, "root", ""))


atexit.register(_close_at_exit)


class ProcessBoundMixin:
    """For a queue whose files one process owns: refused in a forked child, never pickled to another process.

    A queue still open at exit is closed by an exit hook, with a ResourceWarning (its service threads keep an open
    queue reachable, so it is never garbage collected open)."""

    _forked = False

    def _bind_to_process(self) -> None:
        """Call once the queue is open: a fork from now on leaves the child's copy refusing every use."""
        _PROCESS_BOUND.add(self)

    def _closed_error(self) -> Exception:
        """The error for a use after close, or in a forked child."""
        if self._forked:
            return ForkedStoreError(
                f"{type(self).__name__} {getattr(self, 'root', '')!r} was opened by process that forked this one "
                f"(pid {os.getpid()}): open the store in this process instead (localmq.open(path, shared=True) in "
                f"both processes lets them share it), or open it only after forking"
            )
        return StoreClosedError("the store is closed")

    def __reduce__(self) -> Any:
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled or sent to another process: pass its path and "
            f"open it there (localmq.open(path)), once this process has closed it"
        )


__all__ = [
    "MessageStore",
    "QueueClientsMixin",
    "ProgressWaiterMixin",
    "ProcessBoundMixin",
    "build_properties",
    "check_queue_id",
    "tag_names",
]


class QueueClientsMixin:
    """``create_producer``, ``create_consumer`` and ``consumer_lag`` for a MessageStore.

    The client classes (localmq.client, the layer below) are written against localmq.interface; the state they share
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
                    st = self._clients = ClientState(self, self._consumer_offset_flush_interval_ms())
        return st

    def _consumer_offset_flush_interval_ms(self) -> int:
        cfg = getattr(self, "config", None)
        return int(getattr(cfg, "flush_consumer_offset_interval", 5000))

    def create_producer(
        self,
        *,
        queue_id: Optional[int] = None,
        queue_selector=None,
        queue_nums: Optional[int] = None,
        on_delivery=None,
        uniq_keys: bool = True,
    ) -> Producer:
        """A Producer (see localmq.client.producer.Producer for the parameters)."""
        return Producer(
            self,
            queue_id=queue_id,
            queue_selector=queue_selector,
            queue_nums=queue_nums,
            on_delivery=on_delivery,
            uniq_keys=uniq_keys,
        )

    def create_transaction_producer(
        self, group: str, check_listener, *, queue_id: Optional[int] = None, queue_nums: Optional[int] = None
    ) -> TransactionProducer:
        """A TransactionProducer of producer group ``group`` whose ``check_listener(message)`` answers the store's
        check-backs (see localmq.client.transaction). Raises TransactionNotSupportedError unless this is an
        exclusive LocalMessageQueue."""
        return TransactionProducer(self, group, check_listener, queue_id=queue_id, queue_nums=queue_nums)

    def create_consumer(
        self, group: str, topics, *, tags: Optional[str] = None, broadcast: bool = False, **options: Any
    ) -> Consumer:
        """A pull Consumer of ``group`` on ``topics`` (see localmq.client.consumer.Consumer for ``options``)."""
        return Consumer(self, group, topics, tags=tags, broadcast=broadcast, **options)

    def consumer_lag(self, group: str) -> Dict[Tuple[str, int], Optional[int]]:
        """{(topic, queue id): messages not yet committed by ``group``} for every queue of the topics the group
        has committed offsets in or subscribes to now. A queue the group never committed is None (unknown),
        never 0; lag is never negative (max offset minus the larger of the commit and the min offset)."""
        return self._client_state().lag(group)

    def dead_letters(self, group: str, *, start: int = 0, max_messages: Optional[int] = None) -> List[Message]:
        """The messages of ``group`` that failed ``max_reconsume_times`` times (topic ``%DLQ%<group>``), from queue
        offset ``start``, oldest first; each keeps its properties (RETRY_TOPIC: the business topic;
        ORIGIN_MESSAGE_ID) and its reconsume count. Raises InvalidTopicError for a group too long for its DLQ."""
        return retry.dead_letters(self, group, start=start, max_messages=max_messages)

    def redrive_dead_letters(self, group: str, *, queue_id: int = 0, max_messages: Optional[int] = None) -> int:
        """Send the dead letters of ``group`` not re-driven before again, each to its business topic queue
        ``queue_id`` as a new message (fresh retries); progress is committed under group ``<group>%REDRIVE``, so a
        second call sends only what arrived since. Returns how many were sent. Raises SendError."""
        return retry.redrive_dead_letters(
            self, group, offsets=self._client_state().offsets, queue_id=queue_id, max_messages=max_messages
        )

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
