"""The NATS client protocol, sans-IO: bytes in, events out, bytes to send.

:class:`NatsConnection` is one client's side of the text protocol across
any number of transports (one at a time). The driver calls
:meth:`~NatsConnection.connection_made` for a new transport, feeds what it
reads to :meth:`~NatsConnection.receive_data` (any chunking: the events
are the same), answers the first :class:`InfoReceived` with
:meth:`~NatsConnection.connect` (after a TLS upgrade if it wants one), and
writes :meth:`~NatsConnection.data_to_send`; time is passed in, and the
keepalive's PINGs are due at :meth:`~NatsConnection.next_deadline`. It
never calls back into the application: parsing only returns events.

What it keeps across transports: the subscriptions (sent again, with what
is left of their ``max_msgs``, at every handshake) and the output the
application queued while no transport was up (sent after the handshake's
PONG, so a refused CONNECT loses none of it). A server's PING is answered
by the protocol itself.

A frame that breaks the protocol (an unknown operation, a size that is
not a number or exceeds the server's ``max_payload``, a payload not ended
by CRLF, a control line without end) gives one :class:`ProtocolViolation`
event and the connection reads nothing more: the driver drops the
transport and connects again.
"""

from __future__ import annotations

import enum
import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ._errors import PayloadTooLarge
from ._headers import Headers, decode_headers, encode_headers

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "ConnectOptions",
    "Connected",
    "Event",
    "InfoReceived",
    "Msg",
    "NatsConnection",
    "Pong",
    "ProtocolViolation",
    "ServerError",
    "StaleConnection",
    "State",
    "encode_subject",
]

#: The server's ``max_payload`` until its INFO says otherwise (its default).
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: The longest control line accepted from the server before it ends.
MAX_CONTROL_LINE = 64 * 1024

_CRLF = b"\r\n"
_PING = b"PING\r\n"
_PONG = b"PONG\r\n"


# ===================================================================== events


@dataclass(slots=True)
class Msg:
    """A message (MSG or HMSG): what subscription ``sid`` received.

    ``reply`` is ``""`` when the sender asked for none; ``headers`` is None
    for a MSG. A status message from the server (no responders, a pull
    request's end, a heartbeat) has ``headers.status`` set."""

    subject: str
    sid: int
    reply: str
    payload: bytes
    headers: Headers | None = None

    @property
    def status(self) -> int | None:
        """The status line's code (503, 404, 408, 409, 100), or None."""
        headers = self.headers
        return None if headers is None else headers.status


@dataclass(slots=True)
class InfoReceived:
    """The server's INFO: the first opens the handshake (answer with
    :meth:`NatsConnection.connect`); later ones update ``connect_urls`` and
    the like."""

    info: dict[str, Any]


@dataclass(slots=True)
class Connected:
    """The server answered the handshake's PING: the CONNECT was accepted."""

    info: dict[str, Any]


@dataclass(slots=True)
class Pong:
    """The answer to :meth:`NatsConnection.ping` with ``token``."""

    token: object


@dataclass(slots=True)
class ServerError:
    """The server's ``-ERR``. ``fatal``: the server closes the connection
    after it (all but permission violations); the connection reads nothing more."""

    message: str
    fatal: bool


@dataclass(slots=True)
class ProtocolViolation:
    """The server's bytes broke the protocol; the connection reads nothing more."""

    reason: str


@dataclass(slots=True)
class StaleConnection:
    """PINGs went unanswered ``max_outstanding_pings`` times in a row."""

    outstanding: int = field(default=0)


Event = Msg | InfoReceived | Connected | Pong | ServerError | ProtocolViolation | StaleConnection


# ==================================================================== options


