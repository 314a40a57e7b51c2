"""Spark integration: the ``localmq`` Python data source, mapInArrow decoding, the JVM reader's jar (pyspark lazily)."""

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "register",
    "read_commitlog",
    "arrow_batches",
    "jar_path",
    "configure_spark",
    "spark_ddl",
    "COLUMNS",
    "LocalMQDataSource",
]


def _need(*modules: str) -> None:
    """Import ``modules`` (the decoder needs pyarrow; the data source and mapInArrow also pyspark), raising
    ModuleNotFoundError that says how to install the ``spark`` extra when one is missing, before anything is done."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"localmq.spark needs {name}, which is not installed: pip install 'localmq[spark]' (pyspark, pyarrow, "
                f"pandas; Spark also needs Java 17)",
                name=name,
            ) from e


def register(spark: "SparkSession") -> None:
    """Register the Python data source with a SparkSession as ``localmq`` and ``localmq-python`` (Spark 4; needs the
    ``spark`` extra). With the JVM reader's jar on the session Spark resolves ``localmq`` to the JVM reader first.

    :param spark: the session.
    :raises ModuleNotFoundError: pyspark or pyarrow is not installed.
    """
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


def jar_path(cache_dir: "str | os.PathLike[str] | None" = None) -> str:
    """The JVM reader's jar, built on first use with javac + jar and cached: see ``localmq.spark.jar.jar_path``.

    :param cache_dir: where built jars are kept; default ``~/.cache/localmq/spark``.
    :returns: the jar's path.
    :raises MissingToolError: pyspark, ``javac`` or ``jar`` is missing.
    :raises JarBuildError: the build failed.
    """
    from localmq.spark.jar import jar_path as _jar_path

    return _jar_path(cache_dir)


def configure_spark(builder: "SparkSession.Builder", jar: "str | None" = None) -> "SparkSession.Builder":
    """Put the JVM reader's jar on ``spark.jars`` and this Python on the workers: see
    ``localmq.spark.jar.configure_spark``.

    :param builder: ``SparkSession.builder`` before ``getOrCreate()``.
    :param jar: the jar to add; default ``jar_path()``.
    :returns: ``builder``.
    :raises MissingToolError: pyspark, ``javac`` or ``jar`` is missing.
    :raises JarBuildError: the build failed.
    """
    from localmq.spark.jar import configure_spark as _configure

    return _configure(builder, jar)


def __getattr__(name: str) -> Any:
    if name in ("spark_ddl", "COLUMNS"):
        from localmq.spark import decode

        return getattr(decode, name)
    if name == "LocalMQDataSource":
        _need("pyspark", "pyarrow")
        from localmq.spark.datasource import LocalMQDataSource

        return LocalMQDataSource
    raise AttributeError(name)
