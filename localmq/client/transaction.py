"""TransactionProducer: RocketMQ's TransactionMQProducer (half message, local transaction, commit or rollback)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

from localmq._record import Message, properties_to_bytes
from localmq.client.producer import build_properties, new_uniq_key, producer_queue
from localmq.config import check_queue_id, check_topic
from localmq.errors import InvalidPropertyError, StoreClosedError, TransactionNotSupportedError
from localmq.services.transaction import PROPERTY_UNIQ_KEY, user_message
from localmq.status import LocalTransactionState, TransactionSendResult

log = logging.getLogger("localmq.client")

# local_transaction(message, arg) -> LocalTransactionState; check_listener(message) -> LocalTransactionState
LocalTransaction = Callable[[Message, Any], Any]
CheckListener = Callable[[Message], Any]


class TransactionProducer:
    """Sends transactional messages (``mq.create_transaction_producer(group, check_listener)``).

    ``send_in_transaction(topic, body, local_transaction, arg)`` stores a half message (invisible to consumers of
    ``topic``), runs ``local_transaction(message, arg)`` and ends the transaction with its answer, a
    LocalTransactionState: COMMIT_MESSAGE makes the message visible in ``topic`` (exactly once), ROLLBACK_MESSAGE
    drops it, UNKNOW (or an exception, which is logged) leaves it to the store's check-back: after
    ``transaction_timeout`` ms the store asks ``check_listener(message)`` of the producer of this ``group`` in
    this process, every ``transaction_check_interval`` ms, at most ``transaction_check_max`` times (then the half
    goes to TRANS_CHECK_MAX_TIME_TOPIC). Both callbacks see the message with its real topic and queue id;
    ``message.uniq_key`` is the transaction id.

    Only an exclusive LocalMessageQueue has the check-back service (TransactionNotSupportedError otherwise).
    Thread-safe. ``close()`` (or ``with``) unregisters the check listener and refuses further sends.
    """

    def __init__(
        self,
        mq: Any,
        group: str,
        check_listener: CheckListener,
        *,
        queue_id: Optional[int] = None,
        queue_nums: Optional[int] = None,
    ):
        svc = getattr(mq, "transaction_service", None)
        if svc is None:
            raise TransactionNotSupportedError(
                f"{type(mq).__name__} has no TransactionalMessageCheckService: transactional messages need an "
                f"exclusive LocalMessageQueue (localmq.open(path) without shared=True)"
            )
        if not isinstance(group, str) or not group or "\x01" in group or "\x02" in group:
            raise InvalidPropertyError(f"a producer group is a non-empty str without 0x01/0x02, not {group!r}")
        if not callable(check_listener):
            raise TypeError("check_listener must be callable: check_listener(message) -> LocalTransactionState")
        state = mq._client_state()
        self.group = group
        self.check_listener = check_listener
        self.queue_nums, self.queue_id = producer_queue(mq, state, queue_id, queue_nums)
        self._mq = mq
        self._svc = svc
        self._state = state
        self.closed = False
        state.register(self, consumer=False)
        svc.register(group, self._check)

    def _check(self, message: Message) -> Any:
        return self.check_listener(message)

    def send_in_transaction(
        self,
        topic: str,
        body: Any,
        local_transaction: LocalTransaction,
        arg: Any = None,
        *,
        queue_id: Optional[int] = None,
        tags: Optional[str] = None,
        keys: Any = None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ) -> TransactionSendResult[Any]:
        """Put the half message, run ``local_transaction(message, arg)``, end the transaction with its answer.

        Returns TransactionSendResult (``half``, ``state``, ``transaction_id``, ``commit``, ``op``). Raises
        StoreClosedError, InvalidTopicError, InvalidQueueIdError, InvalidPropertyError, MessageSizeError,
        PropertiesSizeError, SendError (the half message was not stored: the local transaction did not run; or
        the end was not stored: the check-back ends it later).
        """
        if self.closed:
            raise StoreClosedError("the producer is closed")
        if not callable(local_transaction):
            raise TypeError(
                "local_transaction must be callable: local_transaction(message, arg) -> LocalTransactionState"
            )
        check_topic(topic)
        qid = self.queue_id if queue_id is None else queue_id
        check_queue_id(qid)
        props = build_properties(tags, keys, properties)
        if PROPERTY_UNIQ_KEY not in props:
            props[PROPERTY_UNIQ_KEY] = new_uniq_key()  # the transaction id; every copy and the commit keep it
            properties_to_bytes(props)  # InvalidPropertyError before anything is stored
        half = self._svc.prepare(topic, body, qid, self.group, props, flag)
        tid = props[PROPERTY_UNIQ_KEY]
        stored = self._svc.read(half.physical_offset)
        try:
            state = LocalTransactionState(local_transaction(user_message(stored), arg))
        except Exception:  # noqa: BLE001 - RocketMQ logs it and answers UNKNOW: the check-back decides
            log.exception("local transaction of %s (group %r) failed; left to the check-back", tid, self.group)
            state = LocalTransactionState.UNKNOW
        commit, op = self._svc.end_transaction(stored, state, group=self.group, look_up=False)
        return TransactionSendResult(half, state, tid, commit, op)

    def end_transaction(self, half: Message, state: LocalTransactionState) -> TransactionSendResult[Any]:
        """End the transaction of ``half`` (a half record read from RMQ_SYS_TRANS_HALF_TOPIC, any copy of it) with
        ``state``; a commit is written only when the transaction has none yet. Returns TransactionSendResult.
        Raises InvalidTransactionError (not a half message of this group), SendError, StoreClosedError."""
        if self.closed:
            raise StoreClosedError("the producer is closed")
        state = LocalTransactionState(state)
        commit, op = self._svc.end_transaction(half, state, group=self.group)
        return TransactionSendResult(None, state, half.uniq_key or "", commit, op)

    def close(self) -> None:
        """Unregister the check listener and refuse further sends. Idempotent."""
        if not self.closed:
            self.closed = True
            self._svc.unregister(self.group, self._check)
            self._state.unregister(self)

    def __enter__(self) -> "TransactionProducer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TransactionProducer group={self.group!r} {'closed' if self.closed else 'open'}>"
