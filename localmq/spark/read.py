"""``read_commitlog``: a store as a DataFrame through ``mapInArrow``, and the same decode without Spark."""

import os
import pickle
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from localmq.spark.decode import read_partition, spark_ddl
from localmq.spark.options import ReadOptions
from localmq.spark.plan import Plan, plan_batch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_commitlog", "arrow_batches", "plan"]


def _split(path: str | os.PathLike[str], options: Mapping[str, Any]) -> tuple[ReadOptions, list[str] | None]:
    options = dict(options)
    columns = options.pop("columns", None)
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    if columns is not None:
        from localmq.errors import ConfigError
        from localmq.spark.decode import COLUMN_TYPES

        unknown = [c for c in columns if c not in COLUMN_TYPES]
        if unknown:
            raise ConfigError(f"unknown columns {unknown} (columns: {', '.join(COLUMN_TYPES)})")
    options["path"] = path
    return ReadOptions.parse({k: str(v) for k, v in options.items()}), columns


def plan(path: str | os.PathLike[str], **options: Any) -> Plan:
    """The batch Plan (partitions, per-queue offsets) that a read with these options would use."""
    opts, _ = _split(path, options)
    return plan_batch(opts)


def arrow_batches(path: str | os.PathLike[str], **options: Any) -> Iterator["pa.RecordBatch"]:
    """pyarrow RecordBatches of the store at ``path``, read here partition after partition.

    Takes the data source's options (``topics``, ``startingOffsets``, ``mapped_file_size_commit_log``, ...)
    as keywords, plus ``columns`` (names or a comma string).
    """
    opts, columns = _split(path, options)
    for part in plan_batch(opts).partitions:
        yield from read_partition(part, columns, opts.batch_size)


def read_commitlog(spark: "SparkSession", path: str | os.PathLike[str], **options: Any) -> "DataFrame":
    """A DataFrame of the messages of the store at ``path``, decoded on the executors with ``mapInArrow``.

    The driver plans partitions (commit-log byte ranges that start at record boundaries known from the
    ConsumeQueues or from a walk, or ConsumeQueue offset ranges) over a consistent prefix of the store; each
    task opens its segment files by path (a shared filesystem on a cluster) and yields Arrow batches filled by
    the Cython codec.

    :param options: the ``localmq`` data source options as keywords (``topics``, ``startingOffsets``,
        ``endingOffsets``, ``startingTimestamp``, ``endingTimestamp``, ``failOnDataLoss``,
        ``mapped_file_size_commit_log``, ``batchSize``, ``minPartitions``, ``partitioning``, ``checkCRC``, ``tags``,
        ``sql``) and
        ``columns``: the subset of columns to decode.
    :raises NotAStoreError, CorruptStoreError, CorruptFrameError, OffsetRangeError, ConfigError: while planning.
    """
    opts, columns = _split(path, options)
    if opts.min_partitions is None:
        opts.min_partitions = max(2, spark.sparkContext.defaultParallelism)
    parts = plan_batch(opts).partitions
    batch_size = opts.batch_size
    rdd = spark.sparkContext.parallelize([(pickle.dumps(p),) for p in parts], max(1, len(parts)))
    descriptors = spark.createDataFrame(rdd, "part binary")

    def decode(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        for b in batches:
            for blob in b.column(0).to_pylist():
                yield from read_partition(pickle.loads(blob), columns, batch_size)

    return descriptors.mapInArrow(decode, spark_ddl(columns))
