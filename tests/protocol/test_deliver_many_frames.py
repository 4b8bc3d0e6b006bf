"""DeliverMany on the wire between two connections: what the broker sends to
a client that asked for it (and to one that did not), how the client
accounts for it (guarantees once per frame, one handle reference per entry),
and how either side refuses one it must not accept."""

from __future__ import annotations

import struct

import cbor2
import pytest

from broker.protocol import (
    U64_MAX,
    Channel,
    ChannelKind,
    ConnectionClosed,
    Deliver,
    DeliverMany,
    DeliverManyReceived,
    DeliverReceived,
    Entry,
    Gap,
    GoodbyeCode,
    HandleDeleted,
    HandleType,
    Hello,
    LocalProtocolError,
    Policy,
    RemoteProtocolError,
)
from broker.protocol._types import LENGTH_PREFIX
from broker.protocol.connection import DELIVER_SLACK
from broker.protocol.frames import decode_body, encode, encode_deliver_tail
from broker.protocol.frames._encode import deliver_many_head_size

from .pair import ConnectionPair, of, split_frames

#: Sequence numbers from 0, and from where they take four bytes.
BASES = pytest.mark.parametrize("base", [0, 70_000])


def subscribed_pair(
    capacity: int = 100_000, *, deliver_many: bool = True, broker_max_frame: int | None = None
) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(
        client_policy=Policy(deliver_capacity=capacity),
        deliver_many=deliver_many,
        broker_max_frame=broker_max_frame,
    )
    topic = pair.client.bind_topic("t")
    pair.run()
    subscription = pair.client.subscribe(topic)
    pair.run()
    pair.assert_no_errors()
    assert pair.broker.hello_message is not None
    assert pair.broker.hello_message.deliver_many is deliver_many
    assert pair.broker.bytes_to_send == 0
    return pair, subscription


def deliver_channel(subscription: int) -> Channel:
    return Channel(ChannelKind.DELIVER, subscription)


def entries_of(payloads: list[bytes], keyed: bool = False) -> list[Entry]:
    return [(p, b"k%d" % i if keyed and i % 2 else None, None) for i, p in enumerate(payloads)]


def tails_of(entries: list[Entry]) -> list[bytes]:
    return [encode_deliver_tail(*entry) for entry in entries]


def expected_deliveries(subscription: int, first: int, entries: list[Entry]) -> list[Deliver]:
    return [Deliver(subscription, first + i, *entry) for i, entry in enumerate(entries)]


def decoded(frames: list[bytes]) -> list[Deliver | DeliverMany]:
    messages = [decode_body(frame[LENGTH_PREFIX:]) for frame in frames]
    assert all(type(m) in (Deliver, DeliverMany) for m in messages), messages
    return messages  # type: ignore[return-value]


def as_deliveries(messages: list[Deliver | DeliverMany]) -> list[Deliver]:
    out: list[Deliver] = []
    for message in messages:
        out += message.deliveries() if isinstance(message, DeliverMany) else [message]
    return out


def client_deliveries(pair: ConnectionPair) -> list[Deliver]:
    """Every delivery the client reported, DeliverMany entries one by one."""
    out: list[Deliver] = []
    for event in pair.client_events:
        if isinstance(event, DeliverManyReceived):
            out += event.message.deliveries()
        elif isinstance(event, DeliverReceived):
            out.append(event.message)
    return out


def release_from(pair: ConnectionPair, start: int) -> int:
    """Release every delivery the client reported from event ``start`` on;
    where the next call starts."""
    for event in pair.client_events[start:]:
        if isinstance(event, DeliverManyReceived | DeliverReceived):
            assert pair.client.release(event) == []
    return len(pair.client_events)


def frame(message: DeliverMany | Deliver | list[object]) -> bytes:
    """A frame for ``message`` (or for a raw CBOR array of fields)."""
    if isinstance(message, list):
        body = cbor2.dumps(message)
        return struct.pack(">I", len(body)) + body
    return encode(message)


def closed(events: list[object]) -> ConnectionClosed:
    assert events, "no events"
    last = events[-1]
    assert isinstance(last, ConnectionClosed), events
    return last


# ==================================================================== Hello


