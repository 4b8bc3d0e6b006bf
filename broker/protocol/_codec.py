"""Framing and CBOR codec: messages to bytes and bytes to messages.

A frame is a ``u32`` big-endian body length ``N`` followed by ``N`` bytes
holding exactly one CBOR array ``[type, field, ...]``. Decoding is strict:
anything that is not exactly a well-formed message of a known type becomes a
:class:`RemoteProtocolError` carrying the Goodbye code to send, and never
another exception. Decoding has no side effects, so a bad frame is never
half-applied. Cutting a byte stream into frames is :mod:`._framing`'s job.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import cbor2

from ._errors import LocalProtocolError, RemoteProtocolError
from ._messages import (
    Abort,
    Absolve,
    Ack,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Commit,
    Confirm,
    Deliver,
    DeliverMany,
    DeliverTimed,
    Entry,
    FreeHandle,
    Gap,
    Goodbye,
    Headers,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Message,
    Offsets,
    Options,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
)
from ._names import topic_name_problem
from ._types import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    U64_MAX,
    Channel,
    ChannelKind,
    MessageType,
)

_LENGTH = struct.Struct(">I")
_MAX_DEPTH = 6  # [type, {map: {k: v}}] is depth 3; options are flat
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


# --------------------------------------------------------------------------- encoding


def _wire_channel(channel: Channel) -> list[int]:
    return [int(channel.kind), channel.index]


def _wire_headers(headers: Headers | None) -> list[list[Any]] | None:
    return None if headers is None else [[name, value] for name, value in headers]


def _fields(message: Message) -> list[Any]:
    """The wire array of ``message``, type code first."""
    match message:
        case Publish(topic, payload, key, headers):
            return [32, topic, payload, key, _wire_headers(headers)]
        case Deliver(subscription, seq, payload, key, headers):
            return [33, subscription, seq, payload, key, _wire_headers(headers)]
        case DeliverTimed(subscription, first_seq, entries, times):
            if not entries or len(entries) > MAX_DELIVER_TIMED or len(times) != len(entries):
                raise LocalProtocolError(
                    f"a DeliverTimed carries 1 to {MAX_DELIVER_TIMED} entries, each with "
                    f"a time, not {len(entries)} entries and {len(times)} times"
                )
            timed: list[Any] = [35, subscription, first_seq]
            for time_ms, (payload, key, headers) in zip(times, entries, strict=True):
                timed += (time_ms, payload, key, _wire_headers(headers))
            return timed
        case DeliverMany(subscription, first_seq, entries):
            if not entries or len(entries) > MAX_DELIVER_MANY:
                raise LocalProtocolError(
                    f"a DeliverMany carries 1 to {MAX_DELIVER_MANY} entries, not {len(entries)}"
                )
            many: list[Any] = [34, subscription, first_seq]
            for payload, key, headers in entries:
                many += (payload, key, _wire_headers(headers))
            return many
        case (
            IssueGuarantee(channel, value)
            | Absolve(channel, value)
            | Plead(channel, value)
            | LimitSending(channel, value)
            | LimitReceiving(channel, value)
        ):
            return [int(message.TYPE), _wire_channel(channel), value]
        case AnnounceDropping(channel) | Apologise(channel):
            return [int(message.TYPE), _wire_channel(channel)]
        case Throttled(channel, throttled):
            return [5, _wire_channel(channel), throttled]
        case Ping(nonce) | Pong(nonce):
            return [int(message.TYPE), nonce]
        case Goodbye(code, reason):
            return [4, int(code), reason]
        case FreeHandle(handle_type, handle, mine):
            return [20, int(handle_type), handle, mine]
        case Ack(subscription, seq):
            return [21, subscription, seq]
        case Gap(subscription, first_seq, count):
            return [22, subscription, first_seq, count]
        case Confirm(topic, count):
            return [23, topic, count]
        case BindTopic(name, None):
            return [30, name]
        case BindTopic(name, Stage(batch, member)):
            return [30, name, [batch, member]]
        case Commit(request, batch, members):
            return [40, request, batch, [[member, count] for member, count in members]]
        case Abort(request, batch):
            return [41, request, batch]
        case Outcome(request, status, messages, reason):
            return [42, request, status, messages, reason]
        case ListOffsets(request, topics):
            return [43, request, None if topics is None else list(topics)]
        case Offsets(request, topics, reason):
            return [44, request, [[name, first, end] for name, first, end in topics], reason]
        case Subscribe(topic, mode, options):
            return [31, topic, mode, options]
        case Hello(version, client, session, processed, token, deliver_many):
            fields: dict[str, Any] = {"client": client, "session": session, "processed": processed}
            if token is not None:
                fields["token"] = token
            if deliver_many:
                fields["deliver_many"] = True
            return [0, version, fields]
        case Welcome():
            welcome: dict[str, Any] = {
                "session": message.session,
                "resumed": message.resumed,
                "epoch": message.epoch,
                "lease_ms": message.lease_ms,
                "heartbeat_ms": message.heartbeat_ms,
                "max_frame": message.max_frame,
                "received": message.received,
            }
            if message.bound is not None:
                welcome["bound"] = list(message.bound)
            if message.subscriptions is not None:
                welcome["subscriptions"] = list(message.subscriptions)
            if message.offsets:
                welcome["offsets"] = True
            return [1, message.version, welcome]
    raise LocalProtocolError(f"not a protocol message: {type(message).__name__}")


def encode_body(message: Message) -> bytes:
    """The CBOR body of ``message`` (without the length prefix)."""
    try:
        return cbor2.dumps(_fields(message))
    except (TypeError, ValueError, cbor2.CBOREncodeError) as exc:
        raise LocalProtocolError(f"cannot encode {type(message).__name__}: {exc}") from exc


def encode(message: Message, *, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The whole frame of ``message``: length prefix and body.

    Raises :class:`LocalProtocolError` if the body would exceed ``max_frame``
    or a field cannot be encoded. The message is not validated beyond what
    encoding needs; :func:`decode_body` is the strict side.
    """
    if type(message) is Publish and message.headers is None:
        body = _publish_body(message)
    else:
        body = encode_body(message)
    if len(body) > max_frame:
        raise LocalProtocolError(
            f"{type(message).__name__} frame of {len(body)} bytes exceeds max_frame {max_frame}"
        )
    return _LENGTH.pack(len(body)) + body


