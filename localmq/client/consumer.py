"""Consumer: a pull consumer of a group, with prefetch, round-robin over its queues, long polling and offsets."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

from localmq._record import Message
from localmq.layout import TOPIC_RE
from localmq.status import GetStatus
from localmq.config import check_topic
from localmq.errors import CorruptMessageError, QueueReassignedError, StoreClosedError

log = logging.getLogger("localmq.client.consumer")

Bucket = Tuple[str, int]

_FOUND = GetStatus.FOUND
_SKIP_AHEAD = (GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_FOUND_NULL, GetStatus.MESSAGE_WAS_REMOVING)


class _Cursor:
    """One queue this consumer reads: the grant epoch, where the next pull starts, and the prefetched messages.
    ``position`` (the next offset not yet handed out) is what a commit records."""

    __slots__ = ("bucket", "epoch", "fetch_offset", "buffer", "committed")

    def __init__(self, bucket: Bucket, epoch: int, offset: int, committed: Optional[int]):
        self.bucket = bucket
        self.epoch = epoch
        self.fetch_offset = offset
        self.buffer: collections.deque = collections.deque()
        self.committed = committed

    @property
    def position(self) -> int:
        return self.buffer[0].queue_offset if self.buffer else self.fetch_offset


class Consumer:
    """A pull consumer of ``group`` on ``topics`` (``mq.create_consumer(group, topics, ...)``).

    Clustering (default): each (topic, queue) is held by one consumer of the group at a time (ConsumerScheduler),
    so a queue's messages, hence one producer's, are delivered in order and once within the group. Broadcasting
    (``broadcast=True``): every consumer reads every queue from its own offsets; they persist under the group
    ``"<group>%<client_id>"`` when ``client_id`` is given, else they live in memory only.

    ``poll(timeout)`` returns the next Message or None; ``poll_batch(max_messages, timeout)`` a list. Both prefetch
    ``batch_size`` messages per queue (LocalMQ's batchPoll), hand them out round-robin across queues, and when
    nothing is there wait on the queue's dispatch notification (long polling: a message put while a consumer
    waits reaches it within milliseconds). ``timeout`` None waits until a message comes or the consumer closes.

    Offsets: the position of a queue is the offset after the last message handed out. ``commit()`` records the
    positions and, by default, writes them durably (``config/consumerOffset.json``) before returning.
    ``auto_commit=True`` records at every poll the positions reached by the previous polls (Kafka's rule: what
    was handed out before this poll counts as processed), written by the periodic persist (every
    ``flush_consumer_offset_interval`` ms) and by ``close()``. Delivery is at-least-once: after a crash, or when
    a queue passes to another consumer, messages after the last commit are delivered again; a commit never moves
    an offset backwards except through ``seek``.

    ``consumer_retention_ms``: how long this consumer keeps its queues without polling; after that another
    consumer of the group takes them, and this one's next ``poll`` raises QueueReassignedError (once) and never
    hands out what it had prefetched from them. ``from_offset``: "earliest" (default) or "latest", where a queue
    the group never committed starts. ``tags``: "a || b" filters on the tag (hash first on the Local queue).
    ``skip_corrupt`` (default True): a message the store reports corrupt (CorruptMessageError: a damaged unit or
    record, a body CRC mismatch) is skipped, logged and counted in ``skipped_corrupt`` (the errors in
    ``corrupt_errors``) instead of failing every poll; False raises it from ``poll``.

    Group membership is per process and per queue object (the store has one writer process).

    Thread-safety: use a consumer from one thread at a time (poll, commit, seek); ``close()`` may be called from
    any thread and ends a ``poll`` waiting in another one (it then returns what it has, possibly nothing).
    ``for m in consumer`` iterates until the consumer (or its queue) is closed; ``with`` closes it.
    """

    def __init__(self, mq, group: str, topics: Union[str, Iterable[str]], *, tags: Optional[str] = None,
                 broadcast: bool = False, auto_commit: bool = False, batch_size: int = 32,
                 consumer_retention_ms: int = 30_000, from_offset: str = "earliest", client_id: Optional[str] = None,
                 rebalance_interval_ms: int = 100, skip_corrupt: bool = True):
        if not isinstance(group, str) or TOPIC_RE.match(group) is None:
            raise ValueError(f"invalid group name {group!r}: must match [%|a-zA-Z0-9_-]{{1,127}}")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        for t in topics:
            check_topic(t)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if consumer_retention_ms <= 0:
            raise ValueError("consumer_retention_ms must be positive")
        if from_offset not in ("earliest", "latest"):
            raise ValueError("from_offset must be 'earliest' or 'latest'")
        if client_id is not None and (not isinstance(client_id, str) or TOPIC_RE.match(client_id) is None):
            raise ValueError(f"invalid client_id {client_id!r}")
        self._mq = mq
        self._state = mq._client_state()
        self.group = group
        self.topics = tuple(dict.fromkeys(topics))
        self._topic_set = frozenset(self.topics)
        self.tags = tags if tags not in (None, "", "*") else None
        self.broadcast = broadcast
        self.auto_commit = auto_commit
        self.batch_size = batch_size
        self.consumer_retention_ms = consumer_retention_ms
        self.from_offset = from_offset
        self.client_id = client_id
        if broadcast:
            self._offset_group = f"{group}%{client_id}" if client_id is not None else None
        else:
            self._offset_group = group
        self._offsets = self._state.offsets
        self._sched = self._state.scheduler
        self._refresh_s = rebalance_interval_ms / 1000.0
        self._wait_slice = min(0.5, consumer_retention_ms / 3000.0)
        self._lock = threading.RLock()   # one poll / commit / seek / close at a time; released while waiting
        self._cursors: Dict[Bucket, _Cursor] = {}
        self._order: List[_Cursor] = []
        self._rr = 0
        self._seeks: Dict[Bucket, int] = {}
        self._lost: List[Bucket] = []
        self._last_refresh = -1e18
        self.closed = False
        self.delivered = 0
        # messages skipped because the store reported them corrupt (CorruptMessageError), and the last few errors
        self.skip_corrupt = skip_corrupt
        self.skipped_corrupt = 0
        self.corrupt_errors: collections.deque = collections.deque(maxlen=16)
        self._cid = self._sched.join(group, self.topics, consumer_retention_ms) if not broadcast else 0
        try:
            self._state.register(self, consumer=True)
        except BaseException:
            if not broadcast:
                self._sched.leave(group, self._cid)
            raise

    # -- assignment -------------------------------------------------------------------------------------------

    def _buckets(self) -> List[Bucket]:
        existing = self._mq.topics()
        return [(t, q) for t in self.topics for q in existing.get(t, ())]

    def _start_offset(self, b: Bucket) -> Tuple[int, Optional[int]]:
        mq = self._mq
        committed = self._offsets.query(self._offset_group, *b) if self._offset_group is not None else None
        if b in self._seeks:
            off = self._seeks.pop(b)
        elif committed is not None:
            off = committed
        elif self.from_offset == "latest":
            off = mq.max_offset(*b)
        else:
            off = mq.min_offset(*b)
        return self._clamp(b, off), committed

    def _clamp(self, b: Bucket, off: int) -> int:
        mn = self._mq.min_offset(*b)
        mx = self._mq.max_offset(*b)
        return mn if off < mn else mx if off > mx else off

    def _add(self, b: Bucket, epoch: int) -> None:
        off, committed = self._start_offset(b)
        cur = _Cursor(b, epoch, off, committed)
        self._cursors[b] = cur
        self._order.append(cur)

    def _drop(self, b: Bucket) -> None:
        cur = self._cursors.pop(b, None)
        if cur is not None:
            cur.buffer.clear()
            self._order.remove(cur)

    def _maintain(self, force: bool = False) -> None:
        """Heartbeat; at most every ``rebalance_interval_ms`` (or when forced) look for new queues and rebalance."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self._refresh_s:
            if not self.broadcast:
                self._sched.heartbeat(self.group, self._cid)
            return
        self._last_refresh = now
        buckets = self._buckets()
        if self.broadcast:
            for b in buckets:
                if b not in self._cursors:
                    self._add(b, 0)
            return
        a = self._sched.assign(self.group, self._cid, buckets, self.consumer_retention_ms, self.topics)
        for b in a.lost:
            if b in self._cursors:
                self._drop(b)
                self._lost.append(b)
        if a.to_release:
            if self.auto_commit:
                self._commit_locked(a.to_release)
            for b in a.to_release:
                self._drop(b)
            self._sched.release(self.group, self._cid, a.to_release)
        for b in a.granted:
            self._add(b, a.owned[b])
        for b in list(self._cursors):
            if b not in a.owned and b not in a.to_release:
                self._drop(b)

    def assignment(self) -> List[Bucket]:
        """The (topic, queue id) pairs this consumer reads now."""
        with self._lock:
            return sorted(self._cursors)

    # -- poll -------------------------------------------------------------------------------------------------

    def poll(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message, or None when ``timeout`` seconds passed first (or the consumer was closed meanwhile).

        Raises StoreClosedError when the consumer is closed, QueueReassignedError (once) when queues it held
        passed to another consumer, DispatchError when the queue's dispatcher stopped.
        """
        out = self._poll(1, timeout)
        return out[0] if out else None

    def poll_batch(self, max_messages: int = 32, timeout: Optional[float] = None) -> List[Message]:
        """Up to ``max_messages`` messages (from several queues, each queue's in order); [] after ``timeout``.

        Raises as ``poll``.
        """
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        return self._poll(max_messages, timeout)

    def _poll(self, max_n: int, timeout: Optional[float]) -> List[Message]:
        if self.closed:
            raise StoreClosedError("the consumer is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        mq = self._mq
        lock = self._lock
        force = False
        while True:
            with lock:
                if self.closed:
                    return []
                if self.auto_commit:
                    self._commit_locked(None)
                self._maintain(force)
                if self._lost:
                    lost, self._lost = self._lost, []
                    raise QueueReassignedError(
                        f"consumer of group {self.group!r} did not poll for {self.consumer_retention_ms} ms; "
                        f"queues {lost} passed to another consumer", lost)
                out: List[Message] = []
                while True:
                    token = mq.progress
                    out += self._deliver(max_n - len(out))
                    if len(out) >= max_n:
                        break
                    try:
                        if not self._fetch_round():
                            break
                    except CorruptMessageError:
                        if not out:
                            raise
                        break  # hand out what was taken; the next poll reaches the bad message again and raises
                if out:
                    self.delivered += len(out)
                    return out
            # nothing anywhere: wait for the dispatcher (without the lock, so close() can get in)
            wait = self._wait_slice
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                wait = min(wait, left)
            try:
                now = mq.wait_for_new_messages(wait, since=token)
            except StoreClosedError:
                if self.closed:
                    return []
                raise
            force = now != token

    def _deliver(self, max_n: int) -> List[Message]:
        order = self._order
        n = len(order)
        if n == 0:
            return []
        out: List[Message] = []
        start = self._rr
        sched = self._sched
        clustering = not self.broadcast
        # a takeover happens under the scheduler lock too: messages leave a buffer only while the grant holds
        with sched.lock:
            for i in range(n):
                cur = order[(start + i) % n]
                buf = cur.buffer
                if not buf:
                    continue
                if clustering and not sched.holds(self.group, self._cid, cur.bucket, cur.epoch):
                    self._lost.append(cur.bucket)
                    buf.clear()
                    continue
                want = max_n - len(out)
                if want == 1:
                    out.append(buf.popleft())
                elif len(buf) <= want:
                    out.extend(buf)
                    buf.clear()
                else:
                    for _ in range(want):
                        out.append(buf.popleft())
                if len(out) >= max_n:
                    self._rr = (start + i + 1) % n
                    break
            else:
                self._rr = (start + 1) % n
        for b in self._lost:
            if b in self._cursors:
                self._drop(b)
        return out

    def _fetch_round(self) -> bool:
        """One pull for every queue whose buffer is empty. True when a pull found messages or moved forward."""
        mq = self._mq
        moved = False
        tags = self.tags
        for cur in list(self._order):
            if cur.buffer:
                continue
            topic, qid = cur.bucket
            try:
                r = mq.get_message(topic, qid, cur.fetch_offset, self.batch_size, tags=tags)
            except CorruptMessageError as e:
                # the messages before it were delivered by earlier pulls; skip this one, count it, go on
                if not self.skip_corrupt or e.next_offset is None or e.next_offset <= cur.fetch_offset:
                    raise
                log.error("group %s, %s queue %d: skipping corrupt message at queue offset %d: %s", self.group,
                          topic, qid, cur.fetch_offset, e)
                self.skipped_corrupt += 1
                self.corrupt_errors.append(e)
                cur.fetch_offset = e.next_offset
                moved = True
                continue
            st = r.status
            if st is _FOUND:
                cur.buffer.extend(r.messages)
                cur.fetch_offset = r.next_begin_offset
                moved = True
            elif st in _SKIP_AHEAD:
                cur.fetch_offset = r.next_begin_offset
                moved = True
            elif st is GetStatus.OFFSET_TOO_SMALL or st is GetStatus.OFFSET_OVERFLOW_BADLY:
                log.warning("group %s, %s queue %d: offset %d is outside %d..%d (%s); continuing from %d",
                            self.group, topic, qid, cur.fetch_offset, r.min_offset, r.max_offset, st.name,
                            r.next_begin_offset)
                cur.fetch_offset = r.next_begin_offset
                moved = True
        return moved

    # -- offsets ----------------------------------------------------------------------------------------------

    def _commit_locked(self, buckets: Optional[Iterable[Bucket]]) -> Optional[int]:
        """Record the positions of ``buckets`` (None: every queue read) whose position moved; returns the table
        version, or None when nothing changed. Positions of queues lost to another consumer are not recorded."""
        curs = self._order if buckets is None else [self._cursors[b] for b in buckets if b in self._cursors]
        changed = {cur.bucket: cur.position for cur in curs if cur.position != cur.committed}
        if not changed:
            return None
        if self._offset_group is None:  # broadcast without client_id: positions live in this object only
            for cur in curs:
                cur.committed = cur.position
            return None
        sched = self._sched
        with sched.lock:
            if not self.broadcast:
                for b in list(changed):
                    cur = self._cursors[b]
                    if not sched.holds(self.group, self._cid, b, cur.epoch):
                        del changed[b]
                        if b not in self._lost:
                            self._lost.append(b)
            if not changed:
                return None
            version = self._offsets.commit(self._offset_group, changed)
        for b, pos in changed.items():
            self._cursors[b].committed = pos
        return version

    def commit(self, *, durable: bool = True) -> None:
        """Commit the position of every queue this consumer reads (the offset after the last message handed out).

        ``durable`` (default): returns after ``config/consumerOffset.json`` holds them (fsync + rename; the
        Memory queue keeps offsets in memory); False leaves the write to the periodic persist or ``close()``.
        Raises QueueReassignedError when queues it had read from passed to another consumer (their positions
        are not committed), StoreClosedError when closed, OSError when the write fails.
        """
        with self._lock:
            if self.closed:
                raise StoreClosedError("the consumer is closed")
            version = self._commit_locked(None)
            lost = []
            if self._lost:
                lost, self._lost = self._lost, []
                for b in lost:
                    self._drop(b)
        if durable and version is not None:
            self._offsets.persist(version)
        if lost:
            raise QueueReassignedError(f"queues {lost} passed to another consumer; not committed", lost)

    def committed(self, topic: str, queue_id: int) -> Optional[int]:
        """The group's committed offset of (topic, queue), or None."""
        if self._offset_group is None:
            cur = self._cursors.get((topic, queue_id))
            return cur.committed if cur is not None else None
        return self._offsets.query(self._offset_group, topic, queue_id)

    def position(self, topic: str, queue_id: int) -> Optional[int]:
        """The next offset this consumer hands out from (topic, queue), or None when it does not read it."""
        with self._lock:
            cur = self._cursors.get((topic, queue_id))
            return cur.position if cur is not None else None

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Continue (topic, queue) from ``offset`` (clamped to the queue's min..max): at once when this consumer
        reads that queue, else when it is granted to it. Prefetched messages of the queue are dropped."""
        with self._lock:
            b = (topic, queue_id)
            cur = self._cursors.get(b)
            if cur is None:
                self._seeks[b] = offset
                return
            cur.buffer.clear()
            cur.fetch_offset = self._clamp(b, offset)

    def seek_to_time(self, ts_ms: int) -> None:
        """Seek every queue of the subscribed topics to its first message stored at or after ``ts_ms``."""
        with self._lock:
            for b in self._buckets():
                self.seek(b[0], b[1], self._mq.offset_by_time(b[0], b[1], ts_ms))

    # -- lifecycle --------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit (with ``auto_commit``), release the queues to the group's other consumers, stop. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                if self.auto_commit and not self._mq.closed:
                    version = self._commit_locked(None)
                    if version is not None:
                        self._offsets.persist(version)
            finally:
                if not self.broadcast:
                    self._sched.leave(self.group, self._cid)
                for cur in self._order:
                    cur.buffer.clear()
                self._cursors.clear()
                self._order.clear()
                self._state.unregister(self)
        if not self._mq.closed:
            self._mq.wake_waiters()  # a poll waiting in another thread returns now

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        while not self.closed:
            try:
                m = self.poll(self._wait_slice)
            except StoreClosedError:
                if self.closed:
                    return
                raise
            if m is not None:
                yield m

    def __repr__(self) -> str:
        mode = "broadcast" if self.broadcast else "clustering"
        return (f"<Consumer group={self.group!r} topics={list(self.topics)} {mode} queues={len(self._cursors)} "
                f"{'closed' if self.closed else 'open'}>")
