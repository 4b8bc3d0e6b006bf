"""``decode_deliver_tail`` reads back what ``encode_deliver_tail`` wrote (what
a worker forwarding a publish to its topic's owner relies on)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import Deliver, Headers, RemoteProtocolError
from broker.protocol._types import LENGTH_PREFIX
from broker.protocol.frames import (
    decode_body,
    decode_deliver_tail,
    encode_deliver,
    encode_deliver_tail,
)

headers = st.none() | st.lists(
    st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3
).map(lambda items: [(name, value) for name, value in items])


@given(st.binary(max_size=300), st.none() | st.binary(max_size=20), headers)
def test_a_tail_reads_back_as_written(
    payload: bytes, key: bytes | None, written: Headers | None
) -> None:
    tail = encode_deliver_tail(payload, key, written)
    read = decode_deliver_tail(tail)
    assert read[:2] == (payload, key)
    assert (read[2] or None) == (written or None)


@pytest.mark.parametrize(
    "tail", [b"", b"\x41", b"\x41x\xf6", b"\x41x\xf6\xf6\xf6", b"\x01\xf6\xf6"]
)
def test_what_is_not_a_tail_is_refused(tail: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_deliver_tail(tail)


def _general(tail: bytes) -> object:
    """What the general decoder reads of ``tail`` (as a Deliver's end), or
    the refusal."""
    head, _ = encode_deliver(0, 1, tail)
    try:
        message = decode_body(head[LENGTH_PREFIX:] + tail)
    except RemoteProtocolError:
        return RemoteProtocolError
    assert isinstance(message, Deliver)
    return message.payload, message.key, message.headers


@given(
    st.binary(max_size=300),
    st.none() | st.binary(max_size=20),
    headers | st.just([("mqtt-qos", b"1")]) | st.just([("n" * 30, b"v" * 300)]),
    st.data(),
)
def test_the_direct_reading_agrees_with_the_general_one(
    payload: bytes, key: bytes | None, written: Headers | None, data: st.DataObject
) -> None:
    """Well formed, garbled or cut short, a tail reads the same both ways."""
    tail = bytearray(encode_deliver_tail(payload, key, written))
    change = data.draw(st.sampled_from(["none", "byte", "cut", "extra"]))
    if change == "byte":
        tail[data.draw(st.integers(0, len(tail) - 1))] = data.draw(st.integers(0, 255))
    elif change == "cut":
        del tail[data.draw(st.integers(0, len(tail) - 1)) :]
    elif change == "extra":
        tail += data.draw(st.binary(min_size=1, max_size=3))
    expected = _general(bytes(tail))
    try:
        read: object = decode_deliver_tail(bytes(tail))
    except RemoteProtocolError:
        read = RemoteProtocolError
    assert read == expected
