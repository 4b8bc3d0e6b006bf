"""JetStream's and KV's JSON codecs, sans-IO: request bodies as the API
takes them, and answers captured from a real nats-server 2.15.1
(``captured.py``) parsed."""

from __future__ import annotations

import json

import pytest

from broker.nats import (
    ERR_NO_MESSAGE_FOUND,
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    AckInfo,
    ConsumerConfig,
    Headers,
    JetStreamError,
    Msg,
    StreamConfig,
    parse_ack_reply,
)
from broker.nats._jetstream import (
    check_bucket,
    check_key,
    consumer_create_request,
    get_request,
    kv_record,
    kv_stream_config,
    parse_api_response,
    parse_consumer_info,
    parse_pub_ack,
    parse_stored_msg,
    parse_stream_info,
    parse_time_ns,
    publish_headers,
    pull_request,
    purge_request,
)

from . import captured


def test_stream_config_round_trips_through_the_api_form() -> None:
    config = StreamConfig(
        "RUNS",
        ["runs.>"],
        num_replicas=3,
        max_msgs=10,
        max_bytes=1 << 20,
        max_age=3600.0,
        discard="new",
        duplicate_window=30.0,
        allow_direct=True,
        deny_delete=True,
    )
    body = json.loads(config.encode())
    assert body["max_age"] == 3600 * 10**9 and body["duplicate_window"] == 30 * 10**9
    assert body["num_replicas"] == 3 and body["allow_direct"] is True
    back = StreamConfig.from_json(body)
    assert back.to_json() == body
    assert (back.max_age, back.duplicate_window, back.discard) == (3600.0, 30.0, "new")


def test_publish_headers() -> None:
    assert publish_headers() is None
    base = Headers({"Run-First": "64"})
    headers = publish_headers(
        base, msg_id="r1", expected_last_seq=7, expected_last_subject_seq=0, expected_stream="S"
    )
    assert headers == Headers(
        {
            "Run-First": "64",
            "Nats-Msg-Id": "r1",
            "Nats-Expected-Stream": "S",
            "Nats-Expected-Last-Sequence": "7",
            "Nats-Expected-Last-Subject-Sequence": "0",
        }
    )
    assert base == Headers({"Run-First": "64"})  # (not changed)


def test_pull_request_bodies() -> None:
    assert json.loads(pull_request(64, max_bytes=1 << 20, expires=2.5, idle_heartbeat=0.5)) == {
        "batch": 64,
        "max_bytes": 1 << 20,
        "expires": 2_500_000_000,
        "idle_heartbeat": 500_000_000,
    }
    assert json.loads(pull_request(1, no_wait=True)) == {"batch": 1, "no_wait": True}
    with pytest.raises(ValueError):
        pull_request(0)


def test_get_and_purge_bodies() -> None:
    assert json.loads(get_request(seq=5)) == {"seq": 5}
    assert json.loads(get_request(last_by_subject="a.b")) == {"last_by_subj": "a.b"}
    with pytest.raises(ValueError):
        get_request()
    assert purge_request() == b""
    assert json.loads(purge_request("a.>", keep=3)) == {"filter": "a.>", "keep": 3}


def test_consumer_create_requests() -> None:
    ordered = ConsumerConfig(
        name="ord_1",
        deliver_policy="by_start_sequence",
        opt_start_seq=42,
        ack_policy="none",
        inactive_threshold=30.0,
        mem_storage=True,
        num_replicas=1,
    )
    subject, body = consumer_create_request("S", ordered)
    assert subject == "$JS.API.CONSUMER.CREATE.S.ord_1"
    assert json.loads(body) == {
        "stream_name": "S",
        "config": {
            "name": "ord_1",
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": 42,
            "ack_policy": "none",
            "replay_policy": "instant",
            "inactive_threshold": 30 * 10**9,
            "mem_storage": True,
            "num_replicas": 1,
        },
    }
    durable = ConsumerConfig(durable_name="d", ack_wait=10.0)
    subject, body = consumer_create_request("S", durable)
    assert subject == "$JS.API.CONSUMER.CREATE.S.d"
    assert json.loads(body)["config"]["ack_wait"] == 10 * 10**9


def test_ack_reply_subjects() -> None:
    assert parse_ack_reply("$JS.ACK.S.c.1.17.3.1765000000123456789.9") == AckInfo(
        "S", "c", 1, 17, 3, 1765000000123456789, 9
    )
    assert parse_ack_reply("$JS.ACK.hub.ACCHASH.S.c.2.17.3.1765000000123456789.9.tok") == AckInfo(
        "S", "c", 2, 17, 3, 1765000000123456789, 9, "hub"
    )
    no_domain = parse_ack_reply("$JS.ACK._.ACCHASH.S.c.2.17.3.1.0.tok")
    assert no_domain is not None and no_domain.domain == ""
    for other in ("", "_INBOX.x.1", "$JS.ACK.S.c.1.x.3.4.5", "$JS.ACK.S.c.1.2"):
        assert parse_ack_reply(other) is None


