"""A commit cut off while it routed is completed when the broker starts
again: each topic's log is asked how much of the batch's share it holds
(the commit put where each run of its publishes went before appending it),
only the rest is routed, and a retried commit answers "duplicate".

The state a kill -9 leaves is made here directly (a state journal and topic
logs in a data directory, as a broker killed mid-commit wrote them), then a
real broker starts on it."""

from __future__ import annotations

from pathlib import Path

import trio

from accounts import unlimited
from broker.client import Client, open_client
from broker.log import LogStore
from broker.protocol import OutcomeStatus, Stage
from broker.protocol.frames import encode_deliver_tail
from broker.server.staging._area import StagingArea

from .helpers import TIMEOUT, running_broker, url

#: The batch's publishes, in commit order: runs to t0 and t1.
LAYOUT = ["t0"] * 150 + ["t1"] * 80 + ["t0"] * 70


def message(index: int) -> bytes:
    return b"job|%d" % index


def kill_mid_commit(data_dir: Path, run_start: int, run_appended: int) -> None:
    """Stage the batch, commit it and route part of it as a broker does,
    then stop as a kill -9 would (what was written stays): of t0's share,
    the first ``run_start`` are in its log, the run put last is 64 from
    there, of which ``run_appended`` are appended; t1's share is not begun.
    Another publisher's record is before them in t0's log, and one after
    them if the run is whole (a run cut off is the log's end: records of
    others wait behind a run, whatever stops it)."""
    store = LogStore(data_dir)
    journal = store.journal
    root = unlimited("root")
    staging = StagingArea(root, limit=1 << 30, ttl=600.0, remember=10, journal=journal)
    for index, topic in enumerate(LAYOUT):
        tail = encode_deliver_tail(message(index), None, None)
        assert staging.stage(None, Stage("job", "m"), topic, tail, None, 100, 0.0) is None
    decision = staging.commit(None, "job", [("m", len(LAYOUT))])
    assert decision.status is OutcomeStatus.COMMITTED
    journal.write()  # (the broker writes the commit record before routing)
    t0 = [p.loan.item for p in decision.publishes if p.topic == "t0"]
    log = store.topic("t0")
    log.append_many([encode_deliver_tail(b"before", None, None)], 0)
    if run_start:
        before_append = staging.progress((None, "job"), "t0", 0, run_start)
        assert before_append is not None
        before_append(log.next_offset)
        log.append_many(t0[:run_start], 0)
    before_append = staging.progress((None, "job"), "t0", run_start, 64)
    assert before_append is not None
    before_append(log.next_offset)
    if run_appended:
        log.append_many(t0[run_start : run_start + run_appended], 0)
    if run_appended == 64:
        log.append_many([encode_deliver_tail(b"after", None, None)], 0)
    log.write()
    for publish in decision.publishes:
        publish.loan.repay()
    staging.clear()
    store.close()


async def read_all(client: Client, topic: str) -> list[bytes]:
    first, end = (await client.offsets([topic]))[topic]
    got: list[bytes] = []
    async with client.subscribe(topic, start="earliest") as subscription:
        with trio.fail_after(TIMEOUT):
            while len(got) < end - first:
                got.append((await subscription.receive()).payload)
    return got


async def completed(data_dir: Path) -> tuple[list[bytes], list[bytes], int, str]:
    async with running_broker(data_dir=str(data_dir)) as broker:
        async with open_client(url(broker)) as client:
            t0, t1 = await read_all(client, "t0"), await read_all(client, "t1")
            outcome = await client.commit("job", [("m", len(LAYOUT))])
        staging = broker.staging
        assert staging.unfinished == {} and (None, "job") in staging.finished
    return t0, t1, outcome.status, outcome.reason


def expected_t0(appended: int, after: bool = False) -> list[bytes]:
    t0 = [message(i) for i, topic in enumerate(LAYOUT) if topic == "t0"]
    return [b"before", *t0[:appended], *([b"after"] if after else []), *t0[appended:]]


async def test_a_commit_cut_off_in_a_run_is_completed_once(tmp_path: Path) -> None:
    # 100 of t0's 220 in its log: the last run put (64 from the 64th) in part.
    kill_mid_commit(tmp_path, 64, 36)
    t0, t1, status, _ = await completed(tmp_path)
    assert t0 == expected_t0(100)
    assert t1 == [message(i) for i, topic in enumerate(LAYOUT) if topic == "t1"]
    assert status == OutcomeStatus.DUPLICATE
    # Started again: nothing more is routed.
    t0_again, t1_again, status, _ = await completed(tmp_path)
    assert (t0_again, t1_again, status) == (t0, t1, OutcomeStatus.DUPLICATE)


async def test_a_run_put_but_not_appended_is_routed_at_the_start(tmp_path: Path) -> None:
    kill_mid_commit(tmp_path, 64, 0)  # the second run put, none of it appended
    t0, t1, status, _ = await completed(tmp_path)
    assert t0 == expected_t0(64)
    assert len(t1) == 80 and status == OutcomeStatus.DUPLICATE


async def test_a_commit_cut_off_before_its_first_append_is_routed_whole(tmp_path: Path) -> None:
    kill_mid_commit(tmp_path, 0, 0)
    t0, t1, status, _ = await completed(tmp_path)
    assert t0 == expected_t0(0)
    assert len(t1) == 80 and status == OutcomeStatus.DUPLICATE


async def test_a_commit_whose_run_was_appended_whole_routes_only_the_rest(
    tmp_path: Path,
) -> None:
    kill_mid_commit(tmp_path, 64, 64)
    t0, t1, status, _ = await completed(tmp_path)
    assert t0 == expected_t0(128, after=True)
    assert len(t1) == 80 and status == OutcomeStatus.DUPLICATE
