"""Exactly once across faults of cluster mode: a Spark streaming query writes
numbered rows through the sink (``broker.delivery = "exactly-once"``) to a
front end over three ``nats-server``s while the stream's leader is killed
(``kill -9``) and started again, then the front end is killed and started
again on its data directory; every row is then read back. The script
``tests/measure/spark_cluster_faults.py`` does it with 100,000 rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..measure.spark_cluster_faults import Result, Settings, run
from ..nats.raw import require_nats_server

ROWS = 5_000


def check(result: Result) -> None:
    """Both faults happened, the job finished, and every row is stored once."""
    assert result.errors == [], result
    # The leader was killed (another server led the stream), and so was the
    # front end (another process answered on its port, on its data directory).
    assert result.leader_kill.before and result.leader_kill.after, result
    assert result.leader_kill.after != result.leader_kill.before, result
    assert result.front_end_kill.before and result.front_end_kill.after, result
    assert result.front_end_kill.after != result.front_end_kill.before, result
    assert (result.read, result.lost, result.duplicated, result.foreign) == (ROWS, 0, 0, 0), result


@pytest.mark.slow
def test_a_stream_leader_kill_and_a_front_end_kill_between_commits(
    spark: Any, tmp_path: Path
) -> None:
    """The leader is killed while a commit routes; the front end while the
    tasks stage a micro-batch's rows (its staged rows and sessions are on
    its disk): the tasks resume their sessions and the job goes on, its
    query never restarted."""
    require_nats_server()
    settings = Settings(rows=ROWS, batches=10, seed=1, front_end_kill_during="staging")
    result = run(settings, tmp_path, spark)
    if result.commits_completed_at_start:  # (the trigger raced a commit after all)
        pytest.xfail(f"the front end was killed during a commit, not while staging: {result}")
    check(result)


@pytest.mark.slow
# Not strict: rows are lost only when the kill finds two or more of the
# commit's runs (64 rows each) handed on and not yet stored by the stream:
# most times, not every time (the script at 100,000 rows lost 0 to 3,712
# rows in 6 runs; at 5,000 rows, 64 in 3 runs of 4). To be a plain test
# once the front end's recovery is fixed.
@pytest.mark.xfail(
    strict=False,
    reason=(
        "a front end killed while it routes a commit into a stream loses the commit's "
        "runs it had appended but the stream had not stored, but the last: its state "
        "journal keeps the place of the last run only, and on restart "
        "UnfinishedCommit.routed_before counts every run before it as stored"
    ),
)
def test_a_stream_leader_kill_and_a_front_end_kill_during_a_commit(
    spark: Any, tmp_path: Path
) -> None:
    """The leader and the front end are both killed while a commit routes
    (the driver's commit is sent again after the restart and answered
    "duplicate"; the restarted front end completes the commit)."""
    require_nats_server()
    settings = Settings(rows=ROWS, batches=10, seed=1, front_end_kill_during="commit")
    check(run(settings, tmp_path, spark))
