"""Spark's auto-discovered entry for localmq: ``spark.read.format("localmq")`` works without register().

Spark 4 imports every top-level ``pyspark_*`` module it finds and registers its ``DefaultSource``. With the JVM
reader's jar on a session Spark resolves ``localmq`` to that reader first; ``pyspark_localmq_python`` keeps this source
reachable as ``localmq-python``.
"""

from localmq.spark.datasource import LocalMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
