"""What the output queue really holds is what ``memory_to_send`` counts
(issue 18, item 5: a client that sends Pings and reads nothing made the
broker queue a 7-byte Pong per Ping, each costing about 56 bytes, so a
bound on the queue's bytes let it hold eight times that in memory)."""

from __future__ import annotations

import tracemalloc

from broker.protocol import PIECE_OVERHEAD, Ping, encode

from .pair import ConnectionPair


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
