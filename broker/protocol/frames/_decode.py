"""The CBOR codec's decoding side: frame bodies to messages (the encoders
are in :mod:`._encode`, the fast path for the usual message-carrying frames
in :mod:`._decode_fast`).

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
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import cbor2

from .._errors import ProtocolError, RemoteProtocolError
from .._names import topic_name_problem
from .._origins import check_origins
from .._owners import Cluster
from .._patterns import topic_pattern_error
from .._types import (
    LENGTH_PREFIX,
    U64_MAX,
    Channel,
    ChannelKind,
    MessageType,
    SettleOutcome,
)
from ._decode_fast import _fast_tail_headers
from ._encode import encode_deliver, encode_deliver_tail
from ._messages import (
    Abort,
    Absolve,
    Ack,
    Admin,
    AdminAnswer,
    AdminValue,
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
    Entry,
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
    Options,
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
from ._settle import detail_problem, ranges_problem

_MAX_DEPTH = 6  # [type, {map: {k: v}}] is depth 3; options are flat
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


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


def _options(value: Any, what: str = "subscribe options") -> Options:
    """A flat map of text to scalars (Subscribe options, Admin arguments and
    answer rows): ints in the signed 64-bit range, text, bools, finite
    floats, null."""
    if type(value) is not dict:
        raise _bad(f"{what} must be a map")
    options: Options = {}
    for key, item in value.items():
        _text(key, f"a key of {what}")
        if (
            item is None
            or type(item) in (str, bool)
            or (type(item) is int and _I64_MIN <= item <= _I64_MAX)
            or (type(item) is float and math.isfinite(item))
        ):
            options[key] = item
        else:
            raise _bad(f"{what}: {_show(key)} must be a scalar, got {_show(item)}")
    return options


def _record(value: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if type(value) is not dict or value.keys() != keys:
        raise _bad(f"{what} must be a map with exactly the keys {sorted(keys)}")
    return value


_HELLO_KEYS = frozenset({"client", "session", "processed"})
#: A Hello may also carry a credential (absent when the client has none) and
#: say that the client reads DeliverMany frames.
_HELLO_KEYS_OPTIONAL = frozenset(
    {"token", "deliver_many", "metadata", "publish_many", "max_message"}
)
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
        _bool(rec["metadata"], "metadata") if "metadata" in rec else False,
        _bool(rec["publish_many"], "publish_many") if "publish_many" in rec else False,
        _max_message(rec),
    )


def _max_message(rec: dict[str, Any]) -> int:
    """A Hello's or Welcome's ``max_message``: absent is 0, present is at least 1."""
    if "max_message" not in rec:
        return 0
    value = _u64(rec["max_message"], "max_message")
    if value == 0:
        raise _bad("max_message must be at least 1 (leave the key out instead)")
    return value


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
    if type(fields) is dict:
        keys = keys | ({"offsets", "cluster", "publish_many", "max_message"} & fields.keys())
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
        _cluster(rec["cluster"]) if "cluster" in rec else None,
        _bool(rec["publish_many"], "publish_many") if "publish_many" in rec else False,
        _max_message(rec),
    )


def _cluster(value: Any) -> Cluster:
    try:
        return Cluster.from_wire(value)
    except ProtocolError as error:
        raise _bad(str(error)) from None


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


def _publish_many(f: list[Any]) -> PublishMany:
    count, extra = divmod(len(f) - 2, 3)
    if count < 1 or extra > 1:
        raise _bad(
            "a PublishMany carries whole [payload, key, headers] entries, at least one, "
            "then at most its origins"
        )
    topic = _u64(f[1], "topic")
    stop = 2 + 3 * count
    keys = [_opt_blob(f[i + 1], "key") for i in range(2, stop, 3)]
    entries = [
        encode_deliver_tail(_blob(f[i], "payload"), keys[(i - 2) // 3], _headers(f[i + 2]))
        for i in range(2, stop, 3)
    ]
    return PublishMany(topic, entries, keys, check_origins(f[-1], count) if extra else None)


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


def _deliver_two(f: list[Any], name: str, first: str, second: str) -> tuple[Any, ...]:
    """The fields of a DeliverMany whose entries each begin with two uints
    (DeliverGroup, DeliverMatched): subscription, first_seq, entries and
    the two uints' lists."""
    count, extra = divmod(len(f) - 3, 5)
    if count < 1 or extra:
        raise _bad(
            f"a {name} carries whole [{first}, {second}, payload, key, headers] entries, "
            "one or more"
        )
    subscription = _u64(f[1], "subscription")
    first_seq = _u64(f[2], "first_seq")
    if first_seq + count - 1 > U64_MAX:
        raise _bad(f"the sequence numbers of a {name} must be u64")
    firsts = [_u64(f[i], first) for i in range(3, len(f), 5)]
    seconds = [_u64(f[i], second) for i in range(4, len(f), 5)]
    entries = [
        (_blob(f[i], "payload"), _opt_blob(f[i + 1], "key"), _headers(f[i + 2]))
        for i in range(5, len(f), 5)
    ]
    return subscription, first_seq, entries, firsts, seconds


def _deliver_group(f: list[Any]) -> DeliverGroup:
    return DeliverGroup(*_deliver_two(f, "DeliverGroup", "offset", "delivered"))


