"""Authentication at Hello and per-principal limits, end to end over loopback.

A refused client gets its Goodbye code (6: not authorised, 3: limit
exceeded) as :class:`ConnectionLost`; the broker counts the refusal, keeps
serving everybody else, and gives back everything the refused connection
held.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from broker.auth import AuthError, token_digest
from broker.cli._stat_text import render
from broker.client import BlockingClient, ConnectionLost, open_client
from broker.client._common import connection_target
from broker.config import BrokerConfig
from broker.metrics import stat_document
from broker.protocol import GoodbyeCode
from broker.server import Broker, serve_broker
from tests.server.helpers import (
    TIMEOUT,
    make_config,
    running_broker,
    url,
    wait_idle,
    wait_subscribed,
    wait_until,
)

from .conftest import Pki

AUTH_FILE = f"""
[principals.writer]
token = "writer-token"
max_connections = 2
publish = ["events.*"]
subscribe = []

[principals.reader]
token_sha256 = "{token_digest("reader-token")}"
publish = []
subscribe = ["events.*", "alerts"]

[principals.admin]
token = "admin-token"
identities = ["alice"]

[principals.small]
token = "small-token"
budget_share = 0.01
"""


@pytest.fixture
def auth_config(tmp_path: Path) -> BrokerConfig:
    path = tmp_path / "auth.toml"
    path.write_text(AUTH_FILE)
    return make_config(auth_file=str(path))


def failures(broker: Broker) -> dict[str, int]:
    return {reason: n for reason, n in broker.security.auth_failures.items() if n}


async def refused(broker: Broker, code: GoodbyeCode, **options: Any) -> ConnectionLost:
    """Connect with ``options`` and expect the broker's Goodbye ``code`` at once."""
    with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
        async with open_client(url(broker), **options):
            pass  # pragma: no cover - refused at Hello
    assert caught.value.code == code, caught.value
    return caught.value


async def test_tokens_admit_their_principal_and_anything_else_is_refused(
    auth_config: BrokerConfig,
) -> None:
    async with running_broker(auth_config) as broker:
        error = await refused(broker, GoodbyeCode.NOT_AUTHORISED)
        assert "credentials required" in error.reason
        error = await refused(broker, GoodbyeCode.NOT_AUTHORISED, token="wrong")
        assert "bad credentials" in error.reason
        assert "wrong" not in error.reason
        assert failures(broker) == {"no_credentials": 1, "bad_credentials": 1}

        async with (
            open_client(url(broker), name="r", token="reader-token") as reader,
            open_client(url(broker), name="w", token="writer-token") as writer,
            reader.subscribe("events.clicks") as subscription,
        ):
            await wait_subscribed(broker, "events.clicks")
            principals = {c.client_name: c.principal for c in broker.connections.values()}
            assert {k: p.principal.name for k, p in principals.items() if p} == {
                "r": "reader",
                "w": "writer",
            }
            await writer.publish("events.clicks", b"click")
            assert (await subscription.receive()).payload == b"click"
            usage = broker.principals["writer"]
            assert usage.connections == 1
            assert usage.buffer_reserved == broker.connections[2 + 2].buffer_reserved
        await wait_idle(broker)
        assert all(usage.connections == 0 for usage in broker.principals.values())
        assert all(usage.buffer_reserved == 0 for usage in broker.principals.values())


async def test_a_principal_is_held_to_its_connection_limit(auth_config: BrokerConfig) -> None:
    async with running_broker(auth_config) as broker:
        async with (
            open_client(url(broker), token="writer-token") as first,
            open_client(url(broker), token="writer-token") as second,
        ):
            error = await refused(broker, GoodbyeCode.LIMIT_EXCEEDED, token="writer-token")
            assert "'writer' already has 2 connection(s)" in error.reason
            assert failures(broker) == {"connection_limit": 1}
            await first.publish("events.a", b"still served")
            await second.flush()
        # Once one leaves, the principal may connect again.
        async with open_client(url(broker), token="writer-token") as again:
            await again.publish("events.a", b"x")
        await wait_idle(broker)


