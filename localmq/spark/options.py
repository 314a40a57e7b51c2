"""Parsing of the ``localmq`` reader options (names as Spark's Kafka source where one exists)."""

import errno
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from localmq.errors import ConfigError, FilterSyntaxError, NotAStoreError
from localmq.filter import compile_sql92, tag_names
from localmq.store.files import DEFAULT_SEGMENT_SIZE

__all__ = ["ReadOptions", "DEFAULT_SEGMENT", "EARLIEST", "LATEST"]

# {(topic, queue id): offset}, -2 earliest and -1 latest
Offsets = dict[tuple[str, int], int]
# a startingOffsets / endingOffsets option: "earliest", "latest" or per-queue offsets
OffsetSpec = Union[Literal["earliest", "latest"], Offsets]

DEFAULT_SEGMENT = DEFAULT_SEGMENT_SIZE
EARLIEST = -2
LATEST = -1


def _bool(value: object, name: str) -> bool:
    """An option's true / false (also 1 / 0, yes / no); ConfigError otherwise."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, not {value!r}")


def _int(value: object, name: str, minimum: int | None = None) -> int:
    """An option's integer, at least ``minimum`` when given; ConfigError otherwise."""
    try:
        out = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, not {value!r}") from None
    if minimum is not None and out < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, not {out}")
    return out


def _offsets_spec(value: object, name: str) -> OffsetSpec | None:
    """ "earliest", "latest" or a JSON {"topic": {"queueId": offset}} (-2 earliest, -1 latest)."""
    if value is None:
        return None
    text = str(value).strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        spec = json.loads(text)
    except ValueError:
        raise ConfigError(
            f"option {name} must be 'earliest', 'latest' or JSON like {{\"topic\":{{\"0\":23}}}}, not {value!r}"
        ) from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ConfigError(f'option {name}: JSON must map topics to {{"queueId": offset}} objects, not {value!r}')
    out: Offsets = {}
    for topic, queues in spec.items():
        for qid, off in queues.items():
            out[(str(topic), _int(qid, f"{name} queue id of {topic}", 0))] = _int(off, f"{name} offset", -2)
    return out