def _deliver_matched(f: list[Any]) -> DeliverMatched:
    return DeliverMatched(*_deliver_two(f, "DeliverMatched", "match", "offset"))


def _matched(f: list[Any]) -> Matched:
    topic = f[3]
    if topic is not None and (problem := topic_name_problem(topic)) is not None:
        raise _bad(f"Matched: {problem}")
    return Matched(_u64(f[1], "subscription"), _u64(f[2], "match"), topic)


def _matched_gap(f: list[Any]) -> MatchedGap:
    return MatchedGap(
        _u64(f[1], "subscription"), _u64(f[2], "match"), _u64(f[3], "first"), _u64(f[4], "count")
    )


def _admin(f: list[Any]) -> Admin:
    command = _text(f[2], "Admin command")
    if not 1 <= len(command) <= 64:
        raise _bad("an Admin command is 1 to 64 characters")
    arguments: dict[str, AdminValue] = _options(f[3], "Admin arguments")
    return Admin(_u64(f[1], "request"), command, arguments)


def _admin_answer(f: list[Any]) -> AdminAnswer:
    rows = f[3]
    if type(rows) is not list:
        raise _bad("AdminAnswer rows must be an array of maps")
    decoded: list[dict[str, AdminValue]] = [_options(row, "an AdminAnswer row") for row in rows]
    after = f[4]
    if after is not None:
        _text(after, "AdminAnswer next")
    return AdminAnswer(
        _u64(f[1], "request"), _u64(f[2], "status"), decoded, after, _text(f[5], "reason")
    )


def _settle(f: list[Any]) -> Settle:
    subscription = _u64(f[1], "subscription")
    outcome = _u64(f[2], "outcome")
    if outcome > SettleOutcome.IN_PROGRESS:
        raise _bad(f"unknown Settle outcome {outcome}")
    flat = f[3]
    if type(flat) is not list or len(flat) < 2 or len(flat) % 2:
        raise _bad("Settle ranges must be a flat array of [first, count] pairs, one or more")
    ranges = list(zip(flat[0::2], flat[1::2], strict=True))
    detail = f[4]
    problem = ranges_problem(ranges) or detail_problem(outcome, detail)
    if problem is not None:
        raise _bad(problem)
    return Settle(subscription, SettleOutcome(outcome), ranges, detail)


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


#: FramePart flags (Aeron's): the first part of a message, and its last.
PART_BEGIN = 0x80
PART_END = 0x40


def _frame_part(f: list[Any]) -> FramePart:
    flags = _u64(f[2], "flags")
    if flags & ~(PART_BEGIN | PART_END):
        raise _bad(f"FramePart flags {flags:#x}: only 0x80 (begin) and 0x40 (end) are defined")
    return FramePart(_channel(f[1]), flags, _blob(f[3], "chunk"))


def _subscribe(f: list[Any]) -> Subscribe:
    topic = f[1]
    if type(topic) is str:
        if (problem := topic_pattern_error(topic)) is not None:
            raise _bad(f"Subscribe: {problem}")
    else:
        _u64(topic, "topic")
    return Subscribe(topic, _text(f[2], "mode"), _options(f[3]))


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
    MessageType.PUBLISH_MANY: (0, _publish_many),
    MessageType.DELIVER_GROUP: (0, _deliver_group),
    MessageType.SETTLE: (5, _settle),
    MessageType.FRAME_PART: (4, _frame_part),
    MessageType.COMMIT: (4, _commit),
    MessageType.ABORT: (3, lambda f: Abort(_u64(f[1], "request"), _stage_name(f[2], "batch"))),
    MessageType.OUTCOME: (5, _outcome),
    MessageType.LIST_OFFSETS: (3, _list_offsets),
    MessageType.OFFSETS: (4, _offsets),
    MessageType.MATCHED: (4, _matched),
    MessageType.DELIVER_MATCHED: (0, _deliver_matched),
    MessageType.MATCHED_GAP: (5, _matched_gap),
    MessageType.ADMIN: (4, _admin),
    MessageType.ADMIN_ANSWER: (6, _admin_answer),
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


def decode_body(body: bytes) -> Message:
    """The message in one frame body (the bytes after the length prefix).

    Raises :class:`RemoteProtocolError` for anything but exactly one
    well-formed CBOR array holding a message of a known type with fields of
    the right types.
    """
    stream = io.BytesIO(body)
    return _decode_item(_new_decoder(stream), stream, 0, len(body))


def decode_deliver_tail(tail: bytes) -> Entry:
    """The ``(payload, key, headers)`` that :func:`~._encode.encode_deliver_tail`
    encoded into ``tail`` (the usual shapes, with a few short headers or
    none, read directly);
    :class:`RemoteProtocolError` for bytes that are not such a tail."""
    try:
        fast = _fast_tail_headers(tail, 0, len(tail))
    except IndexError:  # (cut short: the strict way says what is wrong)
        fast = None
    if fast is not None:
        return fast
    head, _ = encode_deliver(0, 1, tail)
    message = decode_body(head[LENGTH_PREFIX:] + tail)
    assert isinstance(message, Deliver)
    return message.payload, message.key, message.headers
