"""JetStream and KV on trio, over a :class:`~broker.nats.NatsClient`:
:class:`JetStream` (streams, publishing with acknowledgements, stored
messages, pull consumers), :class:`OrderedReader` (a stream in order from a
sequence) and :class:`KeyValue` (a bucket).

Every API call is a request on the client's shared inbox. When JetStream
does not answer (no responders, as while a stream has no leader; a
timeout; the connection lost) the call raises
:class:`~broker.nats.JetStreamUnavailable`, which is retryable; a refusal
raises :class:`~broker.nats.JetStreamError` with the server's codes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Literal

import trio

from ._client import NatsClient, PendingReply, _Waiter
from ._errors import (
    ConnectionLost,
    JetStreamError,
    JetStreamUnavailable,
    NoResponders,
    RequestTimeout,
)
from ._headers import Headers
from ._jetstream import (
    API_PREFIX,
    ERR_WRONG_LAST_SEQUENCE,
    KV_OPERATION,
    ConsumerConfig,
    ConsumerInfo,
    KvEntry,
    KvRecord,
    PubAck,
    StoredMsg,
    StreamConfig,
    StreamInfo,
    check_key,
    consumer_create_request,
    get_request,
    kv_record,
    kv_stream_config,
    parse_ack_reply,
    parse_api_response,
    parse_consumer_info,
    parse_pub_ack,
    parse_stored_msg,
    parse_stream_info,
    publish_headers,
    pull_request,
    purge_request,
)
from ._protocol import Msg

__all__ = ["FetchedMsg", "JetStream", "KeyValue", "OrderedReader", "PendingAck"]

_UNAVAILABLE = (NoResponders, RequestTimeout, ConnectionLost)


class PendingAck:
    """A JetStream publish in flight (:meth:`JetStream.publish_nowait`):
    :meth:`wait` for its :class:`PubAck`. Its timeout runs from the publish."""

    __slots__ = ("_deadline", "_reply", "_timeout")

    def __init__(self, reply: PendingReply, timeout: float) -> None:
        self._reply = reply
        self._timeout = timeout
        self._deadline = trio.current_time() + timeout

    def done(self) -> bool:
        """Whether its answer (or a failure) came."""
        return self._reply.done()

    async def wait(self) -> PubAck:
        """The acknowledgement; :class:`JetStreamUnavailable` if none came in
        time (resend with the same ``msg_id``), :class:`JetStreamError` if
        refused (a wrong expected last sequence: err_code 10071)."""
        try:
            msg = await self._reply.wait(max(0.0, self._deadline - trio.current_time()))
        except _UNAVAILABLE as error:
            raise JetStreamUnavailable(f"publish to {self._reply.subject!r}: {error}") from error
        return parse_pub_ack(msg.payload)

    def cancel(self) -> None:
        """Stop waiting for the answer."""
        self._reply.cancel()


@dataclass(slots=True)
class FetchedMsg:
    """A message a pull consumer delivered, with its place in the stream and
    the consumer (from its ``$JS.ACK`` reply subject)."""

    subject: str
    payload: bytes
    headers: Headers | None
    stream_seq: int
    consumer_seq: int
    time_ns: int
    pending: int
    reply: str


class _Batch(_Waiter):
    """The messages of one pull request, until its end (a status, or the batch)."""

    __slots__ = ("batch", "description", "messages", "status")

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch
        self.messages: list[Msg] = []
        self.status: int | None = None
        self.description = ""

    def deliver(self, msg: Msg) -> bool:
        headers = msg.headers
        if headers is not None and headers.status is not None:
            if headers.status == 100:  # an idle heartbeat: the request lives
                return False
            self.status = headers.status
            self.description = headers.description
            self.event.set()
            return True
        self.messages.append(msg)
        if len(self.messages) >= self.batch:
            self.event.set()
            return True
        return False


def _fetched(msg: Msg) -> FetchedMsg | None:
    info = parse_ack_reply(msg.reply)
    if info is None:
        return None
    return FetchedMsg(
        msg.subject,
        msg.payload,
        msg.headers,
        info.stream_seq,
        info.consumer_seq,
        info.time_ns,
        info.pending,
        msg.reply,
    )


class JetStream:
    """JetStream's API over ``client``; ``timeout`` is each call's default, in seconds."""

    def __init__(
        self, client: NatsClient, *, prefix: str = API_PREFIX, timeout: float = 5.0
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout = timeout

    async def _api(self, suffix: str, body: bytes = b"") -> Msg:
        subject = f"{self.prefix}.{suffix}"
        try:
            return await self.client.request(subject, body, timeout=self.timeout)
        except _UNAVAILABLE as error:
            raise JetStreamUnavailable(f"JetStream API {suffix}: {error}") from error

    async def account_info(self) -> dict[str, Any]:
        """The account's JetStream usage and limits."""
        return parse_api_response((await self._api("INFO")).payload)

    # ------------------------------------------------------------ streams

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        """Create a stream (the same configuration again is no error; another
        is, err_code 10058)."""
        msg = await self._api(f"STREAM.CREATE.{config.name}", config.encode())
        return parse_stream_info(msg.payload)

    async def update_stream(self, config: StreamConfig) -> StreamInfo:
        """Change a stream's configuration (what may change)."""
        msg = await self._api(f"STREAM.UPDATE.{config.name}", config.encode())
        return parse_stream_info(msg.payload)

    async def stream_info(self, name: str) -> StreamInfo:
        """A stream's configuration and state (err_code 10059 if there is none)."""
        return parse_stream_info((await self._api(f"STREAM.INFO.{name}")).payload)

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and everything in it."""
        parse_api_response((await self._api(f"STREAM.DELETE.{name}")).payload)

    async def purge_stream(
        self,
        name: str,
        *,
        subject: str | None = None,
        seq: int | None = None,
        keep: int | None = None,
    ) -> int:
        """Remove messages (all, or of ``subject``; below ``seq``; all but
        ``keep``); how many were removed. Sequences go on from where they were."""
        body = purge_request(subject, seq=seq, keep=keep)
        answer = parse_api_response((await self._api(f"STREAM.PURGE.{name}", body)).payload)
        return int(answer.get("purged", 0))

    # ------------------------------------------------------------ publishing

    def publish_nowait(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview,
        *,
        headers: Headers | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        timeout: float | None = None,
    ) -> PendingAck:
        """Publish now and return the :class:`PendingAck` (any number in
        flight; each answer goes to its own); ``trio.WouldBlock`` if the
        client's output is full (while disconnected). ``msg_id`` makes a resend
        within the stream's duplicate window a duplicate, not a second copy;
        ``expected_last_seq`` fences: refused (err_code 10071) unless it is
        the stream's last sequence."""
        with_headers = publish_headers(
            headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
        )
        reply = self.client.start_request(subject, payload, with_headers)
        return PendingAck(reply, self.timeout if timeout is None else timeout)

    async def publish(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview,
        *,
        headers: Headers | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (an answer: JetStreamUnavailable)
    ) -> PubAck:
        """Publish and wait for the acknowledgement (see :meth:`publish_nowait`
        and :meth:`PendingAck.wait`)."""
        await self.client.wait_for_room()
        pending = self.publish_nowait(
            subject,
            payload,
            headers=headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            timeout=timeout,
        )
        return await pending.wait()

    # ------------------------------------------------------------ stored messages

    async def get_msg(self, stream: str, seq: int, *, direct: bool = False) -> StoredMsg | None:
        """The message at ``seq``; None if there is none (removed, or past
        the end). ``direct`` asks any replica (the stream must have
        ``allow_direct``) instead of the leader."""
        return await self._get(stream, get_request(seq=seq), direct)

    async def get_last_msg(
        self, stream: str, subject: str, *, direct: bool = False
    ) -> StoredMsg | None:
        """The last message of ``subject`` (wildcards allowed); None if none."""
        return await self._get(stream, get_request(last_by_subject=subject), direct)

    async def get_next_msg(
        self, stream: str, seq: int, subject: str, *, direct: bool = False
    ) -> StoredMsg | None:
        """The first message of ``subject`` (wildcards allowed) at or after
        ``seq``; None if there is none."""
        return await self._get(stream, get_request(seq=seq, next_by_subject=subject), direct)

    async def _get(self, stream: str, body: bytes, direct: bool) -> StoredMsg | None:
        suffix = f"DIRECT.GET.{stream}" if direct else f"STREAM.MSG.GET.{stream}"
        return parse_stored_msg(await self._api(suffix, body))

    # ------------------------------------------------------------ consumers

    async def add_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        """Create a consumer of ``stream`` (durable with ``durable_name``)."""
        subject, body = consumer_create_request(stream, config, self.prefix)
        suffix = subject[len(self.prefix) + 1 :]
        return parse_consumer_info((await self._api(suffix, body)).payload)

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        """A consumer's state (err_code 10014 if there is none)."""
        return parse_consumer_info((await self._api(f"CONSUMER.INFO.{stream}.{name}")).payload)

    async def delete_consumer(self, stream: str, name: str) -> None:
        """Delete a consumer."""
        parse_api_response((await self._api(f"CONSUMER.DELETE.{stream}.{name}")).payload)

    async def fetch(
        self,
        stream: str,
        consumer: str,
        batch: int,
        *,
        max_bytes: int | None = None,
        expires: float = 5.0,
        no_wait: bool = False,
        idle_heartbeat: float | None = None,
    ) -> list[FetchedMsg]:
        """Pull up to ``batch`` messages (and ``max_bytes``) from a pull
        consumer: what came when the batch is full, the server ended the
        request (nothing more now with ``no_wait``, ``expires`` seconds
        passed, the next message larger than what is left of ``max_bytes``)
        or ``expires`` plus a margin passed. :class:`JetStreamUnavailable` if
        nobody serves the consumer (it does not exist, or has no leader)."""
        messages, _status, _ = await self._pull(
            stream, consumer, batch, max_bytes, expires, no_wait, idle_heartbeat
        )
        return messages

    async def _pull(
        self,
        stream: str,
        consumer: str,
        batch: int,
        max_bytes: int | None,
        expires: float,
        no_wait: bool,
        idle_heartbeat: float | None,
    ) -> tuple[list[FetchedMsg], int | None, str]:
        body = pull_request(
            batch,
            max_bytes=max_bytes,
            expires=None if no_wait else expires,
            no_wait=no_wait,
            idle_heartbeat=idle_heartbeat,
        )
        client = self.client
        await client.wait_for_room()
        waiter = _Batch(batch)
        subject = f"{self.prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        reply = client.start_collect(subject, body, waiter)
        try:
            with trio.move_on_after(expires + max(1.0, expires / 2)):
                await waiter.event.wait()
        finally:
            reply.cancel()
        if waiter.error is not None and not waiter.messages:
            raise JetStreamUnavailable(f"pull from {stream}/{consumer}: {waiter.error}")
        if waiter.status == 503 and not waiter.messages:
            raise JetStreamUnavailable(
                f"pull from {stream}/{consumer}: no responders (no such consumer, or no leader)"
            )
        fetched = [found for msg in waiter.messages if (found := _fetched(msg)) is not None]
        return fetched, waiter.status, waiter.description

    def ordered(
        self,
        stream: str,
        start_seq: int = 1,
        *,
        filter_subject: str | None = None,
        inactive_threshold: float = 30.0,
    ) -> OrderedReader:
        """A reader of ``stream`` in order from ``start_seq`` (see :class:`OrderedReader`)."""
        return OrderedReader(
            self,
            stream,
            start_seq,
            filter_subject=filter_subject,
            inactive_threshold=inactive_threshold,
        )

    # ------------------------------------------------------------ KV

    async def create_key_value(
        self,
        bucket: str,
        *,
        history: int = 1,
        ttl: float = 0.0,
        max_bytes: int = -1,
        max_value_size: int = -1,
        storage: Literal["file", "memory"] = "file",
        replicas: int = 1,
    ) -> KeyValue:
        """Create bucket ``bucket`` (its stream ``KV_<bucket>``) and return it."""
        config = kv_stream_config(
            bucket,
            history=history,
            ttl=ttl,
            max_bytes=max_bytes,
            max_value_size=max_value_size,
            storage=storage,
            replicas=replicas,
        )
        await self.add_stream(config)
        return KeyValue(self, bucket)

    def key_value(self, bucket: str) -> KeyValue:
        """Bucket ``bucket`` (made before; nothing is asked of the server)."""
        return KeyValue(self, bucket)


