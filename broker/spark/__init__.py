"""Spark jobs publish into the broker and read topics back: a PySpark data
source (batch and streaming, both ways) and a ``foreachPartition`` helper.

Reading is ``spark.read(Stream).format("broker").option("subscribe", ...)``
with the options, columns and offsets of Spark's Kafka source (see
``_reader.py``); the rest of this text is about publishing.

::

    (df.write.format("broker")
        .option("broker.servers", "127.0.0.1:7400")
        .option("topic", "events")
        .mode("append")
        .save())

Columns are those of Spark's Kafka sink: ``value`` (binary or string,
required), ``key``, ``headers`` (``array<struct<key:string,value:binary>>``),
``topic`` (unless the ``topic`` option is set). Each task publishes through
one blocking client cached per Python worker, within the broker's
guarantees: a slow broker slows the task, nothing buffers beyond what the
broker promised. Delivery is at least once, or with
``.option("broker.delivery", "exactly-once")`` exactly once: tasks stage
their rows and the driver's commit makes exactly the successful attempts
visible. Installed, the source registers itself (``pyspark_broker``);
:func:`register` does it explicitly. Needs ``pip install
trio-broker[spark]`` (pyspark 4 and pyarrow).
"""

from typing import Any

from ._options import AT_LEAST_ONCE, EXACTLY_ONCE, SinkError, SinkOptions, check_schema
from ._writer import TaskReport, publish_partition, publish_rows

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "BrokerDataSource",
    "SinkError",
    "SinkOptions",
    "TaskReport",
    "check_schema",
    "publish_partition",
    "publish_rows",
    "register",
]


def register(spark: Any) -> None:
    """Make ``format("broker")`` known to ``spark`` (a ``SparkSession``)."""
    from ._source import BrokerDataSource

    spark.dataSource.register(BrokerDataSource)


def __getattr__(name: str) -> object:
    # The data source class imports pyspark: only when asked for.
    if name == "BrokerDataSource":
        from ._source import BrokerDataSource

        return BrokerDataSource
    raise AttributeError(name)
