"""A link whose owner closed the connection (Goodbye) sends nothing more on
it: a batch a forwarding topic hands it before the connection's tasks end
waits for the next connection. It used to be published on the closed
connection: ``LocalProtocolError`` failed the topic's actor, and the whole
worker with it (seen at a graceful shutdown of every worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from accounts import Account, LoanedItem
from broker.config import BrokerConfig
from broker.protocol import Connection, GoodbyeCode, HelloReceived, Role
from broker.protocol.frames import encode_deliver_tail
from broker.server.cluster._forward import ForwardTopic, PendingBatch
from broker.server.cluster._link import Link
from broker.server.topics._topic import Routed
from broker.server.transport._wake import Outbox


@dataclass
class Host:
    config: BrokerConfig = field(default_factory=BrokerConfig)
    outbox: Outbox = field(default_factory=Outbox)
    offsets: bool = False
    account: Account = field(
        default_factory=lambda: Account("root", high_watermark=1 << 30, low_watermark=1 << 29)
    )


class Origin:
    def __init__(self) -> None:
        self.routed_batches: list[Routed] = []

    def routed(self, routed: Routed) -> None:
        self.routed_batches.append(routed)


def batch(account: Account, origin: Origin, count: int) -> PendingBatch:
    tails = [encode_deliver_tail(b"%d" % n, None, None) for n in range(count)]
    routed = Routed(tails, origin, 1, 0, [None] * count)
    return PendingBatch(routed, LoanedItem(account, 100, None))


async def test_a_batch_handed_over_after_the_owners_goodbye_waits() -> None:
    host = Host()
    link = Link(host, "link:w0->w1", "w1", "/nonexistent")
    conn = link.connected()
    owner = Connection(Role.BROKER)
    owner.accept_origins = True  # (as the owner's side of a link is)
    hello = owner.receive_data(conn.data_to_send(0.0), 0.0)
    assert isinstance(hello[0], HelloReceived)
    owner.welcome(session=bytes(16), epoch=b"e")
    assert link.handle(conn, conn.receive_data(owner.data_to_send(0.0), 0.0)) is None
    assert link.open and not link.owner_closing

    account = Account("publisher", high_watermark=1 << 20, low_watermark=1 << 19)
    origin = Origin()
    topic = ForwardTopic("t", {}, link)
    first = batch(account, origin, 3)
    topic.pending.append(first)
    link.publish(topic, first)  # (binds the topic: sent once the owner grants guarantees)
    owner.receive_data(conn.data_to_send(0.0), 0.0)
    assert link.handle(conn, conn.receive_data(owner.data_to_send(0.0), 0.0)) is None
    assert first.sent == 3 and link.awaits_owner

    owner.receive_data(conn.data_to_send(0.0), 0.0)
    owner.goodbye(GoodbyeCode.SHUTTING_DOWN, "broker shutting down")
    reason = link.handle(conn, conn.receive_data(owner.data_to_send(0.0), 0.0))
    assert reason == "goodbye 5: broker shutting down"
    assert conn.closed

    second = batch(account, origin, 2)
    topic.pending.append(second)
    link.publish(topic, second)  # (before: LocalProtocolError, connection is closed)
    assert second.sent == 0 and conn.data_to_send(0.0) == b""
    assert not link.open
    # The owner shuts down: it confirmed and relayed all it will.
    assert link.owner_closing and not link.awaits_owner
    assert not origin.routed_batches  # nothing confirmed: the publishers keep it all

    link.broken()  # (the connection's tasks ended)
    assert [b.sent for b in topic.pending] == [0, 0]  # sent again on the next one
    link.close()  # (the broker stops: what waits is let go, unconfirmed)
    assert not topic.pending and account.debt == 0
