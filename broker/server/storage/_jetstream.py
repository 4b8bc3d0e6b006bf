"""The topics' streams in NATS JetStream: cluster mode's :class:`RunStreams`.

Each topic has one stream, ``T-<name>`` (its name encoded: bytes other
than ASCII letters, digits and ``-`` as ``_XX``; a long name shortened with
a hash), holding one subject, ``broker.topic.<same>``; the topic's name is
kept in the stream's metadata (``topic``), which is how the topics
are listed. The stream is replicated (``cluster_replicas``), on file, with
no limits of its own: the broker purges it as the topic's retention
deletes records. A run is one message: its body the records (see
``broker.log.encode_run``), its headers ``Broker-First-Offset`` and
``Broker-Count`` (and ``Broker-Origins``: whose publishes they are),
``Nats-Msg-Id`` the run's id and
``Nats-Expected-Last-Sequence`` the sequence it follows.

JetStream's answers map onto the seam's errors: no responders, a timeout,
a lost connection (an election, a server down) are
:class:`StreamUnavailable` (the run is sent again, the same message); a
wrong last sequence is :class:`StreamFenced` (another front end wrote the
topic), unless the message after the one the run expected is the run
itself, stored when it was sent before (JetStream checks the expected
sequence before the message id: a run sent again after its answer was
lost is refused that way, and is taken as stored); any other refusal is
taken as unavailable too (tried again with a backoff, never dropped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from broker.backoff import Backoff
from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.log import LogError
from broker.nats import (
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    ConnectError,
    ConnectionClosed,
    ConnectionLost,
    Headers,
    JetStream,
    JetStreamError,
    NatsClient,
    NatsError,
    NoResponders,
    OrderedReader,
    PendingAck,
    RequestTimeout,
    SlowConsumer,
    StreamConfig,
    open_nats,
)
from broker.nats._jetstream import parse_api_response
from broker.nats._server_checks import (
    JSZ_PING_SUBJECT,
    check_server,
    expected_answers,
    servers_not_answering,
)
from broker.protocol import OriginRun

from ._replicated import OutgoingRun
from ._replication import StoredRun, StreamFenced, StreamUnavailable

log = logging.getLogger("broker.server")

__all__ = [
    "ClusterUnavailable",
    "JetStreamRun",
    "JetStreamRuns",
    "open_jetstream_runs",
    "stream_name",
    "topic_subject",
]

#: Prefixes of the broker's streams and subjects.
STREAM_PREFIX = "T-"
SUBJECT_PREFIX = "broker.topic."
#: The stream metadata key that names the topic.
TOPIC_KEY = "topic"
#: Where JetStream tells of a stream's new leader (the stream's name follows).
LEADER_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED."
MSG_ID = "Nats-Msg-Id"
FIRST_OFFSET = "Broker-First-Offset"
#: Whose publishes a run's records are: ``SESSION:HANDLE:INDEX:COUNT``
#: (the session in hex), ``;`` between origins.
ORIGINS = "Broker-Origins"
COUNT = "Broker-Count"
#: Encoded names longer than this are shortened (JetStream keeps a stream
#: in a directory named after it).
_MAX_ENCODED = 120
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
#: Seconds a front end waits for a run's acknowledgement before it sends the
#: run again (to the new leader, after an election; a resend is never stored
#: twice): a stream leader that hangs costs about this much on top of the
#: election.
STORE_TIMEOUT = 2.0
#: Seconds between the front end's PINGs to its NATS server: a server that
#: hangs (sends nothing at all) is left for another after two unanswered
#: ones, within two to three intervals.
PING_INTERVAL = 1.0
#: Bytes of a message kept for a record's header and the message's headers.
RUN_HEADROOM = 4096
#: Seconds a restore's read asks again while JetStream does not answer.
READ_PATIENCE = 60.0
#: Seconds a restore's read waits for the next messages before asking again.
READ_EXPIRES = 2.0


def topic_token(topic: str) -> str:
    """``topic`` as one NATS subject token and name part: its bytes outside
    ``[A-Za-z0-9-]`` as ``_XX``, a long one cut and ended with a digest."""
    data = topic.encode()
    encoded = "".join(chr(b) if b in _SAFE else f"_{b:02X}" for b in data)
    if len(encoded) <= _MAX_ENCODED:
        return encoded
    cut = encoded[:80]
    if "_" in cut[-2:]:
        cut = cut[: cut.rindex("_")]
    return f"{cut}-{hashlib.sha256(data).hexdigest()[:32]}"


def stream_name(topic: str) -> str:
    """The name of ``topic``'s stream (only ``[A-Za-z0-9_-]``)."""
    return STREAM_PREFIX + topic_token(topic)


