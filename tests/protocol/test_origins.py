"""Origin runs: a worker's link says, per run of a PublishMany's entries,
whose publishes they are (client session, topic handle, indices); only a
connection the broker marked as a link may send them."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    ConnectionClosed,
    GoodbyeCode,
    OriginRun,
    Policy,
    PublishMany,
    PublishManyReceived,
    RemoteProtocolError,
    add_runs,
    slice_origins,
)
from broker.protocol.frames import decode_body, encode, encode_deliver_tail, publish_many_head
from broker.protocol.frames._decode_fast import _fast_message
from broker.protocol.frames._encode import encode_origins

from .pair import ConnectionPair, of, split_frames

RUNS: list[OriginRun] = [(b"s" * 16, 3, 10, 40), (b"", 0, 1, 20), (b"t" * 16, 1, 5, 40)]


def expand(runs: list[OriginRun]) -> list[tuple[bytes, int, int]]:
    """One (session, handle, index) per publish."""
    return [(s, h, first + i) for s, h, first, count in runs for i in range(count)]


def opened(
    *, accept: bool = True, max_frame: int | None = None, policy: Policy | None = None
) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(publish_many=True, broker_max_frame=max_frame, client_policy=policy)
    pair.broker.accept_origins = accept
    topic = pair.client.bind_topic("t")
    pair.run()
    return pair, topic


def test_a_links_frames_carry_the_runs_of_their_entries() -> None:
    pair, topic = opened(max_frame=4096)
    tails = [encode_deliver_tail(bytes([i]) * 100, None, None) for i in range(100)]
    assert pair.client.publish_many_tails(topic, tails, origins=RUNS) == 100
    frames = split_frames(pair.client.data_to_send())
    assert len(frames) > 1
    assert all(len(frame) - 4 <= pair.client.peer_max_frame for frame in frames)
    for frame in frames:  # (the fast way reads what the general way reads)
        assert _fast_message(frame, 4, len(frame)) == decode_body(frame[4:])
    events = of(PublishManyReceived, pair.broker.receive_data(b"".join(frames), now=0.0))
    assert [tail for event in events for tail in event.message.entries] == tails
    carried: list[OriginRun] = []
    for event in events:
        assert event.message.origins is not None
        assert sum(run[3] for run in event.message.origins) == len(event.message.entries)
        carried += event.message.origins
    assert expand(carried) == expand(RUNS)
    pair.assert_no_errors()


def test_a_client_that_says_whose_they_are_gets_a_goodbye() -> None:
    pair, topic = opened(accept=False)
    tails = [encode_deliver_tail(b"x", None, None)] * 3
    frame = encode(PublishMany(topic, tails, [None] * 3, [(b"s", 0, 1, 3)]))
    (closed,) = of(ConnectionClosed, pair.broker.receive_data(frame, now=0.0))
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    assert "worker's link" in closed.reason
    assert pair.broker.topics.bindings[topic].received == 0


@pytest.mark.parametrize(
    "runs",
    [
        [(b"s", 0, 1, 2)],  # covers 2 of 3
        [(b"s", 0, 0, 3)],  # index 0
        [(b"s" * 65, 0, 1, 3)],  # session id too long
        [[b"s", 0, 1]],  # not a run
        "runs",
    ],
)
def test_runs_that_do_not_describe_the_entries_are_malformed(runs: object) -> None:
    pair, topic = opened()
    tails = [encode_deliver_tail(b"x", None, None)] * 3
    body = b"".join(tails) + cbor2.dumps(runs)
    frame = publish_many_head(topic, 3, len(body), origins=True) + body
    with pytest.raises(RemoteProtocolError, match="origin"):
        decode_body(frame[4:])
    assert _fast_message(frame, 4, len(frame)) is None
    (closed,) = of(ConnectionClosed, pair.broker.receive_data(frame, now=0.0))
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR


def test_beyond_the_guarantees_one_goes_alone_with_its_origin() -> None:
    pair, topic = opened(policy=Policy(optimism=64 * 1024))
    tails = [encode_deliver_tail(b"y" * 1000, None, None)] * 1000
    runs: list[OriginRun] = [(b"s", 7, 1, 1000)]
    sent = pair.client.publish_many_tails(topic, tails, origins=runs)
    assert 0 < sent < 1000
    before = split_frames(pair.client.data_to_send())
    # No room left within the guarantees: one more goes on optimism, alone.
    assert pair.client.publish_many_tails(topic, tails, sent, origins=runs) == 1
    (frame,) = split_frames(pair.client.data_to_send())
    message = decode_body(frame[4:])
    assert isinstance(message, PublishMany)
    assert message.entries == [tails[sent]] and message.origins == [(b"s", 7, sent + 1, 1)]
    assert len(before) >= 1


@given(
    st.lists(
        st.tuples(st.binary(max_size=4), st.integers(0, 9), st.integers(1, 99), st.integers(1, 9)),
        min_size=1,
        max_size=8,
    ),
    st.data(),
)
def test_a_slice_of_runs_is_the_slice_of_their_publishes(
    runs: list[OriginRun], data: st.DataObject
) -> None:
    total = sum(run[3] for run in runs)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total))
    sliced = slice_origins(runs, start, stop)
    assert expand(sliced) == expand(runs)[start:stop]
    assert all(run[3] > 0 for run in sliced)
    if sliced:  # (and they survive the wire)
        message = PublishMany(0, [b"\x41a\xf6\xf6"] * (stop - start), [None] * (stop - start))
        message.origins = sliced
        assert decode_body(encode(message)[4:]) == message
        assert len(encode_origins(sliced)) > 0


def test_many_runs_are_read_the_fast_way_too() -> None:
    """A frame of one publish from each of 300 sessions (a topic many
    clients publish to through one worker)."""
    runs: list[OriginRun] = [(b"%016d" % n, 0, n + 1, 1) for n in range(300)]
    tail = encode_deliver_tail(b"x", None, None)
    message = PublishMany(5, [tail] * 300, [None] * 300, runs)
    frame = encode(message)
    assert _fast_message(frame, 4, len(frame)) == decode_body(frame[4:]) == message


def test_room_kept_for_many_runs_never_keeps_a_frame_from_going() -> None:
    """300 origins' runs take more than a 4 KiB frame could keep for them:
    frames then carry fewer runs, and every publish still goes, with its own."""
    pair, topic = opened(max_frame=4096)
    runs: list[OriginRun] = [(b"%016d" % n, 0, 1, 1) for n in range(300)]
    tails = [encode_deliver_tail(bytes([n % 256]) * 100, None, None) for n in range(300)]
    sent = calls = 0
    carried: list[OriginRun] = []
    received: list[bytes] = []
    while sent < 300:
        more = pair.client.publish_many_tails(topic, tails, sent, origins=runs)
        assert more > 0
        sent += more
        calls += 1
        frames = split_frames(pair.client.data_to_send())
        assert all(len(frame) - 4 <= pair.client.peer_max_frame for frame in frames)
        for event in of(PublishManyReceived, pair.broker.receive_data(b"".join(frames), now=0.0)):
            assert event.message.origins is not None
            carried += event.message.origins
            received += event.message.entries
            pair.broker.release(event)
        pair.run()
    assert received == tails and expand(carried) == expand(runs)
    assert calls <= 10  # (as far as the guarantees go each time, not one at a time)
    pair.assert_no_errors()


def test_a_run_that_continues_the_last_one_joins_it() -> None:
    runs: list[OriginRun] = [(b"s", 1, 1, 5)]
    add_runs(runs, [(b"s", 1, 6, 3), (b"s", 2, 9, 1), (b"", 0, 1, 2), (b"", 0, 1, 2)])
    add_runs(runs, [(b"s", 2, 10, 4), (b"s", 2, 20, 1)])
    joined: list[OriginRun] = [(b"s", 1, 1, 8), (b"s", 2, 9, 1), (b"", 0, 1, 2), (b"", 0, 1, 2)]
    assert runs == [*joined, (b"s", 2, 10, 4), (b"s", 2, 20, 1)]
