"""JetStream and KV through the trio client against a real nats-server:
streams, deduplicated and fenced publishes, pipelined acknowledgements,
stored messages, pull consumers, ordered reads and KV compare-and-set."""

from __future__ import annotations

import contextlib

import pytest
import trio

from broker.nats import (
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    ConsumerConfig,
    Headers,
    JetStream,
    JetStreamError,
    JetStreamUnavailable,
    KvEntry,
    StreamConfig,
    open_nats,
)
from broker.nats._servers import NatsServer

PATIENCE = 30


def stream(name: str = "T", **options: object) -> StreamConfig:
    return StreamConfig(name=name, subjects=[f"{name.lower()}.>"], allow_direct=True, **options)  # type: ignore[arg-type]


async def test_stream_lifecycle(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        info = await js.add_stream(stream(max_msgs=1000, duplicate_window=60.0))
        assert info.config.name == "T" and info.config.subjects == ["t.>"]
        assert info.config.max_msgs == 1000 and info.config.duplicate_window == 60.0
        assert info.state.messages == 0
        assert (
            await js.add_stream(stream(max_msgs=1000, duplicate_window=60.0))
        ).config.name == "T"
        for i in range(5):
            await js.publish("t.a", b"%d" % i)
        info = await js.stream_info("T")
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (5, 1, 5)
        updated = await js.update_stream(stream(max_msgs=2000, duplicate_window=60.0))
        assert updated.config.max_msgs == 2000
        assert await js.purge_stream("T", keep=2) == 3
        await js.delete_stream("T")
        with pytest.raises(JetStreamError) as caught:
            await js.stream_info("T")
        assert caught.value.err_code == ERR_STREAM_NOT_FOUND and caught.value.code == 404
        assert "\n" not in str(caught.value)


async def test_msg_id_deduplicates_and_expected_last_seq_fences(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        await js.add_stream(stream())
        first = await js.publish("t.run", b"run-1", msg_id="run-1")
        again = await js.publish("t.run", b"run-1", msg_id="run-1")
        assert (first.stream, first.seq, first.duplicate) == ("T", 1, False)
        assert (again.seq, again.duplicate) == (1, True)
        second = await js.publish("t.run", b"run-2", msg_id="run-2", expected_last_seq=1)
        assert second.seq == 2
        with pytest.raises(JetStreamError) as caught:
            await js.publish("t.run", b"late", expected_last_seq=1)
        assert caught.value.err_code == ERR_WRONG_LAST_SEQUENCE
        assert (await js.stream_info("T")).state.messages == 2


async def test_no_stream_is_retryable_unavailable(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        with pytest.raises(JetStreamUnavailable):
            await js.publish("nowhere.x", b"x", msg_id="a")


async def test_pipelined_publishes_get_their_own_acks(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        await js.add_stream(stream())
        pending = [js.publish_nowait(f"t.{i % 4}", b"x" * 100, msg_id=f"m{i}") for i in range(300)]
        acks = [await p.wait() for p in pending]
        assert [ack.seq for ack in acks] == list(range(1, 301))
        assert not any(ack.duplicate for ack in acks)


async def test_stored_messages_direct_and_through_the_leader(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        await js.add_stream(stream())
        await js.publish("t.a", b"one", headers=Headers({"Run-First": "0"}))
        await js.publish("t.b", b"two")
        await js.publish("t.a", b"three")
        for direct in (True, False):
            one = await js.get_msg("T", 1, direct=direct)
            assert one is not None
            assert (one.subject, one.seq, one.payload) == ("t.a", 1, b"one")
            assert one.headers is not None and one.headers["Run-First"] == "0"
            assert one.time_ns > 1_600_000_000 * 10**9
            last = await js.get_last_msg("T", "t.a", direct=direct)
            assert last is not None and (last.seq, last.payload) == (3, b"three")
            assert await js.get_msg("T", 99, direct=direct) is None
            assert await js.get_last_msg("T", "t.none", direct=direct) is None


async def test_pull_fetch_from_a_durable_consumer(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        await js.add_stream(stream())
        for i in range(10):
            await js.publish("t.x", b"%d" % i)
        info = await js.add_consumer(
            "T", ConsumerConfig(durable_name="d", ack_policy="none", deliver_policy="all")
        )
        assert info.name == "d" and info.num_pending == 10
        batch = await js.fetch("T", "d", 4, expires=PATIENCE)
        assert [m.payload for m in batch] == [b"0", b"1", b"2", b"3"]
        assert [(m.stream_seq, m.consumer_seq) for m in batch] == [(s, s) for s in (1, 2, 3, 4)]
        assert batch[-1].pending == 6
        rest = await js.fetch("T", "d", 100, expires=1.0)
        assert [m.stream_seq for m in rest] == list(range(5, 11))
        assert await js.fetch("T", "d", 5, no_wait=True) == []
        sized = await js.add_consumer("T", ConsumerConfig(durable_name="small", ack_policy="none"))
        assert sized.num_pending == 10
        few = await js.fetch("T", "small", 10, max_bytes=200, expires=PATIENCE)
        assert 1 <= len(few) < 10
        await js.delete_consumer("T", "d")
        with pytest.raises(JetStreamError):
            await js.consumer_info("T", "d")


async def test_ordered_read_from_a_sequence(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        await js.add_stream(stream())
        for i in range(1, 21):
            await js.publish(f"t.{i % 2}", b"%d" % i)
        reader = js.ordered("T", 5)
        got: list[int] = []
        with trio.fail_after(PATIENCE):
            while len(got) < 16:
                got += [m.stream_seq for m in await reader.fetch(6, expires=1.0)]
        assert got == list(range(5, 21))
        assert reader.next_seq == 21
        # The consumer lost: a new one from where it was, nothing skipped or repeated.
        assert reader.consumer is not None
        await js.delete_consumer("T", reader.consumer)
        await js.publish("t.0", b"21")
        later: list[int] = []
        with trio.fail_after(PATIENCE):
            while not later:
                with contextlib.suppress(JetStreamUnavailable):  # (the lost consumer's turn)
                    later += [m.stream_seq for m in await reader.fetch(6, expires=1.0)]
        assert later == [21]
        evens = js.ordered("T", 1, filter_subject="t.0")
        evens_seen = [m.stream_seq for m in await evens.fetch(100, expires=1.0)]
        assert evens_seen == [*range(2, 21, 2), 21]


async def test_key_value_compare_and_set(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        js = JetStream(client, timeout=PATIENCE)
        kv = await js.create_key_value("sessions", history=3)
        assert await kv.get("s1") is None
        first = await kv.create("s1", b"front-a")
        with pytest.raises(JetStreamError) as caught:
            await kv.create("s1", b"front-b")
        assert caught.value.err_code == ERR_WRONG_LAST_SEQUENCE
        second = await kv.update("s1", b"front-b", first)
        with pytest.raises(JetStreamError) as stale:
            await kv.update("s1", b"front-c", first)
        assert stale.value.err_code == ERR_WRONG_LAST_SEQUENCE
        assert await kv.get("s1") == KvEntry(b"front-b", second)
        third = await kv.put("s1", b"front-c")
        assert third > second
        await kv.delete("s1")
        assert await kv.get("s1") is None
        again = await kv.create("s1", b"front-d")  # (a deleted key can be created again)
        assert await kv.get("s1") == KvEntry(b"front-d", again)
        with pytest.raises(ValueError):
            await kv.get("bad key")


async def test_publishes_resent_across_a_restart_are_stored_once(nats_server: NatsServer) -> None:
    """What a front end does while JetStream is away: resend with the same
    Nats-Msg-Id until acknowledged; the stream holds each publish once, in order."""
    async with open_nats(nats_server.url, reconnect_wait_most=0.1) as client:
        js = JetStream(client, timeout=1.0)
        await js.add_stream(stream())
        await js.publish("t.a", b"0", msg_id="m0")
        nats_server.kill()
        unavailable = 0
        with trio.fail_after(PATIENCE):
            for i in range(1, 4):
                while True:
                    try:
                        await js.publish("t.a", b"%d" % i, msg_id=f"m{i}")
                        break
                    except JetStreamUnavailable:
                        unavailable += 1
                        if not nats_server.running:
                            nats_server.start()
        assert unavailable >= 1
        info = await js.stream_info("T")
        assert (info.state.messages, info.state.last_seq) == (4, 4)
        stored = [await js.get_msg("T", seq) for seq in range(1, 5)]
        assert [m.payload for m in stored if m is not None] == [b"0", b"1", b"2", b"3"]
