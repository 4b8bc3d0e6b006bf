"""A broker with topic logs (issue 21): reliable subscriptions read the log,
deliveries are numbered by offsets, late joiners replay, and a restart on
the same data directory keeps every confirmed record."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.client._common import Message
from broker.config import BrokerConfig
from broker.protocol import BindTopic, Goodbye, Subscribe

from .helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until


def log_config(data_dir: Path, **overrides: object) -> BrokerConfig:
    return make_config(data_dir=str(data_dir), **overrides)


async def goodbye_for(raw: RawClient, subscribe: Subscribe) -> Goodbye:
    """Bind topic "t", send ``subscribe``, and return the broker's Goodbye."""
    await raw.handshake()
    await raw.send(BindTopic("t"), subscribe)
    await raw.read_until_eof()
    (goodbye,) = raw.goodbyes()
    return goodbye


async def publish(address: str, topic: str, payloads: list[bytes]) -> None:
    async with open_client(address, name="pub") as client:
        for payload in payloads:
            await client.publish(topic, payload)
        await client.flush()


async def read(
    address: str, topic: str, count: int, options: dict[str, object] | None = None
) -> list[Message]:
    """The first ``count`` messages of a new subscription with ``options``."""
    async with (
        open_client(address, name="reader") as client,
        client.subscribe(topic, options=options) as sub,
    ):
        return await take(sub, count)


async def take(subscription: object, count: int) -> list[Message]:
    got: list[Message] = []
    with trio.fail_after(TIMEOUT):
        async for message in subscription:  # type: ignore[attr-defined]
            got.append(message)
            if len(got) == count:
                break
    return got


async def test_deliveries_are_numbered_by_offset_and_late_joiners_replay(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"m%d" % i for i in range(1, 101)])
        got = await read(address, "t", 100, {"from": "earliest"})
        assert [m.payload for m in got] == [b"m%d" % i for i in range(1, 101)]
        assert [m.seq for m in got] == list(range(1, 101))
        got = await read(address, "t", 40, {"from": 61})
        assert [m.seq for m in got] == list(range(61, 101))
        assert got[0].payload == b"m61"


async def test_latest_is_the_default_and_continues_live(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"old"] * 5)
        async with open_client(address, name="sub") as client, client.subscribe("t") as sub:
            await publish(address, "t", [b"new1", b"new2"])
            got = await take(sub, 2)
        assert [(m.payload, m.seq) for m in got] == [(b"new1", 6), (b"new2", 7)]


async def test_from_time_starts_at_the_first_record_received_then(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"before"] * 3)
        await trio.sleep(0.05)
        cut = time.time_ns() // 1_000_000
        await trio.sleep(0.05)
        await publish(address, "t", [b"after1", b"after2"])
        got = await read(address, "t", 2, {"from_time": cut})
        assert [(m.payload, m.seq) for m in got] == [(b"after1", 4), (b"after2", 5)]


async def test_a_restart_on_the_same_directory_keeps_every_confirmed_record(
    tmp_path: Path,
) -> None:
    payloads = [b"r%d" % i for i in range(500)]
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", payloads)
    async with running_broker(log_config(tmp_path)) as broker:
        got = await read(url(broker), "t", 500, {"from": "earliest"})
        await publish(url(broker), "t", [b"next"])
        (last,) = await read(url(broker), "t", 1, {"from": 501})
    assert [m.payload for m in got] == payloads
    assert (last.payload, last.seq) == (b"next", 501)


async def test_a_durable_cursor_continues_after_its_last_ack(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"c%d" % i for i in range(1, 11)])
        async with (
            open_client(address, name="c1") as client,
            client.subscribe("t", options={"from": "earliest", "cursor": "reader"}) as sub,
        ):
            got = await take(sub, 10)  # all taken: the client acknowledges them
            cursors = broker.cursors
            assert cursors is not None
            await wait_until(
                lambda: cursors.position("\x00t\x00reader") == 11, what="cursor stored"
            )
        await publish(address, "t", [b"c%d" % i for i in range(11, 21)])
        assert got[-1].seq == 10
        got = await read(address, "t", 10, {"cursor": "reader"})
    assert [m.seq for m in got] == list(range(11, 21))


