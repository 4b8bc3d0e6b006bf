"""Consumer groups under ``--workers``: the group lives at its topic's
owner; a member may subscribe at any worker (a plain client connected to
a worker that does not own the topic is a member over the link), and
members at the owner and elsewhere share the records."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from accounts import Account
from broker.client import Message, Subscription, open_client
from broker.groups import GroupError, Outcome
from broker.server.cluster._forward import ForwardTopic
from broker.server.cluster._forward_group import ForwardedGroupMember

from .helpers import TIMEOUT, cut_links, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_members_at_the_owner_and_elsewhere_share_the_records(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "jobs-")
    count = 600
    async with (
        running_workers(tmp_path, data=True) as (w0, w1),
        open_client(url(w1)) as at_owner,
        open_client(url(w0)) as via_w0,
        at_owner.subscribe(topic, group="g", start="earliest", max_outstanding=50) as direct,
        via_w0.subscribe(topic, group="g", start="earliest", max_outstanding=50) as forwarded,
    ):
        async with open_client(url(w0)) as publisher:
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
        got: dict[str, list[Message]] = {"direct": [], "forwarded": []}
        settled: set[int] = set()

        async def member(name: str, subscription: Subscription) -> None:
            while len(settled) < count:
                with trio.move_on_after(0.2):
                    message = await subscription.receive()
                    got[name].append(message)
                    if message.payload == b"7" and not message.deliveries:
                        message.retry()
                        continue
                    message.ack()
                    settled.add(message.offset or 0)

        with trio.fail_after(TIMEOUT * 2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(member, "direct", direct)
                nursery.start_soon(member, "forwarded", forwarded)
        done = [m.offset for name in got for m in got[name] if m.payload != b"7" or m.deliveries]
        assert sorted(done) == list(range(1, count + 1))  # each done once, 7 retried once
        assert got["forwarded"] and got["direct"]
        assert all(m.offset is not None for m in got["forwarded"])
        assert w1.groups is not None and w0.groups is not None
        (group,) = w1.groups.groups.values()
        await wait_until(lambda: group.state.floor == count + 1, what="all settled at the owner")
        assert not w0.groups.groups  # (the group lives at the owner only)


async def test_a_broken_link_gives_the_forwarded_members_records_back(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "cut-")
    count = 300
    async with running_workers(tmp_path, data=True) as (w0, w1):
        async with open_client(url(w0)) as publisher:
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
        async with (
            open_client(url(w0)) as via_w0,
            via_w0.subscribe(topic, group="g", start="earliest", max_outstanding=20) as member,
        ):
            offsets: set[int] = set()
            with trio.fail_after(TIMEOUT * 2):
                while len(offsets) < count:
                    message = await member.receive()
                    assert message.offset is not None
                    offsets.add(message.offset)
                    message.ack()  # (a settle of a member gone changes nothing)
                    if len(offsets) in (50, 150):
                        assert cut_links(w1) >= 1
            assert offsets == set(range(1, count + 1))
            assert w1.groups is not None
            (group,) = w1.groups.groups.values()
            await wait_until(lambda: group.state.floor == count + 1, what="all settled")


class _FakeLink:
    """A link that records what a forwarded member asks of it."""

    offsets = True

    def __init__(self) -> None:
        self.made: list[object] = []
        self.settles: list[tuple[list[tuple[int, int]], int]] = []

    def subscribe(self, subscription: ForwardedGroupMember) -> None:
        self.made.append(subscription)
        subscription.owner_handle = len(self.made)  # (made at the owner)

    def unsubscribe(self, subscription: object) -> None: ...

    def ack(self, subscription: object, seq: int) -> None: ...

    def resume_deliveries(self, subscription: object) -> None: ...

    def settle(
        self, subscription: object, ranges: list[tuple[int, int]], outcome: int, detail: object
    ) -> None:
        self.settles.append((ranges, outcome))

    def subscription_account(self, name: str) -> Account:
        return Account(name, high_watermark=1 << 20, low_watermark=1 << 19)

    def topic_released(self, topic: object) -> None: ...


class _FakeClient:
    """A connection that takes every delivery."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[int]]] = []

    def send_group(
        self, sub: object, first: int, tails: list[bytes], offsets: list[int], _: list[int]
    ) -> int:
        self.sent.append((first, offsets))
        return len(tails)

    def subscription_stalled(self, subscription: object) -> None: ...

    def gap(self, subscription: object, first: int, count: int) -> bool:
        return True


def test_a_restored_member_through_another_worker_is_made_again_when_its_client_resumes() -> None:
    """After a restart of the worker its client is on, a member over the
    link is made at the owner only once the client resumes, and numbers its
    deliveries on after what the client processed; settles of numbers from
    before the restart change nothing (their records went back)."""
    link = _FakeLink()
    topic = ForwardTopic("t", {}, link)  # type: ignore[arg-type]
    member = ForwardedGroupMember(
        None,  # type: ignore[arg-type]
        3,
        topic,
        {"group": "g"},
        "alice",
        restored=5,
    )
    assert link.made == []  # (nothing held for a client that may not come back)
    client = _FakeClient()
    assert member.attach(client, 7) == 0  # type: ignore[arg-type]
    assert link.made == [member]
    assert member.resubscribe_options(offsets=True) == {"group": "g", "cursor_principal": "alice"}
    member.relay_group(1, [b"a", b"b"], [40, 41], [0, 0])
    assert client.sent == [(8, [40, 41])]
    member.settle([(2, 1), (8, 2)], Outcome.DONE, None)
    assert link.settles == [([(1, 2)], Outcome.DONE)]  # (2 was the old member's)
    with pytest.raises(GroupError, match="only 1 to 9 were sent"):
        member.settle([(10, 1)], Outcome.DONE, None)
    member.close()  # (what it kept for the client is repaid)