def _cbor_head(major: int, value: int) -> bytes:
    """The CBOR initial byte(s) for ``major`` type with argument ``value``."""
    if value < 24:
        return bytes((major << 5 | value,))
    if value < 0x100:
        return bytes((major << 5 | 24, value))
    if value < 0x10000:
        return bytes((major << 5 | 25,)) + value.to_bytes(2, "big")
    if value < 0x100000000:
        return bytes((major << 5 | 26,)) + value.to_bytes(4, "big")
    return bytes((major << 5 | 27,)) + value.to_bytes(8, "big")


#: CBOR heads of unsigned integers below 24, and of byte strings shorter than 256.
_SMALL_UINT = [bytes((value,)) for value in range(24)]
_SHORT_BLOB = [bytes((0x40 | n,)) if n < 24 else bytes((0x58, n)) for n in range(256)]


_DELIVER_HEAD = _cbor_head(4, 6) + _cbor_head(0, 33)
_PUBLISH_HEAD = _cbor_head(4, 5) + _cbor_head(0, 32)


def encode_publish(topic: int, payload: bytes, key: bytes | None, *, max_frame: int) -> bytes:
    """The whole frame of ``Publish(topic, payload, key)`` (no headers), as
    :func:`encode` makes it; the caller vouches that ``topic`` is a u64 and
    ``payload`` and ``key`` are bytes."""
    size = len(payload)
    blob = _SHORT_BLOB[size] if size < 256 else _cbor_head(2, size)
    handle = _SMALL_UINT[topic] if topic < 24 else _cbor_head(0, topic)
    parts: tuple[bytes, ...]
    if key is None:
        body = len(_PUBLISH_HEAD) + len(handle) + len(blob) + size + 2
        parts = (_LENGTH.pack(body), _PUBLISH_HEAD, handle, blob, payload, b"\xf6\xf6")
    else:
        key_part = _cbor_head(2, len(key)) + key
        body = len(_PUBLISH_HEAD) + len(handle) + len(blob) + size + len(key_part) + 1
        parts = (_LENGTH.pack(body), _PUBLISH_HEAD, handle, blob, payload, key_part, _NULL)
    if body > max_frame:
        raise LocalProtocolError(f"Publish frame of {body} bytes exceeds max_frame {max_frame}")
    return b"".join(parts)


def _publish_body(message: Publish) -> bytes:
    """The body of a Publish without headers, as :func:`encode_body` makes it."""
    topic, payload, key = message.topic, message.payload, message.key
    if type(payload) is not bytes or not (key is None or type(key) is bytes):
        return encode_body(message)  # says what is wrong with it
    if type(topic) is not int or not 0 <= topic <= U64_MAX:
        return encode_body(message)
    key_part = _NULL if key is None else _cbor_head(2, len(key)) + key
    return b"".join(
        (_PUBLISH_HEAD, _cbor_head(0, topic), _cbor_head(2, len(payload)), payload, key_part, _NULL)
    )


_NULL = b"\xf6"


def encode_deliver_tail(payload: bytes, key: bytes | None, headers: Headers | None) -> bytes:
    """The part of a Deliver frame shared by every subscriber of one publish.

    Encode it once per published message and pass it to
    :func:`encode_deliver` for each subscriber: the payload is never
    re-encoded per subscriber.
    """
    if headers is None and type(payload) is bytes:
        # The common case, without a trip through the generic encoder.
        size = len(payload)
        blob = _SHORT_BLOB[size] if size < 256 else _cbor_head(2, size)
        if key is None:
            return b"".join((blob, payload, b"\xf6\xf6"))
        return b"".join((blob, payload, _cbor_head(2, len(key)), key, _NULL))
    return b"".join(cbor2.dumps(item) for item in (payload, key, _wire_headers(headers)))


