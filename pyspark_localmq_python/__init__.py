"""Spark's auto-discovered entry for ``format("localmq-python")``: the Python source even when the JVM jar is there.

Spark 4 imports every top-level ``pyspark_*`` module it finds and registers its ``DefaultSource`` under its name; one
module holds one, so the second name of the Python source has its own module (``pyspark_localmq`` holds ``localmq``).
"""

from localmq.spark.datasource import LocalMQPythonDataSource as DefaultSource

__all__ = ["DefaultSource"]
