"""Decoding costs work in proportion to the bytes received, however they
are cut (issue 18, item 12: fed one byte at a time, the decoder used to copy
its whole buffer on every call: 64 KiB took 0.46 s of CPU, 256 KiB 2.9 s)."""

from __future__ import annotations

import random

from broker.protocol import Ping, Policy, Pong, Publish, PublishReceived
from broker.protocol.frames import FrameDecoder, encode

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


# ==================================================================== issue 40, item 6


def test_a_limit_takes_that_many_frames_and_copies_each_byte_once() -> None:
    """``messages(limit)`` gives at most ``limit`` frames; the rest stay
    buffered (``frame_ready``) and are decoded from the same copy next time:
    a read of thousands of tiny frames taken 64 at a time is copied once
    (before: a limit made of the buffer's copy a cost per call)."""
    pings = [Ping(i) for i in range(1000)]
    stream = b"".join(encode(ping) for ping in pings)
    decoder = FrameDecoder()
    decoder.feed(stream)
    taken: list[object] = []
    calls = 0
    while decoder.frame_ready:
        batch = [message for message, _ in decoder.messages(64)]
        assert 1 <= len(batch) <= 64
        taken += batch
        calls += 1
    assert taken == pings
    assert calls == 16
    assert decoder.copied == len(stream)
    assert decoder.buffered == 0


def test_bytes_fed_while_a_limit_holds_frames_back_come_after_them() -> None:
    """Cut anywhere, fed between limited takes, a stream decodes in order,
    every whole frame comes out, and no byte is copied more than twice."""
    rng = random.Random(40)
    messages = [
        Publish(rng.randrange(4), rng.randbytes(rng.randrange(0, 300))) if i % 3 else Ping(i)
        for i in range(600)
    ]
    stream = b"".join(encode(message) for message in messages)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 200)))
        decoder = FrameDecoder()
        taken: list[object] = []
        start = 0
        for end in [*cuts, len(stream)]:
            decoder.feed(stream[start:end])
            start = end
            taken += [message for message, _ in decoder.messages(rng.randrange(1, 40))]
        while decoder.frame_ready:
            taken += [message for message, _ in decoder.messages(7)]
        assert taken == messages
        assert decoder.copied <= 2 * len(stream)


def test_a_connection_handles_at_most_max_frames_per_call() -> None:
    """The broker's ``receive_data(..., max_frames=64)`` answers 64 Pings
    per call; ``frames_waiting`` says more are buffered, and calls without
    new bytes take them, in order, until none are left."""
    pair = ConnectionPair()
    broker = pair.broker
    broker.data_to_send()
    broker.receive_data(b"".join(encode(Ping(i)) for i in range(200)), 1.0, max_frames=64)
    answered = [of_pongs(broker.data_to_send())]
    while broker.frames_waiting:
        broker.receive_data(b"", 1.0, max_frames=64)
        answered.append(of_pongs(broker.data_to_send()))
    assert [len(pongs) for pongs in answered] == [64, 64, 64, 8]
    assert [pong.nonce for pongs in answered for pong in pongs] == list(range(200))
    pair.assert_no_errors()


def of_pongs(data: bytes) -> list[Pong]:
    decoder = FrameDecoder()
    decoder.feed(data)
    return [message for message, _ in decoder.messages() if isinstance(message, Pong)]


def _publishes_per_call(handles: list[int], limit: int) -> list[list[int]]:
    """Each receive_data call's publishes (as topic handles), given the
    stream of publishes on ``handles`` in one read and ``max_frames``."""
    pair = ConnectionPair()
    topics = {handle: pair.client.bind_topic(f"t.{handle}") for handle in sorted(set(handles))}
    pair.run()
    stream = b"".join(encode(Publish(topics[handle], b"x")) for handle in handles)
    broker = pair.broker
    calls = [broker.receive_data(stream, 1.0, max_frames=limit)]
    while broker.frames_waiting:
        calls.append(broker.receive_data(b"", 1.0, max_frames=limit))
    pair.assert_no_errors()
    by_handle = {value: key for key, value in topics.items()}
    return [
        [by_handle[event.message.topic] for event in events if isinstance(event, PublishReceived)]
        for events in calls
    ]


def test_a_run_of_publishes_begun_within_the_limit_is_finished_past_it() -> None:
    """max_frames 4: the run on 2 that began at the third frame goes on to
    four frames of its own (six in the call); the rest wait for the next."""
    assert _publishes_per_call([1, 1, 2, 2, 2, 2, 2, 1], 4) == [[1, 1, 2, 2, 2, 2], [2, 1]]


def test_a_run_is_finished_only_up_to_the_limit_of_its_own() -> None:
    """A run from the first frame is cut at the limit, as before; a run
    that begins past the limit is not begun."""
    assert _publishes_per_call([3] * 10, 4) == [[3] * 4, [3] * 4, [3] * 2]
    assert _publishes_per_call([1, 2, 3, 4, 4, 4], 3) == [[1, 2, 3], [4, 4, 4]]
    # A run begun at the limit's last frame takes max_frames - 1 more.
    assert _publishes_per_call([1, 1, 1, 2, 2, 2, 2, 2], 4) == [[1, 1, 1, 2, 2, 2, 2], [2]]
