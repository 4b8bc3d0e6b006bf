"""The trio client against a scripted server (a trio listener on loopback):
a silent server found stale by the keepalive, a protocol violation, a
server's INFO naming more servers, and cancellation going through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from broker.nats import ConnectError, ConnectionLost, open_nats

PATIENCE = 30
INFO = b'INFO {"server_id":"FAKE","version":"2.15.1","max_payload":1048576,"headers":true}\r\n'

Script = Callable[[trio.SocketStream, int], Awaitable[None]]


async def _handshake(stream: trio.SocketStream, info: bytes = INFO) -> bytes:
    """Send INFO, read until the handshake's PING, answer PONG; what was read."""
    await stream.send_all(info)
    seen = b""
    while b"PING\r\n" not in seen:
        data = await stream.receive_some(65536)
        if not data:
            raise trio.BrokenResourceError
        seen += data
    await stream.send_all(b"PONG\r\n")
    return seen


async def _answer_pings(stream: trio.SocketStream) -> None:
    """Read until the client leaves, answering each PING (a server that works)."""
    while data := await stream.receive_some(65536):
        if count := data.count(b"PING\r\n"):
            await stream.send_all(b"PONG\r\n" * count)


async def _serve(nursery: trio.Nursery, script: Script) -> int:
    """A server running ``script(stream, connection number)`` per connection; its port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    count = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal count
        count += 1
        try:
            await script(stream, count)
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return int(listeners[0].socket.getsockname()[1])


async def test_a_silent_server_is_found_stale_and_left() -> None:
    connections: list[int] = []

    async def script(stream: trio.SocketStream, number: int) -> None:
        connections.append(number)
        await _handshake(stream)
        if number == 1:
            await trio.sleep_forever()  # reads nothing more, answers no PING
        await _answer_pings(stream)

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, script)
        async with open_nats(
            f"127.0.0.1:{port}", ping_interval=0.05, max_outstanding_pings=2
        ) as client:
            with trio.fail_after(PATIENCE):
                while client.statistics().reconnects < 1:  # noqa: ASYNC110 (polled)
                    await trio.sleep(0.01)
            assert "stale connection" in client.statistics().last_error
        nursery.cancel_scope.cancel()
    assert connections[:2] == [1, 2]


async def test_a_protocol_violation_ends_the_connection_not_the_client() -> None:
    async def script(stream: trio.SocketStream, number: int) -> None:
        await _handshake(stream)
        if number == 1:  # (the client's flush, answered by a broken frame)
            while b"PING" not in await stream.receive_some(65536):
                pass
            await stream.send_all(b"MSG a 1 notanumber\r\n")
        await _answer_pings(stream)

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, script)
        async with open_nats(f"127.0.0.1:{port}", reconnect_wait_most=0.05) as client:
            with pytest.raises(ConnectionLost):
                await client.flush()
            with trio.fail_after(PATIENCE):
                while client.statistics().reconnects < 1:  # noqa: ASYNC110 (polled)
                    await trio.sleep(0.01)
            assert "protocol violation" in client.statistics().last_error
            assert client.connected or client.statistics().state != "failed"
        nursery.cancel_scope.cancel()


async def test_servers_named_by_info_are_learned() -> None:
    info = INFO.replace(b'"headers":true', b'"headers":true,"connect_urls":["127.0.0.9:4333"]')

    async def script(stream: trio.SocketStream, number: int) -> None:
        await _handshake(stream, info)
        await _answer_pings(stream)

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, script)
        async with open_nats(f"127.0.0.1:{port}") as client:
            assert client.servers == [f"nats://127.0.0.1:{port}", "nats://127.0.0.9:4333"]
        nursery.cancel_scope.cancel()


async def test_a_refused_connect_is_one_line() -> None:
    async def script(stream: trio.SocketStream, number: int) -> None:
        await stream.send_all(INFO)
        await stream.receive_some(65536)
        await stream.send_all(b"-ERR 'Authorization Violation'\r\n")

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, script)
        with pytest.raises(ConnectError) as caught:
            async with open_nats(f"127.0.0.1:{port}"):
                pass
        assert str(caught.value) == (
            f"cannot connect to NATS: nats://127.0.0.1:{port}: "
            "server error: Authorization Violation"
        )
        nursery.cancel_scope.cancel()


async def test_cancellation_goes_through_and_releases_the_request() -> None:
    async def script(stream: trio.SocketStream, number: int) -> None:
        await _handshake(stream)
        await _answer_pings(stream)  # (and no request)

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, script)
        async with open_nats(f"127.0.0.1:{port}") as client:
            with trio.move_on_after(0.05) as scope:
                await client.request("svc", b"?", timeout=PATIENCE)
            assert scope.cancelled_caught
            assert client.statistics().requests_in_flight == 0
            with trio.CancelScope() as scope:
                scope.cancel()
                await client.flush()
            assert scope.cancelled_caught
            with trio.CancelScope() as scope:
                scope.cancel()
                await client.publish("x", b"")
            assert scope.cancelled_caught and client.statistics().out_msgs == 1
        nursery.cancel_scope.cancel()
