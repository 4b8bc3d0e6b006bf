"""JetStream's and KV's JSON API, sans-IO: the subjects, request bodies and
answers of the subset the broker uses.

Streams (``$JS.API.STREAM.*``: create, update, info, delete, purge), stored
messages (``$JS.API.DIRECT.GET.<stream>`` when the stream allows direct
gets, else ``$JS.API.STREAM.MSG.GET.<stream>``), publish acknowledgements
and the publish headers that ask for deduplication and fencing, pull
consumers (create, the ``MSG.NEXT`` request, the ``$JS.ACK`` reply subject
of a delivered message) and KV buckets (the stream ``KV_<bucket>`` with
subjects ``$KV.<bucket>.>``; an entry's revision is its stream sequence).

Durations are seconds here and nanoseconds on the wire. Every answer with
an ``error`` raises :class:`~broker.nats.JetStreamError`. No I/O, no clock.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

from ._errors import JetStreamError
from ._headers import Headers, decode_headers
from ._protocol import Msg

__all__ = [
    "API_PREFIX",
    "ERR_CONSUMER_NOT_FOUND",
    "ERR_NO_MESSAGE_FOUND",
    "ERR_STREAM_NAME_IN_USE",
    "ERR_STREAM_NOT_FOUND",
    "ERR_WRONG_LAST_SEQUENCE",
    "KV_OPERATION",
    "AckInfo",
    "ConsumerConfig",
    "ConsumerInfo",
    "KvEntry",
    "KvRecord",
    "PubAck",
    "StoredMsg",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "check_bucket",
    "check_key",
    "consumer_create_request",
    "get_request",
    "kv_record",
    "kv_stream_config",
    "parse_ack_reply",
    "parse_api_response",
    "parse_consumer_info",
    "parse_pub_ack",
    "parse_stored_msg",
    "parse_stream_info",
    "parse_time_ns",
    "publish_headers",
    "pull_request",
    "purge_request",
]

API_PREFIX = "$JS.API"

#: ``err_code`` of an expected last (subject) sequence that was not the last:
#: a stale fencing token, a KV ``create`` of a key that exists, a stale ``update``.
ERR_WRONG_LAST_SEQUENCE = 10071
ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_NAME_IN_USE = 10058
ERR_NO_MESSAGE_FOUND = 10037
ERR_CONSUMER_NOT_FOUND = 10014

_NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def _seconds(ns: int | None) -> float:
    return (ns or 0) / _NS


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def parse_api_response(payload: bytes) -> dict[str, Any]:
    """An API answer as a dict; its ``error`` raises :class:`JetStreamError`
    (a payload that is not a JSON object too, as code 0)."""
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise JetStreamError(0, 0, f"an answer that is not a JSON object: {payload[:80]!r}")
    error = answer.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise JetStreamError(0, 0, str(error))
        raise JetStreamError(
            int(error.get("code", 0)),
            int(error.get("err_code", 0)),
            str(error.get("description", "no description")),
        )
    return answer


# ==================================================================== streams


@dataclass(slots=True)
class StreamConfig:
    """A stream's configuration (seconds for durations; -1 for no limit)."""

    name: str
    subjects: list[str] = field(default_factory=list)
    storage: Literal["file", "memory"] = "file"
    num_replicas: int = 1
    retention: Literal["limits", "interest", "workqueue"] = "limits"
    max_msgs: int = -1
    max_bytes: int = -1
    max_age: float = 0.0
    max_msgs_per_subject: int = -1
    max_msg_size: int = -1
    discard: Literal["old", "new"] = "old"
    duplicate_window: float = 120.0
    allow_direct: bool = False
    allow_rollup_hdrs: bool = False
    deny_delete: bool = False
    deny_purge: bool = False
    description: str | None = None
    #: Fields this class does not name, sent as they are (and kept from answers).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The configuration as the API takes it."""
        body: dict[str, Any] = {
            "name": self.name,
            "subjects": list(self.subjects),
            "storage": self.storage,
            "num_replicas": self.num_replicas,
            "retention": self.retention,
            "max_consumers": -1,
            "max_msgs": self.max_msgs,
            "max_bytes": self.max_bytes,
            "max_age": _ns(self.max_age),
            "max_msgs_per_subject": self.max_msgs_per_subject,
            "max_msg_size": self.max_msg_size,
            "discard": self.discard,
            "duplicate_window": _ns(self.duplicate_window),
            "allow_direct": self.allow_direct,
            "allow_rollup_hdrs": self.allow_rollup_hdrs,
            "deny_delete": self.deny_delete,
            "deny_purge": self.deny_purge,
        }
        if self.description is not None:
            body["description"] = self.description
        body.update(self.extra)
        return body

    def encode(self) -> bytes:
        """The create or update request's body."""
        return _dumps(self.to_json())

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> StreamConfig:
        """The configuration of an API answer."""
        named = {
            "name",
            "subjects",
            "storage",
            "num_replicas",
            "retention",
            "max_msgs",
            "max_bytes",
            "max_age",
            "max_msgs_per_subject",
            "max_msg_size",
            "discard",
            "duplicate_window",
            "allow_direct",
            "allow_rollup_hdrs",
            "deny_delete",
            "deny_purge",
            "description",
            "max_consumers",
        }
        return cls(
            name=config["name"],
            subjects=list(config.get("subjects") or []),
            storage=config.get("storage", "file"),
            num_replicas=int(config.get("num_replicas", 1)),
            retention=config.get("retention", "limits"),
            max_msgs=int(config.get("max_msgs", -1)),
            max_bytes=int(config.get("max_bytes", -1)),
            max_age=_seconds(config.get("max_age")),
            max_msgs_per_subject=int(config.get("max_msgs_per_subject", -1)),
            max_msg_size=int(config.get("max_msg_size", -1)),
            discard=config.get("discard", "old"),
            duplicate_window=_seconds(config.get("duplicate_window")),
            allow_direct=bool(config.get("allow_direct", False)),
            allow_rollup_hdrs=bool(config.get("allow_rollup_hdrs", False)),
            deny_delete=bool(config.get("deny_delete", False)),
            deny_purge=bool(config.get("deny_purge", False)),
            description=config.get("description"),
            extra={key: value for key, value in config.items() if key not in named},
        )


