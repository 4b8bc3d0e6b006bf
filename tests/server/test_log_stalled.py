"""A reliable subscriber that stops reading does not hold back a fast one on
the same topic, and the broker's memory stays flat: its lag waits in the
topic log, on disk (issue 21).

Over real TCP, against a broker process (so that its own anonymous memory
can be read from ``/proc``): a raw client subscribes, makes sure the broker
processed it (a Ping's Pong), and never reads again, though it keeps its
lease with a Ping now and then (a subscriber alive and stuck, not gone:
the broker must not get rid of it to make progress). At the end it is
still connected: it reads what waited for it up to a last Pong. A publisher then
sends far more than every buffer budget of the broker adds up to, and a
fast subscriber on the same topic must get all of it, every offset once;
meanwhile the broker's anonymous memory (``RssAnon`` and ``RssShmem``,
where the active term's buffer is) grows by less than 64 MiB.
Nothing waits for time to pass (a busy machine makes it slower, not wrong);
the deadline is a hang guard: a broker that held the topic at the stalled
subscriber's pace would never let the publisher finish.

(``test_topic_log`` checks the same in-process, at a small volume.)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.client._common import parse_url
from broker.protocol import DEFAULT_MAX_FRAME, BindTopic, Ping, Pong, Subscribe

from .helpers import RawClient
from .test_log_restart import broker_process

#: Hang guard of the whole exchange (seconds).
DEADLINE = 300.0
PAYLOAD = 1000
#: 100 MB published: more than the broker's global buffer budget (256 MiB
#: is not reached, but every per-connection and per-channel bound is, many
#: times over), so a stalled subscriber holding it in memory would show.
COUNT = 100_000
#: The issue's bound on the broker's anonymous memory growth.
RSS_GROWTH_LIMIT = 64 << 20

pytestmark = pytest.mark.slow


def rss_anon(pid: int) -> int:
    """Process ``pid``'s anonymous resident memory, private and shared (bytes;
    0 once it is gone): ``RssAnon`` plus ``RssShmem``, where an active
    term's buffer (an anonymous shared map) is counted."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


async def stalled_subscriber(url: str) -> RawClient:
    """A raw connection subscribed reliably to topic "t" (the broker has
    processed it) that reads nothing more."""
    host, port = parse_url(url)
    with trio.fail_after(DEADLINE):
        stream = await trio.open_tcp_stream(host, port)
    raw = RawClient(stream, max_frame=DEFAULT_MAX_FRAME)
    await raw.handshake("stalled")
    await raw.send(BindTopic("t"), Subscribe(0, "reliable", {}), Ping(1))
    await raw.wait_for_message(Pong)
    return raw


async def keep_alive(raw: RawClient) -> None:
    """Ping the broker now and then, never reading (the lease counts frames received)."""
    nonce = 100
    while True:
        await trio.sleep(1.0)
        nonce += 1
        await raw.send(Ping(nonce))


async def still_connected(raw: RawClient) -> None:
    """Read what waited for ``raw`` up to the Pong of a last Ping: the broker
    kept the stalled connection (no Goodbye, no EOF)."""
    await raw.send(Ping(7))
    with trio.fail_after(DEADLINE):
        await raw.wait_for(lambda message: isinstance(message, Pong) and message.nonce == 7)
    assert not raw.goodbyes() and not raw.eof, raw.summary()


async def test_a_stalled_subscriber_holds_back_neither_a_fast_one_nor_broker_memory(
    tmp_path: Path,
) -> None:
    payload = b"p" * PAYLOAD
    offsets: list[int] = []
    with broker_process(tmp_path / "data", tmp_path / "broker.log") as (process, url):
        stalled = await stalled_subscriber(url)
        try:
            baseline = rss_anon(process.pid)
            peak = [baseline]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.1):
                    peak[0] = max(peak[0], rss_anon(process.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                with trio.fail_after(DEADLINE):
                    async with (
                        open_client(url, name="fast") as client,
                        client.subscribe("t") as sub,
                        open_client(url, name="pub") as publisher,
                        trio.open_nursery() as nursery,
                    ):
                        nursery.start_soon(keep_alive, stalled)

                        async def publish() -> None:
                            for _ in range(COUNT):
                                await publisher.publish("t", payload)
                            await publisher.flush()

                        nursery.start_soon(publish)
                        while len(offsets) < COUNT:
                            offsets.extend(m.seq for m in await sub.receive_batch())
                        nursery.cancel_scope.cancel()
            finally:
                stop.set()
                sampler.join()
            assert process.poll() is None, "the broker died"
            await still_connected(stalled)
        finally:
            await stalled.aclose()
    assert offsets == list(range(1, COUNT + 1))
    growth = peak[0] - baseline
    assert growth < RSS_GROWTH_LIMIT, f"broker RssAnon+RssShmem grew {growth / 2**20:.1f} MiB"
    print(f"broker RssAnon+RssShmem {baseline / 2**20:.1f} MiB, grew {growth / 2**20:.1f} MiB")