def topic_subject(topic: str) -> str:
    """The one subject of ``topic``'s stream."""
    return SUBJECT_PREFIX + topic_token(topic)


#: The NATS client's errors (or their causes) by what a run's failure is
#: counted as (``StreamUnavailable.reason``, see ``STORE_FAILURES``).
_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (RequestTimeout, "timeout"),
    (NoResponders, "no_responders"),
    (ConnectionLost, "connection"),
    (ConnectionClosed, "connection"),
    (trio.WouldBlock, "connection"),  # (not sent: the output full while disconnected)
)
#: JetStream's own "temporarily unavailable" (no meta leader, no quorum).
_JS_UNAVAILABLE = 503
#: "duplicate message id is in process" (409): a resend of a run the stream
#: leader holds but has not committed, as while its replicas lost their
#: quorum (nats-server 2.15.1, two of three servers killed: tests/nats/test_cluster.py).
_ERR_IN_PROCESS = 10158


def failure_reason(error: BaseException) -> str:
    """What a failure to store is counted as: ``error`` or its cause (the
    client's ``JetStreamUnavailable`` wraps a timeout, no responders, a lost
    connection)."""
    if isinstance(error, JetStreamError):
        unavailable = error.code == _JS_UNAVAILABLE or error.err_code == _ERR_IN_PROCESS
        return "unavailable" if unavailable else "refused"
    for cause in (error, error.__cause__):
        for kind, reason in _REASONS:
            if isinstance(cause, kind):
                return reason
    return "unavailable"


def _unavailable(what: str, error: BaseException) -> StreamUnavailable:
    return StreamUnavailable(f"{what}: {error}", failure_reason(error))


