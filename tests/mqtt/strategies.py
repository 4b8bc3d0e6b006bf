"""Hypothesis strategies for MQTT packets of either version."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from broker.mqtt import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from broker.mqtt._codes import REASONS_ALLOWED, V3_CONNACK_CODES
from broker.mqtt._properties import _SPECS, WILL, _Kind

texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
names = texts.filter(bool)
packet_ids = st.integers(1, 0xFFFF)
payloads = st.binary(max_size=40)

_VALUES: dict[_Kind, st.SearchStrategy[Any]] = {
    _Kind.FLAG: st.integers(0, 1),
    _Kind.BYTE: st.integers(0, 255),
    _Kind.U16: st.integers(0, 0xFFFF),
    _Kind.U32: st.integers(0, 0xFFFF_FFFF),
    _Kind.VARINT: st.integers(1, 268_435_455),
    _Kind.STRING: texts,
    _Kind.BINARY: st.binary(max_size=12),
    _Kind.PAIR: st.tuples(texts, texts),
}


@st.composite
def properties(draw: st.DrawFn, packet: PacketType | None) -> Properties:
    """Any valid properties for ``packet`` (a packet type, or WILL)."""
    values: dict[str, Any] = {}
    for spec in _SPECS.values():
        if packet not in spec.packets or not draw(st.booleans()):
            continue
        value = _VALUES[spec.kind]
        if spec.nonzero and spec.kind is not _Kind.VARINT:
            value = value.filter(bool)
        if spec.field == "user_properties":
            values[spec.field] = tuple(draw(st.lists(value, max_size=3)))
        elif spec.field == "subscription_identifiers":
            count = 3 if packet is PacketType.PUBLISH else 1
            values[spec.field] = tuple(draw(st.lists(value, min_size=1, max_size=count)))
        else:
            values[spec.field] = draw(value)
    return Properties(**values)


def _props(version: int, packet: PacketType | None) -> st.SearchStrategy[Properties]:
    return properties(packet) if version == MQTT_5 else st.just(Properties())


def _reason(version: int, packet: PacketType) -> st.SearchStrategy[ReasonCode]:
    if version == MQTT_5:
        return st.sampled_from(sorted(REASONS_ALLOWED[packet]))
    return st.just(ReasonCode.SUCCESS)


@st.composite
def packets(draw: st.DrawFn, version: int) -> Packet:
    """Any packet of either direction that ``version`` (4 or 5) can carry."""
    T = PacketType
    kinds = [kind for kind in T if version == MQTT_5 or kind is not T.AUTH]
    kind = draw(st.sampled_from(kinds))
    props = draw(_props(version, kind))
    if kind is T.CONNECT:
        will = None
        if draw(st.booleans()):
            will = Will(
                draw(names),
                draw(payloads),
                draw(st.integers(0, 2)),
                draw(st.booleans()),
                draw(_props(version, WILL)),
            )
        username = draw(st.none() | texts)
        password = draw(st.none() | st.binary(max_size=8))
        if version != MQTT_5 and username is None:
            password = None
        return Connect(
            draw(texts),
            version,
            draw(st.booleans()),
            draw(st.integers(0, 0xFFFF)),
            username,
            password,
            will,
            props,
        )
    if kind is T.CONNACK:
        if version == MQTT_5:
            reason = draw(_reason(version, kind))
        else:
            reason = draw(st.sampled_from(sorted(set(V3_CONNACK_CODES.values()))))
        present = draw(st.booleans()) and not reason
        return ConnAck(reason, present, props)
    if kind is T.PUBLISH:
        qos = draw(st.integers(0, 2))
        return Publish(
            draw(names),
            draw(payloads),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(packet_ids) if qos else None,
            props,
        )
    if kind in (T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP):
        ack = {T.PUBACK: PubAck, T.PUBREC: PubRec, T.PUBREL: PubRel, T.PUBCOMP: PubComp}[kind]
        return ack(draw(packet_ids), draw(_reason(version, kind)), props)
    if kind is T.SUBSCRIBE:
        v5 = version == MQTT_5
        subs = st.builds(
            Subscription,
            names,
            st.integers(0, 2),
            st.booleans() if v5 else st.just(False),
            st.booleans() if v5 else st.just(False),
            st.integers(0, 2) if v5 else st.just(0),
        )
        return Subscribe(
            draw(packet_ids), tuple(draw(st.lists(subs, min_size=1, max_size=4))), props
        )
    if kind is T.SUBACK:
        codes = (
            _reason(version, kind)
            if version == MQTT_5
            else st.sampled_from([ReasonCode(c) for c in (0, 1, 2, 0x80)])
        )
        return SubAck(draw(packet_ids), tuple(draw(st.lists(codes, max_size=4))), props)
    if kind is T.UNSUBSCRIBE:
        filters = tuple(draw(st.lists(names, min_size=1, max_size=4)))
        return Unsubscribe(draw(packet_ids), filters, props)
    if kind is T.UNSUBACK:
        reasons = draw(st.lists(_reason(version, kind), max_size=4)) if version == MQTT_5 else []
        return UnsubAck(draw(packet_ids), tuple(reasons), props)
    if kind is T.PINGREQ:
        return PingReq()
    if kind is T.PINGRESP:
        return PingResp()
    if kind is T.DISCONNECT:
        return Disconnect(draw(_reason(version, kind)), props)
    return Auth(draw(_reason(version, kind)), props)
