"""The peer benchmark's floor: the least an MQTT broker written with trio
does, run as ``python -m broker.bench._trio_floor`` (it prints its port).

It answers CONNECT and SUBSCRIBE, forwards each PUBLISH to the topic's
subscribers at the publisher's QoS and acknowledges it (PUBACK) at QoS 1,
with trio's own streams, one task per connection; subscribers' PUBACKs are
read and dropped. Nothing else: no accounts, no flow control, no sessions,
no bounds on memory, no checks on what clients send. It is not a broker to
use; it is what one costs at the least in this runtime (Python and trio,
idiomatic), measured by ``broker bench peers`` with the same MQTT clients
and method as Mosquitto, so that this broker's figures can be read against
both: a native broker and the floor of any broker built as this one is.
"""

from __future__ import annotations

from functools import partial

import trio

from . import _mqtt as mqtt

#: CONNACK: session not present, connection accepted.
_CONNACK = bytes([0x20, 2, 0, 0])


class _Relay:
    """The subscribers of each topic, by topic name."""

    def __init__(self) -> None:
        self.subscribers: dict[str, list[trio.SocketStream]] = {}

    async def serve(self, stream: trio.SocketStream) -> None:
        """One client, until it disconnects (or sends what this cannot read)."""
        reader = mqtt.PacketReader()
        try:
            while data := await stream.receive_some(65536):
                for packet in reader.feed(data):
                    if not await self._packet(stream, packet):
                        return
        except (trio.BrokenResourceError, mqtt.MqttError):
            pass
        finally:
            for streams in self.subscribers.values():
                if stream in streams:
                    streams.remove(stream)

    async def _packet(self, stream: trio.SocketStream, packet: mqtt.Packet) -> bool:
        """Act on one packet; False once the client said DISCONNECT."""
        if packet.type == mqtt.PUBLISH:
            message = mqtt.parse_publish(packet)
            out = mqtt.publish(message.topic, message.payload, message.qos, message.packet_id)
            for subscriber in self.subscribers.get(message.topic, ()):
                await subscriber.send_all(out)
            if message.qos:
                await stream.send_all(mqtt.puback(message.packet_id))
        elif packet.type == mqtt.CONNECT:
            await stream.send_all(_CONNACK)
        elif packet.type == mqtt.SUBSCRIBE:
            body = packet.body
            length = int.from_bytes(body[2:4], "big")
            topic = body[4 : 4 + length].decode()
            self.subscribers.setdefault(topic, []).append(stream)
            granted = body[4 + length : 5 + length]
            await stream.send_all(bytes([mqtt.SUBACK << 4, 3]) + body[:2] + granted)
        return packet.type != mqtt.DISCONNECT


async def main() -> None:
    """Serve on a free loopback port; print it once listening."""
    relay = _Relay()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, relay.serve, 0, host="127.0.0.1"))
        print(listeners[0].socket.getsockname()[1], flush=True)


if __name__ == "__main__":
    trio.run(main)
