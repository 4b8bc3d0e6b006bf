"""Count MQTT messages lost and duplicated across ``kill -9`` of the broker (issue 45).

Each seed starts ``broker serve --mqtt-listen`` on a fresh data directory
(topic logs, every setting its default: ``flush = "batch"``) and, over MQTT
3.1.1 with the bench's own codec (``broker.bench._mqtt``), in one trio run:

- a **persistent QoS 1 subscriber** (Clean Session 0, one client id for the
  whole run) of both topics below; whenever CONNACK says no session is
  present it subscribes again (a broker restart keeps its positions, not
  yet its list of subscriptions: see docs/mqtt.md), and it acknowledges
  each read's deliveries once it has counted them;
- ``--q1`` **QoS 1 publishers** (Clean Session 1) of ``kill/q1``, flat out
  with at most ``--window`` PUBLISHes unacknowledged; after a reconnection
  each resends what had no PUBACK (DUP set);
- ``--q2`` **QoS 2 publishers** (Clean Session 0) of ``kill/q2``, likewise;
  after a reconnection each resends, as MQTT says (and as paho does,
  whatever CONNACK's Session Present), the PUBLISH of what had no PUBREC
  (DUP set) and the PUBREL of what had no PUBCOMP.

Each payload is the publisher's name and a sequence number. Once traffic
flows (every publisher and the subscriber made progress since the last
start) it waits a seeded random ``--min-delay``-``--max-delay`` s and sends
the broker SIGKILL, then starts it again on the same data directory and
ports ``--restart-delay`` s later; ``--kills`` times. After the last one
the publishers stop publishing and finish what they have in flight, the
subscriber reads until it has every acknowledged message (or nothing came
for ``--settle`` s), and a native client reads both topics' logs from
their first record. Counted, per topic:

- ``acked``: messages the broker acknowledged (QoS 1: PUBACK; QoS 2:
  PUBREC, after which the publisher never sends that PUBLISH again);
- ``lost_log``: acknowledged and not in the topic's log;
  ``lost_subscriber``: acknowledged and never delivered to the persistent
  subscriber;
- ``log_duplicates``: messages stored more than once in the log (QoS 1
  allows it; for QoS 2 it is what exactly once forbids), and
  ``unacked_stored`` (sent, never acknowledged, stored: allowed);
- ``subscriber_duplicates``: deliveries of a message the subscriber had
  (a QoS 1 redelivery, allowed);
- the clients' reconnections and how many of their CONNACKs said Session
  Present.

One JSON line per seed; exit status 1 if an acknowledged message was lost,
or a QoS 2 message stored twice, or a run stalled.

    python -m tests.measure.mqtt_kill --seeds 1 2 3 4 5 --kills 5

(Run from the repository root: with ``-m``, ``broker`` is this tree's.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from broker.bench import _mqtt as mqtt
from broker.client import open_client

try:
    from ._process import free_port, wait_listening
except ImportError:  # run as a script: tests/measure is sys.path[0]
    from _process import free_port, wait_listening  # type: ignore[no-redef,import-not-found]

#: The topics (MQTT names) and their broker names.
TOPICS = {1: "kill/q1", 2: "kill/q2"}
BROKER_NAMES = {1: "kill.q1", 2: "kill.q2"}
#: Errors a client meets when the broker goes away.
GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, mqtt.MqttError, EOFError)


def gone(error: BaseException) -> bool:
    """Whether ``error`` (or every error of a group) says the broker went away."""
    if isinstance(error, BaseExceptionGroup):
        return all(gone(inner) for inner in error.exceptions)
    return isinstance(error, GONE)


async def reconnecting(
    connection: Callable[[int], Awaitable[None]], port: Callable[[], int], done: Callable[[], bool]
) -> None:
    """Run ``connection`` on the broker's current ``port`` again whenever
    the broker went away (:func:`gone`), until ``done()``; any other error
    goes through."""
    while not done():
        try:
            await connection(port())
        except Exception as error:
            if not gone(error):
                raise
            await trio.sleep(0.05)


#: After a start, traffic "flows" once every publisher had this many more
#: acknowledgements and the subscriber this many more deliveries.
FLOW = 200
#: Hang guards (seconds).
FLOW_GUARD = 90.0
FINISH_GUARD = 120.0


@dataclass
class Settings:
    seed: int = 1
    kills: int = 5
    q1: int = 2
    q2: int = 2
    window: int = 64
    payload: int = 64
    min_delay: float = 0.3
    max_delay: float = 1.5
    restart_delay: float = 0.5
    settle: float = 10.0
    keep: bool = False


class Link:
    """One MQTT connection: packets in, bytes out."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = mqtt.PacketReader()
        self.ready: list[mqtt.Packet] = []
        self._sending = trio.Lock()  # (a publisher's reader sends PUBRELs)

    @classmethod
    async def open(cls, port: int, client_id: str, clean: bool) -> tuple[Link, bool]:
        """Connected (CONNACK 0), and whether a session was present."""
        link = cls(await trio.open_tcp_stream("127.0.0.1", port))
        try:
            # (keepalive 0: the broker never closes a quiet client.)
            await link.stream.send_all(mqtt.connect(client_id, keepalive=0, clean_session=clean))
            connack = await link.packet()
            if mqtt.parse_connack(connack):
                raise mqtt.MqttError(f"CONNACK {mqtt.parse_connack(connack)}")
            return link, mqtt.session_present(connack)
        except BaseException:
            await trio.aclose_forcefully(link.stream)
            raise

    async def packets(self) -> list[mqtt.Packet]:
        if self.ready:
            out, self.ready = self.ready, []
            return out
        while True:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the broker closed the connection")
            if out := self.reader.feed(data):
                return out

    async def packet(self) -> mqtt.Packet:
        got = await self.packets()
        first, self.ready = got[0], got[1:] + self.ready
        return first

    async def send(self, data: bytes) -> None:
        async with self._sending:
            await self.stream.send_all(data)


