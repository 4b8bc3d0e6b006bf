"""Messages to frames: the general encoder (:func:`encode`) and the
precomputed pieces of the frames that carry messages (Publish, Deliver,
DeliverMany, DeliverTimed, DeliverGroup), so that a payload is encoded once however many
subscribers get it. Decoding is :mod:`._codec`'s job."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import cbor2

from .._errors import LocalProtocolError
from .._origins import OriginRun
from .._types import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    U64_MAX,
    Channel,
    ChannelKind,
)
from ._messages import (
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
    FramePart,
    FreeHandle,
    Gap,
    Goodbye,
    Headers,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Matched,
    MatchedGap,
    Message,
    Offsets,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishMany,
    Settle,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
)

_LENGTH = struct.Struct(">I")


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
        case DeliverMatched(subscription, first_seq, entries, matches, offsets):
            count = len(entries)
            if not entries or count > MAX_DELIVER_GROUP or {len(matches), len(offsets)} != {count}:
                raise LocalProtocolError(
                    f"a DeliverMatched carries 1 to {MAX_DELIVER_GROUP} entries, each with a "
                    f"match and an offset, not {count} entries, {len(matches)} matches "
                    f"and {len(offsets)} offsets"
                )
            matched: list[Any] = [46, subscription, first_seq]
            for match, offset, (payload, key, headers) in zip(
                matches, offsets, entries, strict=True
            ):
                matched += (match, offset, payload, key, _wire_headers(headers))
            return matched
        case DeliverGroup(subscription, first_seq, entries, offsets, delivered):
            count = len(entries)
            if not entries or count > MAX_DELIVER_GROUP or len(offsets) != count:
                raise LocalProtocolError(
                    f"a DeliverGroup carries 1 to {MAX_DELIVER_GROUP} entries, each with an "
                    f"offset, not {count} entries and {len(offsets)} offsets"
                )
            if len(delivered) != count:
                raise LocalProtocolError(
                    f"a DeliverGroup's {count} entries each have a delivered count, "
                    f"not {len(delivered)}"
                )
            group: list[Any] = [38, subscription, first_seq]
            for offset, before, (payload, key, headers) in zip(
                offsets, delivered, entries, strict=True
            ):
                group += (offset, before, payload, key, _wire_headers(headers))
            return group
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
        case Settle(subscription, outcome, ranges, detail):
            flat: list[int] = []
            for first, count in ranges:
                flat += (first, count)
            return [39, subscription, int(outcome), flat, detail]
        case Gap(subscription, first_seq, count):
            return [22, subscription, first_seq, count]
        case Matched(subscription, match, topic):
            return [45, subscription, match, topic]
        case MatchedGap(subscription, match, first, count):
            return [47, subscription, match, first, count]
        case Admin(request, command, arguments):
            return [48, request, command, arguments]
        case AdminAnswer(request, status, rows, after, reason):
            return [49, request, status, rows, after, reason]
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
        case FramePart(channel, flags, chunk):
            return [37, _wire_channel(channel), flags, chunk]
        case Hello(
            version, client, session, processed, token, deliver_many, metadata, sends_many, large
        ):
            fields: dict[str, Any] = {"client": client, "session": session, "processed": processed}
            if token is not None:
                fields["token"] = token
            if deliver_many:
                fields["deliver_many"] = True
            if metadata:
                fields["metadata"] = True
            if sends_many:
                fields["publish_many"] = True
            if large:
                fields["max_message"] = large
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
            if message.cluster is not None:
                welcome["cluster"] = message.cluster.to_wire()
            if message.publish_many:
                welcome["publish_many"] = True
            if message.max_message:
                welcome["max_message"] = message.max_message
            return [1, message.version, welcome]
    raise LocalProtocolError(f"not a protocol message: {type(message).__name__}")


def encode_body(message: Message) -> bytes:
    """The CBOR body of ``message`` (without the length prefix)."""
    if type(message) is PublishMany:
        return _publish_many_body(message)
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
    kind = type(message)
    if kind is Publish and message.headers is None:  # type: ignore[union-attr]
        body = _publish_body(message)  # type: ignore[arg-type]
    elif kind in _NOTICES:
        body = _notice_body(message)
    elif kind is PublishMany:
        body = _publish_many_body(message)  # type: ignore[arg-type]
    else:
        body = encode_body(message)
    if len(body) > max_frame:
        if kind is Publish:
            payload = len(message.payload)  # type: ignore[union-attr]
            raise _too_large(len(body), payload, max_frame)
        raise LocalProtocolError(
            f"{type(message).__name__} frame of {len(body)} bytes exceeds max_frame {max_frame}"
        )
    return _LENGTH.pack(len(body)) + body


def _too_large(body: int, payload: int, max_frame: int) -> LocalProtocolError:
    """The error of a Publish of a ``payload``-byte message whose frame body
    is ``body`` bytes, over ``max_frame``: what fits, and what to change."""
    overhead = body - payload
    if overhead > max_frame:
        return LocalProtocolError(
            f"a message of {payload} bytes is too large: its key and headers alone make "
            f"a Publish frame of {overhead} bytes, over the broker's max_frame {max_frame} "
            "(shorten them, or raise the broker's max_frame)"
        )
    fits = max_frame - overhead
    return LocalProtocolError(
        f"a message of {payload} bytes is too large: its Publish frame of {body} bytes "
        f"exceeds the broker's max_frame {max_frame} (with its key and headers, a payload "
        f"of at most {fits} bytes fits; or raise the broker's max_frame)"
    )


#: The notices sent for most messages, by type: the head of their array
#: of three (its length and type code).
_NOTICES = {
    IssueGuarantee: b"\x83\x0a",
    Ack: b"\x83\x15",
    Confirm: b"\x83\x17",
}


def _notice_body(message: Message) -> bytes:
    """The body of an IssueGuarantee, Ack or Confirm, as :func:`encode_body`
    makes it, without a trip through the generic encoder."""
    if type(message) is IssueGuarantee:
        channel, value = message.channel, message.amount
        kind, index = channel.kind, channel.index
        if (
            type(value) is int
            and type(index) is int
            and 0 <= kind <= ChannelKind.DELIVER
            and 0 <= index <= U64_MAX
            and 0 <= value <= U64_MAX
        ):
            return b"".join(
                (b"\x83\x0a\x82", _SMALL_UINT[kind], _uint_head(index), _uint_head(value))
            )
        return encode_body(message)  # says what is wrong with it
    first, second = (
        (message.subscription, message.seq)
        if type(message) is Ack
        else (message.topic, message.count)  # type: ignore[union-attr]
    )
    if (
        type(first) is int
        and type(second) is int
        and 0 <= first <= U64_MAX
        and 0 <= second <= U64_MAX
    ):
        return b"".join((_NOTICES[type(message)], _uint_head(first), _uint_head(second)))
    return encode_body(message)


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
#: CBOR heads of unsigned integers below 256 (handles, match indexes).
_UINT_HEADS = _SMALL_UINT + [bytes((0x18, value)) for value in range(24, 256)]
_SHORT_BLOB = [bytes((0x40 | n,)) if n < 24 else bytes((0x58, n)) for n in range(256)]


_DELIVER_HEAD = _cbor_head(4, 6) + _cbor_head(0, 33)
_PUBLISH_HEAD = _cbor_head(4, 5) + _cbor_head(0, 32)


def encode_publish(topic: int, payload: bytes, key: bytes | None, *, max_frame: int) -> bytes:
    """The whole frame of ``Publish(topic, payload, key)`` (no headers), as
    :func:`encode` makes it; the caller vouches that ``topic`` is a u64 and
    ``payload`` and ``key`` are bytes."""
    size = len(payload)
    blob = _SHORT_BLOB[size] if size < 256 else _cbor_head(2, size)
    handle = _UINT_HEADS[topic] if topic < 256 else _cbor_head(0, topic)
    parts: tuple[bytes, ...]
    if key is None:
        body = len(_PUBLISH_HEAD) + len(handle) + len(blob) + size + 2
        parts = (_LENGTH.pack(body), _PUBLISH_HEAD, handle, blob, payload, b"\xf6\xf6")
    else:
        key_part = _cbor_head(2, len(key)) + key
        body = len(_PUBLISH_HEAD) + len(handle) + len(blob) + size + len(key_part) + 1
        parts = (_LENGTH.pack(body), _PUBLISH_HEAD, handle, blob, payload, key_part, _NULL)
    if body > max_frame:
        raise _too_large(body, size, max_frame)
    return b"".join(parts)


def publish_prefix(topic: int) -> bytes:
    """The first bytes of the body of every Publish frame on topic handle
    ``topic`` (its array head, type and handle)."""
    return _PUBLISH_HEAD + _uint_head(topic)


def encode_publish_tail(topic: int, tail: bytes, *, max_frame: int) -> bytes:
    """The whole frame of a Publish on ``topic`` whose payload, key and
    headers are ``tail``, a Deliver tail (:func:`encode_deliver_tail`): the
    two frames end alike, so a broker passing a delivery on as a publish
    copies it without decoding it."""
    handle = _UINT_HEADS[topic] if topic < 256 else _cbor_head(0, topic)
    body = len(_PUBLISH_HEAD) + len(handle) + len(tail)
    if body > max_frame:
        raise LocalProtocolError(f"Publish frame of {body} bytes exceeds max_frame {max_frame}")
    return b"".join((_LENGTH.pack(body), _PUBLISH_HEAD, handle, tail))


def publish_tail_frames(topic: int, tails: list[bytes], start: int, room: int) -> list[bytes]:
    """The whole Publish frames on ``topic`` of ``tails[start:]``
    (:func:`encode_publish_tail` of each), as many as fit in ``room`` bytes
    in all, in order: one head per topic handle, not one per tail. The
    caller vouches that ``topic`` is a u64 and checks each frame against
    the peer's ``max_frame``."""
    head = _PUBLISH_HEAD + (_UINT_HEADS[topic] if topic < 256 else _cbor_head(0, topic))
    fixed = len(head)
    pack = _publish_frame_struct(fixed).pack
    frames: list[bytes] = []
    append = frames.append
    for index in range(start, len(tails)):
        tail = tails[index]
        body = fixed + len(tail)
        room -= body + 4
        if room < 0:
            break
        append(pack(body, head) + tail)
    return frames


