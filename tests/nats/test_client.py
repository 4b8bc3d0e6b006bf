"""The trio client against a real nats-server: publish and subscribe,
headers, request and reply, no responders, slow consumers, credentials,
TLS, and reconnection after the server is killed and restarted."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trustme

from broker.nats import (
    ConnectError,
    ConnectionClosed,
    Headers,
    NoResponders,
    RequestTimeout,
    SlowConsumer,
    open_nats,
)
from broker.nats._servers import NatsServer, NatsTls, open_nats_servers

from .conftest import free_port
from .raw import require_nats_server

#: A hang guard only: no test depends on being faster than this.
PATIENCE = 30


async def test_publish_and_subscribe_in_order(nats_server: NatsServer) -> None:
    async with open_nats([nats_server.url], name="t") as client:
        with client.subscribe("orders.*") as sub:
            await client.flush()
            for i in range(200):
                await client.publish(f"orders.{i % 3}", b"%d" % i)
            with trio.fail_after(PATIENCE):
                got = [await sub.receive() for _ in range(200)]
        assert [msg.payload for msg in got] == [b"%d" % i for i in range(200)]
        assert got[5].subject == "orders.2"
        assert sub.statistics().delivered == 200
        assert client.statistics().out_msgs == 200


async def test_headers_arrive_as_sent(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        sub = client.subscribe("h")
        await client.flush()
        headers = Headers([("Nats-Msg-Id", "m1"), ("X", "1"), ("X", "2")])
        client.publish_nowait("h", b"body", headers=headers)
        with trio.fail_after(PATIENCE):
            msg = await sub.receive()
        assert msg.payload == b"body"
        assert msg.headers == headers


async def test_request_and_reply(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client, trio.open_nursery() as nursery:
        service = client.subscribe("svc.echo", queue="echoers")
        await client.flush()

        async def serve() -> None:
            async for msg in service:
                await client.publish(msg.reply, b"echo:" + msg.payload, headers=msg.headers)

        nursery.start_soon(serve)
        with trio.fail_after(PATIENCE):
            replies = [await client.request("svc.echo", b"%d" % i) for i in range(20)]
            pending = [client.start_request("svc.echo", b"p%d" % i) for i in range(50)]
            piped = [await reply.wait(PATIENCE) for reply in pending]
        assert [r.payload for r in replies] == [b"echo:%d" % i for i in range(20)]
        assert [r.payload for r in piped] == [b"echo:p%d" % i for i in range(50)]
        assert client.statistics().requests_in_flight == 0
        nursery.cancel_scope.cancel()


async def test_no_responders_and_timeouts_are_told_apart(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        with pytest.raises(NoResponders):
            await client.request("nobody.listens", b"?", timeout=PATIENCE)
        silent = client.subscribe("silent")
        await client.flush()
        with pytest.raises(RequestTimeout):
            await client.request("silent", b"?", timeout=0.2)
        assert silent.statistics().delivered == 1


async def test_a_slow_subscriber_drops_and_is_told(nats_server: NatsServer) -> None:
    """NATS's slow-consumer rule: the buffer's bound holds, the drop is
    counted and reported once, and the kept messages still come, in order."""
    async with open_nats(nats_server.url) as client:
        sub = client.subscribe("fast", max_pending_msgs=10)
        await client.flush()
        for i in range(100):
            await client.publish("fast", b"%d" % i)
        await client.flush()  # (its PONG comes after the 100 messages)
        assert sub.statistics().pending_msgs == 10
        with pytest.raises(SlowConsumer) as caught:
            sub.receive_nowait()
        assert caught.value.dropped == 90
        assert [sub.receive_nowait().payload for _ in range(10)] == [b"%d" % i for i in range(10)]
        with pytest.raises(trio.WouldBlock):
            sub.receive_nowait()


async def test_unsubscribe_after_max_messages(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        sub = client.subscribe("few")
        sub.unsubscribe(max_msgs=3)
        await client.flush()
        for i in range(10):
            client.publish_nowait("few", b"%d" % i)
        await client.flush()
        got = [msg.payload async for msg in sub]
        assert got == [b"0", b"1", b"2"]


async def test_connecting_nowhere_is_one_line() -> None:
    port = free_port()
    with pytest.raises(ConnectError) as caught:
        async with open_nats([f"nats://127.0.0.1:{port}"], connect_timeout=PATIENCE):
            pass
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_user_and_password(tmp_path: Path) -> None:
    require_nats_server()
    with open_nats_servers(tmp_path, 1, user="alice", password="s3cret") as servers:
        server = servers[0]
        with pytest.raises(ConnectError, match="Authorization Violation"):
            async with open_nats(server.url, user="alice", password="wrong"):
                pass
        async with open_nats(server.url, user="alice", password="s3cret") as client:
            await client.flush()
        async with open_nats(f"nats://alice:s3cret@127.0.0.1:{server.ports.client}") as client:
            await client.flush()


async def test_token(tmp_path: Path) -> None:
    require_nats_server()
    with open_nats_servers(tmp_path, 1) as servers:
        server = servers[0]
        with server.config_path.open("a") as config:
            config.write('authorization { token: "tok" }\n')
        await trio.to_thread.run_sync(server.restart)
        with pytest.raises(ConnectError, match="Authorization Violation"):
            async with open_nats(server.url):
                pass
        async with open_nats(server.url, token="tok") as client:
            await client.flush()


async def test_tls(tmp_path: Path) -> None:
    require_nats_server()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    with open_nats_servers(tmp_path / "servers", 1, tls=NatsTls(cert_path, key_path)) as servers:
        server = servers[0]
        context = ssl.create_default_context()
        ca.configure_trust(context)
        async with open_nats(server.url, tls=context) as client:
            sub = client.subscribe("secret")
            await client.flush()
            client.publish_nowait("secret", b"x")
            with trio.fail_after(PATIENCE):
                assert (await sub.receive()).payload == b"x"
        with pytest.raises(ConnectError):  # (a CA it does not trust)
            async with open_nats(server.url, tls=ssl.create_default_context()):
                pass


async def test_reconnect_restores_subscriptions_and_sends_what_waited(
    nats_server: NatsServer,
) -> None:
    async with open_nats(
        nats_server.url, reconnect_wait_most=0.2, max_pending_bytes=64 * 1024
    ) as client:
        sub = client.subscribe("kept")
        await client.flush()
        nats_server.kill()
        with trio.fail_after(PATIENCE):
            while client.connected:  # noqa: ASYNC110 (the client's state, polled)
                await trio.sleep(0.01)
        for i in range(10):
            await client.publish("kept", b"%d" % i)
        with pytest.raises(trio.WouldBlock):  # the bound holds while disconnected
            while True:
                client.publish_nowait("kept", bytes(1000))
        assert client.statistics().pending_bytes < 64 * 1024 + 1100
        nats_server.start()
        with trio.fail_after(PATIENCE):
            got = [await sub.receive() for _ in range(10)]
            await client.flush()
        assert [msg.payload for msg in got] == [b"%d" % i for i in range(10)]
        assert client.statistics().reconnects == 1
        assert client.connected


async def test_a_client_that_gives_up_is_closed(nats_server: NatsServer) -> None:
    async with open_nats(
        nats_server.url, reconnect_wait_most=0.05, max_reconnect_attempts=2
    ) as client:
        sub = client.subscribe("x")
        await client.flush()
        nats_server.kill()
        with trio.fail_after(PATIENCE):
            with pytest.raises(ConnectionClosed):
                await sub.receive()
        with pytest.raises(ConnectionClosed):
            client.publish_nowait("x", b"")
