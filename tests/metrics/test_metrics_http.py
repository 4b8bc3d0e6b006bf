"""The metrics HTTP server (h11 on trio): routes, refusals, timeouts, and
that idle connections cannot keep anybody else out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from tests.metrics.test_metrics import Address, get, http, parse_response, running

# ====================================================================== routes


async def test_index_head_query_and_not_found() -> None:
    async with running() as (_broker, address):
        index = await get(address, "/")
        assert index.status == 200
        assert b"/metrics" in index.body and b"/stat.json" in index.body
        assert (await get(address, "/metrics?debug=1")).status == 200
        head = await get(address, "/metrics", method="HEAD")
        assert head.status == 200
        assert head.body == b""
        assert int(head.headers["content-length"]) > 0
        for path in ("/nope", "/metrics/", "/stat.json.bak"):
            missing = await get(address, path)
            assert missing.status == 404
            assert missing.headers["connection"] == "close"


async def test_other_methods_are_not_allowed() -> None:
    async with running() as (_broker, address):
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            response = await get(address, "/metrics", method=method)
            assert response.status == 405
            assert response.headers["allow"] == "GET, HEAD"
        body = b"a=1"
        response = await http(
            address,
            b"POST /stat.json HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body),
        )
        assert response.status == 405


async def test_http_1_0_without_host_is_served() -> None:
    async with running() as (_broker, address):
        response = await http(address, b"GET /healthz HTTP/1.0\r\n\r\n")
        assert (response.status, response.body) == (200, b"ok\n")


# ====================================================================== refusals


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x00\x01\x02garbage\xff\r\n\r\n", 400),
        (b"GET\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET metrics HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"GET /metrics FTP/1.0\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /m\xe9trics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 needs Host
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20000, 431),  # never ends
        (b"GET /metrics HTTP/1.1\r\n", 400),  # the client half-closes mid-request
    ],
)
async def test_bad_requests_get_an_error_and_the_server_keeps_serving(
    request_bytes: bytes, status: int
) -> None:
    async with running() as (_broker, address):
        response = await http(address, request_bytes, half_close=True)
        assert response.status == status
        assert response.headers["connection"] == "close"
        assert b"Traceback" not in response.body
        assert (await get(address, "/metrics")).status == 200


async def test_a_silent_client_times_out_with_408() -> None:
    async with running(read_timeout=0.2) as (_broker, address):
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream(*address)
            async with stream:
                await stream.send_all(b"GET /metrics HTTP/1.1\r\n")  # and never finishes
                data = bytearray()
                while chunk := await stream.receive_some(65536):
                    data += chunk
        assert parse_response(bytes(data)).status == 408
        # A client that connects and vanishes does not disturb the server either.
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream(*address)
            await stream.aclose()
        assert (await get(address, "/metrics")).status == 200


# ====================================================================== idle clients


@asynccontextmanager
async def hold_idle(
    address: Address,
    count: int,
    closed_by_server: int,
    send: bytes = b"",
    *,
    unanswered: bool = True,
) -> AsyncIterator[list[trio.SocketStream]]:
    """Open ``count`` connections that send ``send`` (an unfinished request,
    or nothing) and then nothing more; enter once the server has closed
    ``closed_by_server`` of them (each without an answer, if ``unanswered``),
    with those it still holds; close all on exit."""
    streams: list[trio.SocketStream] = []
    for _ in range(count):
        streams.append(await trio.open_tcp_stream(*address))
        if send:  # before any newer connection can make the server close it
            await streams[-1].send_all(send)
    closed: list[trio.SocketStream] = []
    done = trio.Event()

    async def until_closed(stream: trio.SocketStream) -> None:
        while data := await stream.receive_some(1000):
            assert not unanswered, f"an idle connection got an answer: {data!r}"
        closed.append(stream)
        if len(closed) == closed_by_server:
            done.set()

    try:
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(until_closed, stream)
            await done.wait()
            nursery.cancel_scope.cancel()
        yield [stream for stream in streams if stream not in closed]
    finally:
        for stream in streams:
            await stream.aclose()


async def test_idle_connections_beyond_max_clients_are_closed_and_probes_answered() -> None:
    async with running(max_clients=4) as (_broker, address):
        with trio.fail_after(10):
            async with hold_idle(address, 20, 16) as held:
                assert len(held) == 4  # the server still waits for these
                for path in ("/healthz", "/readyz", "/metrics", "/stat.json", "/"):
                    assert (await get(address, path)).status == 200, path


async def test_unfinished_requests_beyond_max_clients_are_closed_without_an_answer() -> None:
    async with running(max_clients=2) as (_broker, address):
        with trio.fail_after(10):
            async with hold_idle(address, 6, 4, send=b"GET /metrics HTTP/1.1\r\n") as held:
                assert len(held) == 2
                assert (await get(address, "/healthz")).status == 200


async def test_bytes_that_cannot_start_a_request_get_400_at_once() -> None:
    """A broker client pointed at the metrics port sends a binary Hello, with
    no line end: it is answered 400 at once (before, the server waited for a
    line end until its 10 s read timeout), so the client can say what it
    reached. (``http`` gives up after 5 s.)"""
    async with running() as (_broker, address):
        response = await http(address, b"\x00\x00\x00\x10\xa5binary hello")
        assert response.status == 400
        assert b"not an HTTP request" in response.body
