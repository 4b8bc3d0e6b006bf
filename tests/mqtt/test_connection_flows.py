"""A state machine test of the connection's QoS 1 and 2 flows both ways:
a model client and application drive it in any order, across restored
sessions, and the packet-id bookkeeping matches the model's."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.mqtt import (
    MQTT_5,
    Connect,
    ConnectionClosed,
    Packet,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ServerConnection,
    SessionState,
    encode_packet,
)
from tests.hypothesis_profiles import examples

CLIENT_RECEIVE_MAXIMUM = 3


class Flows(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.session = SessionState()
        self.conn = self._connect(None)
        # Inbound (client to server): packet id -> stage.
        self.inbound: dict[int, str] = {}
        # Outbound (server to client): packet id -> "ack1" | "rec2" | "comp2".
        self.outbound: dict[int, str] = {}

    def _connect(self, session: SessionState | None) -> ServerConnection:
        conn = ServerConnection(receive_maximum=4)
        props = Properties(receive_maximum=CLIENT_RECEIVE_MAXIMUM)
        conn.receive_data(encode_packet(Connect("m", properties=props), MQTT_5))
        assert isinstance(conn.next_event(0.0), Connect)
        conn.connack(session_present=session is not None, session=session)
        conn.data_to_send()
        return conn

    def _feed(self, packet: Packet) -> list[object]:
        self.conn.receive_data(encode_packet(packet, MQTT_5))
        events: list[object] = list(self.conn.events(0.0))
        assert not any(isinstance(event, ConnectionClosed) for event in events), events
        self.conn.data_to_send()
        return events

    def _in(self, stage: str) -> list[int]:
        return sorted(pid for pid, now in self.inbound.items() if now == stage)

    def _out(self, stage: str) -> list[int]:
        return sorted(pid for pid, now in self.outbound.items() if now == stage)

    # -- the client sends ----------------------------------------------------

    @precondition(lambda self: len(self.inbound) < 4)
    @rule(pid=st.integers(1, 6), qos=st.integers(1, 2))
    def client_publishes(self, pid: int, qos: int) -> None:
        if pid in self.inbound:
            return
        events = self._feed(Publish("t", b"m", qos, packet_id=pid))
        assert [type(e) for e in events] == [Publish]
        self.inbound[pid] = "app_ack" if qos == 1 else "app_rec"

    @precondition(lambda self: bool(self._in("rec")))
    @rule(data=st.data())
    def client_resends_a_received_qos2(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._in("rec")))
        assert self._feed(Publish("t", b"m", 2, dup=True, packet_id=pid)) == []

    @precondition(lambda self: bool(self._in("rec")))
    @rule(data=st.data())
    def client_releases(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._in("rec")))
        assert self._feed(PubRel(pid)) == [PubRel(pid)]
        self.inbound[pid] = "app_comp"

    @precondition(lambda self: bool(self._out("ack1")))
    @rule(data=st.data())
    def client_acks_qos1(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._out("ack1")))
        assert self._feed(PubAck(pid)) == [PubAck(pid)]
        del self.outbound[pid]

    @precondition(lambda self: bool(self._out("rec2")))
    @rule(data=st.data())
    def client_receives_qos2(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._out("rec2")))
        assert self._feed(PubRec(pid)) == [PubRec(pid)]
        self.conn.pubrel(pid)
        self.outbound[pid] = "comp2"

    @precondition(lambda self: bool(self._out("comp2")))
    @rule(data=st.data())
    def client_completes_qos2(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._out("comp2")))
        assert self._feed(PubComp(pid)) == [PubComp(pid)]
        del self.outbound[pid]

    # -- the application answers ----------------------------------------------

    @precondition(lambda self: bool(self._in("app_ack") + self._in("app_rec")))
    @rule(data=st.data())
    def app_acknowledges(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._in("app_ack") + self._in("app_rec")))
        if self.inbound[pid] == "app_ack":
            self.conn.puback(pid)
            del self.inbound[pid]
        else:
            self.conn.pubrec(pid)
            self.inbound[pid] = "rec"

    @precondition(lambda self: bool(self._in("app_comp")))
    @rule(data=st.data())
    def app_completes(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(self._in("app_comp")))
        self.conn.pubcomp(pid)
        del self.inbound[pid]

    @precondition(lambda self: len(self.outbound) < CLIENT_RECEIVE_MAXIMUM)
    @rule(qos=st.integers(1, 2))
    def app_publishes(self, qos: int) -> None:
        pid = self.conn.publish("out", b"x", qos)
        assert pid is not None and pid not in self.outbound
        self.outbound[pid] = "ack1" if qos == 1 else "rec2"

    @rule()
    def the_client_reconnects(self) -> None:
        """The session goes to a new connection (as across a restart): QoS 2
        ids awaiting PUBREL and unacknowledged outbound flows are kept; what
        the application had not answered, the client sends again as new."""
        state = self.conn.session_state()
        self.conn = self._connect(state)
        self.inbound = {
            pid: "rec" for pid, stage in self.inbound.items() if stage in ("rec", "app_comp")
        }
        for pid in self._out("ack1") + self._out("rec2"):
            self.conn.publish("out", b"x", state.outbound_unacked[pid], packet_id=pid)
        for pid in self._out("comp2"):
            self.conn.pubrel(pid)
        self.conn.data_to_send()

    # -- what must hold ------------------------------------------------------

    @invariant()
    def the_bookkeeping_matches(self) -> None:
        state = self.conn.session_state()
        assert state.inbound_qos2 == {
            pid for pid, stage in self.inbound.items() if stage in ("rec", "app_comp")
        }
        assert state.outbound_unacked == {
            pid: 1 if stage == "ack1" else 2
            for pid, stage in self.outbound.items()
            if stage != "comp2"
        }
        assert state.outbound_released == set(self._out("comp2"))
        assert self.conn.send_quota == CLIENT_RECEIVE_MAXIMUM - len(self.outbound)


Flows.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40)
test_flows = Flows.TestCase
