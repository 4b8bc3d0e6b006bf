"""What the output queue really holds is what ``memory_to_send`` counts
(issue 18, item 5: a client that sends Pings and reads nothing made the
broker queue a 7-byte Pong per Ping, each costing about 56 bytes, so a
bound on the queue's bytes let it hold eight times that in memory)."""

from __future__ import annotations

import tracemalloc

from broker.protocol import Deliver, Ping, Policy
from broker.protocol.connection import PIECE_OVERHEAD
from broker.protocol.frames import encode, encode_deliver_tail

from .pair import ConnectionPair, split_frames


def test_memory_to_send_covers_what_many_small_frames_really_hold() -> None:
    pair = ConnectionPair()
    broker = pair.broker
    pings = encode(Ping(1)) * 1000
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(50):
            broker.receive_data(pings, 0.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert broker.bytes_to_send == 50_000 * len(encode(Ping(1)))
    assert held > 5 * broker.bytes_to_send  # what the bytes alone miss
    # An upper estimate, and not a wild one.
    assert held <= broker.memory_to_send <= 2 * held
    assert broker.data_to_send() and broker.memory_to_send == broker.bytes_to_send == 0


def test_memory_to_send_adds_little_to_large_frames() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    for _ in range(10):
        pair.client.publish(topic, b"p" * 10_000)
    queued = pair.client.bytes_to_send
    assert pair.client.memory_to_send - queued <= 10 * 2 * PIECE_OVERHEAD


def test_pieces_to_send_hand_out_a_large_shared_tail_without_copying_it() -> None:
    """A message fanned out to many subscriptions of one connection is queued
    as one tail shared by all its Deliver frames; the server's writer used
    to join the whole queue into one buffer, a copy per subscription (one
    65 KB publish to 9,000 subscriptions of non-reading clients: +560 MiB).
    ``pieces_to_send`` hands large tails out as they are: the same object,
    once per frame; small pieces are joined as before."""
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=1 << 30))
    topic = pair.client.bind_topic("t")
    pair.run()
    subscriptions = []
    for _ in range(50):
        subscriptions.append(pair.client.subscribe(topic))
        pair.run()
    pair.broker.data_to_send()  # (what the setting up queued)
    tail = encode_deliver_tail(b"p" * 20_000, None, None)
    for seq, sub in enumerate(subscriptions, 1):
        pair.broker.deliver_encoded(sub, seq, tail)
    pair.broker.ping()  # a small frame at the end
    pieces = pair.broker.pieces_to_send(0.0)
    assert sum(piece is tail for piece in pieces) == 50
    assert len(pieces) == 101  # a head, the tail; ...; the last head joined with the Ping
    assert pair.broker.bytes_to_send == 0 and pair.broker.pieces_to_send() == []
    frames = split_frames(b"".join(pieces))
    assert frames[:1] == [encode(Deliver(subscriptions[0], 1, b"p" * 20_000, None, None))]
    assert len(frames) == 51
    # Small frames only: one joined buffer, as data_to_send gives.
    pair.broker.ping()
    pair.broker.ping()
    assert pair.broker.pieces_to_send() == [encode(Ping(2)) + encode(Ping(3))]
