"""A stateful property test: a staging area on a state journal, killed and
restarted now and then (after the broker wrote the journal, as it does
before every Confirm and Outcome), answers every stage, commit and abort
exactly as one that never restarted."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from accounts import unlimited
from broker.log import StateJournal
from broker.protocol import Stage
from broker.server.staging._area import CommitDecision, StagingArea

OWNERS = st.sampled_from([None, "alice", "bob"])
BATCHES = st.sampled_from(["b1", "b2", "b3", "b4"])
MEMBERS = st.sampled_from(["0/0", "0/1", "1/0"])


def _seen(decision: CommitDecision) -> tuple[object, ...]:
    tails = [(p.topic, p.loan.item, p.key) for p in decision.publishes]
    for publish in decision.publishes:  # (routed: the loans are repaid)
        publish.loan.repay()
    return decision.status, decision.messages, decision.reason, tails


class StagingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="staging-journal-"))
        self.serial = 0
        self.model = StagingArea(unlimited("model"), limit=10**9, ttl=60.0, remember=3)
        self.journal = StateJournal(self.dir / "state.journal", compact_min_bytes=2000)
        self.area = self._open()

    def _open(self) -> StagingArea:
        return StagingArea(
            unlimited("root"), limit=10**9, ttl=60.0, remember=3, journal=self.journal
        )

    def teardown(self) -> None:
        self.area.clear()
        self.model.clear()
        self.journal._abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(owner=OWNERS, batch=BATCHES, member=MEMBERS, key=st.none() | st.binary(max_size=3))
    def stage(self, owner: str | None, batch: str, member: str, key: bytes | None) -> None:
        self.serial += 1
        tail = b"tail-%d" % self.serial
        for area in (self.model, self.area):
            refusal = area.stage(
                owner, Stage(batch, member), f"t{self.serial % 3}", tail, key, 50, 0.0
            )
            assert refusal is None
        self.journal.write()  # before the Confirm

    @rule(
        owner=OWNERS,
        batch=BATCHES,
        members=st.lists(MEMBERS, unique=True, max_size=3),
        off=st.booleans(),
    )
    def commit(self, owner: str | None, batch: str, members: list[str], off: bool) -> None:
        staged = self.model.batches.get((owner, batch))
        counts = [
            (m, (0 if staged is None else len(staged.members.get(m, ()))) + (1 if off else 0))
            for m in members
        ]
        expected = _seen(self.model.commit(owner, batch, counts))
        decision = self.area.commit(owner, batch, counts)
        # As the broker does: routed, written before the Outcome, then the
        # staged publishes deleted (written with the next state). Without
        # forget_routed a duplicate commit wrote the batch as committed
        # again, later: a wrong order of the remembered batches.
        self.area.routed((owner, batch))
        self.journal.write()  # before the Outcome
        self.area.forget_routed((owner, batch))
        assert _seen(decision) == expected

    @rule(owner=OWNERS, batch=BATCHES)
    def abort(self, owner: str | None, batch: str) -> None:
        expected = _seen(self.model.abort(owner, batch))
        assert _seen(self.area.abort(owner, batch)) == expected
        self.journal.write()

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        self.area.clear()
        if clean:
            self.journal.close()
        else:
            self.journal._abandon()
        self.journal = StateJournal(self.dir / "state.journal", compact_min_bytes=2000)
        self.area = self._open()

    @invariant()
    def holds_the_same(self) -> None:
        def shape(area: StagingArea) -> object:
            return {
                key: {m: [(p.topic, p.loan.item, p.key) for p in ps] for m, ps in b.members.items()}
                for key, b in area.batches.items()
            }

        assert shape(self.area) == shape(self.model)
        assert list(self.area.finished) == list(self.model.finished)
        assert self.area.size == self.model.size
        assert self.area.account.debt == self.model.account.debt


StagingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestStagingAcrossRestarts = StagingMachine.TestCase