@pytest.mark.parametrize(
    ("token", "action", "topic", "why"),
    [
        ("writer-token", "publish", "secret.plans", "may not use topic 'secret.plans'"),
        ("writer-token", "subscribe", "events.a", "may not subscribe to 'events.a'"),
        ("reader-token", "publish", "events.a", "may not publish to 'events.a'"),
        ("reader-token", "subscribe", "other", "may not use topic 'other'"),
    ],
)
async def test_topics_outside_a_principals_patterns_end_the_connection(
    auth_config: BrokerConfig, token: str, action: str, topic: str, why: str
) -> None:
    async with running_broker(auth_config) as broker:
        with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
            async with open_client(url(broker), token=token) as client:
                if action == "publish":
                    for _ in range(10):
                        await client.publish(topic, b"denied")
                    await client.flush()
                else:
                    async with client.subscribe(topic) as subscription:
                        # The refusal may cross the subscribe's round trip; it
                        # ends the subscription at the latest.
                        await subscription.receive()
        assert caught.value.code == GoodbyeCode.NOT_AUTHORISED
        assert why in caught.value.reason
        assert failures(broker) == {"topic_denied": 1}
        # Nothing of the refused traffic reached a topic or stayed charged.
        await wait_idle(broker)
        topic_stats = stat_document(broker)["topics"]
        assert topic_stats == []


async def test_a_denied_publish_is_not_routed_but_earlier_ones_are(
    auth_config: BrokerConfig,
) -> None:
    async with running_broker(auth_config) as broker:
        async with (
            open_client(url(broker), token="admin-token") as watcher,
            watcher.subscribe("events.ok") as ok,
            watcher.subscribe("alerts") as alerts,
        ):
            await wait_subscribed(broker, "alerts")
            with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost):
                async with open_client(url(broker), token="reader-token") as reader:
                    # A reader may bind "alerts" (it may subscribe to it), not publish.
                    await reader.publish("alerts", b"forged")
                    await reader.flush()
            with trio.move_on_after(0.2):
                message = await alerts.receive()
                raise AssertionError(f"a denied publish was delivered: {message}")
            async with open_client(url(broker), token="writer-token") as writer:
                await writer.publish("events.ok", b"fine")
            assert (await ok.receive()).payload == b"fine"
        await wait_idle(broker)


async def test_a_budget_share_bounds_what_a_principals_connections_reserve(
    auth_config: BrokerConfig,
) -> None:
    config = auth_config.replace(global_budget=64 * 1024 * 1024)
    async with running_broker(config) as broker:
        usage = broker.principals["small"]
        assert usage.buffer_budget == int(64 * 1024 * 1024 * 0.01)  # 671,088 bytes
        async with open_client(url(broker), token="small-token") as small:
            for i in range(8):  # each topic asks for a 256 KiB publish channel
                await small.publish(f"t{i}", b"x")
            await small.flush()
            assert usage.buffer_reserved <= usage.buffer_budget
            (connection,) = broker.connections.values()
            assert connection.buffer_reserved == usage.buffer_reserved
            # The others are not held to the small share.
            async with open_client(url(broker), token="admin-token") as admin:
                for i in range(4):
                    await admin.publish(f"a{i}", b"x")
                await admin.flush()
                admin_reserved = broker.principals["admin"].buffer_reserved
                assert admin_reserved > usage.buffer_budget
        await wait_idle(broker)


