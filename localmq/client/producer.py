"""Producer: sends messages to a queue (Memory, Embedded or Local), one queue id per producer by default."""

from __future__ import annotations

import itertools
import os
import random
import socket
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from localmq._record import Message, properties_to_bytes
from localmq.config import check_queue_id, check_topic, message_properties
from localmq.errors import DelayNotSupportedError, InvalidDelayError, SendError, StoreClosedError
from localmq.services.schedule import delay_rewrite, level_for_delay
from localmq.status import PutStatus

QueueSelector = Callable[[Message, int], int]
# on_delivery(result, error): called after each send; error is the SendError that send would have raised, or None
DeliveryCallback = Callable[[Any, Optional[SendError]], None]

_MESSAGE_ONLY = ("TAGS", "KEYS")
_STORED_ANYWAY = (PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT, PutStatus.SLAVE_NOT_AVAILABLE)


class _UniqKeys:
    """RocketMQ's client message ids (MessageClientIDSetter, the UNIQ_KEY property): 16 bytes as 32 upper-case hex
    digits: an IPv4 address, the low 16 bits of the pid, 4 bytes fixed per process (RocketMQ: its class loader's
    hash; here random), the ms since the start of the month (local time, int32), and a 16-bit counter. Recomputed
    in a forked child (the pid changes)."""

    def __init__(self) -> None:
        self._pid = -1
        self._prefix = ""
        self._month_start = 0.0
        self._next_month = 0.0
        self._counter = itertools.count(random.randrange(1 << 16))

    @staticmethod
    def _ip() -> bytes:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))  # no packet is sent: the route picks the outgoing address
                return socket.inet_aton(s.getsockname()[0])
        except OSError:
            return int(time.time() * 1000).to_bytes(8, "big")[-4:]  # RocketMQ's createFakeIP

    def _month(self, now: float) -> None:
        t = time.localtime(now)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        nxt = time.mktime((t.tm_year + t.tm_mon // 12, t.tm_mon % 12 + 1, 1, 0, 0, 0, 0, 0, -1))
        self._month_start, self._next_month = start, nxt

    def new(self) -> str:
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._prefix = (
                (self._ip() + (pid & 0xFFFF).to_bytes(2, "big") + random.getrandbits(32).to_bytes(4, "big"))
                .hex()
                .upper()
            )
        now = time.time()
        if now >= self._next_month or now < self._month_start:
            self._month(now)
        # RocketMQ writes (int) of the ms since the month began: past 2**31 ms (day 25) the int wraps negative, and
        # its hex is the low 32 bits; masking to 31 bits made the time field wrong from then to the month's end
        ms = max(0, int((now - self._month_start) * 1000)) & 0xFFFFFFFF
        return "%s%08X%04X" % (self._prefix, ms, next(self._counter) & 0xFFFF)


_uniq_keys = _UniqKeys()


def new_uniq_key() -> str:
    """A new client message id (RocketMQ's UNIQ_KEY format, 32 hex digits)."""
    return _uniq_keys.new()


def build_properties(tags: Optional[str], keys: Any, properties: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The properties dict of a message (TAGS and KEYS folded in), validated as the CommitLog validates them.

    Raises ArgumentTypeError, InvalidPropertyError, PropertiesSizeError.
    """
    d = message_properties(tags, keys, properties)
    if d:
        properties_to_bytes(d)  # raises on an empty name, separators, more than 32767 bytes
    return d


def producer_queue(mq: Any, state: Any, queue_id: Optional[int], queue_nums: Optional[int]) -> "tuple[int, int]":
    """(queue_nums, queue id) of a new producer: ``queue_id``, else the producer's number modulo ``queue_nums``
    (the queue's ``default_queue_nums`` when not given). Raises ValueError, InvalidQueueIdError."""
    nums = int(queue_nums or mq.default_queue_nums)
    if nums < 1:
        raise ValueError("queue_nums must be at least 1")
    if queue_id is None:
        queue_id = state.next_producer_slot() % nums
    check_queue_id(queue_id)
    return nums, queue_id


def _delay_property(value: Optional[str]) -> Optional[int]:
    """The delay level a DELAY property asks for: a positive decimal int, else None (RocketMQ delays a message
    only when its level is > 0; an empty value is no delay, as a broker's parsed properties have no DELAY then).
    Raises InvalidDelayError for a value that is not an int."""
    if not value:
        return None
    try:
        level = int(value)
    except (TypeError, ValueError):
        raise InvalidDelayError(f"property DELAY must be a delay level (an int), not {value!r}") from None
    return level if level > 0 else None


class Producer:
    """Sends messages to the queue it was created from (``mq.create_producer()``).

    Every topic's messages from this producer go to one queue id of its own (``queue_id``; by default producers
    are numbered and take ``number % queue_nums``, LocalMQ's "the queue id follows the producer"), so the messages
    of one producer are stored, and consumed, in the order it sent them. ``queue_selector(message, queue_nums)
    -> queue id`` chooses per message instead (RocketMQ's MessageQueueSelector; e.g. by order id for ordered
    messages per key).

    Results are PutResult (``ok``, ``status``, ``queue_offset``...). A put that does not answer PUT_OK (a full disk,
    a SYNC_FLUSH timeout) raises SendError, which says how many messages were stored; with ``on_delivery(result,
    error)`` (fire-and-forget code) the callback gets the result and that error instead, and nothing is raised.
    Invalid input raises (InvalidTopicError, MessageSizeError...). The low-level ``put`` / ``put_batch`` keep
    RocketMQ's statuses.

    ``send`` gives each message a UNIQ_KEY property (RocketMQ's client message id, unless it has one), so
    ``look_message_by_id(uniq_key)`` and the index find it, as they find RocketMQ producers' messages;
    ``uniq_keys=False`` leaves it out (43 bytes less per record). ``send_batch`` shares one set of properties
    across its batch and sets none.

    Thread-safety: a producer may be shared by threads; the order of its messages in a queue is then the order
    in which the ``send`` calls took the queue's put lock. ``close()`` (or ``with``) only forbids further sends.
    """

    def __init__(
        self,
        mq,
        *,
        queue_id: Optional[int] = None,
        queue_selector: Optional[QueueSelector] = None,
        queue_nums: Optional[int] = None,
        on_delivery: Optional[DeliveryCallback] = None,
        uniq_keys: bool = True,
    ):
        state = mq._client_state()
        self.queue_nums, self.queue_id = producer_queue(mq, state, queue_id, queue_nums)
        self.queue_selector = queue_selector
        self.on_delivery = on_delivery
        self.uniq_keys = uniq_keys
        self._mq = mq
        self._state = state
        self._put = mq.put
        self._put_batch = mq.put_batch
        self.closed = False
        state.register(self, consumer=False)

    def create_message(
        self, topic: str, body, *, tags: Optional[str] = None, keys=None, properties: Optional[Dict[str, str]] = None
    ) -> Message:
        """A Message to ``send`` later (OpenMessaging style)."""
        return Message(topic, body, tags=tags, keys=keys, properties=properties)

    def _queue_for(self, message: Message) -> int:
        q = self.queue_selector(message, self.queue_nums)
        check_queue_id(q)
        return q

    def send(
        self,
        topic: Union[str, Message],
        body=None,
        *,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        delay_level: Optional[int] = None,
        delay: Optional[float] = None,
    ):
        """Send one message: ``send(topic, body, tags=..., keys=..., properties=...)`` or ``send(message)``.

        Delayed messages (RocketMQ's delay levels, ``message_delay_level``): ``delay_level=N`` (1-based; above the
        largest level it is clamped to it, as RocketMQ does) or ``delay=seconds`` (the smallest level whose delay
        is >= seconds, so never earlier than asked; ``delay=0`` is level 1). The message is stored as RocketMQ
        stores it: topic SCHEDULE_TOPIC_XXXX, queue id level - 1, properties DELAY, REAL_TOPIC, REAL_QID added;
        the store's ScheduleMessageService puts it in ``topic`` when due. A LocalMessageQueue has that service (in
        a store shared between processes it runs in the housekeeper process); the Embedded and Memory queues do
        not.

        Returns PutResult (for a delayed message, that of the SCHEDULE_TOPIC_XXXX record). Raises
        StoreClosedError (producer or queue closed), InvalidTopicError, MessageSizeError, PropertiesSizeError,
        InvalidPropertyError, InvalidDelayError (a level < 1, a delay longer than the largest level, both given),
        DelayNotSupportedError (a delayed send to an embedded or memory queue).
        """
        if self.closed:
            raise StoreClosedError("the producer is closed")
        if delay_level is None and delay is None:
            # a DELAY property delays the message, as a RocketMQ broker does (Message.setDelayTimeLevel)
            if properties is not None and "DELAY" in properties:
                delay_level = _delay_property(properties["DELAY"])
            elif isinstance(topic, Message):
                delay_level = _delay_property(topic.properties.get("DELAY"))
        if delay_level is not None or delay is not None:
            return self._send_delayed(topic, body, tags, keys, properties, delay_level, delay)
        if isinstance(topic, Message):
            m = topic
            props = m.properties
            tags = props.pop("TAGS", None)
            keys = props.pop("KEYS", None)
            if self.uniq_keys and "UNIQ_KEY" not in props:
                props["UNIQ_KEY"] = _uniq_keys.new()
            qid = self._queue_for(m) if self.queue_selector is not None else self.queue_id
            r = self._put(
                m.topic,
                m.body,
                queue_id=qid,
                tags=tags,
                keys=keys.split(" ") if keys else None,
                properties=props or None,
                flag=m.flag,
            )
            return self._deliver(r, 1, uniq_key=props.get("UNIQ_KEY"))
        if self.uniq_keys and (properties is None or "UNIQ_KEY" not in properties):
            properties = dict(properties or ())
            properties["UNIQ_KEY"] = _uniq_keys.new()
        if self.queue_selector is None:
            r = self._put(topic, body, queue_id=self.queue_id, tags=tags, keys=keys, properties=properties)
        else:
            m = Message(topic, body, tags=tags, keys=keys, properties=properties)
            r = self._put(topic, body, queue_id=self._queue_for(m), tags=tags, keys=keys, properties=properties)
        return self._deliver(r, 1, uniq_key=properties.get("UNIQ_KEY") if properties else None)

    def _send_delayed(self, topic, body, tags, keys, properties, delay_level, delay):
        levels_of = getattr(self._mq, "delay_levels_ms", None)
        if levels_of is None:
            raise DelayNotSupportedError(
                f"{type(self._mq).__name__} has no ScheduleMessageService: delayed messages need a "
                f"LocalMessageQueue (localmq.open(path))"
            )
        levels = levels_of()
        if delay_level is not None and delay is not None:
            raise InvalidDelayError("pass delay_level or delay, not both")
        level = level_for_delay(levels, delay) if delay is not None else delay_level
        flag = 0
        if isinstance(topic, Message):
            m = topic
            topic, body, flag = m.topic, m.body, m.flag
            properties = m.properties
            tags = properties.pop("TAGS", None)
            keys = properties.pop("KEYS", None)
            keys = keys.split(" ") if keys else None
        else:
            m = Message(topic, body, tags=tags, keys=keys, properties=properties)
        check_topic(topic)  # the real topic: the put checks only SCHEDULE_TOPIC_XXXX
        qid = self._queue_for(m) if self.queue_selector is not None else self.queue_id
        if self.uniq_keys and (properties is None or "UNIQ_KEY" not in properties):
            properties = dict(properties or ())
            properties["UNIQ_KEY"] = _uniq_keys.new()
        stopic, sqid, props = delay_rewrite(topic, qid, properties, level, len(levels))
        r = self._put(stopic, body, queue_id=sqid, tags=tags, keys=keys, properties=props, flag=flag)
        return self._deliver(r, 1, uniq_key=props.get("UNIQ_KEY"))

    def _deliver(self, r, count: int, before=(), uniq_key: Optional[str] = None):
        """PutResult ``r`` of ``count`` messages (its ``uniq_key`` set to the client message id of a single send):
        returned when PUT_OK; else SendError, raised or handed to ``on_delivery``."""
        if uniq_key is not None and hasattr(r, "uniq_key"):
            r.uniq_key = uniq_key
        err = None
        if r.status is not PutStatus.PUT_OK:
            # a timeout answers after the messages were written; a refusal or a full disk stored msg_num of them
            stored = count if r.status in _STORED_ANYWAY else int(getattr(r, "msg_num", 0) or 0)
            why = ""
            cl = getattr(self._mq, "commit_log", None)
            failure = getattr(cl, "sync_failure", None)
            if r.status is PutStatus.CREATE_MAPPED_FILE_FAILED:
                why = getattr(cl, "last_failure", None) or ""
            elif failure is not None and r.status in (PutStatus.SERVICE_NOT_AVAILABLE, PutStatus.FLUSH_DISK_TIMEOUT):
                why = (
                    f"a flush of the commit log failed ({failure}); a failed flush is never retried: the store "
                    f"takes no more puts until it is closed and opened again"
                )
            err = SendError(
                f"send answered {r.status.name}: {stored} of {count} message(s) stored"
                f"{' (not known to be on disk)' if 'TIMEOUT' in r.status.name else ''}"
                f"{'; ' + why if why else ''}",
                r.status,
                r,
                stored,
                before,
            )
            if failure is not None and why and r.status is not PutStatus.CREATE_MAPPED_FILE_FAILED:
                err.__cause__ = failure
        if self.on_delivery is not None:
            self.on_delivery(r, err)
        elif err is not None:
            raise err
        return r

    def send_batch(
        self,
        topic: Union[str, List[Message]],
        bodies: Optional[Iterable] = None,
        *,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
    ):
        """Send several bodies to one queue with consecutive offsets under one lock (``put_batch``); they share
        ``tags``, ``keys`` and ``properties``. ``send_batch(messages)`` sends Message objects in order, one
        ``put_batch`` for each run of consecutive messages with the same topic, tags, keys, properties and flag,
        and returns the list of those runs' PutResults.

        Returns PutResult for the batch (``msg_num``, ``queue_offset`` of the first). The queue is chosen once
        for the batch (``queue_selector`` sees the first message). Raises SendError when the put does not answer
        PUT_OK: ``stored`` says how many of this batch (or run) are in the log, ``results`` the runs before it.
        """
        if self.closed:
            raise StoreClosedError("the producer is closed")
        if not isinstance(topic, str):
            msgs = list(topic)
            if any(_delay_property(m.properties.get("DELAY")) for m in msgs):
                raise InvalidDelayError(
                    "a batch cannot be delayed (RocketMQ refuses delayed batches too): send delayed messages one by one"
                )
            return self._send_messages(msgs)
        if properties is not None and _delay_property(properties.get("DELAY")):
            raise InvalidDelayError(
                "a batch cannot be delayed (RocketMQ refuses delayed batches too): send delayed messages one by one"
            )
        bodies = bodies if isinstance(bodies, list) else list(bodies)
        if not bodies:
            raise ValueError("send_batch needs at least one body")
        qid = self.queue_id
        if self.queue_selector is not None:
            qid = self._queue_for(Message(topic, bodies[0], tags=tags, keys=keys, properties=properties))
        r = self._put_batch(topic, bodies, queue_id=qid, tags=tags, keys=keys, properties=properties)
        return self._deliver(r, len(bodies))

    def _send_messages(self, msgs: List[Message]) -> list:
        runs: List[tuple] = []
        for m in msgs:
            props = m.properties
            tags = props.pop("TAGS", None)
            keys = props.pop("KEYS", None)
            qid = self._queue_for(m) if self.queue_selector is not None else self.queue_id
            key = (m.topic, qid, tags, keys, tuple(sorted(props.items())), m.flag)
            if runs and runs[-1][0] == key:
                runs[-1][1].append(m.body)
            else:
                runs.append((key, [m.body]))
        results: list = []
        for (topic, qid, tags, keys, props, flag), bodies in runs:
            r = self._put_batch(
                topic,
                bodies,
                queue_id=qid,
                tags=tags,
                keys=keys.split(" ") if keys else None,
                properties=dict(props) or None,
                flag=flag,
            )
            before = list(results)
            results.append(self._deliver(r, len(bodies), before))
        return results

    def close(self) -> None:
        """Refuse further sends (messages already sent are the queue's). Idempotent."""
        if not self.closed:
            self.closed = True
            self._state.unregister(self)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Producer queue_id={self.queue_id} {'closed' if self.closed else 'open'}>"
