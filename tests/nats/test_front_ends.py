"""Two front ends over one JetStream cluster (``broker serve --cluster``
processes, three real ``nats-server``s): they share out the topics, each
forwarding to the other what the other owns; a client asking for the
membership is told both; a client of one reads what was published
through the other; and when one stops, the other serves every topic."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.nats._servers import open_nats_servers

from ..proxy import proxied
from .faults import FrontEnd
from .raw import require_nats_server

pytestmark = pytest.mark.slow

#: A hang guard only.
DEADLINE = 120
TOPICS = [f"shared.{n}" for n in range(12)]


async def _publish(address: str, count: int) -> None:
    async with open_client(address, name="pub", reconnect=60) as client:
        for topic in TOPICS:
            for n in range(count):
                await client.publish(topic, b"%s %d" % (topic.encode(), n))
        await client.flush()


async def _read(address: str, topic: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with (
        open_client(address, name="reader", reconnect=60) as client,
        client.subscribe(topic, options={"from": "earliest"}) as subscription,
    ):
        async for message in subscription:
            got.append(message.payload)
            if len(got) == count:
                break
    return got


async def _members(address: str) -> set[int]:
    """The client ports of the front ends a Welcome names."""
    async with open_client(address, name="asker") as client:
        cluster = client.cluster
    assert cluster is not None
    return {member.port for member in cluster.members}


@contextmanager
def _two_front_ends(tmp_path: Path) -> Iterator[list[FrontEnd]]:
    """Three nats-servers and two front ends over them, stopped after (each
    front end's log checked for tracebacks)."""
    require_nats_server()
    with open_nats_servers(
        tmp_path / "nats", 3, system_account=True, app_jsz_import=True
    ) as servers:
        fronts = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            fronts.append(FrontEnd(servers, tmp_path / name))
        try:
            for front in fronts:
                front.start()
            yield fronts
        finally:
            for front in fronts:
                front.stop()
        for name in ("a", "b"):
            log = (tmp_path / name / "front-end.log").read_text()
            assert "Traceback" not in log, log[-3000:]


async def _both_serving(fronts: list[FrontEnd]) -> None:
    """Until each front end names both in its Welcome (each serves afresh
    once the other joins)."""
    ports = {int(f.address.rsplit(":", 1)[1]) for f in fronts}
    for front in fronts:
        for _ in range(DEADLINE * 5):
            if await _members(front.address) == ports:
                break
            await trio.sleep(0.2)
        assert await _members(front.address) == ports


def test_two_front_ends_share_the_topics_and_fail_over(tmp_path: Path) -> None:
    with _two_front_ends(tmp_path) as fronts:
        a, b = fronts

        async def main() -> None:
            with trio.fail_after(DEADLINE):
                await _both_serving(fronts)
                await _publish(a.address, 50)
                for topic in TOPICS:
                    got = await _read(b.address, topic, 50)
                    assert got == [b"%s %d" % (topic.encode(), n) for n in range(50)]
                b.kill()  # (a takes over b's topics once b falls silent)
                await _publish(a.address, 10)
                for topic in TOPICS:
                    got = await _read(a.address, topic, 60)
                    expected = [b"%s %d" % (topic.encode(), n) for n in range(50)]
                    expected += [b"%s %d" % (topic.encode(), n) for n in range(10)]
                    assert got == expected

        trio.run(main)


def test_a_session_moves_between_two_live_front_ends(tmp_path: Path) -> None:
    """A client publishing through one front end reconnects to the other,
    some of its publishes on their way when it does: its session resumes
    there, its publish counts taken from the topics' streams (asked of the
    other front end for the topics that one owns), and every publish is
    stored once, in order (those it sends again are recognised by their
    origins wherever the first copy went)."""
    with _two_front_ends(tmp_path) as fronts:
        a, b = fronts

        async def main() -> None:
            with trio.fail_after(DEADLINE):
                await _both_serving(fronts)
                host, port = a.address.rsplit(":", 1)
                lost: list[int] = []
                async with (
                    proxied((host, int(port))) as proxy,
                    open_client(
                        proxy.url,
                        name="mover",
                        reconnect=60,
                        on_session_lost=lambda: lost.append(1),
                    ) as client,
                ):
                    for n in range(30):
                        for topic in TOPICS:
                            await client.publish(topic, b"%s %d" % (topic.encode(), n))
                    await client.flush()
                    for n in range(30, 35):  # (cut while these are on their way)
                        for topic in TOPICS:
                            await client.publish(topic, b"%s %d" % (topic.encode(), n))
                    host, port = b.address.rsplit(":", 1)
                    proxy.target = (host, int(port))
                    proxy.cut()  # (it reconnects, now to b)
                    for n in range(35, 40):
                        for topic in TOPICS:
                            await client.publish(topic, b"%s %d" % (topic.encode(), n))
                    await client.flush()
                    assert proxy.connections >= 2  # (it moved)
                assert lost == []
                for topic in TOPICS:
                    got = await _read(a.address, topic, 40)
                    assert got == [b"%s %d" % (topic.encode(), n) for n in range(40)]

        trio.run(main)


def test_a_pattern_takes_the_topics_made_at_the_other_front_end(tmp_path: Path) -> None:
    """A pattern subscription on one front end reads the topics another
    front end makes after it subscribed (each topic's stream is in the
    cluster; the front end looks for new ones every second), the ones the
    other owns as well as its own."""
    with _two_front_ends(tmp_path) as fronts:
        a, b = fronts

        async def main() -> None:
            with trio.fail_after(DEADLINE):
                await _both_serving(fronts)
                got: dict[str, list[bytes]] = {topic: [] for topic in TOPICS}
                async with (
                    open_client(a.address, name="watcher", reconnect=60) as client,
                    client.subscribe("shared.>", start="earliest") as subscription,
                ):
                    await trio.sleep(1.5)  # (subscribed, and looked once: nothing yet)
                    await _publish(b.address, 5)
                    async for message in subscription:
                        got[message.topic].append(message.payload)
                        if sum(map(len, got.values())) == 5 * len(TOPICS):
                            break
                for topic in TOPICS:
                    assert got[topic] == [b"%s %d" % (topic.encode(), n) for n in range(5)]

        trio.run(main)
