"""One seeded fault schedule of each kind against a front end (two for the
failover) over three real ``nats-server``s (``faults.py``): nothing
confirmed lost, nothing stored twice, every record in order, the
publisher's session resumed each time (never started afresh), and each
hop's debt within its watermark plus one run (``hop_debt.py``; the
publisher flushes every 5,000 records, so that a stall takes its channel
to the watermark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .faults import FAULTS, run_schedule
from .raw import require_nats_server

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_fault_schedule_loses_nothing_confirmed(fault: str, tmp_path: Path) -> None:
    require_nats_server()
    seed = FAULTS.index(fault) + 1
    outcome = await run_schedule(seed, fault, tmp_path, min_records=20_000, batch=5_000)
    print(outcome)
    assert outcome.confirmed > 0 and outcome.read >= outcome.confirmed
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order) == (0, 0, 0)
    assert outcome.sessions_lost == 0
    # Bounded memory: an election holds runs back, not records in memory.
    assert outcome.rss_anon_growth_mib < 64
    # Each hop's debt within its watermark plus one run (the publisher's
    # channel and connection, a link, the runs and records on their way to
    # the stream), sampled from the front ends' /stat.json.
    assert outcome.exceeded == [], outcome.hops
    for hop in ("client channel", "client connection", "jetstream runs", "jetstream records"):
        assert outcome.hops[hop].samples > 0, hop