def payload_of(name: str, seq: int, size: int) -> bytes:
    return f"{name} {seq} ".encode().ljust(size, b".")


def parse_payload(payload: bytes) -> tuple[str, int]:
    name, seq, _rest = payload.split(b" ", 2)
    return name.decode(), int(seq)


@dataclass
class Publisher:
    """A QoS 1 or 2 publisher that survives its broker's restarts."""

    name: str
    qos: int
    window: int
    size: int
    next_seq: int = 0
    #: Packet id -> sequence number: PUBLISH sent, no PUBACK / PUBREC yet.
    awaiting: dict[int, int] = field(default_factory=dict)
    #: QoS 2: PUBREC came, PUBREL sent, no PUBCOMP yet.
    releasing: dict[int, int] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    completed: int = 0
    resent_publishes: int = 0
    resent_pubrels: int = 0
    connects: int = 0
    sessions_present: int = 0
    stopping: bool = False
    _next_id: int = 1

    @property
    def topic(self) -> str:
        return TOPICS[self.qos]

    def done(self) -> bool:
        return self.stopping and not self.awaiting and not self.releasing

    def _packet_id(self) -> int:
        packet_id = self._next_id
        while packet_id in self.awaiting or packet_id in self.releasing:
            packet_id = packet_id % 0xFFFF + 1
        self._next_id = packet_id % 0xFFFF + 1
        return packet_id

    async def run(self, port: Callable[[], int]) -> None:
        await reconnecting(self._connection, port, self.done)

    async def _connection(self, port: int) -> None:
        link, present = await Link.open(port, self.name, clean=self.qos == 1)
        self.connects += 1
        self.sessions_present += present
        try:
            resend = [
                mqtt.publish(
                    self.topic, payload_of(self.name, seq, self.size), self.qos, pid, dup=True
                )
                for pid, seq in self.awaiting.items()
            ]
            resend += [mqtt.pubrel(pid) for pid in self.releasing]
            self.resent_publishes += len(self.awaiting)
            self.resent_pubrels += len(self.releasing)
            if resend:
                await link.send(b"".join(resend))
            room = trio.Event()

            async def read() -> None:
                nonlocal room
                while True:
                    out = []
                    for packet in await link.packets():
                        if packet.type == mqtt.PUBACK and self.qos == 1:
                            seq = self.awaiting.pop(mqtt.parse_ack(packet, mqtt.PUBACK), None)
                            if seq is not None:
                                self.acked.add(seq)
                        elif packet.type == mqtt.PUBREC and self.qos == 2:
                            pid = mqtt.parse_ack(packet, mqtt.PUBREC)
                            seq = self.awaiting.pop(pid, None)
                            if seq is not None:
                                self.acked.add(seq)
                                self.releasing[pid] = seq
                            if pid in self.releasing:
                                out.append(mqtt.pubrel(pid))
                        elif packet.type == mqtt.PUBCOMP and self.qos == 2:
                            if self.releasing.pop(mqtt.parse_ack(packet, mqtt.PUBCOMP), None):
                                self.completed += 1
                        else:
                            raise mqtt.MqttError(f"{self.name} got packet type {packet.type}")
                    if out:
                        await link.send(b"".join(out))
                    room.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                while not self.done():
                    free = self.window - len(self.awaiting) - len(self.releasing)
                    if self.stopping or free <= 0:
                        room = trio.Event()
                        await room.wait()
                        continue
                    chunk = []
                    for _ in range(min(free, 16)):
                        pid, seq = self._packet_id(), self.next_seq
                        self.next_seq += 1
                        self.awaiting[pid] = seq
                        chunk.append(
                            mqtt.publish(
                                self.topic, payload_of(self.name, seq, self.size), self.qos, pid
                            )
                        )
                    await link.send(b"".join(chunk))
                nursery.cancel_scope.cancel()
            with contextlib.suppress(*GONE):
                await link.send(mqtt.disconnect())
        finally:
            await trio.aclose_forcefully(link.stream)


