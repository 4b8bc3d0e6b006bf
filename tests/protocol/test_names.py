"""The topic-name rule: what it accepts and refuses, how it says so, and
that both ends of a connection enforce it before anything changes."""

from __future__ import annotations

import unicodedata
from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import (
    MAX_TOPIC_NAME,
    TOPIC_BINDS,
    BindTopic,
    ConnectionClosed,
    Goodbye,
    GoodbyeCode,
    Stage,
    TopicBound,
    TopicNameError,
    check_topic_name,
    topic_name_problem,
    topic_pattern_problem,
)
from broker.protocol.frames import decode_body, encode
from tests.hypothesis_profiles import examples

from .pair import ConnectionPair, of, split_frames

#: The general categories a name may use: letters, marks, numbers,
#: punctuation, symbols.
ALLOWED_CATEGORIES = ("L", "M", "N", "P", "S")

BAD_NAMES = {
    "empty": ("", "must not be empty"),
    "NUL": ("a\x00b", "U+0000 (a control character, Cc)"),
    "newline": ("news\n", "U+000A (a control character, Cc)"),
    "bidi override": ("abc\u202edef", "U+202E (a format character, Cf)"),
    "zero-width joiner": ("a\u200db", "U+200D (a format character, Cf)"),
    "space": ("two words", "U+0020 (a space, Zs)"),
    "no-break space": ("a\u00a0b", "U+00A0 (a space, Zs)"),
    "line separator": ("a\u2028b", "U+2028 (a line separator, Zl)"),
    "surrogate": ("a\ud800", "U+D800 (a surrogate, Cs)"),
    "private use": ("\ue000", "U+E000 (a private-use character, Co)"),
    "unassigned": ("\u0378", "U+0378 (an unassigned code point, Cn)"),
    "not NFC": ("cafe\u0301", "not in Unicode NFC form"),
    "256 bytes": ("x" * 256, "too long"),
    "20 KB": ("x" * 20_000, "too long: 20000 characters"),
    "255 characters, 510 bytes": ("é" * 255, "too long: 510 bytes of UTF-8"),
}

GOOD_NAMES = [
    "a",
    "prices",
    "orders.eu-west-1",
    "a/b/c:d#e",
    "x" * MAX_TOPIC_NAME,
    "é" * (MAX_TOPIC_NAME // 2),
    "Bestellungen.Österreich",
    "価格",
    "émoji-🎉",
    "[*?]",
]


def reference_problem(name: str) -> bool:
    """The rule, written out independently of the implementation."""
    if not all(unicodedata.category(c)[0] in ALLOWED_CATEGORIES for c in name):
        return True
    size = len(name.encode())
    return not 1 <= size <= MAX_TOPIC_NAME or unicodedata.normalize("NFC", name) != name


# ==================================================================== the rule


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_names_pass(name: str) -> None:
    assert topic_name_problem(name) is None
    check_topic_name(name)


@pytest.mark.parametrize(("name", "says"), BAD_NAMES.values(), ids=list(BAD_NAMES))
def test_invalid_names_are_refused_with_one_line_naming_the_rule(name: str, says: str) -> None:
    with pytest.raises(TopicNameError) as raised:
        check_topic_name(name)
    message = str(raised.value)
    assert says in message
    assert message.isascii() and message.isprintable(), message  # one safe line
    assert len(message) <= 180  # fits a Goodbye reason with its prefix
    assert isinstance(raised.value, ValueError)


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(TopicNameError, match="must be a str, not bytes"):
        check_topic_name(b"prices")


@settings(deadline=None, max_examples=examples(500))
@given(st.text(max_size=300))
def test_the_rule_matches_its_definition(name: str) -> None:
    assert (topic_name_problem(name) is not None) == reference_problem(name)


@settings(deadline=None, max_examples=examples(300))
@given(
    st.text(
        alphabet=st.characters(categories=["L", "M", "N", "P", "S"]),  # type: ignore[list-item]
        min_size=1,
        max_size=60,
    )
)
def test_every_nfc_name_of_allowed_characters_within_the_limit_passes(text: str) -> None:
    name = unicodedata.normalize("NFC", text)
    if len(name.encode()) <= MAX_TOPIC_NAME:
        assert topic_name_problem(name) is None


@settings(deadline=None, max_examples=examples(300))
@given(st.text(min_size=1, max_size=2000))
def test_a_complaint_never_echoes_the_name(name: str) -> None:
    problem = topic_name_problem(name)
    if problem is not None:
        assert problem.isascii() and problem.isprintable()
        assert len(problem) <= 180


# ==================================================================== patterns


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("", "must not be empty"),
        ("news\n*", "U+000A"),
        ("a b*", "U+0020"),
        ("\u202e*", "U+202E"),
        ("cafe\u0301*", "not in Unicode NFC form"),
        ("x" * 256, "256 bytes or more"),
        ("x" * 200 + "?" * 56 + "*", "256 bytes or more"),
        ("x" * 255 + "[ab]", "256 bytes or more"),
    ],
)
def test_patterns_that_could_never_match_are_refused(pattern: str, says: str) -> None:
    problem = topic_pattern_problem(pattern)
    assert problem is not None and says in problem


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("*", "prices"),
        ("events.*", "events.eu"),
        ("x" * 255, "x" * 255),
        ("x" * 254 + "*", "x" * 255),
        ("[!]]*", "a"),
        ("[abc", "[abc"),  # no closing bracket: a literal
        ("[" + "x" * 300 + "]", "x"),  # a set is one character
        ("é?", "éa"),
    ],
)
def test_patterns_that_can_match_are_kept(pattern: str, matches: str) -> None:
    assert topic_pattern_problem(pattern) is None
    assert topic_name_problem(matches) is None and fnmatchcase(matches, pattern)


