"""The wire checks of pattern subscriptions and Admin requests: a Subscribe
of a pattern that breaks the rule, a DeliverMatched or Matched that does
not fit its subscription, malformed Admin frames."""

from __future__ import annotations

import cbor2
import pytest

from broker.protocol import (
    ConnectionClosed,
    DeliverManyReceived,
    GoodbyeCode,
    Matched,
    Policy,
    RemoteProtocolError,
    Subscribed,
    TopicPattern,
    TopicPatternError,
    check_topic_pattern,
    is_topic_pattern,
)
from broker.protocol.frames import decode_body, encode_deliver_tail

from .pair import ConnectionPair, of


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("a..b", "empty token"),
        (".a", "empty token"),
        ("a.", "empty token"),
        ("a.>.b", "last token"),
        ("orders*", "whole token"),
        ("a.b>", "whole token"),
        ("", "must not be empty"),
        ("a b.*", "space"),
    ],
)
def test_a_subscribe_of_a_bad_pattern_is_refused_naming_the_rule(pattern: str, words: str) -> None:
    with pytest.raises(RemoteProtocolError, match=words):
        decode_body(cbor2.dumps([31, pattern, "reliable", {}]))
    with pytest.raises(TopicPatternError, match=words):
        check_topic_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("orders.*", ["orders.eu", "orders.us", "orders.x"], ["orders", "orders.eu.x"]),
        ("orders.>", ["orders.eu", "orders.eu.new"], ["orders", "ordersx.eu"]),
        ("*.new", ["eu.new"], ["new", "eu.old", "a.eu.new"]),
        (">", ["a", "a.b.c"], []),
        ("a.b", ["a.b"], ["a.c", "a.b.c"]),
        ("*.*", ["a.b"], ["a", "a.b.c"]),
    ],
)
def test_matching(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    compiled = TopicPattern(pattern)
    for name in matching:
        assert compiled.matches(name), name
    for name in not_matching:
        assert not compiled.matches(name), name


def test_what_is_a_pattern() -> None:
    assert is_topic_pattern("a.*") and is_topic_pattern(">") and is_topic_pattern("a.*.b")
    assert not is_topic_pattern("a.b") and not is_topic_pattern("a*") and not is_topic_pattern("a>")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([48, 1, "", {}], "1 to 64"),
        ([48, 1, "topics", {"pattern": [1]}], "scalar"),
        ([48, 1, "topics", []], "map"),
        ([49, 1, 0, [[1]], None, ""], "map"),
        ([49, 1, 0, [], 5, ""], "text"),
        ([45, 1, 0, "a b"], "Matched"),
        ([46, 1, 1, 0, 1, b"p", None], "whole"),
    ],
)
def test_malformed_frames_are_refused(body: list[object], words: str) -> None:
    with pytest.raises(RemoteProtocolError, match=words):
        decode_body(cbor2.dumps(body))


def _pattern_pair() -> tuple[ConnectionPair, int, int]:
    """A client subscribed to ``orders.*`` and to topic ``t`` (both bound)."""
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=100_000), deliver_many=True)
    topic = pair.client.bind_topic("t")
    pair.run()
    plain = pair.client.subscribe(topic)
    pattern = pair.client.subscribe_pattern("orders.*", "reliable", {"from": -5})
    pair.run()
    pair.assert_no_errors()
    subscribed = of(Subscribed, pair.broker_events)
    assert [(s.topic, s.topic_name, s.options) for s in subscribed] == [
        (topic, "t", {}),
        (None, "orders.*", {"from": -5}),
    ]
    return pair, plain, pattern


def test_matched_deliveries_reach_the_client_naming_their_topics() -> None:
    pair, _, pattern = _pattern_pair()
    tails = [encode_deliver_tail(b"a", None, None), encode_deliver_tail(b"b", b"k", None)]
    pair.broker.matched(pattern, 0, "orders.eu")
    assert pair.broker.deliver_matched(pattern, 1, tails, 0, 7) == 2
    pair.broker.matched(pattern, 1, "orders.us")
    assert pair.broker.deliver_matched(pattern, 3, tails[:1], 1, 1) == 1
    pair.broker.matched(pattern, 0, None)
    pair.run()
    pair.assert_no_errors()
    matched = of(Matched, pair.client_events)
    assert [(m.match, m.topic) for m in matched] == [(0, "orders.eu"), (1, "orders.us"), (0, None)]
    received = [e.message for e in of(DeliverManyReceived, pair.client_events)]
    assert [(m.first_seq, m.matches, m.offsets) for m in received] == [
        (1, [0, 0], [7, 8]),
        (3, [1], [1]),
    ]


@pytest.mark.parametrize(
    "wrong",
    [
        "unbound match",  # a delivery naming a match no Matched bound
        "not a pattern",  # Matched on a subscription to one topic
        "unbind unbound",  # Matched null of a match never bound
    ],
)
def test_matched_frames_that_do_not_fit_close_the_connection(wrong: str) -> None:
    pair, plain, pattern = _pattern_pair()
    tails = [encode_deliver_tail(b"a", None, None)]
    if wrong == "unbound match":
        pair.broker.deliver_matched(pattern, 1, tails, 3, 1)
    elif wrong == "not a pattern":
        pair.broker.matched(plain, 0, "t")
    else:
        pair.broker.matched(pattern, 4, None)
    pair.run()
    (closing,) = of(ConnectionClosed, pair.client_events)
    assert closing.error is not None and closing.code == GoodbyeCode.PROTOCOL_ERROR
