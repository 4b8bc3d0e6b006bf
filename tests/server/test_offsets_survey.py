"""``ListOffsets`` of logs not opened since the start: their files are read
in a thread without opening them, so that one client asking for the offsets
of many large logs holds up no other client (it used to open every log on
the event loop: about 0.2 s per 14 MB term, 40 s for 500 such logs)."""

from __future__ import annotations

import errno
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.log import LogStore
from broker.protocol import GoodbyeCode, ListOffsets, Offsets
from broker.server import Broker
from broker.server.connection._dispatch import MAX_SURVEYS

from .helpers import TIMEOUT, RawClient, running_broker, url, wait_until
from .test_topic_log import log_config, publish


async def test_offsets_of_logs_not_opened_since_the_start_leave_them_unopened(
    tmp_path: Path,
) -> None:
    async with restarted(tmp_path, a=10, b=5) as broker:
        logs = broker.logs
        assert logs is not None
        async with open_client(url(broker), name="reader") as client:
            assert await client.offsets() == {"a": (1, 11), "b": (1, 6)}
            assert await client.offsets(["b", "missing"]) == {"b": (1, 6)}
            assert logs.opened("a") is None and logs.opened("b") is None
            await client.publish("a", b"more")
            await client.flush()
            assert logs.opened("a") is not None
            assert await client.offsets() == {"a": (1, 12), "b": (1, 6)}


@asynccontextmanager
async def restarted(tmp_path: Path, **records: int) -> AsyncIterator[Broker]:
    """A broker started again on a data directory where each topic named
    got that many records (none of their logs opened since the start)."""
    async with running_broker(log_config(tmp_path)) as broker:
        for topic, count in records.items():
            await publish(url(broker), topic, [b"x"] * count)
    async with running_broker(log_config(tmp_path)) as broker:
        yield broker


@contextmanager
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Reading a log's files (``LogStore.survey``) blocks until the second
    event is set; the first is set when a read has started."""
    started, release = threading.Event(), threading.Event()
    real = LogStore.survey

    def survey(self: LogStore, name: str) -> tuple[int, int]:
        started.set()
        release.wait(TIMEOUT)
        return real(self, name)

    with monkeypatch.context() as patched:
        patched.setattr(LogStore, "survey", survey)
        try:
            yield started, release
        finally:
            release.set()


async def test_offsets_waiting_for_the_disk_hold_up_no_other_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with restarted(tmp_path, old=3) as broker:
        answers: list[dict[str, tuple[int, int]]] = []

        async def ask() -> None:
            async with open_client(url(broker), name="reader") as client:
                answers.append(await client.offsets())

        with slow_disk(monkeypatch) as (started, release):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await wait_until(started.is_set, what="the log being read")
                # Its files are being read: other clients go on meanwhile.
                async with (
                    open_client(url(broker), name="other") as client,
                    client.subscribe("new") as subscription,
                ):
                    await client.publish("new", b"served")
                    await client.flush()
                    with trio.fail_after(TIMEOUT):
                        assert (await subscription.receive()).payload == b"served"
                assert answers == []
                release.set()
        assert answers == [{"old": (1, 4)}]  # (as it was when asked)


async def test_too_many_offsets_waiting_for_the_disk_end_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with restarted(tmp_path, old=1) as broker:
        with slow_disk(monkeypatch) as (started, release):
            raw = await RawClient.connect(broker)
            await raw.handshake()
            await raw.send(*[ListOffsets(n, None) for n in range(MAX_SURVEYS)])
            await wait_until(started.is_set, what="the log being read")
            await raw.send(ListOffsets(MAX_SURVEYS, None))
            frames = await raw.read_until_eof()
            release.set()
        (goodbye,) = raw.goodbyes()
        assert goodbye.code == GoodbyeCode.LIMIT_EXCEEDED
        assert f"more than {MAX_SURVEYS} requests wait for the disk" in goodbye.reason
        assert not any(isinstance(frame, Offsets) for frame in frames)
        await raw.aclose()
        async with open_client(url(broker)) as client:  # the broker goes on
            assert await client.offsets() == {"old": (1, 2)}


async def test_a_log_whose_files_cannot_be_read_ends_the_asker_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with restarted(tmp_path, old=1) as broker:

        def unreadable(self: LogStore, name: str) -> tuple[int, int]:
            raise OSError(errno.EIO, "Input/output error", str(tmp_path / "topics" / name))

        with monkeypatch.context() as patched:
            patched.setattr(LogStore, "survey", unreadable)
            async with open_client(url(broker)) as client:
                with pytest.raises(ConnectionLost) as lost:
                    await client.offsets()
        assert lost.value.code == GoodbyeCode.LIMIT_EXCEEDED
        assert "cannot read the log of topic 'old' now: [Errno 5]" in str(lost.value)
        assert str(tmp_path) not in str(lost.value)
        async with open_client(url(broker)) as client:
            assert await client.offsets() == {"old": (1, 2)}
