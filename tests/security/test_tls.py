"""TLS on the client listener, end to end over loopback, with both clients.

Certificates come from trustme (see conftest.py). Every test also checks that
the broker keeps serving and gives back everything it lent or reserved.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any

import pytest
import trio

from broker.client import BlockingClient, ConnectionLost, open_client
from broker.config import BrokerConfig, ConfigError
from broker.protocol import PROTOCOL_VERSION, Goodbye, GoodbyeCode, Hello
from broker.protocol.frames import FrameDecoder, encode
from broker.server import Broker, serve_broker
from broker.tls import TLSConfigError, certificate_identity, client_context, server_context
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


def tls_config(pki: Pki, **overrides: Any) -> BrokerConfig:
    return make_config(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), **overrides)


async def tls_round_trip(broker: Broker, context: ssl.SSLContext, topic: str = "secure") -> None:
    """A TLS publisher and a TLS subscriber exchange a few messages."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_client(url(broker), name="tls-sub", ssl_context=context) as subscriber,
            open_client(url(broker), name="tls-pub", ssl_context=context) as publisher,
            subscriber.subscribe(topic) as subscription,
        ):
            await wait_subscribed(broker, topic)
            for i in range(50):
                await publisher.publish(topic, b"secret %d" % i, key=b"k")
            received = [(await subscription.receive()).payload for _ in range(50)]
    assert received == [b"secret %d" % i for i in range(50)]


async def test_async_clients_publish_and_subscribe_over_tls(pki: Pki) -> None:
    async with running_broker(tls_config(pki)) as broker:
        await tls_round_trip(broker, pki.client())
        assert broker.security.tls_handshake_failures == 0
        await wait_idle(broker)


async def test_a_tls_url_uses_the_system_trust_store_which_does_not_know_the_test_ca(
    pki: Pki,
) -> None:
    async with running_broker(tls_config(pki)) as broker:
        with pytest.raises(ConnectionLost, match="TLS handshake") as raised:
            async with open_client("tls://{}:{}".format(*broker.address)):
                pass  # pragma: no cover - the handshake fails
        assert "give the CA that signed it with --cafile PEM" in str(raised.value)
        await wait_until(lambda: broker.security.tls_handshake_failures == 1, what="counted")
        await tls_round_trip(broker, pki.client())  # others are unaffected


async def test_the_blocking_client_speaks_tls(pki: Pki) -> None:
    async with running_broker(tls_config(pki)) as broker:
        address = "tls://" + url(broker)
        context = pki.client()

        def exchange() -> list[bytes]:
            with (
                BlockingClient(address, name="blocking-sub", ssl_context=context) as sub_client,
                sub_client.subscribe("blocking") as subscription,
                BlockingClient(address, name="blocking-pub", ssl_context=context) as publisher,
            ):
                # 300 kB, beyond one delivery window: guarantees flow back over TLS.
                for i in range(300):
                    publisher.publish("blocking", b"%04d" % i + b"x" * 1000, timeout=TIMEOUT)
                publisher.flush(timeout=TIMEOUT)
                return [subscription.receive(timeout=TIMEOUT).payload[:4] for _ in range(300)]

        received = await trio.to_thread.run_sync(exchange)
        assert received == [b"%04d" % i for i in range(300)]
        await wait_idle(broker)


async def test_a_blocking_client_that_does_not_trust_the_broker_is_refused(pki: Pki) -> None:
    async with running_broker(tls_config(pki)) as broker:
        untrusting = client_context(str(pki.other_ca))

        def connect() -> None:
            BlockingClient(url(broker), ssl_context=untrusting, connect_timeout=TIMEOUT)

        with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED") as raised:
            await trio.to_thread.run_sync(connect)
        assert "give the CA that signed it with --cafile PEM" in str(raised.value)
        await wait_until(lambda: broker.security.tls_handshake_failures == 1, what="counted")


async def test_a_plain_tcp_client_is_cut_off_and_counted(pki: Pki) -> None:
    async with running_broker(tls_config(pki)) as broker:
        with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost):
            async with open_client(url(broker)):  # no TLS: its Hello is not a ClientHello
                pass  # pragma: no cover
        await wait_until(lambda: broker.security.tls_handshake_failures == 1, what="counted")
        assert not broker.connections
        await tls_round_trip(broker, pki.client())


