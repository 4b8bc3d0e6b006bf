"""Exactly once across faults of cluster mode: a Spark streaming query writes
numbered rows through the sink (``broker.delivery = "exactly-once"``) to a
front end over three ``nats-server``s while the stream's leader is killed
(``kill -9``) and started again, then the front end is killed and started
again on its data directory (or a new one); every row is then read back. The script
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
def test_a_stream_leader_kill_and_a_front_end_kill_during_a_commit(
    spark: Any, tmp_path: Path
) -> None:
    """The leader and the front end are both killed while a commit routes
    (several of its runs handed to the stream and not yet stored): the
    driver's commit is sent again after the restart and answered
    "duplicate"; the restarted front end completes the commit from what
    the stream's runs say they hold of it (their origins)."""
    require_nats_server()
    settings = Settings(rows=ROWS, batches=10, seed=1, front_end_kill_during="commit")
    result = run(settings, tmp_path, spark)
    check(result)
    assert result.commits_completed_at_start == 1, result


@pytest.mark.slow
@pytest.mark.parametrize("during", ["commit", "staging"])
def test_a_front_end_replaced_on_a_new_disk(spark: Any, tmp_path: Path, during: str) -> None:
    """As above, but the front end is started again on a new, empty data
    directory, while a commit routes or while the tasks stage: the
    batch's staged rows are in the cluster's staging stream, so the
    driver's commit (sent again after the restart, or sent then) reads
    them from there and routes only what the topic's stream does not hold
    of the batch (the registry in the cluster says whether it was being
    committed; the stream's runs name it): the query is never started
    again."""
    require_nats_server()
    settings = Settings(rows=ROWS, batches=10, seed=1, front_end_kill_during=during)
    settings.new_disk = True
    result = run(settings, tmp_path, spark)
    check(result)
    assert result.commits_completed_at_start == 0, result  # (nothing on the new disk)
    assert result.query_runs == 1, result
