"""Staged topic handles, Commit, Abort and Outcome, sans-IO."""

from __future__ import annotations

import pytest

from broker.protocol import (
    Abort,
    Commit,
    ConnectionClosed,
    GoodbyeCode,
    LocalProtocolError,
    Outcome,
    OutcomeStatus,
    PublishReceived,
    Stage,
    Subscribe,
    TopicBound,
)
from broker.protocol.connection import ClientSessionState
from broker.protocol.frames import encode

from .pair import ConnectionPair, of
from .test_resume import reconnect

STAGE = Stage("job-7", "3/1")


def test_a_staged_bind_reaches_the_broker_with_its_stage() -> None:
    pair = ConnectionPair()
    plain = pair.client.bind_topic("t")
    staged = pair.client.bind_topic("t", STAGE)
    pair.run()
    bound = of(TopicBound, pair.broker_events)
    assert [(b.handle, b.name, b.stage) for b in bound] == [
        (plain, "t", None),
        (staged, "t", STAGE),
    ]
    assert pair.client.stage_of(staged) == pair.broker.stage_of(staged) == STAGE
    assert pair.client.stage_of(plain) is None
    pair.client.publish(staged, b"held")
    pair.run()
    (received,) = of(PublishReceived, pair.broker_events)
    assert received.channel.index == staged


def test_a_staged_handle_cannot_be_subscribed_to() -> None:
    pair = ConnectionPair()
    staged = pair.client.bind_topic("t", STAGE)
    pair.run()
    with pytest.raises(LocalProtocolError, match="staged"):
        pair.client.subscribe(staged)
    # A client that sends one anyway is cut off with a protocol error.
    pair.wire_to_broker.append(encode(Subscribe(staged)))
    events = pair.to_broker()
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    assert "staged" in closed.reason


def test_commit_abort_and_outcome_pass_through_in_order() -> None:
    pair = ConnectionPair()
    first = pair.client.commit("job-7", [("0/0", 10), ("1/2", 0)])
    second = pair.client.abort("job-8")
    assert second == first + 1
    pair.run()
    requests = [e for e in pair.broker_events if isinstance(e, Commit | Abort)]
    assert requests == [Commit(first, "job-7", [("0/0", 10), ("1/2", 0)]), Abort(second, "job-8")]
    pair.broker.outcome(first, OutcomeStatus.COMMITTED, 10)
    pair.broker.outcome(second, OutcomeStatus.ABORTED, 0, "nothing staged")
    pair.run()
    assert of(Outcome, pair.client_events) == [
        Outcome(first, 0, 10, ""),
        Outcome(second, 2, 0, "nothing staged"),
    ]


def test_each_side_sends_only_its_own_staging_messages() -> None:
    pair = ConnectionPair()
    with pytest.raises(LocalProtocolError):
        pair.broker.commit("b", [])
    with pytest.raises(LocalProtocolError):
        pair.client.outcome(1, 0, 0)
    pair.wire_to_client.append(encode(Commit(1, "b", [])))
    (closed,) = of(ConnectionClosed, pair.to_client())
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    other = ConnectionPair()
    other.wire_to_broker.append(encode(Outcome(1, 0, 0)))
    (closed,) = of(ConnectionClosed, other.to_broker())
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR


def test_a_resumed_session_keeps_its_stages_and_resends_staged_binds() -> None:
    pair = ConnectionPair()
    known = pair.client.bind_topic("t", STAGE)
    pair.run()
    lost = pair.client.bind_topic("u", Stage("job-7", "4/0"))
    pair.client.publish(known, b"a")
    pair.flush()
    pair.wire_to_broker.clear()  # the bind of "u" and the publish are lost
    state = pair.client.session_state()
    assert isinstance(state, ClientSessionState)
    assert state.stages == {known: STAGE, lost: Stage("job-7", "4/0")}
    new, _ = reconnect(pair)
    assert new.broker.stage_of(known) == STAGE
    new.run()
    bound = of(TopicBound, new.broker_events)
    assert [(b.handle, b.name, b.stage) for b in bound] == [(lost, "u", Stage("job-7", "4/0"))]
    assert [e.message.payload for e in of(PublishReceived, new.broker_events)] == [b"a"]
    assert new.client.stage_of(lost) == new.broker.stage_of(lost) == Stage("job-7", "4/0")
