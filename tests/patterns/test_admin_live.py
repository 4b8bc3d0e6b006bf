"""Delete and purge a topic under a live publisher and subscribers, on real
TCP: nothing crashes or hangs, the subscribers are told (a plain one's
iteration ends; a pattern's goes on with the topic made again, from offset
1; a reader behind a purge gets a Gap), the publisher goes on, and the
disk space comes back."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from broker._topic_rules import TopicRule
from broker.client import AdminRefused, Message, open_client
from tests.proxy import proxied
from tests.server.helpers import TIMEOUT, running_broker, url, wait_until

from .helpers import take

#: Small terms: a purge then deletes whole files.
TERM = 256 * 1024


def _disk(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


async def test_delete_and_purge_under_a_live_publisher(tmp_path: Path) -> None:
    rules = (TopicRule(pattern="live*", term_bytes=TERM, retain_bytes=0, retain_seconds=0),)
    payload = b"x" * 1000
    async with (
        running_broker(data_dir=str(tmp_path), topics=rules) as broker,
        open_client(url(broker)) as client,
        open_client(url(broker), name="publisher") as publisher,
    ):
        published = 0
        stop = trio.Event()

        async def publish() -> None:
            nonlocal published
            while not stop.is_set():
                for _ in range(50):
                    await publisher.publish("live", payload)
                    published += 1
                await publisher.flush()
                await trio.lowlevel.checkpoint()

        pattern: list[Message] = []
        plain: list[Message] = []
        async with (
            client.subscribe("live", start="earliest") as plain_sub,
            client.subscribe("live.>", start="earliest") as unrelated,
            client.subscribe(">", start="earliest") as everything,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(publish)

            async def read_pattern() -> None:
                async for message in everything:
                    pattern.append(message)

            nursery.start_soon(read_pattern)
            with trio.fail_after(TIMEOUT):
                while len(plain) < 2000:
                    plain.append(await plain_sub.receive())
            topic_dir = next((tmp_path / "topics").iterdir())
            before = _disk(tmp_path / "topics")
            row = (await client.admin("delete-topic", topic="live"))[0]
            assert row["deleted"] is True and row["records"] >= 2000
            with trio.fail_after(TIMEOUT):
                async for message in plain_sub:  # what it had received, then the end
                    plain.append(message)
            assert plain_sub.ended is not None
            # The pattern goes on: the topic made again by the publisher, from 1.
            await wait_until(
                lambda: any(m.offset == 1 for m in pattern[1:]), what="the topic made again"
            )
            restarted = [i for i, m in enumerate(pattern) if m.offset == 1]
            assert len(restarted) == 2  # the first record, then the first of the new log
            old, new = pattern[: restarted[1]], pattern[restarted[1] :]
            assert [m.offset for m in old] == list(range(1, len(old) + 1))
            assert [m.offset for m in new] == list(range(1, len(new) + 1))
            assert not topic_dir.exists() or _disk(tmp_path / "topics") < before
            # Purge the new log while the pattern reads on; its bytes go.
            with trio.fail_after(TIMEOUT):
                while True:
                    end = (await client.admin("topics", pattern="live"))[0]["end"]
                    if isinstance(end, int) and end >= 3000:
                        break
                    await trio.sleep(0.05)
            before = _disk(tmp_path / "topics")
            row = (await client.admin("purge-topic", topic="live", before=2500))[0]
            assert row["first"] == 2500 and row["records"] >= 2499
            assert _disk(tmp_path / "topics") < before
            rows = await client.admin("topics", pattern="live")
            assert rows[0]["first"] == 2500
            stop.set()
            nursery.cancel_scope.cancel()
        del unrelated
        assert published > 3000


async def test_a_resumed_pattern_hears_of_a_topic_deleted_while_away(tmp_path: Path) -> None:
    """The pattern's client keeps each topic's last offset (to drop what a
    restart delivers again). A topic deleted while the client was away,
    or before anything of it came on the current connection, is still
    said to be over: made again from offset 1, none of it is dropped."""
    async with (
        running_broker(data_dir=str(tmp_path), lease=30.0) as broker,
        proxied(broker.address) as proxy,
        open_client(proxy.url, reconnect=TIMEOUT) as client,
        client.subscribe("d.*", start="earliest") as sub,
        open_client(url(broker), name="admin") as admin,
    ):
        async with open_client(url(broker), name="publisher") as publisher:
            for index in range(20):
                await publisher.publish("d.x", b"%d" % index)
            await publisher.flush()
        assert [m.offset for m in await take(sub, 20)] == list(range(1, 21))
        await client.flush()  # (its Ack is out: nothing to send again)
        proxy.cut()
        await admin.admin("delete-topic", topic="d.x")
        async with open_client(url(broker), name="publisher") as publisher:
            for index in range(5):
                await publisher.publish("d.x", b"again %d" % index)
            await publisher.flush()
        again = await take(sub, 5)
        assert [(m.topic, m.offset, m.payload) for m in again] == [
            ("d.x", n + 1, b"again %d" % n) for n in range(5)
        ]
        assert client.statistics()["resumes"] >= 1


async def test_a_deleted_cursor_does_not_come_back_with_a_resume(tmp_path: Path) -> None:
    """A subscriber whose connection is down when its topic is deleted: its
    session forgets the subscription, so the resume does not store the
    deleted durable cursor again (which would skip the new log's records)."""
    async with running_broker(data_dir=str(tmp_path), lease=30.0) as broker:
        async with (
            proxied(broker.address) as proxy,
            open_client(proxy.url, reconnect=TIMEOUT) as client,
            open_client(url(broker), name="admin") as admin,
            client.subscribe("t", start="earliest", cursor="c") as sub,
        ):
            async with open_client(url(broker), name="publisher") as publisher:
                for index in range(3):
                    await publisher.publish("t", b"%d" % index)
                await publisher.flush()
            await wait_until(lambda: sub.received == 3, what="all three received")
            proxy.freeze()  # (the Ack of what is taken now is lost)
            await take(sub, 3)
            proxy.cut()
            await wait_until(lambda: broker.sessions.detached >= 1, what="detached")
            assert (await admin.admin("delete-topic", topic="t"))[0]["cursors"] == 1
            proxy.thaw()
            await wait_until(
                lambda: client.statistics()["resumes"] >= 1 or sub.ended is not None,
                what="the resume",
            )
            assert await admin.admin("cursors") == []
        async with open_client(url(broker), name="publisher") as publisher:
            for index in range(5):
                await publisher.publish("t", b"new %d" % index)
            await publisher.flush()
        async with (
            open_client(url(broker), name="again") as again,
            again.subscribe("t", start="earliest", cursor="c") as fresh,
        ):
            assert [m.offset for m in await take(fresh, 5)] == [1, 2, 3, 4, 5]


async def test_a_data_directory_that_cannot_be_listed_does_not_stop_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        assert broker.logs is not None

        def cannot(match: object = None) -> list[object]:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(broker.logs.store, "list_topics", cannot)
        async with (
            open_client(url(broker)) as client,
            client.subscribe("a.*", start="earliest") as sub,
            open_client(url(broker), name="publisher") as publisher,
        ):
            await publisher.publish("a.c", b"made after it")
            await publisher.flush()
            assert [m.payload for m in await take(sub, 1)] == [b"made after it"]
            with pytest.raises(AdminRefused, match="cannot be listed"):
                await client.admin("topics")
