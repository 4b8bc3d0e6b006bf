"""Each hop's debt during a fault schedule (``faults.py``), sampled from the
front ends' ``/stat.json``, against its bound: the hop's watermark plus one
run.

The hops of a publish in cluster mode, and what ``/stat.json`` shows of each:

- ``client connection`` and ``client channel``: the publishing connection's
  account and its publish channel's account, at the front end the publisher
  is connected to (``connections[].account``, ``channels[].account``; their
  ``peak_debt``, exact over the account's life, not only at the samples).
  A batch's loan is charged to the channel (and rolled up to the
  connection) from the moment it is passed to the topic until the stream
  stored it (or the owner confirmed it, over a link). Bound: the
  connection's (channel's) high watermark plus one run.
- ``link in flight``: a front end forwarding a topic another front end owns
  holds each batch's loan on its publisher's channel until the owner
  confirms it (``broker.links[].bytes_in_flight``, sampled). Bound: the
  channel's high watermark plus one run (they are that channel's loans).
- ``link at owner``: the owner's side of that link, an ordinary connection
  (peer ``link``) whose publish channels are charged like a client's
  (``peak_debt``). Bound: the channel's high watermark plus one run.
- ``jetstream runs``: runs sent to the topic's stream and not stored yet
  (``cluster.runs_sent - cluster.stores``: each run is counted once when
  first sent and once when stored, resends in neither). Bound: the window
  (``WINDOW``), a hard limit of the replicator: no run beyond it.
- ``jetstream records``: records in the owner's cache not stored by the
  stream yet: its ``logs`` row's records less ``cluster.records_stored``
  less what the cache held already when that broker started (restored from
  the stream: taken at a sample where nothing was being sent, when the
  difference is only that). Every such record is charged to a publish
  channel until stored, so the bound is the records a channel's high
  watermark holds plus one run, per publish channel at the owner.

One run is :data:`RUN_RECORDS` records (or :data:`RUN_BYTES`, whichever is
less): as debt, :data:`RUN_RECORDS` times one record's charge (its deliver
tail, a delivery's head and the per-event constant, as the topic charges it).
"""

from __future__ import annotations

import http.client
import json
import math
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from accounts import DEFAULT_EVENT_COST
from broker.protocol.frames import encode_deliver_tail
from broker.server.storage._replicated import RUN_BYTES, RUN_RECORDS
from broker.server.storage._replication import WINDOW
from broker.server.topics._topic import DELIVER_HEAD_ESTIMATE

#: The hops, in the order they are reported.
HOPS = (
    "client connection",
    "client channel",
    "link in flight",
    "link at owner",
    "jetstream runs",
    "jetstream records",
)
#: Seconds between two samples of each front end.
EVERY = 0.1


def record_charge(payload: bytes) -> int:
    """What a record of ``payload`` (no key, no headers) is charged while it
    waits for the stream (``topics._topic._charge`` of one tail)."""
    tail = encode_deliver_tail(payload, None, None)
    return len(tail) + DELIVER_HEAD_ESTIMATE + DEFAULT_EVENT_COST