async def test_a_certificate_identity_admits_without_a_token(
    pki: Pki, auth_config: BrokerConfig
) -> None:
    config = auth_config.replace(
        tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), tls_client_ca=str(pki.ca)
    )
    async with running_broker(config) as broker:
        context = pki.client(pki.alice)
        async with open_client(url(broker), name="alice", ssl_context=context) as client:
            await client.publish("anything", b"x")
            (connection,) = broker.connections.values()
            assert connection.principal is not None
            assert connection.principal.principal.name == "admin"
            document = stat_document(broker)
            assert document["connections"][0]["principal"] == "admin"
            assert document["connections"][0]["identity"] == "alice"
            assert document["principals"]["admin"]["connections"] == 1
        # A token, when given, decides: a wrong one is refused despite the certificate.
        await refused(broker, GoodbyeCode.NOT_AUTHORISED, token="nope", ssl_context=context)
        await wait_idle(broker)


async def test_the_blocking_client_presents_its_token(auth_config: BrokerConfig) -> None:
    async with running_broker(auth_config) as broker:

        def publish_and_be_refused() -> int | None:
            with BlockingClient(url(broker), token="writer-token") as client:
                client.publish("events.x", b"ok", timeout=TIMEOUT)
                client.flush(timeout=TIMEOUT)
            try:
                BlockingClient(url(broker), token="bad", connect_timeout=TIMEOUT)
            except ConnectionLost as error:
                return error.code
            return None  # pragma: no cover

        assert await trio.to_thread.run_sync(publish_and_be_refused) == 6
        await wait_until(lambda: failures(broker) == {"bad_credentials": 1}, what="counted")
        await wait_idle(broker)


async def test_a_broker_with_a_bad_auth_file_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text("[principals.x]\nmax_connections = 1\n")
    with pytest.raises(AuthError, match="needs a token"):
        await serve_broker(make_config(auth_file=str(path)))


async def test_without_an_auth_file_tokens_are_ignored() -> None:
    async with running_broker() as broker:
        async with open_client(url(broker), token="anything") as client:
            await client.publish("t", b"x")
            (connection,) = broker.connections.values()
            assert connection.principal is None
        assert failures(broker) == {}


async def test_a_budget_share_too_small_for_one_connection_is_refused_at_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "auth.toml"
    path.write_text('[principals.tiny]\ntoken = "t"\nbudget_share = 0.0001\n')
    with pytest.raises(AuthError, match=r"'tiny': budget_share 0.0001 .* 26843 bytes"):
        await serve_broker(make_config(auth_file=str(path)))


async def test_bind_channels_count_against_the_principal_from_the_welcome_on(
    auth_config: BrokerConfig,
) -> None:
    async with running_broker(auth_config) as broker:
        async with open_client(url(broker), token="reader-token"):
            usage = broker.principals["reader"]
            bind_channels = 2 * auth_config.bind_capacity
            assert usage.buffer_reserved == bind_channels
            assert broker.buffer_reserved == bind_channels
            (connection,) = broker.connections.values()
            assert connection.buffer_reserved == bind_channels
        await wait_idle(broker)
        assert usage.buffer_reserved == 0


async def test_identities_without_client_certificates_are_warned_about(
    auth_config: BrokerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(auth_config):
        pass
    assert "lists certificate identities, but clients present no certificates" in caplog.text


def test_a_token_sent_in_clear_beyond_loopback_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert connection_target("10.0.0.7:7400", None, "secret") == ("10.0.0.7", 7400, None)
    assert "sending a token to 10.0.0.7 without TLS" in caplog.text
    assert "secret" not in caplog.text
    caplog.clear()
    assert connection_target("127.0.0.1:7400", None, "secret")[2] is None
    assert connection_target("tls://10.0.0.7:7400", None, "secret")[2] is not None
    assert caplog.text == ""


def test_broker_stat_shows_principal_and_identity() -> None:
    connection = {"name": "conn-1", "peer": "p", "client": "c", "principal": "admin"}
    text = render({"connections": [{**connection, "identity": "alice"}, {"name": "conn-2"}]})
    lines = text.splitlines()
    assert "principal='admin' identity='alice'" in lines[-2]
    assert "principal" not in lines[-1]
