"""The staging area on its own: ownership, expiry, the memory of finished
batches, and that every staged loan is repaid whatever becomes of it."""

from __future__ import annotations

from accounts import unlimited
from broker.protocol import OutcomeStatus, Stage
from broker.server.staging._area import StagingArea


def area(**overrides: float) -> StagingArea:
    settings: dict[str, float] = {"limit": 10_000, "ttl": 60.0, "remember": 3}
    settings.update(overrides)
    return StagingArea(
        unlimited("root"),
        limit=int(settings["limit"]),
        ttl=settings["ttl"],
        remember=int(settings["remember"]),
    )


def stage(
    staging: StagingArea, owner: str | None, batch: str, member: str, n: int, now: float = 0.0
) -> None:
    for i in range(n):
        refusal = staging.stage(owner, Stage(batch, member), "t", b"%d" % i, None, 100, now)
        assert refusal is None


def test_batches_of_different_principals_never_mix() -> None:
    staging = area()
    stage(staging, "alice", "job", "0/0", 2)
    stage(staging, "bob", "job", "0/0", 5)
    # Bob's commit sees only Bob's staged publishes.
    decision = staging.commit("bob", "job", [("0/0", 5)])
    assert (decision.status, decision.messages) == (OutcomeStatus.COMMITTED, 5)
    assert staging.commit("bob", "job", [("0/0", 5)]).status is OutcomeStatus.DUPLICATE
    # Alice's batch of the same name is untouched, and hers to commit.
    assert staging.messages == 2
    refused = staging.commit("alice", "job", [("0/0", 5)])
    assert refused.status is OutcomeStatus.REFUSED
    alices = staging.commit("alice", "job", [("0/0", 2)])
    assert alices.messages == 2
    # (Routing a commit repays its loans; here nobody routes them.)
    for publish in decision.publishes + alices.publishes:
        publish.loan.repay()
    assert staging.account.debt == 0


def test_the_limit_counts_bytes_staged_and_frees_with_commits_and_aborts() -> None:
    staging = area(limit=500)
    stage(staging, None, "a", "m", 5)
    refusal = staging.stage(None, Stage("a", "m"), "t", b"x", None, 100, 0.0)
    assert refusal is not None and "full" in refusal
    assert staging.abort(None, "a").messages == 5
    assert staging.size == 0
    assert staging.account.debt == 0
    stage(staging, None, "b", "m", 5)
    staging.clear()


def test_batches_older_than_the_ttl_expire_and_their_loans_are_repaid() -> None:
    staging = area(ttl=60.0)
    stage(staging, None, "old", "m", 3, now=0.0)
    stage(staging, None, "new", "m", 1, now=0.0)
    stage(staging, None, "new", "n", 1, now=50.0)  # still staging: its ttl starts again
    assert staging.expire(59.0) == 0
    assert staging.expire(61.0) == 1
    assert set(staging.batches) == {(None, "new")}
    assert staging.counters.discarded["expired"] == 3
    assert staging.size == 200
    assert staging.account.debt == sum(
        p.loan.amount for b in staging.batches.values() for m in b.members.values() for p in m
    )
    # An expired batch is not remembered as finished: it may be staged afresh.
    stage(staging, None, "old", "m", 1, now=70.0)
    again = staging.commit(None, "old", [("m", 1)])
    assert again.status is OutcomeStatus.COMMITTED
    staging.clear()
    for publish in again.publishes:
        publish.loan.repay()


def test_only_the_last_batches_are_remembered() -> None:
    staging = area(remember=2)
    for name in ("a", "b", "c"):
        assert staging.commit(None, name, []).status is OutcomeStatus.COMMITTED
    assert list(staging.finished) == [(None, "b"), (None, "c")]
    assert staging.commit(None, "c", []).status is OutcomeStatus.DUPLICATE
    # "a" was forgotten: committing it again is (knowingly) a new commit.
    assert staging.commit(None, "a", []).status is OutcomeStatus.COMMITTED


def test_clear_repays_everything() -> None:
    staging = area()
    stage(staging, None, "a", "m", 4)
    stage(staging, "p", "b", "n", 2)
    staging.clear()
    assert staging.batches == {}
    assert staging.size == 0
    assert staging.account.debt == 0


def test_an_aborted_batch_may_be_staged_and_committed_afresh() -> None:
    """A streaming micro-batch that failed (aborted) runs again under the same
    batch name: its new attempt commits; once committed, it never again."""
    staging = area()
    stage(staging, None, "query-1/7", "0/0/a", 3)
    assert staging.abort(None, "query-1/7").messages == 3
    stage(staging, None, "query-1/7", "0/0/b", 2)
    decision = staging.commit(None, "query-1/7", [("0/0/b", 2)])
    assert (decision.status, decision.messages) == (OutcomeStatus.COMMITTED, 2)
    for publish in decision.publishes:
        publish.loan.repay()
    stage(staging, None, "query-1/7", "0/0/c", 2)  # a third run: dropped, late
    assert staging.messages == 0
    assert staging.counters.discarded["late"] == 2
    assert staging.abort(None, "query-1/7").status is OutcomeStatus.REFUSED


def test_a_commit_to_a_topic_served_elsewhere_is_refused_and_changes_nothing() -> None:
    """After a change of ``--workers`` a batch's topic may be owned by another
    worker: its commit is refused (never forwarded: a forwarded commit cut
    off by a kill could not be completed exactly), and the batch stays."""
    staging = area()
    stage(staging, None, "job", "0/0", 2)

    def elsewhere(topic: str) -> str | None:
        return f"topic {topic!r} is owned by worker w1" if topic == "t" else None

    refused = staging.commit(None, "job", [("0/0", 2)], elsewhere)
    assert (refused.status, refused.reason) == (
        OutcomeStatus.REFUSED,
        "topic 't' is owned by worker w1",
    )
    assert staging.messages == 2 and not staging.finished
    decision = staging.commit(None, "job", [("0/0", 2)], lambda _topic: None)
    assert decision.status is OutcomeStatus.COMMITTED
    for publish in decision.publishes:
        publish.loan.repay()