async def test_a_slow_subscriber_does_not_hold_back_a_fast_one_on_the_same_topic(
    tmp_path: Path,
) -> None:
    """A reliable subscriber that never issues guarantees: publishers and a
    fast subscriber on its topic go on (the lag waits in the log)."""
    count = 3000
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        stuck = await RawClient.connect(broker)
        try:
            await stuck.handshake("stuck")
            # Bound, then it never reads or issues a guarantee again.
            await stuck.send(BindTopic("t"), Subscribe(0, "reliable", {}))
            await wait_until(lambda: bool(broker.topics.get("t")), what="subscribed")
            async with (
                open_client(address, name="fast") as client,
                client.subscribe("t") as sub,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(publish, address, "t", [b"x" * 1000] * count)
                got = await take(sub, count)
        finally:
            await stuck.aclose()
    assert [m.seq for m in got] == list(range(1, count + 1))


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"from": "first"}, '"from" must be'),
        ({"from": 1.5}, '"from" must be'),
        ({"from_time": "now"}, '"from_time" must be'),
        ({"from": 1, "from_time": 1}, "exclude each other"),
        ({"cursor": ""}, '"cursor"'),
        ({"cursor": 7}, '"cursor" must be text'),
        ({"start": 1}, "unknown subscribe option"),
    ],
)
async def test_a_malformed_start_option_gets_goodbye_1_naming_it(
    tmp_path: Path, options: dict[str, object], fragment: str
) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        raw = await RawClient.connect(broker)
        goodbye = await goodbye_for(raw, Subscribe(0, "reliable", options))
        await raw.aclose()
    assert goodbye.code == 1
    assert fragment in goodbye.reason


async def test_a_memory_only_broker_refuses_a_start_it_cannot_serve() -> None:
    async with running_broker(make_config()) as broker:
        raw = await RawClient.connect(broker)
        goodbye = await goodbye_for(raw, Subscribe(0, "reliable", {"from": "earliest"}))
        await raw.aclose()
    assert goodbye.code == 1
    assert "memory-only" in goodbye.reason


async def test_a_durable_cursor_survives_a_restart(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"c%d" % i for i in range(1, 11)])
        got = await read(address, "t", 10, {"from": "earliest", "cursor": "reader"})
        cursors = broker.cursors
        assert cursors is not None
        await wait_until(lambda: cursors.position("\x00t\x00reader") == 11, what="cursor stored")
        await publish(address, "t", [b"c%d" % i for i in range(11, 21)])
    assert [m.seq for m in got] == list(range(1, 11))
    async with running_broker(log_config(tmp_path)) as broker:
        # "from" applies only to a cursor seen for the first time.
        got = await read(url(broker), "t", 10, {"from": "earliest", "cursor": "reader"})
    assert [(m.seq, m.payload) for m in got] == [(i, b"c%d" % i) for i in range(11, 21)]


async def test_a_start_beyond_the_end_waits_for_that_offset(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"a", b"b"])
        async with (
            open_client(address, name="ahead") as client,
            client.subscribe("t", options={"from": 5}) as sub,
        ):
            await publish(address, "t", [b"c", b"d", b"e", b"f"])
            got = await take(sub, 2)
    assert [(m.seq, m.payload) for m in got] == [(5, b"e"), (6, b"f")]


