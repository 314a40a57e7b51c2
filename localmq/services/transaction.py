"""TransactionalMessageCheckService: ends transactions (commit / rollback) and checks unresolved half messages back.

RocketMQ 4.9.8's broker side of transactional messages (spec rocketmq-semantics.md §4), in one object per store:

- ``prepare`` stores a half message as a 4.9.8 broker does (§4.3): topic RMQ_SYS_TRANS_HALF_TOPIC queue 0,
  properties TRAN_MSG=true, PGROUP, REAL_TOPIC, REAL_QID (and the producer's UNIQ_KEY, the transaction id), sysflag
  transaction bits NOT_TYPE (the broker resets them), so the half is an ordinary record of the half topic that no
  consumer of the real topic sees.
- ``end_transaction`` (§4.4): COMMIT puts the real record (REAL_TOPIC / REAL_QID; body, flag, born time and host,
  reconsume times copied; sysflag transaction bits COMMIT; prepared transaction offset = the half's commit-log
  offset; the half's properties bytes unchanged), then the op record; ROLLBACK puts only the op record
  (RMQ_SYS_TRANS_OP_HALF_TOPIC, queue of the half, body = the half's queue offset in decimal, properties WAIT=true
  and TAGS=d, born host = store host).
- the thread (``check_once`` every ``transaction_check_interval``) runs the check-back of §4.5 with its offsets
  under group CID_RMQ_SYS_TRANS in consumerOffset.json, TRANSACTION_CHECK_TIMES, the discard to
  TRANS_CHECK_MAX_TIME_TOPIC after ``transaction_check_max`` checks, CHECK_IMMUNITY_TIME_IN_SECONDS, and a re-put of
  the half at the tail of the half queue before each check; the check calls the check listener registered for the
  half's PGROUP in this process (``register``), then ends the transaction with its answer.

Exactly once across crashes (better than RocketMQ, which commits twice when the broker dies between the commit
put and the op record, or when a check answer races the producer's own answer): every COMMIT first looks for a
committed record of the same transaction (``find_commit``: the real topic's record with the half's UNIQ_KEY and
sysflag COMMIT, found through the IndexFile key ``<REAL_TOPIC>#<UNIQ_KEY>`` after the index has caught up, or a
scan of the real queue when the index is disabled). Every copy of a half (the check re-puts) shares the UNIQ_KEY,
so a commit of any copy is found. When one exists only the missing op record is written. The check-back does the
same look-up before it re-puts or asks the listener, so a transaction whose commit survived a crash is closed
without a question. Commits and op records of one store are written under one lock (``_end_lock``), so the
look-up and the put it guards cannot interleave with another commit in this process; stores shared between
processes have no checker (TransactionNotSupportedError), so no other process commits. A producer's own commit
skips the look-up (its UNIQ_KEY is fresh) unless the checker already asked about that transaction.
A half message without UNIQ_KEY (a foreign client's) cannot be looked up and is committed as RocketMQ would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from localmq._record import Message, properties_to_bytes
from localmq.errors import InvalidTransactionError, SendError
from localmq.layout import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    is_decimal,
)
from localmq.services.service_thread import ServiceThread
from localmq.status import LocalTransactionState, PutStatus
from localmq.store.commit_log import PutExtra

log = logging.getLogger("localmq.services")

# TopicValidator / TransactionalMessageUtil names (spec §4.2)
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"
OP_REMOVE_TAG = "d"
# MessageConst property keys (spec §4.2)
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_DELAY = "DELAY"

# The op record's stored properties: RocketMQ builds it with new Message(opTopic, "d", body), whose properties are
# a default HashMap (16 buckets) holding TAGS and WAIT=true; it iterates bucket order: WAIT (13) before TAGS (14).
OP_PROPERTIES = properties_to_bytes({"WAIT": "true", "TAGS": OP_REMOVE_TAG})

HALF_QUEUE_ID = 0  # RocketMQ uses only queue 0 of the half topic (and the same id in the op topic)
OP_BATCH = 32  # ops read per getOpMsg in RocketMQ; here the unit count read per CQ scan step
MAX_CHECK_SECONDS = 60.0  # RocketMQ's MAX_PROCESS_TIME_LIMIT: one queue is walked at most this long per pass
_CHECKED_KEYS_MAX = 65_536  # transaction ids the checker asked about, remembered for the producers' commits
_STORED_ANYWAY = (
    PutStatus.PUT_OK,
    PutStatus.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE,
)

CheckListener = Callable[[Message], Any]


def half_properties(topic: str, queue_id: int, group: str, properties: Dict[str, str]) -> Dict[str, str]:
    """The properties of a half message as a 4.9.8 broker stores them (§4.3): the producer's (DELAY removed, as its
    client does), then TRAN_MSG=true, PGROUP, REAL_TOPIC and REAL_QID. ``properties`` is not modified."""
    props = {k: v for k, v in properties.items() if k != PROPERTY_DELAY}
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_PRODUCER_GROUP] = group
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return props


def user_message(half: Message) -> Message:
    """The message a local transaction or check listener sees: the half's body, flag and properties, with topic
    and queue id REAL_TOPIC / REAL_QID (RocketMQ's check request rewrites them the same way). ``uniq_key`` is the
    transaction id."""
    props = half.properties
    try:
        qid = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
    except ValueError:
        qid = 0
    return Message(
        props.get(PROPERTY_REAL_TOPIC, half.topic), bytes(half.body), properties=props, flag=half.flag, queue_id=qid
    )


def _stored(r: Any, what: str) -> Any:
    if r.status not in _STORED_ANYWAY:
        raise SendError(f"{what}: put answered {r.status.name}", r.status, r, 0)
    return r


class TransactionalMessageCheckService(ServiceThread):
    """RocketMQ's TransactionalMessageCheckService + TransactionalMessageServiceImpl + EndTransactionProcessor.

    Params (callables the queue hands in; the services layer never sees a queue or a client):
    ``read(physical_offset)`` -> Message or None; ``put(topic, body, queue_id=, properties=, flag=)`` and
    ``put_ext(topic, body, queue_id=, flag=, extra=)`` -> PutResult; ``find_cq(topic, queue_id)`` -> ConsumeQueue
    or None; ``find_commit(half)`` -> the committed Message of that transaction or None (raises when it cannot tell);
    ``query_offset(topic)`` -> committed offset of CID_RMQ_SYS_TRANS in (topic, 0) or None; ``commit_offsets({topic:
    offset})``; ``flush_log()`` (before offsets that cover re-puts are committed); ``store_host`` (born host of op
    records); ``timeout_ms``, ``check_max``, ``interval_ms``, ``file_reserved_ms`` (BrokerConfig / store
    settings); ``clock()`` -> ms since the epoch; ``before_pass()`` (the queue waits for its dispatcher, so that
    every op record written before a pass is in the op queue the pass reads).

    Checks run only while at least one check listener is registered (a TransactionProducer exists in this
    process); a half message whose PGROUP has no listener here is counted and re-put as RocketMQ does when no
    producer of the group is online, and is discarded after ``check_max`` checks.

    Thread-safety: ``end_transaction`` may be called from any thread; commits and op records are written under
    ``_end_lock``, taken before the store's put lock (ARCHITECTURE.md, Locks). Listeners are called without any lock.
    """

    def __init__(
        self,
        *,
        read: Callable[[int], Optional[Message]],
        put: Callable[..., Any],
        put_ext: Callable[..., Any],
        find_cq: Callable[[str, int], Any],
        find_commit: Callable[[Message], Optional[Message]],
        query_offset: Callable[[str], Optional[int]],
        commit_offsets: Callable[[Dict[str, int]], None],
        flush_log: Callable[[], None],
        store_host: str,
        timeout_ms: int = 6000,
        check_max: int = 15,
        interval_ms: int = 60_000,
        file_reserved_ms: int = 72 * 3_600_000,
        clock: Optional[Callable[[], int]] = None,
        before_pass: Optional[Callable[[], Any]] = None,
    ):
        super().__init__("TransactionalMessageCheckService")
        self._read = read
        self._put = put
        self._put_ext = put_ext
        self._find_cq = find_cq
        self._find_commit = find_commit
        self._query_offset = query_offset
        self._commit_offsets = commit_offsets
        self._flush_log = flush_log
        self._before_pass = before_pass
        self.store_host = store_host
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.interval_ms = interval_ms
        self.file_reserved_ms = file_reserved_ms
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._end_lock = threading.Lock()  # commits and op records: look-up and put together
        self._listeners_lock = threading.Lock()  # the listener table
        self._listeners: Dict[str, List[CheckListener]] = {}
        # UNIQ_KEYs the checker asked a listener about (guarded by _end_lock): a producer's own commit of one of
        # them looks for an earlier commit first
        self._checked: "OrderedDict[str, None]" = OrderedDict()
        self.checks = 0
        self.commits = 0
        self.rollbacks = 0
        self.discarded = 0
        self.duplicates_avoided = 0
        self.unanswered = 0
        self.passes = 0

    # -- listeners ----------------------------------------------------------------------------------------------

    def register(self, group: str, listener: CheckListener) -> None:
        """Answer check-backs of half messages whose PGROUP is ``group`` with ``listener(message)``."""
        with self._listeners_lock:
            self._listeners.setdefault(group, []).append(listener)
        self.wakeup()

    def unregister(self, group: str, listener: CheckListener) -> None:
        with self._listeners_lock:
            row = self._listeners.get(group)
            if row is not None and listener in row:
                row.remove(listener)
                if not row:
                    del self._listeners[group]

    def _listener(self, group: Optional[str]) -> Optional[CheckListener]:
        with self._listeners_lock:
            row = self._listeners.get(group or "")
            return row[0] if row else None

    @property
    def has_listeners(self) -> bool:
        with self._listeners_lock:
            return bool(self._listeners)

    def read(self, physical_offset: int) -> Optional[Message]:
        """The record at ``physical_offset`` (a half message to end), or None."""
        return self._read(physical_offset)

    # -- prepare / end ------------------------------------------------------------------------------------------

    def prepare(
        self, topic: str, body: Any, queue_id: int, group: str, properties: Dict[str, str], flag: int = 0
    ) -> Any:
        """Put the half message of a transaction (§4.3). ``properties`` must hold UNIQ_KEY. Returns the PutResult;
        raises SendError when it was not stored, and what ``put`` raises."""
        props = half_properties(topic, queue_id, group, properties)
        r = self._put(TRANS_HALF_TOPIC, body, queue_id=HALF_QUEUE_ID, properties=props, flag=flag)
        return _stored(r, "half message")

    def end_transaction(
        self, half: Message, state: LocalTransactionState, *, group: Optional[str] = None, look_up: bool = True
    ) -> Tuple[Any, Any]:
        """End the transaction of the half record ``half`` (as read from the log, any copy) with ``state`` (§4.4).

        COMMIT: the real record (unless one of this transaction is already committed, see the module docstring),
        then the op record; ROLLBACK: the op record; UNKNOW: nothing. ``group``: when given, the half's PGROUP must
        equal it. ``look_up=False`` (a producer's commit right after its own prepare) skips the search for an
        earlier commit unless the checker asked about this transaction. Returns (commit PutResult or None, op
        PutResult or None). Raises InvalidTransactionError (not a half message, or of another group), SendError
        (a put not stored: the half stays and is checked back), what ``find_commit`` raises.
        """
        state = LocalTransactionState(state)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            raise InvalidTransactionError(f"not a half message: {half!r}")
        props = half.properties
        if group is not None and props.get(PROPERTY_PRODUCER_GROUP) != group:
            raise InvalidTransactionError(
                f"the half message at {half.physical_offset} belongs to producer group "
                f"{props.get(PROPERTY_PRODUCER_GROUP)!r}, not {group!r}"
            )
        if not props.get(PROPERTY_REAL_TOPIC) or not is_decimal(props.get(PROPERTY_REAL_QUEUE_ID, "")):
            raise InvalidTransactionError(f"the half message at {half.physical_offset} has no REAL_TOPIC/REAL_QID")
        if state is LocalTransactionState.UNKNOW:
            return None, None
        with self._end_lock:
            commit = None
            if state is LocalTransactionState.COMMIT_MESSAGE:
                key = half.uniq_key
                existing = None
                if look_up or (key is not None and key in self._checked):
                    existing = self._find_commit(half)
                if existing is None:
                    commit = self._put_commit(half, props)
                    self.commits += 1
                else:
                    self.duplicates_avoided += 1
                    log.info(
                        "transaction %s is already committed at %d: writing only its op record",
                        key,
                        existing.physical_offset,
                    )
            else:
                self.rollbacks += 1
            op = self._put_op(half)
        return commit, op

    def _put_commit(self, half: Message, props: Dict[str, str]) -> Any:
        extra = PutExtra(
            sys_flag=(half.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.physical_offset,
            raw_properties=bytes(half.raw_properties),
        )
        r = self._put_ext(
            props[PROPERTY_REAL_TOPIC],
            half.body,
            queue_id=int(props[PROPERTY_REAL_QUEUE_ID]),
            flag=half.flag,
            extra=extra,
        )
        return _stored(r, "committed message")

    def _put_op(self, half: Message) -> Any:
        extra = PutExtra(sys_flag=SYSFLAG_TRANSACTION_NOT_TYPE, born_host=self.store_host, raw_properties=OP_PROPERTIES)
        r = self._put_ext(TRANS_OP_HALF_TOPIC, str(half.queue_offset).encode(), queue_id=half.queue_id, extra=extra)
        return _stored(r, "op record")

    # -- check-back ---------------------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(self.interval_ms)
            if self.stopped:
                break
            if not self.has_listeners:
                continue
            try:
                self.check_once()
            except Exception as e:  # noqa: BLE001 - logged and counted; the next pass retries
                self.errors += 1
                self.last_error = e
                log.exception("service %s: check pass failed", self.name)

    def _ops(self, op_cq: Any, op_offset: int, half_offset: int) -> Tuple[Dict[int, int], Set[int], Dict[int, int]]:
        """Every op record from ``op_offset``: ({half queue offset: op queue offset} still to meet, done ops,
        {half queue offset: op queue offset} of every op read, those below ``half_offset`` included)."""
        remove: Dict[int, int] = {}
        done: Set[int] = set()
        ended: Dict[int, int] = {}
        if op_cq is None:
            return remove, done, ended
        for off in range(op_offset, op_cq.max_offset):
            unit = op_cq.unit(off)
            m = self._read(unit[0]) if unit is not None else None
            if m is None or m.topic != TRANS_OP_HALF_TOPIC:
                done.add(off)  # a lost or foreign unit: nothing to wait for
                continue
            try:
                half_off = int(bytes(m.body).decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                half_off = -1
            if m.tags != OP_REMOVE_TAG or half_off < 0:
                done.add(off)  # RocketMQ logs an illegal op and never moves past it; it can only be skipped
                continue
            ended[half_off] = off
            if half_off < half_offset:
                done.add(off)
            else:
                remove[half_off] = off
        return remove, done, ended

    def check_once(self) -> int:
        """One pass of the check-back over the half queue (§4.5). Returns the number of listener calls."""
        half_cq = self._find_cq(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        if half_cq is None:
            return 0
        self.passes += 1
        if self._before_pass is not None:
            self._before_pass()
        op_cq = self._find_cq(TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
        start = self._clock()
        t0 = time.monotonic()
        half_offset = self._query_offset(TRANS_HALF_TOPIC)
        half_offset = half_cq.min_offset if half_offset is None else max(half_offset, half_cq.min_offset)
        op_min = op_cq.min_offset if op_cq is not None else 0
        op_offset = self._query_offset(TRANS_OP_HALF_TOPIC)
        op_offset = op_min if op_offset is None else max(op_offset, op_min)
        remove, done, ended = self._ops(op_cq, op_offset, half_offset)
        calls = 0
        i = half_offset
        new_offset = half_offset
        while i < half_cq.max_offset and not self.stopped:
            if time.monotonic() - t0 > MAX_CHECK_SECONDS:
                break
            if i in remove:
                done.add(remove.pop(i))
                i += 1
                new_offset = i
                continue
            unit = half_cq.unit(i)
            m = self._read(unit[0]) if unit is not None else None
            if m is None or m.topic != TRANS_HALF_TOPIC:
                log.warning("%s: no half record for unit %d; skipped", self.name, i)
                i += 1
                new_offset = i
                continue
            outcome = self._check_one(m, start, remove, done, ended)
            if outcome == "stop":
                break
            if outcome == "checked":
                calls += 1
            i += 1
            new_offset = i
        self._commit_progress(half_offset, new_offset, op_offset, done)
        return calls

    def _commit_progress(self, old_half: int, new_half: int, old_op: int, done: Set[int]) -> None:
        op = old_op
        while op in done:
            op += 1
        if new_half != old_half or op != old_op:
            # the re-puts and ends of this pass reach the disk before offsets that skip their originals
            self._flush_log()
            self._commit_offsets({TRANS_HALF_TOPIC: new_half, TRANS_OP_HALF_TOPIC: op})

    def _check_one(self, m: Message, start: int, remove: Dict[int, int], done: Set[int], ended: Dict[int, int]) -> str:
        """One half record: "next" (done with it), "stop" (end this pass) or "checked" (re-put and a listener
        asked). ``remove``, ``done``, ``ended``: see ``_ops``."""
        props = m.properties
        now = self._clock()
        times = props.get(PROPERTY_TRANSACTION_CHECK_TIMES)
        check_times = 1
        if times is not None:
            try:
                check_times = int(times)
            except ValueError:
                check_times = 0
            if check_times >= self.check_max:
                self._discard(m, bytes(m.raw_properties), "checked %d times" % check_times)
                return "next"
            check_times += 1
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
        if now - m.born_timestamp > self.file_reserved_ms:
            self._discard(m, properties_to_bytes(props), "older than file_reserved_time")
            return "next"
        if m.store_timestamp >= start:
            return "stop"  # stored during this pass (a re-put of ours): the next pass
        age = now - m.born_timestamp
        immunity = self.timeout_ms
        immunity_text = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if immunity_text is not None:
            try:
                seconds = int(immunity_text)
                immunity = self.timeout_ms if seconds == -1 else seconds * 1000
            except ValueError:
                immunity = self.timeout_ms
            if age < immunity and self._immune(m, props, remove, done, ended):
                return "next"
        elif 0 <= age < immunity:
            return "stop"  # FIFO by born time: later halves are younger still
        # Here every op record is known (``_ops`` read them all), so the half needs a check when it is old enough
        # (or its born time is in the future: a clock that went back), as RocketMQ decides once its ops run out.
        if not (age > immunity or age <= -1):
            return "stop"
        prepared = props.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
        if is_decimal(prepared) and int(prepared) in ended:
            # an immunity copy whose original was ended meanwhile: RocketMQ checks it again once its immunity is
            # over (a second commit if the answer is COMMIT); the op naming the original already ended it
            done.add(ended[int(prepared)])
            return "next"
        return self._check(m, props)

    def _immune(
        self, m: Message, props: Dict[str, str], remove: Dict[int, int], done: Set[int], ended: Dict[int, int]
    ) -> bool:
        """RocketMQ's checkPrepareQueueOffset: a half still inside its CHECK_IMMUNITY_TIME is re-put with
        TRAN_PREPARED_QUEUE_OFFSET naming the original, or is done when an op names that original (RocketMQ looks
        only among ops at or above the half offset, so it misses the usual case, an op naming the original that
        the walk has already passed; ``ended`` holds every op read)."""
        prepared = props.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
        if prepared is not None:
            try:
                off = int(prepared)
            except ValueError:
                off = -1
            if off == -1:
                return False
            if off in ended:
                done.add(ended[off])
                remove.pop(off, None)
                return True
        props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(m.queue_offset if prepared is None else prepared)
        self._re_put(m, props)
        return True

    def _check(self, m: Message, props: Dict[str, str]) -> str:
        # a transaction whose commit survived a crash is closed without asking anyone (see the module docstring)
        existing = self._find_commit(m)
        if existing is not None:
            self.end_transaction(m, LocalTransactionState.COMMIT_MESSAGE)
            return "next"
        r = self._re_put(m, props)
        copy = self._read(r.physical_offset)
        if copy is None:
            raise SendError(f"the half copy at {r.physical_offset} cannot be read back", r.status, r, 1)
        self.checks += 1
        group = props.get(PROPERTY_PRODUCER_GROUP)
        listener = self._listener(group)
        if listener is None:
            self.unanswered += 1
            log.warning(
                "%s: no check listener of producer group %r in this process for transaction %s",
                self.name,
                group,
                m.uniq_key,
            )
            return "checked"
        key = m.uniq_key
        if key is not None:
            with self._end_lock:
                self._checked[key] = None
                while len(self._checked) > _CHECKED_KEYS_MAX:
                    self._checked.popitem(last=False)
        try:
            state = LocalTransactionState(listener(user_message(copy)))
        except Exception:  # noqa: BLE001 - RocketMQ's client logs it and answers UNKNOW; checked again later
            log.exception("%s: check listener of %r failed for transaction %s", self.name, group, key)
            state = LocalTransactionState.UNKNOW
        self.end_transaction(copy, state)
        return "checked"

    def _re_put(self, m: Message, props: Dict[str, str]) -> Any:
        """RocketMQ's putBackHalfMsgQueue: a copy of the half at the tail of its queue, properties re-serialised
        (with the new TRANSACTION_CHECK_TIMES), born time and host, sysflag and reconsume times kept."""
        extra = PutExtra(
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
            raw_properties=properties_to_bytes(props),
        )
        return _stored(
            self._put_ext(TRANS_HALF_TOPIC, m.body, queue_id=m.queue_id, flag=m.flag, extra=extra),
            "half message re-put",
        )

    def _discard(self, m: Message, raw: bytes, why: str) -> None:
        """RocketMQ's resolveDiscardMsg: a copy in TRANS_CHECK_MAX_TIME_TOPIC queue 0, every field kept."""
        extra = PutExtra(
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
            raw_properties=raw,
        )
        _stored(
            self._put_ext(TRANS_CHECK_MAX_TIME_TOPIC, m.body, queue_id=0, flag=m.flag, extra=extra),
            "discarded half message",
        )
        self.discarded += 1
        log.warning("%s: transaction %s discarded to %s (%s)", self.name, m.uniq_key, TRANS_CHECK_MAX_TIME_TOPIC, why)

    def stats(self) -> Dict[str, Any]:
        return {
            "passes": self.passes,
            "checks": self.checks,
            "commits": self.commits,
            "rollbacks": self.rollbacks,
            "discarded": self.discarded,
            "duplicates_avoided": self.duplicates_avoided,
            "unanswered": self.unanswered,
            "errors": self.errors,
        }