@dataclass(slots=True)
class StreamState:
    """What a stream holds."""

    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    consumer_count: int
    first_ts: str = ""
    last_ts: str = ""


@dataclass(slots=True)
class StreamInfo:
    """A stream's configuration and state; ``leader`` (clustered) and the raw answer."""

    config: StreamConfig
    state: StreamState
    created: str
    leader: str | None
    raw: dict[str, Any]


def parse_stream_info(payload: bytes) -> StreamInfo:
    """The answer of a stream create, update or info."""
    answer = parse_api_response(payload)
    state = answer.get("state") or {}
    cluster = answer.get("cluster") or {}
    return StreamInfo(
        config=StreamConfig.from_json(answer["config"]),
        state=StreamState(
            messages=int(state.get("messages", 0)),
            bytes=int(state.get("bytes", 0)),
            first_seq=int(state.get("first_seq", 0)),
            last_seq=int(state.get("last_seq", 0)),
            consumer_count=int(state.get("consumer_count", 0)),
            first_ts=str(state.get("first_ts", "")),
            last_ts=str(state.get("last_ts", "")),
        ),
        created=str(answer.get("created", "")),
        leader=cluster.get("leader"),
        raw=answer,
    )


def purge_request(
    subject: str | None = None, *, seq: int | None = None, keep: int | None = None
) -> bytes:
    """A purge's body: everything, or only ``subject``; below ``seq``, or all but ``keep``."""
    body: dict[str, Any] = {}
    if subject is not None:
        body["filter"] = subject
    if seq is not None:
        body["seq"] = seq
    if keep is not None:
        body["keep"] = keep
    return _dumps(body) if body else b""


# =================================================================== publish


@dataclass(slots=True)
class PubAck:
    """A stored publish: its ``stream`` and sequence; ``duplicate`` if its
    ``Nats-Msg-Id`` was stored before (within the duplicate window): then
    ``seq`` is the first copy's."""

    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None


