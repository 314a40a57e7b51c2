"""Consumer retry and dead letters: RocketMQ's send-back of a failed message to %RETRY%<group> or %DLQ%<group>.

A Local store (exclusive or shared) re-puts a failed message as a 4.9.8 broker does (semantics §1.2-1.3, §2): a record
in SCHEDULE_TOPIC_XXXX, queue level - 1, with the failed record's body, flag, sysflag, born timestamp and born host,
RECONSUMETIMES + 1, and its properties plus ``RETRY_TOPIC`` (the business topic, kept from the first failure on),
``WAIT=false``, ``ORIGIN_MESSAGE_ID`` (kept, else the failed record's offset message id), ``DELAY=<level>``,
``REAL_TOPIC=%RETRY%<group>`` and ``REAL_QID=0``; the store's ScheduleMessageService moves it to the retry topic
when due. After ``max_reconsume_times`` failures (or for ``delay_level=-1``) the record goes straight to
``%DLQ%<group>`` queue 0 with ``DELAY=0``. One retry queue per group (RocketMQ's retryQueueNums default 1).

The Memory and Embedded queues have no schedule service and no record fields: a send-back there is RocketMQ's
client fallback (§1.4), a plain put to the retry topic with ``RECONSUME_TIME`` and ``MAX_RECONSUME_TIMES``
properties, delivered at once, so only ``delay=0`` (or ``delay_level=-1``, the dead letters) is accepted there.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from localmq.config import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC, check_topic
from localmq.errors import DelayNotSupportedError, InvalidDelayError, InvalidTopicError, SendError
from localmq.layout import is_decimal
from localmq.services.schedule import level_for_delay
from localmq.status import PutStatus
from localmq.store.commit_log import PutExtra

RETRY_QUEUE_ID = 0  # retryQueueNums = 1
DLQ_QUEUE_ID = 0  # DLQ_NUMS_PER_GROUP = 1
DEFAULT_MAX_RECONSUME_TIMES = 16
# the offsets of a re-drive of the dead letters of group G are committed under this group on %DLQ%G
REDRIVE_GROUP_SUFFIX = "%REDRIVE"

# properties a send-back adds that a re-driven message must not carry on (it starts over as a new message)
_RETRY_BOOKKEEPING = ("DELAY", "REAL_TOPIC", "REAL_QID", "WAIT", "RECONSUME_TIME", "MAX_RECONSUME_TIMES")


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``. Raises InvalidTopicError when the name would pass 255 characters."""
    t = RETRY_PREFIX + group
    check_topic(t)
    return t


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``. Raises InvalidTopicError when the name would pass 255 characters."""
    t = DLQ_PREFIX + group
    check_topic(t)
    return t


def check_group_for_retry(group: str) -> None:
    """A clustering group's retry and dead-letter topics must be valid topic names (group <= 248 characters)."""
    try:
        retry_topic(group)
    except InvalidTopicError:
        raise InvalidTopicError(
            f"group {group!r} is too long for its retry topic {RETRY_PREFIX + group!r} (255 characters at most)"
        ) from None


def reconsume_count(m: Any) -> int:
    """How many times ``m`` was consumed and failed before: the record's RECONSUMETIMES, or the client-fallback
    property RECONSUME_TIME (Memory / Embedded queues)."""
    n = int(getattr(m, "reconsume_times", 0) or 0)
    p = m.properties.get("RECONSUME_TIME")
    if p is not None and is_decimal(p):
        n = max(n, int(p))
    return n


def original_topic(m: Any) -> str:
    """The business topic of a message read from a retry or dead-letter topic (its RETRY_TOPIC), else its topic."""
    if m.topic.startswith(RETRY_PREFIX) or m.topic.startswith(DLQ_PREFIX):
        return m.properties.get("RETRY_TOPIC") or m.topic
    return m.topic


def choose_level(
    levels_ms: Optional[Tuple[int, ...]], reconsumed: int, delay: Optional[float], delay_level: Optional[int]
) -> int:
    """The delay level of a send-back: ``delay_level`` (-1: dead letters at once), else the smallest level of at
    least ``delay`` seconds, else RocketMQ's 3 + reconsume times; clamped to the largest level. 0 means no delay
    (only where the queue has no schedule service and ``delay=0`` was asked)."""
    if delay_level is not None and delay is not None:
        raise InvalidDelayError("pass delay_level or delay, not both")
    if delay_level is not None:
        if isinstance(delay_level, bool) or not isinstance(delay_level, int) or delay_level < -1 or delay_level == 0:
            raise InvalidDelayError(f"delay_level must be -1 (dead letters) or an int >= 1, not {delay_level!r}")
        if delay_level == -1:
            return -1
        if levels_ms is None:
            raise DelayNotSupportedError(
                "this queue has no ScheduleMessageService: nack(delay=0) or nack(delay_level=-1) only"
            )
        return min(delay_level, len(levels_ms))
    if levels_ms is None:
        if delay is not None and delay == 0 and not isinstance(delay, bool):
            return 0
        raise DelayNotSupportedError(
            "this queue has no ScheduleMessageService: a retry cannot wait; "
            "nack(delay=0) retries at once, nack(delay_level=-1) sends to the dead letters"
        )
    if delay is not None:
        return level_for_delay(levels_ms, delay)
    return min(3 + reconsumed, len(levels_ms))


