"""Publishing rows from Spark tasks: one cached blocking client per Python
worker, reused across tasks (like Spark's Kafka producer cache)."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.client import BlockingClusterClient
from broker.protocol import Stage
from broker.tls import client_context

from ._options import AT_LEAST_ONCE, RowLayout, SinkError, SinkOptions

log = logging.getLogger("broker.spark")

_clients: dict[tuple[str, str | None, bool, str | None, str, float], BlockingClusterClient] = {}
_clients_lock = threading.Lock()


def cached_client(options: SinkOptions) -> BlockingClusterClient:
    """The worker's client for these brokers and credentials (made on first use,
    made again if its connection ended)."""
    key = (
        options.servers,
        options.token,
        options.tls,
        options.cafile,
        options.client_name,
        options.reconnect,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is not None and any(c.closed for c in client.clients.values()):
            client.close(flush=False)
            client = None
        if client is None:
            context = client_context(options.cafile) if options.tls else None
            client = BlockingClusterClient(
                options.servers,
                name=options.client_name,
                token=options.token,
                ssl_context=context,
                connect_timeout=options.timeout,
                reconnect=options.reconnect,
            )
            _clients[key] = client
        return client


@atexit.register
def _close_cached_clients() -> None:
    with _clients_lock:
        for client in _clients.values():
            try:
                client.close(flush=True, timeout=5.0)
            except Exception:  # the worker is exiting: nothing more to do
                log.debug("closing a cached client failed", exc_info=True)
        _clients.clear()


@dataclass
class TaskReport:
    """What one task published (it travels to the driver in a commit message)."""

    partition: int
    attempt: int
    rows: int
    bytes: int
    #: Seconds spent in publish and flush calls: waiting for the broker's guarantees.
    wait_seconds: float
    #: Exactly-once: where the rows were staged, and how many on each broker.
    stage: Stage | None = None
    staged: dict[str, int] = field(default_factory=dict)


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise TypeError(f"expected string or binary, got {type(value).__name__}")


def task_stage(batch: str) -> Stage:
    """The stage of this task attempt in ``batch``: a member name made of the
    partition, the attempt number and a random part (unique even across
    application restarts, so a zombie attempt never shares a member)."""
    partition, attempt = _task_identity()
    return Stage(batch, f"{partition}/{attempt}/{uuid.uuid4().hex[:12]}")


def streaming_batch() -> str:
    """The batch name of the streaming micro-batch this task belongs to:
    query id (stable across restarts from a checkpoint) and batch id."""
    from pyspark import TaskContext

    context = TaskContext.get()
    query = context.getLocalProperty("sql.streaming.queryId") if context else None
    batch = context.getLocalProperty("streaming.sql.batchId") if context else None
    if not query or batch is None:
        raise SinkError("no streaming query id or batch id in the task's context")
    return f"spark-query-{query}-batch-{batch}"


def _header(header: Any) -> tuple[str, bytes]:
    """A ``headers`` element as the broker takes it: a null value is an
    empty one (a broker header value is bytes, never null)."""
    if header is None or header[0] is None:
        raise ValueError('a row has a null element or a null key in its "headers" column')
    return header[0], b"" if header[1] is None else bytes(header[1])


def publish_rows(
    rows: Iterable[Any], layout: RowLayout, options: SinkOptions, stage: Stage | None = None
) -> TaskReport:
    """Publish every row within the broker's guarantees (a slow broker slows
    this call; nothing is buffered beyond what the broker promised), then
    flush: when it returns, the broker has routed every row, or with a
    ``stage``, holds every row staged (the report says how many per broker,
    for the commit). Errors (the broker's Goodbye reason included) propagate
    and fail the task."""
    client = cached_client(options)
    count = size = 0
    waited = 0.0
    topic = options.topic
    for row in rows:
        value = row[layout.value]
        if value is None:
            raise ValueError('a row has a null "value"')
        payload = _text(value)
        key = None
        if layout.key is not None and row[layout.key] is not None:
            key = _text(row[layout.key])
        headers = None
        if layout.headers is not None and row[layout.headers] is not None:
            headers = [_header(h) for h in row[layout.headers]]
        if layout.topic is not None:
            topic = row[layout.topic]
            if not topic:
                raise ValueError('a row has a null or empty "topic"')
        assert topic is not None
        started = time.monotonic()
        client.publish(
            topic, payload, key=key, headers=headers, timeout=options.timeout, stage=stage
        )
        waited += time.monotonic() - started
        count += 1
        size += len(payload)
    started = time.monotonic()
    staged: dict[str, int] = {}
    if stage is None:
        client.flush(timeout=options.timeout)
    else:
        staged = client.finish_stage(stage, timeout=options.timeout)
        if sum(staged.values()) != count:  # pragma: no cover - a bug, not a condition
            raise RuntimeError(f"staged {sum(staged.values())} of {count} rows")
    waited += time.monotonic() - started
    partition, attempt = _task_identity()
    return TaskReport(partition, attempt, count, size, waited, stage, staged)


def _task_identity() -> tuple[int, int]:
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is there when Spark calls us
        return -1, 0
    context = TaskContext.get()
    if context is None:
        return -1, 0
    return context.partitionId(), context.attemptNumber()


def publish_partition(
    rows: Iterator[Any],
    *,
    servers: str,
    topic: str | None = None,
    **options: object,
) -> None:
    """For ``df.foreachPartition(functools.partial(publish_partition, servers=...,
    topic=...))``: the same publishing as the data source, for code that cannot
    use it. ``options`` are the data source's options without their
    ``broker.`` prefix (``token``, ``tls``, ``cafile``, ``timeout``)."""
    from ._options import check_schema

    # Spark passes options as strings; so do we (True -> "true").
    spark_options = {f"broker.{k}": _option_text(v) for k, v in options.items()}
    spark_options["broker.servers"] = servers
    if topic is not None:
        spark_options["topic"] = topic
    parsed = SinkOptions.parse(spark_options)
    if parsed.delivery != AT_LEAST_ONCE:
        raise SinkError(
            "publish_partition publishes at least once (there is no driver to commit): "
            'use the data source for delivery="exactly-once"'
        )
    first = next(rows, None)
    if first is None:
        return
    layout = check_schema(_schema_of(first), parsed)

    def all_rows() -> Iterator[Any]:
        yield first
        yield from rows

    report = publish_rows(all_rows(), layout, parsed)
    log.info("partition %d published %d rows", report.partition, report.rows)


def _option_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _schema_of(row: Any) -> Any:
    """A StructType for a Row whose fields are known by name (foreachPartition rows)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        StringType,
        StructField,
        StructType,
    )

    fields = []
    header = ArrayType(
        StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    )
    for name in row.__fields__:
        value = row[name]
        if name == "headers":
            fields.append(StructField(name, header))
        elif name not in ("topic", "key", "value"):
            continue  # ignored, as the data source ignores other columns
        elif isinstance(value, str | None):
            fields.append(StructField(name, StringType()))
        elif isinstance(value, bytes | bytearray):
            fields.append(StructField(name, BinaryType()))
        else:
            raise SinkError(f'column "{name}" must be binary or string, not {type(value).__name__}')
    return StructType(fields)
