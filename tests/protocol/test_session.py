"""Handshake, heartbeats, leases and resume bookkeeping (time is a parameter)."""

from __future__ import annotations

import pytest

from broker.protocol import (
    PROTOCOL_VERSION,
    BindTopic,
    Connection,
    ConnectionClosed,
    ConnectionState,
    GoodbyeCode,
    Hello,
    HelloReceived,
    LocalProtocolError,
    Ping,
    Pong,
    PublishReceived,
    Role,
    Welcome,
    WelcomeReceived,
)
from broker.protocol.connection import Liveness
from broker.protocol.frames import encode

from .pair import EPOCH, SESSION, ConnectionPair


def test_handshake_states_and_parameters() -> None:
    pair = ConnectionPair(handshake=False)
    assert pair.client.state is ConnectionState.IDLE
    with pytest.raises(LocalProtocolError):
        pair.client.bind_topic("too early")
    pair.client.hello("me", session=b"s" * 16, processed={3: 41})
    assert pair.client.state is ConnectionState.AWAIT_WELCOME
    with pytest.raises(LocalProtocolError):
        pair.client.hello("twice")
    events = pair.to_broker()
    assert events == [HelloReceived(Hello(PROTOCOL_VERSION, "me", b"s" * 16, {3: 41}))]
    with pytest.raises(LocalProtocolError, match="16 bytes"):
        pair.broker.welcome(session=b"short", epoch=EPOCH)
    with pytest.raises(LocalProtocolError, match="restore"):
        pair.broker.welcome(session=SESSION, epoch=EPOCH, resumed=True)
    pair.broker.welcome(session=SESSION, epoch=EPOCH, lease_ms=9000, heartbeat_ms=3000)
    events = pair.to_client(1)
    assert isinstance(events[0], WelcomeReceived)
    welcome = events[0].welcome
    assert (welcome.resumed, welcome.epoch, welcome.received) == (False, EPOCH, {})
    assert pair.client.state is pair.broker.state is ConnectionState.OPEN
    assert (pair.client.liveness.lease, pair.client.liveness.heartbeat) == (9.0, 3.0)
    assert pair.client.peer_max_frame == pair.broker.max_frame


def test_receiving_before_hello_is_a_local_error() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.receive_data(b"\x00", 0.0)


@pytest.mark.parametrize(
    ("first", "fragment"),
    [
        (Ping(1), "before the handshake"),
        (BindTopic("x"), "before the handshake"),
        (Hello(PROTOCOL_VERSION + 1, "future", None, {}), "unsupported protocol version"),
    ],
)
def test_the_broker_requires_a_hello_of_its_version_first(first: object, fragment: str) -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(encode(first), 0.0)  # type: ignore[arg-type]
    assert isinstance(events[-1], ConnectionClosed)
    assert fragment in events[-1].reason and events[-1].code == GoodbyeCode.PROTOCOL_ERROR
    assert broker.closed


def test_a_client_frame_before_welcome_is_refused() -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(encode(Hello(PROTOCOL_VERSION, "c", None, {})), 0.0)
    assert isinstance(events[0], HelloReceived)
    events = broker.receive_data(encode(BindTopic("eager")), 0.0)
    assert isinstance(events[-1], ConnectionClosed)


def test_a_second_welcome_is_a_protocol_error() -> None:
    pair = ConnectionPair()
    welcome = Welcome(PROTOCOL_VERSION, SESSION, False, EPOCH, 1000, 100, 1 << 20, {})
    events = pair.client.receive_data(encode(welcome), 0.0)
    assert isinstance(events[-1], ConnectionClosed) and "unexpected Welcome" in events[-1].reason


def test_ping_is_answered_with_the_same_nonce() -> None:
    pair = ConnectionPair()
    nonce = pair.client.ping()
    pair.run()
    assert Pong(nonce) in pair.client_events


def test_goodbye_closes_both_sides_cleanly() -> None:
    pair = ConnectionPair()
    pair.client.goodbye(GoodbyeCode.NORMAL, "done")
    assert pair.client.closed
    pair.run()
    assert pair.broker_events[-1] == ConnectionClosed(0, "done", True)
    assert pair.broker.closed
    assert pair.broker.receive_data(encode(Ping(1)), 0.0) == []


def test_heartbeat_is_due_only_after_a_silent_interval() -> None:
    liveness = Liveness(heartbeat=5.0, lease=15.0)
    assert not liveness.ping_due(4.9)
    assert liveness.ping_due(5.0)
    liveness.on_sent(4.0)  # any frame sent resets the heartbeat
    assert not liveness.ping_due(8.9) and liveness.ping_due(9.0)
    assert liveness.next_deadline() == 9.0


