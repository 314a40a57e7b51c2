"""Every outcome localmq reports as a value rather than an exception: status enums and the result types.

Pure Python, importing nothing of localmq. The string-valued enums (RecordStatus, Stop) compare equal to their
values ("end", "torn", ...), so code and users that compared against those strings keep working.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Generic, Iterator, List, Optional, TypeVar

_M = TypeVar("_M")  # the message type: localmq.Message (status.py imports nothing of localmq)


class _StatusEnum(enum.IntEnum):
    """An IntEnum that prints as its name (``PutStatus.PUT_OK``) on every Python: from 3.11 an IntEnum prints as its
    number (``0``), which tells a reader of a log or a ``print()`` nothing. Comparisons and ``int()`` are unchanged."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class PutStatus(_StatusEnum):
    """RocketMQ's PutMessageStatus (5.x spelling; the 4.x spellings are aliases)."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPPED_FILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGE_CACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    CREATE_MAPEDFILE_FAILED = 5  # 4.x name
    OS_PAGECACHE_BUSY = 8  # 4.x name


class GetStatus(_StatusEnum):
    """RocketMQ's GetMessageStatus (4.x)."""

    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8


class RecordStatus(str, enum.Enum):
    """What lies at a position of a CommitLog segment (``scan_record``, recovery, the dispatcher's errors).

    The integer codes are the compiled decoder's (``_record.parse_record``); ``of(code)`` maps them.
    """

    OK = "ok"
    BLANK = "blank"  # the end-of-segment blank record: go on in the next segment
    END = "end"  # zero bytes where a record would start: the end of written data
    TORN = "torn"  # a record that runs past the readable bytes (recovery: or whose properties hold
    # a sector of zeros, a torn write of its tail)
    BAD_MAGIC = "bad magic"
    BAD_LENGTH = "bad length"  # TOTALSIZE disagrees with the fields
    BAD_CRC = "bad crc"
    GAP = "gap"  # a gap record: damaged bytes that recovery quarantined; skip its size and go on
    BAD_TOPIC = "bad topic"  # a topic name no writer can have written (the header is damaged)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, code: int) -> "RecordStatus":
        """The status of a compiled decoder's REC_* code (0..8)."""
        return _RECORD_CODES[code]


_RECORD_CODES = list(RecordStatus)


class Stop(str, enum.Enum):
    """Why a walk over a range of records (decode_range, scan_range, readers, the index thread) stopped."""

    END = "end"  # zero bytes or the end of the range after the last whole record
    BLANK = "blank"  # the segment's blank record
    FULL = "full"  # the output buffers are full: call again from where it stopped
    TORN = "torn"  # a record cut short by the end of the readable bytes
    CORRUPT = "corrupt"  # a record that is not valid (magic, length or CRC)
    FALLBACK = "fallback"  # the single-pass scan cannot fill this range: take the general path
    INVALID = "invalid"  # ConsumeQueue readers: a unit that cannot be valid
    PARTIAL = "partial"  # ConsumeQueue readers: a file length that is not a multiple of the unit

    def __str__(self) -> str:
        return self.value


