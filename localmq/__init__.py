"""localmq: an embedded, persistent message queue on RocketMQ-compatible CommitLog / ConsumeQueue files."""

from __future__ import annotations

import os
from typing import Any, Literal, overload

from localmq._columns import RecordColumns, decode_range
from localmq._record import (
    Message,
    decode_message,
    decode_message_id,
    encode_blank,
    encode_message,
    java_hash,
    parse_properties,
    properties_to_bytes,
    tags_hash,
)
from localmq.client import Consumer, ConsumerOffsetManager, ConsumerScheduler, Producer
from localmq.client.transaction import TransactionProducer
from localmq.config import FlushDiskType, StoreConfig
from localmq.errors import (
    AckError,
    ArgumentOverflowError,
    ArgumentRangeError,
    ArgumentTypeError,
    ConfigError,
    CorruptFrameError,
    CorruptMessageError,
    CorruptStoreError,
    DamagedLogError,
    DelayNotSupportedError,
    DispatchError,
    FilterSyntaxError,
    ForkedStoreError,
    IndexDisabledError,
    InvalidDelayError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidQueueIdError,
    InvalidTopicError,
    InvalidTransactionError,
    JarBuildError,
    LocalMQError,
    MessageSizeError,
    MissingToolError,
    NotAStoreError,
    PositionOutOfRangeError,
    PropertiesSizeError,
    QueueReassignedError,
    ReadOnlyFilesystemError,
    ReadOnlyStoreError,
    SendError,
    StoreBusyError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
    StorePathError,
    StoreSettingsError,
    TopicTableFullError,
    TransactionNotSupportedError,
    UnknownRecordFormatError,
    UnsafePathError,
    UnsupportedFilesystemError,
)
from localmq.filter import Sql92Filter, compile_sql92
from localmq.interface import MessageStore
from localmq.queues.embedded import EmbeddedMessageQueue
from localmq.queues.local import LocalMessageQueue
from localmq.queues.memory import MemoryMessageQueue
from localmq.queues.readonly import ReadOnlyMessageQueue
from localmq.queues.shared import SharedMessageQueue
from localmq.status import (
    ConsumeStatus,
    GetBodiesResult,
    GetResult,
    GetStatus,
    LocalTransactionState,
    PutStatus,
    TransactionSendResult,
)
from localmq.store.checkpoint import StoreCheckpoint, read_checkpoint
from localmq.store.config_json import read_config_json, write_config_json
from localmq.store.put_result import PutResult
from localmq.store.readers import read_commitlog, read_consume_queue, read_consume_queue_ext

__version__ = "0.1.0"


@overload
def open(
    path: str | os.PathLike[str],
    kind: Literal["local"] = "local",
    *,
    shared: bool | None = None,
    read_only: bool = False,
    **config: Any,
) -> LocalMessageQueue: ...
@overload
def open(path: str | os.PathLike[str], kind: Literal["embedded"], **config: Any) -> EmbeddedMessageQueue: ...
@overload
def open(path: str | os.PathLike[str], kind: str, **config: Any) -> LocalMessageQueue | EmbeddedMessageQueue: ...


def open(
    path: str | os.PathLike[str],
    kind: str = "local",  # noqa: A001 - the library's entry point
    **config: Any,
) -> LocalMessageQueue | EmbeddedMessageQueue:
    """Open (creating if needed) the queue stored at ``path`` and recover it.

    ``kind``: "local" (default), the RocketMQ-compatible LocalMessageQueue (``config``: StoreConfig fields), or
    "embedded", the EmbeddedMessageQueue of per-(topic, queue) partition files (``config``: its keyword
    arguments). The in-memory queue has no path: ``localmq.MemoryMessageQueue()``.

    ``shared`` (local only): True opens the store so that other processes can open it at the same time
    (a SharedMessageQueue: gunicorn workers, multiprocessing pools, a CLI beside a service); False holds it for
    this process alone; None (default) joins the processes sharing it when there are any, else holds it alone.
    ``read_only`` (local only): a ReadOnlyMessageQueue, which writes and locks nothing (a closed store, or one that
    processes share while it is read).

    Raises StoreLockedError when another writer holds the store (for shared=None: one that holds it alone),
    CorruptStoreError when its files cannot be used as they are, ConfigError for bad settings or an unknown kind.
    """
    if kind == "local":
        shared = config.pop("shared", None)
        if config.pop("read_only", False):
            return ReadOnlyMessageQueue(path, **config)
        if shared:
            return SharedMessageQueue(path, **config)
        try:
            return LocalMessageQueue(path, **config)
        except StoreLockedError as e:
            if shared is None and e.shared_holders:
                return SharedMessageQueue(path, **config)
            raise
    if kind == "embedded":
        return EmbeddedMessageQueue(path, **config)
    raise ConfigError(f"unknown queue kind {kind!r} (available: 'local', 'embedded')")


__all__ = [
    "open",
    "LocalMessageQueue",
    "SharedMessageQueue",
    "MemoryMessageQueue",
    "EmbeddedMessageQueue",
    "MessageStore",
    "Producer",
    "Consumer",
    "ConsumerScheduler",
    "ConsumerOffsetManager",
    "QueueReassignedError",
    "StoreConfig",
    "FlushDiskType",
    "PutStatus",
    "GetStatus",
    "GetBodiesResult",
    "PutResult",
    "GetResult",
    "Message",
    "RecordColumns",
    "decode_range",
    "decode_message",
    "encode_message",
    "encode_blank",
    "decode_message_id",
    "java_hash",
    "tags_hash",
    "parse_properties",
    "properties_to_bytes",
    "read_commitlog",
    "read_consume_queue",
    "read_consume_queue_ext",
    "read_checkpoint",
    "StoreCheckpoint",
    "read_config_json",
    "write_config_json",
    "LocalMQError",
    "StoreClosedError",
    "StoreLockedError",
    "InvalidTopicError",
    "InvalidQueueIdError",
    "MessageSizeError",
    "PropertiesSizeError",
    "InvalidPropertyError",
    "CorruptFrameError",
    "CorruptStoreError",
    "NotAStoreError",
    "ConfigError",
    "DispatchError",
    "InvalidMessageIdError",
    "IndexDisabledError",
    "ForkedStoreError",
    "ArgumentRangeError",
    "PositionOutOfRangeError",
    "ArgumentOverflowError",
    "CorruptMessageError",
    "DamagedLogError",
    "UnsafePathError",
    "UnknownRecordFormatError",
    "StoreBusyError",
    "TopicTableFullError",
    "UnsupportedFilesystemError",
    "ReadOnlyStoreError",
    "ReadOnlyFilesystemError",
    "StoreIOError",
    "SendError",
    "ArgumentTypeError",
    "ReadOnlyMessageQueue",
    "StoreSettingsError",
    "StorePathError",
    "InvalidDelayError",
    "DelayNotSupportedError",
    "ConsumeStatus",
    "AckError",
    "TransactionProducer",
    "LocalTransactionState",
    "TransactionSendResult",
    "TransactionNotSupportedError",
    "InvalidTransactionError",
    "compile_sql92",
    "Sql92Filter",
    "FilterSyntaxError",
    "MissingToolError",
    "JarBuildError",
]
