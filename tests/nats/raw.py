"""What the launcher's tests share: the ``nats-server`` binary or a skip, and
a few lines of the NATS text protocol over a plain socket for one request
to a real server without the project's NATS client."""

from __future__ import annotations

import json
import os
import socket
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from broker.nats._servers import NatsServerMissing, find_nats_server


def require_nats_server() -> Path:
    """The ``nats-server`` binary, or a skip saying what to install (a
    failure under CI, where ``$BROKER_REQUIRE_TOOLS`` is 1)."""
    try:
        return find_nats_server()
    except NatsServerMissing as missing:
        if os.environ.get("BROKER_REQUIRE_TOOLS") == "1":
            pytest.fail(str(missing), pytrace=False)
        pytest.skip(str(missing))


def request(
    url: str,
    subject: str,
    payload: bytes = b"",
    *,
    user: str | None = None,
    password: str | None = None,
    wait: float = 1.0,
    expect: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Send one request to ``subject`` and collect the answers for ``wait``
    seconds (or until ``expect`` of them came): the server's INFO and every
    ``(status, body)`` received on the reply inbox, ``status`` the header
    status code or ``""`` (a 503 no responders is ``("503", b"")``). With
    ``tls``, the connection turns to TLS after the server's INFO, as NATS
    clients do."""
    parts = urllib.parse.urlsplit(url)
    connect: dict[str, Any] = {"verbose": False, "pedantic": False, "protocol": 1}
    connect |= {"headers": True, "no_responders": True}
    if user is not None:
        connect |= {"user": user, "pass": password or ""}
    with socket.create_connection((parts.hostname, parts.port), timeout=5.0) as plain:
        data = b""
        while b"\r\n" not in data:
            data += plain.recv(65536)
        line, _, data = data.partition(b"\r\n")
        info = json.loads(line.removeprefix(b"INFO "))
        sock = plain if tls is None else tls.wrap_socket(plain, server_hostname=parts.hostname)
        try:
            sock.sendall(
                b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB _INBOX.raw 1\r\n"
                b"PUB %s _INBOX.raw %d\r\n%s\r\nPING\r\n"
                % (subject.encode(), len(payload), payload)
            )
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = sock.recv(1 << 20)
                except TimeoutError:
                    break
                if not chunk:
                    break
                data += chunk
                if expect is not None and len(_answers(data)) >= expect:
                    break
        finally:
            sock.close()
    return info, _answers(data)


def _answers(data: bytes) -> list[tuple[str, bytes]]:
    """The whole messages in ``data`` (one cut short is left out); raises
    ``RuntimeError`` with the line of an ``-ERR``."""
    answers = []
    while b"\r\n" in data:
        line, _, data = data.partition(b"\r\n")
        words = line.split()
        if not words:
            continue
        if words[0] == b"-ERR":
            raise RuntimeError(line.decode())
        if words[0] not in (b"MSG", b"HMSG"):
            continue
        size = int(words[-1])
        if len(data) < size + 2:
            break
        if words[0] == b"MSG":
            answers.append(("", data[:size]))
            data = data[size + 2 :]
        else:
            header_size = int(words[-2])
            headers, body = data[:header_size], data[header_size:size]
            status = headers.split(b"\r\n", 1)[0].split()
            answers.append((status[1].decode() if len(status) > 1 else "", body))
            data = data[size + 2 :]
    return answers


def create_stream(url: str, name: str, replicas: int, **auth: str) -> dict[str, Any]:
    """Create a file stream ``name`` on subject ``name`` with ``replicas``;
    return the JetStream API's answer."""
    config = {"name": name, "subjects": [name], "num_replicas": replicas, "storage": "file"}
    _, answers = request(
        url,
        f"$JS.API.STREAM.CREATE.{name}",
        json.dumps(config).encode(),
        wait=30.0,
        expect=1,
        **auth,
    )
    for status, body in answers:
        if body:
            answer: dict[str, Any] = json.loads(body)
            return answer
        raise RuntimeError(f"stream create answered status {status}")
    raise RuntimeError("no answer to the stream create")