@pytest.mark.parametrize("deliver_many", [False, True])
def test_the_hello_says_deliver_many_only_when_true(deliver_many: bool) -> None:
    hello = Hello(1, "c", None, {}, None, deliver_many)
    fields = cbor2.loads(encode(hello)[LENGTH_PREFIX:])[2]
    assert ("deliver_many" in fields) is deliver_many
    if deliver_many:
        assert fields["deliver_many"] is True
    assert decode_body(encode(hello)[LENGTH_PREFIX:]) == hello


@pytest.mark.parametrize(("value", "ok"), [(False, True), (True, True), (1, False), ("yes", False)])
def test_a_hello_deliver_many_must_be_a_boolean(value: object, ok: bool) -> None:
    body = cbor2.dumps(
        [0, 1, {"client": "c", "session": None, "processed": {}, "deliver_many": value}]
    )
    if ok:
        assert decode_body(body) == Hello(1, "c", None, {}, None, value is True)
    else:
        with pytest.raises(RemoteProtocolError, match="deliver_many must be a boolean"):
            decode_body(body)


# ==================================================================== the broker sends


@BASES
def test_a_client_that_did_not_ask_gets_one_deliver_per_tail(base: int) -> None:
    pair, sub = subscribed_pair(deliver_many=False)
    entries = entries_of([b"a", b"bb" * 50, b"ccc", b"", b"e" * 300], keyed=True)
    assert pair.broker.deliver_encoded_many(sub, base, tails_of(entries)) == 5
    frames = split_frames(pair.broker.data_to_send())
    expected = expected_deliveries(sub, base, entries)
    assert frames == [encode(d) for d in expected]
    pair.wire_to_client.extend(frames)
    pair.run()
    pair.assert_no_errors()
    assert not of(DeliverManyReceived, pair.client_events)
    assert [e.message for e in of(DeliverReceived, pair.client_events)] == expected


@BASES
def test_a_batch_to_a_client_that_asked_is_one_deliver_many(base: int) -> None:
    pair, sub = subscribed_pair()
    entries = entries_of([b"a", b"bb" * 50, b"ccc", b"", b"e" * 300], keyed=True)
    entries.append((b"with headers", b"k", [("h", b"v")]))  # read the general way
    sender = pair.broker.sender(deliver_channel(sub))
    before = sender.statistics()
    frames_sent = pair.broker.frames_sent
    assert pair.broker.deliver_encoded_many(sub, base, tails_of(entries)) == 6
    frames = split_frames(pair.broker.data_to_send())
    assert frames == [encode(DeliverMany(sub, base, entries))]
    assert pair.broker.frames_sent == frames_sent + 1
    after = sender.statistics()
    assert after.sent_frames == before.sent_frames + 1
    assert after.sent_bytes == before.sent_bytes + len(frames[0])
    assert after.balance == before.balance - len(frames[0])

    pair.wire_to_client.extend(frames)
    events = pair.to_client()
    (event,) = events
    assert isinstance(event, DeliverManyReceived)
    assert event.size == len(frames[0])
    assert event.channel == deliver_channel(sub)
    assert event.message.deliveries() == expected_deliveries(sub, base, entries)
    receiver = pair.client.receiver(deliver_channel(sub))
    assert receiver.buffered == len(frames[0])
    assert receiver.accepted_frames == 1
    assert pair.client.subscriptions.references(sub) == 6
    pair.run()
    pair.assert_no_errors()


@BASES
def test_a_single_tail_goes_as_a_deliver(base: int) -> None:
    pair, sub = subscribed_pair()
    entries = entries_of([b"x" * 40])
    assert pair.broker.deliver_encoded_many(sub, base, tails_of(entries)) == 1
    frames = split_frames(pair.broker.data_to_send())
    assert frames == [encode(Deliver(sub, base, b"x" * 40))]
    pair.wire_to_client.extend(frames)
    pair.run()
    pair.assert_no_errors()
    assert [e.message for e in of(DeliverReceived, pair.client_events)] == [
        Deliver(sub, base, b"x" * 40)
    ]
    assert pair.client.subscriptions.references(sub) == 1


