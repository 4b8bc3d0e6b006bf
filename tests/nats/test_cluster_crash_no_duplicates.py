"""A cluster-mode front end killed with SIGKILL while a client publishes
flat out and a reliable subscriber reads behind it, then started again on
its data directory and port (``tests/measure/crash_duplicates.py`` with
``--cluster``): once the sessions resume, every confirmed publish is in the
topic's stream exactly once and in order, and the subscriber had each once.

This is the front end's process dying, its disk kept (a pod restarted on
its volume): the session records and publish marks in its state journal
let a resuming client's resends be recognised. A front end whose disk is
lost too loses its sessions (``faults.py``, front-end-kill)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.nats._servers import open_nats_servers
from tests.measure.crash_duplicates import Settings, measure, summary

from .raw import require_nats_server

pytestmark = pytest.mark.slow

KILLS = 4


def test_kill_9_of_a_front_end_loses_and_repeats_nothing(tmp_path: Path) -> None:
    require_nats_server()
    with open_nats_servers(tmp_path / "nats", 3, system_account=True, app_jsz_import=True) as nats:
        settings = Settings(
            client="async",
            kills=KILLS,
            min_delay=0.3,
            max_delay=0.8,
            quiet=True,
            cluster=",".join(nats.urls),
        )
        result = measure(settings, tmp_path)
    described = summary(1, result) + "".join(f"\n  error: {e}" for e in result.errors)
    assert not result.errors, described
    assert result.kills == KILLS, described
    assert result.published > 0 and result.confirmed == result.published, described
    assert (result.lost, result.duplicated, result.reordered) == (0, 0, 0), described
    assert (result.log_duplicates, result.log_missing) == (0, 0), described
    assert result.log_records == result.confirmed, described
    print(described)
