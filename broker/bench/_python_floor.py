"""The peer benchmark's second floor: the least an MQTT broker written in
Python does, with no async framework at all, run as
``python -m broker.bench._python_floor`` (it prints its port).

One thread waits on Linux's readiness call (``select.epoll``: the
benchmark's CPU figures need Linux's ``/proc`` anyway) and relays by
:class:`~._relay.RelayTable`'s rule, the same as the trio floor's: a read,
the packets in it, a ``send`` per packet sent.
Bytes a client's socket does not take at once wait for it to be writable.
Nothing else (see ``_relay``). It is what any broker in this language costs
at the least, framework aside: ``broker bench peers`` measures it with the
same clients and method as Mosquitto and the trio floor, so that what the
runtime costs (this floor over Mosquitto) and what trio adds (the trio floor
over this one) can be read apart from what this broker adds.
"""

from __future__ import annotations

import select
import socket

from . import _mqtt as mqtt
from ._relay import RelayTable

#: The events that call for a read (an error or a hang-up: the read says which).
_READABLE = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP


class _Client:
    """One connection: its socket, its packet reader, bytes it did not take yet."""

    __slots__ = ("closed", "pending", "reader", "sock", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = mqtt.PacketReader()
        self.pending = bytearray()
        self.closed = False
        #: Whether the selector waits for the socket to be writable.
        self.writing = False


class PythonFloor:
    """The relay over one selector, until the process is stopped."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.epoll = select.epoll()
        #: The clients by file descriptor.
        self.clients: dict[int, _Client] = {}
        self.table = RelayTable[_Client]()
        listener.setblocking(False)
        self.epoll.register(listener.fileno(), select.EPOLLIN)

    def serve_forever(self) -> None:
        listening = self.listener.fileno()
        clients = self.clients
        while True:
            for fd, events in self.epoll.poll():
                if fd == listening:
                    self._accept()
                    continue
                client = clients.get(fd)
                if client is None:
                    continue  # closed earlier in this round
                if events & select.EPOLLOUT:
                    self._send(client, b"")
                if events & _READABLE and not client.closed:
                    self._read(client)

    def _accept(self) -> None:
        try:
            sock, _address = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.clients[sock.fileno()] = _Client(sock)
        self.epoll.register(sock.fileno(), select.EPOLLIN)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
            packets = client.reader.feed(data) if data else None
        except BlockingIOError:
            return
        except (OSError, mqtt.MqttError):
            packets = None
        if packets is None:
            self._close(client)
            return
        for packet in packets:
            try:
                sends = self.table.packet(client, packet)
            except mqtt.MqttError:
                self._close(client)
                return
            for target, out in sends:
                self._send(target, out)
            if packet.type == mqtt.DISCONNECT:
                self._close(client)
                return

    def _send(self, client: _Client, data: bytes) -> None:
        """Send ``data`` after what ``client`` has pending; keep what it
        does not take, and wait for it to be writable then."""
        if client.closed:
            return
        pending = client.pending
        if pending:
            pending += data
            data = bytes(pending)
            pending.clear()
        if data:
            try:
                sent = client.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(client)
                return
            pending += data[sent:]
        if client.writing != bool(pending):
            client.writing = bool(pending)
            events = select.EPOLLIN | (select.EPOLLOUT if pending else 0)
            self.epoll.modify(client.sock.fileno(), events)

    def _close(self, client: _Client) -> None:
        if not client.closed:
            client.closed = True
            del self.clients[client.sock.fileno()]
            self.epoll.unregister(client.sock.fileno())
            client.sock.close()
            self.table.forget(client)


def main() -> None:
    """Serve on a free loopback port; print it once listening."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    PythonFloor(listener).serve_forever()


if __name__ == "__main__":
    main()
