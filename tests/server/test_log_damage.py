"""Damage to a topic log's files between two runs of a broker (issue 40,
items 1 and 2), over real TCP on real files: every intact record is still
served, readers get a Gap for exactly the offsets lost, and the loss is
reported with its count (a log line, broker_log_truncated_records_total,
``broker stat``'s logs section)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio

from broker._topic_rules import TopicRule
from broker.client import open_client
from broker.client._subscription import SubscriptionState
from broker.config import BrokerConfig
from broker.metrics import stat_document
from tests.log.helpers import records_of
from tests.metrics.test_metrics_logs import Scrape

from .helpers import TIMEOUT, make_config, running_broker, url, wait_until

TERM = 128 * 1024
COUNT = 1300  # records of about 1 KB: 11 terms of 128 KiB


def config(data_dir: Path) -> BrokerConfig:
    rule = TopicRule("t", term_bytes=TERM, retain_bytes=0, retain_seconds=0)
    return make_config(data_dir=str(data_dir), topics=(rule,))


def payload(offset: int) -> bytes:
    return b"%06d:" % offset + b"x" * 1000


def damage(data_dir: Path) -> set[int]:
    """A flipped byte in sealed term 4 of 11, 3,000 zero bytes in term 2,
    term 7 deleted (file and index), the last term cut at a record
    boundary: returns the offsets lost."""
    terms = sorted(data_dir.glob("topics/t/*.term"))
    assert len(terms) == 11, len(terms)
    lost: set[int] = set()

    def overwrite(term: Path, start: int, data: bytes) -> None:
        raw = bytearray(term.read_bytes())
        raw[start : start + len(data)] = data
        term.write_bytes(bytes(raw))
        lost.update(o for o, s, e in records_of_before[term] if s < start + len(data) and start < e)

    records_of_before = {term: records_of(term) for term in terms}
    third = records_of_before[terms[3]][40]
    flipped = terms[3].read_bytes()[third[1] + 500] ^ 0x20
    overwrite(terms[3], third[1] + 500, bytes([flipped]))
    overwrite(terms[1], 20_000, bytes(3000))
    lost.update(o for o, _, _ in records_of_before[terms[6]])
    terms[6].unlink()
    terms[6].with_suffix(".index").unlink()
    last = records_of_before[terms[-1]]
    os.truncate(terms[-1], last[len(last) // 2][1])
    lost.update(o for o, _, _ in last[len(last) // 2 :])
    return lost


def ranges(offsets: set[int]) -> list[tuple[int, int]]:
    """``offsets`` as (first, count) runs."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((offset, 1))
    return runs


async def test_damage_between_runs_loses_exactly_the_damaged_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        running_broker(config(tmp_path)) as broker,
        open_client(url(broker), name="pub") as client,
    ):
        for offset in range(1, COUNT + 1):
            await client.publish("t", payload(offset))
        await client.flush()
    lost = damage(tmp_path)
    intact = [offset for offset in range(1, COUNT + 1) if offset not in lost]
    assert 3 * 128 > len(lost) > 128  # (about a term and a half)

    gaps: list[tuple[int, int]] = []
    real_gap = SubscriptionState._gap

    def gap(self: SubscriptionState, first_seq: int, count: int) -> None:
        gaps.append((first_seq, count))
        real_gap(self, first_seq, count)

    monkeypatch.setattr(SubscriptionState, "_gap", gap)
    caplog.set_level(logging.WARNING, logger="broker")
    async with running_broker(config(tmp_path)) as broker:
        received: list[tuple[int, bytes]] = []
        async with (
            open_client(url(broker), name="reader") as client,
            client.subscribe("t", options={"from": "earliest", "until": COUNT + 1}) as sub,
        ):
            with trio.fail_after(TIMEOUT):
                async for message in sub:
                    assert message.offset is not None
                    received.append((message.offset, message.payload))
                    if len(received) == len(intact):
                        break
            await wait_until(lambda: sub.skipped_to == COUNT + 1, what="the last Gap")
        # Every intact record, in order; a Gap for exactly each range lost.
        assert received == [(offset, payload(offset)) for offset in intact]
        assert gaps == ranges(lost)
        # Reported with the count: a log line, the metric, broker stat.
        lines = [r.getMessage() for r in caplog.records if "lost from its log" in r.getMessage()]
        (line,) = lines
        assert f"{len(lost)} records lost" in line
        scrape = Scrape(broker)
        assert scrape("broker_log_truncated_records_total") == len(lost)
        assert scrape("broker_log_gap_records") == len(lost)
        assert stat_document(broker)["logs"]["truncated_records"] == len(lost)
        assert stat_document(broker)["logs"]["gap_records"] == len(lost)
        # The log goes on after the last offset it had: none is used twice.
        async with open_client(url(broker), name="pub") as client:
            await client.publish("t", b"next")
            await client.flush()
        logs = broker.logs
        assert logs is not None
        assert logs.store.open_logs()["t"].next_offset == COUNT + 2
    # The damaged terms are kept aside for inspection.
    assert len(list(tmp_path.glob("topics/t/*.damaged"))) == 2  # noqa: ASYNC240
    caplog.clear()
    async with running_broker(config(tmp_path)) as broker:
        async with (
            open_client(url(broker), name="reader") as client,
            client.subscribe("t", options={"from": COUNT + 1}) as sub,
        ):
            with trio.fail_after(TIMEOUT):
                async for message in sub:  # noqa: B007
                    break
        assert (message.offset, message.payload) == (COUNT + 1, b"next")
        # Found before: not reported again as new losses, still missing.
        scrape = Scrape(broker)
        assert scrape("broker_log_truncated_records_total") == 0
        assert scrape("broker_log_gap_records") == len(lost)
    assert not [r for r in caplog.records if "lost from its log" in r.getMessage()]
