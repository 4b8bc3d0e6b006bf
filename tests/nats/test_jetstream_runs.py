"""Cluster mode's streams in a real JetStream (``storage/_jetstream.py``):
a run sent again is answered as stored (also after later runs), a run that
does not follow the stream's last message is refused as fenced, topics of
any valid name have a stream of their own and are listed back by name, and
a deleted topic's stream goes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.log import encode_run
from broker.nats import JetStream, open_nats
from broker.server.storage._jetstream import JetStreamRuns, stream_name, topic_subject
from broker.server.storage._replicated import OutgoingRun
from broker.server.storage._replication import StreamFenced, StreamUnavailable


@pytest.fixture
async def runs(nats_url: str) -> AsyncIterator[JetStreamRuns]:
    async with open_nats(nats_url, name="test") as client:
        yield JetStreamRuns(JetStream(client), replicas=1)


def _run(first: int, records: list[bytes], expected: int, writer: str = "w") -> OutgoingRun:
    body = encode_run(first, records, [1000] * len(records))
    return OutgoingRun(first, len(records), body, f"{writer}:{first}", expected)


async def test_a_run_sent_again_is_answered_with_its_first_sequence(runs: JetStreamRuns) -> None:
    stream = await runs.open_stream("again")
    first = _run(1, [b"a"], 0)
    assert await stream.publish(first) == 1
    assert await stream.publish(_run(2, [b"b"], 1)) == 2
    # The answer to the first was lost: it is sent again as it was (its
    # expected sequence stale by then): a duplicate, not a fence, not a copy.
    assert await stream.publish(first) == 1
    stored = await stream.fetch(1, 10)
    assert [(m.seq, m.first_offset, m.count) for m in stored] == [(1, 1, 1), (2, 2, 1)]


async def test_a_run_after_another_writer_is_fenced(runs: JetStreamRuns) -> None:
    stream = await runs.open_stream("fenced")
    assert await stream.publish(_run(1, [b"mine"], 0, "w1")) == 1
    assert await stream.publish(_run(2, [b"theirs"], 1, "w2")) == 2
    with pytest.raises(StreamFenced, match="10071"):
        await stream.publish(_run(2, [b"mine again"], 1, "w1"))


@pytest.mark.parametrize(
    "topic", ["orders.eu", "a/b c", "ünïcode.τ", "x" * 255, "under_score", "-"]
)
async def test_every_topic_name_has_its_own_stream_and_is_listed(
    runs: JetStreamRuns, topic: str
) -> None:
    name = stream_name(topic)
    assert name.startswith("T-") and len(name) <= 130
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
    assert topic_subject(topic).count(".") == 2
    await runs.open_stream(topic)
    assert topic in await runs.topics()
    assert await runs.delete_stream(topic)
    assert topic not in await runs.topics()
    assert not await runs.delete_stream(topic)


def test_names_that_differ_get_different_streams() -> None:
    topics = ["a.b", "a_b", "a_2Eb", "a-b", "x" * 200 + "1", "x" * 200 + "2"]
    assert len({stream_name(t) for t in topics}) == len(topics)


async def test_a_purge_keeps_what_is_at_and_after_its_sequence(
    runs: JetStreamRuns, tmp_path: Path
) -> None:
    stream = await runs.open_stream("purged")
    for seq in range(1, 6):
        assert await stream.publish(_run(seq, [b"%d" % seq], seq - 1)) == seq
    await stream.purge_below(4)
    assert [m.seq for m in await stream.fetch(1, 10)] == [4, 5]


async def test_a_run_after_a_missing_one_is_sent_again_not_fenced(runs: JetStreamRuns) -> None:
    """Runs in flight one behind the other: if one was not stored, the next
    is refused for its expected sequence; that is no other writer, and
    both are sent again."""
    stream = await runs.open_stream("gap")
    assert await stream.publish(_run(1, [b"a"], 0)) == 1
    with pytest.raises(StreamUnavailable, match="earlier run is missing"):
        await stream.publish(_run(3, [b"c"], 2))  # (run 2, expected at 2, was lost)
    assert await stream.publish(_run(2, [b"b"], 1)) == 2
    assert await stream.publish(_run(3, [b"c"], 2)) == 3
