"""Which cluster front ends are alive, learned from their heartbeats.

Every front end publishes a small heartbeat (CBOR, below) on a core NATS
subject every fraction of a second and listens to everyone's. The table
here keeps the front ends heard from within ``dead_after`` seconds, plus
this one; the topics' owners are chosen over it by rendezvous hashing
(:class:`broker.protocol.Cluster`). A front end that stops says so (a
``leaving`` heartbeat) and is dropped at once; one that dies silently is
dropped once it has been silent ``dead_after`` seconds.

Sans-IO: no I/O and no clock; the time is passed in as ``now`` (seconds, any
monotonic clock). The trio driver is ``_members_io.py``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import cbor2

from broker.protocol import Cluster, Member

__all__ = [
    "HEARTBEAT_VERSION",
    "FrontEnd",
    "Heartbeat",
    "MalformedHeartbeat",
    "Membership",
    "MembershipStatistics",
    "decode_heartbeat",
    "encode_heartbeat",
]

#: The ``v`` of the heartbeats written here. A decoder takes only its own
#: version (an incompatible change bumps it); keys it does not know are
#: ignored, so a compatible addition needs no new version.
HEARTBEAT_VERSION = 1

#: Heartbeats are a few dozen bytes; anything much longer is not one.
MAX_HEARTBEAT_BYTES = 1024
#: The longest id and host name taken (a DNS name is at most 253 characters).
MAX_ID_CHARS = 64
MAX_HOST_CHARS = 255


@dataclass(frozen=True, slots=True, order=True)
class FrontEnd:
    """One cluster front end, as its heartbeat describes it.

    ``id`` is unique per process start (the caller draws it, e.g. 12 hex
    characters of randomness), so a restarted front end is a new member;
    clients connect directly to ``host:port``, other front ends' links to
    ``link_host:link_port``.
    """

    id: str
    host: str
    port: int
    link_host: str
    link_port: int

    def member(self) -> Member:
        """Its entry in a :class:`~broker.protocol.Cluster` (id and client address)."""
        return Member(self.id, self.host, self.port)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A decoded heartbeat: who, and whether it is leaving for good."""

    front_end: FrontEnd
    leaving: bool


class MalformedHeartbeat(ValueError):
    """Bytes on the membership subject that are not a heartbeat of our version."""


def encode_heartbeat(front_end: FrontEnd, leaving: bool = False) -> bytes:
    """The heartbeat of ``front_end``: a CBOR map of ``v``, ``id``, ``host``,
    ``port``, ``link_host``, ``link_port`` and ``leaving``."""
    return cbor2.dumps(
        {
            "v": HEARTBEAT_VERSION,
            "id": front_end.id,
            "host": front_end.host,
            "port": front_end.port,
            "link_host": front_end.link_host,
            "link_port": front_end.link_port,
            "leaving": leaving,
        }
    )


def _reject_tag(decoder: Any, *_: Any) -> Any:
    raise cbor2.CBORDecodeError("CBOR tags are not allowed")


class _EveryTag(dict[int, Any]):
    """Maps every semantic tag to a rejection (cbor2 would otherwise build
    datetimes, sets, shared references, ...)."""

    def __missing__(self, key: int) -> Any:
        return _reject_tag

    def __contains__(self, key: object) -> bool:
        return True


_NO_TAGS = _EveryTag()


def _text(value: object, what: str, longest: int) -> str:
    if type(value) is not str or not 0 < len(value) <= longest:
        raise MalformedHeartbeat(f"{what} must be a text string of 1 to {longest} characters")
    return value


def _port(value: object, what: str) -> int:
    if type(value) is not int or not 0 < value < 65536:
        raise MalformedHeartbeat(f"{what} must be a port number")
    return value


def decode_heartbeat(data: bytes) -> Heartbeat:
    """The heartbeat in ``data``; :class:`MalformedHeartbeat` for anything
    else (whatever the bytes: no other exception)."""
    if len(data) > MAX_HEARTBEAT_BYTES:
        raise MalformedHeartbeat(f"a heartbeat is at most {MAX_HEARTBEAT_BYTES} bytes")
    stream = io.BytesIO(data)
    try:
        value = cbor2.CBORDecoder(
            stream,
            max_depth=4,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            str_errors="strict",
            tag_hook=_reject_tag,
            semantic_decoders=_NO_TAGS,
        ).decode()
    except Exception as exc:  # cbor2 raises several types for garbage; all mean the same
        raise MalformedHeartbeat(f"not valid CBOR ({str(exc)[:120]})") from None
    if stream.tell() != len(data):
        raise MalformedHeartbeat("bytes after the heartbeat")
    if type(value) is not dict:
        raise MalformedHeartbeat("a heartbeat is a CBOR map")
    version = value.get("v")
    if type(version) is not int or version != HEARTBEAT_VERSION:
        raise MalformedHeartbeat(f"a heartbeat of version {HEARTBEAT_VERSION} was expected")
    leaving = value.get("leaving")
    if type(leaving) is not bool:
        raise MalformedHeartbeat("leaving must be a boolean")
    front_end = FrontEnd(
        _text(value.get("id"), "id", MAX_ID_CHARS),
        _text(value.get("host"), "host", MAX_HOST_CHARS),
        _port(value.get("port"), "port"),
        _text(value.get("link_host"), "link_host", MAX_HOST_CHARS),
        _port(value.get("link_port"), "link_port"),
    )
    return Heartbeat(front_end, leaving)


