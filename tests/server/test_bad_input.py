"""A broker facing clients that break the protocol: it says the right Goodbye,
closes, cleans up, pays back every loan, and keeps serving everybody else."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from broker.client import ConnectionLost, open_client
from broker.config import MiB
from broker.protocol import (
    PROTOCOL_VERSION,
    BindTopic,
    Goodbye,
    GoodbyeCode,
    Hello,
    Message,
    Ping,
    Publish,
    Subscribe,
    Welcome,
)
from broker.protocol.frames import encode
from broker.server import Broker, serve_broker

from .helpers import (
    DEAF_CONFIG,
    RawClient,
    assert_round_trip,
    make_config,
    newest_connection,
    publish_until_throttled,
    raw_client,
    running_broker,
    subscribe_deaf,
    url,
    wait_idle,
    wait_subscribed,
    wait_until,
)


def prefixed(body: bytes, length: int | None = None) -> bytes:
    return struct.pack(">I", len(body) if length is None else length) + body


async def expect_goodbye(client: RawClient, code: GoodbyeCode) -> None:
    """The broker says Goodbye ``code`` and closes; nothing follows the Goodbye."""
    frames = await client.read_until_eof()
    assert client.decode_error is None, client.decode_error
    assert client.goodbye_code() == code, client.summary()
    assert isinstance(frames[-1], Goodbye), "the Goodbye is the broker's last frame"


# ==================================================================== garbage


GARBAGE = {
    # A sane length prefix, a body that is not CBOR at all.
    "not-cbor": prefixed(b"\xff\xfe\xfd\xfc\xfb"),
    # Well-formed CBOR, but not an array.
    "cbor-text": prefixed(b"\x65hello"),
    # An array with a type code no message has.
    "unknown-type": prefixed(b"\x82\x18\x63\x00"),
    # A length prefix of 0.
    "empty-frame": prefixed(b"", 0),
    # Trailing bytes after a complete Hello.
    "trailing-bytes": prefixed(encode(Hello(PROTOCOL_VERSION, "x"))[4:] + b"\x00"),
    # Indefinite-length array.
    "indefinite": prefixed(b"\x9f\x00\x01\xff"),
}


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
async def test_garbage_gets_protocol_error(garbage: bytes) -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.send(garbage)
            await expect_goodbye(client, GoodbyeCode.PROTOCOL_ERROR)
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_garbage_after_handshake_gets_protocol_error() -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake()
            await client.send(prefixed(b"\xff\xfe\xfd"))
            await expect_goodbye(client, GoodbyeCode.PROTOCOL_ERROR)
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_text_protocol_reads_as_an_oversize_frame() -> None:
    """An HTTP request's first four bytes, read as a length, are far above max_frame."""
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.send(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")
            await expect_goodbye(client, GoodbyeCode.FRAME_TOO_LARGE)
        await assert_round_trip(broker)
        await wait_idle(broker)


# ==================================================================== oversize


@pytest.mark.parametrize("after_handshake", [False, True], ids=["before-hello", "after-hello"])
async def test_oversize_frame_refused_before_its_body(after_handshake: bool) -> None:
    async with running_broker(max_frame=4096, publish_capacity=8192) as broker:
        async with raw_client(broker) as client:
            if after_handshake:
                welcome = await client.handshake()
                assert welcome.max_frame == 4096
            # Only the prefix: the broker must refuse without waiting for the body.
            await client.send(struct.pack(">I", 4097))
            await expect_goodbye(client, GoodbyeCode.FRAME_TOO_LARGE)
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_frame_of_exactly_max_frame_is_accepted() -> None:
    """The boundary: a body of max_frame bytes is legal (only above is refused)."""
    async with running_broker(max_frame=4096, publish_capacity=8192) as broker:
        async with open_client(url(broker)) as subscriber, subscriber.subscribe("edge") as sub:
            await wait_subscribed(broker, "edge")
            async with raw_client(broker) as client:
                await client.handshake()
                overhead = len(encode(Publish(0, b"x" * 1000))) - 1000
                frame = encode(Publish(0, b"x" * (4096 + 4 - overhead)))
                assert len(frame) == 4096 + 4
                await client.send(BindTopic("edge"), frame)
                with trio.fail_after(5):
                    message = await sub.receive()
                assert len(message.payload) == 4096 + 4 - overhead
                assert client.goodbyes() == []
        await wait_idle(broker)


# ==================================================================== wrong first frame


@pytest.mark.parametrize(
    "first",
    [
        Publish(0, b"early"),
        Ping(1),
        BindTopic("t"),
        Subscribe(0),
        Welcome(PROTOCOL_VERSION, bytes(16), False, b"e", 1000, 500, 1024),
    ],
    ids=["publish", "ping", "bind", "subscribe", "welcome"],
)
async def test_wrong_first_frame_gets_protocol_error(first: Message) -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.send(first)
            await expect_goodbye(client, GoodbyeCode.PROTOCOL_ERROR)
            assert not any(isinstance(m, Welcome) for m in client.frames)
        await assert_round_trip(broker)
        await wait_idle(broker)


@pytest.mark.parametrize(
    ("follow_up", "code"),
    [
        (encode(BindTopic("t")), GoodbyeCode.PROTOCOL_ERROR),
        (b"\x00\x00\x00\x02\xff\xfe", GoodbyeCode.PROTOCOL_ERROR),
        (encode(Goodbye(0, "changed my mind")), None),
    ],
    ids=["bind-before-welcome", "garbage", "goodbye"],
)
async def test_hello_and_another_frame_in_one_write(
    follow_up: bytes, code: GoodbyeCode | None
) -> None:
    """Nothing but Hello may come before Welcome, even in the same write (a
    Goodbye may: the broker just closes). Either way the broker survives."""
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.send(Hello(PROTOCOL_VERSION, "eager"), follow_up)
            await client.read_until_eof()
            assert client.goodbye_code() == code, client.summary()
            assert not any(isinstance(m, Welcome) for m in client.frames)
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_second_hello_gets_protocol_error() -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake()
            await client.hello()
            await expect_goodbye(client, GoodbyeCode.PROTOCOL_ERROR)
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_wrong_version_gets_protocol_error() -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.send(Hello(PROTOCOL_VERSION + 1, "future"))
            await expect_goodbye(client, GoodbyeCode.PROTOCOL_ERROR)
        await assert_round_trip(broker)
        await wait_idle(broker)


# ==================================================================== mid-frame disconnect


@pytest.mark.parametrize("stage", ["in-hello", "after-handshake", "in-publish-body"])
async def test_disconnect_mid_frame_is_cleaned_up(stage: str) -> None:
    async with running_broker() as broker:
        async with open_client(url(broker)) as subscriber, subscriber.subscribe("half") as sub:
            await wait_subscribed(broker, "half")
            async with raw_client(broker) as client:
                hello = encode(Hello(PROTOCOL_VERSION, "half"))
                if stage == "in-hello":
                    await client.send(hello[: len(hello) // 2])
                else:
                    await client.handshake("half")
                    whole = encode(Publish(0, b"whole"))
                    half = encode(Publish(0, b"h" * 1000))
                    # A whole frame, then the first bytes of one: 2 (inside the
                    # length prefix) or 500 (inside the body).
                    cut = 2 if stage == "after-handshake" else 500
                    await client.send(BindTopic("half"), whole, half[:cut])
                    with trio.fail_after(5):
                        message = await sub.receive()
                    assert message.payload == b"whole"
                await wait_until(lambda: len(broker.connections) == 2, what="the raw connection")
                connection = newest_connection(broker)
                await client.aclose()
                with trio.fail_after(5):
                    await connection.closed.wait()
                assert connection.serial not in broker.connections
                assert connection.protocol.closed
                assert "peer closed" in connection.close_reason
            # Only the complete frame was routed: the half one is not delivered.
            await assert_round_trip(broker, topic="half-probe")
            with pytest.raises(trio.WouldBlock):
                sub.receive_nowait()
        await wait_idle(broker)


# ==================================================================== sessions and leases


async def test_resume_of_unknown_session_gets_a_new_session() -> None:
    """PROTOCOL.md: an unknown session is answered with a fresh one (resumed
    false), never silently resumed; the client then knows to subscribe again."""
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.hello("resumer", session=bytes(range(16)))
            welcome = await client.wait_for_message(Welcome)
            assert not welcome.resumed and welcome.bound is None
            assert welcome.session != bytes(range(16))
            assert list(broker.sessions.sessions) == [welcome.session]
            assert client.goodbyes() == []
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_no_hello_within_lease_gets_goodbye_4(autojump_clock: trio.testing.MockClock) -> None:
    """Virtual time (over memory streams): the Goodbye comes when the lease
    runs out, not before."""
    lease = 4.0
    async with running_broker(heartbeat=1.0, lease=lease, in_memory=True) as broker:
        async with raw_client(broker) as client:
            start = trio.current_time()
            await client.read_until_eof()
            elapsed = trio.current_time() - start
            assert client.goodbye_code() == GoodbyeCode.LEASE_EXPIRED, client.summary()
            assert lease <= elapsed < 2 * lease
        await wait_idle(broker)


async def test_silent_client_after_handshake_gets_goodbye_4() -> None:
    """Real clock, short lease: a client that stops talking (and never answers
    Pings) is closed with code 4; a live client keeps its connection."""
    lease = 2.0  # long enough for the live client's Pongs on a loaded machine
    async with running_broker(heartbeat=0.5, lease=lease) as broker:
        async with open_client(url(broker), name="alive") as alive:
            async with raw_client(broker) as client:
                await client.handshake()
                start = trio.current_time()
                await client.read_until_eof()
                assert client.goodbye_code() == GoodbyeCode.LEASE_EXPIRED, client.summary()
                assert trio.current_time() - start >= lease - 0.05
                assert any(isinstance(m, Ping) for m in client.frames)
            # The live client answered Pings all along and still works.
            async with alive.subscribe("alive") as sub:
                await alive.publish("alive", b"still here")
                with trio.fail_after(5):
                    assert (await sub.receive()).payload == b"still here"
        await wait_idle(broker)


# ==================================================================== shutdown


async def test_graceful_shutdown_says_goodbye_5_to_everybody() -> None:
    config = make_config(shutdown_deadline=5.0)
    returned = trio.Event()

    async def serve(*, task_status: trio.TaskStatus[Broker]) -> None:
        await serve_broker(config, task_status=task_status)
        returned.set()

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            broker = await nursery.start(serve)
            raw = await RawClient.connect(broker)
            await raw.handshake()
            lost: list[int | None] = []

            async def subscriber() -> None:
                try:  # (the Goodbye may come before its Subscribe's answer is read)
                    async with (
                        open_client(url(broker), name="sub") as client,
                        client.subscribe("news") as sub,
                    ):
                        async for _ in sub:
                            pass
                except ConnectionLost as error:
                    lost.append(error.code)

            nursery.start_soon(subscriber)
            await wait_until(lambda: sum(len(t.subscriptions) for t in broker.topics.values()) == 1)
            await broker.shutdown()
            with trio.fail_after(5):
                await returned.wait()
            await raw.read_until_eof()
            assert raw.goodbye_code() == GoodbyeCode.SHUTTING_DOWN
            await raw.aclose()
        assert lost == [GoodbyeCode.SHUTTING_DOWN]
        assert not broker.connections
        assert broker.account.debt == 0
        # The listener is gone: nobody can connect any more.
        with pytest.raises(OSError):
            await trio.open_tcp_stream(*broker.address)


async def test_shutdown_with_unread_deliveries_repays_every_loan() -> None:
    """Graceful shutdown with a subscriber that does not read: the drain
    deadline passes while the broker is blocked writing to it, connections are
    cut, and every loan is still repaid by the broker (the conftest's leak
    check fails the test if the garbage collector had to repay one)."""
    config = make_config(**DEAF_CONFIG, shutdown_deadline=0.2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            broker = await nursery.start(serve_broker, config)
            async with raw_client(broker) as deaf:
                await subscribe_deaf(deaf, 64 * MiB)
                await wait_until(lambda: broker.statistics().subscriptions == 1)
                async with open_client(url(broker), name="publisher") as publisher:
                    await publish_until_throttled(publisher, "busy", b"x" * 1000)
                    await broker.shutdown()
                    # Its throttled publishes were never confirmed: accept that
                    # explicitly (leaving with flush would raise ConnectionLost).
                    assert publisher.statistics()["confirmed"] < publisher.statistics()["published"]
                    await publisher.aclose(flush=False)
        # serve_broker returned and nothing is owed.
        assert broker.account.debt == 0
