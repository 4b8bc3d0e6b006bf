"""The in-memory seam: ``serve_broker(config, listeners=...)`` serves any trio
listener, ``Broker.handle_stream`` any trio stream, and the raw socket I/O
(``transport._socket_io``, ``Wake.write_now``) is for plain TCP streams only.
"""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing

from broker.protocol import Goodbye, GoodbyeCode
from broker.server import Broker, serve_broker
from broker.server.transport._socket_io import socket_io

from .helpers import (
    RawClient,
    connect_client,
    connection_named,
    make_config,
    raw_client,
    running_broker,
    wait_idle,
    wait_subscribed,
)
from .memory import MemoryListener


async def test_a_broker_serves_clients_over_memory_streams() -> None:
    async with running_broker(in_memory=True) as broker:
        assert broker.address == ("memory", 0)
        async with (
            connect_client(broker, name="sub") as subscriber,
            connect_client(broker, name="pub") as publisher,
            subscriber.subscribe("news") as subscription,
        ):
            await wait_subscribed(broker, "news")
            await publisher.publish("news", b"in memory")
            assert (await subscription.receive()).payload == b"in memory"
            connection = connection_named(broker, "pub")
            # A placeholder peer, and the stream's own methods (no socket I/O).
            assert connection.peer.startswith("memory:")
            assert not isinstance(connection.stream, trio.SocketStream)
            assert connection._pump.io is None
            assert not connection._pump.write_now()  # (the writer task writes, always)
        await wait_idle(broker)


async def test_raw_socket_io_is_for_plain_tcp_streams_only() -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake("tcp")
            connection = connection_named(broker, "tcp")
            assert isinstance(connection.stream, trio.SocketStream)
            assert connection._pump.io is not None
            await client.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
            await client.read_until_eof()
        await wait_idle(broker)
    left, right = trio.testing.memory_stream_pair()
    assert socket_io(left) is None
    a, b = trio.testing.lockstep_stream_pair()
    assert socket_io(a) is None
    for stream in (left, right, a, b):
        await stream.aclose()


async def test_handle_stream_takes_the_peer_address_it_is_given() -> None:
    async with running_broker(in_memory=True) as broker:
        client_end, broker_end = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.handle_stream, broker_end, ("192.0.2.7", 4711))
            given = RawClient(client_end, max_frame=broker.config.max_frame)
            await given.handshake("given")
            assert connection_named(broker, "given").peer == "192.0.2.7:4711"
            async with raw_client(broker) as other:  # (none given: a placeholder)
                await other.handshake("other")
                assert connection_named(broker, "other").peer == "memory:1"
                for client in (given, other):
                    await client.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
                    await client.read_until_eof()
            await given.aclose()
        await wait_idle(broker)
        assert broker.connections_total == 2


async def test_the_broker_closes_its_listeners_when_it_stops() -> None:
    listener = MemoryListener()
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(
            partial(serve_broker, make_config(), listeners=[listener])
        )
        client = RawClient(await listener.connect(), max_frame=broker.config.max_frame)
        await client.handshake("client")
        await broker.shutdown()
        await client.read_until_eof()
        assert client.goodbye_code() == GoodbyeCode.SHUTTING_DOWN
        await client.aclose()
    with pytest.raises(ConnectionRefusedError):
        await listener.connect()
