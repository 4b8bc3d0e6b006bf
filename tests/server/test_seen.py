"""The owner's table of forwarded origins: a publish sent again under the
same origin (session, handle, index) is never passed on twice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.server.cluster._origin_dedup import SeenOrigins
from broker.server.storage._publish_marks import Held


def tails(first: int, count: int) -> list[bytes]:
    return [b"%d" % n for n in range(first, first + count)]


def test_a_resend_passes_on_only_what_was_not_taken() -> None:
    seen = SeenOrigins()
    assert seen.take("t", [(b"s", 1, 1, 5)], tails(1, 5), [None] * 5) is None
    taken = seen.take("t", [(b"s", 1, 3, 6)], tails(3, 6), [b"k"] * 6)
    assert taken == (tails(6, 3), [b"k"] * 3, 3, [(b"s", 1, 6, 3)])
    assert seen.duplicates == 3
    # Wholly taken before: nothing passed on, all of it skipped.
    assert seen.take("t", [(b"s", 1, 1, 8)], tails(1, 8), [None] * 8) == ([], [], 8, [])


def test_runs_of_several_origins_in_one_batch_are_each_checked() -> None:
    seen = SeenOrigins()
    seen.take("t", [(b"a", 1, 1, 2), (b"b", 1, 1, 2)], tails(1, 4), [None] * 4)
    runs = [(b"a", 1, 2, 2), (b"", 0, 1, 2), (b"b", 1, 3, 1), (b"b", 2, 1, 1)]
    taken = seen.take("t", runs, [b"a2", b"a3", b"x", b"y", b"b3", b"c1"], [None] * 6)
    # a2 was taken; the runs without a session are never left out.
    assert taken == (
        [b"a3", b"x", b"y", b"b3", b"c1"],
        [None] * 5,
        1,
        [(b"a", 1, 3, 1), (b"", 0, 1, 2), (b"b", 1, 3, 1), (b"b", 2, 1, 1)],
    )


def test_topics_and_handles_are_apart() -> None:
    seen = SeenOrigins()
    seen.take("t", [(b"s", 1, 1, 3)], tails(1, 3), [None] * 3)
    assert seen.take("u", [(b"s", 1, 1, 3)], tails(1, 3), [None] * 3) is None
    assert seen.take("t", [(b"s", 2, 1, 3)], tails(1, 3), [None] * 3) is None
    assert seen.take("t", [(b"r", 1, 1, 3)], tails(1, 3), [None] * 3) is None


def test_it_forgets_the_least_recently_used_first() -> None:
    seen = SeenOrigins(limit=2)
    seen.take("t", [(b"a", 0, 1, 1)], [b"x"], [None])
    seen.take("t", [(b"b", 0, 1, 1)], [b"x"], [None])
    seen.take("t", [(b"a", 0, 2, 1)], [b"x"], [None])  # a used again: b is the oldest
    seen.take("t", [(b"c", 0, 1, 1)], [b"x"], [None])
    assert len(seen) == 2
    assert seen.take("t", [(b"a", 0, 2, 1)], [b"x"], [None]) == ([], [], 1, [])
    assert seen.take("t", [(b"b", 0, 1, 1)], [b"x"], [None]) is None  # forgotten


def test_forgotten_origins_are_told_and_a_later_publish_of_one_is_counted() -> None:
    forgotten: list[tuple[bytes, int]] = []
    seen = SeenOrigins(limit=1, forgotten=lambda s, h: forgotten.append((s, h)))
    seen.take("t", [(b"a", 1, 1, 2)], [b"x", b"y"], [None] * 2)
    seen.take("t", [(b"b", 1, 1, 1)], [b"x"], [None])
    assert forgotten == [(b"a", 1)]
    assert seen.unknown == 0
    # a's third publish: the owner no longer knows what a sent before.
    assert seen.take("t", [(b"a", 1, 3, 2)], [b"x", b"y"], [None] * 2) is None
    assert seen.unknown == 2


def test_restored_origins_take_nothing_twice() -> None:
    asked: list[tuple[bytes, int]] = []

    def restored(session: bytes, handle: int) -> Held | None:
        asked.append((session, handle))
        return Held("t", 4)

    seen = SeenOrigins(restored=restored)
    seen.restore("t", b"s", 1)  # (a mark: what the log held is asked when used)
    assert asked == []
    taken = seen.take("t", [(b"s", 1, 3, 4)], tails(3, 4), [None] * 4)
    assert taken == (tails(5, 2), [None] * 2, 2, [(b"s", 1, 5, 2)])
    assert seen.unknown == 0
    assert asked == [(b"s", 1)]


@given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20)), max_size=20))
def test_resends_from_anywhere_taken_store_each_publish_once_in_order(
    total: int, resends: list[tuple[int, int]]
) -> None:
    """A client's publishes 1..total go through in batches; after each, a
    forwarder may die and the client send again from any index it has not
    seen confirmed (at most the next one not taken): each is stored once."""
    seen = SeenOrigins()
    stored: list[bytes] = []
    sent = 0
    for back, size in resends:
        first = max(1, sent + 1 - back)
        last = min(total, first + size - 1)
        if first > last:
            continue
        taken = seen.take(
            "t",
            [(b"s", 0, first, last - first + 1)],
            tails(first, last - first + 1),
            [None] * (last - first + 1),
        )
        stored += tails(first, last - first + 1) if taken is None else taken[0]
        sent = max(sent, last)
    assert stored == tails(1, sent)
