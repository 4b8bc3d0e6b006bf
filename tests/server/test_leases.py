"""Heartbeats, leases and session expiry, end to end.

Most tests run on trio's MockClock with autojump, over in-memory streams
(``memory``; the autojump clock must not run over real sockets): sleeping
through a lease costs no real time, and the broker's timers fire exactly
when due. The real-clock tests run over loopback TCP. Every
virtual time used here is a dyadic fraction (sums of them are exact floats):
see test_lease_deadline_and_peer_gone_agree for why that matters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.client import open_client
from broker.config import KiB, MiB
from broker.protocol import (
    PROTOCOL_VERSION,
    BindTopic,
    Channel,
    ChannelKind,
    Confirm,
    Deliver,
    Goodbye,
    GoodbyeCode,
    Hello,
    IssueGuarantee,
    Message,
    Ping,
    Pong,
    Publish,
    Subscribe,
    Welcome,
)
from broker.protocol.connection import Liveness
from broker.server import Broker

from .helpers import (
    DEAF_CONFIG,
    TIMEOUT,
    RawClient,
    connect_client,
    connection_named,
    raw_client,
    running_broker,
    subscribe_deaf,
    url,
    wait_idle,
)

HEARTBEAT = 2.0
LEASE = 6.0
#: Slack for "about" a deadline in virtual time (the broker's timers are exact).
SLACK = 1 / 16

DELIVER_0 = Channel(ChannelKind.DELIVER, 0)
PUBLISH_0 = Channel(ChannelKind.PUBLISH, 0)


async def settle(condition: Callable[[], bool], *, what: str = "condition") -> None:
    """Like helpers.wait_until, but polling at dyadic intervals of virtual time."""
    with trio.move_on_after(TIMEOUT):
        while True:
            if condition():
                return
            await trio.sleep(1 / 128)
    raise AssertionError(f"timed out waiting for {what}")


def pings(client: RawClient) -> list[Ping]:
    return [m for m in client.frames if isinstance(m, Ping)]


async def answer_pings(client: RawClient, until: float) -> list[float]:
    """Answer every Ping with its Pong until ``until``; returns when each came."""
    answered: list[Message] = []
    times: list[float] = []

    def unanswered(message: Message) -> bool:
        return isinstance(message, Ping) and all(message is not m for m in answered)

    with trio.move_on_at(until):
        while True:
            ping = await client.wait_for(unanswered, what="a Ping")
            assert isinstance(ping, Ping)
            answered.append(ping)
            times.append(trio.current_time())
            await client.send(Pong(ping.nonce))
    return times


# ==================================================================== heartbeats


async def test_idle_client_gets_a_ping_every_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The broker, with nothing to say, pings after one heartbeat, and again
    in every heartbeat after; a client that only answers with Pongs keeps its
    connection far beyond the lease."""
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with raw_client(broker, background=True) as client:
            await client.handshake("idle")
            start = trio.current_time()  # the broker's last frame: the bind guarantees
            times = await answer_pings(client, start + 4 * LEASE)
            assert HEARTBEAT <= times[0] - start <= HEARTBEAT + SLACK
            gaps = [b - a for a, b in zip([start, *times], times, strict=False)]
            assert all(gap <= HEARTBEAT + SLACK for gap in gaps), gaps
            assert times[-1] >= start + 4 * LEASE - HEARTBEAT - SLACK
            assert client.goodbyes() == [] and not client.eof
            assert broker.security.lease_expirations == 0
        await wait_idle(broker)


async def test_one_ping_per_heartbeat(autojump_clock: trio.testing.MockClock) -> None:
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with raw_client(broker, background=True) as client:
            await client.handshake("idle")
            start = trio.current_time()
            await answer_pings(client, start + 24 * HEARTBEAT + HEARTBEAT / 2)
            assert len(pings(client)) == 24, [p.nonce for p in pings(client)]
        await wait_idle(broker)


async def _ping_often(client: RawClient, until: float) -> None:
    nonce = 1000
    while trio.current_time() < until:
        nonce += 1
        await client.send(Ping(nonce))
        await trio.sleep(HEARTBEAT / 4)


async def _publish_often(client: RawClient, until: float) -> None:
    await client.send(BindTopic("chatter"))
    await client.wait_for_guarantee(PUBLISH_0)
    while trio.current_time() < until:
        await client.send(Publish(0, b"tick"))
        await trio.sleep(HEARTBEAT / 4)


