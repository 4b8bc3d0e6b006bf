"""A fake broker on a real socket that says it keeps topic logs (or not):
a broker-side protocol connection that welcomes with ``offsets`` as told,
records each Subscribe and delivers three messages, numbered from ``FIRST``,
to it. For the client and CLI tests of ``start``/``cursor`` and offsets,
which hold whatever the server does with those options.

It never resumes a session, and it delivers from ``FIRST`` whatever the
Subscribe asks: told to (``redeliver``), it breaks the first connection
once the client has acknowledged everything delivered on it, and delivers
more to the next Subscribe (from ``FIRST`` again: a broker whose durable
cursor never read that Ack)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from broker.protocol import Ack, Connection, ConnectionClosed, HelloReceived, Role, Subscribed

SESSION = bytes(range(16))
FIRST = 1000


@dataclass
class Seen:
    """What the fake broker received: Subscribes and Acks, in order."""

    subscribes: list[Subscribed] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)

    @property
    def options(self) -> list[dict[str, Any]]:
        """The options of each Subscribe."""
        return [dict(subscribe.options) for subscribe in self.subscribes]


@asynccontextmanager
async def fake_broker(
    offsets: bool, redeliver: Sequence[int] = ()
) -> AsyncIterator[tuple[str, Seen]]:
    """A broker at ``host:port`` (yielded with what it sees) whose Welcome
    says ``offsets``; it delivers three messages, numbered from ``FIRST``,
    each in its own frame, to every subscription. With ``redeliver``, the
    Subscribes after the first get ``redeliver[i]`` messages from ``FIRST``
    (the last count for any later), and the first connection is broken
    (no Goodbye) once an Ack covers all it delivered."""
    seen = Seen()
    counts = [3, *redeliver]

    async def handle(stream: trio.SocketStream) -> None:
        conn = Connection(Role.BROKER, now=trio.current_time())
        delivered = 0
        async with stream:
            while not conn.closed:
                data = await stream.receive_some(65536)
                if not data:
                    return
                for event in conn.receive_data(data, trio.current_time()):
                    if isinstance(event, HelloReceived):
                        conn.welcome(session=SESSION, epoch=b"fake", offsets=offsets)
                    elif isinstance(event, Ack):
                        seen.acks.append(event)
                        if redeliver and len(seen.subscribes) == 1 and event.seq >= delivered:
                            return  # (closing the stream breaks the connection)
                    elif isinstance(event, Subscribed):
                        seen.subscribes.append(event)
                        count = counts[min(len(seen.subscribes), len(counts)) - 1]
                        for seq in range(FIRST, FIRST + count):
                            conn.deliver(event.handle, seq, b"m%d" % seq)
                        delivered = FIRST + count - 1
                    elif isinstance(event, ConnectionClosed):
                        break
                out = conn.data_to_send(trio.current_time())
                if out:
                    await stream.send_all(out)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        host, port = listeners[0].socket.getsockname()[:2]
        yield f"{host}:{port}", seen
        nursery.cancel_scope.cancel()