@dataclass
class ReadOptions:
    """Parsed reader options (names as Spark's Kafka source where one exists; case-insensitive)."""

    path: str
    topics: tuple[str, ...] | None = None
    starting: OffsetSpec = "earliest"  # "earliest" | "latest" | {(topic, qid): offset}
    ending: Literal["latest"] | Offsets = "latest"  # (never "earliest")
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    segment_size: int | None = None  # None: the store's settings record, else the size of its segment files
    batch_size: int = 65536
    min_partitions: int | None = None
    partitioning: str = "auto"  # "auto" | "segment" | "queue"
    check_crc: bool = True
    include_undispatched: Literal["auto"] | bool = "auto"  # records past the ConsumeQueues (see Tail)
    # pushed-down filters (batch, spark.sql.python.filterPushdown.enabled): queue ids, offsets [lo, hi)
    queue_ids: frozenset[int] | None = None
    offset_lo: int = 0
    offset_hi: int | None = None
    pushed: bool = False  # filters narrowed the topics or queues read
    # message filters, as a consumer's subscription: tags "a || b" (None: every tag), a SQL92 expression
    tag_names: frozenset[str] | None = None
    sql: str | None = None

    @classmethod
    def parse(cls, options: Mapping[Any, Any] | None, *, streaming: bool = False) -> "ReadOptions":
        """Build from a Spark options mapping. Raises ConfigError for unknown names or values, NotAStoreError without
        a path."""
        opts = {str(k).lower(): v for k, v in dict(options or {}).items()}
        check_option_names(opts)
        path = opts.get("path")
        if not path:
            raise NotAStoreError(errno.ENOENT, "no path given: use .load(path) or .option('path', ...)", "")
        topics = None
        if opts.get("topics"):
            topics = tuple(t.strip() for t in str(opts["topics"]).split(",") if t.strip())
        for kafka_only in ("subscribe", "subscribepattern", "assign"):
            if kafka_only in opts:
                raise ConfigError(f"option {kafka_only} is Kafka's; localmq takes 'topics' (a comma list)")
        out = cls(path=os.fspath(path), topics=topics)
        out.starting = _offsets_spec(opts.get("startingoffsets"), "startingOffsets") or (
            "latest" if streaming else "earliest"
        )
        ending = _offsets_spec(opts.get("endingoffsets"), "endingOffsets") or "latest"
        if streaming and "endingoffsets" in opts:
            raise ConfigError("endingOffsets is for batch reads only")
        if ending == "earliest":
            raise ConfigError("endingOffsets cannot be 'earliest'")
        out.ending = ending
        if isinstance(out.ending, dict) and any(v == EARLIEST for v in out.ending.values()):
            raise ConfigError("endingOffsets cannot use -2 (earliest)")
        if isinstance(out.starting, dict) and any(v == LATEST for v in out.starting.values()) and not streaming:
            raise ConfigError("startingOffsets of a batch read cannot use -1 (latest)")
        if out.starting == "latest" and not streaming:
            raise ConfigError("startingOffsets of a batch read cannot be 'latest'")
        if "startingtimestamp" in opts:
            out.starting_timestamp = _int(opts["startingtimestamp"], "startingTimestamp", 0)
        if "endingtimestamp" in opts:
            if streaming:
                raise ConfigError("endingTimestamp is for batch reads only")
            out.ending_timestamp = _int(opts["endingtimestamp"], "endingTimestamp", 0)
        if "maxoffsetspertrigger" in opts:
            out.max_offsets_per_trigger = _int(opts["maxoffsetspertrigger"], "maxOffsetsPerTrigger", 1)
        if "failondataloss" in opts:
            out.fail_on_data_loss = _bool(opts["failondataloss"], "failOnDataLoss")
        if "mapped_file_size_commit_log" in opts:
            out.segment_size = _int(opts["mapped_file_size_commit_log"], "mapped_file_size_commit_log", 4096)
        if "batchsize" in opts:
            out.batch_size = _int(opts["batchsize"], "batchSize", 1)
        if "minpartitions" in opts:
            out.min_partitions = _int(opts["minpartitions"], "minPartitions", 1)
        if "partitioning" in opts:
            out.partitioning = str(opts["partitioning"]).strip().lower()
            if out.partitioning not in ("auto", "segment", "queue"):
                raise ConfigError("option partitioning must be auto, segment or queue")
        if out.topics is None:
            # offsets JSON without a topics option: the JSON's topics are the ones read (as Kafka's "assign")
            named = {t for spec in (out.starting, out.ending) if isinstance(spec, dict) for t, _ in spec}
            if named:
                out.topics = tuple(sorted(named))
        if "pushfilters" in opts:
            _bool(opts["pushfilters"], "pushFilters")  # used by LocalMQDataSource.reader; checked here
        if "checkcrc" in opts:
            out.check_crc = _bool(opts["checkcrc"], "checkCRC")
        if "includeundispatched" in opts:
            value = str(opts["includeundispatched"]).strip().lower()
            out.include_undispatched = "auto" if value == "auto" else _bool(value, "includeUndispatched")
        if "tags" in opts:
            text = opts["tags"]
            if not isinstance(text, str):
                raise ConfigError(f"option tags must be a tag expression like 'a || b', not {text!r}")
            out.tag_names = tag_names(text)
        if "sql" in opts:
            text = opts["sql"]
            if not isinstance(text, str):
                raise ConfigError(f"option sql must be a SQL92 filter expression, not {text!r}")
            try:
                compile_sql92(text)
            except FilterSyntaxError as e:
                raise ConfigError(f"option sql: {e}") from e
            out.sql = text
        return out

    @property
    def target_partitions(self) -> int:
        """Partitions a read aims at: ``minPartitions``, else the CPU count (at least 2)."""
        return self.min_partitions or max(2, os.cpu_count() or 2)


# every option the reader takes, by its lower-cased name (Spark passes option names as given)
OPTION_NAMES = {
    n.lower(): n
    for n in (
        "path",
        "topics",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "maxOffsetsPerTrigger",
        "failOnDataLoss",
        "mapped_file_size_commit_log",
        "batchSize",
        "minPartitions",
        "partitioning",
        "pushFilters",
        "checkCRC",
        "includeUndispatched",
        "tags",
        "sql",
        "subscribe",
        "subscribePattern",
        "assign",  # Kafka's: refused with a pointer to 'topics'
    )
}


def check_option_names(opts: Mapping[str, object]) -> None:
    """ConfigError for an option name the reader does not take (a misspelling was silently ignored before),
    naming the closest known one."""
    import difflib

    unknown = [k for k in opts if k not in OPTION_NAMES]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, list(OPTION_NAMES), n=1, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {OPTION_NAMES[close[0]]!r}?)" if close else ""))
        raise ConfigError(
            f"unknown localmq option(s): {', '.join(hints)}; the options are: "
            f"{', '.join(sorted(OPTION_NAMES.values(), key=str.lower))}"
        )
