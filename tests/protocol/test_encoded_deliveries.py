"""A client whose Hello asks for DeliverMany and that reads them encoded
(``hello(..., encoded_deliveries=True)``, what a worker relaying an owner's
deliveries does): each entry of a DeliverMany without headers comes as its
Deliver tail, the bytes as they were on the wire, accounted for as the
decoded DeliverMany would be; anything else comes as it always does."""

from __future__ import annotations

import pytest

from broker.protocol import (
    DeliverMany,
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveries,
    EncodedDeliveriesReceived,
    Entry,
    HelloReceived,
    Policy,
)
from broker.protocol._types import LENGTH_PREFIX
from broker.protocol.frames import decode_body, encode_deliver_tail
from broker.protocol.frames._decode_fast import _fast_message_encoded

from .pair import EPOCH, SESSION, ConnectionPair, of, split_frames

ENTRIES: list[Entry] = [
    (b"p" * 40, None, None),  # the commonest entry
    (b"", None, None),
    (b"k" * 30, b"key", None),
    (b"x" * 300, None, None),
    (b"y" * 70_000, b"z" * 30, None),
]


def encoded_pair(*, encoded: bool = True) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=1_000_000), handshake=False)
    pair.client.hello("relay", deliver_many=True, encoded_deliveries=encoded)
    pair.flush()
    assert isinstance(pair.to_broker()[0], HelloReceived)
    pair.broker.welcome(session=SESSION, epoch=EPOCH)
    pair.run()
    topic = pair.client.bind_topic("t")
    pair.run()
    subscription = pair.client.subscribe(topic)
    pair.run()
    pair.assert_no_errors()
    pair.client_events.clear()
    return pair, subscription


@pytest.mark.parametrize("base", [1, 70_000])
def test_entries_come_as_their_tails(base: int) -> None:
    pair, sub = encoded_pair()
    tails = [encode_deliver_tail(*entry) for entry in ENTRIES]
    assert pair.broker.deliver_encoded_many(sub, base, tails) == len(tails)
    pair.run()
    (event,) = of(EncodedDeliveriesReceived, pair.client_events)
    assert event.message == EncodedDeliveries(sub, base, tails)
    state = pair.client.subscriptions.bindings[sub]
    assert state.references == len(tails)  # one per entry, as a DeliverMany's
    pair.client.release(event)
    assert state.references == 0
    pair.run()
    pair.assert_no_errors()


def test_anything_else_comes_as_always() -> None:
    pair, sub = encoded_pair()
    headers = encode_deliver_tail(b"h", None, [("trace", b"1")])
    plain = encode_deliver_tail(b"p", None, None)
    assert pair.broker.deliver_encoded_many(sub, 1, [plain, headers]) == 2
    assert pair.broker.deliver_encoded_many(sub, 3, [plain]) == 1
    pair.run()
    (many,) = of(DeliverManyReceived, pair.client_events)
    assert many.message.entries == [(b"p", None, None), (b"h", None, [("trace", b"1")])]
    (single,) = of(DeliverReceived, pair.client_events)
    assert single.message.seq == 3
    assert not of(EncodedDeliveriesReceived, pair.client_events)


def test_without_asking_entries_are_decoded() -> None:
    pair, sub = encoded_pair(encoded=False)
    tails = [encode_deliver_tail(*entry) for entry in ENTRIES]
    pair.broker.deliver_encoded_many(sub, 1, tails)
    pair.run()
    (event,) = of(DeliverManyReceived, pair.client_events)
    assert event.message.entries == ENTRIES


def test_the_tails_are_what_the_general_decoder_reads() -> None:
    pair, sub = encoded_pair()
    for count in (2, 5, 40):
        entries = (ENTRIES * 8)[:count]
        tails = [encode_deliver_tail(*entry) for entry in entries]
        pair.broker.deliver_encoded_many(sub, 9, tails)
        (frame,) = split_frames(pair.broker.data_to_send())
        body = frame[LENGTH_PREFIX:]
        decoded = decode_body(body)
        encoded = _fast_message_encoded(frame, LENGTH_PREFIX, len(frame))
        assert isinstance(encoded, EncodedDeliveries)
        assert isinstance(decoded, DeliverMany)
        assert encoded.entries == [encode_deliver_tail(*entry) for entry in decoded.entries]
        # Truncated or with bytes after it: not this frame (the general way says why).
        assert _fast_message_encoded(frame[:-1], LENGTH_PREFIX, len(frame) - 1) is None
        assert _fast_message_encoded(frame + b"\xf6", LENGTH_PREFIX, len(frame) + 1) is None
