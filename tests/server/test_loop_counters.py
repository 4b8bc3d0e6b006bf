"""``loop_counters``: the broker counts its event loop's task steps and the
waits for I/O that could sleep, for ``/stat.json`` and the metrics (issue 22:
wake-ups per message); off by default."""

from __future__ import annotations

from broker.metrics import stat_document

from .helpers import assert_round_trip, running_broker


async def test_loop_counters_count_task_steps_and_io_waits_when_asked() -> None:
    async with running_broker(loop_counters=True) as broker:
        loop = broker.loop
        assert loop is not None
        before = (loop.task_steps, loop.io_waits)
        await assert_round_trip(broker)
        after = (loop.task_steps, loop.io_waits)
        assert after[0] > before[0] and after[1] > before[1]
        document = stat_document(broker)["broker"]["loop"]
        assert document["task_steps"] >= after[0] and document["io_waits"] >= after[1]


async def test_loop_counters_are_off_by_default() -> None:
    async with running_broker() as broker:
        assert broker.loop is None
        assert stat_document(broker)["broker"]["loop"] is None
