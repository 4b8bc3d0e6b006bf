"""Decoding costs work in proportion to the bytes received, however they
are cut (issue 18, item 12: fed one byte at a time, the decoder used to copy
its whole buffer on every call: 64 KiB took 0.46 s of CPU, 256 KiB 2.9 s)."""

from __future__ import annotations

import random

from broker.protocol import (
    FrameDecoder,
    Ping,
    Policy,
    Publish,
    PublishReceived,
    encode,
)

from .pair import ConnectionPair, of


def feed_in_pieces(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[object]:
    """Feed ``data`` cut at ``cuts``, taking the messages out after each piece."""
    messages: list[object] = []
    start = 0
    for end in [*cuts, len(data)]:
        decoder.feed(data[start:end])
        messages += [message for message, _ in decoder.messages()]
        start = end
    return messages


def test_a_large_frame_fed_one_byte_at_a_time_is_copied_at_most_twice() -> None:
    publish = Publish(0, b"x" * 256 * 1024)
    frame = encode(publish, max_frame=1 << 20)
    decoder = FrameDecoder(max_frame=1 << 20)
    assert feed_in_pieces(decoder, frame, list(range(1, len(frame)))) == [publish]
    # Before: the whole buffer on every call, about len(frame) ** 2 / 2 bytes.
    assert decoder.copied <= 2 * len(frame)
    assert decoder.buffered == 0


def test_any_cutting_of_a_stream_decodes_the_same_with_linear_copying() -> None:
    rng = random.Random(18)
    messages = [
        Publish(rng.randrange(4), rng.randbytes(rng.randrange(0, 3000))) if i % 3 else Ping(i)
        for i in range(300)
    ]
    stream = b"".join(encode(message) for message in messages)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 2000)))
        decoder = FrameDecoder()
        assert feed_in_pieces(decoder, stream, cuts) == messages
        assert decoder.copied <= 2 * len(stream)


def test_a_connection_fed_one_byte_at_a_time_takes_the_frame_once() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=1 << 20), broker_max_frame=1 << 20)
    topic = pair.client.bind_topic("t")
    pair.run()
    frame = encode(Publish(topic, b"y" * 64 * 1024), max_frame=1 << 20)
    events = []
    for i in range(len(frame)):
        events += pair.broker.receive_data(frame[i : i + 1], 0.0)
    (received,) = of(PublishReceived, events)
    assert received.message.payload == b"y" * 64 * 1024 and received.size == len(frame)
    assert pair.broker._decoder.copied <= 2 * len(frame) + 1024  # (+ the handshake's)
    pair.assert_no_errors()
