"""``broker pub`` and ``broker sub`` pointed at something that is not a
broker (an HTTP server, the broker's own metrics port) fail with one line."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from .helpers import Served, run

HTTP_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@contextmanager
def http_server() -> Iterator[str]:
    """A server on 127.0.0.1 that answers whatever it is sent with an HTTP 400."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(4096)
                connection.sendall(HTTP_ANSWER)
                connection.shutdown(socket.SHUT_WR)
                connection.recv(4096)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(10)


@pytest.mark.parametrize("command", [["pub", "news", "x"], ["sub", "news"]])
def test_an_http_server_is_named_in_one_line(command: list[str]) -> None:
    """Before: ``frame of 1213486160 bytes exceeds max_frame 1048576``."""
    with http_server() as address:
        result = run(*command, "--broker", address)
    assert result.returncode == 1
    assert result.stderr == (
        f"broker {command[0]}: {address} did not answer as a broker (it looks like HTTP)\n"
    )


def test_the_metrics_port_is_named_in_one_line(served: Served) -> None:
    """Before: a 10 s wait, then a 40-line ``trio.TooSlowError`` traceback.
    The metrics endpoint answers 400 at once to bytes that cannot start an
    HTTP request (a broker client's Hello), so the client can say what it is."""
    address = served.metrics.removeprefix("http://")
    result = run("pub", "news", "x", "--broker", address)
    assert result.returncode == 1
    assert result.stderr == (
        f"broker pub: {address} did not answer as a broker (it looks like HTTP)\n"
    )


def test_a_host_that_cannot_be_found_is_said_so() -> None:
    """It said only "[Errno -2] Name or service not known"."""
    import socket

    from broker.cli._common import describe

    line = describe(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert line == (
        "cannot find the broker's host: Name or service not known (check the host of --broker)"
    )


def test_a_url_of_another_scheme_is_refused_in_one_line() -> None:
    """``--broker http://HOST:PORT`` said "cannot find the broker's host":
    the scheme, not the host, was wrong."""
    result = run("pub", "news", "x", "--broker", "http://127.0.0.1:7400")
    assert result.returncode != 0
    assert result.stderr == (
        "broker pub: http:// is not a broker address: use HOST:PORT, or tls://HOST:PORT for TLS\n"
    )


def test_tls_to_a_plain_broker_says_what_to_check(served: Served) -> None:
    """It gave only OpenSSL's "[SSL: WRONG_VERSION_NUMBER] wrong version number"."""
    result = run("pub", "news", "x", "--broker", "tls://" + served.address)
    assert result.returncode == 1
    assert "WRONG_VERSION_NUMBER" in result.stderr
    assert result.stderr.endswith(
        " (does the broker use TLS? without tls:// the connection is plain TCP)\n"
    )