class JetStreamRun:
    """One topic's stream (a :class:`~._replication.RunStream`)."""

    def __init__(self, js: JetStream, topic: str, timeout: float) -> None:
        self.js = js
        self.topic = topic
        self.stream = stream_name(topic)
        self.subject = topic_subject(topic)
        self.timeout = timeout
        self._reader: OrderedReader | None = None
        #: The last sequence when a read began (a read ends there).
        self._read_end = 0

    async def publish(self, run: OutgoingRun) -> int:
        return await (await self.start_publish(run)).wait()

    async def start_publish(self, run: OutgoingRun) -> PendingRun:
        headers = Headers()
        headers.add(FIRST_OFFSET, str(run.first_offset))
        headers.add(COUNT, str(run.count))
        if run.origins:
            headers.add(ORIGINS, encode_origins(run.origins))
        try:
            await self.js.client.wait_for_room()
            pending = self.js.publish_nowait(
                self.subject,
                run.body,
                headers=headers,
                msg_id=run.msg_id,
                expected_last_seq=run.expected_last_seq,
                timeout=self.timeout,
            )
        except (NatsError, trio.WouldBlock) as error:
            return PendingRun(self, run, None, _unavailable(f"stream {self.stream}", error))
        return PendingRun(self, run, pending, None)

    async def answer(self, run: OutgoingRun, pending: PendingAck) -> tuple[int, bool]:
        """The sequence of ``run`` from its acknowledgement (see the module
        for how each refusal is taken), and whether the stream held it
        already (a duplicate: it was sent before, its answer lost)."""
        try:
            ack = await pending.wait()
        except JetStreamError as error:
            if error.err_code == ERR_WRONG_LAST_SEQUENCE:
                return await self._stored_before(run, error), True
            raise _unavailable(f"stream {self.stream} refused a run", error) from None
        except NatsError as error:
            raise _unavailable(f"stream {self.stream}", error) from None
        return ack.seq, ack.duplicate

    async def _stored_before(self, run: OutgoingRun, refusal: JetStreamError) -> int:
        """The sequence of ``run`` if the stream stored it when it was sent
        before (its answer lost); :class:`StreamUnavailable` if the stream
        ends before the message the run follows (one sent before it was not
        stored); else :class:`StreamFenced`. JetStream checks
        the expected last sequence before the message id, so a run sent again
        after it was stored is refused as if another writer had appended:
        the message after the one it expects tells which."""
        try:
            found = await self.js.get_msg(self.stream, run.expected_last_seq + 1)
        except NatsError as error:
            raise _unavailable(f"stream {self.stream}", error) from None
        if found is None:
            # The stream ends before the message the run follows: a run sent
            # before it was not stored; they are all sent again, in order.
            raise StreamUnavailable(
                f"stream {self.stream}: an earlier run is missing ({refusal})", "refused"
            )
        if found.headers is not None and found.headers.get(MSG_ID) == run.msg_id:
            return found.seq
        raise StreamFenced(str(refusal))

    async def fetch(self, from_seq: int, max_messages: int) -> list[StoredRun]:
        """(See :class:`~._replication.RunStream`.) While JetStream does not
        answer (a consumer or stream leader being elected, a server
        restarting) it asks again with a backoff, for up to
        :data:`READ_PATIENCE` seconds, before it raises
        :class:`StreamUnavailable`."""
        backoff = Backoff(0.05, 2.0)
        deadline = trio.current_time() + READ_PATIENCE
        while True:
            try:
                return await self._fetch(from_seq, max_messages)
            except JetStreamError as error:
                raise LogError(f"stream {self.stream} cannot be read: {error}") from None
            except NatsError as error:
                if trio.current_time() >= deadline:
                    raise _unavailable(f"reading stream {self.stream}", error) from None
                log.info("stream %s: %s (asked again)", self.stream, error)
                self._reader = None  # (a new consumer from where it was)
                await trio.sleep(backoff.next())

    async def _fetch(self, from_seq: int, max_messages: int) -> list[StoredRun]:
        if self._reader is None or self._reader.next_seq != from_seq:
            info = await self.js.stream_info(self.stream)
            self._read_end = info.state.last_seq
            self._reader = self.js.ordered(self.stream, max(from_seq, 1))
        elif from_seq > self._read_end:  # (at the end read last: has it grown since?)
            self._read_end = (await self.js.stream_info(self.stream)).state.last_seq
        reader = self._reader
        if from_seq > self._read_end:
            return []
        while True:
            messages = await reader.fetch(
                min(max_messages, self._read_end - from_seq + 1), expires=READ_EXPIRES
            )
            if messages:
                return [_stored_run(self.stream, message) for message in messages]
            if reader.next_seq > self._read_end:
                return []

    async def purge_below(self, seq: int) -> None:
        try:
            await self.js.purge_stream(self.stream, seq=seq)
        except NatsError as error:
            raise _unavailable(f"purging stream {self.stream}", error) from None


class PendingRun:
    """A run sent to its stream, its answer to come (a ``PendingStore``)."""

    __slots__ = ("_error", "_pending", "_run", "_stream", "duplicate")

    def __init__(
        self,
        stream: JetStreamRun,
        run: OutgoingRun,
        pending: PendingAck | None,
        error: StreamUnavailable | None,
    ) -> None:
        self._stream = stream
        self._run = run
        self._pending = pending
        self._error = error
        self.duplicate = False

    @property
    def done(self) -> bool:
        return self._pending is None or self._pending.done()

    async def wait(self) -> int:
        if self._pending is None:
            await trio.lowlevel.checkpoint()
            assert self._error is not None
            raise self._error
        seq, self.duplicate = await self._stream.answer(self._run, self._pending)
        return seq

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()


def encode_origins(origins: list[OriginRun]) -> str:
    """The ``Broker-Origins`` header of a run's origins."""
    return ";".join(f"{s.hex()}:{h}:{i}:{c}" for s, h, i, c in origins)


def decode_origins(text: str | None) -> list[OriginRun]:
    """The origins of a ``Broker-Origins`` header (a malformed one: none,
    so a resuming session falls back on its own count: resent, never lost)."""
    origins: list[OriginRun] = []
    for part in (text or "").split(";"):
        fields = part.split(":")
        if len(fields) != 4:
            continue
        try:
            session = bytes.fromhex(fields[0])
            handle, index, count = int(fields[1]), int(fields[2]), int(fields[3])
        except ValueError:
            continue
        if session and index >= 1 and count >= 1:
            origins.append((session, handle, index, count))
    return origins


