"""``broker sub --from WHERE --cursor NAME`` and offsets in its output:
what it refuses (a usage error, before connecting), what it sends (to the
fake broker of ``tests/client/fake_log_broker.py``, which says it keeps topic
logs), ``{offset}`` and ``"offset"``; and, against a real broker with a data
directory, replay and durable cursors end to end."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest
import trio

from broker.cli import build_parser
from broker.cli._output import FormatError, json_line, template_printer
from broker.cli._sub import start_value
from broker.client import Message
from tests.client.fake_log_broker import FIRST, Seen, fake_broker

from .helpers import TIMEOUT, broker_command, run, serving

UTC = datetime.UTC


# ---------------------------------------------------------------- reading --from and --cursor


def test_from_reads_each_kind_of_place() -> None:
    assert start_value("earliest") == "earliest"
    assert start_value("latest") == "latest"
    assert start_value("0") == 0 and start_value("1234") == 1234
    assert start_value("2026-11-25T10:00:00Z") == datetime.datetime(2026, 11, 25, 10, tzinfo=UTC)
    offset = datetime.timezone(datetime.timedelta(hours=1))
    assert start_value("2026-11-25T11:00:00+01:00") == datetime.datetime(
        2026, 11, 25, 11, tzinfo=offset
    )
    for text, seconds in [("-30s", 30), ("-10m", 600), ("-2h", 7200), ("-1h30m", 5400)]:
        before = datetime.datetime.now(UTC)
        when = start_value(text)
        assert isinstance(when, datetime.datetime)
        assert before - datetime.timedelta(seconds=seconds + 5) < when
        assert when <= before - datetime.timedelta(seconds=seconds) + datetime.timedelta(seconds=1)


def test_a_negative_duration_is_a_value_not_a_flag() -> None:
    for argv in (["sub", "t", "--from", "-10m"], ["sub", "t", "--from=-10m"]):
        args = build_parser().parse_args(argv)
        assert isinstance(args.start, datetime.datetime)
    args = build_parser().parse_args(["sub", "t", "--from", "7", "--cursor", "billing"])
    assert (args.start, args.cursor) == (7, "billing")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--from", "first"], "argument --from: expected earliest, latest, an offset, -N"),
        (["--from", "2026-11-25T10:00:00"], "has no timezone: add one, e.g. 2026-11-25T10:00:00Z"),
        (["--from", "10m"], "a duration back is negative: -10m"),
        (["--from", "-0"], "-N is the last N records, N at least 1"),
        (["--from", "1969-07-20T20:17:00Z"], "before 1970"),
        (["--cursor", "two words"], "argument --cursor: cursor names follow the topic-name rule"),
        (["--from", "earliest", "--mode", "lossy"], "--from and --cursor need --mode reliable"),
        (["--cursor", "c", "--mode", "latest"], "--from and --cursor need --mode reliable"),
    ],
)
def test_a_bad_place_is_a_usage_error(args: list[str], said: str) -> None:
    result = run("sub", "news", *args, "--broker", "127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert said in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- offsets in the output


def test_the_offset_placeholder_and_json_key() -> None:
    with_offset = Message("t", b"p", None, None, 7, 7)
    without = Message("t", b"p", None, None, 7)
    render = template_printer("{offset:>4}|{payload}")
    assert render(with_offset) == b"   7|p\n"
    assert render(without) == b"    |p\n"
    with pytest.raises(FormatError, match=r"\{offset\} is empty for a message without"):
        template_printer("{offset:d}")
    assert json.loads(json_line(with_offset))["offset"] == 7
    assert json.loads(json_line(without))["offset"] is None


# ---------------------------------------------------------------- what goes on the wire


async def sub_of(
    offsets: bool, *args: str, redeliver: tuple[int, ...] = ()
) -> tuple[subprocess.CompletedProcess[bytes], Seen]:
    """``broker sub t ARGS`` run to its end against the fake broker."""
    with trio.fail_after(TIMEOUT):
        async with fake_broker(offsets, redeliver) as (address, seen):
            command = [*broker_command("sub", "t", *args), "--broker", address]
            result = await trio.run_process(
                command, capture_stdout=True, capture_stderr=True, check=False
            )
    return result, seen


async def test_sub_sends_where_to_start_and_prints_offsets() -> None:
    args = ("--from", "earliest", "--cursor", "c", "--json", "--count", "2")
    result, seen = await sub_of(True, *args)
    assert result.returncode == 0, result.stderr
    assert seen.options == [{"from": "earliest", "cursor": "c"}]
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [line["offset"] for line in lines] == [FIRST, FIRST + 1]
    # What was printed is acknowledged (a cursor moves past it), and no more.
    assert max(ack.seq for ack in seen.acks) == FIRST + 1


async def test_sub_prints_no_record_twice_after_a_lost_session() -> None:
    """The connection breaks once the three printed are acknowledged; the
    broker no longer knows the session, and its cursor delivers them again
    with two more: those two are printed, and the count said on exit."""
    args = ("--cursor", "c", "--json", "--count", "5")
    result, seen = await sub_of(True, *args, redeliver=(5,))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [line["offset"] for line in lines] == list(range(FIRST, FIRST + 5))
    assert seen.options == [{"cursor": "c"}, {"cursor": "c", "from": FIRST + 3}]
    err = result.stderr.decode()
    assert err.splitlines()[-1] == (
        "broker sub: 5 message(s), 3 delivered again (not printed twice)"
    ), err


async def test_sub_of_a_broker_without_logs() -> None:
    result, seen = await sub_of(False, "--json", "--count", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["offset"] is None
    result, seen = await sub_of(False, "--from", "-10m")
    assert result.returncode == 1
    err = result.stderr.decode()
    assert err.splitlines()[-1].startswith("broker sub: the broker keeps no topic log"), err
    assert "Traceback" not in err
    assert seen.subscribes == []


# ---------------------------------------------------------------- end to end, with a topic log


def publish(address: str, *payloads: str) -> None:
    for payload in payloads:
        result = run("pub", "news", payload, "--broker", address)
        assert result.returncode == 0, result.stderr


def sub(address: str, *args: str) -> list[str]:
    result = run(
        "sub", "news", "--format", "{offset} {payload}", "--timeout", "5", *args,
        "--broker", address,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_replay_from_the_log_and_a_durable_cursor(tmp_path: Path) -> None:
    with serving("--data-dir", str(tmp_path)) as served:
        publish(served.address, "a", "b", "c")
        assert sub(served.address, "--from", "earliest", "--count", "3") == ["1 a", "2 b", "3 c"]
        assert sub(served.address, "--from", "2", "--count", "2") == ["2 b", "3 c"]
        assert sub(served.address, "--from", "-1h", "--count", "1") == ["1 a"]
        first = sub(served.address, "--cursor", "reader", "--from", "earliest", "--count", "2")
        assert first == ["1 a", "2 b"]
        assert sub(served.address, "--cursor", "reader", "--count", "1") == ["3 c"]


def test_a_memory_only_broker_refuses_a_start_in_one_line() -> None:
    with serving("--memory-only") as served:
        result = run("sub", "news", "--from", "earliest", "--broker", served.address)
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert "keeps no topic log" in last, last
    assert "Traceback" not in result.stderr
