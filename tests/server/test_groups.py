"""Consumer groups end to end, on real TCP: members share a topic's
records, settle them one by one, get them again (retry, ``ack_wait``, a
member leaving), poison records go to the dead letters, order per key
holds, and the group's position survives a restart.

Nothing waits for a time to pass but the ``ack_wait`` tests, which only
wait for a redelivery to come (however long the machine takes).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from broker.client import ClientError, ConnectionLost, Message, Subscription, open_client

from .helpers import TIMEOUT, running_broker, url, wait_until


async def _publish(broker_url: str, topic: str, count: int, *, keys: int = 0) -> None:
    """``count`` records; with ``keys``, keyed in runs of three (records of
    a key close together, where a member could take two at once)."""
    async with open_client(broker_url) as client:
        for index in range(count):
            key = b"k%d" % (index // 3 % keys) if keys else None
            await client.publish(topic, b"%d" % index, key=key)
        await client.flush()


async def _take(subscription: Subscription, into: list[Message], count: int) -> None:
    while len(into) < count:
        into.append(await subscription.receive())


async def test_members_share_records_and_a_plain_subscriber_gets_all(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        got: dict[str, list[int]] = {"a": [], "b": [], "plain": []}
        async with (
            client.subscribe("jobs", group="workers", start="earliest") as a,
            client.subscribe("jobs", group="workers", start="earliest") as b,
            client.subscribe("jobs", start="earliest") as plain,
        ):
            await _publish(url(broker), "jobs", 400)

            async def member(name: str, subscription: Subscription) -> None:
                async for message in subscription:
                    assert message.deliveries == 0
                    assert message.offset is not None
                    got[name].append(message.offset)
                    message.ack()
                    if len(got["a"]) + len(got["b"]) == 400:
                        nursery.cancel_scope.cancel()

            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(member, "a", a)
                    nursery.start_soon(member, "b", b)
                plain_got: list[Message] = []
                await _take(plain, plain_got, 400)
            assert sorted(got["a"] + got["b"]) == list(range(1, 401))  # each exactly once
            assert got["a"] and got["b"]
            assert [m.offset for m in plain_got] == list(range(1, 401))
            group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
            await wait_until(lambda: group.state.floor == 401, what="everything settled")
            assert group.statistics()["lag"] == 0


async def test_retry_redelivers_and_a_poison_record_is_dead_lettered(tmp_path: Path) -> None:
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe(
            "orders", group="g", start="earliest", options={"max_deliveries": 3}
        ) as member,
        client.subscribe("orders.dead-letters", start="earliest") as dead,
    ):
        await _publish(url(broker), "orders", 20)
        done: list[int] = []
        poison_deliveries: list[int] = []
        with trio.fail_after(TIMEOUT):
            while len(done) < 19 or len(poison_deliveries) < 3:
                message = await member.receive()
                if message.payload == b"7":
                    poison_deliveries.append(message.deliveries or 0)
                    message.retry()
                else:
                    message.ack()
                    done.append(message.offset or 0)
            letter = await dead.receive()
        assert poison_deliveries == [0, 1, 2]
        assert letter.payload == b"7"
        headers = dict(letter.headers or [])
        assert headers["dead-letter.topic"] == b"orders"
        assert headers["dead-letter.offset"] == b"8"
        assert headers["dead-letter.group"] == b"g"
        assert headers["dead-letter.deliveries"] == b"3"
        assert headers["dead-letter.reason"] == b"max_deliveries"
        assert sorted(done) == [o for o in range(1, 21) if o != 8]
        group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
        await wait_until(lambda: group.state.floor == 21, what="the poison settled")
        assert group.state.dead_lettered_count == 1


async def test_reject_goes_straight_to_the_dead_letters_with_its_reason(tmp_path: Path) -> None:
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe("t", group="g", start="earliest", options={"dead_letters": "dlq"}) as m,
        client.subscribe("dlq", start="earliest") as dead,
    ):
        await _publish(url(broker), "t", 1)
        with trio.fail_after(TIMEOUT):
            message = await m.receive()
            message.reject("bad schema")
            letter = await dead.receive()
        assert dict(letter.headers or [])["dead-letter.reason"] == b"bad schema"
        assert dict(letter.headers or [])["dead-letter.deliveries"] == b"1"


async def test_a_member_leaving_gives_back_what_it_held(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "t", 10)
        async with (
            open_client(url(broker)) as leaving_client,
            leaving_client.subscribe(
                "t", group="g", start="earliest", max_outstanding=10
            ) as leaves,
        ):
            held: list[Message] = []
            with trio.fail_after(TIMEOUT):
                await _take(leaves, held, 1)  # it holds all ten (max_outstanding)
            # (it leaves holding them, settling nothing)
        async with open_client(url(broker)) as client, client.subscribe("t", group="g") as stays:
            got: list[Message] = []
            with trio.fail_after(TIMEOUT):
                while {m.offset for m in got} != set(range(1, 11)):
                    message = await stays.receive()
                    got.append(message)
                    message.ack()
            assert sorted(m.offset or 0 for m in got) == list(range(1, 11))
            assert all(m.deliveries == 1 for m in got)  # each delivered once before


async def test_ack_wait_gives_a_record_to_another_member(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        await _publish(url(broker), "t", 1)
        async with client.subscribe(
            "t", group="g", start="earliest", options={"ack_wait": 200}
        ) as slow:
            with trio.fail_after(TIMEOUT):
                first = await slow.receive()  # held, never settled in time
            async with client.subscribe("t", group="g") as fast:
                with trio.fail_after(TIMEOUT):
                    again = await fast.receive()
                assert again.offset == first.offset == 1
                assert again.deliveries == 1
                first.ack()  # too late: counted, changes nothing
                group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
                await wait_until(lambda: group.state.late_settles == 1, what="the late settle")
                assert group.state.floor == 1
                again.ack()
                await wait_until(lambda: group.state.floor == 2, what="settled")


async def test_in_progress_puts_off_ack_wait(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        await _publish(url(broker), "t", 1)
        async with client.subscribe(
            "t", group="g", start="earliest", options={"ack_wait": 300}
        ) as m:
            with trio.fail_after(TIMEOUT):
                message = await m.receive()
            group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
            for _ in range(5):
                await trio.sleep(0.1)
                message.in_progress()
                await m._client.flush()
            # Five extensions later (0.5 s > ack_wait) it is still out, never expired.
            assert group.state.expired == 0
            message.ack()
            await wait_until(lambda: group.state.floor == 2, what="settled")


async def test_order_per_key_across_joins_and_leaves(tmp_path: Path) -> None:
    """4 members at a time, 1,000 keys, two members leaving mid-stream
    holding records and one joining: a key's record is never out while an
    earlier one of that key is, and each key's records come in offset order."""
    count, keys = 4000, 1000
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "k", count, keys=keys)
        processed: dict[bytes, list[int]] = defaultdict(list)
        # key -> the offset out with a member now, and which member
        out: dict[bytes, tuple[int, int]] = {}
        done: set[int] = set()
        violations: list[str] = []

        async def member(stop_after: int | None, me: int) -> None:
            holding: set[bytes] = set()
            try:
                async with (
                    open_client(url(broker)) as client,
                    client.subscribe(
                        "k",
                        group="g",
                        start="earliest",
                        max_outstanding=20,
                        options={"ordering": "key"},
                    ) as subscription,
                ):
                    taken = 0
                    while len(done) < count:
                        with trio.move_on_after(0.5):
                            message = await subscription.receive()
                            key, offset = message.key, message.offset
                            assert key is not None and offset is not None
                            if out.get(key, (offset, me))[0] != offset:
                                violations.append(f"{key!r}: {offset} while {out[key]} is out")
                            out[key] = (offset, me)  # (a record given back comes again)
                            holding.add(key)
                            processed[key].append(offset)
                            taken += 1
                            if stop_after is not None and taken >= stop_after:
                                return  # leaves holding it (not settled)
                            await trio.lowlevel.checkpoint()
                            done.add(offset)
                            del out[key]
                            holding.discard(key)
                            message.ack()
            finally:
                for key in holding:  # (given back to the group as it left)
                    if out.get(key, (0, me))[1] == me:  # (not yet out with another)
                        out.pop(key, None)

        with trio.fail_after(TIMEOUT * 4):
            async with trio.open_nursery() as nursery:
                for me, stop_after in enumerate((None, None, 300, 900)):
                    nursery.start_soon(member, stop_after, me)
                await trio.sleep(0.05)
                nursery.start_soon(member, None, 4)
        assert not violations, violations[:5]
        assert done == set(range(1, count + 1))
        assert len(processed) == keys
        for key, offsets in processed.items():
            # Redeliveries repeat an offset; a key never goes back in order.
            firsts = list(dict.fromkeys(offsets))
            assert firsts == sorted(firsts), f"key {key!r} out of order: {offsets[:20]}"


