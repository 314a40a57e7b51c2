"""Consumer: a pull consumer of a group, with prefetch, round-robin over its queues, long polling and offsets."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

from localmq._record import Message, bind_delivery, inflate_body
from localmq.client.retry import (
    DEFAULT_MAX_RECONSUME_TIMES,
    RETRY_PREFIX,
    check_group_for_retry,
    retry_topic,
    send_back,
)
from localmq.config import check_topic
from localmq.errors import AckError, ArgumentRangeError, CorruptMessageError, QueueReassignedError, StoreClosedError
from localmq.filter import compile_sql92, tag_names
from localmq.layout import SYSFLAG_COMPRESSED, TOPIC_RE
from localmq.status import ConsumeStatus, GetStatus

log = logging.getLogger("localmq.client.consumer")

Bucket = Tuple[str, int]

_FOUND = GetStatus.FOUND
_SKIP_AHEAD = (GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_FOUND_NULL, GetStatus.MESSAGE_WAS_REMOVING)


class _Cursor:
    """One queue this consumer reads: the grant epoch, where the next pull starts, and the prefetched messages.
    ``position`` (the next offset not yet handed out) is what a commit records, or with ``manual_ack`` the lowest
    offset handed out and not yet done (``inflight[0]``: RocketMQ's process queue), so a crash never skips one.

    With ``manual_ack`` a cursor is the ``ack()`` / ``nack()`` target of the messages it handed out: ``pending``
    holds their queue offsets until done, ``inflight`` the offsets handed out in order (trimmed at the front as
    they are done). Both are guarded by the consumer's ``_ack_lock``."""

    __slots__ = (
        "bucket",
        "epoch",
        "fetch_offset",
        "buffer",
        "committed",
        "consumer",
        "pending",
        "inflight",
        "retry",
        "dropped",
        "redo",
        "suspended_until",
        "redo_count",
    )

    def __init__(self, bucket: Bucket, epoch: int, offset: int, committed: Optional[int], consumer: "Consumer"):
        self.bucket = bucket
        self.epoch = epoch
        self.fetch_offset = offset
        self.buffer: collections.deque = collections.deque()
        self.committed = committed
        self.consumer = consumer
        self.pending: Set[int] = set()
        self.inflight: collections.deque = collections.deque()
        self.retry = bucket[0].startswith(RETRY_PREFIX)  # the group's retry queue: topics shown as RETRY_TOPIC
        self.dropped = False
        # orderly: the failed message handed out again (still pending) once the suspension ends, and its count
        self.redo: Optional[Message] = None
        self.suspended_until = 0.0
        self.redo_count = 0

    @property
    def position(self) -> int:
        return self.buffer[0].queue_offset if self.buffer else self.fetch_offset

    def ack(self, m: Message) -> None:
        self.consumer._ack(self, m)

    def nack(self, m: Message, delay: Optional[float], delay_level: Optional[int]) -> None:
        self.consumer._nack(self, m, delay, delay_level)


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
    ``sql``: a RocketMQ SQL92 expression on the properties (``"price > 100 AND region IN ('eu', 'us')"``,
    ``localmq.filter``), compiled at creation (FilterSyntaxError with the position); messages it does not select
    are passed over (counted in ``filtered_out``) and the committed offset moves past them, as a broker's
    filtered pull does.
    ``skip_corrupt`` (default True): a message the store reports corrupt (CorruptMessageError: a damaged unit or
    record, a body CRC mismatch) is skipped, logged and counted in ``skipped_corrupt`` (the errors in
    ``corrupt_errors``) instead of failing every poll; False raises it from ``poll``.

    Acknowledgements (``manual_ack=True``): every message handed out must be acknowledged, ``m.ack()``, or failed,
    ``m.nack(delay=...)`` (from any thread). The committed offset of a queue is then the lowest offset not yet done,
    recorded at every poll and written by the periodic persist, ``commit()`` and ``close()``: a crash delivers the
    unfinished messages again, never skips one. A failed message is sent back (RocketMQ's send-back,
    ``client/retry.py``): to ``%RETRY%<group>`` after a delay (delay level 3 + reconsume times by default), where
    the group's consumers receive it again (shown under its original topic, ``reconsume_times`` + 1), and after
    ``max_reconsume_times`` (16) failures to ``%DLQ%<group>`` (``mq.dead_letters(group)``,
    ``mq.redrive_dead_letters(group)``). At most ``max_unacked`` messages per queue are outstanding (RocketMQ's
    consumeConcurrentlyMaxSpan): past that, the queue hands out nothing until the oldest is done. ``listen(fn)``
    runs a RocketMQ-style listener that answers ConsumeStatus.CONSUME_SUCCESS or RECONSUME_LATER. Broadcasting
    consumers never send back (as RocketMQ): a nack there only logs and drops the message.

    Orderly (``orderly=True``, implies ``manual_ack``): each queue hands out one message at a time, the next only
    when it is done (RocketMQ's ConsumeMessageOrderlyService; different queues still go in parallel). A failed
    message is not sent back: its queue is suspended for ``suspend_ms`` (1000 ms) and the same message is handed
    out again (its ``reconsume_times`` counts the failures, in memory); after ``max_reconsume_times`` failures
    (unlimited by default, as RocketMQ's orderly consumers) it goes to the dead letters and the queue moves on.

    Clustering consumers also read their group's retry topic ``%RETRY%<group>`` (RocketMQ subscribes it for them).

    Group membership spans the processes of a shared store and is per queue object otherwise.

    Thread-safety: use a consumer from one thread at a time (poll, commit, seek); ``close()`` may be called from
    any thread and ends a ``poll`` waiting in another one (it then returns what it has, possibly nothing).
    ``for m in consumer`` iterates until the consumer (or its queue) is closed; ``with`` closes it.
    """

    def __init__(
        self,
        mq,
        group: str,
        topics: Union[str, Iterable[str]],
        *,
        tags: Optional[str] = None,
        broadcast: bool = False,
        auto_commit: bool = False,
        batch_size: int = 32,
        consumer_retention_ms: int = 30_000,
        from_offset: str = "earliest",
        client_id: Optional[str] = None,
        rebalance_interval_ms: int = 100,
        skip_corrupt: bool = True,
        manual_ack: bool = False,
        max_reconsume_times: Optional[int] = None,
        max_unacked: int = 2000,
        orderly: bool = False,
        suspend_ms: int = 1000,
        sql: Optional[str] = None,
    ):
        if not isinstance(group, str) or TOPIC_RE.match(group) is None:
            raise ValueError(f"invalid group name {group!r}: must match [%|a-zA-Z0-9_-]{{1,255}}")
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
        if max_reconsume_times is not None and (
            isinstance(max_reconsume_times, bool) or not isinstance(max_reconsume_times, int) or max_reconsume_times < 0
        ):
            raise ValueError("max_reconsume_times must be an int >= 0 (or None: RocketMQ's default)")
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        if orderly and broadcast:
            raise ValueError("an orderly consumer holds its queues in a group: it cannot be a broadcast consumer")
        if not 10 <= suspend_ms <= 30_000:
            raise ValueError("suspend_ms must be within 10..30000 (RocketMQ's bounds)")
        if not broadcast:
            check_group_for_retry(group)
        self._mq = mq
        self._state = mq._client_state()
        self.group = group
        self.topics = tuple(dict.fromkeys(topics))
        self._topic_set = frozenset(self.topics)
        if tags is not None:
            tag_names(tags)  # FilterSyntaxError here, at creation ("||"), as RocketMQ's subscribe()
        self.tags = tags if tags not in (None, "", "*") else None
        # RocketMQ's MessageSelector.bySql: compiled once (FilterSyntaxError here, at creation)
        self.sql = sql
        self._sql_match = compile_sql92(sql).matches if sql is not None else None
        self.filtered_out = 0
        self.broadcast = broadcast
        self.orderly = orderly
        self.manual_ack = manual_ack or orderly
        manual_ack = self.manual_ack
        if max_reconsume_times is None:  # RocketMQ's -1: 16 for concurrent consumers, no limit for orderly ones
            max_reconsume_times = (1 << 31) - 1 if orderly else DEFAULT_MAX_RECONSUME_TIMES
        self.max_reconsume_times = max_reconsume_times
        self.max_unacked = 1 if orderly else max_unacked
        self.suspend_s = suspend_ms / 1000.0
        # with manual_ack the acknowledged prefix is recorded at every poll, as auto_commit records positions
        self.auto_commit = auto_commit or manual_ack
        # the topics this consumer reads: a clustering consumer also reads its group's retry topic
        self._read_topics = self.topics if broadcast else self.topics + (retry_topic(group),)
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
        self._lock = threading.RLock()  # one poll / commit / seek / close at a time; released while waiting
        # manual_ack: cursors' pending/inflight (ack() from any thread); taken inside _lock and the scheduler lock,
        # never around a store call. Lock order: ARCHITECTURE.md, Locks.
        self._ack_lock = threading.Lock()
        self._nack_lock = threading.Lock()  # one send-back at a time (a message is never sent back twice)
        self.acked = 0
        self.retried = 0
        self.dead_lettered = 0
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
        self._cid = self._sched.join(group, self._read_topics, consumer_retention_ms) if not broadcast else 0
        try:
            self._state.register(self, consumer=True)
        except BaseException:
            if not broadcast:
                self._sched.leave(group, self._cid)
            raise

    # -- assignment -------------------------------------------------------------------------------------------

    def _buckets(self) -> List[Bucket]:
        existing = self._mq.topics()
        return [(t, q) for t in self._read_topics for q in existing.get(t, ())]

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
        cur = _Cursor(b, epoch, off, committed, self)
        self._cursors[b] = cur
        self._order.append(cur)

    def _drop(self, b: Bucket) -> None:
        cur = self._cursors.pop(b, None)
        if cur is not None:
            cur.buffer.clear()
            cur.dropped = True
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
        a = self._sched.assign(self.group, self._cid, buckets, self.consumer_retention_ms, self._read_topics)
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
            raise ArgumentRangeError("max_messages must be at least 1", "max_messages")
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
                        f"queues {lost} passed to another consumer",
                        lost,
                    )
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
            if self.orderly:  # a suspended queue's message is due again: wake for it, not at the next slice
                redo = [cur.suspended_until for cur in self._order if cur.redo is not None]
                if redo:
                    wait = min(wait, max(0.001, min(redo) - time.monotonic()))
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
        manual = self.manual_ack
        # a takeover happens under the scheduler lock too: messages leave a buffer only while the grant holds
        with sched.lock:
            for i in range(n):
                cur = order[(start + i) % n]
                buf = cur.buffer
                if not buf and cur.redo is None:
                    continue
                if clustering and not sched.holds(self.group, self._cid, cur.bucket, cur.epoch):
                    self._lost.append(cur.bucket)
                    buf.clear()
                    continue
                want = max_n - len(out)
                if cur.redo is not None:
                    if not self._redeliver(cur, out):
                        continue
                    if len(out) >= max_n:
                        self._rr = (start + i + 1) % n
                        break
                    continue
                if manual:
                    room = self.max_unacked - len(cur.inflight)
                    if room <= 0:
                        continue  # too much outstanding from this queue: nothing until the oldest is done
                    want = min(want, room)
                before = len(out)
                if want == 1:
                    out.append(buf.popleft())
                elif len(buf) <= want:
                    out.extend(buf)
                    buf.clear()
                else:
                    for _ in range(want):
                        out.append(buf.popleft())
                if manual or cur.retry:
                    self._hand_out(cur, out, before)
                if len(out) >= max_n:
                    self._rr = (start + i + 1) % n
                    break
            else:
                self._rr = (start + 1) % n
        for b in self._lost:
            if b in self._cursors:
                self._drop(b)
        return out

    def _redeliver(self, cur: _Cursor, out: List[Message]) -> bool:
        """Orderly: hand out ``cur``'s failed message again once its suspension ended (it stayed pending)."""
        with self._ack_lock:
            m = cur.redo
            if m is None or time.monotonic() < cur.suspended_until:
                return False
            cur.redo = None
            bind_delivery(m, cur, None, cur.redo_count)
        out.append(m)
        return True

    def _inflate(self, msgs: List[Message]) -> None:
        """Bodies a RocketMQ producer compressed (sysflag COMPRESSED) are handed out inflated, as its client does;
        one that does not inflate is handed out as stored, with a warning."""
        for m in msgs:
            if m.sys_flag & SYSFLAG_COMPRESSED and not inflate_body(m):
                log.warning(
                    "group %s: %s queue %d offset %d: the body is marked compressed but does not inflate; "
                    "handed out as stored",
                    self.group,
                    m.topic,
                    m.queue_id,
                    m.queue_offset,
                )

    def _hand_out(self, cur: _Cursor, out: List[Message], start: int) -> None:
        """Messages ``out[start:]`` leave ``cur``: with manual_ack they become pending and ack()/nack() reach
        ``cur``; from the retry queue they show their business topic (RETRY_TOPIC), as RocketMQ's client does."""
        acker = cur if self.manual_ack else None
        retry = cur.retry
        with self._ack_lock:
            for j in range(start, len(out)):
                m = out[j]
                bind_delivery(m, acker, m.properties.get("RETRY_TOPIC") if retry else None)
                if acker is not None:
                    cur.pending.add(m.queue_offset)
                    cur.inflight.append(m.queue_offset)

    # -- acknowledgements (manual_ack) ---------------------------------------------------------------------------

    def _ack(self, cur: _Cursor, m: Message) -> None:
        with self._ack_lock:
            off = m.queue_offset
            if off not in cur.pending:
                return  # done before (ack twice, ack after nack)
            cur.pending.discard(off)
            self.acked += 1
            self._trim(cur)

    @staticmethod
    def _trim(cur: _Cursor) -> None:
        infl, pending = cur.inflight, cur.pending
        while infl and infl[0] not in pending:
            infl.popleft()

    def _nack(self, cur: _Cursor, m: Message, delay: Optional[float], delay_level: Optional[int]) -> None:
        with self._nack_lock:
            with self._ack_lock:
                if m.queue_offset not in cur.pending:
                    return
                dropped = cur.dropped
            if dropped:
                # the queue passed to another consumer: it delivers this message again from the committed offset
                with self._ack_lock:
                    cur.pending.discard(m.queue_offset)
                    self._trim(cur)
                return
            if self.orderly:
                with self._ack_lock:
                    count = m.reconsume_times + 1
                    if count <= self.max_reconsume_times and not (delay_level is not None and delay_level < 0):
                        # the same message again after the suspension; the queue hands out nothing else meanwhile
                        cur.redo = m
                        cur.redo_count = count
                        cur.suspended_until = time.monotonic() + (self.suspend_s if delay is None else delay)
                        return
                send_back(self._mq, self.group, m, delay_level=-1, max_reconsume_times=self.max_reconsume_times)
                self.dead_lettered += 1
            elif self.broadcast:
                log.warning(
                    "broadcast consumer of group %s: %s queue %d offset %d failed; dropped (broadcasting "
                    "consumers never send back)",
                    self.group,
                    m.topic,
                    m.queue_id,
                    m.queue_offset,
                )
            else:
                kind, _ = send_back(
                    self._mq,
                    self.group,
                    m,
                    delay=delay,
                    delay_level=delay_level,
                    max_reconsume_times=self.max_reconsume_times,
                )
                if kind == "dlq":
                    self.dead_lettered += 1
                else:
                    self.retried += 1
            with self._ack_lock:
                cur.pending.discard(m.queue_offset)
                self._trim(cur)

    def unacked(self) -> int:
        """How many messages handed out are neither acknowledged nor failed (manual_ack)."""
        with self._ack_lock:
            return sum(len(cur.pending) for cur in self._order)

    def listen(
        self,
        listener: Callable[[List[Message]], Optional[ConsumeStatus]],
        *,
        batch_size: int = 1,
        idle_timeout: Optional[float] = None,
        max_messages: Optional[int] = None,
    ) -> int:
        """Run a RocketMQ-style listener: ``listener(messages)`` for batches of up to ``batch_size`` messages; it
        answers ConsumeStatus.CONSUME_SUCCESS (or None) to acknowledge the batch, RECONSUME_LATER to fail it (each
        message sent back, see ``nack``); an exception it raises fails the batch too (logged). Returns the number
        of messages handled, when ``idle_timeout`` seconds passed without a message, when ``max_messages`` were
        handled, or when the consumer closed.

        Raises AckError (the consumer was not created with manual_ack=True), StoreClosedError (the consumer was
        closed before the call), TypeError (another answer), and what ``poll`` and ``nack`` raise.
        """
        if not self.manual_ack:
            raise AckError("listen() needs a consumer created with manual_ack=True")
        if self.closed:  # as poll: a closed consumer is misuse; closing it while it listens ends listen()
            raise StoreClosedError("the consumer is closed")
        handled = 0
        while not self.closed:
            want = batch_size if max_messages is None else min(batch_size, max_messages - handled)
            try:
                msgs = self.poll_batch(want, idle_timeout if idle_timeout is not None else self._wait_slice)
            except StoreClosedError:
                if self.closed:
                    break
                raise
            if not msgs:
                if idle_timeout is not None:
                    break
                continue
            try:
                status = listener(msgs)
            except Exception:  # noqa: BLE001 - RocketMQ's rule: a listener that throws asks for a retry
                log.exception(
                    "group %s: listener raised; the batch of %d will be consumed again later", self.group, len(msgs)
                )
                status = ConsumeStatus.RECONSUME_LATER
            if status is None or status is ConsumeStatus.CONSUME_SUCCESS:
                for m in msgs:
                    m.ack()
            elif status is ConsumeStatus.RECONSUME_LATER:
                for m in msgs:
                    m.nack()
            else:
                for m in msgs:
                    m.nack(delay_level=1)  # never leave a batch in flight; the wrong answer still raises
                raise TypeError(
                    f"a listener answers ConsumeStatus.CONSUME_SUCCESS, RECONSUME_LATER or None, not {status!r}"
                )
            handled += len(msgs)
            if max_messages is not None and handled >= max_messages:
                break
        return handled

    def _commit_point(self, cur: _Cursor) -> int:
        """What a commit records for ``cur``: its position, or with manual_ack the lowest offset not yet done."""
        if self.manual_ack:
            with self._ack_lock:
                if cur.inflight:
                    return cur.inflight[0]
        return cur.position

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
                # the retry queue is read with "*" (RocketMQ's subscription): its messages matched when first read
                r = mq.get_message(topic, qid, cur.fetch_offset, self.batch_size, tags=None if cur.retry else tags)
            except CorruptMessageError as e:
                # the messages before it were delivered by earlier pulls; skip this one, count it, go on
                if not self.skip_corrupt or e.next_offset is None or e.next_offset <= cur.fetch_offset:
                    raise
                log.error(
                    "group %s, %s queue %d: skipping corrupt message at queue offset %d: %s",
                    self.group,
                    topic,
                    qid,
                    cur.fetch_offset,
                    e,
                )
                self.skipped_corrupt += 1
                self.corrupt_errors.append(e)
                cur.fetch_offset = e.next_offset
                moved = True
                continue
            st = r.status
            if st is _FOUND:
                if r.compressed:
                    self._inflate(r.messages)
                msgs = r.messages
                match = self._sql_match
                if match is not None and not cur.retry:  # a retried message matched when first handed out
                    msgs = [m for m in msgs if match(m.properties)]
                    self.filtered_out += len(r.messages) - len(msgs)
                cur.buffer.extend(msgs)
                cur.fetch_offset = r.next_begin_offset
                moved = True
            elif st in _SKIP_AHEAD:
                cur.fetch_offset = r.next_begin_offset
                moved = True
            elif st is GetStatus.OFFSET_TOO_SMALL or st is GetStatus.OFFSET_OVERFLOW_BADLY:
                log.warning(
                    "group %s, %s queue %d: offset %d is outside %d..%d (%s); continuing from %d",
                    self.group,
                    topic,
                    qid,
                    cur.fetch_offset,
                    r.min_offset,
                    r.max_offset,
                    st.name,
                    r.next_begin_offset,
                )
                cur.fetch_offset = r.next_begin_offset
                moved = True
        return moved

    # -- offsets ----------------------------------------------------------------------------------------------

    def _commit_locked(self, buckets: Optional[Iterable[Bucket]]) -> Optional[int]:
        """Record the positions of ``buckets`` (None: every queue read) whose position moved; returns the table
        version, or None when nothing changed. Positions of queues lost to another consumer are not recorded."""
        curs = self._order if buckets is None else [self._cursors[b] for b in buckets if b in self._cursors]
        points = {cur.bucket: self._commit_point(cur) for cur in curs}
        changed = {cur.bucket: points[cur.bucket] for cur in curs if points[cur.bucket] != cur.committed}
        if not changed:
            return None
        if self._offset_group is None:  # broadcast without client_id: positions live in this object only
            for cur in curs:
                cur.committed = points[cur.bucket]
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
            with self._ack_lock:  # messages handed out before the seek no longer hold the committed offset back
                cur.pending.clear()
                cur.inflight.clear()

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
        return (
            f"<Consumer group={self.group!r} topics={list(self.topics)} {mode} queues={len(self._cursors)} "
            f"{'closed' if self.closed else 'open'}>"
        )
