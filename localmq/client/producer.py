"""Producer: sends messages to a queue (Memory, Embedded or Local), one queue id per producer by default."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Union

from localmq._record import Message
from localmq.errors import StoreClosedError
from localmq.config import check_queue_id

QueueSelector = Callable[[Message, int], int]

_MESSAGE_ONLY = ("TAGS", "KEYS")


class Producer:
    """Sends messages to the queue it was created from (``mq.create_producer()``).

    Every topic's messages from this producer go to one queue id of its own (``queue_id``; by default producers
    are numbered and take ``number % queue_nums``, LocalMQ's "the queue id follows the producer"), so the messages
    of one producer are stored, and consumed, in the order it sent them. ``queue_selector(message, queue_nums)
    -> queue id`` chooses per message instead (RocketMQ's MessageQueueSelector; e.g. by order id for ordered
    messages per key).

    Results are PutResult (``ok``, ``status``, ``queue_offset``...): a status other than PUT_OK (a full disk, a
    SYNC_FLUSH timeout) is returned, not raised; invalid input raises (InvalidTopicError, MessageSizeError...).

    Thread-safety: a producer may be shared by threads; the order of its messages in a queue is then the order
    in which the ``send`` calls took the queue's put lock. ``close()`` (or ``with``) only forbids further sends.
    """

    def __init__(self, mq, *, queue_id: Optional[int] = None, queue_selector: Optional[QueueSelector] = None,
                 queue_nums: Optional[int] = None):
        state = mq._client_state()
        self.queue_nums = int(queue_nums or mq.default_queue_nums)
        if self.queue_nums < 1:
            raise ValueError("queue_nums must be at least 1")
        if queue_id is None:
            queue_id = state.next_producer_slot() % self.queue_nums
        check_queue_id(queue_id)
        self.queue_id = queue_id
        self.queue_selector = queue_selector
        self._mq = mq
        self._state = state
        self._put = mq.put
        self._put_batch = mq.put_batch
        self.closed = False
        state.register(self, consumer=False)

    def create_message(self, topic: str, body, *, tags: Optional[str] = None, keys=None,
                       properties: Optional[Dict[str, str]] = None) -> Message:
        """A Message to ``send`` later (OpenMessaging style)."""
        return Message(topic, body, tags=tags, keys=keys, properties=properties)

    def _queue_for(self, message: Message) -> int:
        q = self.queue_selector(message, self.queue_nums)
        check_queue_id(q)
        return q

    def send(self, topic: Union[str, Message], body=None, *, tags: Optional[str] = None, keys=None,
             properties: Optional[Dict[str, str]] = None):
        """Send one message: ``send(topic, body, tags=..., keys=..., properties=...)`` or ``send(message)``.

        Returns PutResult. Raises StoreClosedError (producer or queue closed), InvalidTopicError,
        MessageSizeError, PropertiesSizeError, InvalidPropertyError.
        """
        if self.closed:
            raise StoreClosedError("the producer is closed")
        if isinstance(topic, Message):
            m = topic
            props = m.properties
            tags = props.pop("TAGS", None)
            keys = props.pop("KEYS", None)
            qid = self._queue_for(m) if self.queue_selector is not None else self.queue_id
            return self._put(m.topic, m.body, queue_id=qid, tags=tags, keys=keys.split(" ") if keys else None,
                             properties=props or None, flag=m.flag)
        if self.queue_selector is None:
            return self._put(topic, body, queue_id=self.queue_id, tags=tags, keys=keys, properties=properties)
        m = Message(topic, body, tags=tags, keys=keys, properties=properties)
        return self._put(topic, body, queue_id=self._queue_for(m), tags=tags, keys=keys, properties=properties)

    def send_batch(self, topic: Union[str, List[Message]], bodies: Optional[Iterable] = None, *,
                   tags: Optional[str] = None, keys=None, properties: Optional[Dict[str, str]] = None):
        """Send several bodies to one queue with consecutive offsets under one lock (``put_batch``); they share
        ``tags``, ``keys`` and ``properties``. ``send_batch(messages)`` sends Message objects in order (one
        batch when they share topic and properties, else one put each) and returns the list of PutResults.

        Returns PutResult for the batch (``msg_num``, ``queue_offset`` of the first). The queue is chosen once
        for the batch (``queue_selector`` sees the first message).
        """
        if self.closed:
            raise StoreClosedError("the producer is closed")
        if not isinstance(topic, str):
            msgs = list(topic)
            return [self.send(m) for m in msgs]
        bodies = bodies if isinstance(bodies, list) else list(bodies)
        if not bodies:
            raise ValueError("send_batch needs at least one body")
        qid = self.queue_id
        if self.queue_selector is not None:
            qid = self._queue_for(Message(topic, bodies[0], tags=tags, keys=keys, properties=properties))
        return self._put_batch(topic, bodies, queue_id=qid, tags=tags, keys=keys, properties=properties)

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