def _stored_run(stream: str, message: Any) -> StoredRun:
    headers = message.headers
    first = headers.get(FIRST_OFFSET) if headers is not None else None
    count = headers.get(COUNT) if headers is not None else None
    if first is None or count is None or not first.isdigit() or not count.isdigit():
        raise LogError(
            f"stream {stream} holds message {message.stream_seq} without "
            f"{FIRST_OFFSET} and {COUNT}: it was not written by the broker"
        )
    origins = decode_origins(headers.get(ORIGINS))
    return StoredRun(message.stream_seq, int(first), int(count), bytes(message.payload), origins)


async def _list_streams(js: JetStream, subject: str, answer_within: float) -> list[StreamConfig]:
    """The configurations of every stream with a subject matching ``subject``
    (``$JS.API.STREAM.LIST``, page by page)."""
    configs: list[StreamConfig] = []
    while True:
        body = json.dumps({"offset": len(configs), "subject": subject}).encode()
        answer = parse_api_response(
            (
                await js.client.request(f"{js.prefix}.STREAM.LIST", body, timeout=answer_within)
            ).payload
        )
        page = answer.get("streams") or []
        configs += [StreamConfig.from_json(info["config"]) for info in page]
        if not page or len(configs) >= int(answer.get("total", 0)):
            return configs


class JetStreamRuns:
    """The topics' streams in one JetStream account (a
    :class:`~._replication.RunStreams`): ``replicas`` copies of each;
    ``timeout`` seconds for each answer."""

    def __init__(self, js: JetStream, *, replicas: int = 3, timeout: float = 5.0) -> None:
        self.js = js
        self.replicas = replicas
        self.timeout = timeout
        #: The topics of the streams opened, by stream name (for advisories).
        self._topics: dict[str, str] = {}
        #: Streams under the broker's subjects that are no topic's (warned of once).
        self._foreign: set[str] = set()

    @property
    def max_record(self) -> int:
        """The largest record a run can carry: the servers' ``max_payload``
        less room for the record's header and the message's headers."""
        return self.js.client.max_payload - RUN_HEADROOM

    def fit(self, config: BrokerConfig) -> BrokerConfig:
        """``config`` with ``max_message`` lowered to :attr:`max_record` if it
        is larger (a record travels whole in one NATS message), said in one line."""
        if config.max_message <= self.max_record:
            return config
        log.warning(
            "cluster mode: messages are limited to %d bytes by the NATS servers' "
            "max_payload (max_message is %d): raise max_payload in their config "
            "for larger ones",
            self.max_record,
            config.max_message,
        )
        return dataclasses.replace(config, max_message=max(self.max_record, config.max_frame))

    def _config(self, topic: str) -> StreamConfig:
        return StreamConfig(
            name=stream_name(topic),
            subjects=[topic_subject(topic)],
            storage="file",
            num_replicas=self.replicas,
            discard="old",
            allow_direct=True,
            description=f"broker topic {topic[:200]}",
            extra={"metadata": {TOPIC_KEY: topic}},
        )

    async def open_stream(self, topic: str) -> JetStreamRun:
        try:
            await self.js.add_stream(self._config(topic))
        except JetStreamError as error:
            raise LogError(f"the stream of topic {topic[:64]!r} cannot be made: {error}") from None
        except NatsError as error:
            raise _unavailable(f"making the stream of topic {topic[:64]!r}", error) from None
        self._topics[stream_name(topic)] = topic
        return JetStreamRun(self.js, topic, self.timeout)

    async def topics(self) -> list[str]:
        try:
            configs = await _list_streams(self.js, SUBJECT_PREFIX + ">", self.timeout)
        except NatsError as error:
            raise _unavailable("listing the topics' streams", error) from None
        found = []
        for config in configs:
            metadata = config.extra.get("metadata") or {}
            topic = metadata.get(TOPIC_KEY) if isinstance(metadata, dict) else None
            if isinstance(topic, str) and stream_name(topic) == config.name:
                found.append(topic)
            elif config.name not in self._foreign:  # (said once: the list is asked often)
                self._foreign.add(config.name)
                log.warning("stream %s is not a broker topic's: left alone", config.name[:80])
        return sorted(found)

    async def watch_leaders(self, elected: Callable[[str], None]) -> None:
        """Hear JetStream's advisories of new stream leaders (the
        subscription is kept across reconnections) and call ``elected`` for
        each topic stream's."""
        with self.js.client.subscribe(LEADER_ELECTED + "*", max_pending_msgs=1024) as advisories:
            while True:
                try:
                    advisory = await advisories.receive()
                except SlowConsumer:  # (some not heard: their runs wait out a timeout)
                    continue
                except (trio.EndOfChannel, NatsError):  # (the client closed: shutting down)
                    return
                topic = self._topics.get(advisory.subject[len(LEADER_ELECTED) :])
                if topic is not None:
                    elected(topic)

    async def delete_stream(self, topic: str) -> bool:
        try:
            await self.js.delete_stream(stream_name(topic))
        except JetStreamError as error:
            if error.err_code == ERR_STREAM_NOT_FOUND:
                return False
            raise _unavailable(f"deleting the stream of topic {topic[:64]!r}", error) from None
        except NatsError as error:
            raise _unavailable(f"deleting the stream of topic {topic[:64]!r}", error) from None
        return True