@BASES
def test_it_stops_where_the_guarantees_end_and_goes_on_after_release(base: int) -> None:
    capacity = 300
    pair, sub = subscribed_pair(capacity)
    entries = entries_of([b"x%02d" % i + b"y" * 27 for i in range(20)])
    tails = tails_of(entries)
    channel = deliver_channel(sub)
    assert pair.broker.room(channel) == capacity
    sent = pair.broker.deliver_encoded_many(sub, base, tails)
    assert 0 < sent < len(tails)
    frames = split_frames(pair.broker.data_to_send())
    total = sum(len(f) for f in frames)
    assert total <= capacity
    room = pair.broker.room(channel)
    assert room == capacity - total
    # Not even the next message alone fits in what is left.
    assert len(encode(Deliver(sub, base + sent, *entries[sent]))) > room
    messages = decoded(frames)
    assert any(isinstance(m, DeliverMany) for m in messages)
    assert as_deliveries(messages) == expected_deliveries(sub, base, entries[:sent])
    assert pair.broker.deliver_encoded_many(sub, base + sent, tails[sent:]) == 0
    assert pair.broker.bytes_to_send == 0

    pair.wire_to_client.extend(frames)
    pair.run()
    pair.assert_no_errors()  # the client saw nothing beyond its guarantees
    receiver = pair.client.receiver(channel)
    assert receiver.buffered == total
    assert receiver.sender_balance == room
    # Releasing what arrived brings the guarantees back; the rest then goes.
    done = sent
    released = 0
    while done < len(tails):
        released = release_from(pair, released)
        pair.run()
        assert pair.broker.room(channel) == capacity
        more = pair.broker.deliver_encoded_many(sub, base + done, tails[done:])
        assert more > 0
        done += more
        pair.run()
    pair.assert_no_errors()
    assert client_deliveries(pair) == expected_deliveries(sub, base, entries)


def test_a_long_batch_arrives_whole_in_order_across_releases() -> None:
    pair, sub = subscribed_pair(300)
    entries = entries_of([b"%02d" % i * 15 for i in range(30)], keyed=True)
    tails = tails_of(entries)
    done = released = 0
    for _ in range(30):
        done += pair.broker.deliver_encoded_many(sub, 70_000 + done, tails[done:])
        pair.run()
        released = release_from(pair, released)
        pair.run()
        if done == len(tails):
            break
    assert done == len(tails)
    assert client_deliveries(pair) == expected_deliveries(sub, 70_000, entries)
    assert of(DeliverManyReceived, pair.client_events)
    assert pair.client.receiver(deliver_channel(sub)).buffered == 0
    assert pair.client.subscriptions.references(sub) == 0
    pair.assert_no_errors()


def test_a_room_that_holds_the_whole_batch_in_one_frame_gets_it() -> None:
    entries = entries_of([b"x" * 10] * 3)
    size = len(encode(DeliverMany(0, 0, entries)))
    pair, sub = subscribed_pair(size)
    assert sub == 0
    assert pair.broker.deliver_encoded_many(sub, 0, tails_of(entries)) == 3
    assert split_frames(pair.broker.data_to_send()) == [encode(DeliverMany(sub, 0, entries))]


@BASES
def test_frames_keep_to_the_clients_max_frame(base: int) -> None:
    pair, sub = subscribed_pair(broker_max_frame=200)
    limit = pair.broker.peer_max_frame + LENGTH_PREFIX
    assert pair.broker.peer_max_frame == 200 + 32  # the Deliver slack
    entries = entries_of([b"%03d" % i * 13 for i in range(40)], keyed=True)
    tails = tails_of(entries)
    assert pair.broker.deliver_encoded_many(sub, base, tails) == 40
    frames = split_frames(pair.broker.data_to_send())
    assert len(frames) > 1
    assert all(len(f) <= limit for f in frames)
    messages = decoded(frames)
    assert as_deliveries(messages) == expected_deliveries(sub, base, entries)
    # Each frame is full: the next entry did not fit, its head at its real
    # size (so the batch went in as few frames as max_frame allows).
    position = 0
    for message in messages:
        count = len(message.entries) if isinstance(message, DeliverMany) else 1
        if isinstance(message, DeliverMany):
            assert count >= 2
        body = sum(len(t) for t in tails[position : position + count])
        position += count
        if position < len(tails):
            head = deliver_many_head_size(sub, base + position - count, count + 1)
            assert head + body + len(tails[position]) > limit
    pair.wire_to_client.extend(frames)
    pair.run()
    pair.assert_no_errors()
    assert client_deliveries(pair) == expected_deliveries(sub, base, entries)