@pytest.mark.parametrize("talk", [_ping_often, _publish_often], ids=["pings", "publishes"])
async def test_busy_client_gets_no_ping(
    autojump_clock: trio.testing.MockClock,
    talk: Callable[[RawClient, float], Awaitable[None]],
) -> None:
    """A client that keeps sending frames the broker answers (Pongs,
    Confirms) is never pinged: the broker is never silent for a heartbeat."""
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with raw_client(broker, background=True) as client:
            await client.handshake("busy")
            await talk(client, trio.current_time() + 3 * LEASE)
            answers = [m for m in client.frames if isinstance(m, Pong | Confirm)]
            assert len(answers) >= 3 * LEASE / HEARTBEAT, client.summary()
            assert pings(client) == [], client.summary()
            assert client.goodbyes() == [] and not client.eof
        await wait_idle(broker)


async def test_broker_pings_when_it_alone_is_silent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Liveness counts each direction separately: a client whose frames need
    no answer (guarantees for an empty subscription) keeps its own lease, but
    the broker, having sent nothing, still pings it once per heartbeat."""
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with raw_client(broker, background=True) as client:
            await client.handshake("granter")
            await client.send(BindTopic("empty"), Subscribe(0, "reliable", {}))
            await settle(lambda: broker.statistics().subscriptions == 1)
            start = trio.current_time()
            while trio.current_time() < start + 3 * LEASE:
                await client.send(IssueGuarantee(DELIVER_0, 1))
                await trio.sleep(HEARTBEAT / 4)
            # (At least) one per heartbeat: see test_one_ping_per_heartbeat.
            assert len(pings(client)) >= 3 * LEASE / HEARTBEAT - 1, client.summary()
            assert client.goodbyes() == [] and not client.eof
            assert broker.security.lease_expirations == 0
        await wait_idle(broker)


# ==================================================================== lease expiry


async def test_broken_connection_detaches_then_expires_and_frees_everything(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A subscriber with unacknowledged deliveries (its own publishes and
    another client's) vanishes without Goodbye. Its session keeps its
    subscription, and the loans of those deliveries, for one lease; then it
    expires and every loan, topic and buffer comes back."""
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with connect_client(broker, name="other") as other:
            async with raw_client(broker, background=True) as client:
                welcome = await client.handshake("vanishing")
                await client.send(
                    BindTopic("leased"),
                    Subscribe(0, "reliable", {}),
                    IssueGuarantee(DELIVER_0, 1 * MiB),
                )
                await client.wait_for_guarantee(PUBLISH_0)
                await settle(lambda: broker.statistics().subscriptions == 1)
                await client.send(*(Publish(0, b"mine %d" % i) for i in range(3)))
                for i in range(3):
                    await other.publish("leased", b"theirs %d" % i)
                await other.flush()
                await client.wait_for(
                    lambda m: isinstance(m, Deliver) and m.seq == 6, what="6 deliveries"
                )
                connection = connection_named(broker, "vanishing")
                subscription = connection.subscriptions[0]
                assert subscription.unacked_deliveries == 6
                assert broker.account.debt > 0
            # The socket is closed with no Goodbye.
            with trio.fail_after(1):
                await connection.closed.wait()
            assert client.goodbyes() == []
            session = broker.sessions.sessions[welcome.session]
            detached_at = session.detached_at
            assert detached_at is not None
            assert broker.sessions.detached == 1
            assert session.subscriptions == {0: subscription}
            assert broker.topics["leased"].subscriptions  # still queueing for a resume
            assert subscription.unacked_deliveries == 6
            assert broker.account.debt > 0  # the unacknowledged deliveries' loans

            # Still there just before the lease ends...
            await trio.sleep_until(detached_at + LEASE - SLACK)
            assert broker.sessions.expired_total == 0
            assert broker.sessions.detached == 1
            await other.publish("leased", b"while detached")
            await other.flush()
            assert subscription.queued == 1
            # ...and gone just after.
            await trio.sleep_until(detached_at + LEASE + SLACK)
            assert broker.sessions.expired_total == 1
            assert broker.sessions.detached == 0
            assert welcome.session not in broker.sessions.sessions  # only other's is left
            assert len(broker.sessions.sessions) == 1
            assert session.subscriptions == {}
            assert broker.statistics().subscriptions == 0
            # The other client goes on publishing to a topic nobody reads.
            await other.publish("leased", b"after")
            await other.flush()
        assert broker.security.lease_expirations == 0  # it never went silent
        await wait_idle(broker)
        assert broker.sessions.sessions == {}


