"""One end of a broker connection, sans-IO: bytes in, events out, bytes to send.

A :class:`Connection` never performs I/O and never reads a clock. Feed it
what the socket produced with :meth:`Connection.receive_data` (passing the
current time), act on the events it returns, and write
:meth:`Connection.data_to_send` to the socket. The same class serves both
roles: a client publishes and receives deliveries; a broker receives
publishes and sends deliveries.

A peer that breaks the protocol never gets a traceback out of this class:
:meth:`receive_data` queues a ``Goodbye`` with the matching code, reports
:class:`ConnectionClosed` carrying the error, and the frame that broke the
rule has changed nothing.

The class is assembled from one module per job, each layered on the ones it
needs (no module imports one that imports it):

- ``_writer``: the output queue (:class:`FrameWriter`);
- ``_core``: the connection's state and shared look-ups; per-handle state
  lives in one object per handle (``_handle_state``);
- ``_flow``: guarantee operations and sending within guarantees;
- ``_binds``: binding, resolving and freeing handles;
- ``_control``: received control messages, and staging requests;
- ``_resume`` and ``_handshake``: sessions, Hello/Welcome, keepalive, Goodbye;
- ``_traffic``: publish and deliver, and their notices;
- this module: reading frames and dispatching each to its handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import ConnectionClosed, Event
from ..frames._encode import publish_prefix
from ..frames._messages import (
    Abort,
    Absolve,
    Ack,
    Admin,
    AdminAnswer,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Commit,
    Confirm,
    Deliver,
    DeliverGroup,
    DeliverMany,
    DeliverMatched,
    DeliverTimed,
    EncodedDeliveries,
    FramePart,
    FreeHandle,
    Gap,
    Goodbye,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Matched,
    MatchedGap,
    Offsets,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishMany,
    Settle,
    Subscribe,
    Throttled,
    Welcome,
)
from ._control import ControlHandling
from ._core import (
    DELIVER_SLACK,
    MAX_HELLO_FRAME,
    ConnectionState,
    ConnectionStatistics,
    NoGuarantees,
)
from ._handshake import Handshake
from ._large import LargeMessages
from ._publish_many import ManyPublishing
from ._short_run import ShortRun
from ._writer import MAX_REASON, PIECE_OVERHEAD

__all__ = [
    "DELIVER_SLACK",
    "MAX_HELLO_FRAME",
    "MAX_REASON",
    "PIECE_OVERHEAD",
    "Connection",
    "ConnectionState",
    "ConnectionStatistics",
    "NoGuarantees",
]


class Connection(Handshake, ManyPublishing, LargeMessages, ControlHandling):
    """The protocol state of one connection, for either role."""

    def receive_data(
        self,
        data: bytes | bytearray | memoryview,
        now: float,
        *,
        max_frames: int | None = None,
    ) -> list[Event]:
        """Process bytes from the peer; returns what happened, in order.

        With ``max_frames``, at most that many frames are handled; the rest
        stay buffered (:attr:`frames_waiting`) for the next call, which may
        pass no new bytes: so that a caller can bound the work of one turn
        whatever a read brought (a read of tiny frames holds thousands). A
        run of Publish frames on one handle that began within the limit is
        finished past it, up to ``max_frames`` frames of its own (at most
        ``2 * max_frames - 1`` in all): so the broker appends it as one batch.

        A protocol violation ends the list with :class:`ConnectionClosed`
        (with ``error`` set) after queueing a ``Goodbye``; frames before the
        bad one stay applied, the bad one changes nothing.
        """
        if self.state is ConnectionState.CLOSED:
            return []
        if self.state is ConnectionState.IDLE:
            raise LocalProtocolError("call hello() before receiving data")
        events: list[Event] = []
        self._decoder.feed(data)
        if data:
            self.liveness.on_received(now)
        handlers = _HANDLERS
        closed = ConnectionState.CLOSED
        frames = received = 0
        run: ShortRun | None = None
        decoder = self._decoder
        try:
            for message, size in decoder.messages(max_frames):
                frames += 1
                received += size
                kind = type(message)
                if run is not None and kind is run.kind and run.take(message, size, events):
                    continue
                self._run = None
                handlers[kind](self, message, size, events)
                run = cast("ShortRun | None", self._run)  # (the handler may set it)
                if max_frames is not None:
                    # A run of publishes begun within the limit may go past
                    # it, up to ``max_frames`` of its own: one batch for the
                    # broker, not two (a cut run costs a second batch).
                    decoder.extend = (
                        None
                        if run is None or run.topic is None or frames > max_frames
                        else (publish_prefix(run.handle), frames - 1 + max_frames)
                    )
                if self.state is closed:
                    break
        except RemoteProtocolError as error:
            reason = self._writer.queue_goodbye(int(error.code), error.reason)
            self.state = ConnectionState.CLOSED
            events.append(ConnectionClosed(int(error.code), reason, False, error))
        finally:
            decoder.extend = None
            self.frames_received += frames
            self.bytes_received += received
        return events

    @property
    def frames_waiting(self) -> bool:
        """Whole frames received are still to be handled (``receive_data``
        stopped at its ``max_frames``): call it again, with or without new
        bytes."""
        return self.state is not ConnectionState.CLOSED and self._decoder.frame_ready


#: How each received message is handled: unbound, as a per-connection table of
#: bound methods would make every connection a cycle only the collector frees.
_HANDLERS: dict[type, Callable[[Connection, Any, int, list[Event]], None]] = {
    Publish: Connection._on_publish,
    PublishMany: Connection._on_publish_many,
    Deliver: Connection._on_deliver,
    DeliverMany: Connection._on_deliver_many,
    EncodedDeliveries: Connection._on_encoded_deliveries,
    DeliverTimed: Connection._on_deliver_prefixed,
    DeliverGroup: Connection._on_deliver_prefixed,
    DeliverMatched: Connection._on_deliver_prefixed,
    Matched: Connection._on_matched,
    MatchedGap: Connection._on_matched,
    FramePart: Connection._on_frame_part,
    IssueGuarantee: Connection._on_issue_guarantee,
    Ack: Connection._on_notice,
    Settle: Connection._on_notice,
    Gap: Connection._on_notice,
    Confirm: Connection._on_notice,
    Ping: Connection._on_ping,
    Pong: Connection._on_passthrough,
    Throttled: Connection._on_throttled,
    Goodbye: Connection._on_goodbye,
    Absolve: Connection._on_absolve,
    Plead: Connection._on_plead,
    LimitSending: Connection._on_limit_sending,
    LimitReceiving: Connection._on_limit_receiving,
    AnnounceDropping: Connection._on_announce_dropping,
    Apologise: Connection._on_apologise,
    FreeHandle: Connection._on_free_handle,
    BindTopic: Connection._on_bind_frame,
    Subscribe: Connection._on_bind_frame,
    Hello: Connection._on_hello,
    Welcome: Connection._on_welcome,
    Commit: Connection._on_staging_notice,
    Abort: Connection._on_staging_notice,
    Outcome: Connection._on_staging_notice,
    ListOffsets: Connection._on_staging_notice,
    Offsets: Connection._on_staging_notice,
    Admin: Connection._on_staging_notice,
    AdminAnswer: Connection._on_staging_notice,
}
