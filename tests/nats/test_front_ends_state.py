"""Durable cursors and consumer groups follow their topic to another front
end (``broker serve --cluster`` processes, three real ``nats-server``s):
a front end that owned the topics is killed (``kill -9``) once the
cluster holds what its subscribers acknowledged and its group settled;
the other front end takes the topics over, and the cursor continues
after its last acknowledged record, the group after what it settled.

Every process is started on free loopback ports and stopped by PID.
Every wait is for a state, with a hang guard: nothing waits for a time
to pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import cbor2
import pytest
import trio

from broker.client import open_client
from broker.nats import JetStream, open_nats
from broker.server.storage._cluster_cursors import BUCKET as CURSORS
from broker.server.storage._cluster_cursors import bucket_key
from broker.server.storage._cluster_groups import BUCKET as GROUPS
from tests.server.test_topic_log import publish, read

from .test_front_ends import _both_serving, _two_front_ends

pytestmark = pytest.mark.slow

#: A hang guard only.
DEADLINE = 120


async def _kept(nats_url: str, topic: str) -> tuple[int | None, int | None]:
    """What the cluster holds of ``topic``: its cursor "c"'s next offset,
    and its group "g"'s floor (None: nothing)."""
    async with open_nats(nats_url, name="looker") as client:
        js = JetStream(client)
        cursor = await js.key_value(CURSORS).get(bucket_key(f"\x00{topic}\x00c"))
        group = await js.key_value(GROUPS).get(bucket_key(f"\x00{topic}\x00g"))
    position = None if cursor is None else int(json.loads(cursor.value)["next"])
    floor = None if group is None else int(cbor2.loads(group.value)[4]["state"][1])
    return position, floor


async def _settle_six(address: str, topic: str) -> None:
    """A member of group "g" takes all ten records and settles the first six."""
    async with (
        open_client(address, name="member") as client,
        client.subscribe(topic, group="g", start="earliest") as member,
    ):
        for _ in range(10):
            message = await member.receive()
            if message.offset is not None and message.offset <= 6:
                message.ack()
        await member.settled()


async def _group_gives(address: str, topic: str) -> list[int]:
    """The offsets a new member of group "g" is given: four."""
    offsets: list[int] = []
    async with (
        open_client(address, name="member", reconnect=60) as client,
        client.subscribe(topic, group="g", start="earliest") as member,
    ):
        while len(offsets) < 4:
            message = await member.receive()
            offsets.append(message.offset or 0)
            message.ack()
    return sorted(offsets)


def test_cursors_and_groups_follow_their_topic_to_another_front_end(tmp_path: Path) -> None:
    with _two_front_ends(tmp_path) as fronts:
        a, b = fronts

        async def main() -> None:
            with trio.fail_after(DEADLINE):
                await _both_serving(fronts)
                async with open_client(a.address, name="asker") as client:
                    cluster = client.cluster
                assert cluster is not None
                b_port = int(b.address.rsplit(":", 1)[1])
                names = (f"moving.{n}" for n in range(1000))
                topics = [t for t in names if cluster.owner(t).port == b_port][:2]
                options = {"from": "earliest", "cursor": "c"}
                for topic in topics:  # (through a: forwarded to b, their owner)
                    await publish(a.address, topic, [b"r%d" % n for n in range(1, 11)])
                    await read(a.address, topic, 6, options)  # (acked as it leaves)
                    await _settle_six(a.address, topic)
                for topic in topics:
                    for _ in range(DEADLINE * 5):  # (written within 0.2 s)
                        if await _kept(a.servers.urls[0], topic) == (7, 7):
                            break
                        await trio.sleep(0.2)
                b.kill()  # (a takes b's topics over once b falls silent)
                await _both_serving([a])  # (a alone)
                for topic in topics:
                    got = await read(a.address, topic, 4, options)
                    assert [(m.seq, m.payload) for m in got] == [
                        (n, b"r%d" % n) for n in range(7, 11)
                    ]
                    assert await _group_gives(a.address, topic) == [7, 8, 9, 10]

        trio.run(main)