def _uint_head(value: int) -> bytes:
    return _SMALL_UINT[value] if value < 24 else _cbor_head(0, value)


def deliver_heads(subscription: int, first_seq: int, tails: list[bytes]) -> Iterator[bytes]:
    """The heads of Deliver frames of ``tails`` on ``subscription``, with
    sequence numbers from ``first_seq``: ``head + tail`` is each frame, as
    :func:`encode_deliver` makes it. The caller vouches for u64 values."""
    middle = _DELIVER_HEAD + _uint_head(subscription)
    fixed = len(middle)
    pack = _LENGTH.pack
    # The usual sequence numbers (65536 and on) in one struct call per head.
    pack_wide = _wide_head_struct(fixed).pack
    seq = first_seq
    for tail in tails:
        if 0x10000 <= seq <= 0xFFFFFFFF:
            yield pack_wide(fixed + 5 + len(tail), middle, 0x1A, seq)
        else:
            seq_head = _uint_head(seq)
            yield pack(fixed + len(seq_head) + len(tail)) + middle + seq_head
        seq += 1


_WIDE_HEADS: dict[int, struct.Struct] = {}


def _wide_head_struct(fixed: int) -> struct.Struct:
    """Packs a Deliver head whose sequence number takes 4 bytes: the frame
    length, the ``fixed`` bytes before the sequence number, and it."""
    packer = _WIDE_HEADS.get(fixed)
    if packer is None:
        packer = _WIDE_HEADS[fixed] = struct.Struct(f">I{fixed}sBI")
    return packer


#: Most entries one DeliverMany carries (its array head then takes at most 3 bytes).
MAX_DELIVER_MANY = (0xFFFF - 3) // 3
_DELIVER_MANY_TYPE = _cbor_head(0, 34)


def deliver_many_head_size(subscription: int, first_seq: int, count: int) -> int:
    """The size of :func:`deliver_many_head` for these values: what a
    DeliverMany adds to its entries (at most 27 bytes)."""
    items = 3 + 3 * count
    array = 1 if items < 24 else 2 if items < 0x100 else 3
    fields = len(_uint_head(subscription)) + len(_uint_head(first_seq))
    return LENGTH_PREFIX + array + len(_DELIVER_MANY_TYPE) + fields


def deliver_many_head(subscription: int, first_seq: int, count: int, entries_size: int) -> bytes:
    """The length prefix and head of a DeliverMany frame of ``count``
    entries on ``subscription`` from ``first_seq``, whose entries (Deliver
    tails, see :func:`encode_deliver_tail`) take ``entries_size`` bytes: the
    head followed by the tails is the frame. The caller vouches for u64
    values and ``1 <= count <= MAX_DELIVER_MANY``."""
    head = b"".join(
        (
            _cbor_head(4, 3 + 3 * count),
            _DELIVER_MANY_TYPE,
            _uint_head(subscription),
            _uint_head(first_seq),
        )
    )
    return _LENGTH.pack(len(head) + entries_size) + head


#: Most entries one DeliverTimed carries (its array head then takes at most 3 bytes).
MAX_DELIVER_TIMED = (0xFFFF - 3) // 4
_DELIVER_TIMED_TYPE = _cbor_head(0, 35)


def deliver_timed_head(subscription: int, first_seq: int, count: int, entries_size: int) -> bytes:
    """The length prefix and head of a DeliverTimed frame of ``count``
    entries on ``subscription`` from ``first_seq``, whose entries (each a
    :func:`time_head` followed by a Deliver tail) take ``entries_size``
    bytes. The caller vouches for u64 values and ``1 <= count <=
    MAX_DELIVER_TIMED``; the head is at most 27 bytes."""
    head = b"".join(
        (
            _cbor_head(4, 3 + 4 * count),
            _DELIVER_TIMED_TYPE,
            _uint_head(subscription),
            _uint_head(first_seq),
        )
    )
    return _LENGTH.pack(len(head) + entries_size) + head


_TIME_HEAD = struct.Struct(">BQ").pack


def time_heads(times: list[int]) -> list[bytes]:
    """The CBOR heads of ``times`` (uints), for the entries of a
    DeliverTimed (9 bytes each for any time after 1970-02-19; records
    appended together share one time, and its head)."""
    heads: list[bytes] = []
    append = heads.append
    last = -1
    head = b""
    for time_ms in times:
        if time_ms != last:
            head = _TIME_HEAD(0x1B, time_ms) if time_ms > 0xFFFFFFFF else _uint_head(time_ms)
            last = time_ms
        append(head)
    return heads