class ConsumeStatus(_StatusEnum):
    """What a listener answers for its batch (RocketMQ's ConsumeConcurrentlyStatus): done, or fail and retry later."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class _PullResult:
    """What the results of ``get_message`` and ``get_bodies`` share: ``status`` (GetStatus), ``next_begin_offset``
    (where the next pull should start), ``min_offset`` / ``max_offset`` of the queue and ``compressed`` (how many of
    the bodies are zlib-compressed: sysflag COMPRESSED, a RocketMQ producer's bodies over 4 KiB; the store returns
    bodies as stored, a Consumer inflates them as RocketMQ's client does). Each subclass sets the fields itself (a
    get builds one per call)."""

    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "compressed")
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    compressed: int

    @property
    def found(self) -> bool:
        """True when ``status`` is FOUND."""
        return self.status is GetStatus.FOUND

    def _offsets(self) -> str:
        return f"next_begin_offset={self.next_begin_offset}, min_offset={self.min_offset}, max_offset={self.max_offset}"


class GetResult(_PullResult, Generic[_M]):
    """Result of ``get_message``: ``status`` (GetStatus), ``messages`` (list of Message), ``next_begin_offset``
    (where the next pull should start), ``min_offset`` / ``max_offset`` of the queue, ``compressed``."""

    __slots__ = ("messages",)

    def __init__(
        self,
        status: GetStatus,
        messages: List[_M],
        next_begin_offset: int,
        min_offset: int,
        max_offset: int,
        compressed: int = 0,
    ) -> None:
        self.compressed = compressed
        self.status = status
        self.messages = messages
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[_M]:
        return iter(self.messages)

    def __repr__(self) -> str:
        return f"GetResult(status={self.status.name}, messages={len(self.messages)}, {self._offsets()})"


class GetBodiesResult(_PullResult):
    """Result of ``get_bodies``: ``status`` (GetStatus), ``bodies`` (list of bytes, as stored: a compressed body
    stays zlib bytes; ``fields=("sys_flag",)`` tells which), ``fields`` ({name: list} for each field asked for,
    parallel to ``bodies``), ``next_begin_offset``, ``min_offset``, ``max_offset`` and ``compressed``, as
    ``get_message``'s GetResult."""

    __slots__ = ("bodies", "fields")

    def __init__(
        self,
        status: GetStatus,
        bodies: List[bytes],
        next_begin_offset: int,
        min_offset: int,
        max_offset: int,
        compressed: int = 0,
        fields: Optional[Dict[str, List[Any]]] = None,
    ) -> None:
        self.compressed = compressed
        self.status = status
        self.bodies = bodies
        self.fields = fields if fields is not None else {}
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset

    def __len__(self) -> int:
        return len(self.bodies)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.bodies)

    def __repr__(self) -> str:
        return (
            f"GetBodiesResult(status={self.status.name}, bodies={len(self.bodies)}, "
            f"fields={sorted(self.fields)}, {self._offsets()})"
        )


class LocalTransactionState(_StatusEnum):
    """RocketMQ's LocalTransactionState (its spelling, UNKNOW included): what a local transaction or a check
    listener answers. The values are the END_TRANSACTION header's commitOrRollback, i.e. the sysflag transaction
    types (COMMIT 0x8, ROLLBACK 0xC; 0 = unknown: the half message stays and is checked back later)."""

    UNKNOW = 0
    COMMIT_MESSAGE = 0x8
    ROLLBACK_MESSAGE = 0xC


class TransactionSendResult(Generic[_M]):
    """Result of ``TransactionProducer.send_in_transaction``: ``half`` (the PutResult of the half message),
    ``state`` (the LocalTransactionState the local transaction answered), ``transaction_id`` (the UNIQ_KEY),
    ``commit`` (PutResult of the real message, None unless committed now) and ``op`` (PutResult of the op record,
    None while the state is UNKNOW)."""

    __slots__ = ("half", "state", "transaction_id", "commit", "op")

    def __init__(
        self,
        half: _M,
        state: LocalTransactionState,
        transaction_id: str,
        commit: _M | None = None,
        op: _M | None = None,
    ) -> None:
        self.half = half
        self.state = state
        self.transaction_id = transaction_id
        self.commit = commit
        self.op = op

    def __repr__(self) -> str:
        return (
            f"TransactionSendResult(state={self.state.name}, transaction_id={self.transaction_id!r}, "
            f"half_offset={getattr(self.half, 'queue_offset', None)}, committed={self.commit is not None})"
        )


__all__ = [
    "PutStatus",
    "GetStatus",
    "RecordStatus",
    "Stop",
    "ConsumeStatus",
    "GetResult",
    "LocalTransactionState",
    "TransactionSendResult",
]