async def test_a_full_disk_holds_publishes_unconfirmed_until_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on the log's file: nothing is confirmed or delivered, the
    broker keeps serving, and once the disk has room again every publish
    is appended once and delivered in order (the broker retries by itself)."""
    import errno

    from broker.log import _files

    real_write_at = _files.TermFile.write_at
    full = True

    def write_at(self: _files.TermFile, data: memoryview, offset: int) -> None:
        if full and self.path.suffix == ".term":  # (the state journal has room)
            raise _files.write_error(OSError(errno.ENOSPC, "No space left on device"), "test")
        real_write_at(self, data, offset)

    monkeypatch.setattr(_files.TermFile, "write_at", write_at)
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        async with (
            open_client(address, name="sub") as reader,
            reader.subscribe("t") as sub,
            open_client(address, name="pub") as client,
        ):
            for i in range(10):
                await client.publish("t", b"%d" % i)
            with trio.move_on_after(1.5) as waited:
                await client.flush()  # never confirmed while the disk is full
            assert waited.cancelled_caught
            with trio.move_on_after(0.2):
                early = await sub.receive()
                pytest.fail(f"delivered before it was written: {early}")
            logs = broker.logs
            assert logs is not None and logs.append_errors >= 1
            full = False
            with trio.fail_after(TIMEOUT):
                await client.flush()
            got = await take(sub, 10)
    assert [(m.seq, m.payload) for m in got] == [(i + 1, b"%d" % i) for i in range(10)]


def tear_last_record(data_dir: Path) -> None:
    """Flip a byte of the last record's body in the topic's only term file."""
    (term,) = data_dir.glob("topics/*/*.term")
    data = bytearray(term.read_bytes())
    end = len(data.rstrip(b"\0"))
    data[end - 3] ^= 0xFF  # its checksum no longer matches
    term.write_bytes(bytes(data))


def cut_last_record(data_dir: Path) -> None:
    """Cut the last record off the topic's only term file (at its start)."""
    (term,) = data_dir.glob("topics/*/*.term")
    data = term.read_bytes()
    pos = 0
    while True:
        end = pos + 24 + int.from_bytes(data[pos + 4 : pos + 8], "little")
        if end >= len(data):
            break
        pos = end
    os.truncate(term, pos)


def write_meta(data_dir: Path, content: bytes) -> None:
    """Replace topic "t"'s meta.json with ``content``."""
    from broker.log._files import META, topic_dir_name, topics_dir

    (topics_dir(data_dir) / topic_dir_name("t") / META).write_bytes(content)


async def test_a_torn_tail_is_cut_at_start_up_and_the_rest_served(tmp_path: Path) -> None:
    """The torn record is counted as lost (it used to be "0 records"), and
    its offset is not given to a new record: a reader from it gets a Gap."""
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"r%d" % i for i in range(1, 21)])
    tear_last_record(tmp_path)
    async with running_broker(log_config(tmp_path)) as broker:
        got = await read(url(broker), "t", 19, {"from": "earliest"})
        logs = broker.logs
        assert logs is not None
        recovery = logs.store.open_logs()["t"].recovery
        assert recovery.cut_records == 1 and recovery.cut_bytes > 0
        await publish(url(broker), "t", [b"next"])
        async with (
            open_client(url(broker), name="reader") as client,
            client.subscribe("t", options={"from": 20}) as sub,
        ):
            (after,) = await take(sub, 1)
            assert (sub.missed, sub.skipped_to) == (1, 21)
    assert [m.payload for m in got] == [b"r%d" % i for i in range(1, 20)]
    assert (after.seq, after.payload) == (21, b"next")


async def test_flush_always_confirms_only_what_is_fsynced(tmp_path: Path) -> None:
    from broker.config import TopicRule

    config = log_config(tmp_path, topics=(TopicRule("sync.*", flush="always"),))
    async with running_broker(config) as broker:
        await publish(url(broker), "sync.t", [b"s%d" % i for i in range(50)])
        await publish(url(broker), "batch.t", [b"b%d" % i for i in range(50)])
        logs = broker.logs
        assert logs is not None
        synced, batched = (logs.store.open_logs()[name] for name in ("sync.t", "batch.t"))
        # Confirmed: fsynced with "always"; with "batch" written (fsynced within a second).
        assert synced.durable_offset == synced.written_offset == 50
        assert batched.written_offset == 50
        await wait_until(lambda: batched.durable_offset == 50, what="the batch fsync")


