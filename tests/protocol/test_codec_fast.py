"""The codec's fast path for Publish and Deliver agrees with the general decoder.

``FrameDecoder`` reads the usual shape of the two message-carrying frames
directly. For any bytes, what it yields must be exactly what the general
(cbor2-based, strict) decoder yields: the same message, or the same refusal.
"""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    U64_MAX,
    Deliver,
    FrameDecoder,
    LocalProtocolError,
    Message,
    Publish,
    RemoteProtocolError,
    decode_body,
    encode,
    encode_deliver,
)
from broker.protocol._codec import _fast_message, _fields, deliver_heads, encode_publish

#: Sizes on both sides of every CBOR length boundary.
_edges = st.sampled_from([0, 1, 23, 24, 255, 256, 300, 65535, 65536])
_uints = st.one_of(
    st.integers(0, 30), st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, U64_MAX])
)
_blobs = st.one_of(st.binary(max_size=40), _edges.map(lambda n: b"p" * n))
_keys = st.none() | _blobs
_messages = st.one_of(
    st.builds(Publish, _uints, _blobs, _keys, st.none()),
    st.builds(Deliver, _uints, _uints, _blobs, _keys, st.none()),
)


def _general(body: bytes) -> Message | str:
    """What the general decoder makes of ``body``: a message, or its refusal."""
    try:
        return decode_body(body)
    except RemoteProtocolError as error:
        return f"refused: {error}"


def _through_decoder(body: bytes) -> Message | str:
    decoder = FrameDecoder(max_frame=1 << 20)
    decoder.feed(struct.pack(">I", len(body)) + body)
    try:
        ((message, size),) = list(decoder.messages())
    except RemoteProtocolError as error:
        return f"refused: {error}"
    assert size == len(body) + 4
    return message


@given(_messages)
def test_fast_path_reads_what_the_general_decoder_reads(message: Publish | Deliver) -> None:
    body = cbor2.dumps(_fields(message))
    assert _fast_message(body, 0, len(body)) == message
    assert _general(body) == message
    assert encode(message, max_frame=1 << 20)[4:] == body


@given(_messages, st.data())
def test_damaged_frames_are_read_alike(message: Publish | Deliver, data: st.DataObject) -> None:
    body = bytearray(cbor2.dumps(_fields(message)))
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(body)))
        if what == "flip" and at < len(body):
            body[at] = data.draw(st.integers(0, 255))
        elif what == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    if not body:
        return
    damaged = bytes(body)
    fast = _fast_message(damaged, 0, len(damaged))
    general = _general(damaged)
    if fast is not None:
        assert fast == general
    assert _through_decoder(damaged) == general


@pytest.mark.parametrize(
    "body",
    [
        # Integers in longer forms than needed (CBOR allows them).
        bytes([0x85, 0x18, 0x20, 0x18, 0x05, 0x41, 0x61, 0xF6, 0xF6]),
        bytes([0x85, 0x18, 0x20, 0x19, 0x00, 0x05, 0x58, 0x01, 0x61, 0xF6, 0xF6]),
        bytes([0x86, 0x18, 0x21, 0x1A, 0, 0, 0, 1, 0x1B, 0, 0, 0, 0, 0, 0, 0, 2, 0x40, 0x40, 0xF6]),
        # With headers: the general way only.
        cbor2.dumps([32, 1, b"x", None, [["h", b"v"]]]),
        # A text payload, a negative handle, a trailing byte, a short frame.
        cbor2.dumps([32, 1, "x", None, None]),
        cbor2.dumps([32, -1, b"x", None, None]),
        cbor2.dumps([32, 1, b"x", None, None]) + b"\x00",
        bytes([0x85, 0x18, 0x20, 0x01, 0x45, 0x61]),
    ],
)
def test_edge_shapes_are_read_alike(body: bytes) -> None:
    fast = _fast_message(body, 0, len(body))
    general = _general(body)
    if fast is not None:
        assert fast == general
    assert _through_decoder(body) == general


def test_the_fast_path_takes_the_usual_frames() -> None:
    """Publish and Deliver without headers are read by the fast path (or the
    point of it is lost); a frame with headers is not."""
    publish = encode(Publish(3, b"x" * 100, b"k"))[4:]
    deliver = encode(Deliver(3, 1000, b"x" * 100))[4:]
    assert _fast_message(publish, 0, len(publish)) == Publish(3, b"x" * 100, b"k")
    assert _fast_message(deliver, 0, len(deliver)) == Deliver(3, 1000, b"x" * 100)
    with_headers = encode(Publish(3, b"x", None, [("a", b"b")]))[4:]
    assert _fast_message(with_headers, 0, len(with_headers)) is None


@given(_uints, _blobs, _keys)
def test_the_direct_publish_encoder_writes_what_encode_writes(
    topic: int, payload: bytes, key: bytes | None
) -> None:
    frame = encode_publish(topic, payload, key, max_frame=1 << 20)
    assert frame == encode(Publish(topic, payload, key), max_frame=1 << 20)


@given(_uints, _uints, st.lists(_blobs, max_size=5))
def test_deliver_heads_are_what_encode_deliver_writes(
    subscription: int, first: int, tails: list[bytes]
) -> None:
    first = min(first, U64_MAX - len(tails))
    heads = list(deliver_heads(subscription, first, tails))
    assert heads == [encode_deliver(subscription, first + i, t)[0] for i, t in enumerate(tails)]


def test_the_direct_publish_encoder_keeps_to_max_frame() -> None:
    with pytest.raises(LocalProtocolError, match="max_frame"):
        encode_publish(1, b"x" * 2000, None, max_frame=1024)
