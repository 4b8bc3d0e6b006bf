"""The workers' ``/metrics`` and ``/stat.json`` answers as one each (pure: no I/O).

:func:`merge_expositions`: each worker's text is parsed with
prometheus_client's parser; the families are merged by name and written back
in the text format 0.0.4 the way ``prometheus_client.generate_latest`` writes
it (:func:`write_exposition`), except that label order is kept, so the
``worker`` label comes first.

:func:`merge_stat_documents`: the documents merged field by field as
:data:`broker.metrics._stat_schema.MERGE_RULES` says: summed where their
figures add up, their lists of connections and topics joined and cut again
as one broker cuts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, assert_never, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from broker.config import BrokerConfig
from broker.metrics._collector import BACKLOG_UNSENT
from broker.metrics._stat_schema import (
    MERGE_RULES,
    STAT_VERSION,
    MergeRule,
    Order,
    Rows,
    Rule,
    Section,
)

from ._info import WorkerInfo

#: How many connections (and topics) a broker details by default (its ``metrics_top``).
DEFAULT_TOP: Final = BrokerConfig.metrics_top
#: The label each worker's samples get: the worker's id.
WORKER_LABEL: Final = "worker"
#: The supervisor's own families, as the text names them (a worker's family
#: written under one of these names is left out).
SUPERVISOR_FAMILIES: Final = ("broker_workers", "broker_worker_up", "broker_worker_restarts_total")
#: The sample names of the OpenMetrics-only samples the text format 0.0.4 shows
#: as gauges of their own after their family (as generate_latest does).
_OPENMETRICS_SUFFIXES: Final = ("_created", "_gsum", "_gcount")
#: The type word of the text format for each parsed type (as generate_latest writes it).
_TYPE_WORDS: Final = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
#: The suffix the text format adds to a family's name for its TYPE and HELP lines.
_NAME_SUFFIXES: Final = {"counter": "_total", "info": "_info"}


#: prometheus_client's float formatting (untyped there).
_go_float: Final = cast(Callable[[float], str], floatToGoString)


def parse_exposition(text: str) -> list[Metric]:
    """``text`` (the text format 0.0.4) as metric families; raises :class:`ValueError`
    (or another parser error) if it is not."""
    return list(text_string_to_metric_families(text))


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _sample_line(sample: Sample) -> str:
    labels = ",".join(
        f'{escape_label_name(name)}="{_escape_value(value)}"'
        for name, value in sample.labels.items()
    )
    timestamp = ""
    if sample.timestamp is not None:
        timestamp = f" {int(float(sample.timestamp) * 1000):d}"
    braces = "{" + labels + "}" if labels else ""
    return f"{escape_metric_name(sample.name)}{braces} {_go_float(sample.value)}{timestamp}\n"


def write_exposition(families: Iterable[Metric]) -> str:
    """``families`` in the text format 0.0.4, byte for byte as
    ``prometheus_client.generate_latest`` writes them, except that each
    sample's labels are written in their order (generate_latest sorts them).

    As there: a counter's TYPE and HELP name it with ``_total``, an info
    family with ``_info``; ``_created`` (and ``_gsum``, ``_gcount``) samples
    follow their family as gauges of their own.
    """
    out: list[str] = []
    for metric in families:
        name = escape_metric_name(metric.name + _NAME_SUFFIXES.get(metric.type, ""))
        kind = _TYPE_WORDS.get(metric.type, metric.type)
        help_text = _escape_help(metric.documentation)
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        extra: dict[str, list[str]] = {}
        for sample in metric.samples:
            suffix = next(
                (s for s in _OPENMETRICS_SUFFIXES if sample.name == metric.name + s), None
            )
            if suffix is None:
                out.append(_sample_line(sample))
            else:
                extra.setdefault(suffix, []).append(_sample_line(sample))
        for suffix, lines in sorted(extra.items()):
            name = escape_metric_name(metric.name + suffix)
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            out.extend(lines)
    return "".join(out)


def _supervisor_families(workers: Sequence[WorkerInfo], answered: set[str]) -> list[Metric]:
    count = Metric(
        "broker_workers", "Worker processes the supervisor is configured to run.", "gauge"
    )
    count.add_sample("broker_workers", {}, float(len(workers)))
    up = Metric(
        "broker_worker_up",
        "1 if the worker answered this scrape of the supervisor's endpoint, else 0.",
        "gauge",
    )
    restarts = Metric(
        "broker_worker_restarts", "Times the supervisor started the worker again.", "counter"
    )
    for worker in workers:
        labels = {WORKER_LABEL: worker.id}
        up.add_sample("broker_worker_up", labels, 1.0 if worker.id in answered else 0.0)
        restarts.add_sample("broker_worker_restarts_total", labels, float(worker.restarts))
    return [count, up, restarts]


def merge_families(parsed: Mapping[str, Sequence[Metric]]) -> list[Metric]:
    """Worker id -> its families, as one list of families: each name once
    (the first worker's HELP and type win; a family of another type under a
    name already written, as a gauge ``x_total`` after a counter ``x``, or
    of a supervisor family's name, is left out), in
    the order they were first seen, each with every worker's samples in the
    order of ``parsed``; every sample has ``worker="<id>"`` as its first
    label (replacing a ``worker`` label of the worker's own)."""
    merged: dict[str, Metric] = {}
    for worker, families in parsed.items():
        for family in families:
            exposed = family.name + _NAME_SUFFIXES.get(family.type, "")
            if exposed in SUPERVISOR_FAMILIES:
                continue
            into = merged.get(exposed)
            if into is None:
                into = merged[exposed] = Metric(family.name, family.documentation, family.type)
            elif (into.name, into.type) != (family.name, family.type):
                continue
            for sample in family.samples:
                labels = {WORKER_LABEL: worker}
                labels.update((k, v) for k, v in sample.labels.items() if k != WORKER_LABEL)
                into.samples.append(sample._replace(labels=labels))
    return list(merged.values())


def merge_expositions(texts: Mapping[str, str], workers: Sequence[WorkerInfo] | None = None) -> str:
    """Worker id -> its ``/metrics`` text (format 0.0.4, as ``generate_latest``
    writes it) as one exposition in that format.

    Every family's ``# HELP`` and ``# TYPE`` appear once, followed by all
    its samples from every worker (see :func:`merge_families`); each sample
    has the label ``worker="<id>"`` first. A family that only some workers
    have is fine. A text that does not parse is left out, as if that worker
    had not answered.

    With ``workers`` (the supervisor's view, every configured worker), the
    supervisor's families come first: ``broker_workers`` (gauge: how many
    are configured), ``broker_worker_up{worker}`` (gauge: 1 if the worker's
    text is in ``texts`` and parsed, else 0) and
    ``broker_worker_restarts_total{worker}`` (counter: ``restarts``).
    """
    parsed: dict[str, list[Metric]] = {}
    for worker, text in texts.items():
        try:
            parsed[worker] = parse_exposition(text)
        except (ValueError, IndexError, KeyError, TypeError):  # the parser's refusals
            continue
    families = [] if workers is None else _supervisor_families(workers, set(parsed))
    return write_exposition([*families, *merge_families(parsed)])


# ====================================================================== /stat.json


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine(values: Mapping[str, Any]) -> Any:
    """Worker id -> a value of one place in its document, as one value:
    :attr:`Rule.SUM` (and :attr:`Rule.ANY`)."""
    present = {worker: value for worker, value in values.items() if value is not None}
    if not present:
        return None
    kinds = list(present.values())
    if all(isinstance(v, bool) for v in kinds):
        return any(kinds)
    if all(_number(v) for v in kinds):
        return sum(kinds)
    if all(isinstance(v, Mapping) for v in kinds):
        keys = dict.fromkeys(k for v in kinds for k in v)
        return {key: combine({w: v[key] for w, v in present.items() if key in v}) for key in keys}
    return _common(present)


def _common(values: Mapping[str, Any]) -> Any:
    """:attr:`Rule.SAME`: the value every worker has, or ``{worker: value}`` if they differ."""
    distinct = list(values.values())
    if not distinct:
        return None
    if all(v == distinct[0] for v in distinct):
        return distinct[0]
    return dict(values)


def _tagged(docs: Mapping[str, Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    """The items of list ``key`` of every document, each a copy with ``worker`` first."""
    items: list[dict[str, Any]] = []
    for worker, doc in docs.items():
        listed = doc.get(key)
        if isinstance(listed, list):
            items += [{"worker": worker, **item} for item in listed if isinstance(item, Mapping)]
    return items


def _num(value: object) -> float:
    """``value`` if it is a number, else 0."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 0.0


_Key = Callable[[Mapping[str, Any]], tuple[float, ...]]


def _best(items: Sequence[dict[str, Any]], n: int, key: _Key) -> list[dict[str, Any]]:
    """The ``n`` items with the largest ``key``, largest first (ties: as listed)."""
    return sorted(items, key=key, reverse=True)[: max(0, n)]


def _debt(connection: Mapping[str, Any]) -> tuple[float, ...]:
    account = connection.get("account")
    account = account if isinstance(account, Mapping) else {}
    return (float(bool(account.get("blocked"))), _num(account.get("debt")))


def _backlog(connection: Mapping[str, Any]) -> tuple[float, ...]:
    listed = connection.get("subscriptions")
    listed = listed if isinstance(listed, list) else []
    queued = sum(_num(s.get("queued")) for s in listed if isinstance(s, Mapping))
    return (queued, _num(connection.get("unsent_bytes")))


def _behind(connection: Mapping[str, Any]) -> bool:
    queued, unsent = _backlog(connection)
    return queued > 0 or unsent >= BACKLOG_UNSENT


def _any(row: Mapping[str, Any]) -> bool:
    return True


def _order(order: Order) -> tuple[_Key, Callable[[Mapping[str, Any]], bool]]:
    """The key ``order`` ranks rows by, and which rows it ranks."""
    match order:
        case Order.DEBT:
            return _debt, _any
        case Order.BACKLOG:
            return _backlog, _behind
        case Order.QUEUED:
            return lambda t: (_num(t.get("queued")), _num(t.get("messages_in"))), _any
        case Order.LOG_BYTES:
            return lambda t: (float(bool(t.get("blocked"))), _num(t.get("bytes"))), _any
        case Order.LOG_LAG:
            return lambda t: (
                _num(t.get("lag")),
                _num(t.get("bytes")),
            ), lambda t: _num(t.get("lag")) > 0
        case Order.CURSOR_LAG:
            return lambda c: (-1.0 if c.get("lag") is None else _num(c.get("lag")),), _any
        case Order.GROUP_LAG:
            return lambda g: (_num(g.get("lag")),), _any
        case _:
            assert_never(order)


def _rows(items: Sequence[dict[str, Any]], rows: Rows, top: int) -> list[dict[str, Any]]:
    """The items ``rows`` chooses: the ``n`` first by its first order, then up
    to ``n`` more of the rest by its second (those it ranks)."""
    n = top if rows.limit is None else rows.limit
    chosen = _best(items, n, _order(rows.first)[0])
    if rows.then is None:
        return chosen
    key, wanted = _order(rows.then)
    ids = {id(item) for item in chosen}
    rest = [item for item in items if id(item) not in ids and wanted(item)]
    return chosen + _best(rest, n, key)


#: The value of a field left out.
_ABSENT: Final = object()


def _emitted(rule: MergeRule) -> bool:
    """Whether a field with ``rule`` is in the merged section even if no worker has it."""
    if isinstance(rule, Rows):
        return True
    if isinstance(rule, Section):
        return rule.missing != "omit"
    return rule in (Rule.MAX, Rule.JOIN, Rule.LEAST_FREE)


def _children(path: str) -> list[str]:
    """The fields :data:`MERGE_RULES` names in the section at ``path``."""
    prefix = f"{path}." if path else ""
    return [
        name.removeprefix(prefix)
        for name in MERGE_RULES
        if name.startswith(prefix) and "." not in name.removeprefix(prefix)
    ]


def _section(
    parts: Mapping[str, Mapping[str, Any]], path: str, others: Rule, top: int
) -> dict[str, Any]:
    """Worker id -> its section at ``path`` (a mapping), as one: each field
    by its rule (``others`` if it has none), in the order the workers list them."""
    merged: dict[str, Any] = {}
    keys = dict.fromkeys(key for part in parts.values() for key in part)
    for child in _children(path):
        if child not in keys and child != "*" and _emitted(MERGE_RULES[_join(path, child)]):
            keys[child] = None
    for key in keys:
        value = _field(parts, key, _join(path, key), MERGE_RULES.get(_join(path, key), others), top)
        if value is not _ABSENT:
            merged[key] = value
    return merged


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _mixed(values: Mapping[str, Any]) -> bool:
    """Whether some of ``values`` are mappings and some neither mappings nor ``null``."""
    kinds = {isinstance(v, Mapping) for v in values.values() if v is not None}
    return len(kinds) > 1


def _field(
    parts: Mapping[str, Mapping[str, Any]], key: str, path: str, rule: MergeRule, top: int
) -> Any:
    """Field ``key`` of the workers' sections ``parts``, merged by ``rule``
    (``path``: where the rules of its fields are), or :data:`_ABSENT`."""
    values = {w: part[key] for w, part in parts.items() if key in part}
    if isinstance(rule, Rows):
        return _rows(_tagged(parts, key), rule, top)
    if isinstance(rule, Section):
        inner = {w: v for w, v in values.items() if isinstance(v, Mapping)}
        if rule.missing == "omit" and _mixed(values):
            return combine(values)
        if inner:
            return _section(inner, path, rule.others, top)
        if rule.missing != "omit":
            return {} if rule.missing == "empty" else None
        return combine(values) if values else _ABSENT
    match rule:
        case Rule.SUM | Rule.ANY:
            return combine(values) if values else _ABSENT
        case Rule.SAME:
            return _common(values) if values else _ABSENT
        case Rule.MAX:
            return int(max((_num(part.get(key)) for part in parts.values()), default=0))
        case Rule.JOIN:
            return ", ".join(dict.fromkeys(str(part.get(key, "?")) for part in parts.values()))
        case Rule.OMIT:
            return _ABSENT
        case Rule.LEAST_FREE:
            fullest = min(
                parts.values(),
                key=lambda part: (
                    1e300 if part.get("free_bytes") is None else _num(part["free_bytes"])
                ),
            )
            return fullest.get(key)
        case Rule.EACH_KEY:
            maps = {w: v for w, v in values.items() if isinstance(v, Mapping)}
            if not maps or _mixed(values):
                return combine(values) if values else _ABSENT
            names = dict.fromkeys(name for one in maps.values() for name in one)
            star = f"{path}.*"
            return {
                name: _field(maps, name, star, MERGE_RULES.get(star, Rule.SUM), top)
                for name in names
            }
        case _:
            assert_never(rule)


def _topics(doc: Mapping[str, Any]) -> Any:
    """The topics a worker serves: its topic logs if it keeps them (a topic
    whose clients have all left is closed, but its log is still there),
    else the topics open now."""
    logs = doc.get("logs")
    if isinstance(logs, Mapping) and logs.get("topics_total") is not None:
        return logs["topics_total"]
    return doc.get("topics_total")


def _worker_entry(info: WorkerInfo, doc: Mapping[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": info.id,
        "pid": info.pid,
        "up": doc is not None,
        "restarts": info.restarts,
        "direct": info.direct,
        "metrics": "{}:{}".format(*info.metrics),
        "epoch": None,
        "connections": None,
        "connections_total": None,
        "topics": None,
        "messages_in": None,
    }
    if doc is None:
        return entry
    broker = doc.get("broker")
    broker = broker if isinstance(broker, Mapping) else {}
    statistics = broker.get("statistics")
    statistics = statistics if isinstance(statistics, Mapping) else {}
    totals = doc.get("totals")
    totals = totals if isinstance(totals, Mapping) else {}
    entry.update(
        epoch=broker.get("epoch"),
        connections=doc.get("connections_total"),
        connections_total=statistics.get("connections_total"),
        topics=_topics(doc),
        messages_in=totals.get("broker_received_messages_total"),
    )
    return entry


def merge_stat_documents(
    docs: Mapping[str, dict[str, Any] | None],
    workers: Sequence[WorkerInfo],
    *,
    top: int = DEFAULT_TOP,
) -> dict[str, Any]:
    """Worker id -> its ``/stat.json`` document (None: it did not answer) as
    one document of the same shape, which ``broker stat`` shows, with a
    ``workers`` list added.

    Each field is merged over the workers that answered by its rule in
    :data:`~broker.metrics._stat_schema.MERGE_RULES`: figures summed, flags
    true if any worker's is, settings and text the same or ``{worker:
    value}`` where the workers differ, peaks the largest; ``connections``,
    ``topics``, ``logs.topics`` and ``logs.cursors`` list every worker's,
    each tagged ``"worker": id``, chosen again as one broker chooses, ``top``
    (its ``metrics_top``) at a time. Documents of ids not in ``workers`` are
    merged all the same.

    ``workers`` lists every worker of ``workers`` in order: ``{"id", "pid",
    "up" (it answered), "restarts", "direct" ("host:port"), "metrics"
    ("host:port" of its own endpoint), "epoch", "connections" (its client
    connections now: its document's ``connections_total``),
    "connections_total" (client connections it accepted since it started:
    its ``broker.statistics.connections_total``), "topics" (the topics it
    serves: its topic logs' ``topics_total`` if it keeps logs, else its open
    topics' ``topics_total``), "messages_in" (messages its clients
    published since it started: ``totals.broker_received_messages_total``)}``
    (from ``epoch`` on ``null`` for a worker that did not answer).
    """
    answered = {w: d for w, d in docs.items() if isinstance(d, Mapping)}
    merged: dict[str, Any] = {"version": STAT_VERSION}
    merged.update(_section(answered, "", Rule.SUM, top))
    if merged["version"] is None:
        merged["version"] = STAT_VERSION
    merged["workers"] = [_worker_entry(info, answered.get(info.id)) for info in workers]
    return merged
