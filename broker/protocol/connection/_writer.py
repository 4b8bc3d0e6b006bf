"""Bytes out: the queue of encoded frames a connection has for its peer.

Frames are queued whole (a delivery as a per-subscriber head and a shared
tail, two pieces of one frame) and taken out all at once by the connection's
``data_to_send``. The queue counts what it holds, in bytes and in memory
(:data:`PIECE_OVERHEAD`), so a driver can bound a peer that does not read.

A client's Publish frames are queued by topic handle (``_runs``) and go out
grouped, each topic's in the order published, before any frame queued after
them (every other frame closes the runs first): a client publishing
round-robin over many topics sends the broker a run per topic, not one frame
of each in turn, and the broker pays its per-topic work (a log write, a
guarantee, a budget look) once per run instead of once per message. Order
is only ever promised per topic; nothing waits for a run to grow.
"""

from __future__ import annotations

from typing import Any

from .._types import DEFAULT_MAX_FRAME
from ..frames._encode import encode, encode_body
from ..frames._messages import Goodbye, Message

#: Goodbye reasons are cut to this many characters (they may echo peer input).
MAX_REASON = 200
#: What CPython spends on one queued output piece besides its bytes: the
#: header and allocator rounding of a small ``bytes`` object (at most 48)
#: and its slot in the queue's list (8, plus the list's over-allocation).
PIECE_OVERHEAD = 64
#: Queued pieces at least this big (the shared tail of a large message) are
#: handed out by ``pieces_to_send`` as they are, never copied into a joined
#: buffer: a message fanned out to thousands of subscriptions of one
#: connection is queued as one tail shared by all, and stays one.
SHARED_PIECE = 16 * 1024


class FrameWriter:
    """The output side of a connection: frames queued for the peer, a part
    the connection and its other parts own a reference to (it references
    none of them).

    The hot paths of the connection append directly and count directly
    (``frames_sent``, ``bytes_sent``, ``out_size``, or :meth:`count` for a
    batch): a client's publishes to their topic's run (:meth:`run_of`), a
    broker's deliveries to ``out`` (a broker never has runs); everything
    else goes through :meth:`queue` or :meth:`put`, which keep the counts
    and close the runs.
    """

    def __init__(self) -> None:
        #: Largest frame body the peer accepts.
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.frames_sent = 0
        self.bytes_sent = 0
        #: Queued pieces (whole frames, or a frame's head and tail) and their bytes.
        self.out: list[bytes] = []
        self.out_size = 0
        #: Client: Publish frames (pieces) queued since the last other frame,
        #: by topic handle; they go out after ``out`` (see the module).
        self.runs: dict[int, list[bytes]] = {}

    @property
    def bytes_to_send(self) -> int:
        """See :meth:`Connection.bytes_to_send` (its public form)."""
        return self.out_size

    @property
    def memory_to_send(self) -> int:
        """An upper estimate of the memory the output queue holds: its bytes
        plus :data:`PIECE_OVERHEAD` per queued piece. Bound this, not
        :attr:`bytes_to_send`, for a peer that does not read: many tiny
        frames (a Pong per Ping) cost several times their bytes."""
        pieces = len(self.out)
        for run in self.runs.values():
            pieces += len(run)
        return self.out_size + PIECE_OVERHEAD * pieces

    def run_of(self, topic: int) -> list[bytes]:
        """The queue of Publish frames (pieces) of topic handle ``topic``
        (see the module); counted by the caller, as ``_out`` is."""
        run = self.runs.get(topic)
        if run is None:
            run = self.runs[topic] = []
        return run

    def count(self, frames: int, size: int) -> None:
        """``frames`` frames of ``size`` bytes in all were appended directly."""
        self.frames_sent += frames
        self.bytes_sent += size
        self.out_size += size

    def close_runs(self) -> None:
        """Move the queued Publish runs into ``_out``, a topic at a time:
        what a frame queued after them must follow."""
        out = self.out
        for run in self.runs.values():
            out += run
        self.runs.clear()

    def take_output(self) -> bytes:
        """Everything queued, as one buffer; the queue is empty afterwards."""
        if self.runs:
            self.close_runs()
        data = b"".join(self.out)
        self.out.clear()
        self.out_size = 0
        return data

    def take_pieces(self) -> list[bytes]:
        """Everything queued, as buffers to write in order: runs of small
        pieces joined, pieces of :data:`SHARED_PIECE` bytes or more as they
        are (not copied); the queue is empty afterwards."""
        if self.runs:
            self.close_runs()
        out = self.out
        if self.out_size < SHARED_PIECE or max(map(len, out)) < SHARED_PIECE:
            return [self.take_output()] if out else []
        pieces: list[bytes] = []
        run: list[bytes] = []
        for piece in out:
            if len(piece) >= SHARED_PIECE:
                if run:
                    pieces.append(b"".join(run))
                    run = []
                pieces.append(piece)
            else:
                run.append(piece)
        if run:
            pieces.append(b"".join(run))
        out.clear()
        self.out_size = 0
        return pieces

    def queue(self, message: Message) -> None:
        """Queue a message, encoded within the peer's ``max_frame``."""
        self.put(encode(message, max_frame=self.peer_max_frame))

    def queue_all(self, messages: list[Any]) -> None:
        for message in messages:
            self.queue(message)

    def put(self, frame: bytes, tail: bytes = b"") -> None:
        """Queue one frame (optionally as a head and a shared ``tail``), after
        every Publish run queued before it."""
        if self.runs:
            self.close_runs()
        self.out.append(frame)
        if tail:
            self.out.append(tail)
        size = len(frame) + len(tail)
        self.frames_sent += 1
        self.bytes_sent += size
        self.out_size += size

    def queue_goodbye(self, code: int, reason: str) -> str:
        """Queue a Goodbye whose reason is cut to fit; returns the reason sent."""
        reason = reason[:MAX_REASON]
        while len(encode_body(Goodbye(code, reason))) > self.peer_max_frame and reason:
            reason = reason[: len(reason) // 2]
        self.queue(Goodbye(code, reason))
        return reason
