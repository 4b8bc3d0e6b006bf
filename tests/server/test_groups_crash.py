"""``kill -9`` of a broker under a consumer group, and a restart on the
same data directory: no record is lost, and a record settled *done* comes
again only if its settle was among the last before the kill (the group's
state is written every 50 ms: ``broker.server._groups.FLUSH_SECONDS``).

The broker runs in its own process. The member (a client that reconnects
by itself) acks every record it gets; the broker is killed while it does,
and started again a moment later on the same port. The member's session
comes back without the member (a group member is not kept across a
restart), so the client subscribes again and the group goes on from its
journal. Waits are hang guards only; the one time bound asserted (acks in
the last second before the kill) is twenty times the flush period.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from broker.client import open_client

from .helpers import TIMEOUT
from .processes import running_broker

pytestmark = pytest.mark.slow

RECORDS = 3000
#: Acks before the broker is killed.
KILL_AFTER = 1000


async def test_a_broker_killed_under_a_group_loses_nothing_settled(tmp_path: Path) -> None:
    with running_broker(tmp_path) as broker:
        async with open_client(broker.url) as publisher:
            for index in range(RECORDS):
                await publisher.publish("work", b"%d" % index)
            await publisher.flush()
        acked_at: dict[int, float] = {}
        again_after_done: list[int] = []
        killed_at = 0.0
        async with (
            open_client(broker.url, reconnect=TIMEOUT) as client,
            client.subscribe("work", group="g", start="earliest", max_outstanding=100) as member,
        ):
            with trio.fail_after(TIMEOUT * 4):
                while len(acked_at) < RECORDS:
                    message = await member.receive()
                    offset = message.offset
                    assert offset is not None
                    if offset in acked_at:
                        again_after_done.append(offset)
                    message.ack()
                    acked_at.setdefault(offset, time.monotonic())
                    if len(acked_at) == KILL_AFTER and not killed_at:
                        broker.kill()
                        killed_at = time.monotonic()
                        await trio.sleep(0.5)
                        broker.start()
        print(f"delivered again after done: {len(again_after_done)} of {RECORDS}")
        assert sorted(acked_at) == list(range(1, RECORDS + 1))  # nothing lost
        late = {o for o, at in acked_at.items() if killed_at - 1.0 <= at <= killed_at}
        assert set(again_after_done) <= late, (
            f"{len(set(again_after_done) - late)} records settled done more than a second "
            "before the kill came again"
        )
        assert client.statistics()["sessions_lost"] + client.statistics()["resumes"] >= 1