class ClusterUnavailable(BrokerError):
    """Cluster mode cannot start: the NATS servers cannot be reached, or
    they do not keep what the broker promises (one line saying what to do)."""


#: How long the start-up waits for every server's answer to the JSZ ping.
JSZ_WAIT = 2.0


async def jsz_answers(client: NatsClient) -> list[dict[str, Any]]:
    """Every server's answer to a JSZ ping (none when the user may not ask:
    no responders, or no answer within :data:`JSZ_WAIT` seconds)."""
    answers: list[dict[str, Any]] = []
    inbox = client.new_inbox()
    with client.subscribe(inbox) as replies:
        await client.flush()
        await client.publish(JSZ_PING_SUBJECT, b"", reply=inbox)
        with trio.move_on_after(JSZ_WAIT):
            while not answers or len(answers) < expected_answers(answers):
                reply = await replies.receive()
                if reply.status is not None:  # (503: no responders)
                    break
                try:
                    answer = json.loads(reply.payload)
                except ValueError:
                    continue
                if isinstance(answer, dict):
                    answers.append(answer)
    return answers


@asynccontextmanager
async def open_jetstream_runs(config: BrokerConfig) -> AsyncIterator[JetStreamRuns]:
    """The topics' streams in the JetStream cluster of ``config.cluster``
    for the block, once its servers are checked (:func:`check_server`: a
    version that syncs replicated writes, ``sync_interval: always`` unless
    ``cluster_unsafe_sync``); raises :class:`ClusterUnavailable` otherwise."""
    servers = config.cluster_servers
    try:
        async with open_nats(
            servers, name="broker front end", ping_interval=PING_INTERVAL
        ) as client:
            answers = await jsz_answers(client)
            problems = check_server(
                client.server_info, answers or None, unsafe_sync=config.cluster_unsafe_sync
            )
            size = expected_answers(answers) if answers else None
            if size is not None and size < config.cluster_replicas:
                problems.append(
                    f"cluster_replicas is {config.cluster_replicas} but the JetStream cluster "
                    f"has {size} server{'s' if size != 1 else ''}: add servers, or set "
                    f"cluster_replicas = {1 if size < 3 else 3}"
                )
            if problems:
                raise ClusterUnavailable("cluster mode: " + "; ".join(problems))
            missing = servers_not_answering(answers)
            if missing:
                log.warning(
                    "cluster mode: %s did not answer: their settings are not checked",
                    ", ".join(missing),
                )
            runs = JetStreamRuns(
                JetStream(client), replicas=config.cluster_replicas, timeout=STORE_TIMEOUT
            )
            log.info(
                "cluster mode: JetStream on %d NATS servers (nats-server %s), %d replicas",
                max(len(answers), 1),
                client.server_info.get("version", "?"),
                config.cluster_replicas,
            )
            yield runs
    except ConnectError as error:
        raise ClusterUnavailable(f"cluster mode: {error}") from None
