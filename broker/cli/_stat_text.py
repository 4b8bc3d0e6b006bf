"""The text form of a broker's ``/stat.json`` (what ``broker stat`` prints).

Sections and fields carry the JSON's names, so what a runbook names in the
JSON (``budgets``, ``topics[].queued``, a connection's ``buffer_reserved``)
is found in the text by the same word. Every part is optional: a document
without per-connection detail, or with sections this version does not know
(shown as ``name=value`` pairs), still prints.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

#: Width the ``name=value`` lines are wrapped to.
WIDTH = 100

#: Account fields shown (the JSON has more).
ACCOUNT_FIELDS = ("debt", "peak_debt", "loans", "blocked", "seconds_blocked", "waiters")
CHANNEL_FIELDS = {
    "publish": ("capacity", "buffered", "sender_balance", "routed", "confirmed", "dropped_frames"),
    "bind": ("capacity", "buffered", "sender_balance", "dropped_frames"),
    "deliver": ("balance", "sent_frames", "sent_bytes", "unconfirmed_frames", "drops_announced"),
}
SUBSCRIPTION_FIELDS = (
    "queued",
    "delivered",
    "next_seq",
    "acked",
    "lag",
    "cursor",
    "dropped_overflow",
    "dropped_replaced",
    "gaps_sent",
    "max_queued",
    "max_queued_bytes",
)
TOPIC_COLUMNS = ("publishers", "subscriptions", "queued", "messages_in")
#: Columns of the workers' table (a supervisor's merged document: ``workers``).
WORKER_COLUMNS = (
    "pid",
    "up",
    "restarts",
    "direct",
    "connections",
    "connections_total",
    "topics",
    "messages_in",
)
#: Columns of the topic logs' table (``logs.topics``) and of the durable cursors.
LOG_COLUMNS = ("first_offset", "last_offset", "bytes", "terms", "held", "lag")
CURSOR_COLUMNS = ("position", "lag", "subscribed")
#: Figures of the ``logs`` section shown on its head lines, in this order.
LOG_FIGURES = (
    "bytes",
    "terms",
    "blocked_topics",
    "max_lag",
    "subscriptions",
    "appends",
    "append_errors",
    "fsyncs",
    "fsync_seconds",
    "truncated_records",
    "truncated_bytes",
    "open_files",
    "file_evictions",
    "gap_records",
)
#: Figures of the ``cluster`` section shown on its head lines, in this order.
CLUSTER_FIGURES = (
    "topics",
    "topics_sending",
    "runs_sent",
    "runs_resent",
    "runs_in_flight",
    "records_stored",
    "writes_fenced",
    "store_duplicates",
    "stores",
    "store_seconds",
    "reads",
    "read_seconds",
)
#: Top-level keys shown by their own sections (any other is shown generically).
KNOWN = {
    "version",
    "broker",
    "budgets",
    "principals",
    "topics",
    "connections",
    "groups",
    "groups_total",
    "connections_total",
    "topics_total",
    "logs",
    "cluster",
    "workers",
    "mqtt",
}


def _value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)  # true, false, null: as the JSON says
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return value if value and value.isprintable() and " " not in value else repr(value)
    if isinstance(value, Mapping):
        return "{" + " ".join(f"{k}={_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value)


def _pairs(items: Iterable[tuple[str, Any]], indent: str, first: str = "") -> list[str]:
    """``name=value`` words, wrapped at :data:`WIDTH`; the first line starts with ``first``."""
    items = list(items)
    if not items:
        return []
    lines: list[str] = []
    line = indent + first
    for name, value in items:
        word = f"{name}={_value(value)}"
        if line.strip() and len(line) + 1 + len(word) > WIDTH:
            lines.append(line.rstrip())
            line = indent + " " * len(first)
        line += ("" if line.endswith(" ") or not line.strip() else " ") + word
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _picked(mapping: Mapping[str, Any], keys: Iterable[str]) -> list[tuple[str, Any]]:
    return [(key, mapping[key]) for key in keys if key in mapping]


def _flat(mapping: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Nested mappings as ``outer.inner`` pairs."""
    items: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            items += [(f"{key}.{k}", v) for k, v in _flat(value)]
        else:
            items.append((key, value))
    return items


