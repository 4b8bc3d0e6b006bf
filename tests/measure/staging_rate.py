"""Staged publishing through a cluster front end: rows per second and the
process's CPU per row.

Three local ``nats-server``s (R3, ``sync_interval: always``) and a front
end in this process; one client stages ``--rows`` 100-byte rows on one
channel, waits for their Confirms, then commits them. The broker and the
client share the process, so the CPU is both's. Run it from two source
trees in turn to compare builds::

    PYTHONPATH=. python tests/measure/staging_rate.py --rows 20000
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import trio

from broker.client import open_client
from broker.nats._servers import open_nats_servers_async
from broker.protocol import Stage
from tests.server.helpers import make_config, running_broker, url


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(rows: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as work:
        nats = Path(work) / "nats"
        async with open_nats_servers_async(nats, 3, system_account=True, app_jsz_import=True) as s:
            config = make_config(
                data_dir=str(Path(work) / "front-end"),
                cluster=",".join(s.urls),
                cluster_replicas=3,
            )
            async with running_broker(config) as broker, open_client(url(broker)) as client:
                stage, payload = Stage("rate", "0/0"), b"x" * 100
                await client.publish("warm", payload)
                started, cpu = time.perf_counter(), _cpu()
                for _ in range(rows):
                    await client.publish("staged", payload, stage=stage)
                await client.finish_stage(stage)
                staged, staged_cpu = time.perf_counter(), _cpu()
                outcome = await client.commit("rate", [("0/0", rows)])
                committed = time.perf_counter()
                counters = broker.staging_counters
    return {
        "rows": rows,
        "staged_rows_per_s": round(rows / (staged - started)),
        "cpu_us_per_row": round((staged_cpu - cpu) / rows * 1e6, 1),
        "commit_s": round(committed - staged, 2),
        "runs_stored": counters.runs_stored if counters else -1,
        "committed": outcome.messages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args.rows)))


if __name__ == "__main__":
    main()