@dataclass
class Subscriber:
    """A persistent QoS 1 subscriber of both topics."""

    name: str = "kill-sub"
    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    received: int = 0
    connects: int = 0
    sessions_present: int = 0
    subscribed: trio.Event = field(default_factory=trio.Event)
    last_receive: float = 0.0

    async def run(self, port: Callable[[], int]) -> None:
        await reconnecting(self._connection, port, lambda: False)

    async def _connection(self, port: int) -> None:
        link, present = await Link.open(port, self.name, clean=False)
        self.connects += 1
        self.sessions_present += present
        try:
            if not present:
                await link.send(
                    b"".join(mqtt.subscribe(n, topic, 1) for n, topic in TOPICS.items())
                )
            granted = 0
            while True:
                acks = []
                for packet in await link.packets():
                    if packet.type == mqtt.SUBACK:
                        _pid, codes = mqtt.parse_suback(packet)
                        if codes != [1]:
                            raise RuntimeError(f"SUBACK {codes}")
                        granted += 1
                        if granted == len(TOPICS):
                            self.subscribed.set()
                        continue
                    message = mqtt.parse_publish(packet)
                    self.counts[parse_payload(message.payload)] += 1
                    self.received += 1
                    self.last_receive = trio.current_time()
                    if message.qos:
                        acks.append(mqtt.puback(message.packet_id))
                if acks:
                    await link.send(b"".join(acks))
        finally:
            await trio.aclose_forcefully(link.stream)