class OrderedReader:
    """A stream read in order from a sequence, through an ephemeral pull
    consumer (deliver from the sequence, no acknowledgements, in memory,
    deleted by the server once unused ``inactive_threshold`` seconds).

    If the consumer is lost (deleted, its server gone) or a gap shows in its
    sequence, the reader makes a new one from the next sequence: no message
    is skipped or repeated. ``next_seq`` is the stream sequence it reads next.
    """

    def __init__(
        self,
        js: JetStream,
        stream: str,
        start_seq: int,
        *,
        filter_subject: str | None,
        inactive_threshold: float,
    ) -> None:
        if start_seq < 1:
            raise ValueError(f"stream sequences start at 1 (got {start_seq})")
        self.js = js
        self.stream = stream
        self.next_seq = start_seq
        self.filter_subject = filter_subject
        self.inactive_threshold = inactive_threshold
        self.consumer: str | None = None
        self._consumer_seq = 0
        #: Consumers made (the first, then one per loss or gap).
        self.resets = 0

    async def _create(self) -> str:
        name = "ord_" + secrets.token_hex(8)
        config = ConsumerConfig(
            name=name,
            deliver_policy="by_start_sequence",
            opt_start_seq=self.next_seq,
            ack_policy="none",
            filter_subject=self.filter_subject,
            inactive_threshold=self.inactive_threshold,
            num_replicas=1,
            mem_storage=True,
        )
        await self.js.add_consumer(self.stream, config)
        self.consumer = name
        self._consumer_seq = 0
        self.resets += 1
        return name

    async def fetch(
        self, batch: int, *, max_bytes: int | None = None, expires: float = 1.0
    ) -> list[FetchedMsg]:
        """The next messages in order (up to ``batch`` and ``max_bytes``;
        ``[]`` if none came within ``expires`` seconds, or the consumer was
        just replaced). :class:`JetStreamUnavailable` while JetStream does not answer."""
        consumer = self.consumer or await self._create()
        try:
            messages, status, description = await self.js._pull(
                self.stream, consumer, batch, max_bytes, expires, False, None
            )
        except JetStreamUnavailable:
            self.consumer = None
            raise
        taken: list[FetchedMsg] = []
        for msg in messages:
            if msg.consumer_seq != self._consumer_seq + 1:
                self.consumer = None  # a gap: start again from next_seq
                break
            self._consumer_seq = msg.consumer_seq
            self.next_seq = msg.stream_seq + 1
            taken.append(msg)
        if status == 409 and "max" not in description.lower():
            self.consumer = None  # deleted, or a leadership change: a new one
        elif status is None and not messages:
            self.consumer = None  # no answer at all: the consumer may be gone
        return taken


