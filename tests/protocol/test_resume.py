"""Resuming a session on a new connection, sans-IO: nothing lost, nothing twice."""

from __future__ import annotations

import pytest

from broker.protocol import (
    Channel,
    ChannelKind,
    Connection,
    DeliverReceived,
    HelloReceived,
    PublishReceived,
    Role,
    WelcomeReceived,
)
from broker.protocol.connection import BrokerSessionState, ClientSessionState

from .pair import EPOCH, SESSION, ConnectionPair, of


def reconnect(pair: ConnectionPair, *, known: bool = True) -> tuple[ConnectionPair, list[int]]:
    """The same session on a new pair of connections (the wires in between are lost).

    Returns the new pair and the subscription handles the broker dropped.
    """
    client_state = pair.client.session_state()
    broker_state = pair.broker.session_state()
    assert isinstance(client_state, ClientSessionState)
    assert isinstance(broker_state, BrokerSessionState)
    new = ConnectionPair(handshake=False)
    new.client.hello("test-client", resume=client_state)
    events = new.to_broker()
    assert isinstance(events[0], HelloReceived)
    hello = events[0].hello
    assert hello.session == SESSION
    dropped: list[int] = []
    if known:
        restore, dropped = broker_state.for_resume(hello.processed)
        new.broker.welcome(session=SESSION, epoch=EPOCH, restore=restore)
    else:
        new.broker.welcome(session=bytes(16), epoch=b"other")
    new.to_client()
    return new, dropped


def published(pair: ConnectionPair) -> list[bytes]:
    return [e.message.payload for e in of(PublishReceived, pair.broker_events)]


def test_publishes_lost_on_the_wire_are_resent_once_in_order() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sent = [b"m%d" % i for i in range(10)]
    for payload in sent[:6]:
        pair.client.publish(topic, payload)
    pair.to_broker(4)  # four arrive, two are on the wire when it breaks
    pair.wire_to_broker.clear()
    first = published(pair)
    assert first == sent[:4]
    new, _ = reconnect(pair)
    welcome = of(WelcomeReceived, new.client_events)[0]
    assert welcome.welcome.resumed and welcome.welcome.received == {topic: 4}
    assert welcome.resent == 2
    for payload in sent[6:]:
        new.run()
        new.client.publish(topic, payload)
    new.run()
    new.assert_no_errors()
    assert first + published(new) == sent


def test_subscriptions_survive_and_new_binds_are_resent() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    late = pair.client.bind_topic("late")  # its bind is lost with the connection
    pair.flush()
    pair.wire_to_broker.clear()
    new, dropped = reconnect(pair)
    assert dropped == []
    new.run()
    new.assert_no_errors()
    assert new.broker.topics.get(late) is not None and new.broker.topics.get(late).value == "late"
    # Deliveries flow on the restored subscription: the client issued guarantees.
    new.broker.deliver(sub, 1, b"hello")
    new.run()
    assert [e.message.payload for e in of(DeliverReceived, new.client_events)] == [b"hello"]
    assert new.client.room(Channel(ChannelKind.PUBLISH, late)) > 0


def test_unknown_session_is_a_fresh_one() -> None:
    pair = ConnectionPair()
    pair.client.bind_topic("t")
    pair.run()
    new, _ = reconnect(pair, known=False)
    welcome = of(WelcomeReceived, new.client_events)[0]
    assert not welcome.welcome.resumed and welcome.resent == 0
    assert len(new.client.topics) == 0
    new.assert_no_errors()


def test_session_state_needs_a_handshake() -> None:
    from broker.protocol import LocalProtocolError

    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT).session_state()
