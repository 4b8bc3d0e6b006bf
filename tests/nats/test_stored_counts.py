"""Front ends ask each other over NATS how many of a session's publishes
their streams hold (``cluster/_stored_counts.py``): an owner answers for
the topics it owns; an owner that is gone, or does not know a topic yet,
leaves the asker without an answer by its deadline (the resume is then
refused for now, never answered with a count too low)."""

from __future__ import annotations

import pytest
import trio

from broker.nats import open_nats
from broker.server.cluster._stored_counts import (
    Answer,
    StoredCounts,
    StoredCountsUnavailable,
)

SESSION = bytes.fromhex("a1b2")


def _owner_of(topics: set[str]) -> Answer:
    """An answer that knows ``topics``: handle h holds 10 * h publishes."""

    async def answer(session: bytes, pairs: list[tuple[int, str]]) -> dict[int, int]:
        await trio.lowlevel.checkpoint()
        assert session == SESSION
        return {handle: 10 * handle for handle, topic in pairs if topic in topics}

    return answer


async def test_an_owner_answers_for_the_topics_it_owns(nats_url: str) -> None:
    async with (
        open_nats(nats_url, name="owner") as owner_client,
        open_nats(nats_url, name="asker") as asker_client,
        trio.open_nursery() as nursery,
    ):
        owner = StoredCounts(owner_client, "owner1")
        answer = _owner_of({"orders", "bills"})
        await nursery.start(owner.serve, lambda: answer)
        asker = StoredCounts(asker_client, "asker1")
        deadline = trio.current_time() + 10
        counts = await asker.ask({"owner1": [(1, "orders"), (3, "bills")]}, SESSION, deadline)
        assert counts == {1: 10, 3: 30}
        assert owner.answered == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("case", ["gone", "not open yet", "no broker"])
async def test_no_answer_for_a_handle_is_unavailable(nats_url: str, case: str) -> None:
    async with (
        open_nats(nats_url, name="owner") as owner_client,
        open_nats(nats_url, name="asker") as asker_client,
        trio.open_nursery() as nursery,
    ):
        if case != "gone":
            owner = StoredCounts(owner_client, "owner2")
            answer = None if case == "no broker" else _owner_of({"orders"})
            await nursery.start(owner.serve, lambda: answer)
        silent: list[str] = []
        asker = StoredCounts(asker_client, "asker2", silent.append)
        deadline = trio.current_time() + 0.5
        with pytest.raises(StoredCountsUnavailable):
            await asker.ask({"owner2": [(1, "orders"), (2, "moving")]}, SESSION, deadline)
        assert asker.asked >= 1
        # (Nobody listening for a front end that is gone: it is suspected.)
        assert bool(silent) == (case == "gone")
        assert set(silent) <= {"owner2"}
        nursery.cancel_scope.cancel()