class KeyValue:
    """A KV bucket: values by key, each write a revision (its stream sequence).

    :meth:`create` and :meth:`update` are compare-and-set: a second create
    of a key, or an update at a revision that is not the key's last, raises
    :class:`JetStreamError` with err_code 10071 (``ERR_WRONG_LAST_SEQUENCE``).
    """

    def __init__(self, js: JetStream, bucket: str) -> None:
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."

    def _subject(self, key: str) -> str:
        return self._prefix + check_key(key)

    async def _last(self, key: str) -> KvRecord | None:
        stored = await self.js.get_last_msg(self.stream, self._subject(key), direct=True)
        return None if stored is None else kv_record(self.bucket, stored)

    async def get(self, key: str) -> KvEntry | None:
        """The key's value and revision; None if it has none (never written, deleted)."""
        record = await self._last(key)
        if record is None or record.operation != "PUT":
            return None
        return KvEntry(record.value, record.revision)

    async def put(self, key: str, value: bytes) -> int:
        """Write ``value`` whatever the key holds; its revision."""
        return (await self.js.publish(self._subject(key), value)).seq

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        """Write ``value`` if ``last_revision`` is the key's last (0: the key
        was never written); its revision. Refused (10071) if stale."""
        ack = await self.js.publish(
            self._subject(key), value, expected_last_subject_seq=last_revision
        )
        return ack.seq

    async def create(self, key: str, value: bytes) -> int:
        """Write ``value`` if the key has no value (never written, or
        deleted); its revision. Refused (10071) if it has one."""
        try:
            return await self.update(key, value, 0)
        except JetStreamError as error:
            if error.err_code != ERR_WRONG_LAST_SEQUENCE:
                raise
            record = await self._last(key)
            if record is None or record.operation == "PUT":
                raise
            return await self.update(key, value, record.revision)

    async def delete(self, key: str, *, last_revision: int | None = None) -> int:
        """Delete the key's value (a marker is written; ``last_revision`` makes
        it a compare-and-set); the marker's revision."""
        headers = Headers({KV_OPERATION: "DEL"})
        ack = await self.js.publish(
            self._subject(key), b"", headers=headers, expected_last_subject_seq=last_revision
        )
        return ack.seq

    async def purge(self, key: str) -> int:
        """Delete the key and every revision it kept; the marker's revision."""
        headers = Headers({KV_OPERATION: "PURGE", "Nats-Rollup": "sub"})
        return (await self.js.publish(self._subject(key), b"", headers=headers)).seq