def test_a_deliver_many_body_is_at_most_max_frame_and_the_slack() -> None:
    pair, sub = subscribed_pair(broker_max_frame=200)
    entries = entries_of([b"x" * 65] * 3)  # 3 tails of 69 bytes: 207 + a 5-byte head
    assert pair.broker.deliver_encoded_many(sub, 0, tails_of(entries)) == 3
    frames = split_frames(pair.broker.data_to_send())
    assert as_deliveries(decoded(frames)) == expected_deliveries(sub, 0, entries)
    for f, message in zip(frames, decoded(frames), strict=True):
        if isinstance(message, DeliverMany):
            assert len(f) - LENGTH_PREFIX <= 200 + DELIVER_SLACK


@pytest.mark.parametrize("by", ["max_frame", "room"])
def test_a_frame_that_would_hold_one_entry_goes_as_a_deliver(by: str) -> None:
    payload = b"p" * 150  # one fits a 200-byte max_frame or a 300-byte room, two do not
    entries = entries_of([payload] * 4)
    if by == "max_frame":
        pair, sub = subscribed_pair(broker_max_frame=200)
        expected = 4
    else:
        pair, sub = subscribed_pair(300)
        expected = 1
    assert pair.broker.deliver_encoded_many(sub, 70_000, tails_of(entries)) == expected
    frames = split_frames(pair.broker.data_to_send())
    assert frames == [encode(Deliver(sub, 70_000 + i, payload)) for i in range(expected)]
    pair.wire_to_client.extend(frames)
    pair.run()
    pair.assert_no_errors()
    assert len(of(DeliverReceived, pair.client_events)) == expected


@BASES
def test_max_frame_errors_are_as_for_deliver(base: int) -> None:
    pair, sub = subscribed_pair(1_000_000, broker_max_frame=200)
    limit = pair.broker.peer_max_frame + LENGTH_PREFIX
    small = encode_deliver_tail(b"s", None, None)
    # The largest tail a Deliver frame can carry within the limit, and one more byte.
    payload = next(
        n for n in range(400, 0, -1) if len(encode(Deliver(sub, base + 1, b"x" * n))) <= limit
    )
    edge = encode_deliver_tail(b"x" * payload, None, None)
    huge = encode_deliver_tail(b"x" * (payload + 1), None, None)
    sender = pair.broker.sender(deliver_channel(sub))
    before = sender.statistics()
    assert pair.broker.bytes_to_send == 0 and sender.statistics() == before
    # A tail that fits only alone goes as a plain Deliver of exactly the limit.
    assert pair.broker.deliver_encoded_many(sub, base + 1, [edge, small, small]) == 3
    frames = split_frames(pair.broker.data_to_send())
    assert len(frames[0]) == limit
    assert decoded(frames) == [
        Deliver(sub, base + 1, b"x" * payload),
        DeliverMany(sub, base + 2, [(b"s", None, None)] * 2),
    ]
    # An oversize tail later in the batch ends it before itself.
    assert pair.broker.deliver_encoded_many(sub, base + 4, [small, small, huge, small]) == 2
    assert decoded(split_frames(pair.broker.data_to_send())) == [
        DeliverMany(sub, base + 4, [(b"s", None, None)] * 2)
    ]
    # First, to a client that takes no parts (no max_message): a Gap, then the rest.
    assert pair.broker.deliver_encoded_many(sub, base + 6, [huge, small]) == 2
    gap = split_frames(pair.broker.data_to_send())
    assert [decode_body(f[LENGTH_PREFIX:]) for f in gap] == [
        Gap(sub, base + 6, 1),
        Deliver(sub, base + 7, b"s"),
    ]


