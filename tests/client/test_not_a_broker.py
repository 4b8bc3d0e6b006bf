"""A client pointed at something that is not a broker says so in one line,
as its usual connection error, whichever client it is: an HTTP server, a
peer that sends bytes no broker sends, one that closes without a word, and
one that stays silent (such as the metrics port, which waits for a request)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from broker.client import BlockingClient, ConnectionLost, open_client
from tests.server.helpers import TIMEOUT

HTTP_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
#: A frame of the right shape whose body is no protocol message.
GARBAGE = b"\x00\x00\x00\x05hello"
#: What the slow cases wait for (real seconds; the peer never answers).
SILENCE = 1.5


@asynccontextmanager
async def fake_server(
    answer: Callable[[trio.SocketStream], Awaitable[None]],
) -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 that treats each connection with ``answer``;
    yields its ``host:port``."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await answer(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        host, port = listeners[0].socket.getsockname()[:2]
        yield f"{host}:{port}"
        nursery.cancel_scope.cancel()


def sends(data: bytes) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def answer(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)  # the Hello
        await stream.send_all(data)
        await trio.sleep(TIMEOUT)  # and keeps the connection open

    return answer


async def closes(stream: trio.SocketStream) -> None:
    await stream.receive_some(4096)


async def stays_silent(stream: trio.SocketStream) -> None:
    await trio.sleep(TIMEOUT)


async def async_error(address: str, connect_timeout: float = TIMEOUT) -> str:
    with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
        async with open_client(address, connect_timeout=connect_timeout):
            pass  # pragma: no cover
    return str(caught.value)


async def blocking_error(address: str, connect_timeout: float = TIMEOUT) -> str:
    def connect() -> None:
        BlockingClient(address, connect_timeout=connect_timeout)

    with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
        await trio.to_thread.run_sync(connect)
    return str(caught.value)


@pytest.mark.parametrize("error_of", [async_error, blocking_error], ids=["async", "blocking"])
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (sends(HTTP_ANSWER), "it looks like HTTP"),
        (sends(b"SSH-2.0-OpenSSH_9.2\r\n"), "it looks like SSH"),
        (sends(GARBAGE), f"it sent {GARBAGE!r}"),
        (sends(b"\x15\x03\x03\x00\x02\x02\x32"), "it answered in TLS: use tls://{address}"),
        (
            closes,
            "it closed the connection without a word, as a TLS broker does to a plain "
            "client: for TLS use tls://{address}",
        ),
    ],
    ids=["http", "ssh", "garbage", "tls-alert", "closes"],
)
async def test_a_peer_that_is_no_broker_is_named_in_one_line(
    error_of: Callable[[str], Awaitable[str]],
    answer: Callable[[trio.SocketStream], Awaitable[None]],
    said: str,
) -> None:
    async with fake_server(answer) as address:
        message = await error_of(address)
    assert message == f"{address} did not answer as a broker ({said.format(address=address)})"


@pytest.mark.parametrize("error_of", [async_error, blocking_error], ids=["async", "blocking"])
async def test_a_silent_peer_is_named_after_the_connect_timeout(
    error_of: Callable[[str, float], Awaitable[str]],
) -> None:
    """Before: ``trio.TooSlowError`` (async, a 40-line traceback from the
    command line) or ``no Welcome from ... in time`` (blocking)."""
    async with fake_server(stays_silent) as address:
        message = await error_of(address, SILENCE)
    assert message == f"{address} did not answer as a broker (no answer within {SILENCE:g} s)"