# ==================================================================== both ends


def test_a_client_binding_a_bad_name_raises_and_sends_nothing() -> None:
    pair = ConnectionPair()
    before = (pair.client.bytes_to_send, pair.client.topics.next_handle, pair.client.frames_sent)
    for name, _ in BAD_NAMES.values():
        with pytest.raises(TopicNameError):
            pair.client.bind_topic(name)
    after = (pair.client.bytes_to_send, pair.client.topics.next_handle, pair.client.frames_sent)
    assert after == before
    assert pair.client.bind_topic("fine") == 0  # the connection is still usable
    pair.run()
    pair.assert_no_errors()


def _broker_receives_raw(pair: ConnectionPair, data: bytes) -> list[object]:
    events = pair.broker.receive_data(data, pair.now)
    pair.flush()
    return list(events)


#: What a client can put on the wire (UTF-8 cannot carry a surrogate).
WIRE_BAD_NAMES = {k: v for k, v in BAD_NAMES.items() if k != "surrogate"}


@pytest.mark.parametrize(("name", "says"), WIRE_BAD_NAMES.values(), ids=list(WIRE_BAD_NAMES))
def test_the_broker_answers_a_bad_name_with_goodbye_1_and_binds_nothing(
    name: str, says: str
) -> None:
    pair = ConnectionPair()
    good = encode(BindTopic("fine"))
    bad = encode(BindTopic(name), max_frame=1 << 20)
    assert decode_body(bad[4:]) == BindTopic(name)  # the codec itself lets it through
    events = _broker_receives_raw(pair, good + bad)
    # The frame before the bad one stays applied; the bad one changes nothing.
    assert [e.name for e in of(TopicBound, events)] == ["fine"]
    assert pair.broker.topics.next_handle == 1
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    assert closed.reason.startswith("BindTopic: ") and says in closed.reason
    assert pair.broker.closed
    goodbyes = [m for m in (decode_body(f[4:]) for f in pair.wire_to_client) if type(m) is Goodbye]
    assert [(g.code, g.reason) for g in goodbyes] == [(1, closed.reason)]


def test_the_broker_checks_a_staged_bind_too() -> None:
    pair = ConnectionPair()
    events = _broker_receives_raw(pair, encode(BindTopic("a\nb", Stage("batch", "m"))))
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR and "U+000A" in closed.reason
    assert not of(TopicBound, events)


def test_an_encoded_surrogate_is_malformed_text() -> None:
    pair = ConnectionPair()
    body = bytes([0x82, 0x18, 0x1E, 0x63, 0xED, 0xA0, 0x80])  # [30, "\ud800" as bytes]
    events = _broker_receives_raw(pair, len(body).to_bytes(4, "big") + body)
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR and not of(TopicBound, events)


def test_a_bad_bind_takes_no_guarantee_bytes() -> None:
    """The refused frame is not counted against the bind channel either."""
    pair = ConnectionPair()
    receiver = pair.broker.receiver(TOPIC_BINDS)
    buffered = receiver.buffered
    frames = split_frames(encode(BindTopic("")))
    _broker_receives_raw(pair, frames[0])
    assert receiver.buffered == buffered
