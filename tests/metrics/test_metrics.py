"""The Prometheus collector and /stat.json, over real loopback TCP (the HTTP
server's own behaviour: tests/metrics/test_metrics_http.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from broker.client import open_client
from broker.config import BrokerConfig, ConfigError, load_config
from broker.metrics import (
    CHANNEL_KINDS,
    CLIENT_NAME_LIMIT,
    DROP_REASONS,
    METRICS,
    BrokerCollector,
    metrics_registry,
    sanitise_label,
    serve_metrics,
    stat_document,
)
from broker.protocol import Policy
from broker.server import Broker, ServerConnection, serve_broker

Address = tuple[str, int]
Labels = frozenset[tuple[str, str]]


# ====================================================================== helpers


@asynccontextmanager
async def running(
    *, config: dict[str, Any] | None = None, **serve_options: Any
) -> AsyncIterator[tuple[Broker, Address]]:
    """A broker (``config``: settings) on a free port and its metrics server
    on another, its snapshots never reused unless ``max_age`` says so; on a
    normal exit the broker is shut down gracefully, then the metrics server
    stopped."""
    settings: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "metrics_listen": "",
        "shutdown_deadline": 2.0,
        **(config or {}),
    }
    serve_options.setdefault("max_age", 0.0)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(serve_broker, BrokerConfig(**settings))
        metrics: Address = await nursery.start(
            partial(serve_metrics, **serve_options), broker, "127.0.0.1", 0
        )
        yield broker, metrics
        await broker.shutdown()
        nursery.cancel_scope.cancel()


def url(broker: Broker) -> str:
    return "{}:{}".format(*broker.address)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def http(address: Address, request: bytes, *, half_close: bool = False) -> Response:
    """Send ``request`` raw (then half-close, if asked), read until the server
    closes, parse the response."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(request)
            if half_close:
                await stream.send_eof()
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    return parse_response(bytes(data))


def parse_response(data: bytes) -> Response:
    head, separator, body = data.partition(b"\r\n\r\n")
    assert separator, f"no complete response head: {data!r}"
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert int(headers["content-length"]) == len(body) or not body
    return Response(int(status), headers, body)