def test_sequence_numbers_past_u64_max_are_refused() -> None:
    pair, sub = subscribed_pair()
    tails = tails_of(entries_of([b"a", b"b"]))
    with pytest.raises(LocalProtocolError, match="u64"):
        pair.broker.deliver_encoded_many(sub, U64_MAX - 1, [*tails, tails[0]])
    with pytest.raises(LocalProtocolError, match="u64"):
        pair.broker.deliver_encoded_many(sub, U64_MAX, tails)
    assert pair.broker.bytes_to_send == 0
    assert pair.broker.deliver_encoded_many(sub, U64_MAX - 2, tails) == 2
    (message,) = decoded(split_frames(pair.broker.data_to_send()))
    assert message == DeliverMany(sub, U64_MAX - 2, entries_of([b"a", b"b"]))


@pytest.mark.parametrize("count", [1, 2])
def test_the_last_sequence_number_may_be_u64_max(count: int) -> None:
    pair, sub = subscribed_pair()
    entries = entries_of([b"a", b"b"][:count])
    first = U64_MAX - count + 1
    assert pair.broker.deliver_encoded_many(sub, first, tails_of(entries)) == count
    (message,) = decoded(split_frames(pair.broker.data_to_send()))
    assert as_deliveries([message]) == expected_deliveries(sub, first, entries)


# ==================================================================== the client accounts


def _received_many(
    pair: ConnectionPair, sub: int, count: int, base: int = 0
) -> tuple[DeliverManyReceived, list[Entry]]:
    entries = entries_of([b"m%d" % i * 10 for i in range(count)])
    assert pair.broker.deliver_encoded_many(sub, base, tails_of(entries)) == count
    events = pair.to_client()
    (event,) = events
    assert isinstance(event, DeliverManyReceived)
    assert len(event.message.entries) == count
    return event, entries


def test_release_frees_the_frame_and_the_guarantees_come_back() -> None:
    pair, sub = subscribed_pair(400)
    channel = deliver_channel(sub)
    event, _ = _received_many(pair, sub, 5)
    receiver = pair.client.receiver(channel)
    assert receiver.buffered == event.size
    assert pair.broker.room(channel) == 400 - event.size
    assert pair.client.release(event) == []
    assert receiver.buffered == 0
    assert pair.client.subscriptions.references(sub) == 0
    pair.run()
    assert pair.broker.room(channel) == 400 == receiver.sender_balance
    with pytest.raises(LocalProtocolError):
        pair.client.release(event)  # once only
    pair.assert_no_errors()


def test_release_frames_counts_one_reference_per_entry() -> None:
    pair, sub = subscribed_pair(400)
    channel = deliver_channel(sub)
    event, _ = _received_many(pair, sub, 4)
    receiver = pair.client.receiver(channel)
    refs = pair.client.subscriptions.references
    before = receiver.statistics()
    with pytest.raises(LocalProtocolError):
        pair.client.release_frames(channel, event.size, 5)  # more entries than buffered
    with pytest.raises(LocalProtocolError):
        pair.client.release_frames(channel, event.size + 1, 4)  # more bytes than buffered
    assert receiver.statistics() == before and refs(sub) == 4
    # Entry by entry, the bytes shared out any way that adds up.
    assert pair.client.release_frames(channel, 3, 1) == []
    assert pair.client.release_frames(channel, 10, 2) == []
    assert refs(sub) == 1 and receiver.buffered == event.size - 13
    with pytest.raises(LocalProtocolError):
        pair.client.release(event)  # four references wanted, one left
    with pytest.raises(LocalProtocolError):
        pair.client.release_frames(channel, 1, 2)
    assert refs(sub) == 1 and receiver.buffered == event.size - 13
    assert pair.client.release_frames(channel, event.size - 13, 1) == []
    assert refs(sub) == 0 and receiver.buffered == 0
    with pytest.raises(LocalProtocolError):
        pair.client.release_frames(channel, 1, 1)
    pair.run()
    assert pair.broker.room(channel) == 400
    pair.assert_no_errors()


