"""``broker stat`` text of the topic logs (``/stat.json``'s ``logs``): offsets,
bytes, terms, blocked topics, reliable subscriptions' positions and lags,
and the durable cursors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from broker.cli._stat_text import render
from broker.client import open_client
from broker.metrics import stat_document
from tests.server.helpers import TIMEOUT, make_config, running_broker, url, wait_until

LOGS: dict[str, Any] = {
    "data_dir": "/var/lib/broker",
    "free_bytes": 1 << 30,
    "size_bytes": 4 << 30,
    "topics_total": 3,
    "bytes": 5000,
    "terms": 3,
    "blocked_topics": 1,
    "max_lag": 40,
    "subscriptions": 1,
    "appends": 120,
    "append_errors": 2,
    "fsyncs": 7,
    "fsync_seconds": 0.01,
    "truncated_records": 0,
    "truncated_bytes": 0,
    "topics": [
        {
            "name": "orders",
            "first_offset": 1,
            "last_offset": 100,
            "bytes": 4000,
            "terms": 1,
            "held": 2,
            "blocked": True,
            "error": "log full",
            "lag": 40,
            "subscriptions_total": 1,
            "subscriptions": [
                {
                    "connection": "conn-3",
                    "handle": 0,
                    "position": 71,
                    "acked": 60,
                    "lag": 40,
                    "gaps_sent": 0,
                    "cursor": "billing",
                }
            ],
        },
        {
            "name": "audit",
            "first_offset": 1,
            "last_offset": 20,
            "bytes": 1000,
            "terms": 1,
            "held": 0,
            "blocked": False,
            "error": None,
            "lag": 0,
            "subscriptions_total": 0,
            "subscriptions": [],
        },
    ],
    "cursors_listed": "live",
    "cursors_total": 1,
    "cursors": [
        {
            "principal": "alice",
            "topic": "orders",
            "cursor": "billing",
            "position": 61,
            "lag": 40,
            "subscribed": True,
        }
    ],
}


def test_the_text_shows_the_topic_logs() -> None:
    lines = render({"logs": LOGS}).splitlines()
    assert lines[0] == "topic logs   data_dir=/var/lib/broker  free 1.0 GiB of 4.0 GiB (25.0 %)"
    text = "\n".join(lines)
    assert "blocked_topics=1 max_lag=40" in text
    assert "append_errors=2" in text
    topics = lines.index(
        "  topics opened since the broker started "
        "(3, 2 in detail; every topic on disk: broker topics ls)"
    )
    assert lines[topics + 1].split() == [
        "name",
        "first_offset",
        "last_offset",
        "bytes",
        "terms",
        "held",
        "lag",
    ]
    assert lines[topics + 2].split() == ["'orders'", "1", "100", "4000", "1", "2", "40", "BLOCKED"]
    assert lines[topics + 3].strip() == "error='log full'"
    assert lines[topics + 4].split() == [
        "subscription",
        "conn-3/0",
        "position=71",
        "acked=60",
        "lag=40",
        "gaps_sent=0",
        "cursor='billing'",
    ]
    assert lines[topics + 5].split() == ["'audit'", "1", "20", "1000", "1", "0", "0"]
    cursors = lines.index("  durable cursors (1, live subscriptions only)")
    assert lines[cursors + 1].split() == ["topic", "cursor", "position", "lag", "subscribed"]
    assert lines[cursors + 2].split() == [
        "'orders'",
        "'billing'",
        "of",
        "'alice'",
        "61",
        "40",
        "true",
    ]


def test_a_memory_only_broker_says_it_keeps_no_log() -> None:
    assert render({"logs": None}).splitlines() == ["topic logs   none (a memory-only broker)"]
    assert "topic logs" not in render({"version": 2})


async def test_a_live_brokers_logs_render(tmp_path: Path) -> None:
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        async with open_client(url(broker), name="pub") as client:
            for index in range(5):
                await client.publish("news", b"n%d" % index)
            await client.flush()
        async with (
            open_client(url(broker), name="reader") as client,
            client.subscribe("news", options={"from": "earliest", "cursor": "c"}) as sub,
        ):
            with trio.fail_after(TIMEOUT):
                for _ in range(5):
                    await sub.receive()
            cursors = broker.cursors
            assert cursors is not None
            await wait_until(lambda: cursors.position("\x00news\x00c") == 6, what="acked")
            text = render(stat_document(broker))
    lines = text.splitlines()
    assert f"topic logs   data_dir={tmp_path}" in text
    assert "appends=5" in text
    topics = lines.index(
        "  topics opened since the broker started (1; every topic on disk: broker topics ls)"
    )
    assert lines[topics + 2].split() == [
        "'news'",
        "1",
        "5",
        lines[topics + 2].split()[3],
        "1",
        "0",
        "0",
    ]
    assert lines[topics + 3].split()[:5] == [
        "subscription",
        lines[topics + 3].split()[1],
        "position=6",
        "acked=5",
        "lag=0",
    ]
    assert "cursor='c'" in lines[topics + 3]
    cursors_at = lines.index("  durable cursors (1, stored)")
    assert lines[cursors_at + 2].split() == ["'news'", "'c'", "6", "0", "true"]
    # The reader's connection lists its subscription with acked, lag and cursor.
    words = " ".join(text[text.index("subscription 0  topic='news'") :].split()).split(" totals")[0]
    assert "mode=reliable queued=0 delivered=5 next_seq=6 acked=5 lag=0 cursor=c" in words