async def _silent_client_closed(broker: Broker, name: str) -> tuple[Welcome, float]:
    """A client that handshakes, subscribes, then sends nothing at all (its
    socket open): the broker closes it with Goodbye 4 after one lease, and
    its session detaches. Returns its Welcome and when it detached."""
    async with raw_client(broker) as client:
        welcome = await client.handshake(name)
        await client.send(BindTopic("quiet"), Subscribe(0, "reliable", {}))
        last_sent = trio.current_time()
        await settle(lambda: broker.statistics().subscriptions == 1)
        connection = connection_named(broker, name)
        frames = await client.read_until_eof()
        closed_at = trio.current_time()
        assert client.goodbye_code() == GoodbyeCode.LEASE_EXPIRED, client.summary()
        assert LEASE <= closed_at - last_sent <= LEASE + SLACK
        assert any(isinstance(m, Ping) for m in frames)  # it was asked, in vain
        assert broker.security.lease_expirations == 1
        # Goodbye 4 is not the end of the session: it waits for a resume.
        assert broker.sessions.expired_total == 0
    with trio.fail_after(1):
        await connection.closed.wait()
    session = broker.sessions.sessions[welcome.session]
    assert session.connection is None and session.detached_at is not None
    assert broker.sessions.detached == 1
    assert list(session.subscriptions) == [0]
    return welcome, session.detached_at


async def test_silent_client_gets_goodbye_4_and_may_resume_within_the_next_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        welcome, detached_at = await _silent_client_closed(broker, "silent")
        await trio.sleep_until(detached_at + LEASE - 2 * SLACK)
        assert broker.sessions.expired_total == 0
        async with raw_client(broker, background=True) as client:
            # It processed nothing of its subscription 0 (listing it keeps it).
            await client.send(Hello(PROTOCOL_VERSION, "silent", welcome.session, {0: 0}))
            resumed = await client.wait_for_message(Welcome)
            assert resumed.resumed
            assert resumed.session == welcome.session
            assert broker.sessions.detached == 0
            assert broker.sessions.resumed_total == 1
            # The resumed session outlives its old expiry.
            await trio.sleep_until(detached_at + LEASE + 1)
            assert broker.sessions.expired_total == 0
            assert list(broker.sessions.sessions) == [welcome.session]
            assert broker.statistics().subscriptions == 1
            assert client.goodbyes() == []
        # Gone again without Goodbye: a new lease, then expiry.
        await settle(lambda: broker.sessions.detached == 1)
        await trio.sleep(LEASE + SLACK)
        assert broker.sessions.expired_total == 1
        assert broker.sessions.sessions == {}
        await wait_idle(broker)


