"""Topic administration end to end, on real TCP: listing topics opened or
only on disk, deleting and purging under a live publisher and subscriber,
cursors, and who may do it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import AdminRefused, open_client
from tests.server.helpers import TIMEOUT, running_broker, url

from .helpers import take


async def _publish(broker_url: str, topic: str, count: int) -> None:
    async with open_client(broker_url) as client:
        for index in range(count):
            await client.publish(topic, b"%d" % index)
        await client.flush()


async def test_topics_lists_what_is_on_disk_after_a_restart(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        for name, count in (("a.x", 3), ("a.y", 5), ("b", 1)):
            await _publish(url(broker), name, count)
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        rows = await client.admin("topics")
        assert [(r["topic"], r["first"], r["end"], r["open"]) for r in rows] == [
            ("a.x", 1, 4, False),
            ("a.y", 1, 6, False),
            ("b", 1, 2, False),
        ]
        assert all(isinstance(r["bytes"], int) and r["bytes"] > 0 for r in rows)
        rows = await client.admin("topics", pattern="a.*")
        assert [r["topic"] for r in rows] == ["a.x", "a.y"]
        with pytest.raises(AdminRefused, match="empty token"):
            await client.admin("topics", pattern="a..b")


async def test_delete_ends_subscribers_and_publishers_go_on(tmp_path: Path) -> None:
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe("t", start="earliest") as plain,
        client.subscribe("t.>", start="earliest") as other,
        client.subscribe(">", start="earliest") as everything,
    ):
        await _publish(url(broker), "t", 10)
        await take(plain, 10)
        assert len(await take(everything, 10)) == 10
        row = (await client.admin("delete-topic", topic="t"))[0]
        assert row["deleted"] is True and row["records"] == 10
        with trio.fail_after(TIMEOUT):
            async for _ in plain:  # ends cleanly: no hang
                pytest.fail("no message after the delete")
        assert plain.ended is not None and "deleted" in plain.ended
        # (The publisher's session still binds it: it goes on, empty, from offset 1.)
        rows = await client.admin("topics")
        assert [(r["topic"], r["first"], r["end"]) for r in rows] == [("t", 1, 1)]
        # Made again: offsets from 1, and the pattern matches it again.
        await _publish(url(broker), "t", 2)
        again = await take(everything, 2)
        assert [(m.topic, m.offset) for m in again] == [("t", 1), ("t", 2)]
        with pytest.raises(AdminRefused, match="no topic"):
            await client.admin("delete-topic", topic="missing")
        del other


async def test_purge_tells_a_subscriber_behind_with_a_gap(tmp_path: Path) -> None:
    big = b"x" * 60_000  # (100 of them are more than a subscriber's window: it is behind)
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        async with open_client(url(broker)) as publisher:
            for _ in range(100):
                await publisher.publish("p", big)
            await publisher.flush()
        async with (
            client.subscribe("p", start="earliest") as sub,
            client.subscribe("p.>", start="earliest") as none,
        ):
            first = await sub.receive()
            assert first.offset == 1
            row = (await client.admin("purge-topic", topic="p", before=61))[0]
            assert row == {"topic": "p", "first": 61, "records": 60}
            got = [first]
            with trio.fail_after(TIMEOUT):
                while got[-1].offset != 100:
                    got.append(await sub.receive())
            offsets = [m.offset for m in got]
            sent = offsets.index(61)  # what the broker had sent before the purge
            assert offsets == [*range(1, sent + 1), *range(61, 101)]
            assert sub.missed == 60 - sent > 0  # the rest: told with a Gap
            del none
        rows = await client.admin("topics", pattern="p")
        assert (rows[0]["first"], rows[0]["end"]) == (61, 101)


async def test_cursors_listed_and_deleted(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        await _publish(url(broker), "c.1", 5)
        async with client.subscribe("c.*", start="earliest", cursor="reader") as sub:
            await take(sub, 5)
        rows = await client.admin("cursors")
        assert [(r["topic"], r["cursor"], r["position"]) for r in rows] == [("c.1", "reader", 6)]
        assert (await client.admin("delete-cursor", topic="c.1", cursor="reader"))[0]["deleted"]
        assert await client.admin("cursors") == []
        with pytest.raises(AdminRefused, match="no cursor"):
            await client.admin("delete-cursor", topic="c.1", cursor="reader")


AUTH = """
[principals.admin]
token = "admin-token"
admin = true

[principals.reader]
token = "reader-token"
subscribe = ["open.*"]
publish = ["open.*", "secret.*"]
"""


async def test_patterns_and_admin_follow_the_principal(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH)
    async with running_broker(data_dir=str(tmp_path / "data"), auth_file=str(auth)) as broker:
        address = url(broker)
        async with open_client(address, token="reader-token") as client:
            for topic in ("open.a", "secret.b", "open.c"):
                await client.publish(topic, b"before")
            await client.flush()
            async with client.subscribe(">", start="earliest") as everything:
                await client.publish("secret.later", b"never shown")
                await client.publish("open.later", b"shown")
                await client.flush()
                got = await take(everything, 3)
                assert sorted(m.topic for m in got) == ["open.a", "open.c", "open.later"]
                with trio.move_on_after(0.3):
                    message = await everything.receive()
                    pytest.fail(f"a topic it may not read was revealed: {message.topic}")
            with pytest.raises(AdminRefused, match="admin = true") as refused:
                await client.admin("topics")
            assert refused.value.status == 2
        async with open_client(address, token="admin-token") as admin:
            rows = await admin.admin("topics")
            assert "secret.b" in [r["topic"] for r in rows]


async def test_groups_listed_and_deleted_only_without_members(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker, open_client(url(broker)) as client:
        await _publish(url(broker), "jobs", 4)
        async with client.subscribe("jobs", group="w", start="earliest") as member:
            for message in await take(member, 2):
                message.ack()
            await member.settled()
            (row,) = await client.admin("groups")
            assert (row["topic"], row["group"], row["members"]) == ("jobs", "w", 1)
            assert row["floor"] == 3 and row["outstanding"] == 2
            with pytest.raises(AdminRefused, match="1 member"):
                await client.admin("delete-group", topic="jobs", group="w")
        assert (await client.admin("delete-group", topic="jobs", group="w"))[0]["deleted"]
        assert await client.admin("groups") == []
        with pytest.raises(AdminRefused, match="no group"):
            await client.admin("delete-group", topic="jobs", group="w")