async def test_a_cursor_past_a_log_cut_back_goes_on_from_its_new_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery cut the log back below where a durable cursor stood (a
    torn tail, unsynced records lost in a power cut): the offsets from the
    new end on go to new records, which the cursor must not skip; it goes
    on from the end, and the broker says so."""
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"r%d" % i for i in range(1, 11)])
        got = await read(url(broker), "t", 10, {"cursor": "c", "from": "earliest"})
        assert got[-1].offset == 10
    # Offset 10 is cut and its checkpoint is behind (a power cut: both
    # were written, neither fsynced): the log ends at 9 as far as it knows.
    cut_last_record(tmp_path)
    (checkpoint,) = tmp_path.glob("topics/*/checkpoint")  # noqa: ASYNC240
    checkpoint.unlink()
    caplog.set_level(logging.WARNING, logger="broker")
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"new"])
        (message,) = await read(url(broker), "t", 1, {"cursor": "c"})
    assert (message.offset, message.payload) == (10, b"new")
    assert any("past the log's end 10" in r.getMessage() for r in caplog.records)


async def test_a_logs_recovery_is_logged_once_however_often_it_is_asked_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store hands the recovered log to every later user (ListOffsets,
    subscriptions): the one-line warning comes with the recovery, not with
    each of them (a Spark source polling offsets used to repeat it)."""
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"r%d" % i for i in range(1, 11)])
    tear_last_record(tmp_path)
    caplog.set_level(logging.WARNING, logger="broker")
    async with running_broker(log_config(tmp_path)) as broker:
        async with open_client(url(broker)) as client:
            for _ in range(5):
                assert (await client.offsets(["t"]))["t"][1] == 11  # (10 is lost: a gap)
        for _ in range(2):
            await read(url(broker), "t", 9, {"from": "earliest"})
    warnings = [r for r in caplog.records if "lost from its log" in r.getMessage()]
    assert len(warnings) == 1
    assert "topic 't'" in warnings[0].getMessage()


async def refused_topic_t_and_others_go_on(data_dir: Path) -> str:
    """Subscribe to topic "t" on a broker on ``data_dir``: the broker cannot
    open its log, and says so with Goodbye 3 (whose reason is returned);
    another topic works meanwhile."""
    async with running_broker(log_config(data_dir)) as broker:
        raw = await RawClient.connect(broker)
        goodbye = await goodbye_for(raw, Subscribe(0, "reliable", {}))
        await raw.aclose()
        await publish(url(broker), "other", [b"fine"])
        (message,) = await read(url(broker), "other", 1, {"from": "earliest"})
    assert goodbye.code == 3
    assert "cannot open the log of topic 't'" in goodbye.reason
    assert message.payload == b"fine"
    return goodbye.reason


async def test_a_topic_whose_metadata_is_not_json_ends_that_client_in_one_line(
    tmp_path: Path,
) -> None:
    """A damaged meta.json is a log that cannot be opened (Goodbye 3 naming
    the file), not an internal error; other topics go on."""
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"one"])
    for damage in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        write_meta(tmp_path, damage)
        reason = await refused_topic_t_and_others_go_on(tmp_path)
        assert "meta.json is not" in reason


async def test_a_log_that_cannot_be_opened_ends_that_client_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file descriptor left (or a disk error) opening a topic's log: the
    client asking for it gets Goodbye 3 saying so; the broker goes on."""
    import errno

    from broker.log import LogStore

    real_topic = LogStore.topic

    def topic(self: LogStore, name: str, *args: object, **kwargs: object) -> object:
        if name == "t":
            raise OSError(errno.EMFILE, "Too many open files")
        return real_topic(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogStore, "topic", topic)
    assert "Too many open files" in await refused_topic_t_and_others_go_on(tmp_path)
