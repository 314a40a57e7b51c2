"""StoreConfig (RocketMQ's MessageStoreConfig in snake_case), the flush mode, and name checks."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from localmq.errors import (
    ArgumentRangeError,
    ArgumentTypeError,
    ConfigError,
    InvalidPropertyError,
    InvalidQueueIdError,
    InvalidTopicError,
)
from localmq.layout import CQ_UNIT_SIZE, MAX_QUEUE_ID, TOPIC_RE, is_decimal


class FlushDiskType(enum.Enum):
    """When a put's bytes are forced to disk (see the durability table in the README)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


@dataclasses.dataclass
class StoreConfig:
    """Store settings. Names are RocketMQ's MessageStoreConfig fields in snake_case, with its defaults.

    Sizes are bytes, intervals milliseconds, ``file_reserved_time`` hours. ``localmq.open(path, **fields)``
    builds one; unknown names raise ConfigError.
    """

    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CQ_UNIT_SIZE
    enable_consume_queue_ext: bool = False
    mapped_file_size_consume_queue_ext: int = 48 * 1024 * 1024
    bit_map_length_consume_queue_ext: int = 64
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log: int = 500
    flush_commit_log_timed: bool = True
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    sync_flush_timeout: int = 5000
    max_message_size: int = 4 * 1024 * 1024
    check_crc_on_recover: bool = True
    # localmq: verify each body's CRC when a get reads it (CorruptMessageError on a mismatch); False skips it
    check_crc_on_read: bool = True
    # localmq: at open, verify every ConsumeQueue unit against its record (topic, queue id, queue offset, size) and
    # rebuild a queue from the log where one does not match; False checks only what RocketMQ checks
    check_consume_queue_on_open: bool = True
    # localmq: open a store whose log has misnamed or missing segments (DamagedLogError otherwise), keeping what
    # can be read; the ConsumeQueues are cut or rebuilt to the log that is there
    salvage: bool = False
    # localmq, a store shared between processes (shared=True): seconds a put waits for the writer lock held by
    # another live process (a stopped one, say) before StoreBusyError; the lock is never taken from a live holder
    shared_lock_timeout: float = 10.0
    warm_mapped_file_enable: bool = False
    preallocate_mapped_file: bool = True  # localmq: AllocateMappedFileService creates the next 2 segments ahead
    # localmq: a new CommitLog segment (RocketMQ's size and layout) is created sparse and its blocks are reserved
    # (posix_fallocate) this many bytes at a time ahead of the writer, so disk use grows with the data and a put never
    # SIGBUSes: it is refused (CREATE_MAPPED_FILE_FAILED) when the next step cannot be reserved. 0 reserves a whole
    # segment when it is created, as RocketMQ does. The same for ConsumeQueue files.
    reserve_step_commit_log: int = 1 << 20
    reserve_step_consume_queue: int = 64 << 10
    # localmq: at most this many ConsumeQueue files of the store stay mapped; the least recently used beyond it are
    # unmapped while idle and mapped again on use (MappingBudget), so that a store's mappings (vm.max_map_count:
    # 65,530 per process) and the memory of idle queues do not grow with its queue count. 0: no bound. No
    # descriptor is kept per queue file either way.
    max_mapped_queue_files: int = 4096
    # localmq: True makes a store's first index file hold 1/256 of max_hash_slot_num / max_index_num and each next
    # one four times its predecessor, up to them. False (the default): every file has the configured geometry, as
    # RocketMQ reads them (a broker maps every index file at its configured size: one of another geometry is
    # misread). Files are sparse either way (420 MB by default, a page reserved as an insert first touches it)
    grow_index_files: bool = False
    flush_least_pages_when_warm_mapped_file: int = 4096
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    message_index_enable: bool = True
    message_index_safe: bool = False
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_msgs_num_batch: int = 64
    default_query_max_num: int = 32
    delete_when: str = "04"
    file_reserved_time: int = 72
    disk_max_used_space_ratio: int = 75
    # localmq: refuse puts (SERVICE_NOT_AVAILABLE) while the store's disk is more than this % used, as RocketMQ
    # does at 90; 0 (the default) refuses a put only when the blocks it needs cannot be reserved, so a small store
    # on a nearly full laptop disk keeps working while space remains
    disk_full_refuse_ratio: int = 0
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_mapped_file_interval_forcibly: int = 120_000
    redelete_hanged_file_interval: int = 120_000
    clean_file_forcibly_enable: bool = True
    clean_unconsumed: bool = False
    os_page_cache_busy_timeout_mills: int = 1000
    store_host: str = "127.0.0.1:10911"
    born_host: str = "127.0.0.1:0"
    dispatch_idle_wait_us: int = 1000
    flush_consumer_offset_interval: int = 5000  # RocketMQ BrokerConfig: consumerOffset.json written every 5 s
    # RocketMQ's messageDelayLevel: level i (1-based) delays by the i-th token (units s, m, h, d; parse_delay_levels)
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # config/delayOffset.json written at most every this many ms while delayed messages are delivered (and at close),
    # after a commit log flush; a crash delivers again the messages re-put since the last write. RocketMQ's
    # flushDelayOffsetInterval is 10 s (10 s of deliveries again after a crash); 0: a write after every re-put
    flush_delay_offset_interval: int = 100
    # transactional messages (RocketMQ 4.9.8 BrokerConfig): a half message is checked back once it is this old (ms),
    # at most this many times (then moved to TRANS_CHECK_MAX_TIME_TOPIC), by a pass every check interval (ms)
    transaction_timeout: int = 6000
    transaction_check_max: int = 15
    transaction_check_interval: int = 60_000

    def __post_init__(self) -> None:
        if isinstance(self.flush_disk_type, str):
            try:
                self.flush_disk_type = FlushDiskType[self.flush_disk_type.upper()]
            except KeyError:
                raise ConfigError(
                    f"flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, not {self.flush_disk_type!r}"
                ) from None
        if not isinstance(self.flush_disk_type, FlushDiskType):
            raise ConfigError(f"flush_disk_type must be a FlushDiskType, not {self.flush_disk_type!r}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(v, int) or isinstance(v, bool)):
                raise ConfigError(f"{f.name} must be an int, not {v!r}")
            if f.type in ("bool", bool) and not isinstance(v, bool):
                raise ConfigError(f"{f.name} must be a bool, not {v!r}")
        if not isinstance(self.message_delay_level, str):
            raise ConfigError(f"message_delay_level must be a str, not {self.message_delay_level!r}")
        parse_delay_levels(self.message_delay_level)
        # Positions inside a segment are int32 in RocketMQ's records and CQ units.
        if not 4096 <= self.mapped_file_size_commit_log <= (1 << 31) - 8:
            raise ConfigError("mapped_file_size_commit_log must be between 4096 bytes and 2 GiB - 8")
        if self.mapped_file_size_commit_log % 8:
            raise ConfigError("mapped_file_size_commit_log must be a multiple of 8")
        if self.mapped_file_size_consume_queue < CQ_UNIT_SIZE:
            raise ConfigError("mapped_file_size_consume_queue must hold at least one 20-byte unit")
        # RocketMQ's getter rounds the CQ file size up to whole units.
        rem = self.mapped_file_size_consume_queue % CQ_UNIT_SIZE
        if rem:
            self.mapped_file_size_consume_queue += CQ_UNIT_SIZE - rem
        if self.reserve_step_commit_log < 0 or self.reserve_step_consume_queue < 0:
            raise ConfigError(
                "reserve_step_commit_log and reserve_step_consume_queue must be >= 0 (0: reserve a "
                "whole file when it is created)"
            )
        if self.max_mapped_queue_files != 0 and self.max_mapped_queue_files < 16:
            raise ConfigError("max_mapped_queue_files must be 0 (no bound) or at least 16")
        # a record must also fit one segment; put() refuses those that don't (MessageSizeError)
        if self.max_message_size <= 0:
            raise ConfigError("max_message_size must be positive")
        if self.disk_full_refuse_ratio != 0 and not 10 <= self.disk_full_refuse_ratio <= 99:
            raise ConfigError("disk_full_refuse_ratio must be 0 (off) or within 10..99")
        if not 10 <= self.disk_max_used_space_ratio <= 95:
            # RocketMQ clamps it to 10..95; refusing says so instead of silently changing the value.
            raise ConfigError("disk_max_used_space_ratio must be within 10..95")
        if self.transient_store_pool_enable and self.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            # RocketMQ silently ignores the pool in SYNC_FLUSH; saying so is clearer
            raise ConfigError("transient_store_pool_enable works with ASYNC_FLUSH only")
        if self.transient_store_pool_enable and self.transient_store_pool_size < 1:
            raise ConfigError("transient_store_pool_size must be at least 1")
        hours = [h.strip() for h in self.delete_when.split(";")] if isinstance(self.delete_when, str) else None
        if not hours or not all(is_decimal(h) and 0 <= int(h) <= 23 for h in hours):
            # RocketMQ skips entries it cannot parse, which silently turns time-based retention off
            raise ConfigError(
                f'delete_when must be \';\'-separated hours 0..23 such as "04" or "04;05", not {self.delete_when!r}'
            )
        parse_host(self.store_host)
        parse_host(self.born_host)
        if self.transaction_timeout < 0 or self.transaction_check_max < 1 or self.transaction_check_interval < 1:
            raise ConfigError(
                "transaction_timeout must be >= 0, transaction_check_max and transaction_check_interval >= 1"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "StoreConfig":
        """Build a config from ``name -> value`` where values may be strings (Spark options, CLI flags).

        Raises ConfigError on an unknown name or a value that does not convert.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, value in options.items():
            if name not in fields:
                raise ConfigError(f"unknown store option {name!r}")
            t = fields[name].type
            if isinstance(value, str) and t in ("int", int):
                try:
                    value = int(value)
                except ValueError:
                    raise ConfigError(f"{name} must be an integer, not {value!r}") from None
            elif isinstance(value, str) and t in ("bool", bool):
                low = value.strip().lower()
                if low not in ("true", "false", "1", "0"):
                    raise ConfigError(f"{name} must be true or false, not {value!r}")
                value = low in ("true", "1")
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> "StoreConfig":
        """Build a config from keyword arguments; an unknown name raises ConfigError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown store config field(s): {', '.join(unknown)}")
        return cls(**kwargs)


def parse_host(text: str) -> tuple[bytes, int]:
    """Parse ``"ip:port"`` or ``"[ipv6]:port"`` into (packed address of 4 or 16 bytes, port).

    Raises ConfigError when the text is not an address and port.
    """
    import ipaddress

    try:
        if text.startswith("["):
            host, _, port = text[1:].partition("]:")
        else:
            host, _, port = text.rpartition(":")
        addr = ipaddress.ip_address(host)
        port_n = int(port)
        if not 0 <= port_n <= 0x7FFFFFFF:
            raise ValueError
    except ValueError:
        raise ConfigError(f"not a host:port: {text!r}") from None
    return addr.packed, port_n


def check_topic(topic: str) -> None:
    """Raise InvalidTopicError unless ``topic`` matches ``[%|a-zA-Z0-9_-]{1,255}`` (RocketMQ's characters; 255 bytes
    is the longest ConsumeQueue directory name, and a topic over 127 is stored as a V2 record as RocketMQ 5.x does),
    ArgumentTypeError (a TypeError) for what is not a str."""
    if not isinstance(topic, str):
        raise ArgumentTypeError(f"topic must be a str, not {type(topic).__name__} {topic!r}", "topic")
    if TOPIC_RE.match(topic) is None:
        raise InvalidTopicError(f"invalid topic name {topic!r}: must match [%|a-zA-Z0-9_-]{{1,255}}")


def check_queue_id(queue_id: int) -> None:
    """Raise InvalidQueueIdError unless ``queue_id`` is in 0..MAX_QUEUE_ID, ArgumentTypeError (a TypeError, naming
    ``queue_id``) unless it is an int (or has ``__index__``, as numpy's ints; never a bool)."""
    if type(queue_id) is not int and (isinstance(queue_id, bool) or not hasattr(type(queue_id), "__index__")):
        raise ArgumentTypeError(f"queue_id must be an int, not {type(queue_id).__name__} {queue_id!r}", "queue_id")
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        raise InvalidQueueIdError(f"queue id {queue_id!r} outside 0..{MAX_QUEUE_ID}")


def body_type_error(body: object, argument: str = "body") -> ArgumentTypeError:
    """The error for a message body that is not bytes-like (the same words from every queue kind)."""
    hint = "; encode text first (body.encode())" if isinstance(body, str) else ""
    return ArgumentTypeError(
        f"{argument} must be bytes-like (bytes, bytearray, memoryview), not {type(body).__name__}{hint}", argument
    )


def body_length(body: object, argument: str = "body") -> int:
    """The byte length of a bytes-like message body. Raises ArgumentTypeError naming ``argument`` otherwise."""
    if type(body) is bytes:
        return len(body)
    try:
        return memoryview(body).nbytes  # type: ignore[arg-type]
    except TypeError:
        raise body_type_error(body, argument) from None


def batch_bodies(bodies: object) -> list[Any]:
    """The bodies of a batch put as a list (one bytes-like object is not a batch). Raises ArgumentTypeError for what
    is not an iterable, ArgumentRangeError for an empty batch; each body is checked by the caller."""
    if type(bodies) is list:
        out = bodies
    elif isinstance(bodies, (str, bytes, bytearray, memoryview)):
        raise ArgumentTypeError(
            f"bodies must be an iterable of bytes-like bodies, not one {type(bodies).__name__}", "bodies"
        )
    else:
        try:
            out = list(bodies)  # type: ignore[call-overload]
        except TypeError:
            raise ArgumentTypeError(
                f"bodies must be an iterable of bytes-like bodies, not {type(bodies).__name__}", "bodies"
            ) from None
    if not out:
        raise ArgumentRangeError("put_batch needs at least one body (bodies is empty)", "bodies")
    return out


def message_properties(tags: object, keys: object, properties: object) -> dict[str, str]:
    """The properties of a message to put, TAGS and KEYS folded in, checked as every queue kind checks them.

    ``tags`` a str or None: an empty tag is stored as RocketMQ stores it (``TAGS\x01``, tagsCode 0) and reads back
    as no tag, since RocketMQ's reader drops a pair with an empty value; ``keys`` a str or an iterable of str (each
    non-empty, no space) or None; ``properties`` a mapping of str to str or None (an empty value is kept in the
    same way). The values themselves (separators, size) are checked when they are encoded
    (``_record.properties_to_bytes``). Raises ArgumentTypeError (a TypeError) for an argument of the wrong type,
    naming it; InvalidPropertyError (a ValueError) for a bad key.
    """
    if properties is None:
        d: dict[str, str] = {}
    elif isinstance(properties, Mapping):
        d = dict(properties)
    else:
        raise ArgumentTypeError(
            f"properties must be a mapping of str to str, not {type(properties).__name__} {properties!r}", "properties"
        )
    if tags is not None:
        if not isinstance(tags, str):
            raise ArgumentTypeError(f"tags must be a str, not {type(tags).__name__} {tags!r}", "tags")
        d["TAGS"] = tags
    if keys is not None:
        if isinstance(keys, str):
            ks = [keys]
        else:
            try:
                ks = list(keys)  # type: ignore[call-overload]
            except TypeError:
                raise ArgumentTypeError(
                    f"keys must be a str or an iterable of str, not {type(keys).__name__} {keys!r}", "keys"
                ) from None
        for k in ks:
            if not isinstance(k, str):
                raise ArgumentTypeError(f"keys must be str, not {type(k).__name__} {k!r}", "keys")
            if not k or " " in k:
                raise InvalidPropertyError(f"keys must be non-empty str without spaces, not {k!r}")
        if ks:
            d["KEYS"] = " ".join(ks)
    return d


# RocketMQ's system topic of delayed messages (TopicValidator.RMQ_SYS_SCHEDULE_TOPIC): queue id = delay level - 1
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# a consumer group's retry and dead-letter topics are these prefixes + the group (MixAll.RETRY_GROUP_TOPIC_PREFIX,
# DLQ_GROUP_TOPIC_PREFIX); retention (services/clean.py) keeps what a group's retry topic still holds for it
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> "tuple[int, ...]":
    """RocketMQ's ``messageDelayLevel`` parsing: tokens split on single spaces, the last character of each is the
    unit (s, m, h, d), the rest a positive integer; token i (0-based) is level i + 1.

    :returns: the delays in ms, level 1 first (a non-empty tuple of ints).
    :raises ConfigError: for an empty string or a token that is not ``<digits><unit>``.
    """
    out = []
    for tok in text.split(" ") if isinstance(text, str) else ():
        unit = _DELAY_UNITS_MS.get(tok[-1:])
        if unit is None or not is_decimal(tok[:-1]) or int(tok[:-1]) < 1:
            raise ConfigError(
                f"message_delay_level: {tok!r} is not a positive number followed by s, m, h or d (in {text!r})"
            )
        out.append(int(tok[:-1]) * unit)
    if not out:
        raise ConfigError("message_delay_level needs at least one level")
    return tuple(out)
