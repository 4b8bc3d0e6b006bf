"""A broker killed with SIGKILL while clients stage publishes (issue 46):
each client reconnects, resumes its session and sends again only what the
broker does not hold, so every member holds exactly what its client
counted, the commit is *committed* (not refused) and the topic then holds
each publish exactly once, in order.

Real broker processes on one data directory and port, real TCP. Each round
(a batch, a topic of its own) has ``TASKS`` clients with ``reconnect``, the
Spark tasks, each staging ``PER_TASK`` numbered payloads into a member of
its own as fast as it can; the broker is ``kill -9``ed ``KILLS`` times at
random points of the staging (when the tasks have published a random number
of messages, each kill once the clients resumed from the one before) and
started again ``RESTART_DELAY`` later, well within its ``lease``. Then each
task finishes its stage, the first commits the batch with the counts
``finish_stage`` returned, and the topic is read from its first offset.
The async client (``open_client``, one trio run) and the blocking one
(``BlockingClient``, one thread per task).

Several tasks stage at once, as a Spark job's do: the state journal is one
file, and one connection's write of it can take another's staged publishes
to the file before that one's session record counts them (a connection
writes its own staged publishes and its counts together). Before issue 46's
fix a kill then left publishes staged that the restored session did not
count: the client sent them again, they were staged twice, and the commit
was refused. The window is narrow: on the code before the fix (0b858f1),
3 runs of both parametrizations (9 kills each) failed once so, the blocking
client's first round: "member 'part-0/attempt-0' staged 8512 publishes, the
commit lists 8000"; with the fix, 3 runs of both passed.

Nothing here depends on the machine's speed: the kill points are counts of
publishes, and every wait has a generous bound that only guards against a
hang.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BlockingClient, Client, StagingRefused, open_client
from broker.protocol import OutcomeStatus, Stage

from .helpers import TIMEOUT, read_range
from .processes import BrokerProcess, running_broker

pytestmark = pytest.mark.slow

ROUNDS = 3
#: Clients staging at once, each into a member of its own.
TASKS = 2
PER_TASK = 8000
KILLS = 3
#: Seconds between a kill and the start of the broker again.
RESTART_DELAY = 0.5
#: The broker's ``lease`` and the clients' ``reconnect`` (seconds): far
#: longer than a restart takes, so every session resumes.
LEASE = 60.0
RECONNECT = 60.0
#: Hang guard for a round's staging and commit (seconds).
GUARD = 4 * TIMEOUT
#: A task notes how many of its publishes are confirmed every this many.
NOTE_EVERY = 20
PAD = b"." * 60


@dataclass
class Figures:
    """What the rounds came to."""

    #: Per kill: publishes made and confirmed when it was sent (of ``TASKS * PER_TASK``).
    kill_points: list[tuple[int, int]] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    refusals: list[str] = field(default_factory=list)
    statistics: Counter[str] = field(default_factory=Counter)
    #: Per round: payloads stored more than once, and missing.
    duplicated: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    def summary(self) -> str:
        total = TASKS * PER_TASK
        stats = {k: self.statistics[k] for k in ("resumes", "frames_resent_on_resume")}
        stats["sessions_lost"] = self.statistics["sessions_lost"]
        return (
            f"kills at {self.kill_points} (of {total} publishes a round); outcomes "
            f"{dict(self.outcomes)}; refusals {self.refusals}; duplicated per round "
            f"{self.duplicated}; missing per round {self.missing}; clients {stats}"
        )


class Killer:
    """A thread that kills the broker ``KILLS`` times while the tasks stage,
    starting it again ``RESTART_DELAY`` later: first once the tasks have
    published ``first`` messages in all, then each time once every task has
    reconnected since the kill before and the tasks have published ``gaps[i]``
    more (so each kill lands while the broker stages, not while it is down
    and the clients wait). The tasks note their progress (``published``,
    ``confirmed``, ``reconnected``: one entry per task, each written by its
    task every ``NOTE_EVERY`` publishes). From a kill until every task has
    reconnected the tasks pause (``go``): the clients come back after random
    waits (full jitter), and one could otherwise finish its stage before
    another is back, leaving no publishes for the next kill to land in."""

    def __init__(self, broker: BrokerProcess, first: int, gaps: list[int]) -> None:
        self.broker = broker
        self.first = first
        self.gaps = gaps
        self.published = [0] * TASKS
        self.confirmed = [0] * TASKS
        self.reconnected = [0] * TASKS
        #: Per kill: (published, confirmed) of the tasks in all when it was sent.
        self.at: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        #: Set while the tasks may publish (cleared from a kill until all resumed).
        self.go = threading.Event()
        self.go.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="killer", daemon=True)

    def note(self, task: int, published: int, statistics: dict[str, int]) -> None:
        """What task ``task`` has done (from its client's ``statistics()``)."""
        self.published[task] = published
        self.confirmed[task] = statistics["confirmed"]
        self.reconnected[task] = statistics["resumes"] + statistics["sessions_lost"]

    def _reconnected_all(self, times: int) -> bool:
        return min(self.reconnected) >= times

    def _published_all(self, count: int) -> bool:
        return sum(self.published) >= count

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Wait until ``ready()``; False if told to stop or the tasks published everything first."""
        while not ready():
            if self._stop.wait(0.002) or sum(self.published) >= TASKS * PER_TASK:
                return False
        return True

    def _run(self) -> None:
        try:
            target = self.first
            for kill in range(KILLS):
                if kill:
                    if not self._wait(partial(self._reconnected_all, kill)):
                        return
                    self.go.set()
                    target = sum(self.published) + self.gaps[kill - 1]
                if not self._wait(partial(self._published_all, target)):
                    return
                self.go.clear()
                self.at.append((sum(self.published), sum(self.confirmed)))
                self.broker.kill()
                time.sleep(RESTART_DELAY)
                self.broker.start()
            self._wait(partial(self._reconnected_all, KILLS))
        except BaseException as error:  # (reported by join)
            self.error = error
        finally:
            self.go.set()

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait for the last kill's restart (a hang guard only); raise what the thread raised."""
        self._thread.join(GUARD)
        assert not self._thread.is_alive(), "the killer thread hangs"
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        self._stop.set()
        self.go.set()
        self._thread.join(GUARD)

    async def pause(self, task: int, published: int, client: Client) -> None:
        """A trio task's pause while :attr:`go` is clear, noting its client's
        reconnections meanwhile (what ends the pause). The killer thread
        sets ``go``: polled, as a trio.Event cannot be set from there."""
        while not self.go.is_set():
            self.note(task, published, client.statistics())
            await trio.sleep(0.005)

    def wait(self, task: int, published: int, client: BlockingClient) -> None:
        """:meth:`pause` for a blocking client's thread."""
        while not self.go.wait(0.005):
            self.note(task, published, client.statistics())


def new_killer(broker: BrokerProcess, rng: random.Random) -> Killer:
    total = TASKS * PER_TASK
    first = rng.randint(total // 20, total // 4)
    return Killer(broker, first, [rng.randint(200, total // 10) for _ in range(KILLS - 1)])


def member_of(task: int) -> str:
    return f"part-{task}/attempt-0"


def payload(batch: str, task: int, index: int) -> bytes:
    return b"%s|%d|%d|%s" % (batch.encode(), task, index, PAD)


def expected(batch: str) -> list[bytes]:
    """The topic's records once ``batch`` is committed: its members in the
    commit's order, each in publishing order."""
    return [payload(batch, t, i) for t in range(TASKS) for i in range(PER_TASK)]


async def read_topic(url: str, topic: str) -> list[bytes]:
    """Every record of ``topic``, from its first offset to its end."""
    async with open_client(url, name="reader") as client:
        with trio.fail_after(GUARD):
            first, end = (await client.offsets([topic])).get(topic, (0, 0))
            return await read_range(client, topic, first, end)


def check_round(url: str, batch: str, topic: str, figures: Figures) -> None:
    got = trio.run(read_topic, url, topic)
    want = expected(batch)
    counts = Counter(got)
    figures.duplicated.append(sum(1 for n in counts.values() if n > 1))
    figures.missing.append(sum(1 for p in want if p not in counts))
    assert got == want, figures.summary()


def outcome_of(figures: Figures, status: int) -> None:
    figures.outcomes[OutcomeStatus(status).name.lower()] += 1


async def async_round(url: str, batch: str, topic: str, killer: Killer, figures: Figures) -> None:
    """Stage with ``TASKS`` trio clients at once (under the kills), then commit."""
    members: list[tuple[str, int]] = [("", 0)] * TASKS

    async def task(client: Client, index: int) -> None:
        stage = Stage(batch, member_of(index))
        for n in range(PER_TASK):
            await client.publish(topic, payload(batch, index, n), stage=stage)
            if n % NOTE_EVERY == 0:
                killer.note(index, n + 1, client.statistics())
                await killer.pause(index, n + 1, client)
        killer.note(index, PER_TASK, client.statistics())
        members[index] = (stage.member, await client.finish_stage(stage))

    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(open_client(url, name=f"task-{i}", reconnect=RECONNECT))
            for i in range(TASKS)
        ]
        with trio.fail_after(GUARD):
            async with trio.open_nursery() as nursery:
                for index, client in enumerate(clients):
                    nursery.start_soon(task, client, index)
            await trio.to_thread.run_sync(killer.join)  # (no kill during the commit)
            try:
                outcome_of(figures, (await clients[0].commit(batch, members)).status)
            except StagingRefused as refused:
                figures.outcomes["refused"] += 1
                figures.refusals.append(refused.reason)
        for client in clients:
            figures.statistics.update(client.statistics())


def blocking_round(url: str, batch: str, topic: str, killer: Killer, figures: Figures) -> None:
    """Stage with ``TASKS`` blocking clients at once, one thread each (under
    the kills), then commit."""

    def task(client: BlockingClient, index: int) -> tuple[str, int]:
        stage = Stage(batch, member_of(index))
        for n in range(PER_TASK):
            client.publish(topic, payload(batch, index, n), stage=stage, timeout=GUARD)
            if n % NOTE_EVERY == 0:
                killer.note(index, n + 1, client.statistics())
                killer.wait(index, n + 1, client)
        killer.note(index, PER_TASK, client.statistics())
        return stage.member, client.finish_stage(stage, timeout=GUARD)

    with ExitStack() as stack:
        clients = [
            stack.enter_context(BlockingClient(url, name=f"task-{i}", reconnect=RECONNECT))
            for i in range(TASKS)
        ]
        with ThreadPoolExecutor(TASKS) as pool:
            members = list(pool.map(task, clients, range(TASKS)))
        killer.join()  # (no kill during the commit)
        try:
            outcome_of(figures, clients[0].commit(batch, members, timeout=GUARD).status)
        except StagingRefused as refused:
            figures.outcomes["refused"] += 1
            figures.refusals.append(refused.reason)
        for client in clients:
            figures.statistics.update(client.statistics())


@pytest.mark.parametrize("client", ["async", "blocking"])
def test_kill_9_while_staging_stages_each_publish_once(client: str, tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("STAGING_PUBLISH_KILL_SEED", f"46-{client}"))
    figures = Figures()
    with running_broker(tmp_path, f"lease={LEASE:g}") as broker:
        for round_ in range(ROUNDS):
            batch = f"job-{client}-{round_}"
            topic = f"staged-{client}-{round_}"
            killer = new_killer(broker, rng)
            killer.start()
            try:
                if client == "async":
                    trio.run(async_round, broker.url, batch, topic, killer, figures)
                else:
                    blocking_round(broker.url, batch, topic, killer, figures)
            finally:
                killer.abandon()
            figures.kill_points += killer.at
            assert figures.outcomes["committed"] == round_ + 1, figures.summary()
            check_round(broker.url, batch, topic, figures)
    print(figures.summary())
    assert len(figures.kill_points) == ROUNDS * KILLS, figures.summary()
    # Every kill landed while the tasks staged (before their last publish).
    assert all(at < TASKS * PER_TASK for at, _ in figures.kill_points), figures.summary()
    # Every session resumed (none lost: the lease outlives each restart).
    assert figures.statistics["sessions_lost"] == 0, figures.summary()
    assert figures.statistics["resumes"] >= ROUNDS * KILLS, figures.summary()