def encode_deliver(subscription: int, seq: int, tail: bytes) -> tuple[bytes, bytes]:
    """A Deliver frame as two pieces: a small per-subscriber head, then ``tail``.

    ``head + tail`` is byte-for-byte what :func:`encode` produces for the
    equivalent :class:`Deliver`; a writer can send both pieces without
    joining them.
    """
    if not (0 <= subscription <= U64_MAX and 0 <= seq <= U64_MAX):
        raise LocalProtocolError("subscription and seq must be u64")
    return next(deliver_heads(subscription, seq, [tail])), tail


# --------------------------------------------------------------------------- decoding


def _bad(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what}")


def _show(value: Any) -> str:
    """A short description of a peer-supplied value, cheap whatever its size.

    Never calls ``repr()`` on a container or a huge integer: both can cost
    time quadratic in the frame size (or raise, for integers over 4300 digits).
    """
    kind = type(value)
    if kind is int:
        return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit integer"
    if kind in (str, bytes):
        return repr(value[:24]) + ("..." if len(value) > 24 else "")
    if value is None or kind in (bool, float):
        return repr(value)
    return f"a {kind.__name__}"


def _reject_tag(decoder: Any, *_: Any) -> Any:
    raise cbor2.CBORDecodeError("CBOR tags are not allowed")


class _EveryTag(dict[int, Any]):
    """Maps every semantic tag to a rejection, overriding cbor2's built-in
    decoders (datetimes, bignums, sets, value sharing, ...)."""

    def __missing__(self, key: int) -> Any:
        return _reject_tag

    def __contains__(self, key: object) -> bool:
        return True


_NO_TAGS = _EveryTag()


