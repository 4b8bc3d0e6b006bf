"""What a Spark source needs of a broker with topic logs (issue 23): the
first and next offsets of topics (``ListOffsets``/``Offsets``, without
creating a topic, by the principal's subscribe patterns), and a bounded
read (``"until"``) that stops at its end and never holds publishers back."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import (
    BlockingClient,
    BlockingClusterClient,
    ClientError,
    ConnectionLost,
    open_client,
)
from broker.config import KiB, TopicRule
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    Gap,
    GoodbyeCode,
    IssueGuarantee,
    ListOffsets,
    Subscribe,
)

from .helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until
from .test_topic_log import goodbye_for, log_config, publish, take

AUTH_FILE = """
[principals.reader]
token = "reader-token"
publish = ["events.*"]
subscribe = ["events.*"]
"""


async def test_offsets_of_named_and_of_all_topics_create_nothing(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "a", [b"x"] * 10)
        await publish(address, "b", [b"y"] * 5)
        async with open_client(address, name="reader") as client:
            assert await client.offsets() == {"a": (1, 11), "b": (1, 6)}
            assert await client.offsets(["b", "missing"]) == {"b": (1, 6)}
            assert await client.offsets([]) == {}
        assert "missing" not in broker.topics
        assert broker.logs is not None
        assert "missing" not in broker.logs.store.stored_topics()


async def test_a_memory_only_broker_has_no_offsets() -> None:
    async with running_broker(make_config()) as broker, open_client(url(broker)) as client:
        with pytest.raises(ClientError, match="keeps no topic log"):
            await client.offsets()
        await client.publish("t", b"still connected")
        await client.flush()


async def test_offsets_follow_the_principals_subscribe_patterns(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    async with running_broker(log_config(tmp_path / "data", auth_file=str(auth))) as broker:
        address = url(broker)
        async with open_client(address, token="reader-token") as client:
            await client.publish("events.1", b"e")
            await client.flush()
        async with open_client(address, token="reader-token") as client:
            assert await client.offsets() == {"events.1": (1, 2)}
            with pytest.raises(ConnectionLost) as lost:
                await client.offsets(["secret"])
        assert lost.value.code == GoodbyeCode.NOT_AUTHORISED


async def test_a_bounded_read_reads_its_range_and_stops(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"m%d" % i for i in range(1, 101)])
        async with (
            open_client(address, name="reader") as client,
            client.subscribe("t", options={"from": 20, "until": 30}) as sub,
        ):
            got = await take(sub, 10)
            assert [m.offset for m in got] == list(range(20, 30))
            assert got[0].payload == b"m20"
            await publish(address, "t", [b"later"] * 10)
            (subscription,) = broker.topics["t"].subscriptions
            await wait_until(lambda: broker.topics["t"].log.next_offset == 111, what="appended")  # type: ignore[union-attr]
            # Nothing beyond its end is sent, and it waits for nothing more.
            assert subscription.next_seq == 30  # type: ignore[attr-defined]
            assert sub.received == 10


async def test_bad_until_options_are_refused(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        for options, words in (
            ({"until": -1}, '"until" must be an offset'),
            ({"until": "end"}, '"until" must be an offset'),
            ({"until": 5, "cursor": "c"}, "exclude each other"),
        ):
            raw = await RawClient.connect(broker)
            goodbye = await goodbye_for(raw, Subscribe(0, "reliable", options))
            await raw.aclose()
            assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
            assert words in goodbye.reason


async def test_a_malformed_list_offsets_is_a_protocol_error(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        raw = await RawClient.connect(broker)
        await raw.handshake()
        await raw.send(ListOffsets(1, ["ok"]), b"\x00\x00\x00\x05\x83\x18\x2b\x02\x05")
        await raw.read_until_eof()
        await raw.aclose()
        (goodbye,) = raw.goodbyes()
        assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
        assert "ListOffsets topics must be an array" in goodbye.reason


TERM = 128 * KiB
PAYLOAD = b"x" * 1000
COUNT = 2000  # about 2 MB: four times what the topic retains


async def test_a_bounded_read_holds_no_publisher_back_and_is_told_what_it_lost(
    tmp_path: Path,
) -> None:
    """``when_full = "block"`` waits for reliable subscribers, never for a
    bounded read: a reader that takes nothing lets publishing go on, and
    is told with a Gap (cut at its end) what retention deleted."""
    rule = TopicRule("t", retain_bytes=4 * TERM, term_bytes=TERM, when_full="block")
    config = make_config(data_dir=str(tmp_path), topics=(rule,))
    async with running_broker(config) as broker:
        address = url(broker)
        await publish(address, "t", [PAYLOAD])
        stuck = await RawClient.connect(broker)
        await stuck.handshake("stuck")
        await stuck.send(BindTopic("t"), Subscribe(0, "reliable", {"from": 1, "until": 1000}))
        await wait_until(
            lambda: "t" in broker.topics and bool(broker.topics["t"].subscriptions),
            what="subscribed",
        )
        with trio.fail_after(TIMEOUT):
            await publish(address, "t", [PAYLOAD] * COUNT)
        topic_log = broker.topics["t"].log
        assert topic_log is not None
        first = topic_log.first_offset
        assert first > 1000  # (it keeps about the last 520 records)
        async with trio.open_nursery() as nursery:
            stuck.start_reading(nursery)
            await stuck.send(IssueGuarantee(Channel(ChannelKind.DELIVER, 0), 1 << 30))
            gap = await stuck.wait_for_message(Gap)
            nursery.cancel_scope.cancel()
        await stuck.aclose()
        # Everything it was to read is gone: the Gap says so, cut at its end.
        assert (gap.first_seq, gap.count) == (1, 999)


async def test_the_blocking_and_cluster_clients_list_offsets(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "a", [b"x"] * 3)

        def ask() -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
            with BlockingClient(address) as client, BlockingClusterClient(address) as cluster:
                return client.offsets(timeout=TIMEOUT), cluster.offsets(["a", "b"], timeout=TIMEOUT)

        single, cluster = await trio.to_thread.run_sync(ask)
    assert single == cluster == {"a": (1, 4)}


async def test_a_bounded_read_whose_range_was_deleted_ends_in_a_gap(tmp_path: Path) -> None:
    """All it was to read is gone: no delivery comes, and ``skipped_to``
    says the range is over."""
    rule = TopicRule("t", retain_bytes=4 * TERM, term_bytes=TERM, when_full="drop-oldest")
    config = make_config(data_dir=str(tmp_path), topics=(rule,))
    async with running_broker(config) as broker:
        address = url(broker)
        await publish(address, "t", [PAYLOAD] * COUNT)
        async with (
            open_client(address, name="reader") as client,
            client.subscribe("t", options={"from": 1, "until": 100}) as sub,
        ):
            await wait_until(lambda: sub.skipped_to >= 100, what="the Gap")
            assert (sub.skipped_to, sub.missed, sub.received) == (100, 99, 0)


async def test_offsets_when_the_data_directory_cannot_be_listed_end_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file descriptor left to list the topics (os.scandir: EMFILE) used
    to end the client's connection as an internal error, with a traceback in
    the log and no reason for the client: it is Goodbye 3 saying why, with
    no path of the broker's in it, and the broker goes on."""
    import errno

    from broker.log import LogStore

    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"one"])

        def no_fds(self: LogStore) -> list[str]:
            raise OSError(errno.EMFILE, "Too many open files", str(tmp_path / "topics"))

        with monkeypatch.context() as patched:
            patched.setattr(LogStore, "stored_topics", no_fds)
            raw = await RawClient.connect(broker)
            goodbye = await goodbye_for(raw, ListOffsets(1, None))
            await raw.aclose()
        assert goodbye.code == GoodbyeCode.LIMIT_EXCEEDED
        assert goodbye.reason == (
            "the broker cannot list its topics now: [Errno 24] Too many open files: 'topics'"
        )
        async with open_client(url(broker)) as client:
            assert await client.offsets() == {"t": (1, 2)}
