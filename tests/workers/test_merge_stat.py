"""merge_stat_documents: two workers' /stat.json documents (the shape
broker.metrics.stat_document gives) as one, and how `broker stat` shows it."""

from __future__ import annotations

import json
from typing import Any

from broker.cli._stat_text import render
from broker.workers import WorkerInfo, merge_stat_documents


def account(name: str, debt: int, *, blocked: bool = False, peak: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "connection" if name.startswith("conn") else "broker",
        "debt": debt,
        "peak_debt": peak,
        "borrowed_total": 10,
        "repaid_total": 10 - debt,
        "loans": 0,
        "blocked": blocked,
        "seconds_blocked": 0.5,
        "waiters": 0,
        "high_watermark": None,
        "low_watermark": None,
    }


def connection(name: str, debt: int, *, queued: int = 0, unsent: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "serial": int(name.split("-")[1]),
        "peer": "127.0.0.1:5000",
        "client": "c-" + name,
        "principal": None,
        "identity": None,
        "state": "open",
        "account": account(name, debt),
        "counters": {"messages_in": 1, "bytes_in": 76, "messages_out": 0, "bytes_out": 166},
        "protocol": {"frames_received": 3, "discarded_frames": 0},
        "buffer_reserved": 294912,
        "unsent_bytes": unsent,
        "channels_total": 0,
        "subscriptions_total": 1,
        "channels": [],
        "subscriptions": [
            {"handle": 0, "topic": "t", "mode": "lossy", "queued": queued, "delivered": 1}
        ],
    }


def topic(name: str, queued: int, messages_in: int) -> dict[str, Any]:
    return {
        "name": name,
        "publishers": 1,
        "subscriptions": 1,
        "queued": queued,
        "messages_in": messages_in,
    }


