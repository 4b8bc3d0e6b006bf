"""The peer benchmark's MQTT clients, run in a worker process
(``broker.bench._worker``, roles ``mqtt_pub`` and ``mqtt_sub``): the same
open-loop method as the broker's own latency run, over MQTT 3.1.1.

The publisher sends at a fixed rate, each 100-byte payload stamped with its
*scheduled* send time; at QoS 1 it keeps publishing while PUBACKs come back
(as the broker's client keeps publishing while Confirms come back) and
finishes once every PUBLISH is acknowledged. The subscriber records receive
time minus scheduled time per message (the time of the read that
completed it) and, at QoS 1, acknowledges the deliveries of each read with
their PUBACKs in one send, once it has timed them. Results have the shape
of the broker's own workers' results.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import trio

from . import _mqtt as mqtt
from ._open_loop import STAMP, Arrivals, filler_for, published, schedule


class _Connection:
    """One MQTT connection over TCP: send packets, receive them one by one."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._reader = mqtt.PacketReader()
        self._ready: deque[mqtt.Packet] = deque()

    @classmethod
    async def open(cls, url: str, client_id: str, *, clean_session: bool = True) -> _Connection:
        host, port = url.rsplit(":", 1)
        connection = cls(await trio.open_tcp_stream(host, int(port)))
        await connection.send(mqtt.connect(client_id, clean_session=clean_session))
        code = mqtt.parse_connack(await connection.receive())
        if code:
            raise RuntimeError(f"MQTT broker refused the connection (CONNACK code {code})")
        return connection

    async def send(self, data: bytes) -> None:
        await self._stream.send_all(data)

    async def receive(self) -> mqtt.Packet:
        while not self._ready:
            self._ready.extend(await self._read())
        return self._ready.popleft()

    @property
    def stream(self) -> trio.SocketStream:
        return self._stream

    def feed(self, data: bytes) -> list[mqtt.Packet]:
        """The packets ``data`` (read from :attr:`stream` by the caller)
        completed, after any that :meth:`receive` held back."""
        held = list(self._ready)
        self._ready.clear()
        return held + self._reader.feed(data)

    async def receive_batch(self) -> list[mqtt.Packet]:
        """Every packet that one read completed (at least one), after any
        that :meth:`receive` held back."""
        if self._ready:
            held = list(self._ready)
            self._ready.clear()
            return held
        return await self._read()

    async def _read(self) -> list[mqtt.Packet]:
        while True:
            data = await self._stream.receive_some(65536)
            if not data:
                raise RuntimeError("MQTT broker closed the connection")
            packets = self._reader.feed(data)
            if packets:
                return packets

    async def close(self) -> None:
        await self.send(mqtt.disconnect())
        await self._stream.aclose()


async def mqtt_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``rate`` messages/s for ``duration`` s to ``topic`` at ``qos``."""
    topic: str = spec["topic"]
    qos: int = spec.get("qos", 0)
    rate: float = spec["rate"]
    total = int(rate * spec["duration"])
    filler = filler_for(spec.get("size", 100))
    lateness: list[int] = []
    acked = 0
    connection = await _Connection.open(spec["url"], "bench-mqtt-pub")
    start = time.perf_counter_ns()

    async def read_acks() -> None:
        nonlocal acked
        while acked < total:
            mqtt.parse_puback(await connection.receive())
            acked += 1

    async with trio.open_nursery() as nursery:
        if qos:
            nursery.start_soon(read_acks)
        async for n, scheduled in schedule(rate, total, lateness):
            payload = STAMP.pack(scheduled, n) + filler
            await connection.send(mqtt.publish(topic, payload, qos, n % 0xFFFF + 1 if qos else 0))
        done = time.perf_counter_ns()
    await connection.close()
    return published(start, done, topic, total, lateness, acked=acked)


async def mqtt_subscribe(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe to ``topic`` at ``qos``, print ``ready``, then time ``count``
    messages (or fewer if ``timeout`` seconds pass first)."""
    topic: str = spec["topic"]
    qos: int = spec.get("qos", 0)
    count: int = spec["count"]
    connection = await _Connection.open(spec["url"], "bench-mqtt-sub")
    await connection.send(mqtt.subscribe(1, topic, qos))
    _ident, granted = mqtt.parse_suback(await connection.receive())
    if granted != [qos]:  # (a SUBACK comes before any PUBLISH on this topic)
        raise RuntimeError(f"MQTT broker granted {granted}, not QoS {qos}")
    print("ready", flush=True)
    arrivals = Arrivals()
    with trio.move_on_after(spec.get("timeout", math.inf)):
        while arrivals.received < count:
            packets = await connection.receive_batch()
            now = time.perf_counter_ns()
            acks = []
            for packet in packets:
                message = mqtt.parse_publish(packet)
                if message.qos:
                    acks.append(mqtt.puback(message.packet_id))
                arrivals.arrived(message.payload, now)
            if acks:
                await connection.send(b"".join(acks))
    await connection.close()
    return arrivals.result()
