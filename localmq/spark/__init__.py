"""Spark integration: the ``localmq`` Python data source and mapInArrow decoding (pyspark imported lazily)."""

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["register", "read_commitlog", "arrow_batches", "spark_ddl", "COLUMNS", "LocalMQDataSource"]


def _need(*modules: str) -> None:
    """Import ``modules`` (the decoder needs pyarrow; the data source and mapInArrow also pyspark), raising
    ModuleNotFoundError that says how to install the ``spark`` extra when one is missing, before anything is done."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"localmq.spark needs {name}, which is not installed: pip install 'localmq[spark]' (pyspark, pyarrow, "
                f"pandas; Spark also needs Java 17)", name=name) from e


def register(spark: "SparkSession") -> None:
    """Register the ``localmq`` data source with a SparkSession (Spark 4; needs the ``spark`` extra)."""
    _need("pyspark", "pyarrow")
    from localmq.spark.datasource import register as _register

    _register(spark)


def read_commitlog(spark: "SparkSession", path: "str | os.PathLike[str]", **options: Any) -> "DataFrame":
    """A DataFrame of a store's messages, decoded by ``mapInArrow`` over planned commit-log / queue ranges.

    See ``localmq.spark.read.read_commitlog``.
    """
    _need("pyspark", "pyarrow")
    from localmq.spark.read import read_commitlog as _read

    return _read(spark, path, **options)


def arrow_batches(path: "str | os.PathLike[str]", **options: Any) -> Iterator["pa.RecordBatch"]:
    """Iterate pyarrow RecordBatches of a store in this process (no Spark): see ``localmq.spark.read``."""
    _need("pyarrow")
    from localmq.spark.read import arrow_batches as _batches

    return _batches(path, **options)


def __getattr__(name: str) -> Any:
    if name in ("spark_ddl", "COLUMNS"):
        from localmq.spark import decode

        return getattr(decode, name)
    if name == "LocalMQDataSource":
        _need("pyspark", "pyarrow")
        from localmq.spark.datasource import LocalMQDataSource

        return LocalMQDataSource
    raise AttributeError(name)
