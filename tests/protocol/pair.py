"""ConnectionPair: a client and a broker endpoint joined by two FIFO wires.

Nothing moves unless a test says so: :meth:`ConnectionPair.flush` puts what
each side queued onto its wire, frame by frame, and the ``to_broker`` /
``to_client`` steps deliver frames one at a time, so a test (or hypothesis)
chooses the interleaving. Events from each side are collected in order.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from broker.protocol import (
    Connection,
    ConnectionClosed,
    Event,
    HelloReceived,
    Policy,
    Role,
)

SESSION = bytes(range(16))
EPOCH = b"epoch-1"


def of(kind: type, events: list[Event]) -> list[Any]:
    """The events of one type, in order."""
    return [event for event in events if isinstance(event, kind)]


def split_frames(data: bytes) -> list[bytes]:
    """Cut a byte stream made of whole frames into its frames."""
    frames = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        frames.append(data[pos : pos + 4 + length])
        pos += 4 + length
    assert pos == len(data), "a connection queued a partial frame"
    return frames


class ConnectionPair:
    """A client and a broker connection with explicit, stepwise delivery."""

    def __init__(
        self,
        *,
        client_policy: Policy | None = None,
        broker_policy: Policy | None = None,
        handshake: bool = True,
        deliver_many: bool = False,
        broker_max_frame: int | None = None,
        publish_many: bool = False,
    ) -> None:
        """``deliver_many``: the client's Hello says it reads DeliverMany frames.
        ``broker_max_frame``: the broker's ``max_frame`` (announced in Welcome)."""
        self.client = Connection(Role.CLIENT, policy=client_policy)
        if broker_max_frame is None:
            self.broker = Connection(Role.BROKER, policy=broker_policy)
        else:
            self.broker = Connection(Role.BROKER, policy=broker_policy, max_frame=broker_max_frame)
        self.deliver_many = deliver_many
        self.publish_many = publish_many
        self.wire_to_broker: deque[bytes] = deque()
        self.wire_to_client: deque[bytes] = deque()
        self.client_events: list[Event] = []
        self.broker_events: list[Event] = []
        self.now = 0.0
        if handshake:
            self.handshake()

    def handshake(self) -> None:
        self.client.hello(
            "test-client", deliver_many=self.deliver_many, publish_many=self.publish_many
        )
        self.flush()
        events = self.to_broker()
        assert isinstance(events[0], HelloReceived)
        self.broker.welcome(session=SESSION, epoch=EPOCH)
        self.run()

    def flush(self) -> None:
        """Move everything both sides queued onto the wires."""
        self.wire_to_broker.extend(split_frames(self.client.data_to_send(self.now)))
        self.wire_to_client.extend(split_frames(self.broker.data_to_send(self.now)))

    def to_broker(self, frames: int = 1) -> list[Event]:
        """Deliver up to ``frames`` frames from the client's wire to the broker."""
        self.flush()
        events: list[Event] = []
        for _ in range(min(frames, len(self.wire_to_broker))):
            events += self.broker.receive_data(self.wire_to_broker.popleft(), self.now)
        self.broker_events += events
        self.flush()
        return events

    def to_client(self, frames: int = 1) -> list[Event]:
        """Deliver up to ``frames`` frames from the broker's wire to the client."""
        self.flush()
        events: list[Event] = []
        for _ in range(min(frames, len(self.wire_to_client))):
            events += self.client.receive_data(self.wire_to_client.popleft(), self.now)
        self.client_events += events
        self.flush()
        return events

    def run(self, max_steps: int = 100_000) -> None:
        """Deliver everything, both ways, until both wires are empty."""
        self.flush()
        steps = 0
        while self.wire_to_broker or self.wire_to_client:
            self.to_broker(len(self.wire_to_broker))
            self.to_client(len(self.wire_to_client))
            steps += 1
            assert steps < max_steps, "the peers keep talking forever"

    def closed_events(self) -> list[ConnectionClosed]:
        return [
            e for e in self.client_events + self.broker_events if isinstance(e, ConnectionClosed)
        ]

    def assert_no_errors(self) -> None:
        closed = self.closed_events()
        assert not closed, f"a peer closed: {closed}"


class FrameMover:
    """For state machines over a :class:`ConnectionPair` (``self.pair``):
    move frames one at a time, handing what each side reports to the
    machine's ``_broker_events`` and ``_client_events``."""

    pair: ConnectionPair

    def _broker_events(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _client_events(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _to_broker(self, frames: int) -> None:
        """Deliver up to ``frames`` frames to the broker, one at a time."""
        for _ in range(frames):
            self.pair.flush()
            if not self.pair.wire_to_broker:
                return
            self._broker_events(self.pair.to_broker(1))

    def _to_client(self, frames: int) -> None:
        """Deliver up to ``frames`` frames to the client, one at a time."""
        for _ in range(frames):
            self.pair.flush()
            if not self.pair.wire_to_client:
                return
            self._client_events(self.pair.to_client(1))

    def _run_all(self) -> None:
        """Deliver everything both ways, one frame at a time."""
        self.pair.flush()
        while self.pair.wire_to_broker or self.pair.wire_to_client:
            self._to_broker(len(self.pair.wire_to_broker))
            self._to_client(len(self.pair.wire_to_client))
            self.pair.flush()