@dataclass(slots=True)
class ConnectOptions:
    """What the CONNECT says (credentials, name); ``tls_required`` when the
    transport was upgraded."""

    name: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls_required: bool = False
    echo: bool = True
    lang: str = "python-trio"
    version: str = "0.1.0"

    def encode(self) -> bytes:
        """The CONNECT line."""
        body: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "tls_required": self.tls_required,
            "lang": self.lang,
            "version": self.version,
            "protocol": 1,
            "headers": True,
            "no_responders": True,
            "echo": self.echo,
        }
        if self.name is not None:
            body["name"] = self.name
        if self.user is not None:
            body["user"] = self.user
            body["pass"] = self.password or ""
        if self.token is not None:
            body["auth_token"] = self.token
        return b"CONNECT " + json.dumps(body, separators=(",", ":")).encode() + _CRLF


class State(enum.Enum):
    """Where a connection is."""

    #: No transport: output is kept for the next one.
    IDLE = "idle"
    #: A transport is up; the server's INFO has not come.
    AWAITING_INFO = "awaiting info"
    #: The INFO came: :meth:`NatsConnection.connect` is next.
    HANDSHAKE = "handshake"
    #: CONNECT sent; its PING's PONG has not come.
    CONNECTING = "connecting"
    #: Ready: queued output flows.
    CONNECTED = "connected"
    #: The transport is unusable (a violation, a fatal -ERR, stale): drop it.
    FAILED = "failed"


class _Sub:
    __slots__ = ("line", "max_msgs", "received")

    def __init__(self, line: bytes, max_msgs: int | None) -> None:
        self.line = line
        self.max_msgs = max_msgs
        self.received = 0


#: The token of the handshake's PING.
_HANDSHAKE = object()
#: The token of a keepalive PING.
_KEEPALIVE = object()


def encode_subject(subject: str) -> bytes:
    """``subject`` as sent; a ValueError if it is empty or holds whitespace."""
    data = subject.encode()
    if data.split() != [data]:
        raise ValueError(f"subject {subject!r} is empty or holds whitespace")
    return data


# ================================================================ connection


