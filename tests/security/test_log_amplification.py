"""Client input in the broker's log: cut short, escaped, and rate-limited per
client address, so that no client makes the log grow faster than a few small
lines a second."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.config import BrokerConfig
from broker.protocol import GoodbyeCode
from broker.server._peer_logging import LINE_CHARS, LOG_BURST, LOG_RATE, SHOWN_CHARS, PeerLog, shown
from tests.server.helpers import TIMEOUT, make_config, running_broker, url, wait_until

AUTH_FILE = """
[principals.narrow]
token = "narrow-token"
publish = ["allowed.*"]
subscribe = ["allowed.*"]
"""
#: A long topic name that still follows the rule (at most 255 bytes), with
#: room for a prefix.
LONG_NAME = "x" * 240


@pytest.fixture
def auth_config(tmp_path: Path) -> BrokerConfig:
    path = tmp_path / "auth.toml"
    path.write_text(AUTH_FILE)
    return make_config(auth_file=str(path))


def test_client_text_is_cut_and_escaped() -> None:
    assert shown("news") == "'news'"
    cut = shown("y" * 10_000)
    assert cut == repr("y" * SHOWN_CHARS) + "... (10000 characters)"
    assert shown(b"\x00" * 100).endswith("... (100 bytes)")
    for sneaky in ("a\nFAKE LOG LINE", "bidi \u202eevil", "nul\x00", "esc\x1b[2J"):
        assert all(ch.isprintable() for ch in shown(sneaky)), sneaky
    assert shown(None) == "None"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_address_gets_a_burst_then_a_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.peerlog")
    clock = Clock()
    peer_log = PeerLog(logging.getLogger("test.peerlog"), clock)
    for i in range(LOG_BURST + 100):
        peer_log.info("10.0.0.1:1000", "line %d", i)
    assert len(caplog.records) == LOG_BURST
    assert peer_log.suppressed_total == 100
    peer_log.info("10.0.0.2:1000", "another address")  # has its own burst
    assert caplog.records[-1].getMessage() == "another address"
    clock.now += 1.0  # LOG_RATE more lines may go out
    for i in range(20):
        peer_log.info("10.0.0.1:2000", "later %d", i)
    assert len(caplog.records) == LOG_BURST + 1 + int(LOG_RATE)
    first_later = caplog.records[LOG_BURST + 1].getMessage()
    assert first_later == "later 0 (100 more lines from 10.0.0.1 not logged)"


def test_a_line_is_never_longer_than_the_limit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.peerlog")
    peer_log = PeerLog(logging.getLogger("test.peerlog"), Clock())
    peer_log.warning("[::1]:5", "%s", "z" * 100_000)
    assert len(caplog.records[0].getMessage()) < LINE_CHARS + 40


def test_the_address_table_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.peerlog")
    peer_log = PeerLog(logging.getLogger("test.peerlog"), Clock(), addresses=100)
    for i in range(1000):
        peer_log.info(f"10.0.{i // 256}.{i % 256}:1", "hello")
    assert len(peer_log._buckets) == 100


async def test_a_denied_topic_name_is_logged_short(
    auth_config: BrokerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A client denied a 240-character topic name: the log holds a few
    short lines, each showing at most the name's first characters."""
    caplog.set_level(logging.INFO, logger="broker.server")
    async with running_broker(auth_config) as broker:
        caplog.clear()
        with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost) as caught:
            async with open_client(url(broker), token="narrow-token") as client:
                await client.publish(LONG_NAME, b"x")
                await client.flush()
        assert caught.value.code == GoodbyeCode.NOT_AUTHORISED
        assert len(caught.value.reason) < SHOWN_CHARS + 100  # the Goodbye's reason too
        logged = [record.getMessage() for record in caplog.records]
        assert any("may not use topic 'xxxx" in line for line in logged), logged
        assert not any(LONG_NAME in line for line in logged), logged
        assert "x" * (SHOWN_CHARS + 1) not in caught.value.reason


async def test_one_client_cannot_flood_the_log(
    auth_config: BrokerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Denied again and again: the lines logged for its address stay within
    the burst and the rate, however fast it tries."""
    caplog.set_level(logging.INFO, logger="broker.server")
    async with running_broker(auth_config) as broker:
        caplog.clear()
        started = trio.current_time()
        attempts = 60
        for _ in range(attempts):
            with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost):
                async with open_client(url(broker), token="narrow-token") as client:
                    await client.publish(f"denied.{LONG_NAME}", b"x")
                    await client.flush()
        await wait_until(lambda: not broker.connections)  # each logged its end
        elapsed = trio.current_time() - started
        lines = len(caplog.records)
        assert lines <= LOG_BURST + LOG_RATE * elapsed + 1
        # Each attempt would log at least three lines (hello, denied, closed).
        assert broker.peer_log.suppressed_total >= 3 * attempts - lines
        assert sum(len(record.getMessage()) for record in caplog.records) < 300 * lines
