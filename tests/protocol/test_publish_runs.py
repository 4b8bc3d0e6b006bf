"""A client's publishes go out grouped by topic (``FrameWriter.runs``):
each topic's in the order published, none before a frame queued ahead of
it, none after a frame queued behind it; what the broker receives is
every publish once, per topic in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import PublishReceived
from broker.protocol.frames._decode import decode_body
from tests.hypothesis_profiles import examples

from .pair import ConnectionPair, of, split_frames


def _topics(pair: ConnectionPair, count: int) -> list[int]:
    handles = [pair.client.bind_topic(f"t.{index}") for index in range(count)]
    pair.run()
    return handles


def _kinds(data: bytes) -> list[tuple[str, int | None, bytes | None]]:
    """(frame type, topic handle, payload) of each frame of ``data``."""
    shown = []
    for frame in split_frames(data):
        message = decode_body(frame[4:])
        shown.append(
            (
                type(message).__name__,
                getattr(message, "topic", None),
                getattr(message, "payload", None),
            )
        )
    return shown


def test_round_robin_publishes_leave_as_one_run_per_topic() -> None:
    pair = ConnectionPair()
    a, b, c = _topics(pair, 3)
    for n in range(3):
        for topic in (a, b, c):
            pair.client.publish(topic, b"%d-%d" % (topic, n))
    sent = _kinds(pair.client.data_to_send())
    assert [topic for _, topic, _ in sent] == [a, a, a, b, b, b, c, c, c]
    assert [payload for _, _, payload in sent] == [
        b"%d-%d" % (topic, n) for topic in (a, b, c) for n in range(3)
    ]


def test_another_frame_is_a_barrier_both_ways() -> None:
    """A frame queued between publishes (here a Ping) goes after every
    publish queued before it and before every publish queued after it."""
    pair = ConnectionPair()
    a, b = _topics(pair, 2)
    pair.client.publish(a, b"a1")
    pair.client.publish(b, b"b1")
    pair.client.publish(a, b"a2")
    pair.client.ping()
    pair.client.publish(b, b"b2")
    pair.client.publish(a, b"a3")
    sent = _kinds(pair.client.data_to_send())
    assert sent == [
        ("Publish", a, b"a1"),
        ("Publish", a, b"a2"),
        ("Publish", b, b"b1"),
        ("Ping", None, None),
        ("Publish", b, b"b2"),
        ("Publish", a, b"a3"),
    ]


def test_queued_runs_are_counted_as_output() -> None:
    pair = ConnectionPair()
    a, b = _topics(pair, 2)
    assert pair.client.bytes_to_send == 0 and pair.client.memory_to_send == 0
    size = pair.client.publish(a, b"x" * 10) + pair.client.publish(b, b"y" * 10)
    assert pair.client.bytes_to_send == size
    assert pair.client.memory_to_send > size  # (two pieces' overhead besides)
    pieces = pair.client.pieces_to_send()
    assert sum(map(len, pieces)) == size
    assert pair.client.bytes_to_send == 0 and pair.client.memory_to_send == 0
    assert pair.client.data_to_send() == b""


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(-1, 4), max_size=60))
def test_any_mix_reaches_the_broker_whole_and_in_order(script: list[int]) -> None:
    """Any mix of publishes to five topics and Pings (-1): every publish
    leaves once, each topic's in order; a Ping leaves after every publish
    made before it and before every one made after it; the broker
    receives them all."""
    pair = ConnectionPair()
    handles = _topics(pair, 5)
    expected: dict[int, list[bytes]] = {handle: [] for handle in handles}
    for step, choice in enumerate(script):
        if choice < 0:
            pair.client.ping()
        else:
            expected[handles[choice]].append(b"%d" % step)
            pair.client.publish(handles[choice], b"%d" % step)
    data = pair.client.data_to_send()
    sent = _kinds(data)
    pings = [step for step, choice in enumerate(script) if choice < 0]
    # Each frame's step in the script: a publish's is its payload, the
    # Pings' are theirs in order.
    steps = []
    for kind, _, payload in sent:
        steps.append(int(payload) if kind == "Publish" else pings.pop(0))
    assert not pings and sorted(steps) == list(range(len(script)))
    for position, (kind, _, _) in enumerate(sent):
        if kind == "Ping":
            assert all(step < steps[position] for step in steps[:position])
            assert all(step > steps[position] for step in steps[position + 1 :])
    received = of(PublishReceived, pair.broker.receive_data(data, now=0.0))
    by_topic: dict[int, list[bytes]] = {handle: [] for handle in handles}
    for event in received:
        by_topic[event.message.topic].append(event.message.payload)
    assert by_topic == expected