async def test_a_client_that_never_starts_the_handshake_is_closed_in_time(pki: Pki) -> None:
    async with running_broker(tls_config(pki, tls_handshake_timeout=0.3)) as broker:
        with trio.fail_after(TIMEOUT):
            stream = await trio.open_tcp_stream(*broker.address)
            async with stream:
                await wait_until(lambda: broker.handshaking == 1, what="handshake started")
                # The broker gives up and closes: we read end of stream (or a reset).
                with contextlib.suppress(trio.BrokenResourceError):
                    assert await stream.receive_some(1024) == b""
        assert broker.security.tls_handshake_failures == 1
        assert broker.handshaking == 0


async def test_handshakes_in_progress_count_against_max_connections(pki: Pki) -> None:
    async with running_broker(tls_config(pki, max_connections=1)) as broker:
        with trio.fail_after(TIMEOUT):
            silent = await trio.open_tcp_stream(*broker.address)
            async with silent:
                await wait_until(lambda: broker.handshaking == 1, what="handshake started")
                refused = trio.SSLStream(
                    await trio.open_tcp_stream(*broker.address),
                    pki.client(),
                    server_hostname="127.0.0.1",
                )
                async with refused:
                    # Refused: Goodbye 3, inside TLS, then the end.
                    goodbye = await read_first_frame(refused)
                    assert goodbye == Goodbye(GoodbyeCode.LIMIT_EXCEEDED, "too many connections")
        assert broker.refused_total == 1


async def test_mutual_tls_requires_a_certificate_from_the_client_ca(pki: Pki) -> None:
    config = tls_config(pki, tls_client_ca=str(pki.ca))
    async with running_broker(config) as broker:
        # Without a certificate, or with one from another CA: no connection.
        for certificate in (None, pki.mallory):
            with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost):
                async with open_client(url(broker), ssl_context=pki.client(certificate)) as c:
                    await c.flush()  # TLS 1.3: the refusal may come after the handshake
        await wait_until(lambda: broker.security.tls_handshake_failures == 2, what="counted")
        # With alice's certificate: served, and the broker knows who it is.
        context = pki.client(pki.alice)
        async with open_client(url(broker), name="alice", ssl_context=context) as client:
            await client.flush()
            (connection,) = broker.connections.values()
            assert connection.identity == "alice"
        await tls_round_trip(broker, context)
        await wait_idle(broker)


def test_tls_settings_are_checked(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="together"):
        make_config(tls_cert=str(pki.server_cert))
    with pytest.raises(ConfigError, match="needs tls_cert"):
        make_config(tls_client_ca=str(pki.ca))
    with pytest.raises(ConfigError, match="tls_handshake_timeout"):
        tls_config(pki, tls_handshake_timeout=0)
    with pytest.raises(TLSConfigError, match="cannot load TLS certificate/key"):
        server_context(str(pki.server_cert), str(pki.ca))  # a key that is not a key
    with pytest.raises(TLSConfigError, match="client CA"):
        server_context(str(pki.server_cert), str(pki.server_key), "/nonexistent/ca.pem")


async def test_a_broker_with_a_bad_key_file_does_not_start(pki: Pki, tmp_path: Any) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(TLSConfigError, match=r"bad\.pem"):
        await serve_broker(make_config(tls_cert=str(pki.server_cert), tls_key=str(bad)))


def test_certificate_identity_is_the_subject_common_name() -> None:
    assert certificate_identity(None) is None
    assert certificate_identity({}) is None
    subject = ((("countryName", "XX"),), (("commonName", "alice"),))
    assert certificate_identity({"subject": subject}) == "alice"
    assert certificate_identity({"subject": ((("organizationName", "x"),),)}) is None


async def read_first_frame(stream: trio.abc.Stream) -> Any:
    decoder = FrameDecoder(max_frame=1 << 20)
    with trio.fail_after(TIMEOUT):
        while True:
            data = await stream.receive_some(65536)
            assert data, "closed before any frame"
            decoder.feed(data)
            for message, _ in decoder.messages():
                return message


async def test_refusals_are_sent_inside_tls(pki: Pki) -> None:
    async with running_broker(tls_config(pki, max_connections=1)) as broker:
        async with open_client(url(broker), ssl_context=pki.client()) as first:
            with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as refused:
                async with open_client(url(broker), ssl_context=pki.client()):
                    pass  # pragma: no cover
            assert refused.value.code == GoodbyeCode.LIMIT_EXCEEDED
            assert refused.value.reason == "too many connections"

            def blocking() -> int | None:
                try:
                    BlockingClient(url(broker), ssl_context=pki.client(), connect_timeout=TIMEOUT)
                except ConnectionLost as error:
                    return error.code
                return None  # pragma: no cover

            assert await trio.to_thread.run_sync(blocking) == GoodbyeCode.LIMIT_EXCEEDED
            await first.flush()
        assert broker.refused_total == 2
        assert broker.security.tls_handshake_failures == 0


