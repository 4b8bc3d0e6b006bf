"""``examples/spark_publish.py`` runs as the README says and publishes what it reports."""

from __future__ import annotations

from pathlib import Path

from broker.client import BlockingClient

from .conftest import TIMEOUT
from .test_sink import fresh_topic, run_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_job_publishes_every_row_exactly_once(broker_address: str) -> None:
    topic = fresh_topic()
    rows = 2000
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        done = run_script(
            [
                "examples/spark_publish.py",
                "--broker",
                broker_address,
                "--topic",
                topic,
                "--rows",
                str(rows),
                "--delivery",
                "exactly-once",
            ],
            ROOT,
        )
        assert f"published {rows} rows to {topic!r} (exactly-once)" in done.stdout
        messages = [subscription.receive(timeout=TIMEOUT) for _ in range(rows)]
    ids = sorted(int(m.payload.split(b",")[0].removeprefix(b'{"id":')) for m in messages)
    assert ids == list(range(rows))
    assert all(len(m.payload) == 100 and m.key is not None for m in messages)