def document(
    address: str,
    epoch: str,
    *,
    scale: int,
    connections: list[dict[str, Any]],
    topics: list[dict[str, Any]],
    logs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A /stat.json document of the shape stat_document gives, its figures
    ``scale`` times a base."""
    return {
        "version": 2,
        "broker": {
            "address": address,
            "epoch": epoch,
            "closing": False,
            "tls": False,
            "authentication": scale == 2,
            "security": {
                "auth_failures": {"no_credentials": scale, "bad_credentials": 0},
                "tls_handshake_failures": 0,
                "lease_expirations": 0,
            },
            "statistics": {
                "connections": len(connections),
                "connections_total": 10 * scale,
                "refused_total": 0,
                "topics": len(topics),
                "subscriptions": scale,
                "buffer_reserved_bytes": 1000 * scale,
                "buffer_budget_bytes": 268435456,
                "debt": scale,
            },
            "account": account("broker", scale, peak=100 * scale, blocked=scale == 1),
            "loop": None,
        },
        "budgets": {
            "global_budget": 268435456,
            "buffer_reserved": 1000 * scale,
            "connection_budget": 4194304,
            "publish_capacity": 262144 * scale,
            "max_connections": 10000,
        },
        "principals": {"alice": {"connections": scale, "buffer_reserved": 5, "buffer_budget": 9}},
        "totals": {
            "broker_received_messages_total": scale,
            "broker_throttled_seconds_total": 0.25 * scale,
            "broker_buffer_used_bytes": {"publish": scale, "bind": 9},
            "broker_dropped_frames_total": {"publish": {"beyond_guarantees": scale}},
        },
        "connections_total": len(connections) + scale,
        "topics_total": len(topics) + scale,
        "connections": connections,
        "topics": topics,
        "logs": logs,
    }


def logs(bytes_: int, free: int, topics: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "data_dir": "/var/lib/broker",
        "free_bytes": free,
        "size_bytes": 10**9,
        "topics_total": len(topics),
        "bytes": bytes_,
        "terms": 1,
        "blocked_topics": 0,
        "max_lag": max((t["lag"] for t in topics), default=0),
        "subscriptions": 1,
        "appends": 5,
        "append_errors": 0,
        "fsyncs": 2,
        "fsync_seconds": 0.5,
        "truncated_records": 0,
        "truncated_bytes": 0,
        "topics": topics,
        "cursors_listed": "stored",
        "cursors_total": 1,
        "cursors": [
            {"principal": None, "topic": "t", "cursor": "c", "position": 1, "lag": bytes_ // 100}
        ],
    }


def log_topic(name: str, bytes_: int, lag: int) -> dict[str, Any]:
    return {"name": name, "bytes": bytes_, "lag": lag, "blocked": False, "subscriptions": []}


WORKERS = [
    WorkerInfo("w0", 101, True, 0, "127.0.0.1:7401", ("127.0.0.1", 9401)),
    WorkerInfo("w1", 102, True, 3, "127.0.0.1:7402", ("127.0.0.1", 9402)),
    WorkerInfo("w2", None, False, 7, "127.0.0.1:7403", ("127.0.0.1", 9403)),
]


def two_documents() -> dict[str, dict[str, Any] | None]:
    w0 = document(
        "0.0.0.0:7400",
        "aa",
        scale=1,
        connections=[connection("conn-1", 50), connection("conn-2", 0, queued=4)],
        topics=[topic("t", 0, 5), topic("u", 2, 1)],
    )
    w1 = document(
        "0.0.0.0:7400",
        "bb",
        scale=2,
        connections=[connection("conn-1", 70), connection("conn-3", 10, unsent=1 << 20)],
        topics=[topic("t", 1, 9)],
        logs=logs(300, 5000, [log_topic("t", 300, 0), log_topic("v", 10, 4)]),
    )
    return {"w0": w0, "w1": w1, "w2": None}


def test_what_sums_is_summed() -> None:
    merged = merge_stat_documents(two_documents(), WORKERS, top=10)
    json.dumps(merged, allow_nan=False)  # still a JSON document
    assert merged["version"] == 2
    broker = merged["broker"]
    assert broker["address"] == "0.0.0.0:7400"
    assert "epoch" not in broker
    assert broker["authentication"] is True  # one worker's is
    assert broker["statistics"]["connections_total"] == 30
    assert broker["statistics"]["buffer_budget_bytes"] == 2 * 268435456
    assert broker["statistics"]["connections"] == 4
    assert broker["security"]["auth_failures"] == {"no_credentials": 3, "bad_credentials": 0}
    assert broker["account"]["debt"] == 3
    assert broker["account"]["peak_debt"] == 200  # the largest worker's, not a sum
    assert broker["account"]["blocked"] is True
    assert broker["account"]["high_watermark"] is None
    assert broker["loop"] is None
    budgets = merged["budgets"]
    assert budgets["global_budget"] == 2 * 268435456
    assert budgets["buffer_reserved"] == 3000
    assert budgets["max_connections"] == 20000
    assert budgets["connection_budget"] == 4194304  # a per-connection setting: the same
    assert budgets["publish_capacity"] == {"w0": 262144, "w1": 524288}  # they differ
    assert merged["principals"] == {
        "alice": {"connections": 3, "buffer_reserved": 10, "buffer_budget": 18}
    }
    assert merged["totals"] == {
        "broker_received_messages_total": 3,
        "broker_throttled_seconds_total": 0.75,
        "broker_buffer_used_bytes": {"publish": 3, "bind": 18},
        "broker_dropped_frames_total": {"publish": {"beyond_guarantees": 3}},
    }
    assert merged["connections_total"] == 2 + 1 + 2 + 2
    assert merged["topics_total"] == 2 + 1 + 1 + 2


def test_lists_are_tagged_and_cut_as_a_broker_cuts_them() -> None:
    merged = merge_stat_documents(two_documents(), WORKERS, top=10)
    listed = [(c["worker"], c["name"]) for c in merged["connections"]]
    # The most debt first (all of them: fewer than top).
    assert listed == [("w1", "conn-1"), ("w0", "conn-1"), ("w1", "conn-3"), ("w0", "conn-2")]
    assert next(iter(merged["connections"][0])) == "worker"
    assert [(t["worker"], t["name"]) for t in merged["topics"]] == [
        ("w0", "u"),
        ("w1", "t"),
        ("w0", "t"),
    ]
    one = merge_stat_documents(two_documents(), WORKERS, top=1)
    # top=1: the one with the most debt, then the one with the longest backlog.
    assert [(c["worker"], c["name"]) for c in one["connections"]] == [
        ("w1", "conn-1"),
        ("w0", "conn-2"),
    ]
    assert [(t["worker"], t["name"]) for t in one["topics"]] == [("w0", "u")]
    logs = one["logs"]
    assert [(t["worker"], t["name"]) for t in logs["topics"]] == [("w1", "t"), ("w1", "v")]
    assert logs["cursors"][0]["worker"] == "w1"
    assert (logs["bytes"], logs["max_lag"], logs["free_bytes"]) == (300, 4, 5000)


def test_the_workers_list() -> None:
    merged = merge_stat_documents(two_documents(), WORKERS)
    assert merged["workers"] == [
        {
            "id": "w0",
            "pid": 101,
            "up": True,
            "restarts": 0,
            "direct": "127.0.0.1:7401",
            "metrics": "127.0.0.1:9401",
            "epoch": "aa",
            "connections": 3,
            "connections_total": 10,
            "topics": 3,  # open topics (it keeps no logs)
            "messages_in": 1,
        },
        {
            "id": "w1",
            "pid": 102,
            "up": True,
            "restarts": 3,
            "direct": "127.0.0.1:7402",
            "metrics": "127.0.0.1:9402",
            "epoch": "bb",
            "connections": 4,
            "connections_total": 20,
            "topics": 2,  # its topic logs
            "messages_in": 2,
        },
        {
            "id": "w2",
            "pid": None,
            "up": False,
            "restarts": 7,
            "direct": "127.0.0.1:7403",
            "metrics": "127.0.0.1:9403",
            "epoch": None,
            "connections": None,
            "connections_total": None,
            "topics": None,
            "messages_in": None,
        },
    ]


def test_no_worker_answered() -> None:
    merged = merge_stat_documents({"w0": None}, WORKERS[:1])
    assert merged["version"] == 2
    assert merged["connections"] == [] and merged["topics"] == [] and merged["logs"] is None
    assert merged["workers"][0]["up"] is False
    assert "workers (1, 0 up)" in render(merged).splitlines()


def test_broker_stat_shows_the_workers() -> None:
    text = render(merge_stat_documents(two_documents(), WORKERS, top=10))
    lines = text.splitlines()
    start = lines.index("workers (3, 2 up)")
    table = [line.split() for line in lines[start + 1 : start + 5]]
    assert table == [
        [
            "id",
            "pid",
            "up",
            "restarts",
            "direct",
            "connections",
            "connections_total",
            "topics",
            "messages_in",
        ],
        ["w0", "101", "true", "0", "127.0.0.1:7401", "3", "10", "3", "1"],
        ["w1", "102", "true", "3", "127.0.0.1:7402", "4", "20", "2", "2"],
        ["w2", "null", "false", "7", "127.0.0.1:7403", "null", "null", "null", "null"],
    ]
    assert lines[start + 5] == ""
    assert any(line.startswith("  conn-1 @w1  127.0.0.1:5000  ") for line in lines)
    assert any(line.split()[:2] == ["'u'", "@w0"] for line in lines)
    assert any(line.strip().startswith("'v' @w1") for line in lines)  # a log topic


def test_a_single_brokers_text_is_unchanged() -> None:
    """Without ``workers`` (a worker's or a single broker's document) no
    workers section and no @worker tags."""
    single = two_documents()["w0"]
    assert single is not None
    text = render(single)
    assert "workers" not in text and "@" not in text
    assert "  conn-1  127.0.0.1:5000  client='c-conn-1'" in text
