"""The ``localmq`` PySpark Python Data Source (Spark 4): batch and streaming reads of a store, Arrow batches."""

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from localmq.errors import ConfigError
from localmq.spark.decode import COLUMN_TYPES, read_partition, spark_ddl
from localmq.spark.options import LATEST, ReadOptions
from localmq.spark.plan import (
    OffsetRangeError,
    check_offsets_json,
    log,
    offset_for_time,
    open_store_files,
    plan_batch,
    queue_partitions,
    split_ranges,
    store_state,
    tail_partitions,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import Filter
    from pyspark.sql.types import StructType

    from localmq.spark.plan import Key, State, Tail
    from localmq.store.files import StoreFiles

    OffsetsJson = dict[str, dict[str, int]]  # Spark's offsets: {"topic": {"queueId": offset}}

__all__ = ["LocalMQDataSource", "LocalMQReader", "LocalMQFilteringReader", "LocalMQStreamReader"]


def _columns(schema: "StructType") -> list[str]:
    """Names of the requested columns; each must be one of the source's columns with its type."""
    names: list[str] = []
    for f in schema.fields:
        want = COLUMN_TYPES.get(f.name)
        if want is None:
            raise ConfigError(f"localmq has no column {f.name!r} (columns: {', '.join(COLUMN_TYPES)})")
        got = f.dataType.simpleString()
        if got != want:
            raise ConfigError(f"localmq column {f.name!r} is {want}, not {got}")
        names.append(f.name)
    return names


class LocalMQDataSource(DataSource):
    """``spark.read.format("localmq").load(path)`` / ``spark.readStream.format("localmq").load(path)``.

    Columns are Spark's Kafka source ones (key, value, topic, partition = queue id, offset = queue offset,
    timestamp = store time, timestampType = 1 LogAppendTime), then tags, keys, properties, physical_offset,
    born_timestamp, reconsume_times, sys_flag, msg_id. A schema given with ``.schema(...)`` may name any subset
    of them, which is all that is decoded. The store is read through read-only mappings, without its lock, so a
    live writer may keep appending. Options: see ``localmq.spark.options.ReadOptions``.
    """

    @classmethod
    def name(cls) -> str:
        return "localmq"

    def schema(self) -> str:
        # fail here, at load(), for a path that is not a store or a wrong segment size (the offsets options are
        # checked by the batch or stream reader: they differ between the two)
        opts = {str(k).lower(): v for k, v in dict(self.options).items()}
        given = {"path": opts.get("path")}
        if opts.get("mapped_file_size_commit_log") is not None:
            given["mapped_file_size_commit_log"] = opts["mapped_file_size_commit_log"]
        open_store_files(ReadOptions.parse(given))
        return spark_ddl()

    def reader(self, schema: "StructType") -> "LocalMQReader":
        opts = {str(k).lower(): v for k, v in dict(self.options).items()}
        if str(opts.get("pushfilters", "false")).strip().lower() in ("true", "1", "yes"):
            return LocalMQFilteringReader(self.options, schema)
        return LocalMQReader(self.options, schema)

    def streamReader(self, schema: "StructType") -> "LocalMQStreamReader":
        return LocalMQStreamReader(self.options, schema)


class LocalMQReader(DataSourceReader):
    """Batch reader: partitions are planned when the query runs, over what the store holds then."""

    def __init__(self, options: Mapping[str, str], schema: "StructType") -> None:
        self.opts = ReadOptions.parse(options)
        self.columns = _columns(schema)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in plan_batch(self.opts).partitions]

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        if partition.value is None:
            return iter(())
        return read_partition(partition.value, self.columns, self.opts.batch_size)


