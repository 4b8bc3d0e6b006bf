"""The ``broker`` command and the packages' import surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.cli import main


def run_broker(*args: str) -> subprocess.CompletedProcess[str]:
    # (A generous deadline: `bench broker --quick` takes about a minute alone,
    # and the suite may run beside another one.)
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_three_packages_import() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import accounts, actors, broker; print(broker.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_help_lists_the_commands() -> None:
    result = run_broker("--help")
    assert result.returncode == 0
    assert "serve" in result.stdout
    assert "bench" in result.stdout


def test_serve_refuses_an_unknown_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--set", "no_such_budget=1"]) == 2
    assert "unknown setting 'no_such_budget'" in capsys.readouterr().err


def test_a_misspelt_setting_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The environment path had one; ``--set`` and the config file said only
    "unknown setting"."""
    assert main(["serve", "--set", "conection_budget=5"]) == 2
    assert capsys.readouterr().err == (
        "broker serve: flags: unknown setting 'conection_budget'"
        " (did you mean 'connection_budget'?)\n"
    )
    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nconection_budget = 5\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "(did you mean 'connection_budget'?)" in capsys.readouterr().err


def test_serve_refuses_inconsistent_watermarks(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["serve", "--set", "channel_low_watermark=9999999999"])
    assert status == 2
    assert "channel_low_watermark" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error() -> None:
    result = run_broker("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_bench_actors_reports_rates_as_json() -> None:
    result = run_broker("bench", "actors", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["actors"]
    for key in ("task_to_actor_per_s", "actor_to_actor_per_s", "fanout_1_to_10_per_s"):
        assert figures[key] > 1000, figures


def test_bench_protocol_reports_codec_and_connection_rates() -> None:
    result = run_broker("bench", "protocol", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["protocol"]
    assert figures["payload_bytes"] == 100
    for key in (
        "encode_publish_per_s",
        "decode_publish_per_s",
        "encode_deliver_fanout_per_s",
        "connection_publish_per_s",
    ):
        assert figures[key] > 1000, figures


@pytest.mark.slow
def test_bench_broker_runs_every_workload_and_loses_nothing() -> None:
    result = run_broker("bench", "broker", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["broker"]
    assert figures["throughput_subscribers_call"] == "receive_batch"
    for key in (
        "one_to_one_msgs_per_s",
        "fanout_1_to_10_deliveries_per_s",
        "fanout_receive_each_deliveries_per_s",
    ):
        assert figures[key] > 1000, figures
    for key in ("one_to_one_lost", "fanout_lost", "fanout_receive_each_lost", "slow_lost"):
        assert figures[key] == 0, figures
    assert figures["fanout_subscriber_processes"] >= 1
    assert figures["slow_received"] == figures["slow_published"] > 0
    # Per message at everyday rates (issue 22): the loop counters were read.
    for rate in (100, 1000, 10000):
        assert figures[f"rate_{rate}_received"] == rate * 3, figures
        assert figures[f"rate_{rate}_task_steps_per_msg"] > 0, figures
        assert figures[f"rate_{rate}_broker_cpu_us_per_msg"] >= 0, figures


async def test_pub_reads_stdin_lines_across_chunk_boundaries() -> None:
    from broker.cli._pub import _lines

    def trickle(data: bytes) -> Callable[[int], bytes]:
        """A read function that hands out 3 bytes at a time."""
        rest = [data]

        def read(size: int) -> bytes:
            chunk, rest[0] = rest[0][:3], rest[0][3:]
            return chunk

        return read

    got = [line async for line in _lines(trickle(b"one\ntwo\n\nlast-no-newline"))]
    assert got == [b"one", b"two", b"", b"last-no-newline"]
    assert [line async for line in _lines(trickle(b"a\nb\n"))] == [b"a", b"b"]


def test_bench_without_a_suite_means_every_suite_and_refuses_an_unknown_one() -> None:
    """Python 3.11's argparse refused ``broker bench`` with no suite
    (``invalid choice: []``)."""
    from broker.cli import build_parser

    assert build_parser().parse_args(["bench", "--quick"]).suites == []
    assert build_parser().parse_args(["bench", "actors", "broker"]).suites == ["actors", "broker"]
    result = run_broker("bench", "nope")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "broker bench: unknown suite 'nope' "
        "(choose from actors, protocol, broker, peers, mqtt, groups, patterns, workers, cluster)"
    )


def test_every_suite_reports_the_yardstick_beside_its_figures() -> None:
    """Figures from different machines compare only with the machine's speed
    beside them: each suite reports ``python_loop_10m_s``."""
    result = run_broker("bench", "actors", "protocol", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for suite in ("actors", "protocol"):
        assert figures[suite]["python_loop_10m_s"] > 0, figures[suite]


def test_the_entry_point_imports_no_command_before_main_runs() -> None:
    """A Ctrl-C while the commands load (trio, cbor2: a second or so on a
    busy machine) used to print a KeyboardInterrupt traceback: the console
    script imported them all before ``main`` could answer it. They load
    inside ``main`` now, whose Ctrl-C is one exit status (130)."""
    check = (
        "import sys, broker.cli\n"
        "heavy = sorted(m for m in ('trio', 'cbor2', 'broker.cli._serve') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_several_tasks_losing_one_connection_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`broker sub a b c` whose broker went silent: each topic's task raised
    ConnectionLost, and the command printed a 60-line ExceptionGroup."""
    import trio
    import trio.lowlevel

    from broker.cli._common import run_interruptibly
    from broker.client import ConnectionLost

    async def body(interrupt: object) -> None:
        async def lose() -> None:
            await trio.lowlevel.checkpoint()
            raise ConnectionLost("the broker went silent (lease expired)")

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lose)

    _, status = run_interruptibly("sub", body)
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        "broker sub: the broker went silent (lease expired)"
    ]


@pytest.mark.parametrize(
    ("env", "flags", "level"),
    [("warning", [], "30"), ("warning", ["--log-level", "error"], "40"), ("", [], "20")],
)
def test_the_log_level_comes_from_the_flag_or_broker_log_level(
    env: str, flags: list[str], level: str
) -> None:
    """``BROKER_LOG_LEVEL`` (what a container sets) used to be ignored in
    silence; it is the level unless ``--log-level`` says otherwise."""
    check = (
        "import logging; from broker.cli import main; "
        f"main([*{flags!r}, 'serve', '--set', 'no_such_setting=1']); "
        "print(logging.getLogger().level)"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BROKER_LOG_LEVEL": env},
    )
    assert result.stdout.strip() == level, result.stderr


def test_a_bad_broker_log_level_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker", "serve"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BROKER_LOG_LEVEL": "loud"},
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "broker: error: BROKER_LOG_LEVEL: 'LOUD' is not a logging level"
        " (choose from DEBUG, INFO, WARNING, ERROR)"
    )