@pytest.mark.parametrize("limit", [None, "sending", "receiving"])
def test_each_entry_references_the_subscription_on_either_path(limit: str | None) -> None:
    """The short path (plainly within the guarantees) and the long one
    (taken while a limit is set) count the same: one reference per entry,
    the frame's bytes once."""
    pair, sub = subscribed_pair(400)
    channel = deliver_channel(sub)
    if limit == "sending":
        pair.broker.limit_sending(channel, 300)
    elif limit == "receiving":
        pair.client.limit_receiving(channel, 350)
    pair.run()
    receiver = pair.client.receiver(channel)
    before = receiver.statistics()
    event, _ = _received_many(pair, sub, 3)
    after = receiver.statistics()
    assert after.accepted_frames == before.accepted_frames + 1
    assert after.accepted_bytes == before.accepted_bytes + event.size
    assert after.buffered == event.size
    assert pair.client.subscriptions.references(sub) == 3
    pair.client.free_handle(HandleType.SUBSCRIPTION, sub)
    pair.run()
    assert pair.client.release_frames(channel, 1, 2) == []
    assert sub in pair.client.subscriptions
    assert pair.client.release_frames(channel, event.size - 1, 1) == [
        HandleDeleted(int(HandleType.SUBSCRIPTION), sub)
    ]
    pair.run()
    pair.assert_no_errors()


@pytest.mark.parametrize("who", ["client", "broker"])
def test_a_freed_subscription_goes_only_after_its_last_entry_is_released(who: str) -> None:
    pair, sub = subscribed_pair(400)
    channel = deliver_channel(sub)
    event, _ = _received_many(pair, sub, 3)
    if who == "client":
        pair.client.free_handle(HandleType.SUBSCRIPTION, sub)
    else:
        pair.broker.free_handle(HandleType.SUBSCRIPTION, sub)
    pair.run()
    pair.assert_no_errors()
    assert not of(HandleDeleted, pair.client_events)
    assert sub in pair.client.subscriptions
    assert pair.client.release_frames(channel, 5, 1) == []
    assert pair.client.release_frames(channel, 5, 1) == []
    assert sub in pair.client.subscriptions
    deleted = pair.client.release_frames(channel, event.size - 10, 1)
    assert deleted == [HandleDeleted(int(HandleType.SUBSCRIPTION), sub)]
    assert sub not in pair.client.subscriptions
    pair.run()
    pair.assert_no_errors()
    assert sub not in pair.broker.subscriptions


def test_a_freed_subscription_goes_when_release_takes_all_its_entries() -> None:
    pair, sub = subscribed_pair(400)
    first, _ = _received_many(pair, sub, 3)
    second, _ = _received_many(pair, sub, 2, base=3)
    pair.client.free_handle(HandleType.SUBSCRIPTION, sub)
    pair.run()
    assert pair.client.release(first) == []
    assert sub in pair.client.subscriptions
    assert pair.client.release(second) == [HandleDeleted(int(HandleType.SUBSCRIPTION), sub)]
    pair.assert_no_errors()


# ==================================================================== refusals


def _state(pair: ConnectionPair, sub: int) -> tuple[object, ...]:
    return (
        pair.client.receiver(deliver_channel(sub)).statistics(),
        pair.client.subscriptions.references(sub),
    )


@pytest.mark.parametrize("many", [pytest.param(2, id="2 entries"), pytest.param(1, id="1 entry")])
def test_a_client_that_did_not_ask_closes_on_a_deliver_many(many: int) -> None:
    pair, sub = subscribed_pair(deliver_many=False)
    before = _state(pair, sub)
    pair.wire_to_client.append(frame(DeliverMany(sub, 0, entries_of([b"a"] * many))))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR and not end.by_peer
    assert end.error is not None
    assert not of(DeliverManyReceived, pair.client_events)
    assert _state(pair, sub) == before
    assert pair.client.closed
    pair.run()
    goodbye = closed(pair.broker_events)
    assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR and goodbye.by_peer


@pytest.mark.parametrize("deliver_many", [False, True])
def test_a_broker_closes_on_a_deliver_many(deliver_many: bool) -> None:
    pair, sub = subscribed_pair(deliver_many=deliver_many)
    pair.wire_to_broker.append(frame(DeliverMany(sub, 0, entries_of([b"a", b"b"]))))
    end = closed(pair.to_broker())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR and end.error is not None
    assert pair.broker.closed
    pair.run()
    assert closed(pair.client_events).code == GoodbyeCode.PROTOCOL_ERROR


