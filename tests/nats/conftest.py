"""The NATS client's integration tests run real ``nats-server``\\ s through
the launcher (``broker/nats/_servers.py``): ``nats_server`` is one server
with JetStream (``sync_interval: always``) on free loopback ports and a store
of the test's own, stopped by PID at the end; ``kill()`` then ``start()``
brings it back on the same port and store."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.nats._servers import NatsServer, open_nats_servers

from .raw import require_nats_server


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    require_nats_server()
    with open_nats_servers(tmp_path, 1) as servers:
        yield servers[0]