async def test_a_handshake_that_ends_during_shutdown_gets_goodbye_5_and_does_not_delay_it(
    pki: Pki,
) -> None:
    config = tls_config(pki, shutdown_deadline=5.0)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(serve_broker, config)
        # A client that never answers the Goodbye keeps the shutdown draining
        # (for the broker's linger time) while the late handshake completes.
        draining = trio.SSLStream(
            await trio.open_tcp_stream(*broker.address), pki.client(), server_hostname="127.0.0.1"
        )
        await draining.do_handshake()
        await draining.send_all(encode(Hello(PROTOCOL_VERSION, "draining", None, {})))
        await wait_until(lambda: len(broker.connections) == 1, what="the first client")
        raw = await trio.open_tcp_stream(*broker.address)
        late = trio.SSLStream(raw, pki.client(), server_hostname="127.0.0.1")
        await wait_until(lambda: broker.handshaking == 1, what="the broker to await a handshake")
        stopped = trio.Event()

        async def stop() -> None:
            await broker.shutdown()
            stopped.set()

        started = trio.current_time()
        nursery.start_soon(stop)
        await wait_until(lambda: broker.closing, what="the shutdown to begin")
        await late.do_handshake()
        await late.send_all(encode(Hello(PROTOCOL_VERSION, "late", None, {})))
        goodbye = await read_first_frame(late)
        assert isinstance(goodbye, Goodbye)
        assert goodbye.code == GoodbyeCode.SHUTTING_DOWN
        with trio.fail_after(TIMEOUT):
            await stopped.wait()
        assert trio.current_time() - started < config.shutdown_deadline
        await late.aclose()
        await draining.aclose()


async def test_a_corrupted_tls_stream_ends_the_blocking_client_with_connection_lost(
    pki: Pki,
) -> None:
    """A proxy flips one byte of the broker's stream: the client reports a TLS
    error as ConnectionLost (never a raw ssl error) and closes its socket."""
    corrupt = trio.Event()

    async def pipe(source: trio.abc.Stream, sink: trio.abc.Stream, flip: bool) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                if flip and corrupt.is_set():
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                await sink.send_all(data)

    async with running_broker(tls_config(pki, heartbeat=0.2, lease=5.0)) as broker:

        async def proxy(client_side: trio.SocketStream) -> None:
            broker_side = await trio.open_tcp_stream(*broker.address)
            async with broker_side, trio.open_nursery() as nursery:
                nursery.start_soon(pipe, client_side, broker_side, False)
                nursery.start_soon(pipe, broker_side, client_side, True)

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, proxy, 0)
            port = listeners[0].socket.getsockname()[1]

            def run() -> str:
                client = BlockingClient(f"127.0.0.1:{port}", ssl_context=pki.client())
                client.publish("t", b"x", timeout=TIMEOUT)
                client.flush(timeout=TIMEOUT)
                client.publish("t", b"pending")  # batched, not written yet
                trio.from_thread.run_sync(corrupt.set)
                try:
                    # The broker's next heartbeat arrives corrupted.
                    for _ in range(100):
                        client.flush(timeout=TIMEOUT)
                        client.publish("t", b"more", timeout=TIMEOUT)
                    raise AssertionError("the corruption went unnoticed")
                except ConnectionLost as error:
                    assert client._sock is None
                    with pytest.raises(ConnectionLost):
                        client.close()
                    return str(error)

            reason = await trio.to_thread.run_sync(run)
            assert "TLS error" in reason
            nursery.cancel_scope.cancel()


async def test_an_error_raised_while_cancelled_is_not_replaced_by_the_cancellation(
    pki: Pki,
) -> None:
    """Closing the client's stream checkpoints; unshielded, a cancellation
    around the block replaced the block's own error with Cancelled."""
    async with running_broker(tls_config(pki)) as broker:
        # Cancelled once connected (TCP, TLS and Hello take what they take).
        with (
            pytest.RaisesGroup(ValueError, allow_unwrapped=True, flatten_subgroups=True),
            trio.CancelScope() as scope,
        ):
            async with open_client(url(broker), ssl_context=pki.client()):
                try:
                    scope.cancel()
                    await trio.sleep(TIMEOUT)
                finally:
                    raise ValueError("raised while being cancelled")
        await wait_idle(broker)
