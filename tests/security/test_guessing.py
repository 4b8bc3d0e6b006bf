"""Per client address: a bound on connections not welcomed yet, and a
growing delay before each failed authentication is answered (token guessing
slows to a crawl). Both in bounded memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.config import BrokerConfig, ConfigError
from broker.protocol import PROTOCOL_VERSION, GoodbyeCode, Hello, Welcome
from broker.server import Broker
from broker.server._peers import FAILURES_REMEMBERED, AddressTable, address_key
from tests.server.helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until

AUTH_FILE = """
[principals.app]
token = "the-right-token"
"""


@pytest.fixture
def auth_file(tmp_path: Path) -> str:
    path = tmp_path / "auth.toml"
    path.write_text(AUTH_FILE)
    return str(path)


def test_an_address_is_a_host_or_an_ipv6_64() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9")
    assert address_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("?") == "?"


def test_failures_from_an_address_are_answered_ever_later() -> None:
    table = AddressTable(0, 0.5, 10.0)
    delays = [table.failed("192.0.2.7", float(t)) for t in range(7)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert table.failed("192.0.2.8", 7.0) == 0.5  # another address: its own count
    # A quiet minute and the address starts again.
    assert table.failed("192.0.2.7", 6.0 + 61.0) == 0.5


def test_no_delay_when_it_is_switched_off() -> None:
    assert AddressTable(0, 0.0, 0.0).failed("192.0.2.7", 0.0) == 0.0


def test_the_failure_table_is_bounded() -> None:
    def host(i: int) -> str:
        return f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"

    table = AddressTable(0, 0.5, 10.0)
    for i in range(FAILURES_REMEMBERED + 500):
        table.failed(host(i), 0.0)
    assert table.addresses_remembered == FAILURES_REMEMBERED
    assert table.failures(host(0)) == 0  # the oldest went first
    assert table.failures(host(FAILURES_REMEMBERED + 499)) == 1


def test_the_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_unwelcomed_per_address"):
        BrokerConfig(max_unwelcomed_per_address=-1)
    with pytest.raises(ConfigError, match="auth_failure_delay"):
        BrokerConfig(auth_failure_delay=5.0, auth_failure_delay_max=1.0)


async def _connect_from(broker: Broker, source: str) -> RawClient:
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream(*broker.address, local_address=source)
    return RawClient(stream, max_frame=broker.config.max_frame)


async def test_one_address_cannot_hold_every_slot_before_hello() -> None:
    """An address that opens connections and never says Hello holds at most
    ``max_unwelcomed_per_address`` of them once the broker is half full
    (here: 5 of 10): clients from elsewhere get in."""
    config = make_config(max_connections=10, max_unwelcomed_per_address=3)
    async with running_broker(config) as broker, trio.open_nursery() as nursery:
        squatters = [await _connect_from(broker, "127.0.0.1") for _ in range(10)]
        for client in squatters:
            client.start_reading(nursery)
        await wait_until(lambda: sum(client.eof for client in squatters) == 5)
        # Another address is served...
        other = await _connect_from(broker, "127.0.0.2")
        await other.handshake("legit")
        refused = [client for client in squatters if client.eof]
        for client in refused:
            assert client.goodbye_code() == GoodbyeCode.LIMIT_EXCEEDED
            assert "before Hello" in client.goodbyes()[0].reason
        assert broker.peers.refused_total == 5
        # ...and so is this one, once it has fewer than three unwelcomed.
        kept = [client for client in squatters if not client.eof]
        for client in kept[:3]:
            await client.hello("late but fine")
            await client.wait_for_message(Welcome)
        again = await _connect_from(broker, "127.0.0.1")
        await again.handshake("again")
        for client in (*squatters, other, again):
            await client.aclose()
        nursery.cancel_scope.cancel()


async def _refused_after(broker: Broker, token: str) -> float:
    """Connect with ``token``, expect Goodbye 6, return how long it took."""
    started = trio.current_time()
    with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
        async with open_client(url(broker), token=token):
            pass  # pragma: no cover - refused at Hello
    assert caught.value.code == GoodbyeCode.NOT_AUTHORISED
    return trio.current_time() - started


async def test_each_failed_token_is_answered_later_than_the_last(auth_file: str) -> None:
    config = make_config(auth_file=auth_file, auth_failure_delay=0.1, auth_failure_delay_max=0.4)
    async with running_broker(config) as broker:
        took = [await _refused_after(broker, "guess") for _ in range(4)]
        # Lower bounds only: a loaded machine is slower, never faster.
        for spent, delay in zip(took, [0.1, 0.2, 0.4, 0.4], strict=True):
            assert spent >= delay
        assert broker.peers.failures("127.0.0.1") == 4
        assert broker.security.auth_failures["bad_credentials"] == 4


async def test_the_right_token_is_not_held_up_by_guessing_from_its_address(
    auth_file: str,
) -> None:
    config = make_config(auth_file=auth_file, auth_failure_delay=30.0, auth_failure_delay_max=30.0)
    async with running_broker(config) as broker:
        guesser = await RawClient.connect(broker)
        await guesser.send(Hello(PROTOCOL_VERSION, "guesser", token="wrong"))
        await wait_until(lambda: broker.peers.failures("127.0.0.1") == 1)
        with trio.fail_after(TIMEOUT):
            async with open_client(url(broker), token="the-right-token") as client:
                await client.publish("news", b"welcome")
                await client.flush()
        assert not guesser.frames  # its refusal is still held back
        assert not guesser.eof
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.shutdown)  # a shutdown does not wait for it
            await guesser.read_until_eof()
        assert guesser.goodbye_code() == GoodbyeCode.NOT_AUTHORISED
        assert broker.shutdown_cut == 0
        await guesser.aclose()
