"""The peer benchmark's floor: the least an MQTT broker written with trio
does, run as ``python -m broker.bench._trio_floor`` (it prints its port).

It relays by :class:`~._relay.RelayTable`'s rule (CONNACK, SUBACK, each
PUBLISH forwarded and acknowledged, nothing else: no accounts, no flow
control, no sessions, no bounds on memory, no checks on what clients send),
with trio's own streams, one task per connection. It is not a broker to
use; it is what one costs at the least in this runtime (Python and trio,
idiomatic), measured by ``broker bench peers`` with the same MQTT clients
and method as Mosquitto, so that this broker's figures can be read against
both: a native broker and the floor of any broker built as this one is.
"""

from __future__ import annotations

from functools import partial

import trio

from . import _mqtt as mqtt
from ._relay import RelayTable


class _Relay:
    """The relay's rule, served over trio streams."""

    def __init__(self) -> None:
        self.table = RelayTable[trio.SocketStream]()

    async def serve(self, stream: trio.SocketStream) -> None:
        """One client, until it disconnects (or sends what this cannot read)."""
        reader = mqtt.PacketReader()
        try:
            while data := await stream.receive_some(65536):
                for packet in reader.feed(data):
                    for target, out in self.table.packet(stream, packet):
                        await target.send_all(out)
                    if packet.type == mqtt.DISCONNECT:
                        return
        except (trio.BrokenResourceError, mqtt.MqttError):
            pass
        finally:
            self.table.forget(stream)


async def main() -> None:
    """Serve on a free loopback port; print it once listening."""
    relay = _Relay()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, relay.serve, 0, host="127.0.0.1"))
        print(listeners[0].socket.getsockname()[1], flush=True)


if __name__ == "__main__":
    trio.run(main)