def test_a_deliver_many_before_the_welcome_closes() -> None:
    pair = ConnectionPair(handshake=False, deliver_many=True)
    pair.client.hello("c", deliver_many=True)
    events = pair.client.receive_data(frame(DeliverMany(0, 0, entries_of([b"a", b"b"]))), 0.0)
    assert closed(events).code == GoodbyeCode.PROTOCOL_ERROR


def test_a_deliver_many_on_an_unbound_subscription_closes() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame(DeliverMany(sub + 5, 0, entries_of([b"a", b"b"]))))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "unbound" in end.reason


def _many_of_size(sub: int, size: int, first: int = 0) -> bytes:
    """A DeliverMany frame of exactly ``size`` bytes (two entries)."""
    for short in (b"a", b"", b"aa"):
        for n in range(size):
            data = frame(DeliverMany(sub, first, [(short, None, None), (b"b" * n, None, None)]))
            if len(data) == size:
                return data
    raise AssertionError(size)


def test_a_deliver_many_beyond_the_guarantees_closes_with_limit_exceeded() -> None:
    pair, sub = subscribed_pair(100)
    before = _state(pair, sub)
    pair.wire_to_client.append(_many_of_size(sub, 101))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.LIMIT_EXCEEDED
    assert _state(pair, sub) == before
    pair.run()
    assert closed(pair.broker_events).code == GoodbyeCode.LIMIT_EXCEEDED


def test_a_deliver_many_up_to_the_guarantees_is_taken_and_one_more_byte_is_not() -> None:
    pair, sub = subscribed_pair(100)
    pair.wire_to_client.append(_many_of_size(sub, 60))
    (event,) = pair.to_client()
    assert isinstance(event, DeliverManyReceived) and event.size == 60
    pair.wire_to_client.append(_many_of_size(sub, 40, first=2))
    (event,) = pair.to_client()
    assert isinstance(event, DeliverManyReceived) and event.size == 40
    pair.assert_no_errors()
    assert pair.client.subscriptions.references(sub) == 4
    before = _state(pair, sub)
    pair.wire_to_client.append(_many_of_size(sub, 20, first=4))
    assert closed(pair.to_client()).code == GoodbyeCode.LIMIT_EXCEEDED
    assert _state(pair, sub) == before


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param([34, 0, 0, b"a", None, None, b"b"], id="7 items"),
        pytest.param([34, 0, 0, b"a", None, None, b"b", None], id="8 items"),
        pytest.param([34, 0, 0], id="no entries"),
        pytest.param([34, 0, U64_MAX, b"a", None, None, b"b", None, None], id="seq overflow"),
        pytest.param([34, 0, 0, b"a", None, None, "b", None, None], id="text payload"),
        pytest.param([34, 0, 0, b"a", None, None, b"b", None, 5], id="bad headers"),
    ],
)
def test_a_malformed_deliver_many_closes_and_changes_nothing(fields: list[object]) -> None:
    good = frame(DeliverMany(0, 0, entries_of([b"a", b"b"])))
    # In one read: the good frame before the bad one stays applied.
    pair, sub = subscribed_pair()
    assert sub == 0
    events = pair.client.receive_data(good + frame(fields), 0.0)
    assert len(events) == 2 and isinstance(events[0], DeliverManyReceived)
    end = closed(events)
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert end.reason.startswith("malformed frame")
    assert pair.client.receiver(deliver_channel(sub)).buffered == len(good)
    assert pair.client.subscriptions.references(sub) == 2
    # In two reads: the bad one changes nothing at all.
    pair, sub = subscribed_pair()
    assert isinstance(pair.client.receive_data(good, 0.0)[0], DeliverManyReceived)
    before = _state(pair, sub)
    end = closed(pair.client.receive_data(frame(fields), 0.0))
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert end.reason.startswith("malformed frame")
    assert _state(pair, sub) == before
    pair.run()
    assert closed(pair.broker_events).code == GoodbyeCode.PROTOCOL_ERROR


def test_a_deliver_many_of_no_entries_in_a_long_head_closes() -> None:
    pair, sub = subscribed_pair()
    body = bytes([0x98, 0x03, 0x18, 0x22, sub, 0x18, 0x05])
    pair.wire_to_client.append(struct.pack(">I", len(body)) + body)
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert pair.client.receiver(deliver_channel(sub)).buffered == 0
