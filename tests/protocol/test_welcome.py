"""The client's side of Welcome (issue 18): a refused Welcome changes
nothing (item 14), and a resumed one says which subscriptions survive, so
that a subscription the broker ended is dropped instead of restored (item 16)."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest

from broker.protocol import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    Connection,
    ConnectionClosed,
    DeliverReceived,
    GoodbyeCode,
    HandleType,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
    SubscriptionDropped,
    Welcome,
    WelcomeReceived,
)
from broker.protocol.connection import ClientSessionState
from broker.protocol.frames import decode_body, encode

from .pair import EPOCH, SESSION, ConnectionPair, of
from .test_resume import reconnect

# ==================================================================== the new key on the wire

_MISSING = object()


def resumed_welcome(**changes: Any) -> Welcome:
    welcome = Welcome(
        PROTOCOL_VERSION, SESSION, True, EPOCH, 15_000, 5_000, DEFAULT_MAX_FRAME, {0: 3}, (1, 2)
    )
    return dataclasses.replace(welcome, **changes)


def test_a_resumed_welcome_may_say_which_subscriptions_survive() -> None:
    for welcome in (resumed_welcome(), resumed_welcome(subscriptions=(1,))):
        assert decode_body(encode(welcome)[4:]) == welcome
    # Without the key (an older broker, or nothing ended) it is the Welcome as before.
    assert b"subscriptions" not in encode(resumed_welcome())


def test_a_welcome_may_say_that_sequence_numbers_are_offsets() -> None:
    for resumed in (True, False):
        welcome = resumed_welcome(offsets=True, resumed=resumed, bound=(1, 2) if resumed else None)
        assert decode_body(encode(welcome)[4:]) == welcome
    # A broker without topic logs leaves the key out: the Welcome as before.
    assert b"offsets" not in encode(resumed_welcome())
    bad = cbor2.dumps([1, PROTOCOL_VERSION, {**_new_welcome_record(), "offsets": 1}])
    with pytest.raises(RemoteProtocolError, match="offsets"):
        decode_body(bad)


def _new_welcome_record() -> dict[str, Any]:
    return {
        "session": SESSION,
        "resumed": False,
        "epoch": EPOCH,
        "lease_ms": 1,
        "heartbeat_ms": 1,
        "max_frame": 1024,
        "received": {},
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"subscriptions": [1, 0]},  # not ascending
        {"subscriptions": [1, 1]},  # a repeat
        {"subscriptions": [-1]},
        {"subscriptions": {1: 1}},
        {"subscriptions": None},
        {"resumed": False, "subscriptions": [], "bound": _MISSING},  # a new session says neither
    ],
)
def test_a_malformed_subscriptions_key_is_refused(fields: dict[str, Any]) -> None:
    record: dict[str, Any] = {
        "session": SESSION,
        "resumed": True,
        "epoch": EPOCH,
        "lease_ms": 1,
        "heartbeat_ms": 1,
        "max_frame": 1024,
        "received": {},
        "bound": [0, 2],
    }
    record.update(fields)
    record = {key: value for key, value in record.items() if value is not _MISSING}
    with pytest.raises(RemoteProtocolError, match="malformed"):
        decode_body(cbor2.dumps([1, 1, record]))


# ==================================================================== item 14


def resuming_client() -> tuple[Connection, ClientSessionState]:
    """A client that resumes a session with topic 0 (3 publishes sent, none
    confirmed) and subscriptions 0 and 1, its Hello sent."""
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    for handle in range(2):
        assert pair.client.subscribe(topic) == handle
    for _ in range(3):
        pair.client.publish(topic, b"m")
    pair.run()
    state = pair.client.session_state()
    assert isinstance(state, ClientSessionState)
    client = Connection(Role.CLIENT, lease=30.0, heartbeat=10.0)
    client.hello("test-client", resume=state)
    client.data_to_send()
    return client, state


@pytest.mark.parametrize(
    ("welcome", "fragment"),
    [
        (resumed_welcome(session=bytes(16)), "did not ask for"),
        (resumed_welcome(bound=None), "'bound'"),
        (resumed_welcome(bound=(2, 2)), "never did"),
        (resumed_welcome(received={0: 4}), "4 publishes received"),
        (resumed_welcome(received={1: 0}), "topic handle 1 is not bound"),
        (resumed_welcome(subscriptions=(5,)), "subscription handle 5"),
        (resumed_welcome(max_frame=10), "unusable"),
        (resumed_welcome(version=2), "version"),
    ],
)
def test_a_refused_welcome_changes_nothing(welcome: Welcome, fragment: str) -> None:
    client, _ = resuming_client()
    events = client.receive_data(encode(welcome), 0.0)
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR and fragment in closed.reason
    assert not of(WelcomeReceived, events)
    # The Welcome that broke a rule took nothing from the broker.
    assert client.welcome_message is None
    assert client.peer_max_frame == DEFAULT_MAX_FRAME
    assert (client.liveness.lease, client.liveness.heartbeat) == (30.0, 10.0)
    assert len(client.topics) == len(client.subscriptions) == 0
    with pytest.raises(LocalProtocolError, match="no session"):
        client.session_state()


def test_a_welcome_that_fits_the_resume_is_taken_whole() -> None:
    client, state = resuming_client()
    events = client.receive_data(encode(resumed_welcome()), 0.0)
    (welcome,) = of(WelcomeReceived, events)
    assert welcome.resent == 0 and client.welcome_message == welcome.welcome
    # The session as it was, but for the publishes the broker received.
    assert client.session_state() == dataclasses.replace(state, retained={0: (3, ())})


# ==================================================================== item 16


def test_a_subscription_the_broker_ended_is_dropped_on_resume() -> None:
    """The broker freed subscription 0; its FreeHandle was lost with the
    connection. On the resume its Welcome lists only subscription 1: the
    client drops 0 (SubscriptionDropped) instead of restoring it, which the
    broker would have refused (Goodbye 1)."""
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    ended, kept = pair.client.subscribe(topic), pair.client.subscribe(topic)
    pair.run()
    pair.broker.free_handle(HandleType.SUBSCRIPTION, ended)
    pair.broker.data_to_send()  # lost with the connection
    new, dropped = reconnect(pair)
    assert dropped == []  # the broker's session had already let it go
    welcome = of(WelcomeReceived, new.client_events)[0].welcome
    assert welcome.subscriptions == (kept,)
    assert of(SubscriptionDropped, new.client_events) == [SubscriptionDropped(ended, "t")]
    new.run()
    new.assert_no_errors()
    assert ended not in new.client.subscriptions and kept in new.client.subscriptions
    state = new.client.session_state()
    assert isinstance(state, ClientSessionState) and set(state.subscriptions) == {kept}
    new.broker.deliver(kept, 1, b"still here")
    new.run()
    assert [e.message.payload for e in of(DeliverReceived, new.client_events)] == [b"still here"]


def test_a_resume_that_ends_nothing_sends_the_welcome_as_before() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.subscribe(topic)
    pair.run()
    new, _ = reconnect(pair)
    assert of(WelcomeReceived, new.client_events)[0].welcome.subscriptions is None
    assert not of(SubscriptionDropped, new.client_events)
    new.run()
    new.assert_no_errors()