async def get(address: Address, path: str, method: str = "GET") -> Response:
    return await http(address, f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


class Scrape:
    """One parsed scrape of /metrics."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = list(text_string_to_metric_families(text))
        self.samples: dict[tuple[str, Labels], float] = {}
        for family in self.families:
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                assert key not in self.samples, f"duplicate series {key}"
                self.samples[key] = sample.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def __call__(self, name: str, **labels: str) -> float:
        value = self.get(name, **labels)
        assert value is not None, f"no series {name}{labels}"
        return value

    def series_of(self, connection: str) -> list[tuple[str, Labels]]:
        return [key for key in self.samples if ("connection", connection) in key[1]]

    def connection_named(self, client: str) -> str:
        for (name, labels), _ in self.samples.items():
            if name == "broker_connection_info" and ("client", client) in labels:
                return dict(labels)["connection"]
        raise AssertionError(f"no connection of client {client!r}")


async def scrape(address: Address) -> Scrape:
    response = await get(address, "/metrics")
    assert response.status == 200
    return Scrape(response.body.decode("utf-8"))


async def wait_until(address: Address, condition: Callable[[Scrape], bool]) -> Scrape:
    """Scrape until ``condition`` holds (the broker settles asynchronously)."""
    with trio.fail_after(5):
        while True:
            result = await scrape(address)
            if condition(result):
                return result
            await trio.sleep(0.01)


def debt_series(scrape: Scrape) -> list[float]:
    """The channels' debts of a scrape that are not zero."""
    return [
        value
        for (name, _labels), value in scrape.samples.items()
        if name == "broker_channel_debt_bytes" and value
    ]


def server_connection(broker: Broker, name: str) -> ServerConnection:
    return next(c for c in broker.connections.values() if c.name == name)


# ====================================================================== /metrics


async def test_metrics_exposes_every_family_with_the_right_content_type() -> None:
    async with running() as (broker, address):
        response = await get(address, "/metrics")
        assert response.status == 200
        assert response.headers["content-type"] == CONTENT_TYPE_LATEST
        assert response.headers["connection"] == "close"
        assert int(response.headers["content-length"]) == len(response.body)
        result = Scrape(response.body.decode())
        names = [family.name for family in result.families]
        assert len(names) == len(set(names)), "a family is exposed twice"
        expected = {spec.name.removesuffix("_total") for spec in METRICS}
        assert expected <= set(names)
        for spec in METRICS:
            assert spec.name.startswith("broker_")
            assert spec.name.endswith("_total") == (spec.type == "counter")
        assert result("broker_connections_open") == 0
        assert result("broker_buffer_budget_bytes") == broker.config.global_budget
        assert result("broker_debt_bytes") == 0


async def test_a_connections_series_exist_while_it_is_connected() -> None:
    async with running() as (broker, address):
        async with open_client(url(broker), name="alice") as client:
            await client.publish("t", b"x")
            await client.flush()
            live = await scrape(address)
            name = live.connection_named("alice")
            assert name.startswith("conn-")
            assert live("broker_connection_debt_bytes", connection=name) >= 0
            assert live("broker_connection_blocked", connection=name) == 0
            assert (
                live("broker_connection_channel_debt_bytes", connection=name, kind="publish") >= 0
            )
            dropped = "broker_connection_dropped_frames_total"
            for kind in ("publish", "bind"):
                assert live(dropped, connection=name, kind=kind, reason="beyond_guarantees") == 0
            assert live(dropped, connection=name, kind="publish", reason="unbound_handle") == 0
            assert live("broker_connections_open") == 1
            connection = server_connection(broker, name)
        with trio.fail_after(5):
            await connection.closed.wait()
        gone = await scrape(address)
        assert gone.series_of(name) == []
        assert "conn-" not in gone.text
        assert gone("broker_connections_open") == 0
        assert gone("broker_connections_accepted_total") == 1


async def test_debt_grows_while_a_subscriber_does_not_consume_and_clears_after() -> None:
    count, size = 20, 1000
    async with running() as (broker, address):
        # A small delivery window: most deliveries must wait in the broker's queue.
        small = Policy(deliver_capacity=4096)
        async with (
            open_client(url(broker), name="subscriber", policy=small) as subscriber,
            open_client(url(broker), name="publisher") as publisher,
            subscriber.subscribe("t") as subscription,
        ):
            for _ in range(count):
                await publisher.publish("t", b"p" * size)
            await publisher.flush()  # every publish routed: queued or sent

            owed = await scrape(address)
            pub = owed.connection_named("publisher")
            sub = owed.connection_named("subscriber")
            debt = owed("broker_connection_debt_bytes", connection=pub)
            assert debt > 0
            assert owed("broker_connection_channel_debt_bytes", connection=pub, kind="publish") > 0
            assert owed("broker_connection_peak_debt_bytes", connection=pub) >= debt
            assert owed("broker_connection_debt_bytes", connection=sub) == 0
            assert owed("broker_connection_queued_deliveries", connection=sub) > 0
            assert owed("broker_queued_deliveries") > 0
            assert owed("broker_debt_bytes") >= debt

            for _ in range(count):
                message = await subscription.receive()
                assert message.payload == b"p" * size

            clear = await wait_until(
                address, lambda s: s("broker_connection_debt_bytes", connection=pub) == 0
            )
            assert (
                clear("broker_connection_channel_debt_bytes", connection=pub, kind="publish") == 0
            )
            assert clear("broker_connection_queued_deliveries", connection=sub) == 0
            assert clear("broker_connection_peak_debt_bytes", connection=pub) >= debt


async def test_counters_and_bindings_follow_the_traffic() -> None:
    count = 10
    async with running() as (broker, address):
        async with (
            open_client(url(broker), name="subscriber") as subscriber,
            open_client(url(broker), name="publisher") as publisher,
            subscriber.subscribe("t") as subscription,
        ):
            await publisher.publish("t", b"warm-up")
            await publisher.flush()
            await subscription.receive()
            before = await scrape(address)
            pub = before.connection_named("publisher")
            sub = before.connection_named("subscriber")

            for i in range(count):
                await publisher.publish("t", b"m%d" % i)
            await publisher.flush()
            for _ in range(count):
                await subscription.receive()

            def sent_all(s: Scrape) -> bool:
                total = "broker_connection_sent_messages_total"
                return s(total, connection=sub) >= before(total, connection=sub) + count

            after = await wait_until(address, sent_all)

        def grew(name: str, connection: str, by: float = 1) -> bool:
            return after(name, connection=connection) >= before(name, connection=connection) + by

        assert grew("broker_connection_received_messages_total", pub, count)
        assert grew("broker_connection_received_bytes_total", pub)
        assert grew("broker_connection_sent_bytes_total", sub)
        assert grew("broker_connection_sent_bytes_total", pub)  # Confirms, guarantees
        assert after("broker_connection_received_messages_total", connection=sub) == 0
        assert after("broker_connection_topics_bound", connection=pub) == 1
        assert after("broker_connection_subscriptions_bound", connection=pub) == 0
        assert after("broker_connection_subscriptions_bound", connection=sub) == 1
        assert after("broker_subscriptions") == 1
        assert after("broker_topics") == 1
        capacity = after("broker_connection_buffer_capacity_bytes", connection=pub, kind="publish")
        assert 0 < capacity <= broker.config.publish_capacity
        assert after("broker_connection_buffer_capacity_bytes", connection=pub, kind="bind") > 0
        assert after("broker_buffer_reserved_bytes") > 0
        held = after("broker_connection_guarantees_held_bytes", connection=sub, kind="deliver")
        assert held >= 0
        for name in (
            "broker_connection_guarantees_outstanding_bytes",
            "broker_connection_buffer_used_bytes",
        ):
            kinds = {dict(labels)["kind"] for (n, labels) in after.samples if n == name}
            assert kinds == {"publish", "bind"}


async def test_client_name_label_is_cut_and_sanitised() -> None:
    raw = "evil\n} 1\x00\u200b" + "\u00e9" * 100
    async with running() as (broker, address):
        async with open_client(url(broker), name=raw):
            result = await scrape(address)
            clients = [
                dict(labels)["client"]
                for (name, labels) in result.samples
                if name == "broker_connection_info"
            ]
        assert clients == [sanitise_label(raw)]
        (client,) = clients
        assert len(client) == CLIENT_NAME_LIMIT
        assert client.isprintable()
        assert client.startswith("evil\ufffd} 1\ufffd\ufffd")


def test_sanitise_label() -> None:
    assert sanitise_label("ok name") == "ok name"
    assert sanitise_label("a\tb\r\nc") == "a\ufffdb\ufffd\ufffdc"
    assert sanitise_label("\udcff") == "\ufffd"  # a lone surrogate could not be encoded
    assert sanitise_label("x" * 100) == "x" * CLIENT_NAME_LIMIT
    assert sanitise_label("abcdef", limit=3) == "abc"


async def test_the_collector_uses_a_private_registry() -> None:
    async with running() as (broker, _address):
        registry = metrics_registry(broker)
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            registry.register(BrokerCollector(broker))  # describe() names the families
        assert not any(f.name.startswith("broker_") for f in REGISTRY.collect())
        families = {family.name for family in registry.collect()}
        assert "broker_connection_debt_bytes" in families
        described = [family.name for family in BrokerCollector(broker).describe()]
        assert all(not family.samples for family in BrokerCollector(broker).describe())
        assert described == [family.name for family in BrokerCollector(broker).collect()]
        assert set(CHANNEL_KINDS) == {"publish", "deliver", "bind"}
        assert set(DROP_REASONS) == {"beyond_guarantees", "unbound_handle"}


# ====================================================================== /stat.json


async def test_stat_json_lists_connections_channels_subscriptions_and_topics() -> None:
    async with running() as (broker, address):
        async with (
            open_client(url(broker), name="subscriber") as subscriber,
            open_client(url(broker), name="publisher") as publisher,
            subscriber.subscribe("prices") as subscription,
        ):
            await publisher.publish("prices", b"42")
            await publisher.flush()
            await subscription.receive()
            # (the subscriber's Ack, held back up to its ack_delay, clears the debt)
            await wait_until(address, lambda scrape: not debt_series(scrape))
            response = await get(address, "/stat.json")
            assert response.status == 200
            assert response.headers["content-type"] == "application/json"
            document = json.loads(response.body)
            # The same document, directly, is strict JSON (no NaN or Infinity).
            json.dumps(stat_document(broker), allow_nan=False)

        assert document["version"] == 2
        assert document["connections_total"] == 2
        assert document["topics_total"] == 1
        assert document["totals"]["broker_received_messages_total"] == 1
        assert document["totals"]["broker_channel_debt_bytes"] == {"publish": 0}
        assert document["broker"]["address"] == url(broker)
        assert document["broker"]["statistics"]["connections"] == 2
        assert document["broker"]["account"]["high_watermark"] is None  # unlimited
        assert document["budgets"]["global_budget"] == broker.config.global_budget
        connections = {c["client"]: c for c in document["connections"]}
        assert set(connections) == {"subscriber", "publisher"}
        pub, sub = connections["publisher"], connections["subscriber"]
        assert pub["name"].startswith("conn-") and pub["state"] == "open"
        assert pub["account"]["kind"] == "connection"
        assert pub["counters"]["messages_in"] == 1
        publish = [c for c in pub["channels"] if c["kind"] == "publish"]
        assert len(publish) == 1
        assert publish[0]["topic"] == "prices"
        assert publish[0]["account"]["kind"] == "publish"
        assert publish[0]["direction"] == "in"
        assert publish[0]["capacity"] > 0
        assert {c["kind"] for c in pub["channels"]} >= {"bind", "publish"}
        assert [s["topic"] for s in sub["subscriptions"]] == ["prices"]
        assert sub["subscriptions"][0]["queued"] == 0
        assert any(c["kind"] == "deliver" and c["direction"] == "out" for c in sub["channels"])
        (topic,) = document["topics"]
        assert topic == {
            "name": "prices",
            # (Subscribing binds the topic too: that channel never published.)
            "publishers": 1,
            "subscriptions": 1,
            "queued": 0,
            "messages_in": 1,
        }


async def test_a_topics_publishers_are_the_channels_that_published() -> None:
    """A client that binds topics only to subscribe to them was counted as
    each one's publisher; a publisher counts from its first publish until
    its connection closes."""

    async def publishers(until: dict[str, int]) -> dict[str, int]:
        """The topics' publishers, read until they are ``until`` (or 5 s passed)."""
        with trio.move_on_after(5):
            while True:
                document = json.loads((await get(address, "/stat.json")).body)
                found = {topic["name"]: topic["publishers"] for topic in document["topics"]}
                if found == until:
                    break
                await trio.sleep(0.01)
        return found

    async with (
        running() as (broker, address),
        open_client(url(broker), name="subscriber") as subscriber,
        subscriber.subscribe("a"),
        subscriber.subscribe("b") as subscription,
    ):
        assert await publishers({"a": 0, "b": 0}) == {"a": 0, "b": 0}
        async with open_client(url(broker), name="publisher") as publisher:
            await publisher.publish("b", b"1")
            await publisher.flush()
            await subscription.receive()
            assert await publishers({"a": 0, "b": 1}) == {"a": 0, "b": 1}
        assert await publishers({"a": 0, "b": 0}) == {"a": 0, "b": 0}


# ====================================================================== bounds


async def open_clients(stack: AsyncExitStack, broker: Broker, count: int, start: int = 0) -> None:
    """``count`` more clients, named ``c<start>``..., each publishing once to topic ``t``."""
    for index in range(start, start + count):
        client = await stack.enter_async_context(open_client(url(broker), name=f"c{index}"))
        await client.publish("t", b"x")
        await client.flush()


async def test_the_series_count_does_not_grow_with_the_connections() -> None:
    top = BrokerConfig().metrics_top
    async with running() as (broker, address), AsyncExitStack() as stack:
        await open_clients(stack, broker, top)
        counts = []
        for extra in range(3):
            await open_clients(stack, broker, 1, start=top + extra)
            result = await scrape(address)
            assert result("broker_connections_open") == top + extra + 1
            counts.append(len(result.samples))
        assert counts[0] == counts[1] == counts[2]
        assert result("broker_connections_detailed") == top
        assert result("broker_received_messages_total") == top + 3
        info = [n for n, _ in result.samples if n == "broker_connection_info"]
        assert len(info) == top


async def test_each_total_is_the_sum_of_its_per_connection_series() -> None:
    async with running() as (broker, address), AsyncExitStack() as stack:
        await open_clients(stack, broker, 3)
        result = await scrape(address)
        assert result("broker_connections_detailed") == 3  # all of them
        checked = set()
        for spec in METRICS:
            for (name, labels), value in result.samples.items():
                if name != spec.total:
                    continue
                summed = sum(
                    v
                    for (n, other), v in result.samples.items()
                    if n == spec.name and {x for x in other if x[0] != "connection"} == labels
                )
                assert value == summed, (name, labels)
                checked.add(name)
        assert checked == {spec.total for spec in METRICS if spec.total}


async def test_a_closed_connection_leaves_its_counts_in_the_totals() -> None:
    async with (
        running(config={"metrics_top": 1}) as (broker, address),
        open_client(url(broker), name="stays") as stays,
    ):
        async with open_client(url(broker), name="leaves") as leaves:
            for _ in range(3):
                await leaves.publish("t", b"x")
            await leaves.flush()
            await stays.publish("t", b"y")
            await stays.flush()
            during = await scrape(address)
            assert during("broker_received_messages_total") == 4
            assert during("broker_connections_detailed") == 1
        after = await wait_until(address, lambda s: s("broker_connections_open") == 1)
        assert after("broker_received_messages_total") == 4
        for name in ("broker_received_bytes_total", "broker_sent_bytes_total"):
            assert after(name) >= during(name) > 0


async def test_the_detailed_connections_have_the_most_debt_or_the_longest_backlog() -> None:
    async with running(config={"metrics_top": 1}) as (broker, address):
        small = Policy(deliver_capacity=4096)
        async with (
            open_client(url(broker), name="idle"),
            open_client(url(broker), name="subscriber", policy=small) as subscriber,
            subscriber.subscribe("t"),
            open_client(url(broker), name="publisher") as publisher,
        ):
            for _ in range(20):
                await publisher.publish("t", b"p" * 1000)
            await publisher.flush()  # routed: most wait in the subscriber's queue
            result = await scrape(address)
            # The idle connection is the oldest (it wins ties) but owes and holds nothing.
            detailed = {
                dict(labels)["client"]
                for name, labels in result.samples
                if name == "broker_connection_info"
            }
            assert detailed == {"publisher", "subscriber"}
            assert result("broker_connections_detailed") == 2
            publisher_name = result.connection_named("publisher")
            subscriber_name = result.connection_named("subscriber")
            assert result("broker_connection_debt_bytes", connection=publisher_name) > 0
            queued = result("broker_connection_queued_deliveries", connection=subscriber_name)
            assert queued == result("broker_queued_deliveries") > 0
            document = json.loads((await get(address, "/stat.json")).body)
            assert [c["client"] for c in document["connections"]] == ["publisher", "subscriber"]


async def test_a_walk_gives_the_loop_a_turn_between_pieces() -> None:
    async with running() as (broker, _address), AsyncExitStack() as stack:
        await open_clients(stack, broker, 7)
        collector = BrokerCollector(broker, chunk=2, max_age=0)
        seen: list[int] = []  # how far the walk was, each time another task ran
        walked = trio.Event()

        async def watch() -> None:
            while not walked.is_set():
                seen.append(collector.visited)
                await trio.lowlevel.checkpoint()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                snapshot = await collector.snapshot()
                walked.set()
        finally:
            collector.close()
        assert snapshot.connections == collector.visited == 7
        # Another task ran while the walk was half done (the order of the two
        # within each scheduling batch is random, so some values may be missed).
        assert any(0 < visited < 7 for visited in seen), seen
        # ... and during each piece of the walk: 4 pieces of connections at least.
        assert len(seen) >= 4, seen


async def test_scrapes_share_a_walk_and_reuse_it_for_max_age() -> None:
    async with running() as (broker, _address), AsyncExitStack() as stack:
        await open_clients(stack, broker, 3)
        cached = BrokerCollector(broker, chunk=1, max_age=3600)
        fresh = BrokerCollector(broker, chunk=1, max_age=0)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(cached.snapshot)
            assert cached.walks == 1
            assert (await cached.text()).startswith(b"# HELP broker_build_info")
            assert cached.walks == 1
            await fresh.snapshot()
            await fresh.snapshot()
            assert fresh.walks == 2
        finally:
            cached.close()
            fresh.close()


async def test_stat_json_details_the_busiest_connections_and_topics_with_totals() -> None:
    async with running(config={"metrics_top": 2}) as (broker, address):
        async with AsyncExitStack() as stack:
            for index in range(4):
                client = await stack.enter_async_context(open_client(url(broker), name=f"c{index}"))
                for _ in range(index + 1):
                    await client.publish(f"t{index}", b"x")
                await client.flush()
            document = json.loads((await get(address, "/stat.json")).body)
        assert document["connections_total"] == 4
        assert [c["client"] for c in document["connections"]] == ["c0", "c1"]  # ties: oldest
        assert document["topics_total"] == 4
        assert [t["name"] for t in document["topics"]] == ["t3", "t2"]  # most messages
        assert document["totals"]["broker_received_messages_total"] == 10
        assert document["broker"]["statistics"]["connections"] == 4


def test_metrics_top_is_a_setting() -> None:
    assert BrokerConfig().metrics_top == 10
    assert load_config(environ={"BROKER_METRICS_TOP": "3"}).metrics_top == 3
    assert load_config(environ={}, overrides={"metrics_top": "0"}).metrics_top == 0
    with pytest.raises(ConfigError, match="metrics_top must be >= 0"):
        BrokerConfig(metrics_top=-1)
