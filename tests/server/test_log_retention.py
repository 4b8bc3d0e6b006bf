"""Retention of a topic log at its limit (issue 21): ``when_full = "block"``
throttles publishers rather than delete a record a live reliable subscriber
still needs; ``"drop-oldest"`` deletes the oldest terms and tells a
subscriber behind them exactly how many it missed, with a ``Gap``."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client
from broker.config import KiB, TopicRule
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    Deliver,
    DeliverMany,
    Gap,
    IssueGuarantee,
    Message,
    Subscribe,
)
from broker.server.storage._topic_logs import wall_ms

from .helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until

TERM = 128 * KiB
RETAIN = 4 * TERM
PAYLOAD = b"x" * 1000
COUNT = 2000  # about 2 MB: four times what the topic retains


def config(data_dir: Path, when_full: str, **overrides: object):  # type: ignore[no-untyped-def]
    rule = TopicRule("t", retain_bytes=RETAIN, term_bytes=TERM, when_full=when_full)
    return make_config(data_dir=str(data_dir), topics=(rule,), **overrides)


async def stuck_subscriber(broker_address: object, raw: RawClient) -> None:
    """Subscribe to "t" (reliable, from now on), then issue no guarantee."""
    await raw.handshake("stuck")
    await raw.send(BindTopic("t"), Subscribe(0, "reliable", {}))


async def test_when_full_block_throttles_publishers_until_the_slow_subscriber_lets_go(
    tmp_path: Path,
) -> None:
    received: list[int] = []
    async with running_broker(config(tmp_path, "block", lease=2.0, heartbeat=0.5)) as broker:
        address = url(broker)
        stuck = await RawClient.connect(broker)
        await stuck_subscriber(broker.address, stuck)
        await wait_until(lambda: "t" in broker.topics, what="subscribed")
        published = trio.Event()
        async with (
            open_client(address, name="fast") as reader,
            reader.subscribe("t") as sub,
            open_client(address, name="pub") as client,
            trio.open_nursery() as nursery,
        ):

            async def publish_all() -> None:
                for i in range(COUNT):
                    await client.publish("t", b"%d:" % i + PAYLOAD)
                await client.flush()
                published.set()

            async def consume() -> None:
                while len(received) < COUNT:
                    message = await sub.receive()
                    received.append(message.seq)

            nursery.start_soon(publish_all)
            nursery.start_soon(consume)
            topic = broker.topics["t"]
            await wait_until(lambda: bool(topic.held), what="the log full, publishes held")
            topic_log = topic.log
            assert topic_log is not None
            # The subscriber at offset 1 holds every term: nothing was deleted,
            # the log is at its limit, and the publisher waits, unconfirmed.
            assert topic_log.first_offset == 1
            assert topic_log.size_bytes <= RETAIN
            assert not published.is_set()
            await wait_until(
                lambda: len(received) == topic_log.next_offset - 1, what="the fast one caught up"
            )
            # The stuck subscriber goes away without a word: once its lease
            # ends, its position no longer holds the log, and publishing goes on.
            await stuck.aclose()
            with trio.fail_after(TIMEOUT):
                await published.wait()
    assert received == list(range(1, COUNT + 1))


async def test_when_full_drop_oldest_tells_a_slow_subscriber_what_it_missed(
    tmp_path: Path,
) -> None:
    async with running_broker(config(tmp_path, "drop-oldest")) as broker:
        stuck = await RawClient.connect(broker)
        try:
            await stuck_subscriber(broker.address, stuck)
            await wait_until(lambda: "t" in broker.topics, what="subscribed")
            async with open_client(url(broker), name="pub") as client:
                for i in range(COUNT):
                    await client.publish("t", b"%d:" % i + PAYLOAD)
                with trio.fail_after(TIMEOUT):
                    await client.flush()  # never held back by the stuck subscriber
            topic_log = broker.topics["t"].log
            assert topic_log is not None
            first = topic_log.first_offset
            assert first > 1 and topic_log.size_bytes <= RETAIN
            # The subscriber reads again: what retention deleted is one Gap
            # with the exact count, then every retained record, in order.
            await stuck.send(IssueGuarantee(Channel(ChannelKind.DELIVER, 0), 1 << 30))
            last = await stuck.wait_for(lambda m: _last_seq(m) == COUNT, what="the last record")
            assert last is not None
        finally:
            await stuck.aclose()
    gaps = [m for m in stuck.frames if isinstance(m, Gap)]
    seqs = [seq for m in stuck.frames for seq in _seqs(m)]
    # Nothing was sent before its first guarantee: one Gap for every record
    # retention deleted, then each retained record once, in order.
    assert [(g.first_seq, g.count) for g in gaps] == [(1, first - 1)]
    assert seqs == list(range(first, COUNT + 1))


def _seqs(message: Message) -> list[int]:
    if isinstance(message, Deliver):
        return [message.seq]
    if isinstance(message, DeliverMany):
        return list(range(message.first_seq, message.first_seq + len(message.entries)))
    return []


def _last_seq(message: Message) -> int:
    seqs = _seqs(message)
    return seqs[-1] if seqs else 0


def term_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("topics/*/*.term"))


async def test_retention_by_age_covers_a_topic_nobody_opened_since_the_start(
    tmp_path: Path,
) -> None:
    """Logs are opened on first use; retention by age used to look only at
    open ones, so a topic left alone after a restart kept its expired terms
    (and disk) for good. The sweep now deletes what is due of those whose
    oldest sealed term is older than their retain_seconds, without opening
    them (opening reads the active term back on the event loop, and keeps
    it in memory)."""
    keep = TopicRule("t", term_bytes=TERM, retain_seconds=3600)
    async with (
        running_broker(make_config(data_dir=str(tmp_path), topics=(keep,))) as broker,
        open_client(url(broker)) as client,
    ):
        for _ in range(400):  # about three terms
            await client.publish("t", PAYLOAD)
        await client.flush()
    terms = term_files(tmp_path)
    assert len(terms) >= 3
    await trio.sleep(1.0)  # (wall time: what was written is now a second old)
    expire = TopicRule("t", term_bytes=TERM, retain_seconds=0.5)
    async with running_broker(make_config(data_dir=str(tmp_path), topics=(expire,))) as broker:
        logs = broker.logs
        assert logs is not None
        assert "t" not in logs.store.open_logs()
        await logs.expire_unopened(wall_ms())
        assert "t" not in logs.store.open_logs()
        kept = term_files(tmp_path)
        async with open_client(url(broker)) as client:
            first, end = (await client.offsets(["t"]))["t"]
    assert [p.name for p in kept] == [terms[-1].name]  # the active term stays, whatever its age
    assert end == 401 and first == int(terms[-1].stem)
