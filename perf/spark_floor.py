"""A Python data source that decodes nothing: Spark's own ceiling for any Python data source, beside localmq."""

import functools

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = ["FloorDataSource"]


@functools.lru_cache(maxsize=4)
def _batch(rows, body):
    """One Arrow batch of ``rows`` distinct-looking ``body``-byte values, built once per worker process."""
    data = np.random.default_rng(body).integers(0, 256, rows * body, dtype=np.uint8)
    offsets = np.arange(0, (rows + 1) * body, body, dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([values], names=["value"])


class FloorDataSource(DataSource):
    """``spark.read.format("python_floor").option("rows", n).load()``: ``n`` rows of one binary column ``value``.

    Options: ``rows`` (required), ``body`` (bytes per value, 100), ``partitions`` (2), ``batchSize`` (65536).
    Each task yields the same prebuilt batch (sliced for the last one) until its share of rows is out, so
    what a scan of it costs is what Spark spends moving Arrow batches from a Python worker into rows: the
    floor under any Python data source, localmq's included.
    """

    @classmethod
    def name(cls):
        return "python_floor"

    def schema(self):
        return "value binary"

    def reader(self, schema):
        return FloorReader(self.options)


class FloorReader(DataSourceReader):
    """Splits ``rows`` evenly over ``partitions``; ``read`` repeats one cached batch."""

    def __init__(self, options):
        self.rows = int(options["rows"])
        self.body = int(options.get("body", 100))
        self.parts = max(1, int(options.get("partitions", 2)))
        self.batch_size = max(1, int(options.get("batchSize", 65536)))

    def partitions(self):
        q, r = divmod(self.rows, self.parts)
        return [InputPartition(q + (i < r)) for i in range(self.parts)]

    def read(self, partition):
        batch = _batch(self.batch_size, self.body)
        left = partition.value
        while left > 0:
            k = min(left, self.batch_size)
            yield batch if k == self.batch_size else batch.slice(0, k)
            left -= k
