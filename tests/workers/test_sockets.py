"""The listening sockets a supervisor makes: one public address shared by
its workers, and never by another broker's."""

from __future__ import annotations

import errno

import pytest

from broker.workers._sockets import reuseport_group, tcp_listener


def test_a_group_shares_one_port() -> None:
    group = reuseport_group("127.0.0.1", 0, 3)
    try:
        assert len({sock.getsockname() for sock in group}) == 1
    finally:
        for sock in group:
            sock.close()


def test_a_port_another_broker_of_workers_listens_on_is_refused() -> None:
    """Two ``serve --workers 2`` on one address both started, each binding
    with SO_REUSEPORT, and the kernel split the clients between them (3 of
    6 subscribers never got their message)."""
    first = reuseport_group("127.0.0.1", 0, 2)
    port = first[0].getsockname()[1]
    try:
        with pytest.raises(OSError) as refused:
            reuseport_group("127.0.0.1", port, 2)
        assert refused.value.errno == errno.EADDRINUSE
    finally:
        for sock in first:
            sock.close()
    again = reuseport_group("127.0.0.1", port, 2)  # free again: taken
    for sock in again:
        sock.close()


def test_a_port_a_single_broker_listens_on_is_refused() -> None:
    single = tcp_listener("127.0.0.1", 0)
    try:
        with pytest.raises(OSError) as refused:
            reuseport_group("127.0.0.1", single.getsockname()[1], 2)
        assert refused.value.errno == errno.EADDRINUSE
    finally:
        single.close()