@dataclass(frozen=True, slots=True)
class MembershipStatistics:
    """A membership table's counts: live members (this one included), changes
    of the member set since it started, members gone by saying they leave
    and by falling silent, heartbeats heard, malformed ones among them
    (ignored), and heartbeats naming this front end's id with other
    addresses (ignored: another process claims our id)."""

    members: int
    changes: int
    left: int
    expired: int
    heard: int
    malformed: int
    conflicts: int


class Membership:
    r"""The live front ends as seen by ``me`` (sans-IO: see the module).

    Promises: ``me`` is always a member; a front end heard (not leaving)
    less than ``dead_after`` seconds ago is a member, unless it is
    :meth:`suspect`\ ed; one silent that long or longer is gone after the
    next :meth:`expire`; one that sent a ``leaving`` heartbeat is gone at
    once. :attr:`epoch` increases exactly
    when the set of members (addresses included) changes.
    """

    def __init__(self, me: FrontEnd, *, dead_after: float = 2.0) -> None:
        if not dead_after > 0:
            raise ValueError("dead_after must be positive")
        self.me = me
        self.dead_after = dead_after
        #: Whether one of our own heartbeats came back (the subject's round trip works).
        self.echoed = False
        self._others: dict[str, FrontEnd] = {}
        self._last_heard: dict[str, float] = {}
        self._epoch = 1
        self._members: tuple[FrontEnd, ...] = (me,)
        self._left = 0
        self._expired = 0
        self._heard = 0
        self._malformed = 0
        self._conflicts = 0

    @property
    def epoch(self) -> int:
        """Increases by one on every change of :attr:`members` (1 at the start)."""
        return self._epoch

    @property
    def members(self) -> tuple[FrontEnd, ...]:
        """The live front ends, ``me`` included, sorted by id."""
        return self._members

    def _changed(self) -> None:
        self._epoch += 1
        self._members = tuple(sorted((self.me, *self._others.values()), key=lambda f: f.id))

    def heard(self, data: bytes, now: float) -> bool:
        """Take a message heard on the membership subject at ``now``; whether
        the members changed. Malformed messages and heartbeats naming our own
        id are counted and change nothing."""
        self._heard += 1
        try:
            heartbeat = decode_heartbeat(data)
        except MalformedHeartbeat:
            self._malformed += 1
            return False
        front_end = heartbeat.front_end
        if front_end.id == self.me.id:
            if front_end != self.me:
                self._conflicts += 1
            elif not heartbeat.leaving:
                self.echoed = True
            return False
        if heartbeat.leaving:
            self._last_heard.pop(front_end.id, None)
            if self._others.pop(front_end.id, None) is None:
                return False
            self._left += 1
            self._changed()
            return True
        self._last_heard[front_end.id] = now
        if self._others.get(front_end.id) == front_end:
            return False
        self._others[front_end.id] = front_end
        self._changed()
        return True

    def expire(self, now: float) -> bool:
        """Drop the front ends silent for ``dead_after`` seconds or longer at
        ``now`` (never ``me``); whether the members changed."""
        dead_after = self.dead_after
        gone = [key for key, last in self._last_heard.items() if last + dead_after <= now]
        for key in gone:
            del self._last_heard[key]
            del self._others[key]
        if gone:
            self._expired += len(gone)
            self._changed()
        return bool(gone)

    def suspect(self, id: str, now: float, silent_for: float) -> None:
        """Front end ``id`` is likely gone (NATS found nobody listening on its
        subject at ``now``): it is dropped once it has been silent
        ``silent_for`` seconds (sooner than ``dead_after``), unless it is
        heard from before; a later heartbeat clears the suspicion."""
        last = self._last_heard.get(id)
        if last is not None and silent_for < self.dead_after:
            self._last_heard[id] = last - (self.dead_after - silent_for)

    def deadline(self) -> float | None:
        """When :meth:`expire` will next drop someone unless heard from
        again (None: no other members): an ``expire(now)`` with ``now`` at or
        after it drops at least one."""
        if not self._last_heard:
            return None
        return min(self._last_heard.values()) + self.dead_after

    def cluster(self) -> Cluster:
        """The protocol's view for ``me``: the epoch, our id and every member's
        client address."""
        return Cluster(self._epoch, self.me.id, tuple(f.member() for f in self._members))

    def link_address(self, id: str) -> tuple[str, int] | None:
        """Where the links of member ``id`` connect (None: not a member)."""
        front_end = self.me if id == self.me.id else self._others.get(id)
        if front_end is None:
            return None
        return front_end.link_host, front_end.link_port

    def statistics(self) -> MembershipStatistics:
        """Its counts now."""
        return MembershipStatistics(
            members=len(self._members),
            changes=self._epoch - 1,
            left=self._left,
            expired=self._expired,
            heard=self._heard,
            malformed=self._malformed,
            conflicts=self._conflicts,
        )