def test_lease_expires_after_silence_and_any_frame_renews_it() -> None:
    liveness = Liveness(heartbeat=5.0, lease=15.0)
    assert not liveness.peer_gone(14.9) and liveness.peer_gone(15.0)
    liveness.on_received(10.0)
    assert not liveness.peer_gone(24.9) and liveness.peer_gone(25.0)
    assert liveness.silence(20.0) == 10.0


def test_time_spent_not_reading_does_not_count_against_the_lease() -> None:
    liveness = Liveness(heartbeat=5.0, lease=15.0)
    liveness.suspend(10.0)  # the broker stops reading: its account is in debt
    assert not liveness.peer_gone(100.0)
    assert liveness.silence(100.0) == 10.0
    liveness.resume(100.0)
    assert liveness.silence(104.0) == 14.0
    assert not liveness.peer_gone(104.9) and liveness.peer_gone(105.0)


def test_connection_liveness_follows_frames_in_and_out() -> None:
    pair = ConnectionPair()
    pair.now = 3.0
    pair.client.ping()
    pair.run()  # the client sent at 3.0, the broker heard at 3.0 and answered
    client = pair.client
    assert client.ping_due(client.liveness.heartbeat + 3.0)
    assert not client.ping_due(client.liveness.heartbeat + 2.9)
    assert not pair.broker.peer_gone(3.0 + pair.broker.liveness.lease - 0.1)
    assert pair.broker.peer_gone(3.0 + pair.broker.liveness.lease)
    assert client.next_deadline() == 3.0 + client.liveness.heartbeat


def test_resume_bookkeeping_counts_publishes_and_processed_sequences() -> None:
    pair = ConnectionPair()
    a = pair.client.bind_topic("a")
    b = pair.client.bind_topic("b")
    pair.run()
    for _ in range(3):
        pair.client.publish(a, b"x")
    pair.client.publish(b, b"y")
    pair.run()
    assert pair.broker.publishes_received == {a: 3, b: 1}
    for event in pair.broker_events:
        if isinstance(event, PublishReceived):
            pair.broker.release(event)
    sub = pair.client.subscribe(a)
    pair.run()
    pair.client.ack(sub, 5)
    pair.client.ack(sub, 5)  # repeating is fine: cumulative
    with pytest.raises(LocalProtocolError, match="never go back"):
        pair.client.ack(sub, 4)
    assert pair.client.processed == {sub: 5}


def test_ping_needs_an_open_connection() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.ping()
    client.hello("c")
    with pytest.raises(LocalProtocolError):
        client.ping()  # the broker would refuse a Ping before Welcome


def test_handle_timer_pings_once_per_heartbeat_and_nothing_before() -> None:
    pair = ConnectionPair()
    client = pair.client
    heartbeat = client.liveness.heartbeat
    assert client.handle_timer(heartbeat - 0.1) == []
    assert client.bytes_to_send == 0
    assert client.handle_timer(heartbeat) == []
    queued = client.bytes_to_send
    assert queued > 0  # a Ping
    assert client.handle_timer(heartbeat + 0.1) == []  # counted as sent at once
    assert client.bytes_to_send == queued
    assert client.next_deadline() == min(2 * heartbeat, client.liveness.lease)


def test_handle_timer_closes_a_connection_whose_peer_went_silent() -> None:
    pair = ConnectionPair()
    broker = pair.broker
    lease = broker.liveness.lease
    broker.suspend_reading(1.0)  # not reading: the silence does not count
    assert broker.handle_timer(lease + 50.0) == [] and not broker.closed
    broker.resume_reading(51.0)
    events = broker.handle_timer(lease + 50.0)
    assert events == [ConnectionClosed(int(GoodbyeCode.LEASE_EXPIRED), "lease expired", False)]
    assert broker.closed and broker.handle_timer(lease + 99.0) == []
    pair.run()
    assert pair.client_events[-1] == ConnectionClosed(
        int(GoodbyeCode.LEASE_EXPIRED), "lease expired", True
    )


def test_handle_timer_before_the_hello_says_so_and_never_pings() -> None:
    broker = Connection(Role.BROKER, lease=10.0, heartbeat=3.0)
    assert broker.handle_timer(3.0) == [] and broker.bytes_to_send == 0
    (closed,) = broker.handle_timer(10.0)
    assert isinstance(closed, ConnectionClosed) and closed.reason == "no Hello in time"
    client = Connection(Role.CLIENT, lease=10.0)
    client.hello("c")
    assert client.handle_timer(10.0)[0].reason == "broker silent"