_PUBLISH_FRAME_HEADS: dict[int, struct.Struct] = {}


def _publish_frame_struct(fixed: int) -> struct.Struct:
    """Packs a Publish frame's length prefix and its ``fixed`` bytes of head."""
    packer = _PUBLISH_FRAME_HEADS.get(fixed)
    if packer is None:
        packer = _PUBLISH_FRAME_HEADS[fixed] = struct.Struct(f">I{fixed}s")
    return packer


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
    if type(payload) is bytes:
        # The common cases, without a trip through the generic encoder.
        size = len(payload)
        blob = _SHORT_BLOB[size] if size < 256 else _cbor_head(2, size)
        if headers is None:
            if key is None:
                return b"".join((blob, payload, b"\xf6\xf6"))
            return b"".join((blob, payload, _cbor_head(2, len(key)), key, _NULL))
        if key is None or type(key) is bytes:
            parts = _header_parts(headers)
            if parts is not None:
                key_part = _NULL if key is None else _cbor_head(2, len(key)) + key
                return b"".join((blob, payload, key_part, *parts))
    return b"".join(cbor2.dumps(item) for item in (payload, key, _wire_headers(headers)))


def _header_parts(headers: Headers) -> list[bytes] | None:
    """The CBOR of ``headers`` (an array of ``[name, value]`` pairs) as
    ``cbor2`` writes it, in parts; None if a name is not a ``str`` that
    encodes as UTF-8 or a value not ``bytes`` (the generic encoder then
    says what is wrong)."""
    parts = [_cbor_head(4, len(headers))]
    append = parts.append
    for name, value in headers:
        if type(name) is not str or type(value) is not bytes:
            return None
        try:
            raw = name.encode()
        except UnicodeEncodeError:
            return None
        append(b"\x82")
        append(_cbor_head(3, len(raw)))
        append(raw)
        append(_SHORT_BLOB[len(value)] if len(value) < 256 else _cbor_head(2, len(value)))
        append(value)
    return parts