def test_times() -> None:
    assert parse_time_ns("1970-01-01T00:00:01.000000002Z") == 1_000_000_002
    assert parse_time_ns("2026-12-06T12:00:00Z") % 10**9 == 0
    assert parse_time_ns("1970-01-01T01:00:00.5+01:00") == 500_000_000
    with pytest.raises(ValueError):
        parse_time_ns("yesterday")


def test_kv_names_and_stream() -> None:
    assert check_key("a/b=c.d-e_f") == "a/b=c.d-e_f"
    for bad in ("", ".a", "a.", "a b", "a*", "a>"):
        with pytest.raises(ValueError):
            check_key(bad)
    with pytest.raises(ValueError):
        check_bucket("a.b")
    config = kv_stream_config("sessions", history=5, replicas=3)
    assert config.name == "KV_sessions" and config.subjects == ["$KV.sessions.>"]
    assert config.max_msgs_per_subject == 5 and config.num_replicas == 3
    assert config.allow_direct and config.allow_rollup_hdrs and config.deny_delete
    assert config.discard == "new"


# ------------------------------------------------------------ captured answers


def test_a_stream_create_answer() -> None:
    info = parse_stream_info(captured.STREAM_CREATE)
    assert info.config.name == "S" and info.config.subjects == ["s.>"]
    assert info.config.duplicate_window == 120.0 and info.config.allow_direct
    assert info.state.messages == 0 and info.created


def test_a_stream_info_answer() -> None:
    info = parse_stream_info(captured.STREAM_INFO)
    assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (1, 1, 1)


def test_a_missing_stream() -> None:
    with pytest.raises(JetStreamError) as caught:
        parse_stream_info(captured.STREAM_INFO_MISSING)
    assert (caught.value.code, caught.value.err_code) == (404, ERR_STREAM_NOT_FOUND)
    assert str(caught.value) == "JetStream refused: stream not found (code 404, err_code 10059)"


def test_pub_acks() -> None:
    ack = parse_pub_ack(captured.PUB_ACK)
    assert (ack.stream, ack.seq, ack.duplicate) == ("S", 1, False)
    again = parse_pub_ack(captured.PUB_ACK_DUPLICATE)
    assert (again.seq, again.duplicate) == (1, True)
    with pytest.raises(JetStreamError) as caught:
        parse_pub_ack(captured.PUB_WRONG_LAST)
    assert caught.value.err_code == ERR_WRONG_LAST_SEQUENCE
    assert "wrong last sequence" in caught.value.description


def test_stored_messages() -> None:
    through_leader = parse_stored_msg(Msg("_INBOX.x.1", 1, "", captured.MSG_GET))
    direct = parse_stored_msg(
        Msg("_INBOX.x.2", 1, "", captured.DIRECT_GET, captured.DIRECT_GET_HEADERS)
    )
    assert through_leader is not None and direct is not None
    for stored in (through_leader, direct):
        assert (stored.subject, stored.seq, stored.payload) == ("s.a", 1, b"hello")
        assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == "one"
        assert stored.headers["Run-First"] == "7"
    assert through_leader.time_ns == direct.time_ns > 0
    assert parse_stored_msg(Msg("_INBOX.x.3", 1, "", captured.MSG_GET_MISSING)) is None
    missing = Msg("_INBOX.x.4", 1, "", b"", captured.DIRECT_GET_MISSING_HEADERS)
    assert parse_stored_msg(missing) is None
    with pytest.raises(JetStreamError) as caught:
        parse_api_response(captured.MSG_GET_MISSING)
    assert caught.value.err_code == ERR_NO_MESSAGE_FOUND
    record = kv_record("b", direct)
    assert record.operation == "PUT" and record.revision == 1


def test_a_consumer_create_answer_and_deliveries() -> None:
    info = parse_consumer_info(captured.CONSUMER_CREATE)
    assert (info.stream, info.name, info.num_pending) == ("S", "c", 1)
    first = parse_ack_reply(captured.PULL_REPLY_0)
    assert first is not None
    assert (first.stream, first.consumer, first.stream_seq, first.consumer_seq) == ("S", "c", 1, 1)
    assert first.pending == 0 and first.delivered == 1 and first.time_ns > 0
    assert captured.PULL_END_HEADERS.status == 408


def test_purge_and_delete_answers() -> None:
    assert parse_api_response(captured.PURGE) == {
        **parse_api_response(captured.PURGE),
        "success": True,
        "purged": 1,
    }
    assert parse_api_response(captured.DELETE)["success"] is True
