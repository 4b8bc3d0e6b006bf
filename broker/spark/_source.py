"""The PySpark data source ``broker``: ``df.write.format("broker")`` and
``df.writeStream.format("broker")``; ``spark.read(Stream).format("broker")``
is in :mod:`._reader`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from broker.protocol import OutcomeStatus

from ._options import EXACTLY_ONCE, RowLayout, SinkError, SinkOptions, check_schema
from ._source_options import SourceOptions
from ._source_reader import SCHEMA, BrokerReader, BrokerStreamReader
from ._writer import TaskReport, cached_client, publish_rows, streaming_batch, task_stage

log = logging.getLogger("broker.spark")

#: The name to use in ``format(...)``.
SHORT_NAME = "broker"


@dataclass
class PublishedMessage(WriterCommitMessage):
    """A task's commit message: what it published."""

    report: TaskReport


def _reports(messages: list[Any]) -> list[TaskReport]:
    """The reports of the successful tasks (failed ones send None), by partition."""
    reports = [m.report for m in messages if isinstance(m, PublishedMessage)]
    return sorted(reports, key=lambda r: (r.partition, r.attempt))


def _summary(messages: list[Any]) -> tuple[int, int, float, int]:
    reports = _reports(messages)
    return (
        sum(r.rows for r in reports),
        sum(r.bytes for r in reports),
        sum(r.wait_seconds for r in reports),
        len(reports),
    )


class _Publisher:
    """What the batch and the streaming writer share: the checked options and
    layout (pickled to every task), the task's work, and (exactly-once) the
    driver's commit and abort of what the tasks staged."""

    def __init__(self, options: SinkOptions, layout: RowLayout) -> None:
        self.options = options
        self.layout = layout

    @property
    def exactly_once(self) -> bool:
        return self.options.delivery == EXACTLY_ONCE

    def _task_batch(self) -> str:
        """The batch this task's rows are staged in (exactly-once)."""
        raise NotImplementedError

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        stage = task_stage(self._task_batch()) if self.exactly_once else None
        return PublishedMessage(publish_rows(iterator, self.layout, self.options, stage))

    def _commit_staged(self, batch: str, messages: list[Any]) -> str:
        """Make exactly the successful attempts' rows visible, on every broker;
        returns how it went ("committed", or "duplicate": done before)."""
        counts: dict[str, dict[str, int]] = {}
        for report in _reports(messages):
            assert report.stage is not None and report.stage.batch == batch
            counts[report.stage.member] = report.staged
        outcomes = cached_client(self.options).commit(batch, counts, timeout=None)
        for server, outcome in outcomes.items():
            if outcome.reason:  # (committed, with something to say: a stop while routing)
                log.warning("batch %s on %s: %s", batch, server, outcome.reason)
        if all(o.status == OutcomeStatus.DUPLICATE for o in outcomes.values()):
            return "duplicate"
        return "committed"

    def _abort_staged(self, batch: str) -> int:
        """Discard what the batch staged on every broker; returns how many rows.

        Never raises: Spark is already failing the job for its own reason,
        which must not be replaced. A broker that cannot abort (it already
        committed its share, or is unreachable) is logged; what it staged
        expires after its ``staging_ttl``."""
        try:
            outcomes = cached_client(self.options).abort(batch, timeout=self.options.timeout)
        except Exception as error:
            log.error("batch %s: abort failed on some broker: %s", batch, error)
            return 0
        return sum(o.messages for o in outcomes.values())


class BrokerWriter(_Publisher, DataSourceWriter):
    """Batch writes: every task publishes its rows. At least once, a retried
    task publishes again what its failed attempt had published; exactly
    once, tasks stage their rows in the job's batch and the driver's commit
    makes exactly the successful attempts' rows visible."""

    def __init__(self, options: SinkOptions, layout: RowLayout) -> None:
        super().__init__(options, layout)
        #: Made on the driver, pickled to every task: the job's staging batch.
        self.batch = f"spark-job-{uuid.uuid4().hex}"

    def _task_batch(self) -> str:
        return self.batch

    def commit(self, messages: list[Any]) -> None:
        rows, size, waited, tasks = _summary(messages)
        if self.exactly_once:
            how = self._commit_staged(self.batch, messages)
            log.info("batch %s %s (exactly once)", self.batch, how)
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
        if self.exactly_once:
            discarded = self._abort_staged(self.batch)
            log.warning("write aborted: %d staged rows discarded, none published", discarded)
            return
        log.warning(
            "write aborted after %d rows from %d successful tasks were published "
            "(at-least-once: they stay published)",
            rows,
            tasks,
        )


class BrokerStreamWriter(_Publisher, DataSourceStreamWriter):
    """Streaming writes: each micro-batch's tasks publish their rows. Exactly
    once, a micro-batch is one staging batch named by the query id and the
    batch id, so a query restarted from its checkpoint that runs a batch
    again finds it committed and publishes nothing twice."""

    def _task_batch(self) -> str:
        return streaming_batch()

    def commit(self, messages: list[Any], batchId: int) -> None:
        rows, size, waited, tasks = _summary(messages)
        reports = _reports(messages)
        if self.exactly_once and reports:
            assert reports[0].stage is not None
            batch = reports[0].stage.batch
            if self._commit_staged(batch, messages) == "duplicate":
                log.info("batch %d was committed before: nothing published again", batchId)
                return
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
        reports = _reports(messages)
        if self.exactly_once:
            if reports:  # (else nothing says the batch's name: what it staged expires)
                assert reports[0].stage is not None
                self._abort_staged(reports[0].stage.batch)
            log.warning("batch %d aborted: its staged rows are discarded", batchId)
            return
        log.warning("batch %d aborted after %d rows from %d tasks", batchId, rows, tasks)


class BrokerDataSource(DataSource):
    """``format("broker")``: publishes a DataFrame's rows to the broker, with
    the columns of Spark's Kafka sink (``value``, ``key``, ``headers``,
    ``topic``). Options: ``broker.servers`` (required), ``topic``,
    ``broker.delivery`` (``at-least-once`` or ``exactly-once``),
    ``broker.token``, ``broker.tls``, ``broker.cafile``, ``broker.timeout``
    (seconds a publish may wait, 60), ``broker.reconnect`` (seconds, 30),
    ``broker.client.name``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def _publisher_parts(self, schema: Any, overwrite: bool) -> tuple[SinkOptions, RowLayout]:
        if overwrite:
            raise SinkError('the broker sink only appends: use .mode("append")')
        options = SinkOptions.parse(dict(self.options))
        return options, check_schema(schema, options)

    def schema(self) -> str:
        """The source's columns (those of Spark's Kafka source)."""
        return SCHEMA

    def reader(self, schema: Any) -> BrokerReader:
        return BrokerReader(SourceOptions.parse(dict(self.options), streaming=False))

    def streamReader(self, schema: Any) -> BrokerStreamReader:
        return BrokerStreamReader(SourceOptions.parse(dict(self.options), streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> BrokerWriter:
        return BrokerWriter(*self._publisher_parts(schema, overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> BrokerStreamWriter:
        return BrokerStreamWriter(*self._publisher_parts(schema, overwrite))
