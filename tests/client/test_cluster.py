"""Several brokers sharing the topics: routing is stable, balanced and moves
little when a broker is added; cluster clients reach each topic's owner."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broker.client import (
    BlockingClusterClient,
    ClientError,
    ConnectionLost,
    open_cluster_client,
    parse_servers,
    route,
)
from broker.server import Broker
from tests.server.helpers import TIMEOUT, running_broker, url, wait_idle, wait_subscribed

SERVERS = ["10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"]
TOPICS = [f"topic-{i}" for i in range(3000)]


def test_every_topic_has_one_owner_whatever_the_order_of_the_list() -> None:
    for topic in TOPICS[:200]:
        owners = {
            route(topic, order) for order in (SERVERS, SERVERS[::-1], SERVERS[1:] + SERVERS[:1])
        }
        assert len(owners) == 1


def test_topics_spread_evenly() -> None:
    shares = Counter(route(topic, SERVERS) for topic in TOPICS)
    assert set(shares) == set(SERVERS)
    for server in SERVERS:
        assert 0.28 < shares[server] / len(TOPICS) < 0.39, shares


def test_adding_a_broker_moves_only_the_topics_it_takes() -> None:
    grown = [*SERVERS, "10.0.0.4:7400"]
    moved = [t for t in TOPICS if route(t, SERVERS) != route(t, grown)]
    assert all(route(t, grown) == "10.0.0.4:7400" for t in moved)
    assert 0.2 < len(moved) / len(TOPICS) < 0.3  # about a quarter


@given(st.text(max_size=40), st.lists(st.integers(1, 65535), min_size=1, max_size=6, unique=True))
def test_the_scheme_does_not_change_the_owner(topic: str, ports: list[int]) -> None:
    plain = [f"127.0.0.1:{p}" for p in ports]
    secure = [f"tls://127.0.0.1:{p}" for p in ports]
    assert plain.index(route(topic, plain)) == secure.index(route(topic, secure))


def test_parse_servers() -> None:
    assert parse_servers(" a:1, b:2,,a:1 ") == ["a:1", "b:2"]
    assert parse_servers(["tls://a:1", "a:1", "b"]) == ["tls://a:1", "b"]
    with pytest.raises(ClientError, match="no broker"):
        parse_servers(" , ")
    with pytest.raises(ClientError, match="no broker"):
        route("t", [])
    with pytest.raises(ClientError, match="port"):
        parse_servers("a:notaport")


async def test_a_cluster_client_publishes_each_topic_to_its_owner_only() -> None:
    async with AsyncExitStack() as stack:
        brokers: list[Broker] = [
            await stack.enter_async_context(running_broker()) for _ in range(2)
        ]
        servers = [url(b) for b in brokers]
        owner_of = {url(b): b for b in brokers}
        topics = [f"orders.{i}" for i in range(12)]
        assert {route(t, servers) for t in topics} == set(servers)  # both brokers are used
        with trio.fail_after(TIMEOUT):
            async with (
                open_cluster_client(",".join(servers), name="cluster-sub") as subscriber,
                open_cluster_client(servers, name="cluster-pub") as publisher,
                AsyncExitStack() as subscriptions,
            ):
                subs = {
                    t: await subscriptions.enter_async_context(subscriber.subscribe(t))
                    for t in topics
                }
                for t in topics:
                    await wait_subscribed(owner_of[route(t, servers)], t)
                for i in range(20):
                    for t in topics:
                        await publisher.publish(t, f"{t}/{i}".encode())
                await publisher.flush()
                for t in topics:
                    received = [(await subs[t].receive()).payload for _ in range(20)]
                    assert received == [f"{t}/{i}".encode() for i in range(20)]
                # Each broker saw exactly the topics it owns.
                for server, broker in owner_of.items():
                    owned = {t for t in topics if route(t, servers) == server}
                    assert set(broker.topics) == owned
        for broker in brokers:
            await wait_idle(broker)


async def test_the_blocking_cluster_client_round_trips_and_fails_whole() -> None:
    async with running_broker() as first, running_broker() as second:
        servers = [url(first), url(second)]

        def exchange() -> dict[str, bytes]:
            with BlockingClusterClient(servers, name="blocking-cluster") as cluster:
                subs = {t: cluster.subscribe(t, timeout=TIMEOUT) for t in ("a", "b", "c", "d")}
                for t in subs:
                    cluster.publish(t, t.encode() * 3, timeout=TIMEOUT)
                cluster.flush(timeout=TIMEOUT)
                return {t: sub.receive(timeout=TIMEOUT).payload for t, sub in subs.items()}

        assert await trio.to_thread.run_sync(exchange) == {
            t: t.encode() * 3 for t in ("a", "b", "c", "d")
        }

        def unreachable() -> None:
            BlockingClusterClient([*servers, "127.0.0.1:1"], connect_timeout=2)

        with pytest.raises(ConnectionLost, match="cannot connect"):
            await trio.to_thread.run_sync(unreachable)
        await wait_idle(first)
        await wait_idle(second)
