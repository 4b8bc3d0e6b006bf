"""No duplicate after a crash (issue 46): a publish appended to a topic's log
whose session count was not yet written when the broker died is known by
its mark, so a resumed session is told the broker has it (``received``)
and its client does not send it again.

The crash window is made exactly, with real files: a session publishes,
the broker stops, and the session's count in the state journal is set
back to what it would have been had the broker died between appending
the records and writing the count (the marks, written before the log,
stay). The restarted broker must still say it has every publish."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.log import JOURNAL_NAME, StateJournal
from broker.protocol import BindTopic, Channel, ChannelKind, Confirm, Publish, Stage, Welcome
from broker.protocol.frames import encode
from broker.server.sessions._records import COUNTS
from broker.server.storage._publish_marks import MARKS, Held, PublishMarks

from .helpers import TIMEOUT, RawClient, running_broker

COUNT = 40


async def publish_and_leave(data_dir: Path, stage: Stage | None = None) -> bytes:
    """A raw client publishes COUNT messages on topic handle 0 of topic "t"
    (staged in ``stage``, if given), sees them confirmed and breaks its
    connection (its session detaches); the broker then stops. Returns the
    session id."""
    async with running_broker(data_dir=str(data_dir), lease=60.0) as broker:
        client = await RawClient.connect(broker)
        welcome = await client.handshake("pub")
        await client.send(BindTopic("t", stage))
        await client.wait_for_guarantee(Channel(ChannelKind.PUBLISH, 0))
        await client.send(b"".join(encode(Publish(0, b"%d" % n)) for n in range(COUNT)))
        with trio.fail_after(TIMEOUT):
            await client.wait_for(
                lambda m: isinstance(m, Confirm) and m.topic == 0 and m.count == COUNT,
                what="the Confirm of every publish",
            )
        await client.aclose()
    return welcome.session


def set_count_back(data_dir: Path, session: bytes, count: int, *, marked: bool = True) -> None:
    """Make the journal say what a crash before the Confirm would have left:
    the session's count of handle 0 is ``count``."""
    with StateJournal(data_dir / JOURNAL_NAME) as journal:
        key = f"{session.hex()}/p/0"
        assert journal.get(COUNTS, key) == COUNT
        assert (journal.get(MARKS, f"{session.hex()}/0") is not None) == marked
        journal.put(COUNTS, key, count)
        journal.write()


async def resumed_received(data_dir: Path, session: bytes) -> dict[int, int]:
    async with running_broker(data_dir=str(data_dir), lease=60.0) as broker:
        client = await RawClient.connect(broker)
        await client.hello("pub", session=session)
        welcome = await client.wait_for_message(Welcome)
        await client.aclose()
    assert welcome.resumed
    return welcome.received


async def test_a_resumed_session_is_told_of_publishes_the_log_took_before_a_crash(
    tmp_path: Path,
) -> None:
    session = await publish_and_leave(tmp_path)
    set_count_back(tmp_path, session, 7)
    # Without the marks the broker would say 7, and the client would send
    # publishes 8 to 40 again: stored twice.
    assert await resumed_received(tmp_path, session) == {0: COUNT}


async def test_a_resumed_session_is_told_of_publishes_staged_before_a_crash(
    tmp_path: Path,
) -> None:
    session = await publish_and_leave(tmp_path, Stage("batch-1", "member-1"))
    set_count_back(tmp_path, session, 3, marked=False)
    # Staged twice, the member would hold 77 publishes: its commit of 40 refused.
    assert await resumed_received(tmp_path, session) == {0: COUNT}


def test_marks_say_what_the_log_holds_of_each_run(tmp_path: Path) -> None:
    with StateJournal(tmp_path / "journal") as journal:
        marks = PublishMarks(journal)
        # Session a: publishes 4 to 9 go to offsets 3 to 8: all in the log.
        marks.note("t", [(b"a", 1, 4, 6)], 3)
        # Session b: 20 publishes from offset 9: only two reached the log.
        marks.note("t", [(b"\x00", 1, 1, 1), (b"b", 2, 11, 20)], 8)
        # Session c: a run from offset 30: the log ends before it.
        marks.note("t", [(b"c", 1, 5, 2)], 30)
        # A run of no session has no mark; one of another topic waits.
        marks.note("t", [(b"", 1, 1, 5)], 1)
        marks.note("u", [(b"d", 1, 1, 5)], 1)
        journal.put(MARKS, "zz/1", ["t", 1, 1, 1])  # malformed: dropped
        journal.write()
    with StateJournal(tmp_path / "journal") as journal:
        marks = PublishMarks(journal)  # (as after a restart)
        assert sorted(marks.load()) == [
            ("t", b"\x00", 1),
            ("t", b"a", 1),
            ("t", b"b", 2),
            ("t", b"c", 1),
            ("u", b"d", 1),
        ]
        assert len(marks) == 5
        assert marks.pending(b"a", 1) and marks.held(b"a", 1) is None  # log not opened yet
        marks.opened("t", 11)  # the log of t holds offsets 1 to 10
        assert marks.held(b"a", 1) == Held("t", 9)
        assert marks.held(b"a", 1) is None  # taken once
        assert marks.held(b"\x00", 1) == Held("t", 1)
        assert marks.held(b"b", 2) == Held("t", 12)
        assert not marks.pending(b"c", 1)
        assert {key for key, _ in journal.items(MARKS)} == {"61/1", "00/1", "62/2", "64/1"}
        marks.forget(b"b")
        marks.forget_origin(b"a", 1)
        marks.forget_origin(b"d", 1)
        assert not marks.pending(b"d", 1)
        marks.opened("u", 6)
        assert marks.held(b"d", 1) is None
        assert {key for key, _ in journal.items(MARKS)} == {"00/1"}
        assert len(marks) == 1


async def test_an_owner_restarted_knows_what_it_took_of_forwarded_publishes(
    tmp_path: Path,
) -> None:
    """The marks of publishes another worker forwarded (a session not
    restored here) fill the owner's table of origins at start-up: a
    forwarder's resend after the owner's crash is not stored again."""
    session = await publish_and_leave(tmp_path)  # 40 records in t's log
    forwarder_client = bytes.fromhex("77" * 16)
    with StateJournal(tmp_path / JOURNAL_NAME) as journal:
        # Publishes 11 to 50 of a forwarded client went to offsets 1 to 40.
        journal.put(MARKS, f"{forwarder_client.hex()}/3", ["t", 11, 1, 40])
        journal.delete(MARKS, f"{session.hex()}/0")
        journal.write()
    async with running_broker(data_dir=str(tmp_path), lease=60.0) as broker:
        assert broker.logs is not None
        broker.logs.open("t")  # (as a link's bind of t does)
        tails = [b"%d" % n for n in range(45, 55)]
        taken = broker.seen.take("t", [(forwarder_client, 3, 45, 10)], tails, [None] * 10)
        assert taken is not None
        assert taken[0] == tails[6:]  # 45 to 50 were in the log: confirmed, not stored
        assert taken[2] == 6


async def test_a_resume_of_a_session_the_broker_no_longer_has_is_counted(
    tmp_path: Path,
) -> None:
    """Past the window of deduplication (the session is gone): the client
    gets a new session, and the resume is counted (its client may publish
    again what was never confirmed)."""
    async with running_broker(data_dir=str(tmp_path)) as broker:
        client = await RawClient.connect(broker)
        await client.hello("pub", session=b"\x01" * 16)
        welcome = await client.wait_for_message(Welcome)
        await client.aclose()
        assert not welcome.resumed
        assert broker.sessions.unknown_total == 1