def _u64(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise _bad(f"{what} must be an unsigned 64-bit integer, got {_show(value)}")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _bad(f"{what} must be a boolean, got {_show(value)}")
    return value


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise _bad(f"{what} must be a text string, got {_show(value)}")
    return value


def _blob(value: Any, what: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(f"{what} must be a byte string, got {_show(value)}")
    return value


def _opt_blob(value: Any, what: str) -> bytes | None:
    return None if value is None else _blob(value, what)


def _channel(value: Any) -> Channel:
    if type(value) is not list or len(value) != 2:
        raise _bad(f"channel must be [kind, index], got {_show(value)}")
    kind = _u64(value[0], "channel kind")
    index = _u64(value[1], "channel index")
    if kind > ChannelKind.DELIVER:
        raise _bad(f"unknown channel kind {kind}")
    if kind <= ChannelKind.SUBSCRIPTION_BINDS and index != 0:
        raise _bad(f"bind channel [{kind},{index}] must have index 0")
    return Channel(ChannelKind(kind), index)


def _headers(value: Any) -> Headers | None:
    if value is None:
        return None
    if type(value) is not list:
        raise _bad("headers must be an array of [name, value] pairs or null")
    headers: Headers = []
    for pair in value:
        if type(pair) is not list or len(pair) != 2:
            raise _bad("each header must be a [name, value] pair")
        headers.append((_text(pair[0], "header name"), _blob(pair[1], "header value")))
    return headers


def _u64_map(value: Any, what: str) -> dict[int, int]:
    if type(value) is not dict:
        raise _bad(f"{what} must be a map of integers")
    return {_u64(k, f"{what} key"): _u64(v, f"{what} value") for k, v in value.items()}


def _options(value: Any) -> Options:
    if type(value) is not dict:
        raise _bad("subscribe options must be a map")
    options: Options = {}
    for key, item in value.items():
        _text(key, "option name")
        if (
            item is None
            or type(item) in (str, bool)
            or (type(item) is int and _I64_MIN <= item <= _I64_MAX)
            or (type(item) is float and math.isfinite(item))
        ):
            options[key] = item
        else:
            raise _bad(f"option {_show(key)} must be a scalar, got {_show(item)}")
    return options


def _record(value: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if type(value) is not dict or value.keys() != keys:
        raise _bad(f"{what} must be a map with exactly the keys {sorted(keys)}")
    return value


_HELLO_KEYS = frozenset({"client", "session", "processed"})
#: A Hello may also carry a credential (absent when the client has none) and
#: say that the client reads DeliverMany frames.
_HELLO_KEYS_OPTIONAL = frozenset({"token", "deliver_many"})
_WELCOME_KEYS = frozenset(
    {"session", "resumed", "epoch", "lease_ms", "heartbeat_ms", "max_frame", "received"}
)
_WELCOME_KEYS_RESUMED = _WELCOME_KEYS | {"bound"}


def _hello(f: list[Any]) -> Hello:
    rec = f[2]
    if type(rec) is not dict or not _HELLO_KEYS <= rec.keys() <= _HELLO_KEYS | _HELLO_KEYS_OPTIONAL:
        raise _bad(
            f"Hello fields must be a map with the keys {sorted(_HELLO_KEYS)} "
            f"and maybe {sorted(_HELLO_KEYS_OPTIONAL)}"
        )
    return Hello(
        _u64(f[1], "version"),
        _text(rec["client"], "client"),
        _opt_blob(rec["session"], "session"),
        _u64_map(rec["processed"], "processed"),
        _secret(rec["token"], "token") if "token" in rec else None,
        _bool(rec["deliver_many"], "deliver_many") if "deliver_many" in rec else False,
    )


def _secret(value: Any, what: str) -> str:
    """A text field that holds a credential: an error names its type, never its value."""
    if type(value) is not str:
        raise _bad(f"{what} must be a text string, got {type(value).__name__}")
    return value


def _welcome(f: list[Any]) -> Welcome:
    fields = f[2]
    resumed = type(fields) is dict and fields.get("resumed") is True
    # A resumed session says how many handles the broker bound, and maybe
    # which subscriptions survive; a new one says neither.
    keys = _WELCOME_KEYS
    if resumed:
        keys = _WELCOME_KEYS_RESUMED | ({"subscriptions"} & fields.keys())
    if type(fields) is dict and "offsets" in fields:
        keys = keys | {"offsets"}
    rec = _record(fields, keys, "Welcome fields")
    session = _blob(rec["session"], "session")
    if len(session) != 16:
        raise _bad("session id must be 16 bytes")
    bound = rec.get("bound")
    if bound is not None:
        if type(bound) is not list or len(bound) != 2:
            raise _bad("bound must be an array of two handle counts")
        bound = (_u64(bound[0], "bound topics"), _u64(bound[1], "bound subscriptions"))
    surviving = rec.get("subscriptions")
    if "subscriptions" in rec:
        if type(surviving) is not list:
            raise _bad("subscriptions must be an array of subscription handles")
        surviving = tuple(_u64(handle, "subscription") for handle in surviving)
        if any(a >= b for a, b in pairwise(surviving)):
            raise _bad("subscriptions must be in ascending order, without repeats")
    return Welcome(
        _u64(f[1], "version"),
        session,
        _bool(rec["resumed"], "resumed"),
        _blob(rec["epoch"], "epoch"),
        _u64(rec["lease_ms"], "lease_ms"),
        _u64(rec["heartbeat_ms"], "heartbeat_ms"),
        _u64(rec["max_frame"], "max_frame"),
        _u64_map(rec["received"], "received"),
        bound,
        surviving,
        _bool(rec["offsets"], "offsets") if "offsets" in rec else False,
    )


def _publish(f: list[Any]) -> Publish:
    return Publish(
        _u64(f[1], "topic"), _blob(f[2], "payload"), _opt_blob(f[3], "key"), _headers(f[4])
    )


def _deliver(f: list[Any]) -> Deliver:
    return Deliver(
        _u64(f[1], "subscription"),
        _u64(f[2], "seq"),
        _blob(f[3], "payload"),
        _opt_blob(f[4], "key"),
        _headers(f[5]),
    )


def _deliver_many(f: list[Any]) -> DeliverMany:
    count, extra = divmod(len(f) - 3, 3)
    if count < 1 or extra:
        raise _bad("a DeliverMany carries whole [payload, key, headers] entries, at least one")
    subscription = _u64(f[1], "subscription")
    first_seq = _u64(f[2], "first_seq")
    if first_seq + count - 1 > U64_MAX:
        raise _bad("the sequence numbers of a DeliverMany must be u64")
    entries = [
        (_blob(f[i], "payload"), _opt_blob(f[i + 1], "key"), _headers(f[i + 2]))
        for i in range(3, len(f), 3)
    ]
    return DeliverMany(subscription, first_seq, entries)


def _deliver_timed(f: list[Any]) -> DeliverTimed:
    count, extra = divmod(len(f) - 3, 4)
    if count < 1 or extra:
        raise _bad(
            "a DeliverTimed carries whole [time, payload, key, headers] entries, one or more"
        )
    subscription = _u64(f[1], "subscription")
    first_seq = _u64(f[2], "first_seq")
    if first_seq + count - 1 > U64_MAX:
        raise _bad("the sequence numbers of a DeliverTimed must be u64")
    times = [_u64(f[i], "time") for i in range(3, len(f), 4)]
    entries = [
        (_blob(f[i], "payload"), _opt_blob(f[i + 1], "key"), _headers(f[i + 2]))
        for i in range(4, len(f), 4)
    ]
    return DeliverTimed(subscription, first_seq, entries, times)


def _goodbye(f: list[Any]) -> Goodbye:
    return Goodbye(_u64(f[1], "code"), _text(f[2], "reason"))


#: Longest batch or member name of a Stage, in characters.
MAX_STAGE_NAME = 256


def _stage_name(value: Any, what: str) -> str:
    name = _text(value, what)
    if not name or len(name) > MAX_STAGE_NAME:
        raise _bad(f"{what} must be 1 to {MAX_STAGE_NAME} characters")
    return name


def _bind_topic(f: list[Any]) -> BindTopic:
    name = _text(f[1], "topic name")
    if len(f) == 2:
        return BindTopic(name)
    stage = f[2]
    if type(stage) is not list or len(stage) != 2:
        raise _bad("a BindTopic stage must be a [batch, member] pair")
    return BindTopic(name, Stage(_stage_name(stage[0], "batch"), _stage_name(stage[1], "member")))


def _commit(f: list[Any]) -> Commit:
    members = f[3]
    if type(members) is not list:
        raise _bad("Commit members must be an array of [member, count] pairs")
    pairs: list[tuple[str, int]] = []
    for pair in members:
        if type(pair) is not list or len(pair) != 2:
            raise _bad("each Commit member must be a [member, count] pair")
        pairs.append((_stage_name(pair[0], "member"), _u64(pair[1], "count")))
    return Commit(_u64(f[1], "request"), _stage_name(f[2], "batch"), pairs)


def _outcome(f: list[Any]) -> Outcome:
    status = _u64(f[2], "status")
    if status > 3:
        raise _bad(f"unknown Outcome status {status}")
    return Outcome(_u64(f[1], "request"), status, _u64(f[3], "messages"), _text(f[4], "reason"))


def _list_offsets(f: list[Any]) -> ListOffsets:
    topics = f[2]
    if topics is None:
        return ListOffsets(_u64(f[1], "request"), None)
    if type(topics) is not list:
        raise _bad("ListOffsets topics must be an array of topic names or null")
    names = []
    for name in topics:
        problem = topic_name_problem(name)
        if problem is not None:
            raise _bad(f"ListOffsets: {problem}")
        names.append(name)
    return ListOffsets(_u64(f[1], "request"), names)


def _offsets(f: list[Any]) -> Offsets:
    entries = f[2]
    if type(entries) is not list:
        raise _bad("Offsets topics must be an array of [name, first, end] triples")
    topics: list[tuple[str, int, int]] = []
    for entry in entries:
        if type(entry) is not list or len(entry) != 3:
            raise _bad("each Offsets entry must be a [name, first, end] triple")
        first, end = _u64(entry[1], "first offset"), _u64(entry[2], "end offset")
        if first > end:
            raise _bad(f"an Offsets entry's first offset {first} is above its end {end}")
        topics.append((_text(entry[0], "topic name"), first, end))
    return Offsets(_u64(f[1], "request"), topics, _text(f[3], "reason"))


def _subscribe(f: list[Any]) -> Subscribe:
    return Subscribe(_u64(f[1], "topic"), _text(f[2], "mode"), _options(f[3]))


def _free(f: list[Any]) -> FreeHandle:
    handle_type = _u64(f[1], "handle_type")
    if handle_type > 1:
        raise _bad(f"unknown handle type {handle_type}")
    return FreeHandle(handle_type, _u64(f[2], "handle"), _bool(f[3], "mine"))


#: type code -> (number of array elements, or the numbers allowed; parser)
_PARSERS: dict[int, tuple[int | tuple[int, ...], Callable[[list[Any]], Message]]] = {
    MessageType.HELLO: (3, _hello),
    MessageType.WELCOME: (3, _welcome),
    MessageType.PING: (2, lambda f: Ping(_u64(f[1], "nonce"))),
    MessageType.PONG: (2, lambda f: Pong(_u64(f[1], "nonce"))),
    MessageType.GOODBYE: (3, _goodbye),
    MessageType.THROTTLED: (3, lambda f: Throttled(_channel(f[1]), _bool(f[2], "throttled"))),
    MessageType.ISSUE_GUARANTEE: (
        3,
        lambda f: IssueGuarantee(_channel(f[1]), _u64(f[2], "amount")),
    ),
    MessageType.ABSOLVE: (3, lambda f: Absolve(_channel(f[1]), _u64(f[2], "amount"))),
    MessageType.PLEAD: (3, lambda f: Plead(_channel(f[1]), _u64(f[2], "target"))),
    MessageType.LIMIT_SENDING: (3, lambda f: LimitSending(_channel(f[1]), _u64(f[2], "bound"))),
    MessageType.LIMIT_RECEIVING: (3, lambda f: LimitReceiving(_channel(f[1]), _u64(f[2], "bound"))),
    MessageType.ANNOUNCE_DROPPING: (2, lambda f: AnnounceDropping(_channel(f[1]))),
    MessageType.APOLOGISE: (2, lambda f: Apologise(_channel(f[1]))),
    MessageType.FREE_HANDLE: (4, _free),
    MessageType.ACK: (3, lambda f: Ack(_u64(f[1], "subscription"), _u64(f[2], "seq"))),
    MessageType.GAP: (
        4,
        lambda f: Gap(_u64(f[1], "subscription"), _u64(f[2], "first_seq"), _u64(f[3], "count")),
    ),
    MessageType.CONFIRM: (3, lambda f: Confirm(_u64(f[1], "topic"), _u64(f[2], "count"))),
    MessageType.BIND_TOPIC: ((2, 3), _bind_topic),
    MessageType.SUBSCRIBE: (4, _subscribe),
    MessageType.PUBLISH: (5, _publish),
    MessageType.DELIVER: (6, _deliver),
    MessageType.DELIVER_MANY: (0, _deliver_many),  # (0: the parser checks the length)
    MessageType.DELIVER_TIMED: (0, _deliver_timed),
    MessageType.COMMIT: (4, _commit),
    MessageType.ABORT: (3, lambda f: Abort(_u64(f[1], "request"), _stage_name(f[2], "batch"))),
    MessageType.OUTCOME: (5, _outcome),
    MessageType.LIST_OFFSETS: (3, _list_offsets),
    MessageType.OFFSETS: (4, _offsets),
}


def _new_decoder(stream: io.BytesIO) -> Any:
    return cbor2.CBORDecoder(
        stream,
        max_depth=_MAX_DEPTH,
        allow_indefinite=False,
        allow_duplicate_keys=False,
        str_errors="strict",
        tag_hook=_reject_tag,
        semantic_decoders=_NO_TAGS,
    )


def _decode_item(decoder: Any, stream: io.BytesIO, start: int, end: int) -> Message:
    """Decode the frame body at ``start:end`` of ``stream`` into a message."""
    stream.seek(start)
    try:
        fields = decoder.decode()
    except Exception as exc:  # cbor2 raises several types for garbage; all mean the same
        raise _bad(f"not valid CBOR ({str(exc)[:120]})") from None
    if stream.tell() != end:
        raise _bad("the CBOR item does not end where the frame ends")
    if type(fields) is not list or not fields:
        raise _bad("a frame must hold a non-empty CBOR array")
    code = fields[0]
    if type(code) is not int:
        raise _bad("the type code must be an integer")
    parser = _PARSERS.get(code)
    if parser is None:
        raise _bad(f"unknown message type {code}")
    arity, parse = parser
    if isinstance(arity, int):
        if arity and len(fields) != arity:
            raise _bad(f"type {code} has {arity - 1} fields, got {len(fields) - 1}")
    elif len(fields) not in arity:
        allowed = " or ".join(str(n - 1) for n in arity)
        raise _bad(f"type {code} has {allowed} fields, got {len(fields) - 1}")
    return parse(fields)


# The two frames that carry messages are most of the traffic. Their usual
# shape (no headers) is read here directly, without the general decoder;
# anything else, well-formed or not, goes the general way. Both ways give
# the same message for the same bytes (tests/protocol/test_codec_fast.py).

_NULL_BYTE = 0xF6


def _fast_uint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned integer at ``pos`` and the position after it; (-1, pos) if none."""
    head = data[pos]
    if head < 24:
        return head, pos + 1
    if head == 24:
        return data[pos + 1], pos + 2
    if head == 25:
        return data[pos + 1] << 8 | data[pos + 2], pos + 3
    if head == 26:
        return int.from_bytes(data[pos + 1 : pos + 5], "big"), pos + 5
    if head == 27:
        return int.from_bytes(data[pos + 1 : pos + 9], "big"), pos + 9
    return -1, pos


def _fast_blob(data: bytes, pos: int) -> tuple[int, int]:
    """Where the byte string at ``pos`` starts and stops; (-1, -1) if there is none."""
    head = data[pos]
    if 0x40 <= head <= 0x57:
        return pos + 1, pos + 1 + head - 0x40
    if head == 0x58:
        return pos + 2, pos + 2 + data[pos + 1]
    if 0x59 <= head <= 0x5B:
        width = 1 << (head - 0x58)
        start = pos + 1 + width
        return start, start + int.from_bytes(data[pos + 1 : start], "big")
    return -1, -1


def _fast_entry(data: bytes, pos: int) -> tuple[bytes, bytes | None, int] | None:
    """The payload and key of a ``payload, key, null`` run of fields (the
    tail of a message without headers) at ``pos``, and the position after
    it; None for anything else."""
    start, stop = _fast_blob(data, pos)
    if start < 0:
        return None
    payload = data[start:stop]
    if data[stop] == _NULL_BYTE:
        key = None
        pos = stop + 1
    else:
        start, pos = _fast_blob(data, stop)
        if start < 0:
            return None
        key = data[start:pos]
    if data[pos] != _NULL_BYTE:
        return None
    return payload, key, pos + 1


def _fast_tail(data: bytes, pos: int, end: int) -> tuple[bytes, bytes | None] | None:
    """The payload and key of a message whose headers are null, read from
    ``pos`` to exactly ``end``; None for anything else."""
    entry = _fast_entry(data, pos)
    if entry is None or entry[2] != end:
        return None
    return entry[0], entry[1]


def _short_and_plain(data: bytes, pos: int, end: int) -> bool:
    """From ``pos``, a payload of 24 to 255 bytes, a null key and null
    headers fill the frame exactly (the commonest tail)."""
    return (
        data[pos] == 0x58
        and pos + 4 + data[pos + 1] == end
        and data[end - 2] == _NULL_BYTE
        and data[end - 1] == _NULL_BYTE
    )


def _fast_run_fields(
    data: bytes, pos: int, count: int, smallest: int, end: int
) -> tuple[int, int, int] | None:
    """The subscription and first sequence number at ``pos`` of a frame of
    ``count`` entries of at least ``smallest`` bytes each, and where its
    entries start; None if they are not those of such a frame."""
    subscription, pos = _fast_uint(data, pos)
    if subscription < 0:
        return None
    first_seq, pos = _fast_uint(data, pos)
    # A count longer than the bytes left could hold is not this frame's.
    if first_seq < 0 or first_seq + count - 1 > U64_MAX or smallest * count > end - pos:
        return None
    return subscription, first_seq, pos


def _fast_many(data: bytes, start: int, end: int) -> DeliverMany | None:
    """The DeliverMany without headers in ``data[start:end]``, or None for
    any other frame (which the general decoder then reads)."""
    first = data[start]
    if 0x86 <= first <= 0x97:
        items, pos = first - 0x80, start + 1
    elif first == 0x98:
        items, pos = data[start + 1], start + 2
    elif first == 0x99:
        items, pos = data[start + 1] << 8 | data[start + 2], start + 3
    else:
        return None
    count, extra = divmod(items - 3, 3)
    if count < 1 or extra or data[pos] != 0x18 or data[pos + 1] != 34:
        if data[pos] == 0x18 and data[pos + 1] == 35:
            return _fast_timed(data, pos + 2, items, end)
        return None
    fields = _fast_run_fields(data, pos + 2, count, 3, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    entries: list[Entry] = []
    append = entries.append
    for _ in range(count):
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 2 + data[pos + 1]
            if data[stop] == _NULL_BYTE and data[stop + 1] == _NULL_BYTE:
                append((data[pos + 2 : stop], None, None))
                pos = stop + 2
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        payload, key, pos = entry
        append((payload, key, None))
    if pos != end:
        return None
    return DeliverMany(subscription, first_seq, entries)


_U64_AT = struct.Struct(">Q")


def _fast_timed(data: bytes, pos: int, items: int, end: int) -> DeliverTimed | None:
    """The DeliverTimed without headers whose fields start at ``pos`` after
    its head of ``items`` elements, up to ``end``; None for anything else."""
    count, extra = divmod(items - 3, 4)
    if count < 1 or extra:
        return None
    fields = _fast_run_fields(data, pos, count, 4, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    times: list[int] = []
    entries: list[Entry] = []
    add_time = times.append
    append = entries.append
    read_u64 = _U64_AT.unpack_from
    for _ in range(count):
        if data[pos] == 0x1B:  # the usual time: a uint of 8 bytes
            add_time(read_u64(data, pos + 1)[0])
            pos += 9
        else:
            time_ms, pos = _fast_uint(data, pos)
            if time_ms < 0:
                return None
            add_time(time_ms)
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 2 + data[pos + 1]
            if data[stop] == _NULL_BYTE and data[stop + 1] == _NULL_BYTE:
                append((data[pos + 2 : stop], None, None))
                pos = stop + 2
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        payload, key, pos = entry
        append((payload, key, None))
    if pos != end:
        return None
    return DeliverTimed(subscription, first_seq, entries, times)


def _fast_message(data: bytes, start: int, end: int) -> Publish | Deliver | DeliverMany | None:
    """The Publish, Deliver or DeliverMany without headers in
    ``data[start:end]``, or None for any other frame (which the general
    decoder then reads)."""
    if end - start < 7:
        return None
    first = data[start]
    try:
        if first >= 0x98 or data[start + 1] != 0x18 or data[start + 2] >= 34:
            return _fast_many(data, start, end) if first >= 0x86 else None
        code = data[start + 2]
        if first == 0x86 and code == 33:
            subscription, pos = _fast_uint(data, start + 3)
            if subscription < 0:
                return None
            seq, pos = _fast_uint(data, pos)
            if seq < 0:
                return None
            if _short_and_plain(data, pos, end):
                return Deliver(subscription, seq, data[pos + 2 : end - 2], None, None)
            tail = _fast_tail(data, pos, end)
            if tail is None:
                return None
            return Deliver(subscription, seq, tail[0], tail[1], None)
        if first == 0x85 and code == 32:
            topic, pos = _fast_uint(data, start + 3)
            if topic < 0:
                return None
            if _short_and_plain(data, pos, end):
                return Publish(topic, data[pos + 2 : end - 2], None, None)
            tail = _fast_tail(data, pos, end)
            if tail is None:
                return None
            return Publish(topic, tail[0], tail[1], None)
    except (IndexError, struct.error):
        return None  # truncated: the general decoder says how
    return None


def decode_body(body: bytes) -> Message:
    """The message in one frame body (the bytes after the length prefix).

    Raises :class:`RemoteProtocolError` for anything but exactly one
    well-formed CBOR array holding a message of a known type with fields of
    the right types.
    """
    stream = io.BytesIO(body)
    return _decode_item(_new_decoder(stream), stream, 0, len(body))
