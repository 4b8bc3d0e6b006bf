"""The fault runner's per-hop debt (``hop_debt.py``): what it reads of a
front end's ``/stat.json`` and the bounds it holds each hop to. Pure: the
documents are made here (their shape is ``broker/metrics/_stat_schema.py``'s)."""

from __future__ import annotations

from typing import Any

from accounts import DEFAULT_EVENT_COST
from broker.server.storage._replicated import RUN_RECORDS
from broker.server.storage._replication import WINDOW
from broker.server.topics._topic import DELIVER_HEAD_ESTIMATE

from .hop_debt import HOPS, HopDebt, record_charge, run_charge

TOPIC = "faults"
PAYLOAD = b"0" * 100
CHANNEL_HIGH = 1 << 20
CONNECTION_HIGH = 4 << 20
RUN = RUN_RECORDS * (104 + DELIVER_HEAD_ESTIMATE + DEFAULT_EVENT_COST)


def account(debt: int, peak: int | None = None) -> dict[str, Any]:
    return {"debt": debt, "peak_debt": debt if peak is None else peak}


def connection(
    client: str, peer: str, channel_peaks: list[int], peak: int | None = None
) -> dict[str, Any]:
    channels: list[dict[str, Any]] = [{"kind": "bind", "direction": "in"}]
    channels += [
        {"kind": "publish", "direction": "in", "topic": TOPIC, "account": account(p, p)}
        for p in channel_peaks
    ]
    total = sum(channel_peaks)
    return {
        "client": client,
        "peer": peer,
        "account": account(total, total if peak is None else peak),
        "channels": channels,
    }


def document(
    *,
    epoch: str = "e1",
    connections: list[dict[str, Any]] | None = None,
    links: list[dict[str, Any]] | None = None,
    log: tuple[int, int] | None = None,
    runs: tuple[int, int] = (0, 0),
    stored: int = 0,
    sending: int = 0,
) -> dict[str, Any]:
    """A front end's ``/stat.json``: ``log`` its topic's (first, last)
    offsets (None: it does not own the topic), ``runs`` (sent, stored)."""
    return {
        "budgets": {
            "channel_high_watermark": CHANNEL_HIGH,
            "connection_high_watermark": CONNECTION_HIGH,
        },
        "broker": {"epoch": epoch, "links": links or []},
        "connections": connections or [],
        "logs": {
            "topics": []
            if log is None
            else [{"name": TOPIC, "first_offset": log[0], "last_offset": log[1]}]
        },
        "cluster": {
            "runs_sent": runs[0],
            "stores": runs[1],
            "records_stored": stored,
            "topics_sending": sending,
        },
    }


def test_one_run_is_64_records_as_the_topic_charges_them() -> None:
    assert record_charge(PAYLOAD) == 104 + DELIVER_HEAD_ESTIMATE + DEFAULT_EVENT_COST
    assert run_charge(PAYLOAD) == RUN
    # (A record larger than RUN_BYTES / 64: fewer per run.)
    assert run_charge(b"x" * 100_000) == 5 * record_charge(b"x" * 100_000)


def test_the_publishers_connection_and_channel_within_watermark_plus_one_run() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document(connections=[connection("pub", "127.0.0.1:1", [CHANNEL_HIGH + RUN])]))
    hops = debt.hops()
    assert list(hops) == list(HOPS)
    assert hops["client channel"].most == CHANNEL_HIGH + RUN
    assert hops["client channel"].bound == CHANNEL_HIGH + RUN
    assert hops["client connection"].bound == CONNECTION_HIGH + RUN
    assert not any(hop.exceeded for hop in hops.values())
    assert hops["link in flight"].samples == 0  # (not exercised: no link)


def test_a_channel_one_byte_past_its_bound_is_exceeded() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document(connections=[connection("pub", "x", [100])]))
    debt.take(document(connections=[connection("pub", "x", [CHANNEL_HIGH + RUN + 1])]))
    hops = debt.hops()
    assert hops["client channel"].exceeded
    assert hops["client channel"].samples == 2
    assert not hops["client connection"].exceeded


