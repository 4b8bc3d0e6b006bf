"""Makes ``format("broker")`` known to every SparkSession, without
``broker.spark.register(spark)``.

PySpark (4.0 and later) looks, once per application, for installed
top-level modules named ``pyspark_*`` that define ``DefaultSource`` and
registers each under its ``name()``. This module is that hook; the data
source itself is :class:`broker.spark.BrokerDataSource`.
"""

from broker.spark._source import BrokerDataSource as DefaultSource

__all__ = ["DefaultSource"]
