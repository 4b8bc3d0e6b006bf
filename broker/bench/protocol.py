"""Benchmark: the sans-IO protocol, with 100-byte payloads.

Measures, in one process, without sockets:

- ``encode_publish``: ``encode(Publish(...))`` for one frame at a time;
- ``decode_publish``: a stream of Publish frames fed to ``FrameDecoder`` in
  64 KiB chunks (as a socket reader would), every frame fully validated;
- ``encode_deliver_fanout``: one ``encode_deliver_tail`` per published
  message, then a per-subscriber head for each of ten subscribers (the
  figure counts deliveries);
- ``connection_publish``: publishes through a client :class:`Connection`,
  the bytes through a broker :class:`Connection` (decode, guarantee
  accounting, handle references, events), each event released and the
  freed space promised again: the protocol's full per-frame cost.

Each figure is the median of several runs, in frames per second.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from broker.protocol import Channel, ChannelKind, Connection, Policy, Publish, PublishReceived, Role
from broker.protocol.frames import FrameDecoder, encode, encode_deliver, encode_deliver_tail

from ._yardstick import python_loop_10m_s

PAYLOAD = b"x" * 100
CHUNK = 65536


def _rate(work: Callable[[int], int], frames: int, runs: int) -> float:
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        done = work(frames)
        rates.append(done / (time.perf_counter() - start))
    return statistics.median(rates)


def _encode_publish(frames: int) -> int:
    for i in range(frames):
        encode(Publish(i & 0xFF, PAYLOAD))
    return frames


def _decode_publish(frames: int) -> int:
    stream = encode(Publish(7, PAYLOAD)) * frames
    decoder = FrameDecoder()
    count = 0
    for start in range(0, len(stream), CHUNK):
        decoder.feed(stream[start : start + CHUNK])
        for _message, _size in decoder.messages():
            count += 1
    assert count == frames
    return count


def _encode_deliver_fanout(frames: int) -> int:
    subscribers = range(10)
    publishes = frames // 10
    for seq in range(publishes):
        tail = encode_deliver_tail(PAYLOAD, None, None)
        for subscriber in subscribers:
            encode_deliver(subscriber, seq, tail)
    return publishes * 10


def _connection_publish(frames: int) -> int:
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER, policy=Policy(publish_capacity=1 << 20))
    client.hello("bench")
    broker.receive_data(client.data_to_send(), 0.0)
    broker.welcome(session=bytes(16), epoch=b"bench")
    client.receive_data(broker.data_to_send(), 0.0)
    topic = client.bind_topic("bench")
    broker.receive_data(client.data_to_send(), 0.0)
    client.receive_data(broker.data_to_send(), 0.0)
    channel = Channel(ChannelKind.PUBLISH, topic)
    done = 0
    while done < frames:
        batch = min(client.room(channel) // 120, frames - done)
        for _ in range(batch):
            client.publish(topic, PAYLOAD)
        for event in broker.receive_data(client.data_to_send(), 0.0):
            if isinstance(event, PublishReceived):
                broker.release(event)
                done += 1
        client.receive_data(broker.data_to_send(), 0.0)
    return done


def run(quick: bool = False) -> dict[str, Any]:
    """Run every measurement; returns frames (or deliveries) per second."""
    frames = 20_000 if quick else 300_000
    runs = 1 if quick else 3
    return {
        "python_loop_10m_s": python_loop_10m_s(),
        "payload_bytes": len(PAYLOAD),
        "frames_per_run": frames,
        "encode_publish_per_s": _rate(_encode_publish, frames, runs),
        "decode_publish_per_s": _rate(_decode_publish, frames, runs),
        "encode_deliver_fanout_per_s": _rate(_encode_deliver_fanout, frames, runs),
        "connection_publish_per_s": _rate(_connection_publish, frames // 3, runs),
    }
