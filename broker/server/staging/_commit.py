"""Routing a committed batch: its staged publishes go to their topics, in order,
charged to the committing connection (the fan-out rule) and paced by that
charge, like any publisher's; and completing at start-up the commits a stop
cut off (see ``_staging``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

import trio

from accounts import Account

from .._peer_logging import shown
from .._services import BrokerServices
from ..storage._topic_logs import TopicUnavailable
from ..topics._topic import FORWARD_BATCH, Routed, Topic
from ._area import StagedPublish
from ._in_flight import CommitInFlight as CommitInFlight  # (re-exported)
from ._records import BatchKey, commit_origin
from ._registry import COMMITTED, COMMITTING
from ._stream import drop_quietly

log = logging.getLogger("broker.server")

#: How long a start waits for the commits it completes before accepting clients.
COMPLETE_BEFORE_ACCEPTING = 10

#: What a commit calls before a run of its publishes to a topic is appended
#: to the topic's log: ``(topic, index, count)`` -> the topic's hook.
Progress = Callable[[str, int, int], Callable[[int], None] | None]


class Topics(Protocol):
    """Where topics are found by name (the broker's topic directory)."""

    def topic(self, name: str) -> Topic:
        """The topic actor for ``name``, spawned on first use."""
        ...


class CommitRun:
    """Counts the routed publishes of one commit; :attr:`done` is set once
    every topic has routed all of them to its subscriptions."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.done = trio.Event()
        if total == 0:
            self.done.set()

    def routed(self, routed: Routed) -> None:
        """A topic routed a batch of this commit's publishes."""
        self.left -= len(routed.tails)
        if self.left <= 0:
            self.done.set()


async def route_commit(
    broker: Topics,
    account: Account,
    publishes: list[StagedPublish],
    *,
    routed_before: Mapping[str, int] | None = None,
    progress: Progress | None = None,
    origin: bytes | None = None,
) -> None:
    """Route ``publishes`` (runs per topic in the order given), each batch a
    loan on ``account``; waits while ``account`` is over its watermark (slow
    subscribers slow the commit, not the broker's memory) and returns once
    everything is routed. Staged loans are repaid as their batch is handed on,
    and all of them, routed or not, if this is cancelled.

    The first ``routed_before[topic]`` publishes to a topic are left out
    (in its log already: a commit completed at start-up); ``progress`` is
    asked for each batch's hook (``Routed.before_append``). With ``origin``
    (cluster mode) each batch names its publishes as that origin's, handle
    0, numbered from 1 among the batch's publishes to its topic: the
    topic's stream then says how many of them it holds (see
    :func:`complete_unfinished`)."""
    skip = routed_before or {}
    # Runs per topic, each with the index (among the batch's publishes to
    # its topic) of its first publish, less those in the log already.
    runs: list[tuple[str, int, list[StagedPublish]]] = []
    index: dict[str, int] = {}
    for topic_name, group in itertools.groupby(publishes, key=lambda p: p.topic):
        run_of_topic = list(group)
        first = index.get(topic_name, 0)
        index[topic_name] = first + len(run_of_topic)
        left_out = min(max(skip.get(topic_name, 0) - first, 0), len(run_of_topic))
        if left_out:
            for publish in run_of_topic[:left_out]:
                publish.loan.repay()
            run_of_topic = run_of_topic[left_out:]
        if run_of_topic:
            runs.append((topic_name, first + left_out, run_of_topic))
    run = CommitRun(sum(len(run_of_topic) for _, _, run_of_topic in runs))
    held: dict[str, Topic] = {}
    try:
        for topic_name, first, run_of_topic in runs:
            topic = held.get(topic_name)
            if topic is None:
                topic = held[topic_name] = broker.topic(topic_name)
                topic.publishers += 1  # kept alive until everything is routed
            for start in range(0, len(run_of_topic), FORWARD_BATCH):
                chunk = run_of_topic[start : start + FORWARD_BATCH]
                await account.ensure_clear_funds()
                tails = [p.loan.item for p in chunk]
                size = sum(len(tail) for tail in tails)
                keys = [p.key for p in chunk]
                # (No fan-out estimate: the account's own debt paces a commit.)
                origins = None if origin is None else [(origin, 0, first + start + 1, len(chunk))]
                routed = Routed(tails, run, 0, 0, keys, origins)
                if progress is not None:
                    routed.before_append = progress(topic_name, first + start, len(chunk))
                topic.send_nowait(routed, account=account, cost=size)
                for publish in chunk:
                    publish.loan.repay()
        await run.done.wait()
    finally:
        for publish in publishes:
            publish.loan.repay()  # (once only: those handed on already were)
        for topic in held.values():
            topic.publishers -= 1
            topic.release_if_unused()


def start_commit(
    services: BrokerServices,
    nursery: trio.Nursery,
    batch: BatchKey,
    account: Account,
    publishes: list[StagedPublish],
    done: Callable[[], None],
    routed_before: Mapping[str, int] | None = None,
) -> None:
    """Route a committed batch's ``publishes`` (charged to ``account``) in
    ``nursery`` (the broker's own, so that a commit under way completes even
    if the committing connection closes); ``done()`` once all are routed.
    Meanwhile the batch is in ``services.commits.in_flight``."""
    storage = services.storage
    in_flight = services.commits.in_flight
    storage.persist_state()  # its "committing" record, before anything is routed
    running = in_flight[batch] = CommitInFlight()
    running.waiters.append(done)
    staging = services.commits.staging
    topics = services.topics

    def progress(topic: str, index: int, count: int) -> Callable[[int], None] | None:
        return staging.progress(batch, topic, index, count)

    replicated = storage.logs is not None and storage.logs.replication is not None
    registry = services.commits.registry
    members = staging.routing_members.get(batch)
    shared = {publish.topic for publish in publishes}

    async def run() -> None:
        before = routed_before
        routing = publishes
        try:
            if registry is not None:
                # Cluster mode: "committing" in the cluster's registry first.
                state = await registry.begin(batch, shared, members or [])
                if state == COMMITTED:  # (meanwhile, through another front end)
                    routing = []
                elif state == COMMITTING and before is None:  # (cut off elsewhere)
                    origin = commit_origin(batch)
                    before = {topic: services.seen.high(topic, origin, 0) for topic in shared}
            try:
                await route_commit(
                    topics,
                    account,
                    routing,
                    routed_before=before,
                    progress=progress,
                    origin=commit_origin(batch) if replicated else None,
                )
            except TopicUnavailable as error:
                # Its logs opened when it was decided: one failing since is a
                # disk fault. It stays in the journal as being committed (the
                # next start completes it), and the broker goes on.
                log.error(
                    "staged batch %s: its commit is cut off (the next start completes it): %s",
                    shown(batch[1]),
                    error,
                )
                return
            # Remembered as committed (written, before anybody hears of
            # it): a rerun after a restart is answered "duplicate".
            if registry is not None:
                # Cluster mode: "committed" in the registry first (cut off
                # before, the journal still says "committing": completed).
                await registry.finish(batch, shared, members)
                staged = services.commits.staged
                if staged is not None:  # (its share's runs are of no more use)
                    services.life.start_soon(partial(drop_quietly, staged, batch, shared))
            staging.routed(batch)
            storage.persist_state()
            for waiter in running.waiters:  # before anybody else hears of it
                waiter()
            staging.forget_routed(batch)  # (written with the next state)
        finally:
            for publish in publishes:
                publish.loan.repay()  # (cut off before routing: once only)
            del in_flight[batch]
            running.routed.set()

    nursery.start_soon(run)


async def complete_unfinished(services: BrokerServices, nursery: trio.Nursery) -> None:
    """Complete the commits a stop cut off while they routed: each topic's
    log is asked how much of the batch's share it holds, and the rest is
    routed. One whose topic is not served here (the workers changed) or
    whose log cannot be opened is kept (a commit of it is refused, saying
    why) for a start that can.

    Returns once they are routed (the broker then accepts clients), or
    after :data:`COMPLETE_BEFORE_ACCEPTING` seconds (a log full with
    ``when_full="block"`` waits for its readers, who need clients; a
    retried commit waits for its batch anyway)."""
    staging = services.commits.staging
    logs = services.storage.logs
    for batch, unfinished in list(staging.unfinished.items()):
        assert logs is not None  # (only a journal has unfinished commits)
        routed_before: dict[str, int] = {}
        why = None
        for topic in sorted({publish.topic for publish in unfinished.publishes}):
            why = services.topics.not_owned(topic)
            if why is not None:
                break
            try:
                topic_log = logs.open(topic)
            except TopicUnavailable as error:
                why = str(error)
                break
            if logs.replication is not None:
                # Cluster mode: the stream's runs name the batch's publishes
                # they hold (several runs may have been in flight at the stop).
                routed_before[topic] = services.seen.high(topic, commit_origin(batch), 0)
                continue
            # (A record torn by the kill is a gap, its offset not given again:
            # the batch's publishes from there on are routed again.)
            routed_before[topic] = unfinished.routed_before(
                topic, topic_log.next_offset, logs.gaps_of(topic_log)
            )
        name, whose = shown(batch[1]), "anonymous clients" if batch[0] is None else repr(batch[0])
        if why is not None:
            staging.block(
                batch,
                f"the broker stopped while it committed this batch and "
                f"cannot complete it here: {why}",
            )
            log.error(
                "staged batch %s of %s: its commit, cut off by a stop, cannot be "
                "completed here: %s",
                name,
                whose,
                why,
            )
            continue
        publishes = staging.resume(batch)
        before = sum(routed_before.values())
        log.warning(
            "staged batch %s of %s was being committed when the broker stopped: %d of its "
            "%d messages were in the topic logs, the other %d are routed now",
            name,
            whose,
            before,
            len(publishes),
            len(publishes) - before,
        )
        account = Account(
            f"commit/{batch[1][:64]}",
            high_watermark=services.config.channel_high_watermark,
            low_watermark=services.config.channel_low_watermark,
            parent=services.resources.account,
            kind="commit",
        )
        start_commit(services, nursery, batch, account, publishes, account.close, routed_before)
    with trio.move_on_after(COMPLETE_BEFORE_ACCEPTING) as waited:
        for running in list(services.commits.in_flight.values()):
            await running.routed.wait()
    if waited.cancelled_caught:
        log.warning(
            "commits cut off by the stop are still being completed after %d s (a topic's "
            "log full?): clients are accepted meanwhile",
            COMPLETE_BEFORE_ACCEPTING,
        )
