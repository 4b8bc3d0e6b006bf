"""The sink's options and the checks of a DataFrame's schema, done on the
driver before any task runs (so mistakes fail at planning time)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError
from broker.protocol import topic_name_problem

#: ``broker.delivery`` values.
AT_LEAST_ONCE = "at-least-once"
EXACTLY_ONCE = "exactly-once"


#: The options about reaching the brokers (the sink's and the source's).
CONNECTION_OPTIONS = frozenset(
    {
        "broker.servers",
        "broker.token",
        "broker.tls",
        "broker.cafile",
        "broker.timeout",
        "broker.reconnect",
        "broker.client.name",
    }
)


class SinkError(BrokerError):
    """A sink option or the DataFrame's schema is not usable."""


@dataclass(frozen=True)
class SinkOptions:
    """What ``.option(...)`` said, checked."""

    servers: str
    topic: str | None
    delivery: str
    token: str | None
    tls: bool
    cafile: str | None
    timeout: float
    client_name: str
    #: Seconds a broken connection is retried (and its session resumed); 0: never.
    reconnect: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Options as Spark passes them (keys lower-case, values strings)."""
        known = CONNECTION_OPTIONS | {"topic", "broker.delivery", "path"}
        unknown = sorted(key for key in options if key.startswith("broker.") and key not in known)
        if unknown:
            raise SinkError(f"unknown option(s) {unknown}; known: {sorted(known - {'path'})}")
        servers = options.get("broker.servers", "").strip()
        if not servers:
            raise SinkError('option "broker.servers" is required (host:port[,host:port...])')
        delivery = options.get("broker.delivery", AT_LEAST_ONCE).strip().lower()
        if delivery not in (AT_LEAST_ONCE, EXACTLY_ONCE):
            raise SinkError(
                f'option "broker.delivery" must be "{AT_LEAST_ONCE}" or "{EXACTLY_ONCE}", '
                f"got {delivery!r}"
            )
        tls = options.get("broker.tls", "false").strip().lower()
        if tls not in ("true", "false"):
            raise SinkError(f'option "broker.tls" must be true or false, got {tls!r}')
        try:
            timeout = float(options.get("broker.timeout", "60"))
        except ValueError:
            raise SinkError('option "broker.timeout" must be a number of seconds') from None
        if not timeout > 0:
            raise SinkError('option "broker.timeout" must be > 0')
        try:
            reconnect = float(options.get("broker.reconnect", "30"))
        except ValueError:
            raise SinkError('option "broker.reconnect" must be a number of seconds') from None
        if not reconnect >= 0:
            raise SinkError('option "broker.reconnect" must be >= 0 (0: never)')
        topic = options.get("topic")
        if topic and (problem := topic_name_problem(topic)) is not None:
            raise SinkError(f'option "topic": {problem}')
        return cls(
            servers=servers,
            topic=topic if topic else None,
            delivery=delivery,
            token=options.get("broker.token") or None,
            tls=tls == "true" or bool(options.get("broker.cafile")),
            cafile=options.get("broker.cafile") or None,
            timeout=timeout,
            client_name=options.get("broker.client.name", "spark"),
            reconnect=reconnect,
        )


@dataclass(frozen=True)
class RowLayout:
    """Where a row's fields are (column indexes) and how to turn them into bytes."""

    value: int
    value_is_text: bool
    key: int | None
    key_is_text: bool
    headers: int | None
    topic: int | None


def check_schema(schema: Any, options: SinkOptions) -> RowLayout:
    """The layout of ``schema`` (a ``StructType``), Spark's Kafka sink's columns:
    ``value`` (binary or string, required), ``key`` (binary or string),
    ``headers`` (``array<struct<key:string,value:binary>>``) and ``topic``
    (string; required unless the ``topic`` option is set). Other columns
    are ignored, as the Kafka sink does."""
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

    names = [field.name for field in schema.fields]
    types = {field.name: field.dataType for field in schema.fields}

    def text_or_binary(column: str) -> bool:
        kind = types[column]
        if isinstance(kind, StringType):
            return True
        if isinstance(kind, BinaryType):
            return False
        raise SinkError(f'column "{column}" must be binary or string, not {kind.simpleString()}')

    if "value" not in types:
        raise SinkError(f'the DataFrame needs a "value" column (binary or string); it has {names}')
    value_is_text = text_or_binary("value")
    key_is_text = text_or_binary("key") if "key" in types else False
    if "headers" in types:
        kind = types["headers"]
        element = kind.elementType if isinstance(kind, ArrayType) else None
        fields = (
            {f.name: f.dataType for f in element.fields} if isinstance(element, StructType) else {}
        )
        if not (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType)
        ):
            raise SinkError(
                'column "headers" must be array<struct<key:string,value:binary>>, '
                f"not {kind.simpleString()}"
            )
    if "topic" in types:
        if not isinstance(types["topic"], StringType):
            raise SinkError(f'column "topic" must be string, not {types["topic"].simpleString()}')
    elif options.topic is None:
        raise SinkError('set the "topic" option or give the DataFrame a "topic" column')
    return RowLayout(
        value=names.index("value"),
        value_is_text=value_is_text,
        key=names.index("key") if "key" in types else None,
        key_is_text=key_is_text,
        headers=names.index("headers") if "headers" in types else None,
        # The option, when set, wins over the column (as in Spark's Kafka sink).
        topic=names.index("topic") if "topic" in types and options.topic is None else None,
    )
