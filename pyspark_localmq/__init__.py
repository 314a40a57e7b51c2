"""Spark's auto-discovered entry for localmq: ``spark.read.format("localmq")`` works without register().

Spark 4 imports every top-level ``pyspark_*`` module it finds and registers its ``DefaultSource``.
"""
from localmq.spark.datasource import LocalMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
