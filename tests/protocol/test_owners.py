"""Topic ownership among workers, and the membership in Hello/Welcome."""

from __future__ import annotations

import itertools

import pytest

from broker.protocol import (
    Cluster,
    Connection,
    HelloReceived,
    Member,
    RemoteProtocolError,
    Role,
    WelcomeReceived,
    owner_id,
)
from broker.protocol.frames._decode import decode_body
from broker.protocol.frames._encode import encode_body
from broker.protocol.frames._messages import Welcome

CLUSTER = Cluster(7, "w1", (Member("w0", "127.0.0.1", 7401), Member("w1", "127.0.0.1", 7402)))


def test_owner_does_not_depend_on_the_order_of_members() -> None:
    ids = ["w0", "w1", "w2", "w3"]
    for topic in (f"t{i}" for i in range(200)):
        owners = {owner_id(topic, order) for order in itertools.permutations(ids)}
        assert len(owners) == 1


def test_owners_spread_and_move_little_when_a_worker_is_added() -> None:
    topics = [f"topic-{i}" for i in range(2000)]
    three = {t: owner_id(t, ["w0", "w1", "w2"]) for t in topics}
    four = {t: owner_id(t, ["w0", "w1", "w2", "w3"]) for t in topics}
    counts = {w: list(three.values()).count(w) for w in ("w0", "w1", "w2")}
    assert all(500 < n < 833 for n in counts.values()), counts
    moved = [t for t in topics if three[t] != four[t]]
    # Only topics the new worker takes move: about a quarter of them.
    assert all(four[t] == "w3" for t in moved)
    assert 350 < len(moved) < 650


def test_cluster_owner_and_owns_agree() -> None:
    for topic in (f"t{i}" for i in range(50)):
        assert CLUSTER.owns(topic) == (CLUSTER.owner(topic).id == "w1")
    assert CLUSTER.owner("x").address in ("127.0.0.1:7401", "127.0.0.1:7402")
    assert Member("w9", "::1", 7400).address == "[::1]:7400"
    assert CLUSTER.index == 1


def _handshake(metadata: bool, cluster: Cluster | None) -> Welcome:
    client, broker = Connection(Role.CLIENT), Connection(Role.BROKER)
    client.hello("c", metadata=metadata)
    events = broker.receive_data(client.data_to_send(), now=0.0)
    assert isinstance(events[0], HelloReceived)
    assert events[0].hello.metadata is metadata
    broker.welcome(session=bytes(16), epoch=b"e", cluster=cluster)
    received = client.receive_data(broker.data_to_send(), now=0.0)
    assert isinstance(received[0], WelcomeReceived)
    return received[0].welcome


def test_welcome_carries_the_membership_only_when_asked() -> None:
    assert _handshake(True, CLUSTER).cluster == CLUSTER
    assert _handshake(False, CLUSTER).cluster is None
    assert _handshake(True, None).cluster is None


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"epoch": 1, "worker": "w0"},
        {"epoch": -1, "worker": "w0", "members": [["w0", "h", 1]]},
        {"epoch": 1, "worker": "w0", "members": []},
        {"epoch": 1, "worker": "w0", "members": [["w0", "h", 0]]},
        {"epoch": 1, "worker": "w0", "members": [["w0", "h"]]},
        {"epoch": 1, "worker": "w9", "members": [["w0", "h", 1]]},
        {"epoch": 1, "worker": "w0", "members": [["w0", "h", 1], ["w0", "h", 2]]},
    ],
)
def test_a_malformed_cluster_is_a_protocol_error(bad: object) -> None:
    welcome = Welcome(1, bytes(16), False, b"e", 1000, 500, 65536)
    body = encode_body(welcome)
    import cbor2

    fields = cbor2.loads(body)
    fields[2]["cluster"] = bad
    with pytest.raises(RemoteProtocolError, match="cluster"):
        decode_body(cbor2.dumps(fields))