def parse_pub_ack(payload: bytes) -> PubAck:
    """A publish's answer; a refusal raises :class:`JetStreamError`."""
    answer = parse_api_response(payload)
    try:
        return PubAck(
            stream=str(answer["stream"]),
            seq=int(answer["seq"]),
            duplicate=bool(answer.get("duplicate", False)),
            domain=answer.get("domain"),
        )
    except (KeyError, TypeError, ValueError):
        raise JetStreamError(
            0, 0, f"a publish answer without stream and seq: {payload[:80]!r}"
        ) from None


def publish_headers(
    headers: Headers | None = None,
    *,
    msg_id: str | None = None,
    expected_stream: str | None = None,
    expected_last_seq: int | None = None,
    expected_last_subject_seq: int | None = None,
) -> Headers | None:
    """``headers`` (copied) plus the ones JetStream reads: ``Nats-Msg-Id``
    (deduplication within the stream's duplicate window),
    ``Nats-Expected-Stream``, ``Nats-Expected-Last-Sequence`` (the stream's
    last sequence must be this: a writer's fence) and
    ``Nats-Expected-Last-Subject-Sequence`` (the subject's, 0 for none yet).
    None when there is nothing to send."""
    if (
        msg_id is None
        and expected_stream is None
        and expected_last_seq is None
        and expected_last_subject_seq is None
    ):
        return headers
    out = Headers() if headers is None else Headers(headers.pairs())
    if msg_id is not None:
        out["Nats-Msg-Id"] = msg_id
    if expected_stream is not None:
        out["Nats-Expected-Stream"] = expected_stream
    if expected_last_seq is not None:
        out["Nats-Expected-Last-Sequence"] = str(expected_last_seq)
    if expected_last_subject_seq is not None:
        out["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_subject_seq)
    return out


# =============================================================== stored messages

_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time (as JetStream writes
    them: ``2026-12-06T12:00:00.123456789Z``); a ValueError if it is not one."""
    match = _TIME.match(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    whole, fraction, zone = match.groups()
    moment = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    seconds = (moment - _EPOCH) // timedelta(seconds=1)
    nanos = int((fraction or "0")[:9].ljust(9, "0"))
    return seconds * _NS + nanos


@dataclass(slots=True)
class StoredMsg:
    """A message as its stream stored it: its subject, sequence, payload,
    headers (the publisher's and, from a direct get, ``Nats-*`` metadata)
    and time (ns since the epoch)."""

    subject: str
    seq: int
    payload: bytes
    headers: Headers | None
    time_ns: int


def parse_stored_msg(msg: Msg) -> StoredMsg | None:
    """The answer of a direct get (headers carry the metadata) or of a
    ``STREAM.MSG.GET`` (a JSON document); None if there is no such message
    (404, or ``err_code`` 10037). Other refusals raise :class:`JetStreamError`."""
    headers = msg.headers
    if headers is not None and headers.status is not None:
        if headers.status == 404:
            return None
        raise JetStreamError(headers.status, 0, headers.description or "direct get refused")
    if headers is not None and "Nats-Sequence" in headers:
        try:
            return StoredMsg(
                subject=headers["Nats-Subject"],
                seq=int(headers["Nats-Sequence"]),
                payload=msg.payload,
                headers=headers,
                time_ns=parse_time_ns(headers["Nats-Time-Stamp"]),
            )
        except (KeyError, ValueError) as error:
            why = f"a direct get answer without its metadata: {error}"
            raise JetStreamError(0, 0, why) from None
    try:
        answer = parse_api_response(msg.payload)
    except JetStreamError as error:
        if error.err_code == ERR_NO_MESSAGE_FOUND:
            return None
        raise
    stored = answer.get("message")
    if not isinstance(stored, dict):
        raise JetStreamError(0, 0, "a message get answer without its message")
    raw_headers = stored.get("hdrs")
    return StoredMsg(
        subject=str(stored["subject"]),
        seq=int(stored["seq"]),
        payload=base64.b64decode(stored.get("data") or ""),
        headers=decode_headers(base64.b64decode(raw_headers)) if raw_headers else None,
        time_ns=parse_time_ns(stored["time"]),
    )


def get_request(
    *,
    seq: int | None = None,
    last_by_subject: str | None = None,
    next_by_subject: str | None = None,
) -> bytes:
    """The body of a message get: by sequence, the last of a subject, or
    (``seq`` and ``next_by_subject``) the first of a subject at or after a
    sequence."""
    if next_by_subject is not None:
        if seq is None or last_by_subject is not None:
            raise ValueError("a get of the next message of a subject names seq, not last")
        return _dumps({"seq": seq, "next_by_subj": next_by_subject})
    if (seq is None) == (last_by_subject is None):
        raise ValueError("a get names exactly one of seq and last_by_subject")
    return _dumps({"seq": seq} if seq is not None else {"last_by_subj": last_by_subject})


# ================================================================= consumers


@dataclass(slots=True)
class ConsumerConfig:
    """A pull consumer's configuration. Without ``durable_name`` it is
    ephemeral (the server deletes it after ``inactive_threshold`` unused)."""

    name: str | None = None
    durable_name: str | None = None
    deliver_policy: Literal[
        "all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"
    ] = "all"
    opt_start_seq: int | None = None
    ack_policy: Literal["none", "all", "explicit"] = "explicit"
    ack_wait: float | None = None
    max_deliver: int | None = None
    filter_subject: str | None = None
    replay_policy: Literal["instant", "original"] = "instant"
    max_waiting: int | None = None
    max_ack_pending: int | None = None
    inactive_threshold: float | None = None
    num_replicas: int | None = None
    mem_storage: bool | None = None
    headers_only: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The configuration as the API takes it (unset fields left to the server)."""
        body: dict[str, Any] = {
            "deliver_policy": self.deliver_policy,
            "ack_policy": self.ack_policy,
            "replay_policy": self.replay_policy,
        }
        for key in (
            "name",
            "durable_name",
            "opt_start_seq",
            "max_deliver",
            "filter_subject",
            "max_waiting",
            "max_ack_pending",
            "num_replicas",
            "mem_storage",
            "headers_only",
        ):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        if self.ack_wait is not None:
            body["ack_wait"] = _ns(self.ack_wait)
        if self.inactive_threshold is not None:
            body["inactive_threshold"] = _ns(self.inactive_threshold)
        body.update(self.extra)
        return body


def consumer_create_request(
    stream: str, config: ConsumerConfig, prefix: str = API_PREFIX
) -> tuple[str, bytes]:
    """The subject and body that create (or, same config, find) a consumer."""
    name = config.durable_name or config.name
    subject = f"{prefix}.CONSUMER.CREATE.{stream}"
    if name:
        subject += f".{name}"
    return subject, _dumps({"stream_name": stream, "config": config.to_json()})


@dataclass(slots=True)
class ConsumerInfo:
    """A consumer's name and where it is: ``num_pending`` messages left to
    deliver; ``delivered`` the last (consumer, stream) sequence sent."""

    stream: str
    name: str
    num_pending: int
    num_waiting: int
    delivered_consumer_seq: int
    delivered_stream_seq: int
    raw: dict[str, Any]


def parse_consumer_info(payload: bytes) -> ConsumerInfo:
    """The answer of a consumer create or info."""
    answer = parse_api_response(payload)
    delivered = answer.get("delivered") or {}
    return ConsumerInfo(
        stream=str(answer.get("stream_name", "")),
        name=str(answer.get("name", "")),
        num_pending=int(answer.get("num_pending", 0)),
        num_waiting=int(answer.get("num_waiting", 0)),
        delivered_consumer_seq=int(delivered.get("consumer_seq", 0)),
        delivered_stream_seq=int(delivered.get("stream_seq", 0)),
        raw=answer,
    )


def pull_request(
    batch: int,
    *,
    max_bytes: int | None = None,
    expires: float | None = None,
    no_wait: bool = False,
    idle_heartbeat: float | None = None,
) -> bytes:
    """The body of a pull (``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``):
    up to ``batch`` messages and ``max_bytes``, the request living
    ``expires`` seconds (then a 408 status ends it), or, ``no_wait``, ended
    at once by a 404 when nothing is there; heartbeats every ``idle_heartbeat``."""
    if batch < 1:
        raise ValueError(f"a pull asks for at least one message (got {batch})")
    body: dict[str, Any] = {"batch": batch}
    if max_bytes is not None:
        body["max_bytes"] = max_bytes
    if expires is not None:
        body["expires"] = _ns(expires)
    if no_wait:
        body["no_wait"] = True
    if idle_heartbeat is not None:
        body["idle_heartbeat"] = _ns(idle_heartbeat)
    return _dumps(body)


class AckInfo(NamedTuple):
    """What the ``$JS.ACK...`` reply subject of a delivered message says."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    time_ns: int
    pending: int
    domain: str = ""


def parse_ack_reply(reply: str) -> AckInfo | None:
    """The delivery metadata of a consumer's message, from its reply subject
    (both forms: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
    seq>.<ns>.<pending>`` and the one with domain and account hash first);
    None if ``reply`` is not one."""
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        if len(tokens) == 9:
            return AckInfo(
                tokens[2],
                tokens[3],
                int(tokens[4]),
                int(tokens[5]),
                int(tokens[6]),
                int(tokens[7]),
                int(tokens[8]),
            )
        if len(tokens) >= 11:
            domain = tokens[2]
            return AckInfo(
                tokens[4],
                tokens[5],
                int(tokens[6]),
                int(tokens[7]),
                int(tokens[8]),
                int(tokens[9]),
                int(tokens[10]),
                "" if domain == "_" else domain,
            )
    except ValueError:
        return None
    return None


# ======================================================================= KV

_BUCKET = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")

#: The header of a KV write that is not a value (``DEL``, ``PURGE``).
KV_OPERATION = "KV-Operation"


def check_bucket(bucket: str) -> str:
    """``bucket`` if it is a valid bucket name (letters, digits, ``_``,
    ``-``), else a ValueError."""
    if not _BUCKET.match(bucket):
        raise ValueError(f"bucket name {bucket!r}: only letters, digits, '_' and '-'")
    return bucket


def check_key(key: str) -> str:
    """``key`` if it is a valid key (letters, digits, ``-/_=.``, not
    starting or ending with ``.``), else a ValueError."""
    if not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise ValueError(f"key {key!r}: letters, digits and -/_=. only, not at the ends '.'")
    return key


def kv_stream_config(
    bucket: str,
    *,
    history: int = 1,
    ttl: float = 0.0,
    max_bytes: int = -1,
    max_value_size: int = -1,
    storage: Literal["file", "memory"] = "file",
    replicas: int = 1,
) -> StreamConfig:
    """The stream that holds bucket ``bucket`` (as NATS's clients make it):
    ``history`` revisions kept per key, direct gets, rollups, no deletes of
    single messages, new writes refused when full."""
    check_bucket(bucket)
    if not 1 <= history <= 64:
        raise ValueError(f"a bucket keeps 1 to 64 revisions per key (got {history})")
    return StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        storage=storage,
        num_replicas=replicas,
        max_msgs_per_subject=history,
        max_bytes=max_bytes,
        max_age=ttl,
        max_msg_size=max_value_size,
        discard="new",
        duplicate_window=min(ttl, 120.0) if ttl > 0 else 120.0,
        allow_direct=True,
        allow_rollup_hdrs=True,
        deny_delete=True,
        deny_purge=False,
    )


class KvEntry(NamedTuple):
    """A key's value and its revision (the stream sequence of its write)."""

    value: bytes
    revision: int


@dataclass(slots=True)
class KvRecord:
    """A key's last write: a value (``operation`` ``"PUT"``) or a delete
    or purge marker (``"DEL"``, ``"PURGE"``)."""

    key: str
    value: bytes
    revision: int
    operation: str
    time_ns: int


def kv_record(bucket: str, stored: StoredMsg) -> KvRecord:
    """The KV view of a stored message of bucket ``bucket``."""
    prefix = f"$KV.{bucket}."
    key = stored.subject[len(prefix) :] if stored.subject.startswith(prefix) else stored.subject
    operation = "PUT"
    if stored.headers is not None:
        operation = stored.headers.get(KV_OPERATION, "PUT")
    return KvRecord(key, stored.payload, stored.seq, operation, stored.time_ns)