class LocalMQFilteringReader(LocalMQReader):
    """The batch reader with filter pushdown, chosen by option ``pushFilters=true``. Spark calls ``pushFilters``
    only when ``spark.sql.python.filterPushdown.enabled`` is true and refuses a reader that has the method while
    it is false, which is why the plain reader does not have it."""

    def pushFilters(self, filters: list["Filter"]) -> Iterator["Filter"]:
        """Prune by ``topic``, ``partition`` and ``offset`` comparisons. Every filter is also returned, so Spark
        still applies it to the rows: pruning only skips what cannot match, so the result stays exact."""
        from pyspark.sql.datasource import (
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            LessThan,
            LessThanOrEqual,
        )

        opts = self.opts
        for f in filters:
            attribute: tuple[str, ...] = getattr(f, "attribute", ())  # Not has a child filter, no column
            col = attribute[0] if len(attribute) == 1 else None
            if col == "topic" and isinstance(f, (EqualTo, In)):
                wanted = {f.value} if isinstance(f, EqualTo) else set(f.value)
                wanted = {t for t in wanted if isinstance(t, str)}
                opts.topics = tuple(sorted(wanted if opts.topics is None else wanted & set(opts.topics)))
                opts.pushed = True
            elif col == "partition" and isinstance(f, (EqualTo, In)):
                values = {f.value} if isinstance(f, EqualTo) else set(f.value)
                wanted_ids = frozenset(q for q in values if isinstance(q, int))
                opts.queue_ids = wanted_ids if opts.queue_ids is None else opts.queue_ids & wanted_ids
                opts.pushed = True
            elif (
                col == "offset"
                and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual))
                and isinstance(f.value, int)
                and not isinstance(f.value, bool)
            ):
                v = f.value
                lo, hi = {
                    EqualTo: (v, v + 1),
                    GreaterThan: (v + 1, None),
                    GreaterThanOrEqual: (v, None),
                    LessThan: (0, v),
                    LessThanOrEqual: (0, v + 1),
                }.get(type(f), (0, None))
                opts.offset_lo = max(opts.offset_lo, lo)
                if hi is not None:
                    opts.offset_hi = hi if opts.offset_hi is None else min(opts.offset_hi, hi)
            yield f


def _to_json(offsets: Mapping["Key", int]) -> "OffsetsJson":
    out: OffsetsJson = {}
    for (topic, qid), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(qid)] = int(off)
    return out


def _from_json(doc: Mapping[str, Mapping[str, Any]] | None) -> dict["Key", int]:
    return {(topic, int(q)): int(off) for topic, queues in (doc or {}).items() for q, off in queues.items()}


class LocalMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: offsets are ``{"topic": {"queueId": next offset}}``, one partition per queue range.

    New queues are read from their earliest offset. ``maxOffsetsPerTrigger`` caps a micro-batch, shared out
    over the queues in proportion to their lag; ``trigger(availableNow=True)`` stops at the offsets the store
    had when the query started.
    """

    def __init__(self, options: Mapping[str, str], schema: "StructType") -> None:
        self.opts = ReadOptions.parse(options, streaming=True)
        self.columns = _columns(schema)
        self._target: dict[Key, int] | None = None

    def _state(self, force_tail: bool = False) -> tuple["StoreFiles", "State", "Tail | None"]:
        store = open_store_files(self.opts)
        opts = self.opts
        if force_tail and opts.include_undispatched is not False:
            opts = dataclasses.replace(opts, include_undispatched=True)
        state, _, tail = store_state(store, opts)
        return store, state, tail

    def initialOffset(self) -> "OffsetsJson":
        store, state, tail = self._state()
        opts = self.opts
        starting = opts.starting
        if isinstance(starting, dict):
            check_offsets_json(starting, state, "startingOffsets")
        out: dict[Key, int] = {}
        for key, (_cq, lo, hi) in state.items():
            if opts.starting_timestamp is not None:
                out[key] = offset_for_time(store, state, tail, key, opts.starting_timestamp)
            elif starting == "earliest":
                out[key] = lo
            elif starting == "latest":
                out[key] = hi
            else:
                s = starting[key]
                out[key] = lo if s == -2 else hi if s == LATEST else s
        return _to_json(out)

    def _latest(self) -> dict["Key", tuple[int, int]]:
        _, state, _ = self._state()
        return {k: (lo, hi) for k, (_, lo, hi) in state.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: hi for k, (_, hi) in self._latest().items()}

    def reportLatestOffset(self) -> "OffsetsJson":
        return _to_json({k: hi for k, (_, hi) in self._latest().items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> "OffsetsJson":
        begin = _from_json(start)
        latest = self._latest()
        end: dict[Key, int] = {}
        for key, (lo, hi) in latest.items():
            if self._target is not None:
                if key not in self._target:
                    continue  # a queue created after availableNow started: not this query's
                hi = min(hi, self._target[key])
            s = begin.get(key, lo)
            end[key] = max(s, hi)
        for key, s in begin.items():
            end.setdefault(key, s)  # a queue whose files are gone keeps its offset
        if isinstance(limit, ReadMaxRows):
            lags = {k: e - begin.get(k, latest[k][0] if k in latest else e) for k, e in end.items()}
            total = sum(lags.values())
            if total > limit.max_rows:
                share = {k: math.floor(lag * limit.max_rows / total) for k, lag in lags.items()}
                left = limit.max_rows - sum(share.values())
                for k in sorted(lags, key=lambda k: lags[k] - share[k], reverse=True)[:left]:
                    share[k] += 1
                for k in end:
                    end[k] = end[k] - lags[k] + share[k]
        return _to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = _from_json(start), _from_json(end)
        store, state, tail = self._state()
        if any(key not in state or e > state[key][2] for key, e in stop.items()):
            # planned from records a dispatcher had not indexed, and still has not: read them from the log
            store, state, tail = self._state(force_tail=True)
        offsets: dict[Key, tuple[int, int]] = {}
        for key, e in stop.items():
            if key not in state:
                if e > begin.get(key, e):
                    msg = f"{key[0]} queue {key[1]}: offsets {begin[key]}..{e} are gone (no ConsumeQueue any more)"
                    if self.opts.fail_on_data_loss:
                        raise OffsetRangeError(msg + "; set failOnDataLoss=false to skip them")
                    log.warning("%s; skipping them", msg)
                continue
            _, lo, hi = state[key]
            if e > hi:
                msg = f"{key[0]} queue {key[1]}: offsets {hi}..{e} planned for this batch are gone from the log"
                if self.opts.fail_on_data_loss:
                    raise OffsetRangeError(msg + "; set failOnDataLoss=false to skip them")
                log.warning("%s; skipping them", msg)
                e = hi
            s = begin.get(key, lo)
            if s < lo:
                msg = f"{key[0]} queue {key[1]}: offsets {s}..{lo} were removed by retention (the earliest is {lo})"
                if self.opts.fail_on_data_loss:
                    raise OffsetRangeError(msg + "; set failOnDataLoss=false to skip them")
                log.warning("%s; skipping them", msg)
                s = lo
            if e > s:
                offsets[key] = (s, e)
        covered, beyond = split_ranges(state, tail, offsets)
        parts = queue_partitions(store, state, covered, self.opts, self.opts.target_partitions)
        parts += tail_partitions(store, tail, beyond, self.opts, 1)
        return [InputPartition(p) for p in parts]

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        return read_partition(partition.value, self.columns, self.opts.batch_size)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # read-only: nothing to release

    def stop(self) -> None:
        pass


class LocalMQPythonDataSource(LocalMQDataSource):
    """The same Python source as ``format("localmq-python")``: the one name that never means the JVM reader (with
    its jar on a session Spark resolves ``localmq`` to the JVM reader first: README, The JVM reader)."""

    @classmethod
    def name(cls) -> str:
        return "localmq-python"


def register(spark: "SparkSession") -> None:
    """Register the Python data source with ``spark`` as ``localmq`` and ``localmq-python`` (not needed when
    ``pyspark_localmq`` and ``pyspark_localmq_python`` are importable: Spark finds them).

    :param spark: the session.
    """
    spark.dataSource.register(LocalMQDataSource)
    spark.dataSource.register(LocalMQPythonDataSource)