class NatsConnection:
    """One NATS client's protocol state (see the module)."""

    __slots__ = (
        "_control",
        "_handshake_ping",
        "_have",
        "_next_ping",
        "_next_sid",
        "_out",
        "_outstanding",
        "_parts",
        "_pings",
        "_queued_pings",
        "_subs",
        "_wait",
        "info",
        "max_outstanding_pings",
        "max_payload",
        "ping_interval",
        "state",
    )

    def __init__(self, *, ping_interval: float = 120.0, max_outstanding_pings: int = 2) -> None:
        self.state = State.IDLE
        #: The last INFO's fields.
        self.info: dict[str, Any] = {}
        #: The largest message the server takes (and sends): its INFO's.
        self.max_payload = DEFAULT_MAX_PAYLOAD
        self.ping_interval = ping_interval
        self.max_outstanding_pings = max_outstanding_pings
        # Input not parsed yet (the start of a frame), its length, and the
        # length the frame needs before parsing is worth trying again.
        self._parts: list[bytes] = []
        self._have = 0
        self._wait = 0
        # Output: the handshake's and PONGs (sent in any state), the application's.
        self._control = bytearray()
        self._out = bytearray()
        self._handshake_ping = False
        # PINGs sent (their tokens in order) and PINGs in _out not yet handed out.
        self._pings: deque[object] = deque()
        self._queued_pings: list[object] = []
        self._outstanding = 0
        self._next_ping = math.inf
        self._subs: dict[int, _Sub] = {}
        self._next_sid = 1

    # ---------------------------------------------------------------- transport

    def connection_made(self) -> None:
        """A new transport is up: wait for the server's INFO."""
        self._reset_input()
        self._control.clear()
        self._handshake_ping = False
        self._pings.clear()
        self._outstanding = 0
        self._next_ping = math.inf
        self.state = State.AWAITING_INFO

    def connect(self, options: ConnectOptions, now: float) -> None:
        """Queue the CONNECT, its PING and every subscription (after the
        INFO and any TLS upgrade); the application's output follows the PONG."""
        if self.state is not State.HANDSHAKE:
            raise RuntimeError(f"connect() needs the server's INFO first ({self.state.value})")
        control = self._control
        control += options.encode()
        control += _PING
        self._handshake_ping = True
        for sid, sub in self._subs.items():
            control += sub.line
            if sub.max_msgs is not None:
                control += b"UNSUB %d %d\r\n" % (sid, sub.max_msgs - sub.received)
        self.state = State.CONNECTING
        self._next_ping = now + self.ping_interval

    def connection_lost(self) -> list[object]:
        """The transport is gone: the tokens of the PINGs sent on it (their
        PONGs will never come). Output not yet handed out is kept."""
        lost = [token for token in self._pings if token not in (_HANDSHAKE, _KEEPALIVE)]
        self._pings.clear()
        self._control.clear()
        self._handshake_ping = False
        self._reset_input()
        self._outstanding = 0
        self._next_ping = math.inf
        self.state = State.IDLE
        return lost

    def close(self) -> list[object]:
        """No more transports: the tokens of every PING not answered (sent or
        queued); the queued output is dropped."""
        lost = self.connection_lost()
        lost.extend(token for token in self._queued_pings if token is not _KEEPALIVE)
        self._queued_pings = []
        self._out = bytearray()
        return lost

    def _reset_input(self) -> None:
        self._parts = []
        self._have = 0
        self._wait = 0

    # ---------------------------------------------------------------- output

    @property
    def bytes_to_send(self) -> int:
        """How much :meth:`data_to_send` would give now."""
        if self.state is State.CONNECTED:
            return len(self._control) + len(self._out)
        return len(self._control)

    @property
    def pending_bytes(self) -> int:
        """The application's output not yet handed out (what a bound applies to)."""
        return len(self._out)

    def data_to_send(self) -> bytes | bytearray:
        """Everything queued that may go now, as one buffer (the handshake's
        first; the application's once connected)."""
        connected = self.state is State.CONNECTED
        data: bytes | bytearray = b""
        if self._control:
            data = self._control
            self._control = bytearray()
            if self._handshake_ping:
                self._handshake_ping = False
                self._pings.append(_HANDSHAKE)
            if connected and self._out:
                data += self._out
                self._out = bytearray()
                self._hand_out_pings()
        elif connected and self._out:
            data = self._out
            self._out = bytearray()
            self._hand_out_pings()
        return data

    def _hand_out_pings(self) -> None:
        if self._queued_pings:
            self._pings.extend(self._queued_pings)
            self._queued_pings = []

    def publish(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview,
        reply: str | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Queue a PUB (an HPUB with ``headers``; no reply subject if
        ``reply`` is None or ``""``). A payload (with its headers) larger than
        ``max_payload`` raises :class:`PayloadTooLarge`; a subject with
        whitespace a ValueError; nothing is queued then."""
        subject_bytes = subject.encode()
        if subject_bytes.split() != [subject_bytes]:
            raise ValueError(f"subject {subject!r} is empty or holds whitespace")
        size = len(payload)
        out = self._out
        if headers is None:
            if size > self.max_payload:
                raise PayloadTooLarge(size, self.max_payload)
            if reply:
                out += b"PUB %b %b %d\r\n" % (subject_bytes, encode_subject(reply), size)
            else:
                out += b"PUB %b %d\r\n" % (subject_bytes, size)
        else:
            block = encode_headers(headers)
            total = len(block) + size
            if total > self.max_payload:
                raise PayloadTooLarge(total, self.max_payload)
            if reply:
                out += b"HPUB %b %b %d %d\r\n" % (
                    subject_bytes,
                    encode_subject(reply),
                    len(block),
                    total,
                )
            else:
                out += b"HPUB %b %d %d\r\n" % (subject_bytes, len(block), total)
            out += block
        out += payload
        out += _CRLF

    def subscribe(self, subject: str, queue: str | None = None) -> int:
        """Subscribe (now, and again after every reconnect); its sid."""
        subject_bytes = encode_subject(subject)
        sid = self._next_sid
        self._next_sid += 1
        if queue:
            line = b"SUB %b %b %d\r\n" % (subject_bytes, encode_subject(queue), sid)
        else:
            line = b"SUB %b %d\r\n" % (subject_bytes, sid)
        self._subs[sid] = _Sub(line, None)
        if self.state is State.CONNECTING or self.state is State.CONNECTED:
            self._out += line
        return sid

    def unsubscribe(self, sid: int, max_msgs: int | None = None) -> None:
        """Unsubscribe ``sid`` now, or once it has received ``max_msgs`` in all."""
        sub = self._subs.get(sid)
        if sub is None:
            return
        if max_msgs is not None and sub.received < max_msgs:
            sub.max_msgs = max_msgs
            if self.state is State.CONNECTING or self.state is State.CONNECTED:
                self._out += b"UNSUB %d %d\r\n" % (sid, max_msgs)
            return
        del self._subs[sid]
        if self.state is State.CONNECTING or self.state is State.CONNECTED:
            self._out += b"UNSUB %d\r\n" % sid

    def is_subscribed(self, sid: int) -> bool:
        """Whether ``sid`` is a live subscription."""
        return sid in self._subs

    def ping(self, token: object) -> None:
        """Queue a PING: :class:`Pong` with ``token`` comes once the server
        has handled everything queued before it (:meth:`connection_lost`
        gives the token back if its transport breaks first)."""
        self._out += _PING
        self._queued_pings.append(token)

    # ---------------------------------------------------------------- time

    def next_deadline(self) -> float:
        """When :meth:`handle_timer` is next due (``inf``: not connected)."""
        return self._next_ping

    def handle_timer(self, now: float) -> list[Event]:
        """Send the keepalive's PING when due; :class:`StaleConnection` (and
        the connection fails) if too many went unanswered."""
        if now < self._next_ping or self.state is not State.CONNECTED:
            return []
        if self._outstanding >= self.max_outstanding_pings:
            self.state = State.FAILED
            self._next_ping = math.inf
            return [StaleConnection(self._outstanding)]
        self._outstanding += 1
        self.ping(_KEEPALIVE)
        self._next_ping = now + self.ping_interval
        return []

    # ---------------------------------------------------------------- input

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """The events of ``data`` (any part of the server's stream)."""
        state = self.state
        if state is State.IDLE or state is State.FAILED or not data:
            return []
        self._outstanding = 0  # (the server is alive: anything it sends says so)
        if type(data) is not bytes:
            data = bytes(data)
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._wait:
                return []
            buf = b"".join(self._parts)
        else:
            buf = data
        events: list[Event] = []
        pos = self._parse(buf, events)
        if pos < len(buf) and self.state is not State.FAILED:
            rest = buf[pos:] if pos else buf
            self._parts = [rest]
            self._have = len(rest)
        else:
            self._reset_input()
        return events

    def _fail(self, events: list[Event], reason: str) -> int:
        events.append(ProtocolViolation(reason))
        self.state = State.FAILED
        self._next_ping = math.inf
        return -1

    def _parse(self, buf: bytes, events: list[Event]) -> int:
        """Parse whole frames of ``buf``; where the first incomplete one starts."""
        pos = 0
        size_all = len(buf)
        find = buf.find
        subs = self._subs
        while pos < size_all:
            end = find(_CRLF, pos)
            if end < 0:
                if size_all - pos > MAX_CONTROL_LINE:
                    return self._fail(events, "a control line longer than 64 KiB")
                self._wait = size_all - pos + 1
                return pos
            first = buf[pos]
            if first == 77 and buf.startswith(b"MSG ", pos):  # M
                args = buf[pos + 4 : end].split()
                count = len(args)
                try:
                    size = int(args[-1])
                    sid = int(args[1])
                except (ValueError, IndexError):
                    return self._fail(events, f"a bad MSG line: {buf[pos:end]!r}")
                if count not in (3, 4) or size < 0:
                    return self._fail(events, f"a bad MSG line: {buf[pos:end]!r}")
                if size > self.max_payload:
                    return self._fail(events, f"a MSG of {size} bytes, over max_payload")
                start = end + 2
                stop = start + size
                if stop + 2 > size_all:
                    self._wait = stop + 2 - pos
                    return pos
                if not buf.startswith(_CRLF, stop):
                    return self._fail(events, "a MSG payload not ended by CRLF")
                events.append(
                    Msg(
                        args[0].decode(),
                        sid,
                        args[2].decode() if count == 4 else "",
                        buf[start:stop],
                    )
                )
                pos = stop + 2
            elif first == 72 and buf.startswith(b"HMSG ", pos):  # H
                args = buf[pos + 5 : end].split()
                count = len(args)
                try:
                    size = int(args[-1])
                    head = int(args[-2])
                    sid = int(args[1])
                except (ValueError, IndexError):
                    return self._fail(events, f"a bad HMSG line: {buf[pos:end]!r}")
                if count not in (4, 5) or not 0 <= head <= size:
                    return self._fail(events, f"a bad HMSG line: {buf[pos:end]!r}")
                if size > self.max_payload:
                    return self._fail(events, f"an HMSG of {size} bytes, over max_payload")
                start = end + 2
                stop = start + size
                if stop + 2 > size_all:
                    self._wait = stop + 2 - pos
                    return pos
                if not buf.startswith(_CRLF, stop):
                    return self._fail(events, "an HMSG payload not ended by CRLF")
                headers = decode_headers(buf[start : start + head])
                if headers is None:
                    return self._fail(events, "an HMSG header block not starting NATS/1.0")
                events.append(
                    Msg(
                        args[0].decode(),
                        sid,
                        args[2].decode() if count == 5 else "",
                        buf[start + head : stop],
                        headers,
                    )
                )
                pos = stop + 2
            else:
                line = buf[pos:end]
                pos = end + 2
                op = line[:4].upper()
                if op == b"PING":
                    self._control += _PONG
                elif op == b"PONG":
                    self._pong(events)
                elif op == b"INFO":
                    self._info(line[5:], events)
                elif op == b"+OK":
                    pass
                elif op == b"-ERR":
                    message = line[4:].strip().strip(b"'").decode("utf-8", "replace")
                    fatal = not message.lower().startswith("permissions violation")
                    events.append(ServerError(message, fatal))
                    if fatal:
                        self.state = State.FAILED
                        self._next_ping = math.inf
                        return -1
                else:
                    return self._fail(events, f"an unknown operation: {line[:32]!r}")
                if self.state is State.FAILED:
                    return -1
                continue
            sub = subs.get(sid)
            if sub is not None:
                sub.received += 1
                if sub.max_msgs is not None and sub.received >= sub.max_msgs:
                    del subs[sid]
        return pos

    def _pong(self, events: list[Event]) -> None:
        self._outstanding = 0
        if not self._pings:
            return  # (an unasked PONG: nothing waits for it)
        token = self._pings.popleft()
        if token is _HANDSHAKE:
            if self.state is State.CONNECTING:
                self.state = State.CONNECTED
                events.append(Connected(self.info))
        elif token is not _KEEPALIVE:
            events.append(Pong(token))

    def _info(self, body: bytes, events: list[Event]) -> None:
        try:
            info = json.loads(body)
        except ValueError:
            info = None
        if not isinstance(info, dict):
            self._fail(events, f"an INFO that is not a JSON object: {body[:64]!r}")
            return
        self.info = info
        max_payload = info.get("max_payload")
        if isinstance(max_payload, int) and max_payload > 0:
            self.max_payload = max_payload
        if self.state is State.AWAITING_INFO:
            self.state = State.HANDSHAKE
        events.append(InfoReceived(info))
