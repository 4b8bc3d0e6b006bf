"""The cluster front ends' membership table (sans-IO): heartbeats encoded and
decoded, members added, dropped on leaving or after silence, the epoch and
the protocol's ``Cluster``; a state machine checks its promises over random
runs of heartbeats, leaves and time."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.protocol import Cluster, Member
from broker.server.cluster._members import (
    FrontEnd,
    Heartbeat,
    MalformedHeartbeat,
    Membership,
    decode_heartbeat,
    encode_heartbeat,
)
from tests.hypothesis_profiles import examples

ME = FrontEnd("me0000000000", "10.0.0.1", 7400, "10.0.0.1", 7500)
A = FrontEnd("a00000000000", "10.0.0.2", 7400, "10.0.0.2", 7500)
B = FrontEnd("b00000000000", "10.0.0.3", 7401, "10.0.0.3", 7501)


def _beat(**fields: object) -> bytes:
    """A heartbeat of A with ``fields`` replaced (None: left out)."""
    value: dict[object, object] = {
        "v": 1,
        "id": A.id,
        "host": A.host,
        "port": A.port,
        "link_host": A.link_host,
        "link_port": A.link_port,
        "leaving": False,
    }
    for key, replacement in fields.items():
        if replacement is None:
            del value[key]
        else:
            value[key] = replacement
    return cbor2.dumps(value)


# ----------------------------------------------------------------- heartbeats


HOSTS = st.text(min_size=1, max_size=40)
PORTS = st.integers(1, 65535)
FRONT_ENDS = st.builds(FrontEnd, st.text(min_size=1, max_size=64), HOSTS, PORTS, HOSTS, PORTS)


@given(FRONT_ENDS, st.booleans())
def test_a_heartbeat_decodes_to_what_was_encoded(front_end: FrontEnd, leaving: bool) -> None:
    assert decode_heartbeat(encode_heartbeat(front_end, leaving)) == Heartbeat(front_end, leaving)


def test_a_later_compatible_heartbeat_with_more_keys_is_taken() -> None:
    assert decode_heartbeat(_beat(zone="eu-1")) == Heartbeat(A, False)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        b"not cbor at all",
        cbor2.dumps([1, A.id]),
        _beat() + b"\x00",  # (bytes after the map)
        _beat(v=2),
        _beat(v=None),
        _beat(v=True),
        _beat(id=""),
        _beat(id="x" * 65),
        _beat(id=7),
        _beat(host=None),
        _beat(host=b"10.0.0.2"),
        _beat(port=0),
        _beat(port=65536),
        _beat(port=True),
        _beat(port=7400.0),
        _beat(link_port=-1),
        _beat(link_host=""),
        _beat(leaving=None),
        _beat(leaving=0),
        _beat(zone="x" * 2000),  # (too long to be a heartbeat)
        cbor2.dumps(cbor2.CBORTag(1, 0)),
        _beat(port=cbor2.CBORTag(2, A.port.to_bytes(2, "big"))),  # (no tags, not even a bignum)
        b"\xa2\x61v\x01\x61v\x01",  # (a duplicate key)
        b"\xbf\x61v\x01\xff",  # (an indefinite-length map)
    ],
)
def test_what_is_not_a_heartbeat_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedHeartbeat):
        decode_heartbeat(data)
    table = Membership(ME)
    assert not table.heard(data, 0.0)
    assert table.members == (ME,)
    assert table.statistics().malformed == 1


@settings(max_examples=examples(2000))
@given(st.binary(max_size=200) | st.builds(lambda b, cut: b[:cut], st.just(_beat()), st.integers()))
def test_no_bytes_crash_the_decoder_or_the_table(data: bytes) -> None:
    """Whatever is heard: a heartbeat or :class:`MalformedHeartbeat`, never
    another exception, and the table counts what it ignored."""
    try:
        decoded: Heartbeat | None = decode_heartbeat(data)
    except MalformedHeartbeat:
        decoded = None
    table = Membership(ME)
    changed = table.heard(data, 0.0)
    assert table.statistics().malformed == (decoded is None)
    joined = decoded is not None and not decoded.leaving and decoded.front_end.id != ME.id
    assert changed == joined


# ------------------------------------------------------------------ the table


def test_at_first_only_me() -> None:
    table = Membership(ME)
    assert table.members == (ME,)
    assert table.deadline() is None
    assert not table.expire(1e9)
    assert table.cluster() == Cluster(1, ME.id, (Member(ME.id, ME.host, ME.port),))
    assert table.link_address(ME.id) == (ME.link_host, ME.link_port)
    assert table.link_address(A.id) is None
    assert not table.echoed


def test_members_come_sorted_by_id_and_in_the_cluster() -> None:
    table = Membership(ME, dead_after=2.0)
    assert table.heard(encode_heartbeat(B), 10.0)
    assert table.heard(encode_heartbeat(A), 11.0)
    assert table.members == (A, B, ME)
    assert table.epoch == 3
    cluster = table.cluster()
    assert cluster.epoch == 3 and cluster.worker == ME.id
    assert cluster.members == (A.member(), B.member(), ME.member())
    assert table.link_address(B.id) == ("10.0.0.3", 7501)
    assert table.deadline() == 12.0
    stats = table.statistics()
    assert (stats.members, stats.changes, stats.heard, stats.malformed) == (3, 2, 2, 0)


def test_hearing_a_member_again_changes_nothing_but_its_deadline() -> None:
    table = Membership(ME, dead_after=2.0)
    table.heard(encode_heartbeat(A), 10.0)
    assert not table.heard(encode_heartbeat(A), 11.5)
    assert table.epoch == 2
    assert table.deadline() == 13.5
    assert not table.expire(13.4)
    assert table.expire(13.5)
    assert table.members == (ME,)
    assert table.epoch == 3
    assert table.deadline() is None


def test_the_silent_go_and_the_others_stay() -> None:
    table = Membership(ME, dead_after=2.0)
    table.heard(encode_heartbeat(A), 10.0)
    table.heard(encode_heartbeat(B), 11.0)
    assert table.expire(12.5)
    assert table.members == (B, ME)
    assert table.deadline() == 13.0
    assert table.link_address(A.id) is None
    assert (table.statistics().expired, table.statistics().left) == (1, 0)


def test_a_suspect_goes_sooner_unless_heard_again() -> None:
    table = Membership(ME, dead_after=2.0)
    table.heard(encode_heartbeat(A), 10.0)
    table.heard(encode_heartbeat(B), 10.0)
    table.suspect(A.id, 10.3, 0.75)
    table.suspect(B.id, 10.3, 0.75)
    table.suspect("nobody", 10.3, 0.75)  # (not a member: nothing)
    assert table.deadline() == 10.75
    assert not table.expire(10.7)
    table.heard(encode_heartbeat(B), 10.72)  # (B is alive after all)
    assert table.expire(10.75)
    assert table.members == (B, ME)
    assert table.deadline() == 12.72


def test_leaving_is_at_once_and_leaving_twice_is_nothing() -> None:
    table = Membership(ME)
    table.heard(encode_heartbeat(A), 10.0)
    assert table.heard(encode_heartbeat(A, leaving=True), 10.1)
    assert table.members == (ME,)
    assert table.deadline() is None
    assert not table.heard(encode_heartbeat(A, leaving=True), 10.2)
    assert not table.heard(encode_heartbeat(B, leaving=True), 10.2)
    assert table.epoch == 3
    assert (table.statistics().expired, table.statistics().left) == (0, 1)


def test_new_addresses_are_a_change() -> None:
    table = Membership(ME)
    table.heard(encode_heartbeat(A), 10.0)
    moved = FrontEnd(A.id, A.host, A.port, A.link_host, 7999)
    assert table.heard(encode_heartbeat(moved), 10.5)
    assert table.members == (moved, ME)
    assert table.link_address(A.id) == (A.link_host, 7999)
    assert table.epoch == 3


def test_our_own_heartbeat_is_an_echo_and_our_id_elsewhere_a_conflict() -> None:
    table = Membership(ME)
    assert not table.heard(encode_heartbeat(ME), 1.0)
    assert table.echoed
    impostor = FrontEnd(ME.id, "10.9.9.9", 1, "10.9.9.9", 2)
    assert not table.heard(encode_heartbeat(impostor), 1.0)
    assert not table.heard(encode_heartbeat(ME, leaving=True), 1.0)
    assert table.members == (ME,)
    assert table.epoch == 1
    assert table.statistics().conflicts == 1


def test_dead_after_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Membership(ME, dead_after=0)


# ------------------------------------------------------------ the state machine

DEAD_AFTER = 2.0
IDS = st.sampled_from(["a", "b", "c", ME.id])
#: Two address sets per id: a heartbeat with the other one moves the member.
PLACES = st.sampled_from([0, 1])


def _front_end(id: str, place: int) -> FrontEnd:
    if id == ME.id:
        return ME
    return FrontEnd(id, "h", 7000 + place, "h", 8000 + place)


class MembershipMachine(RuleBasedStateMachine):
    """A model of the table: who is live with which addresses and when each
    was last heard; the table must agree after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.table = Membership(ME, dead_after=DEAD_AFTER)
        self.now = 1000.0
        self.model: dict[str, FrontEnd] = {}
        self.last: dict[str, float] = {}
        self.epoch = self.table.epoch
        self.members = self.table.members
        self.malformed = 0
        self.left = 0
        self.expired = 0

    def _after(self, changed: bool) -> None:
        expected = tuple(sorted((ME, *self.model.values())))
        assert self.table.members == expected
        assert changed == (expected != self.members)
        if changed:
            assert self.table.epoch == self.epoch + 1
        else:
            assert self.table.epoch == self.epoch
        self.epoch, self.members = self.table.epoch, expected

    @rule(id=IDS, place=PLACES)
    def heartbeat(self, id: str, place: int) -> None:
        front_end = _front_end(id, place)
        changed = self.table.heard(encode_heartbeat(front_end), self.now)
        if id != ME.id:
            self.model[id] = front_end
            self.last[id] = self.now
        self._after(changed)

    @rule(id=IDS, place=PLACES)
    def leave(self, id: str, place: int) -> None:
        changed = self.table.heard(encode_heartbeat(_front_end(id, place), True), self.now)
        if id != ME.id and id in self.model:
            del self.model[id], self.last[id]
            self.left += 1
        self._after(changed)

    @rule(data=st.binary(max_size=40))
    def noise(self, data: bytes) -> None:
        changed = self.table.heard(b"\xff" + data, self.now)
        self.malformed += 1
        self._after(changed)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 1.999, 2.0, 2.5]) | st.floats(0, 5))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def expire(self) -> None:
        changed = self.table.expire(self.now)
        for id, last in list(self.last.items()):
            if last + DEAD_AFTER <= self.now:
                del self.model[id], self.last[id]
                self.expired += 1
        self._after(changed)

    @precondition(lambda self: self.table.deadline() is not None)
    @rule()
    def expire_at_the_deadline(self) -> None:
        deadline = self.table.deadline()
        assert deadline is not None
        self.now = max(self.now, deadline)
        before = len(self.table.members)
        self.expire()
        assert len(self.table.members) < before

    @invariant()
    def me_is_always_a_member(self) -> None:
        assert ME in self.table.members

    @invariant()
    def the_recently_heard_are_members(self) -> None:
        for id, last in self.last.items():
            if self.now < last + DEAD_AFTER:
                assert self.model[id] in self.table.members

    @invariant()
    def the_deadline_is_the_oldest_beat_plus_dead_after(self) -> None:
        oldest = min(self.last.values(), default=None)
        expected = None if oldest is None else oldest + DEAD_AFTER
        assert self.table.deadline() == expected

    @invariant()
    def the_cluster_and_counts_agree(self) -> None:
        cluster = self.table.cluster()
        assert cluster.epoch == self.table.epoch and cluster.worker == ME.id
        assert cluster.members == tuple(f.member() for f in self.table.members)
        stats = self.table.statistics()
        assert stats.members == len(self.table.members)
        assert stats.changes == self.table.epoch - 1
        assert stats.malformed == self.malformed
        assert (stats.left, stats.expired) == (self.left, self.expired)


MembershipMachine.TestCase.settings = settings(
    max_examples=examples(200), stateful_step_count=50, deadline=None
)
TestMembershipMachine = MembershipMachine.TestCase
