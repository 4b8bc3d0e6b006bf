"""``broker sub``: refusing a count below 1, several topics, --format,
--show-keys and --json (parseable whatever the payload), --timeout, the
delivery modes, and Ctrl-C."""

from __future__ import annotations

import base64
import json

import pytest

from broker.cli._output import FormatError, escape, json_line, template_printer
from broker.client import BlockingClient, Message

from .helpers import TIMEOUT, Served, Subscriber, interrupt, run

BINARY = b"\xff\x00bin"
MULTILINE = b"line one\nline\ttwo\\"


@pytest.mark.parametrize("count", ["0", "-1", "x"])
def test_a_count_below_one_is_refused(count: str) -> None:
    """Before: ``--count 0`` and ``--count -1`` subscribed forever."""
    result = run("sub", "news", "--count", count, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert "argument -c/--count:" in result.stderr
    assert "Traceback" not in result.stderr


def publish(served: Served, topic: str, *args: str, stdin: bytes | None = None) -> None:
    result = run("pub", topic, *args, "--broker", served.address, stdin=stdin)
    assert result.returncode == 0, result.stderr


def test_several_topics_in_one_subscriber_formatted(served: Served) -> None:
    subscriber = Subscriber(
        "news",
        "alerts",
        "--format",
        r"{topic}\t{seq}\t{key}\t{headers}\t{size}\t{payload}",
        "--count",
        "4",
        "--broker",
        served.address,
    )
    try:
        publish(served, "news", "hello", "--key", "k", "-H", "h=v", "-H", "i=w")
        publish(served, "alerts", "-s", stdin=MULTILINE)
        publish(served, "alerts", "--file", "/dev/null")
        publish(served, "news", "-s", stdin=BINARY)
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    lines = sorted(out.decode().splitlines())  # topics interleave as they arrive
    assert lines == [
        "alerts\t1\t\t\t18\tline one\\nline\\ttwo\\\\",
        "alerts\t2\t\t\t0\t",
        "news\t1\tk\th=v,i=w\t5\thello",
        "news\t2\t\t\t5\t\\xff\\x00bin",
    ]


def test_show_keys_has_a_key_column_on_every_line(served: Served) -> None:
    """Before: the key and its tab were printed only for keyed messages."""
    subscriber = Subscriber("news", "--show-keys", "--count", "3", "--broker", served.address)
    try:
        publish(served, "news", "keyed", "--key", "k")
        publish(served, "news", "keyless")
        publish(served, "news", "-s", "--key", "a\tb", stdin=b"x\ty\n")
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    rows = [line.split("\t") for line in out.decode().splitlines()]
    assert rows == [["k", "keyed"], ["", "keyless"], ["a\\tb", "x\\ty\\n"]]


def test_json_lines_give_text_or_base64(served: Served) -> None:
    subscriber = Subscriber("news", "--json", "--count", "2", "--broker", served.address)
    try:
        publish(served, "news", "-s", "-k", "k", "-H", "n=v", stdin=MULTILINE)
        publish(served, "news", "-s", "-k", "k", stdin=BINARY)
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    first, second = (json.loads(line) for line in out.decode().splitlines())
    assert first == {
        "topic": "news",
        "seq": 1,
        "offset": None,  # (a broker without topic logs)
        "key": "k",
        "headers": [["n", "v"]],
        "payload": MULTILINE.decode(),
        "encoding": "utf-8",
    }
    assert second["encoding"] == "base64"
    assert base64.b64decode(second["payload"]) == BINARY
    assert base64.b64decode(second["key"]) == b"k"


def test_timeout_ends_a_quiet_subscription_and_says_so(served: Served) -> None:
    subscriber = Subscriber("news", "--timeout", "0.5", "--broker", served.address)
    try:
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    assert out == b""
    assert err == "broker sub: nothing for 0.5 s: stopping after 0 message(s)\n"


def test_timeout_counts_from_the_last_message(served: Served) -> None:
    # Each message comes right after the previous one was printed (in far
    # less than the timeout); the silence after the last one ends it.
    subscriber = Subscriber("news", "--timeout", "3", "--broker", served.address)
    try:
        assert subscriber.process.stdout is not None
        with BlockingClient(served.address) as client:
            for number in range(3):
                client.publish("news", b"%d" % number)
                client.flush()
                assert subscriber.process.stdout.readline() == b"%d\n" % number
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    assert out == b""
    assert err == "broker sub: nothing for 3 s: stopping after 3 message(s)\n"


@pytest.mark.parametrize("mode", ["lossy", "latest"])
def test_dropping_modes_take_their_queue_limits(served: Served, mode: str) -> None:
    subscriber = Subscriber(
        "prices",
        "--mode",
        mode,
        "--max-queued",
        "7",
        "--max-queued-bytes",
        "4096",
        "--count",
        "1",
        "--broker",
        served.address,
    )
    try:
        (connection,) = [c for c in served.stat()["connections"] if c["client"] == "broker-sub"]
        (subscription,) = connection["subscriptions"]
        publish(served, "prices", "42")
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    assert out == b"42\n"
    assert subscription["mode"] == mode
    assert (subscription["max_queued"], subscription["max_queued_bytes"]) == (7, 4096)


def test_queue_limits_need_a_dropping_mode() -> None:
    result = run("sub", "news", "--max-queued", "5", "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert "--max-queued and --max-queued-bytes need --mode lossy or latest" in result.stderr


def test_ctrl_c_ends_cleanly_saying_how_many_arrived(served: Served) -> None:
    subscriber = Subscriber("news", "--broker", served.address)
    try:
        publish(served, "news", "one")
        assert subscriber.process.stdout is not None
        assert subscriber.process.stdout.readline() == b"one\n"
        interrupt(subscriber.process)
        status, rest, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 130
    assert rest == b""
    assert err == "broker sub: interrupted: 1 message(s)\n"


def test_a_reader_that_goes_away_ends_it_quietly(served: Served) -> None:
    subscriber = Subscriber("news", "--broker", served.address)
    try:
        assert subscriber.process.stdout is not None
        subscriber.process.stdout.close()  # as `broker sub news | head -1` does
        publish(served, "news", "one")
        publish(served, "news", "two")
        status = subscriber.process.wait(TIMEOUT)
        assert subscriber.process.stderr is not None
        err = subscriber.process.stderr.read().decode()
    finally:
        subscriber.kill()
    assert status == 0
    assert err == ""


# ---------------------------------------------------------------- formatting


def unescape(text: str) -> bytes:
    """The bytes ``escape`` was given (its escapes undone)."""
    singles = {"\\": b"\\", "t": b"\t", "n": b"\n", "r": b"\r"}
    data, position = bytearray(), 0
    while position < len(text):
        char = text[position]
        if char != "\\":
            data += char.encode()
            position += 1
        elif text[position + 1] == "x":
            data.append(int(text[position + 2 : position + 4], 16))
            position += 4
        else:
            data += singles[text[position + 1]]
            position += 2
    return bytes(data)


def test_escape_keeps_one_line_and_is_reversible() -> None:
    assert escape(b"plain text \xc3\xa9") == "plain text \u00e9"
    assert escape(b"a\\b\tc\nd\re\x00f\x7f\xff") == "a\\\\b\\tc\\nd\\re\\x00f\\x7f\\xff"
    for data in (b"a\\b\tc\nd\re\x00f\x7f\xff", "\u00e9\\x41".encode(), bytes(range(256))):
        text = escape(data)
        assert "\n" not in text and "\t" not in text and "\r" not in text
        assert unescape(text) == data


def test_templates_name_only_known_placeholders() -> None:
    message = Message("t", b"p", b"k", [("h", b"v")], 3)
    assert template_printer("{seq:>4} {topic}/{key}={payload} [{headers}]")(message) == (
        b"   3 t/k=p [h=v]\n"
    )
    with pytest.raises(FormatError, match=r"unknown placeholder \{value\}"):
        template_printer("{value}")
    with pytest.raises(FormatError, match=r"unknown placeholder \{\}"):
        template_printer("{}")
    with pytest.raises(FormatError, match="malformed template"):
        template_printer("{payload")


def test_a_bad_format_is_a_usage_error() -> None:
    result = run("sub", "news", "--format", "{nope}", "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert "--format: unknown placeholder {nope}" in result.stderr


def test_json_line_uses_one_encoding_for_every_bytes_field() -> None:
    text = json.loads(json_line(Message("t", b"p", None, None, 1)))
    assert text == {
        "topic": "t",
        "seq": 1,
        "offset": None,
        "key": None,
        "headers": [],
        "payload": "p",
        "encoding": "utf-8",
    }
    binary = json.loads(json_line(Message("t", b"p", b"k", [("h", b"\xff")], 1)))
    assert binary["encoding"] == "base64"
    assert (binary["payload"], binary["key"], binary["headers"]) == (
        "cA==",
        "aw==",
        [["h", "/w=="]],
    )


def test_an_option_the_broker_refuses_is_one_line(served: Served) -> None:
    result = run(
        "sub", "news", "--mode", "lossy", "--max-queued", "5000000", "--broker", served.address
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "broker sub: goodbye 1: Subscribe: max_queued must be an integer in 1..1000000"
    )
    assert "Traceback" not in result.stderr


def test_an_mqtt_wildcard_is_refused_with_the_pattern_to_write() -> None:
    """``broker sub 'sensors/#'`` once subscribed to a topic of that very
    name and said nothing: a Mosquitto user waited for sensors/x in vain.
    Now patterns exist, an MQTT wildcard is refused with its NATS-style form."""
    result = run("sub", "sensors/#", "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "broker sub: 'sensors/#' is an MQTT wildcard: patterns here are NATS-style, over "
        "'.'-separated tokens ('*' one token, a last '>' one or more): write 'sensors.>'"
    ]