async def test_silent_client_session_expires_one_lease_after_goodbye_4(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker(heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        welcome, detached_at = await _silent_client_closed(broker, "silent")
        await trio.sleep_until(detached_at + LEASE + SLACK)
        assert broker.sessions.expired_total == 1
        assert broker.sessions.sessions == {}
        assert broker.statistics().subscriptions == 0
        async with raw_client(broker) as client:
            await client.hello("silent", session=welcome.session)
            fresh = await client.wait_for_message(Welcome)
            assert not fresh.resumed and fresh.bound is None
            assert fresh.session != welcome.session
            assert broker.sessions.resumed_total == 0
            await client.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
            await client.read_until_eof()
        await wait_idle(broker)
        assert broker.sessions.sessions == {}


# ==================================================================== throttled is not silent


async def _keep_pinging(client: RawClient) -> None:
    nonce = 0
    while True:
        nonce += 1
        await client.send(Ping(nonce))
        await trio.sleep(HEARTBEAT / 2)


async def test_publisher_throttled_for_many_leases_keeps_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A deaf subscriber (alive: it pings, but grants nothing) blocks a
    publisher's account until the broker stops reading the publisher's
    socket. The publisher goes on pinging, unread, for several leases: that
    silence is the broker's doing, so its lease does not run out."""
    config = {
        **DEAF_CONFIG,
        # One channel's debt is enough to stop the connection's reader.
        "connection_high_watermark": 8 * KiB,
        "connection_low_watermark": 4 * KiB,
    }
    async with running_broker(**config, heartbeat=HEARTBEAT, lease=LEASE, in_memory=True) as broker:
        async with raw_client(broker, background=True) as deaf:
            await subscribe_deaf(deaf, 0)
            await settle(lambda: broker.statistics().subscriptions == 1)
            async with raw_client(broker, background=True) as publisher:
                await publisher.handshake("publisher")
                await publisher.send(BindTopic("busy"))
                granted = await publisher.wait_for_guarantee(PUBLISH_0)
                connection = connection_named(broker, "publisher")
                liveness = connection.protocol.liveness
                payload = b"x" * 1000
                count = granted.amount // (len(payload) + 16)
                await publisher.send(*(Publish(0, payload) for _ in range(count)))
                await settle(lambda: liveness.suspended_at is not None, what="suspended")
                assert connection.account.blocked
                suspended_at = liveness.suspended_at
                # Both talk on; the broker does not listen to the publisher.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_keep_pinging, deaf)
                    nursery.start_soon(_keep_pinging, publisher)
                    await trio.sleep(4 * LEASE)
                    nursery.cancel_scope.cancel()
                assert liveness.suspended_at == suspended_at  # not read since
                assert connection.protocol.frames_received == 2 + count  # Hello, BindTopic
                assert publisher.goodbyes() == [] and not publisher.eof
                assert deaf.goodbyes() == [] and not deaf.eof
                assert broker.security.lease_expirations == 0
                assert broker.sessions.detached == 0
                assert broker.connections.get(connection.serial) is connection

                # The deaf subscriber leaves: the debt is repaid, the broker
                # reads the publisher again (the Pings it held back too).
                await deaf.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
                await deaf.read_until_eof()
                await settle(lambda: liveness.suspended_at is None, what="reading again")
                await publisher.send(Ping(424242))
                await publisher.wait_for(lambda m: isinstance(m, Pong) and m.nonce == 424242)
                assert publisher.goodbyes() == []
                assert broker.security.lease_expirations == 0
                await publisher.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
                await publisher.read_until_eof()
        await wait_idle(broker)


# ==================================================================== known bugs


def test_lease_deadline_and_peer_gone_agree() -> None:
    liveness = Liveness(heartbeat=2.0, lease=6.0, last_sent=17.0, last_received=11.9)
    deadline = liveness.next_deadline()
    assert deadline == 11.9 + 6.0
    assert liveness.peer_gone(deadline) or liveness.ping_due(deadline)


async def test_lease_expiry_closes_a_connection_whose_writer_is_blocked() -> None:
    """Real clock. A subscriber grants plenty, then neither reads nor sends
    (a hung process): the broker's writer blocks on the full socket. Its lease
    runs out; the connection must still close and the session detach."""
    lease = 2.0  # (long enough for the publisher to fill the socket on a loaded machine)
    big = 16 * MiB
    config = {
        "heartbeat": 0.5,
        "lease": lease,
        "channel_high_watermark": big,
        "channel_low_watermark": big // 2,
        "connection_high_watermark": 2 * big,
        "connection_low_watermark": big,
    }
    async with running_broker(**config) as broker, raw_client(broker) as deaf:
        await subscribe_deaf(deaf, 4 * big)
        await settle(lambda: broker.statistics().subscriptions == 1)
        connection = connection_named(broker, "deaf")
        async with open_client(url(broker), name="publisher") as publisher:
            with trio.fail_after(TIMEOUT):
                # Until deliveries queue up behind a blocked write.
                while connection.protocol.bytes_to_send < 256 * KiB:
                    await publisher.publish("busy", b"x" * 60_000)
                await publisher.flush()
            with trio.move_on_after(lease + 1.5):  # the broker lingers 1 s at most
                await connection.closed.wait()
            assert broker.security.lease_expirations == 1
            assert connection.closed.is_set(), connection.close_reason
            assert broker.sessions.detached == 1


# ==================================================================== resume by principal

AUTH_FILE = """
[principals.alice]
token = "alice-token"

[principals.mallory]
token = "mallory-token"
"""


async def test_only_the_same_principal_may_resume_a_session(tmp_path: Path) -> None:
    """A detached session's id is not enough: another principal asking to
    resume it gets a fresh session, and the detached one stays its owner's."""
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    async with running_broker(auth_file=str(auth)) as broker:
        async with raw_client(broker) as alice:
            await alice.send(Hello(PROTOCOL_VERSION, "alice", None, {}, "alice-token"))
            welcome = await alice.wait_for_message(Welcome)
            await alice.send(BindTopic("mine"), Subscribe(0, "reliable", {}))
            await settle(lambda: broker.statistics().subscriptions == 1)
        await settle(lambda: broker.sessions.detached == 1)

        async with raw_client(broker) as mallory:
            await mallory.send(
                Hello(PROTOCOL_VERSION, "mallory", welcome.session, {0: 0}, "mallory-token")
            )
            stolen = await mallory.wait_for_message(Welcome)
            assert not stolen.resumed and stolen.session != welcome.session
            assert broker.sessions.sessions[welcome.session].connection is None
            assert broker.sessions.resumed_total == 0
            await mallory.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
            await mallory.read_until_eof()

        async with raw_client(broker) as alice:
            await alice.send(
                Hello(PROTOCOL_VERSION, "alice", welcome.session, {0: 0}, "alice-token")
            )
            resumed = await alice.wait_for_message(Welcome)
            assert resumed.resumed and resumed.session == welcome.session
            assert broker.statistics().subscriptions == 1
            await alice.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
            await alice.read_until_eof()
        await wait_idle(broker)
        assert broker.sessions.sessions == {}
