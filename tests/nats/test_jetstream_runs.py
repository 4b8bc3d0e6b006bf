"""Cluster mode's streams in a real JetStream (``storage/_jetstream.py``):
a run sent again is answered as stored (also after later runs), a run that
does not follow the stream's last message is refused as fenced, topics of
any valid name have a stream of their own and are listed back by name, a
deleted topic's stream goes; and what the metrics count of the answers
(duplicates, failures by reason)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from broker.log import encode_run
from broker.nats import (
    ConnectionClosed,
    ConnectionLost,
    JetStream,
    JetStreamError,
    JetStreamUnavailable,
    NatsError,
    NoResponders,
    RequestTimeout,
    open_nats,
)
from broker.server.storage._jetstream import (
    JetStreamRuns,
    failure_reason,
    stream_name,
    topic_subject,
)
from broker.server.storage._replicated import OutgoingRun
from broker.server.storage._replication import STORE_FAILURES, StreamFenced, StreamUnavailable


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


async def test_a_run_stored_before_is_answered_as_a_duplicate(runs: JetStreamRuns) -> None:
    """What ``broker_cluster_store_duplicates_total`` counts: the answer to
    a run sent again says the stream held it already (whether JetStream
    answers with ``duplicate`` or refuses its stale expected sequence)."""
    stream = await runs.open_stream("duplicate")
    first = _run(1, [b"a"], 0)
    pending = await stream.start_publish(first)
    assert (await pending.wait(), pending.duplicate) == (1, False)
    pending = await stream.start_publish(first)  # (JetStream's own duplicate answer)
    assert (await pending.wait(), pending.duplicate) == (1, True)
    assert await stream.publish(_run(2, [b"b"], 1)) == 2
    pending = await stream.start_publish(first)  # (refused for its expected sequence)
    assert (await pending.wait(), pending.duplicate) == (1, True)


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
    with pytest.raises(StreamUnavailable, match="earlier run is missing") as refused:
        await stream.publish(_run(3, [b"c"], 2))  # (run 2, expected at 2, was lost)
    assert refused.value.reason == "refused"
    assert await stream.publish(_run(2, [b"b"], 1)) == 2
    assert await stream.publish(_run(3, [b"c"], 2)) == 3


async def test_a_stream_without_a_leader_is_a_failure_with_its_reason(
    runs: JetStreamRuns,
) -> None:
    """A run to a stream that is not there (as without a leader): no
    responders, counted as such."""
    stream = await runs.open_stream("gone")
    assert await runs.delete_stream("gone")
    pending = await stream.start_publish(_run(1, [b"a"], 0))
    with pytest.raises(StreamUnavailable) as failed:
        await pending.wait()
    assert failed.value.reason == "no_responders"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RequestTimeout("s", 2.0), "timeout"),
        (NoResponders("s"), "no_responders"),
        (ConnectionLost("lost"), "connection"),
        (ConnectionClosed("closed"), "connection"),
        (trio.WouldBlock(), "connection"),
        (JetStreamError(503, 10008, "JetStream system temporarily unavailable"), "unavailable"),
        (JetStreamError(409, 10158, "duplicate message id is in process"), "unavailable"),
        (JetStreamError(400, 10071, "wrong last sequence"), "refused"),
        (JetStreamError(500, 10077, "insufficient resources"), "refused"),
        (NatsError("something else"), "unavailable"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value,
)
def test_each_failure_is_counted_by_its_reason(error: Exception, reason: str) -> None:
    assert reason in STORE_FAILURES
    assert failure_reason(error) == reason
    if not isinstance(error, JetStreamError):
        # The client's JetStreamUnavailable says why in its cause.
        wrapped = JetStreamUnavailable("publish")
        wrapped.__cause__ = error
        assert failure_reason(wrapped) == reason