def _uint_head(value: int) -> bytes:
    return _UINT_HEADS[value] if value < 256 else _cbor_head(0, value)


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


#: Most entries one DeliverGroup carries (its array head then takes at most 3 bytes).
MAX_DELIVER_GROUP = (0xFFFF - 3) // 5
_DELIVER_GROUP_TYPE = _cbor_head(0, 38)


def deliver_group_head(subscription: int, first_seq: int, count: int, entries_size: int) -> bytes:
    """The length prefix and head of a DeliverGroup frame of ``count``
    entries on ``subscription`` from ``first_seq``, whose entries (each
    a :func:`group_heads` piece followed by a Deliver tail) take
    ``entries_size`` bytes. The caller vouches for u64 values and ``1 <=
    count <= MAX_DELIVER_GROUP``; the head is at most 27 bytes."""
    head = b"".join(
        (
            _cbor_head(4, 3 + 5 * count),
            _DELIVER_GROUP_TYPE,
            _uint_head(subscription),
            _uint_head(first_seq),
        )
    )
    return _LENGTH.pack(len(head) + entries_size) + head


_DELIVER_MATCHED_TYPE = _cbor_head(0, 46)


def deliver_matched_head(subscription: int, first_seq: int, count: int, entries_size: int) -> bytes:
    """:func:`deliver_group_head` of a DeliverMatched (the same layout:
    entries of two uints then a Deliver tail, made by :func:`group_heads`
    of their matches and offsets)."""
    head = b"".join(
        (
            _cbor_head(4, 3 + 5 * count),
            _DELIVER_MATCHED_TYPE,
            _uint_head(subscription),
            _uint_head(first_seq),
        )
    )
    return _LENGTH.pack(len(head) + entries_size) + head


