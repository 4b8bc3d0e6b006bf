"""A pattern subscription with a durable cursor under ``kill -9`` of its
broker: its client resumes and gets every record of every matched topic
once, in order per topic (what the broker delivers again after the
restart is dropped by the client's per-topic bound)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from tests.server.helpers import TIMEOUT
from tests.server.processes import running_broker

pytestmark = pytest.mark.slow

TOPICS = 20
PER_TOPIC = 150
KILLS_AT = (600, 1800)


async def test_a_pattern_with_a_cursor_loses_and_repeats_nothing(tmp_path: Path) -> None:
    with running_broker(tmp_path) as broker:
        async with open_client(broker.url) as publisher:
            for index in range(PER_TOPIC):
                for topic in range(TOPICS):
                    await publisher.publish(f"crash.{topic}", b"%d" % index)
            await publisher.flush()
        seen: dict[str, list[int]] = defaultdict(list)
        total = 0
        async with (
            open_client(broker.url, reconnect=TIMEOUT) as client,
            client.subscribe("crash.*", start="earliest", cursor="c") as sub,
        ):
            with trio.fail_after(TIMEOUT * 4):
                while total < TOPICS * PER_TOPIC:
                    message = await sub.receive()
                    seen[message.topic].append(int(message.payload))
                    total += 1
                    if total in KILLS_AT:
                        broker.kill()
                        await trio.sleep(0.3)
                        broker.start()
            stats = client.statistics()
        assert set(seen) == {f"crash.{t}" for t in range(TOPICS)}
        for topic, values in seen.items():
            assert values == list(range(PER_TOPIC)), topic  # none lost, none twice, in order
        assert stats["resumes"] + stats["sessions_lost"] >= len(KILLS_AT)
        print(
            f"resumes {stats['resumes']}, sessions lost {stats['sessions_lost']}, "
            f"dropped as delivered again: {stats['duplicates_dropped']}"
        )
