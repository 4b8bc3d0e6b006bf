"""/stat.json as TypedDicts, and the workers' merge as a table of rules
(broker/metrics/_stat_schema.py): every field says how the workers' values
merge, the rules do what they say, and a real broker's document has the
shape the types give."""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Iterator
from typing import (
    Any,
    ForwardRef,
    Literal,
    NotRequired,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import trio

from accounts import AccountStatistics
from broker.client import open_client
from broker.metrics import _stat_schema as schema
from broker.metrics import stat_document
from broker.metrics._stat_schema import MERGE_RULES, Order, Rows, Rule, Section, StatDocument
from broker.protocol import BindTopic, Subscribe
from broker.protocol.guarantees._receiver import ReceiverStatistics
from broker.protocol.guarantees._sender import SenderStatistics
from broker.server import BrokerStatistics, ConnectionCounters
from broker.server._principal_usage import SecurityCounters
from broker.server.cluster._link import LinkStatistics
from broker.workers import WorkerInfo, merge_stat_documents
from tests.server.helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until

# ====================================================================== the types


def hints(typed: Any) -> dict[str, tuple[Any, bool]]:
    """Field -> (its type, required) of TypedDict ``typed``."""
    found = {}
    for name, hint in get_type_hints(typed, include_extras=True).items():
        optional = get_origin(hint) is NotRequired
        found[name] = (get_args(hint)[0] if optional else hint, not optional)
    return found


def without_none(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        arms = [arm for arm in get_args(hint) if arm is not type(None)]
        return arms[0] if len(arms) == 1 else Union[tuple(arms)]  # noqa: UP007
    return hint


def ruled_fields(typed: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, type) of every field of ``typed`` that :data:`MERGE_RULES`
    must name: the fields of sections, and of each value of a mapping of
    names; not those of rows (rows are chosen, not merged)."""
    for name, (hint, _required) in hints(typed).items():
        path = prefix + name
        yield path, hint
        rule = MERGE_RULES.get(path)
        inner = without_none(hint)
        if isinstance(rule, Section) and is_typeddict(inner):
            yield from ruled_fields(inner, path + ".")
        elif rule is Rule.EACH_KEY and get_origin(inner) is dict:
            value = get_args(inner)[1]
            yield path + ".*", value
            if is_typeddict(value):
                yield from ruled_fields(value, path + ".*.")


def test_every_field_has_a_merge_rule() -> None:
    """A field added to the document must say how the workers' values merge."""
    fields = dict(ruled_fields(StatDocument))
    assert [path for path in fields if path not in MERGE_RULES] == []
    for path, hint in fields.items():
        rule, inner = MERGE_RULES[path], without_none(hint)
        if is_typeddict(inner):
            assert isinstance(rule, Section), f"{path}: a section, merged field by field"
        if isinstance(rule, Rows):
            assert get_origin(inner) is list and is_typeddict(get_args(inner)[0]), path
        if rule is Rule.EACH_KEY:
            assert get_origin(inner) is dict, path
    # ... and every rule is of a field.
    assert [path for path in MERGE_RULES if path not in fields] == []
    assert len(fields) >= 80  # (walked the whole document)


def test_the_types_have_the_fields_of_what_they_show() -> None:
    """The parts of the document that are snapshots' fields list them all."""
    mirrored = {
        schema.AccountDoc: AccountStatistics,
        schema.StatisticsDoc: BrokerStatistics,
        schema.SecurityDoc: SecurityCounters,
        schema.LinkDoc: LinkStatistics,
        schema.CountersDoc: ConnectionCounters,
    }
    for typed, snapshot in mirrored.items():
        assert list(hints(typed)) == [f.name for f in dataclasses.fields(snapshot)], typed
    for row, snapshot in (
        (schema.ReceiverRow, ReceiverStatistics),
        (schema.SenderRow, SenderStatistics),
    ):
        required = [name for name, (_, needed) in hints(row).items() if needed]
        assert required == ["kind", "direction", *(f.name for f in dataclasses.fields(snapshot))]


def problems(value: Any, hint: Any, path: str = "") -> list[str]:
    """Where ``value`` (JSON-ready data) is not of type ``hint``."""
    if isinstance(hint, str | ForwardRef):
        text = hint if isinstance(hint, str) else hint.__forward_arg__
        hint = eval(text, vars(schema))
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return []
    if origin in (Union, types.UnionType):
        found = [problems(value, arm, path) for arm in args]
        return [] if [] in found else min(found, key=len)
    if hint is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    if origin is Literal:
        return [] if value in args else [f"{path}: {value!r} not in {args}"]
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not a {hint.__name__}"]
        fields = hints(hint)
        found = [f"{path}.{key}: not in {hint.__name__}" for key in value if key not in fields]
        found += [
            f"{path}.{key}: missing"
            for key, (_, needed) in fields.items()
            if needed and key not in value
        ]
        for key, (field_hint, _) in fields.items():
            if key in value:
                found += problems(value[key], field_hint, f"{path}.{key}")
        return found
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        return [p for i, item in enumerate(value) for p in problems(item, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not a mapping"]
        return [p for k, item in value.items() for p in problems(item, args[1], f"{path}.{k}")]
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return [] if ok else [f"{path}: {value!r} is not {hint.__name__}"]


def test_the_checker_sees_a_wrong_document() -> None:
    document = {"version": "2", "groups": [], "groups_total": 0, "extra": 1}
    found = problems(document, StatDocument)
    assert ".version: '2' is not int" in found
    assert ".extra: not in StatDocument" in found
    assert ".broker: missing" in found


async def test_a_brokers_document_has_the_typed_shape(tmp_path: Any) -> None:
    """A broker with a data directory, a reliable subscriber on a durable
    cursor, a lossy subscriber and a publisher: its document (every section
    and kind of row filled) is what the types say."""
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        raw = await RawClient.connect(broker)
        try:
            await raw.handshake("stuck")
            await raw.send(BindTopic("t"), Subscribe(0, "reliable", {"cursor": "c"}))
            async with (
                open_client(url(broker), name="publisher") as publisher,
                open_client(url(broker), name="lossy") as lossy,
                lossy.subscribe("t", mode="lossy") as subscription,
            ):
                await wait_until(
                    lambda: len(broker.topics["t"].subscriptions) == 2, what="two subscribers"
                )
                await publisher.publish("t", b"x")
                await publisher.flush()
                with trio.fail_after(TIMEOUT):
                    await subscription.receive()
                document = stat_document(broker)
        finally:
            await raw.aclose()
    json.dumps(document, allow_nan=False)
    logs = document["logs"]
    assert logs is not None and logs["topics"][0]["subscriptions"] and logs["cursors"]
    modes = {s["mode"] for c in document["connections"] for s in c["subscriptions"]}
    assert modes == {"reliable", "lossy"}
    kinds = {(ch["kind"], ch["direction"]) for c in document["connections"] for ch in c["channels"]}
    assert ("publish", "in") in kinds and ("deliver", "out") in kinds
    assert problems(document, StatDocument) == []


# ====================================================================== the rules


def part(scale: int, *, address: str, free: int | None) -> dict[str, Any]:
    """A small document of one worker: one field for each kind of rule."""
    return {
        "version": 2,
        "broker": {
            "address": address,
            "epoch": f"e{scale}",
            "tls": scale == 2,
            "account": {"name": "broker", "debt": scale, "peak_debt": 10 * scale},
            "loop": None,
        },
        "budgets": {"global_budget": 100, "connection_budget": 4, "max_unsent": scale},
        "principals": {"alice": {"connections": scale}, f"p{scale}": {"connections": 1}},
        "totals": {"broker_received_messages_total": scale, "by": {"publish": scale}},
        "connections_total": scale,
        "connections": [
            {"name": f"conn-{scale}", "account": {"debt": scale}, "subscriptions": []},
        ],
        "topics": [{"name": "t", "queued": scale, "messages_in": 0}],
        "groups": [{"topic": "t", "group": f"g{scale}", "lag": scale}],
        "groups_total": 1,
        "logs": {
            "data_dir": "/d",
            "free_bytes": free,
            "size_bytes": 1000 * scale,
            "max_lag": 3 - scale,
            "bytes": scale,
            "topics": [],
            "cursors": [{"cursor": f"c{scale}", "lag": scale}],
        },
        "news": scale,  # a field a newer worker has: summed
    }


def test_the_rules_on_two_workers() -> None:
    w1 = part(1, address="0.0.0.0:7400", free=None)
    w2 = part(2, address="0.0.0.0:7401", free=50)
    merged = merge_stat_documents({"w1": w1, "w2": w2}, [], top=1)
    assert merged == {
        "version": 2,  # same
        "broker": {
            "address": "0.0.0.0:7400, 0.0.0.0:7401",  # join
            # (no epoch: omit)
            "tls": True,  # any
            "account": {"name": "broker", "debt": 3, "peak_debt": 20},  # same, sum, max
            "loop": None,  # a section no worker has: null
        },
        "budgets": {"global_budget": 200, "connection_budget": 4, "max_unsent": {"w1": 1, "w2": 2}},
        "principals": {
            "alice": {"connections": 3},
            "p1": {"connections": 1},
            "p2": {"connections": 1},
        },
        "totals": {"broker_received_messages_total": 3, "by": {"publish": 3}},
        "connections_total": 3,
        # rows: tagged, the top (1) with the most debt (then none behind)
        "connections": [
            {"worker": "w2", "name": "conn-2", "account": {"debt": 2}, "subscriptions": []}
        ],
        "topics": [{"worker": "w2", "name": "t", "queued": 2, "messages_in": 0}],
        # each worker's groups, tagged, the most lag first (limit LIST_GROUPS)
        "groups": [
            {"worker": "w2", "topic": "t", "group": "g2", "lag": 2},
            {"worker": "w1", "topic": "t", "group": "g1", "lag": 1},
        ],
        "groups_total": 2,
        "logs": {
            "data_dir": "/d",
            "free_bytes": 50,  # least_free: the worker with the least free bytes (known)
            "size_bytes": 2000,
            "max_lag": 2,
            "bytes": 3,
            "topics": [],
            "cursors": [
                {"worker": "w2", "cursor": "c2", "lag": 2},
                {"worker": "w1", "cursor": "c1", "lag": 1},
            ],
        },
        "news": 3,
        "workers": [],
    }
    assert list(merged["broker"]["account"]) == ["name", "debt", "peak_debt"]
    only = merge_stat_documents({"w1": w1, "w0": None}, [])
    assert only["logs"]["free_bytes"] is None and only["broker"]["address"] == "0.0.0.0:7400"


def test_every_kind_of_rule_is_used_and_tried() -> None:
    """The example above exercises every kind of rule the table uses."""
    used = {rule for rule in MERGE_RULES.values() if isinstance(rule, Rule)}
    assert used == set(Rule)
    orders = {
        o
        for rule in MERGE_RULES.values()
        if isinstance(rule, Rows)
        for o in (rule.first, rule.then)
    }
    assert orders - {None} == set(Order)


def test_no_worker_answered() -> None:
    merged = merge_stat_documents({"w0": None}, [WorkerInfo("w0", None, False, 0, "", ("", 0))])
    assert {key: merged[key] for key in ("version", "broker", "budgets", "logs")} == {
        "version": 2,
        "broker": {},
        "budgets": {},
        "logs": None,
    }
    assert merged["connections"] == [] and merged["topics"] == []
