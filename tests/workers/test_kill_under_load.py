"""A worker killed with SIGKILL while a publisher it forwards for is
publishing flat out: every publish confirmed before the kill is in the
owner's log exactly once, nothing is lost, and the log keeps the
publisher's order. A publish in flight at the kill (not yet confirmed to its
client) may be stored twice, as with one broker process (``docs/broker.md``,
"What else survives a restart")."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import trio

from broker.client import open_client

from ..server.helpers import wait_until
from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

#: Messages published; the kill comes at the middle one.
COUNT = 4000


async def test_a_forwarder_killed_mid_stream_loses_nothing_and_stores_no_confirmed_publish_twice(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        topic = topics_of("w1", ["w0", "w1"], 1)[0]  # owned by w1, published at w0
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        url1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(url0, name="pub", reconnect=DEADLINE) as publisher:
            confirmed_at_kill = -1
            for n in range(COUNT):
                await publisher.publish(topic, b"%d" % n)
                if n == COUNT // 2:
                    # Some confirmed, the rest in flight; whatever the client
                    # had heard confirmed before the kill (a Confirm arriving
                    # after this counts as unconfirmed).
                    await wait_until(lambda: publisher.statistics()["confirmed"] >= COUNT // 4)
                    confirmed_at_kill = publisher.statistics()["confirmed"]
                    assert w0.pid is not None
                    os.kill(w0.pid, signal.SIGKILL)
            with trio.fail_after(DEADLINE):
                await publisher.flush()
            statistics = publisher.statistics()
            assert statistics["sessions_lost"] == 0 and statistics["resumes"] >= 1
        assert w0.restarts == 1 and w0.last_exit == -signal.SIGKILL
        assert COUNT // 4 <= confirmed_at_kill <= COUNT // 2 + 1

        stored: list[int] = []
        async with (
            open_client(url1, name="reader") as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(DEADLINE):
                while not stored or stored[-1] != COUNT - 1:
                    stored.append(int((await subscription.receive()).payload))
            # Nothing is stored after the last publish's first copy.
            with trio.move_on_after(0.5):
                extra = await subscription.receive()
                raise AssertionError(f"stored after the last publish: {extra.payload!r}")

    first_copies = list(dict.fromkeys(stored))
    assert first_copies == list(range(COUNT))  # none lost, in order
    repeated = [n for n, copies in Counter(stored).items() if copies > 1]
    assert all(n >= confirmed_at_kill for n in repeated), repeated
    assert len(stored) - COUNT <= COUNT - confirmed_at_kill