def _dict(document: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = document.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(document: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = document.get(key)
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _broker(document: Mapping[str, Any]) -> list[str]:
    broker = _dict(document, "broker")
    if not broker:
        return []
    words = [str(broker.get("address", "?"))]
    if "epoch" in broker:
        words.append(f"epoch {broker['epoch']}")
    if "tls" in broker:
        words.append("TLS" if broker["tls"] else "plain TCP")
    if "authentication" in broker:
        words.append("clients authenticate" if broker["authentication"] else "no authentication")
    if broker.get("closing"):
        words.append("SHUTTING DOWN")
    lines = ["broker       " + "  ".join(words)]
    lines += _pairs(_dict(broker, "statistics").items(), "", "statistics   ")
    lines += _pairs(_picked(_dict(broker, "account"), ACCOUNT_FIELDS), "", "account      ")
    lines += _pairs(_flat(_dict(broker, "security")), "", "security     ")
    return lines


def _worker(item: Mapping[str, Any]) -> str:
    """`` @<worker>`` for an item of a merged document (tagged ``worker``), else ``""``."""
    return f" @{item['worker']}" if "worker" in item else ""


def _workers(document: Mapping[str, Any]) -> list[str]:
    """The workers of a supervisor's merged document (none in a worker's or
    a single broker's)."""
    if "workers" not in document:
        return []
    workers = _list(document, "workers")
    up = sum(1 for worker in workers if worker.get("up") is True)
    lines = ["", f"workers ({len(workers)}, {up} up)"]
    if workers:
        names = [str(worker.get("id", "?")) for worker in workers]
        lines += _table(workers, names, WORKER_COLUMNS, "  ", "id")
    return lines


def _budgets(document: Mapping[str, Any]) -> list[str]:
    budgets = _dict(document, "budgets")
    if not budgets:
        return []
    lines = ["", "budgets"]
    reserved, total = budgets.get("buffer_reserved"), budgets.get("global_budget")
    rest = dict(budgets)
    if isinstance(reserved, int) and isinstance(total, int) and total > 0:
        share = f"{100 * reserved / total:.1f} %"
        lines.append(f"  buffer_reserved={reserved} of global_budget={total} ({share})")
        del rest["buffer_reserved"], rest["global_budget"]
    return lines + _pairs(rest.items(), "  ")


def _principals(document: Mapping[str, Any]) -> list[str]:
    if "principals" not in document:
        return []
    principals = _dict(document, "principals")
    lines = ["", f"principals ({len(principals)})"]
    for name, usage in principals.items():
        usage = usage if isinstance(usage, Mapping) else {"value": usage}
        lines += _pairs(usage.items(), "  ", f"{_value(name)}  ")
    return lines


def _topics(document: Mapping[str, Any]) -> list[str]:
    if "topics" not in document:
        return []
    topics = _list(document, "topics")
    total = document.get("topics_total")
    shown = f"{len(topics)}"
    if isinstance(total, int) and total != len(topics):
        shown = f"{total} opened since start, {len(topics)} in detail"
    elif isinstance(total, int):
        shown = f"{total} opened since start"
    lines = ["", f"topics ({shown}; all of them: broker topics ls)"]
    if not topics:
        return lines
    names = [repr(topic.get("name", "?")) + _worker(topic) for topic in topics]
    width = max(len("name"), *(len(name) for name in names))
    lines.append("  " + "name".ljust(width) + "".join(f"  {c:>13}" for c in TOPIC_COLUMNS))
    for name, topic in zip(names, topics, strict=True):
        cells = "".join(f"  {_value(topic.get(c, '')):>13}" for c in TOPIC_COLUMNS)
        lines.append(f"  {name.ljust(width)}{cells}")
    return lines


def _table(
    rows: list[Mapping[str, Any]],
    names: list[str],
    columns: tuple[str, ...],
    indent: str,
    title: str = "name",
) -> list[str]:
    """``rows`` as a table: ``names`` (already shown as text) in the first
    column, headed ``title``, then ``columns`` of each row right-aligned."""
    width = max(len(title), *(len(name) for name in names))
    cells = [[_value(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    titles = "".join(f"  {c:>{w}}" for c, w in zip(columns, widths, strict=True))
    head = indent + title.ljust(width) + titles
    lines = [head]
    for name, line in zip(names, cells, strict=True):
        text = "".join(f"  {cell:>{w}}" for cell, w in zip(line, widths, strict=True))
        lines.append(f"{indent}{name.ljust(width)}{text}")
    return lines


def _size(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _logs(document: Mapping[str, Any]) -> list[str]:
    """The topic logs: figures, the detailed topics with their reliable
    subscriptions, the durable cursors (or that the broker keeps no log)."""
    if "logs" not in document:
        return []
    logs = document["logs"]
    if not isinstance(logs, Mapping):
        return ["", "topic logs   none (a memory-only broker)"]
    words = [f"data_dir={_value(logs.get('data_dir', '?'))}"]
    free, size = logs.get("free_bytes"), logs.get("size_bytes")
    if isinstance(free, int) and isinstance(size, int) and size > 0:
        words.append(f"free {_size(free)} of {_size(size)} ({100 * free / size:.1f} %)")
    lines = ["", "topic logs   " + "  ".join(words)]
    lines += _pairs(_picked(logs, LOG_FIGURES), "  ")
    topics = _list(logs, "topics")
    total = logs.get("topics_total", len(topics))
    shown = f"{total}" if total == len(topics) else f"{total}, {len(topics)} in detail"
    # Only the logs opened since the start are known here: a topic nobody
    # has used since stays on disk, uncounted (say so, not "all topics").
    lines.append(
        f"  topics opened since the broker started ({shown}; every topic on disk: broker topics ls)"
    )
    if topics:
        names = [repr(topic.get("name", "?")) + _worker(topic) for topic in topics]
        table = _table(topics, names, LOG_COLUMNS, "    ")
        lines.append(table[0])
        for row, topic in zip(table[1:], topics, strict=True):
            lines.append(row + ("  BLOCKED" if topic.get("blocked") else ""))
            if topic.get("error"):
                lines.append(f"        error={_value(topic['error'])}")
            for reader in _list(topic, "subscriptions"):
                where = f"{reader.get('connection', '?')}/{reader.get('handle', '?')}"
                fields = _picked(reader, ("position", "acked", "lag", "gaps_sent"))
                if reader.get("cursor") is not None:
                    fields.append(("cursor", repr(reader["cursor"])))
                lines += _pairs(fields, "        ", f"subscription {where}  ")
    cursors = _list(logs, "cursors")
    listed = "live subscriptions only" if logs.get("cursors_listed") == "live" else "stored"
    total = logs.get("cursors_total", len(cursors))
    most = "" if total == len(cursors) else f", the {len(cursors)} with the most lag"
    lines.append(f"  durable cursors ({total}, {listed}{most})")
    if cursors:
        names = [
            f"{cursor.get('topic', '?')!r} {cursor.get('cursor', '?')!r}"
            + (f" of {cursor['principal']!r}" if cursor.get("principal") else "")
            + _worker(cursor)
            for cursor in cursors
        ]
        lines += _table(cursors, names, CURSOR_COLUMNS, "    ", "topic cursor")
    return lines


def _cluster(document: Mapping[str, Any]) -> list[str]:
    """Cluster mode: the NATS connection, the runs sent to the topics'
    streams, the topics set aside (nothing outside cluster mode)."""
    cluster = document.get("cluster")
    if not isinstance(cluster, Mapping):
        return []
    connected = cluster.get("connected")
    state = _value(connected)
    if isinstance(connected, bool):
        state = "connected" if connected else "NOT CONNECTED"
    lines = ["", f"cluster      {state} to its NATS servers"]
    lines += _pairs(_picked(cluster, CLUSTER_FIGURES), "  ")
    failures = _dict(cluster, "store_failures")
    if any(failures.values()):
        lines += _pairs(failures.items(), "  ", "store failures: ")
    aside = _dict(cluster, "set_aside")
    total = cluster.get("set_aside_total", len(aside))
    if total or aside:
        most = "" if total == len(aside) else f", the first {len(aside)}"
        lines.append(f"  topics set aside, not served ({total}{most}; deleting one starts afresh)")
        for name, why in aside.items():
            lines.append(f"    {name!r}  {_value(why)}")
    return lines


def _connection(connection: Mapping[str, Any]) -> list[str]:
    words = [str(connection.get("name", "?")) + _worker(connection)]
    words.append(str(connection.get("peer", "?")))
    head: list[tuple[str, Any]] = [("client", repr(connection.get("client", "")))]
    head += [
        (key, repr(connection[key]))
        for key in ("principal", "identity")
        if connection.get(key) is not None
    ]
    head += _picked(connection, ("state",))
    head += _picked(_dict(connection, "account"), ("debt", "peak_debt", "blocked"))
    head += _picked(connection, ("buffer_reserved", "unsent_bytes"))
    head += _picked(_dict(connection, "counters"), ("messages_in", "messages_out"))
    head += _picked(_dict(connection, "protocol"), ("discarded_frames",))
    lines = _pairs(head, "  ", "  ".join(words) + "  ")
    for channel in _list(connection, "channels"):
        kind = str(channel.get("kind", "?"))
        number = _value(channel.get("channel", "?"))  # [kind, index]: bind channels are two
        fields = _picked(channel, CHANNEL_FIELDS.get(kind, ("capacity", "buffered", "balance")))
        if "topic" in channel:
            fields.insert(0, ("topic", repr(channel["topic"])))
            fields += _picked(_dict(channel, "account"), ("debt",))
            fields += [("throttled", True)] if channel.get("throttled") else []
        lines += _pairs(fields, "      ", f"{kind} {number}  ")
    for subscription in _list(connection, "subscriptions"):
        items: list[tuple[str, Any]] = [("topic", repr(subscription.get("topic", "?")))]
        items += _picked(subscription, ("mode", *SUBSCRIPTION_FIELDS))
        lines += _pairs(items, "      ", f"subscription {subscription.get('handle', '?')}  ")
    return lines


def _connections(document: Mapping[str, Any]) -> list[str]:
    if "connections" not in document:
        return []
    connections = _list(document, "connections")
    total = document.get("connections_total", len(connections))
    shown = f"{total}" if total == len(connections) else f"{total}, the busiest {len(connections)}"
    lines = ["", f"connections ({shown})"]
    for connection in connections:
        lines += _connection(connection)
    return lines


#: The figures shown of the MQTT listener, and of each MQTT connection.
MQTT_FIGURES = (
    "connections_open",
    "connections_accepted",
    "connections_refused",
    "sessions_kept",
    "wills_waiting",
    "retained_messages",
    "retained_bytes",
)
MQTT_CONNECTION_FIGURES = (
    "state",
    "persistent",
    "subscriptions",
    "shared_subscriptions",
    "messages_in",
    "messages_out",
    "unacknowledged_in",
    "in_flight_out",
    "unsent_bytes",
    "dropped_overflow",
    "dropped_too_large",
    "dropped_expired",
)


def _mqtt(document: Mapping[str, Any]) -> list[str]:
    """The MQTT listener and its busiest connections (nothing without one)."""
    mqtt = document.get("mqtt")
    if not isinstance(mqtt, Mapping):
        return []
    tls = " TLS" if mqtt.get("tls") else ""
    lines = ["", f"mqtt         {mqtt.get('address', '?')}{tls}"]
    lines += _pairs(_picked(mqtt, MQTT_FIGURES), "  ")
    for connection in _list(mqtt, "connections"):
        words = [str(connection.get("name", "?")), str(connection.get("peer", "?"))]
        head: list[tuple[str, Any]] = [("client_id", repr(connection.get("client_id", "")))]
        if connection.get("principal") is not None:
            head.append(("principal", repr(connection["principal"])))
        head += _picked(connection, ("version",))
        head += _picked(_dict(connection, "account"), ("debt", "blocked"))
        head += _picked(connection, MQTT_CONNECTION_FIGURES)
        lines += _pairs(head, "  ", "  ".join(words) + "  ")
    return lines


#: Columns of the consumer groups' table.
GROUP_COLUMNS = ("members", "outstanding", "lag", "redelivered", "dead_lettered", "late_settles")


def _groups(document: Mapping[str, Any]) -> list[str]:
    """The consumer groups loaded (those with members, or settling)."""
    groups = _list(document, "groups")
    if "groups" not in document:
        return []
    total = document.get("groups_total", len(groups))
    most = "" if total == len(groups) else f", the {len(groups)} with the most lag"
    lines = ["", f"consumer groups ({total} with members{most})"]
    if groups:
        names = [f"{g.get('topic', '?')!r} {g.get('group', '?')!r}" + _worker(g) for g in groups]
        lines += _table(groups, names, GROUP_COLUMNS, "  ", "topic group")
    return lines


def _others(document: Mapping[str, Any]) -> list[str]:
    """Sections this version does not know, as ``name=value`` pairs."""
    lines: list[str] = []
    for key, value in document.items():
        if key in KNOWN:
            continue
        if isinstance(value, Mapping):
            lines += ["", key, *_pairs(_flat(value), "  ")]
        elif isinstance(value, list):
            lines += ["", f"{key} ({len(value)})"]
            for item in value:
                if isinstance(item, Mapping):
                    lines += _pairs(_flat(item), "    ", "- ")
                else:
                    lines.append(f"  - {_value(item)}")
        else:
            lines += ["", f"{key} {_value(value)}"]
    return lines


def render(document: Mapping[str, Any]) -> str:
    """``document`` (a ``/stat.json``) as text lines, newline-terminated."""
    lines = [
        *_broker(document),
        *_workers(document),
        *_budgets(document),
        *_principals(document),
        *_topics(document),
        *_logs(document),
        *_cluster(document),
        *_groups(document),
        *_connections(document),
        *_mqtt(document),
        *_others(document),
    ]
    while lines and not lines[0]:
        del lines[0]
    return "\n".join(lines) + "\n"