class Broker:
    """``broker serve`` with an MQTT listener on a data directory."""

    def __init__(self, work: Path) -> None:
        self.data = work / "data"
        self.log_path = work / "broker.log"
        self.port = free_port()
        self.mqtt_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", f"127.0.0.1:{self.port}", "--metrics-listen", ""]
        command += ["--data-dir", str(self.data), "--mqtt-listen", f"127.0.0.1:{self.mqtt_port}"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        wait_listening(self.mqtt_port)
        self.starts += 1

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def errors(self) -> list[str]:
        """Lines of the broker's log that say an error or a traceback."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "Traceback" in line or "ERROR" in line]


async def read_logs(url: str) -> dict[int, Counter[tuple[str, int]]]:
    """Every record of both topics' logs, counted by (publisher, sequence)."""
    stored: dict[int, Counter[tuple[str, int]]] = {qos: Counter() for qos in TOPICS}
    with trio.fail_after(FINISH_GUARD):
        async with open_client(url, name="kill-log") as client:
            ends = await client.offsets(list(BROKER_NAMES.values()))
            for qos, topic in BROKER_NAMES.items():
                first, end = ends.get(topic, (0, 0))
                if end <= first:
                    continue
                async with client.subscribe(topic, start="earliest") as subscription:
                    last = first - 1
                    while last < end - 1:
                        for message in await subscription.receive_batch(4096):
                            stored[qos][parse_payload(message.payload)] += 1
                            last = message.offset
    return stored


async def until(condition: Callable[[], bool], guard: float) -> bool:
    with trio.move_on_after(guard):
        while not condition():  # noqa: ASYNC110 (conditions of several tasks' counters)
            await trio.sleep(0.02)
        return True
    return False


async def measure(settings: Settings, work: Path) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    broker = Broker(work)
    await trio.to_thread.run_sync(broker.start)
    publishers = [
        Publisher(f"q{qos}-{n}", qos, settings.window, settings.payload)
        for qos, many in ((1, settings.q1), (2, settings.q2))
        for n in range(many)
    ]
    subscriber = Subscriber()
    stalled = ""
    kill_delays: list[float] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscriber.run, lambda: broker.mqtt_port)
            with trio.fail_after(FLOW_GUARD):
                await subscriber.subscribed.wait()
            for publisher in publishers:
                nursery.start_soon(publisher.run, lambda: broker.mqtt_port)

            def flowing() -> Callable[[], bool]:
                acked = [len(p.acked) for p in publishers]
                received = subscriber.received
                return lambda: (
                    subscriber.received >= received + FLOW
                    and all(
                        len(p.acked) >= a + FLOW for p, a in zip(publishers, acked, strict=True)
                    )
                )

            for _kill in range(settings.kills):
                if not await until(flowing(), FLOW_GUARD):
                    stalled = f"no traffic after start {broker.starts}"
                    break
                delay = rng.uniform(settings.min_delay, settings.max_delay)
                kill_delays.append(round(delay, 3))
                await trio.sleep(delay)
                broker.kill()
                await trio.sleep(settings.restart_delay)
                await trio.to_thread.run_sync(broker.start)
            if not stalled and not await until(flowing(), FLOW_GUARD):
                stalled = f"no traffic after start {broker.starts}"
            for publisher in publishers:
                publisher.stopping = True
            if not await until(lambda: all(p.done() for p in publishers), FINISH_GUARD):
                stalled = stalled or "the publishers did not finish"

            def complete() -> bool:
                if trio.current_time() - subscriber.last_receive > settings.settle:
                    return True
                return all(subscriber.counts[(p.name, seq)] for p in publishers for seq in p.acked)

            await until(complete, FINISH_GUARD)
            nursery.cancel_scope.cancel()
        stored = await read_logs(f"127.0.0.1:{broker.port}")
    finally:
        broker.stop()
    result: dict[str, Any] = {"seed": settings.seed, "kills": len(kill_delays)}
    result["kill_delays_s"] = kill_delays
    for qos in TOPICS:
        mine = [p for p in publishers if p.qos == qos]
        log = stored[qos]
        acked = {(p.name, seq) for p in mine for seq in p.acked}
        sent = {(p.name, seq) for p in mine for seq in range(p.next_seq)}
        got = {key: n for key, n in subscriber.counts.items() if key[0].startswith(f"q{qos}-")}
        result[f"q{qos}"] = {
            "published": len(sent),
            "acked": len(acked),
            "lost_log": sum(1 for key in acked if not log[key]),
            "lost_subscriber": sum(1 for key in acked if not got.get(key)),
            "log_records": sum(log.values()),
            "log_duplicates": sum(n - 1 for n in log.values() if n > 1),
            "unacked_stored": sum(1 for key in log if key not in acked),
            "subscriber_duplicates": sum(n - 1 for n in got.values() if n > 1),
            "resent_publishes": sum(p.resent_publishes for p in mine),
            "resent_pubrels": sum(p.resent_pubrels for p in mine),
            "connects": sum(p.connects for p in mine),
            "sessions_present": sum(p.sessions_present for p in mine),
        }
    result["subscriber"] = {
        "connects": subscriber.connects,
        "sessions_present": subscriber.sessions_present,
    }
    result["stalled"] = stalled
    result["broker_errors"] = broker.errors()[:5]
    return result


def failed(result: dict[str, Any]) -> bool:
    q1, q2 = result["q1"], result["q2"]
    return bool(
        result["stalled"]
        or q1["lost_log"]
        or q1["lost_subscriber"]
        or q2["lost_log"]
        or q2["lost_subscriber"]
        or q2["log_duplicates"]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--kills", type=int, default=Settings.kills)
    parser.add_argument("--q1", type=int, default=Settings.q1, help="QoS 1 publishers")
    parser.add_argument("--q2", type=int, default=Settings.q2, help="QoS 2 publishers")
    parser.add_argument("--window", type=int, default=Settings.window)
    parser.add_argument("--min-delay", type=float, default=Settings.min_delay)
    parser.add_argument("--max-delay", type=float, default=Settings.max_delay)
    parser.add_argument("--restart-delay", type=float, default=Settings.restart_delay)
    parser.add_argument("--settle", type=float, default=Settings.settle)
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = parser.parse_args()
    status = 0
    for seed in args.seeds:
        settings = Settings(
            seed=seed,
            kills=args.kills,
            q1=args.q1,
            q2=args.q2,
            window=args.window,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            restart_delay=args.restart_delay,
            settle=args.settle,
            keep=args.keep,
        )
        work = Path(tempfile.mkdtemp(prefix=f"mqtt-kill-{seed}-"))
        try:
            result = trio.run(measure, settings, work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        if args.keep:
            result["directory"] = str(work)
        print(json.dumps(result), flush=True)
        status |= failed(result)
    return status


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    started = time.monotonic()
    code = main()
    print(f"# {time.monotonic() - started:.0f} s", file=sys.stderr)
    raise SystemExit(code)