def run_charge(payload: bytes) -> int:
    """One run's charge: :data:`RUN_RECORDS` records of ``payload``, fewer if
    :data:`RUN_BYTES` holds fewer."""
    tail = len(encode_deliver_tail(payload, None, None))
    records = max(1, min(RUN_RECORDS, RUN_BYTES // tail))
    return records * record_charge(payload)


@dataclass
class Hop:
    """One hop's most debt seen in a schedule, and its bound."""

    unit: str
    #: The most seen (0: the hop was never sampled with anything in it).
    most: int = 0
    #: Watermark plus one run (None: never sampled, so not known).
    bound: int | None = None
    #: Samples that had this hop in them (0: not exercised in the schedule).
    samples: int = 0

    @property
    def exceeded(self) -> bool:
        return self.bound is not None and self.most > self.bound

    def see(self, value: int, bound: int) -> None:
        self.samples += 1
        self.most = max(self.most, value)
        # (The bound of a hop is the same at every sample of a schedule
        # but for the publish channels counted at the owner.)
        self.bound = bound if self.bound is None else max(self.bound, bound)


def new_hops() -> dict[str, Hop]:
    units = {"jetstream runs": "runs", "jetstream records": "records"}
    return {name: Hop(units.get(name, "bytes")) for name in HOPS}


@dataclass
class _Epoch:
    """What was seen of one broker (a front end's process serves a new one,
    with a new epoch, each time the front ends change)."""

    #: Per sample: (records in the cache less records stored, publish channels).
    raw: list[tuple[int, int]] = field(default_factory=list)
    #: The raw figure at the latest sample with nothing being sent (None: none yet).
    base: int | None = None
    #: The first sample of it had no records of the topic: it started
    #: before any (base 0 unless a quiet sample says otherwise).
    fresh: bool | None = None


def _publish_accounts(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        channel["account"]
        for channel in row.get("channels", ())
        if channel.get("kind") == "publish" and "account" in channel
    ]


class HopDebt:
    """The per-hop maxima of one schedule, from the ``/stat.json``
    documents of its front ends (:meth:`take`, pure), finished by :meth:`hops`."""

    def __init__(self, topic: str, publisher: str, payload: bytes) -> None:
        self.topic = topic
        self.publisher = publisher
        self.record_charge = record_charge(payload)
        self.run_charge = run_charge(payload)
        self._hops = new_hops()
        self._epochs: dict[str, _Epoch] = {}
        #: The channels' high watermark (the same at every front end).
        self._channel_high = 0
        #: Samples taken, and /stat.json requests that failed (a front end
        #: starting, serving afresh, or killed).
        self.taken = 0
        self.failed = 0

    def take(self, document: Mapping[str, Any]) -> None:
        """Add one front end's ``/stat.json`` document."""
        self.taken += 1
        hops = self._hops
        budgets = document["budgets"]
        self._channel_high = budgets["channel_high_watermark"]
        run = self.run_charge
        channel_bound = budgets["channel_high_watermark"] + run
        connection_bound = budgets["connection_high_watermark"] + run
        publishing = 0
        for row in document.get("connections", ()):
            accounts = _publish_accounts(row)
            if row.get("client") == self.publisher:
                hops["client connection"].see(row["account"]["peak_debt"], connection_bound)
                for account in accounts:
                    hops["client channel"].see(account["peak_debt"], channel_bound)
            elif row.get("peer") == "link":
                for account in accounts:
                    hops["link at owner"].see(account["peak_debt"], channel_bound)
            publishing += sum(1 for account in accounts if account["debt"] > 0)
        for link in document["broker"].get("links") or ():
            if link["publishes_in_flight"] or link["bytes_in_flight"]:
                hops["link in flight"].see(link["bytes_in_flight"], channel_bound)
        cluster = document.get("cluster")
        if cluster is None:
            return
        in_flight = cluster["runs_sent"] - cluster["stores"]
        epoch = self._epochs.setdefault(document["broker"]["epoch"], _Epoch())
        row = next(
            (t for t in (document.get("logs") or {}).get("topics", ()) if t["name"] == self.topic),
            None,
        )
        if epoch.fresh is None:
            epoch.fresh = row is None or row["last_offset"] < row["first_offset"]
        if row is None:
            return
        hops["jetstream runs"].see(in_flight, WINDOW)
        raw = row["last_offset"] - row["first_offset"] + 1 - cluster["records_stored"]
        epoch.raw.append((raw, max(1, publishing)))
        if in_flight == 0 and cluster["topics_sending"] == 0:
            epoch.base = raw

    def hops(self) -> dict[str, Hop]:
        """Every hop's most and bound (``jetstream records`` worked out now:
        each broker's samples less what it held when it started)."""
        hops = {name: replace(hop) for name, hop in self._hops.items()}
        records = hops["jetstream records"]
        per_channel = math.ceil(self._channel_high / self.record_charge) + RUN_RECORDS
        for epoch in self._epochs.values():
            base = epoch.base if epoch.base is not None else 0 if epoch.fresh else None
            if base is None:
                continue  # (restored, never quiet: what it held is not known)
            for raw, channels in epoch.raw:
                records.see(max(0, raw - base), channels * per_channel)
        return hops

    @property
    def unknown_epochs(self) -> int:
        """Brokers whose records not stored could not be worked out."""
        return sum(1 for e in self._epochs.values() if e.base is None and not e.fresh and e.raw)


def fetch_stat(port: int, timeout: float = 2.0) -> dict[str, Any]:
    """``/stat.json`` of the front end whose metrics listen on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stat.json", timeout=timeout) as answer:
        document: dict[str, Any] = json.load(answer)
    return document


async def sample(debt: HopDebt, ports: Callable[[], list[int]], every: float = EVERY) -> None:
    """Every ``every`` seconds, take ``/stat.json`` of each front end
    (``ports()``: the metrics ports of those running now) into ``debt``;
    until cancelled."""
    while True:
        for port in ports():
            try:
                document = await trio.to_thread.run_sync(fetch_stat, port, abandon_on_cancel=True)
            except (OSError, ValueError, http.client.HTTPException):
                debt.failed += 1
                continue
            debt.take(document)
        await trio.sleep(every)
