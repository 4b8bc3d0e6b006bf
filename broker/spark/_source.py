"""The PySpark data source ``broker``: ``df.write.format("broker")`` and
``df.writeStream.format("broker")``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from ._options import RowLayout, SinkError, SinkOptions, check_schema
from ._writer import TaskReport, publish_rows

log = logging.getLogger("broker.spark")

#: The name to use in ``format(...)``.
SHORT_NAME = "broker"


@dataclass
class PublishedMessage(WriterCommitMessage):
    """A task's commit message: what it published."""

    report: TaskReport


def _summary(messages: list[Any]) -> tuple[int, int, float, int]:
    reports = [m.report for m in messages if isinstance(m, PublishedMessage)]
    return (
        sum(r.rows for r in reports),
        sum(r.bytes for r in reports),
        sum(r.wait_seconds for r in reports),
        len(reports),
    )


class _Publisher:
    """What the batch and the streaming writer share: the checked options and
    layout (pickled to every task) and the task's work."""

    def __init__(self, options: SinkOptions, layout: RowLayout) -> None:
        self.options = options
        self.layout = layout

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        return PublishedMessage(publish_rows(iterator, self.layout, self.options))


class BrokerWriter(_Publisher, DataSourceWriter):
    """Batch writes: every task publishes its rows (at least once: a retried
    task publishes again what its failed attempt had published)."""

    def commit(self, messages: list[Any]) -> None:
        rows, size, waited, tasks = _summary(messages)
        log.info(
            "published %d rows (%d bytes) to %s from %d tasks; %.2f s waiting for guarantees",
            rows,
            size,
            self.options.servers,
            tasks,
            waited,
        )

    def abort(self, messages: list[Any]) -> None:
        rows, _, _, tasks = _summary(messages)
        log.warning(
            "write aborted after %d rows from %d successful tasks were published "
            "(at-least-once: they stay published)",
            rows,
            tasks,
        )


class BrokerStreamWriter(_Publisher, DataSourceStreamWriter):
    """Streaming writes: each micro-batch's tasks publish their rows."""

    def commit(self, messages: list[Any], batchId: int) -> None:
        rows, size, waited, tasks = _summary(messages)
        log.info(
            "batch %d: published %d rows (%d bytes) from %d tasks; %.2f s waiting",
            batchId,
            rows,
            size,
            tasks,
            waited,
        )

    def abort(self, messages: list[Any], batchId: int) -> None:
        rows, _, _, tasks = _summary(messages)
        log.warning("batch %d aborted after %d rows from %d tasks", batchId, rows, tasks)


class BrokerDataSource(DataSource):
    """``format("broker")``: publishes a DataFrame's rows to the broker, with
    the columns of Spark's Kafka sink (``value``, ``key``, ``headers``,
    ``topic``). Options: ``broker.servers`` (required), ``topic``,
    ``broker.delivery`` (``at-least-once``), ``broker.token``, ``broker.tls``,
    ``broker.cafile``, ``broker.timeout`` (seconds a publish may wait, 60),
    ``broker.client.name``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def _publisher_parts(self, schema: Any, overwrite: bool) -> tuple[SinkOptions, RowLayout]:
        if overwrite:
            raise SinkError('the broker sink only appends: use .mode("append")')
        options = SinkOptions.parse(dict(self.options))
        return options, check_schema(schema, options)

    def writer(self, schema: Any, overwrite: bool) -> BrokerWriter:
        return BrokerWriter(*self._publisher_parts(schema, overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> BrokerStreamWriter:
        return BrokerStreamWriter(*self._publisher_parts(schema, overwrite))