def test_the_connection_is_held_to_its_own_watermark() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    row = connection("pub", "x", [CHANNEL_HIGH], peak=CONNECTION_HIGH + RUN + 1)
    debt.take(document(connections=[row]))
    assert debt.hops()["client connection"].exceeded


def test_a_link_in_flight_at_the_forwarder_and_its_channel_at_the_owner() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    idle = {"owner": "b", "publishes_in_flight": 0, "bytes_in_flight": 0}
    busy = {"owner": "b", "publishes_in_flight": 500, "bytes_in_flight": CHANNEL_HIGH + RUN + 1}
    debt.take(document(links=[idle]))
    assert debt.hops()["link in flight"].samples == 0
    debt.take(document(links=[busy]))
    debt.take(document(epoch="e2", connections=[connection("link-a", "link", [2000])]))
    hops = debt.hops()
    assert hops["link in flight"].exceeded
    assert hops["link at owner"].most == 2000 and not hops["link at owner"].exceeded
    assert hops["client channel"].samples == 0  # (the link is no publisher's connection)


def test_runs_in_flight_are_sent_less_stored_within_the_window() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document(log=(1, 100), runs=(10, 10 - WINDOW)))
    assert debt.hops()["jetstream runs"].most == WINDOW
    assert not debt.hops()["jetstream runs"].exceeded
    debt.take(document(log=(1, 100), runs=(20, 20 - WINDOW - 1)))
    assert debt.hops()["jetstream runs"].exceeded


def test_records_not_stored_on_a_broker_that_started_before_any() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document())  # (no records yet: the topic is not even made)
    debt.take(document(log=(1, 1000), runs=(10, 6), stored=700, sending=1))
    records = debt.hops()["jetstream records"]
    assert records.most == 300
    per_channel = -(-CHANNEL_HIGH // record_charge(PAYLOAD)) + RUN_RECORDS
    assert records.bound == per_channel and not records.exceeded


def test_records_restored_at_a_brokers_start_are_not_counted() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    # Restored 5,000 records; then appended 2,000, 400 of them not stored...
    debt.take(document(log=(1, 7000), runs=(30, 26), stored=1600, sending=1))
    debt.take(document(log=(1, 7000), runs=(30, 26), stored=1600, sending=1))
    # ...until everything was stored (nothing sent: the difference is what it restored).
    debt.take(document(log=(1, 7000), runs=(32, 32), stored=2000, sending=0))
    records = debt.hops()["jetstream records"]
    assert records.most == 400 and records.samples == 3
    assert debt.unknown_epochs == 0


def test_records_of_a_restored_broker_never_quiet_are_left_out() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document(epoch="old", log=(1, 7000), runs=(30, 26), stored=1600, sending=1))
    assert debt.hops()["jetstream records"].samples == 0
    assert debt.unknown_epochs == 1


def test_records_bound_grows_with_the_publish_channels_at_the_owner() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    per_channel = -(-CHANNEL_HIGH // record_charge(PAYLOAD)) + RUN_RECORDS
    two = [connection("pub", "x", [1000]), connection("link-a", "link", [1000])]
    debt.take(document(connections=two))
    debt.take(document(connections=two, log=(1, per_channel + 10), runs=(5, 1), sending=1))
    records = debt.hops()["jetstream records"]
    assert records.most == per_channel + 10
    assert records.bound == 2 * per_channel and not records.exceeded


def test_hops_can_be_asked_twice() -> None:
    debt = HopDebt(TOPIC, "pub", PAYLOAD)
    debt.take(document())
    debt.take(document(log=(1, 100), runs=(2, 1), sending=1))
    assert debt.hops()["jetstream records"].samples == debt.hops()["jetstream records"].samples == 1