async def test_the_group_position_survives_a_restart(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "t", 100)
        async with (
            open_client(url(broker)) as client,
            client.subscribe("t", group="g", start="earliest") as member,
        ):
            with trio.fail_after(TIMEOUT):
                for _ in range(60):
                    message = await member.receive()
                    if message.offset and message.offset <= 50:
                        message.ack()
            group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
            await wait_until(lambda: group.state.floor == 51, what="fifty settled")
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe("t", group="g") as member,
    ):
        offsets: list[int] = []
        with trio.fail_after(TIMEOUT):
            while len(offsets) < 50:
                message = await member.receive()
                offsets.append(message.offset or 0)
                message.ack()
        assert sorted(offsets) == list(range(51, 101))  # settled ones never again


async def test_refusals_are_one_line_goodbyes(tmp_path: Path) -> None:
    async with running_broker() as broker, open_client(url(broker)) as client:
        with pytest.raises(ClientError, match="consumer groups"):
            async with client.subscribe("t", group="g"):
                pass
    async with running_broker(data_dir=str(tmp_path)) as broker:
        for options, words in (
            ({"group": "g", "cursor": "c"}, '"group" and "cursor" exclude each other'),
            ({"group": "g", "max_outstanding": 0}, '"max_outstanding" must be an integer'),
            ({"group": "g", "ordering": "time"}, '"ordering" must be "key"'),
            ({"group": "g", "colour": 1}, "unknown subscribe option"),
            ({"group": "bad name!"}, '"group"'),
        ):
            async with open_client(url(broker)) as client:
                with pytest.raises(ConnectionLost, match=words):
                    async with client.subscribe("t", options=options) as subscription:
                        await subscription.receive()


