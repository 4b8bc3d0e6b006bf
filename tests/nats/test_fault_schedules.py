"""One seeded fault schedule of each kind against a front end (two for the
failover) over three real ``nats-server``s (``faults.py``): nothing
confirmed lost, nothing stored twice, every record in order, and the
publisher's session resumed each time (never started afresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .faults import FAULTS, run_schedule
from .raw import require_nats_server

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_fault_schedule_loses_nothing_confirmed(fault: str, tmp_path: Path) -> None:
    require_nats_server()
    outcome = await run_schedule(FAULTS.index(fault) + 1, fault, tmp_path, min_records=20_000)
    print(outcome)
    assert outcome.confirmed > 0 and outcome.read >= outcome.confirmed
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order) == (0, 0, 0)
    assert outcome.sessions_lost == 0
    # Bounded memory: an election holds runs back, not records in memory.
    assert outcome.rss_anon_growth_mib < 64