def send_back(
    mq: Any,
    group: str,
    m: Any,
    *,
    delay: Optional[float] = None,
    delay_level: Optional[int] = None,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
) -> Tuple[str, Any]:
    """Send failed message ``m`` (as read from the store) back for group ``group``: to its retry topic after a
    delay, or to its dead-letter topic. Returns (``"retry"`` or ``"dlq"``, PutResult).

    Raises SendError (the put was refused: nothing was sent back), InvalidDelayError, DelayNotSupportedError.
    """
    reconsumed = reconsume_count(m)
    levels = mq.delay_levels_ms() if hasattr(mq, "put_ext") else None
    level = choose_level(levels, reconsumed, delay, delay_level)
    props: Dict[str, str] = m.properties
    props.setdefault("RETRY_TOPIC", original_topic(m))
    props["WAIT"] = "false"
    if "ORIGIN_MESSAGE_ID" not in props:
        origin = m.msg_id or props.get("UNIQ_KEY")
        if origin:
            props["ORIGIN_MESSAGE_ID"] = origin
    to_dlq = level == -1 or reconsumed >= max_reconsume_times
    kind = "dlq" if to_dlq else "retry"
    body = m.body if m.body is not None else b""
    if levels is None:
        # client fallback (§1.4): a plain message to the retry topic; the count travels as a property
        props["RECONSUME_TIME"] = str(reconsumed + 1)
        props["MAX_RECONSUME_TIMES"] = str(max_reconsume_times)
        topic = dlq_topic(group) if to_dlq else retry_topic(group)
        r = mq.put(topic, body, queue_id=DLQ_QUEUE_ID if to_dlq else RETRY_QUEUE_ID, properties=props, flag=m.flag)
    else:
        extra = PutExtra(
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=reconsumed + 1,
        )
        if to_dlq:
            props["DELAY"] = "0"
            r = mq.put_ext(dlq_topic(group), body, queue_id=DLQ_QUEUE_ID, properties=props, flag=m.flag, extra=extra)
        else:
            props["DELAY"] = str(level)
            props["REAL_TOPIC"] = retry_topic(group)
            props["REAL_QID"] = str(RETRY_QUEUE_ID)
            r = mq.put_ext(SCHEDULE_TOPIC, body, queue_id=level - 1, properties=props, flag=m.flag, extra=extra)
    if r.status is not PutStatus.PUT_OK:
        raise SendError(
            f"send-back of {m.topic} queue {m.queue_id} offset {m.queue_offset} to the {kind} topic "
            f"of group {group!r} answered {r.status.name}; the message stays unacknowledged",
            r.status,
            r,
            0,
            (),
        )
    return kind, r


def dead_letters(mq: Any, group: str, *, start: int = 0, max_messages: Optional[int] = None) -> List[Any]:
    """The messages in ``%DLQ%<group>`` from queue offset ``start`` (all of them by default), oldest first.
    Each keeps its properties: RETRY_TOPIC (the business topic), ORIGIN_MESSAGE_ID, and its reconsume count."""
    topic = dlq_topic(group)
    out: List[Any] = []
    off = max(start, mq.min_offset(topic, DLQ_QUEUE_ID))
    end = mq.max_offset(topic, DLQ_QUEUE_ID)
    while off < end and (max_messages is None or len(out) < max_messages):
        want = 32 if max_messages is None else min(32, max_messages - len(out))
        r = mq.get_message(topic, DLQ_QUEUE_ID, off, want)
        out.extend(r.messages)
        if r.next_begin_offset <= off:
            break
        off = r.next_begin_offset
    return out


def redrive_dead_letters(
    mq: Any, group: str, *, offsets: Any, queue_id: int = 0, max_messages: Optional[int] = None
) -> int:
    """Send the dead letters of ``group`` again, each to its business topic (RETRY_TOPIC) queue ``queue_id``, as a
    new message (same body, flag, tags, keys and user properties, ORIGIN_MESSAGE_ID kept; the retry bookkeeping
    properties dropped, so it gets a fresh set of retries). Progress is the committed offset of group
    ``<group>%REDRIVE`` on the DLQ (``offsets``: the queue's ConsumerOffsetManager), written after the puts, so a
    re-drive interrupted by a crash sends the rest (at least once) and a second re-drive sends nothing again.
    Returns how many messages were sent. Raises SendError when a put is refused (what was sent stays committed).
    """
    topic = dlq_topic(group)
    rgroup = group + REDRIVE_GROUP_SUFFIX
    start = offsets.query(rgroup, topic, DLQ_QUEUE_ID) or 0
    sent = 0
    try:
        for m in dead_letters(mq, group, start=start, max_messages=max_messages):
            props = m.properties
            target = props.get("RETRY_TOPIC") or m.topic
            for k in _RETRY_BOOKKEEPING:
                props.pop(k, None)
            props.pop("RETRY_TOPIC", None)
            r = mq.put(target, m.body if m.body is not None else b"", queue_id=queue_id, properties=props, flag=m.flag)
            if r.status is not PutStatus.PUT_OK:
                raise SendError(
                    f"re-drive of {topic} offset {m.queue_offset} to {target!r} answered {r.status.name}",
                    r.status,
                    r,
                    0,
                    (),
                )
            sent += 1
            start = m.queue_offset + 1
    finally:
        if sent:
            offsets.persist(offsets.commit(rgroup, {(topic, DLQ_QUEUE_ID): start}))
    return sent