async def test_four_members_take_each_record_exactly_once(tmp_path: Path) -> None:
    """With 4 equal members the split is even, and nothing is delivered twice."""
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "even", 4000)
        counts: Counter[int] = Counter()
        seen: list[int] = []
        async with (
            open_client(url(broker)) as client,
            client.subscribe("even", group="g", start="earliest") as m0,
            client.subscribe("even", group="g", start="earliest") as m1,
            client.subscribe("even", group="g", start="earliest") as m2,
            client.subscribe("even", group="g", start="earliest") as m3,
        ):

            async def run(index: int, subscription: Subscription) -> None:
                while len(seen) < 4000:
                    with trio.move_on_after(0.5):
                        message = await subscription.receive()
                        seen.append(message.offset or 0)
                        counts[index] += 1
                        message.ack()

            with trio.fail_after(TIMEOUT * 2):
                async with trio.open_nursery() as nursery:
                    for index, subscription in enumerate((m0, m1, m2, m3)):
                        nursery.start_soon(run, index, subscription)
        assert sorted(seen) == list(range(1, 4001))
        assert len(counts) == 4


async def test_the_blocking_client_is_a_member_too(tmp_path: Path) -> None:
    from broker.client import BlockingClient

    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "b", 30)

        def consume() -> list[tuple[int, int]]:
            seen: list[tuple[int, int]] = []
            with BlockingClient(url(broker)) as client:
                member = client.subscribe("b", group="g", start="earliest", timeout=TIMEOUT)
                while len(seen) < 33:
                    message = member.receive(timeout=TIMEOUT)
                    seen.append((message.offset or 0, message.deliveries or 0))
                    if message.offset in (5, 6, 7) and not message.deliveries:
                        message.retry()
                    else:
                        message.ack()
                client.flush(timeout=TIMEOUT)
            return seen

        seen = await trio.to_thread.run_sync(consume)
        assert sorted(o for o, d in seen if d == 0) == list(range(1, 31))
        assert sorted(o for o, d in seen if d == 1) == [5, 6, 7]
        group = next(iter(broker.groups.groups.values()), None)  # type: ignore[union-attr]
        # (the member left: the group's state is in the journal, all settled)
        assert group is None or group.state.floor == 31


async def test_a_member_whose_connection_breaks_keeps_what_it_held(tmp_path: Path) -> None:
    """Cut under a member mid-stream, again and again: it resumes, is sent
    again what it held and had not taken, and every record is settled once
    by it (nothing goes to another member, nothing is lost)."""
    from tests.proxy import proxied

    count = 600
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "r", count)
        async with proxied(broker.address) as proxy:
            address = f"{proxy.address[0]}:{proxy.address[1]}"
            async with (
                open_client(address, reconnect=TIMEOUT) as client,
                client.subscribe("r", group="g", start="earliest", max_outstanding=50) as member,
            ):
                offsets: list[int] = []
                with trio.fail_after(TIMEOUT * 2):
                    while len(set(offsets)) < count:
                        message = await member.receive()
                        offsets.append(message.offset or 0)
                        message.ack()
                        if len(offsets) % 100 == 0:
                            proxy.cut()
                assert sorted(set(offsets)) == list(range(1, count + 1))
                assert proxy.cuts >= 5
                group = next(iter(broker.groups.groups.values()))  # type: ignore[union-attr]
                await wait_until(lambda: group.state.floor == count + 1, what="all settled")
                assert client.statistics()["resumes"] >= 1


async def test_a_settle_of_a_delivery_never_sent_ends_the_connection(tmp_path: Path) -> None:
    from broker.protocol import SettleOutcome

    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), "t", 3)
        for group, words in (
            ("g", "Settle names deliveries 5 to 5: only 1 to 3 were sent"),
            (None, "it is not a consumer group's member"),
        ):
            async with open_client(url(broker)) as client:
                with pytest.raises(ConnectionLost, match=words):
                    async with client.subscribe("t", group=group, start="earliest") as member:
                        with trio.fail_after(TIMEOUT):
                            for _ in range(3):
                                await member.receive()
                        # (what the clients never send: a number beyond those sent)
                        client._session.conn.settle(member.handle, SettleOutcome.DONE, [(5, 1)])
                        client._wake_writer()
                        with trio.fail_after(TIMEOUT):
                            await member.receive()
        group_state = next(iter(broker.groups.groups.values()), None)  # type: ignore[union-attr]
        assert group_state is None or group_state.state.settled == 0  # nothing half-applied
