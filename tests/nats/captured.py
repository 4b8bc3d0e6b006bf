"""Answers of a real nats-server 2.15.1 (one server, JetStream), captured with
the trio client for the codec tests: payloads as they came, and the headers
of the answers that carry them."""

from __future__ import annotations

from broker.nats import Headers

STREAM_CREATE = (
    b'{"type":"io.nats.jetstream.api.v1.stream_create_response","config":{"n'
    b'ame":"S","subjects":["s.\\u003e"],"retention":"limits","max_consumers":'
    b'-1,"max_msgs":-1,"max_bytes":-1,"max_age":0,"max_msgs_per_subject":-1,'
    b'"max_msg_size":-1,"discard":"old","storage":"file","num_replicas":1,"d'
    b'uplicate_window":120000000000,"compression":"none","allow_direct":true'
    b',"mirror_direct":false,"sealed":false,"deny_delete":false,"deny_purge"'
    b':false,"allow_rollup_hdrs":false,"consumer_limits":{},"allow_msg_ttl":'
    b'false,"metadata":{"_nats.level":"5","_nats.req.level":"0","_nats.ver":'
    b'"2.15.1"}},"created":"2026-12-06T12:35:29.99799119Z","state":{"message'
    b's":0,"bytes":0,"first_seq":0,"first_ts":"0001-01-01T00:00:00Z","last_s'
    b'eq":0,"last_ts":"0001-01-01T00:00:00Z","consumer_count":0},"ts":"2026-'
    b'12-06T12:35:30.00148525Z","did_create":true}'
)
PUB_ACK = b'{"stream":"S","seq":1}'
PUB_ACK_DUPLICATE = b'{"stream":"S","seq":1,"duplicate": true}'
PUB_WRONG_LAST = (
    b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequen'
    b'ce: 1"},"stream":"S","seq":0}'
)
STREAM_INFO = (
    b'{"type":"io.nats.jetstream.api.v1.stream_info_response","total":0,"off'
    b'set":0,"limit":0,"config":{"name":"S","subjects":["s.\\u003e"],"retenti'
    b'on":"limits","max_consumers":-1,"max_msgs":-1,"max_bytes":-1,"max_age"'
    b':0,"max_msgs_per_subject":-1,"max_msg_size":-1,"discard":"old","storag'
    b'e":"file","num_replicas":1,"duplicate_window":120000000000,"compressio'
    b'n":"none","allow_direct":true,"mirror_direct":false,"sealed":false,"de'
    b'ny_delete":false,"deny_purge":false,"allow_rollup_hdrs":false,"consume'
    b'r_limits":{},"allow_msg_ttl":false,"metadata":{"_nats.level":"5","_nat'
    b's.req.level":"0","_nats.ver":"2.15.1"}},"created":"2026-12-06T12:35:29'
    b'.99799119Z","state":{"messages":1,"bytes":86,"first_seq":1,"first_ts":'
    b'"2026-12-06T12:35:30.003064167Z","last_seq":1,"last_ts":"2026-12-06T12'
    b':35:30.003064167Z","num_subjects":1,"consumer_count":0},"cluster":{"le'
    b'ader":"NDVJV45WTZNG553QYCHNHMVJLY4T43NNVW7TMEVZOASLRYBPOFXFXBFP"},"ts"'
    b':"2026-12-06T12:35:30.006425157Z"}'
)
STREAM_INFO_MISSING = (
    b'{"type":"io.nats.jetstream.api.v1.stream_info_response","error":{"code'
    b'":404,"err_code":10059,"description":"stream not found"},"total":0,"of'
    b'fset":0,"limit":0}'
)
MSG_GET = (
    b'{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{'
    b'"subject":"s.a","seq":1,"hdrs":"TkFUUy8xLjANCk5hdHMtTXNnLUlkOiBvbmUNCl'
    b'J1bi1GaXJzdDogNw0KDQo=","data":"aGVsbG8=","time":"2026-12-06T12:35:30.'
    b'003064167Z"}}'
)
MSG_GET_MISSING = (
    b'{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"c'
    b'ode":404,"err_code":10037,"description":"no message found"}}'
)
DIRECT_GET = b"hello"
DIRECT_GET_HEADERS = Headers(
    [
        ("Nats-Msg-Id", "one"),
        ("Run-First", "7"),
        ("Nats-Stream", "S"),
        ("Nats-Subject", "s.a"),
        ("Nats-Sequence", "1"),
        ("Nats-Time-Stamp", "2026-12-06T12:35:30.003064167Z"),
    ],
    status=None,
    description="",
)
DIRECT_GET_MISSING = b""
DIRECT_GET_MISSING_HEADERS = Headers([], status=404, description="Message Not Found")
CONSUMER_CREATE = (
    b'{"type":"io.nats.jetstream.api.v1.consumer_create_response","stream_na'
    b'me":"S","name":"c","created":"2026-12-06T12:35:30.012530497Z","config"'
    b':{"durable_name":"c","name":"c","deliver_policy":"all","ack_policy":"n'
    b'one","max_deliver":-1,"replay_policy":"instant","max_waiting":512,"num'
    b'_replicas":0,"metadata":{"_nats.level":"5","_nats.req.level":"0","_nat'
    b's.ver":"2.15.1"}},"delivered":{"consumer_seq":0,"stream_seq":0},"ack_f'
    b'loor":{"consumer_seq":0,"stream_seq":0},"num_ack_pending":0,"num_redel'
    b'ivered":0,"num_waiting":0,"num_pending":1,"ts":"2026-12-06T12:35:30.01'
    b'551487Z"}'
)
PURGE = b'{"type":"io.nats.jetstream.api.v1.stream_purge_response","success":true,"purged":1}'
DELETE = b'{"type":"io.nats.jetstream.api.v1.stream_delete_response","success":true}'
PULL_REPLY_0 = "$JS.ACK.S.c.1.1.1.1796560530003064167.0"
PULL_REPLY_0_HEADERS = Headers(
    [("Nats-Msg-Id", "one"), ("Run-First", "7")], status=None, description=""
)
PULL_END_HEADERS = Headers(
    [("Nats-Pending-Messages", "1"), ("Nats-Pending-Bytes", "0")],
    status=408,
    description="Request Timeout",
)