def group_heads(offsets: list[int], delivered: list[int]) -> list[bytes]:
    """The fields of each DeliverGroup entry before its Deliver tail: the
    CBOR heads of its offset and its delivered count (uints; the caller
    vouches for u64 values), 2 to 18 bytes each."""
    return [
        _uint_head(offset) + _uint_head(before)
        for offset, before in zip(offsets, delivered, strict=True)
    ]


def matched_heads(match: int, first_offset: int, count: int) -> list[bytes]:
    """The fields of each DeliverMatched entry before its Deliver tail, for
    ``count`` records of match index ``match`` from offset ``first_offset``
    on: :func:`group_heads` of ``[match] * count`` and the offsets, with the
    match's head made once and each offset below 2**32 packed beside it in
    one struct call. The caller vouches for u64 values."""
    head = _uint_head(match)
    heads: list[bytes] = []
    offset, end = first_offset, first_offset + count
    while offset < end:
        for below, kind, code in _OFFSET_WIDTHS:
            if offset < below:
                stop = min(end, below)
                if kind:
                    pack = struct.Struct(f">{len(head)}sB{kind}").pack
                    heads += [pack(head, code, value) for value in range(offset, stop)]
                else:
                    heads += [head + _SMALL_UINT[value] for value in range(offset, stop)]
                break
        else:
            stop = end
            heads += [head + _cbor_head(0, value) for value in range(offset, stop)]
        offset = stop
    return heads


#: The CBOR heads of uints by width: (below this value, struct code of the
#: argument, initial byte); a value under 24 is its own head.
_OFFSET_WIDTHS = ((24, "", 0), (0x100, "B", 0x18), (0x10000, "H", 0x19), (1 << 32, "I", 0x1A))


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


#: Most entries one PublishMany carries (its array head then takes at most 3 bytes).
MAX_PUBLISH_MANY = (0xFFFF - 2) // 3
_PUBLISH_MANY_TYPE = _cbor_head(0, 36)


def publish_many_head(topic: int, count: int, entries_size: int, origins: bool = False) -> bytes:
    """The length prefix and head of a PublishMany frame of ``count``
    entries (Deliver tails, see :func:`encode_deliver_tail`) on ``topic``
    that take ``entries_size`` bytes (with ``origins``: and then the
    encoded origin runs, counted in ``entries_size``): the head followed
    by the entries is the frame. The caller vouches for a u64 ``topic`` and
    ``1 <= count <= MAX_PUBLISH_MANY``; the head is at most 17 bytes."""
    head = _cbor_head(4, 2 + 3 * count + origins) + _PUBLISH_MANY_TYPE + _uint_head(topic)
    return _LENGTH.pack(len(head) + entries_size) + head


def _publish_many_body(message: PublishMany) -> bytes:
    """The body of a PublishMany: its head, then its entries as they are."""
    count = len(message.entries)
    topic = message.topic
    if not 1 <= count <= MAX_PUBLISH_MANY or type(topic) is not int or not 0 <= topic <= U64_MAX:
        raise LocalProtocolError("a PublishMany carries 1 to 21,844 entries on a u64 topic handle")
    origins = message.origins
    if origins is None:
        return publish_many_head(topic, count, 0)[LENGTH_PREFIX:] + b"".join(message.entries)
    if sum(run[3] for run in origins) != count:
        raise LocalProtocolError("a PublishMany's origin runs cover each of its entries once")
    head = publish_many_head(topic, count, 0, origins=True)[LENGTH_PREFIX:]
    return head + b"".join(message.entries) + encode_origins(origins)


def encode_origins(runs: list[OriginRun]) -> bytes:
    """The CBOR of ``runs`` as the last element of a ``PublishMany`` (see
    :mod:`._origins`; the caller vouches for their types)."""
    return cbor2.dumps(runs)  # (a tuple is encoded as an array)


def fitting_run(
    tails: list[bytes], first: int, stop: int, capacity: int, *, whole: bool
) -> tuple[int, int]:
    """The end of the longest run ``tails[first:end]`` (``end <= stop``)
    whose bytes add up to at most ``capacity``, and that sum. With
    ``whole`` (the usual case: a batch's first frame) they are first summed
    all in one go; otherwise, or if they do not all fit, measured one by one."""
    if whole:
        body = sum(map(len, tails[first:stop]))
        if body <= capacity:
            return stop, body
    body = 0
    end = first
    while end < stop:
        size = len(tails[end])
        if body + size > capacity:
            break
        body += size
        end += 1
    return end, body
