"""The topic log's settings: ``data_dir``, ``memory_only`` (file, environment,
flags) and the ``[[topics]]`` tables (first match wins, defaults otherwise),
each bad value refused in one line naming the key and what it allows."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.config import (
    DEFAULT_TOPIC_RULE,
    BrokerConfig,
    ConfigError,
    GiB,
    MiB,
    TopicRule,
    load_config,
)
from broker.log import LogConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text, encoding="utf-8")
    return path


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), environ={})
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- data_dir, memory_only


def test_the_library_default_is_memory_only() -> None:
    config = BrokerConfig()
    assert (config.data_dir, config.memory_only, config.topics) == ("", False, ())
    assert config.log_dir is None


def test_log_dir_is_data_dir_unless_memory_only(tmp_path: Path) -> None:
    assert BrokerConfig(data_dir=str(tmp_path)).log_dir == tmp_path
    assert BrokerConfig(data_dir=str(tmp_path), memory_only=True).log_dir is None
    assert BrokerConfig(data_dir="~/logs").log_dir == Path.home() / "logs"


def test_data_dir_and_memory_only_from_the_file(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, '[broker]\ndata_dir = "/var/lib/broker"\nmemory_only = true\n'),
        environ={},
    )
    assert (config.data_dir, config.memory_only) == ("/var/lib/broker", True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        *[("1", True), ("true", True), ("Yes", True), ("on", True)],
        *[("0", False), ("false", False), ("no", False), ("OFF", False), ("", False)],
    ],
)
def test_memory_only_from_the_environment(text: str, expected: bool) -> None:
    config = load_config(environ={"BROKER_MEMORY_ONLY": text, "BROKER_DATA_DIR": "/d"})
    assert config.memory_only is expected
    assert config.data_dir == "/d"
    assert config.log_dir == (None if expected else Path("/d"))


def test_a_memory_only_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"memory_only: expected true or false .*'maybe'"):
        load_config(environ={"BROKER_MEMORY_ONLY": "maybe"})
    with pytest.raises(ConfigError, match="memory_only: expected true or false"):
        load_config(environ={}, overrides={"memory_only": 1})


def test_the_environment_wins_over_the_file_and_flags_over_both(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\ndata_dir = "/from/file"\n')
    assert load_config(path, environ={}).data_dir == "/from/file"
    assert load_config(path, environ={"BROKER_DATA_DIR": "/env"}).data_dir == "/env"
    flagged = load_config(
        path, environ={"BROKER_DATA_DIR": "/env"}, overrides={"data_dir": "/flag"}
    )
    assert flagged.data_dir == "/flag"


def test_a_data_dir_that_is_not_text_is_refused(tmp_path: Path) -> None:
    assert "data_dir: expected str" in refusal(tmp_path, "[broker]\ndata_dir = 5\n")


# ---------------------------------------------------------------- [[topics]]

TOPICS = """
[broker]
listen = "127.0.0.1:7400"

[[topics]]
pattern = "metrics.*"
retain_bytes = 1_000_000
retain_seconds = 3600
when_full = "drop-oldest"
term_bytes = 262144

[[topics]]
pattern = "orders"
flush = "always"
flush_interval_ms = 0

[[topics]]
pattern = "*"
retain_seconds = 0
"""


def test_the_first_matching_table_wins(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TOPICS), environ={})
    assert [rule.pattern for rule in config.topics] == ["metrics.*", "orders", "*"]
    assert config.log_config("metrics.cpu") == LogConfig(
        term_bytes=262144,
        retain_bytes=1_000_000,
        retain_seconds=3600.0,
        when_full="drop-oldest",
        flush="batch",
        flush_interval_ms=1000,
    )
    orders = config.log_config("orders")
    assert (orders.flush, orders.flush_interval_ms, orders.when_full) == ("always", 0, "block")
    # The catch-all's retain_seconds = 0: no age limit; the rest the defaults.
    other = config.log_config("orders.eu")
    assert (other.retain_seconds, other.retain_bytes) == (None, 1 * GiB)
    assert config.topic_rule("metrics") is config.topics[2]


def test_patterns_are_case_sensitive_globs() -> None:
    config = BrokerConfig(topics=(TopicRule("a.[xy]?"), TopicRule("B*", flush="always")))
    assert config.topic_rule("a.x1") is config.topics[0]
    assert config.topic_rule("a.z1") is DEFAULT_TOPIC_RULE
    assert config.topic_rule("b.1") is DEFAULT_TOPIC_RULE
    assert config.topic_rule("B.1").flush == "always"


def test_without_a_matching_table_the_defaults_apply() -> None:
    expected = LogConfig(
        term_bytes=16 * MiB,
        retain_bytes=1 * GiB,
        retain_seconds=7 * 24 * 3600.0,
        when_full="block",
        flush="batch",
        flush_interval_ms=1000,
    )
    assert BrokerConfig().log_config("anything") == expected
    only_metrics = BrokerConfig(topics=[TopicRule("metrics.*", retain_bytes=0)])  # type: ignore[arg-type]
    assert only_metrics.topics == (TopicRule("metrics.*", retain_bytes=0),)  # a tuple
    assert only_metrics.log_config("news") == expected
    assert only_metrics.log_config("metrics.x").retain_bytes is None  # 0: no size limit


def test_topics_inside_the_broker_table_or_a_file_without_one(tmp_path: Path) -> None:
    nested = load_config(
        write(tmp_path, '[broker]\n[[broker.topics]]\npattern = "a*"\n'), environ={}
    )
    top_level = load_config(
        write(tmp_path, 'lease = 20.0\n[[topics]]\npattern = "a*"\n'), environ={}
    )
    assert nested.topics == top_level.topics == (TopicRule("a*"),)
    assert top_level.lease == 20.0
    both = '[broker]\n[[broker.topics]]\npattern = "a"\n[[topics]]\npattern = "b"\n'
    assert "use one" in refusal(tmp_path, both)


@pytest.mark.parametrize(
    "text",
    [
        "max_connections = 5\n[broker]\nlease = 20.0\n",  # written above [broker]
        "[broker]\nlease = 20.0\n[brokr]\nmax_connections = 5\n",  # a misspelt table
    ],
)
def test_settings_outside_the_broker_table_are_refused(tmp_path: Path, text: str) -> None:
    """A file with a [broker] table used to ignore everything outside it in
    silence (max_connections = 5 above it: the broker started with 10,000)."""
    message = refusal(tmp_path, text)
    assert "outside the [broker] table" in message, message
    assert "'max_connections'" in message or "'brokr'" in message


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('when_full = "drop"', 'when_full must be "block" or "drop-oldest", got \'drop\''),
        ('flush = "never"', 'flush must be "batch" or "always", got \'never\''),
        ("retain_bytes = -1", "retain_bytes must be >= 0 (0: no size limit)"),
        ("retain_seconds = -5", "retain_seconds must be a finite number >= 0 (0: no time limit)"),
        ("retain_seconds = nan", "retain_seconds must be a finite number >= 0"),
        ("retain_seconds = inf", "retain_seconds must be a finite number >= 0"),
        ("flush_interval_ms = -1", "flush_interval_ms must be >= 0"),
        ("term_bytes = 100", "term_bytes must be 4096 to 4294967295"),
        ('retain_bytes = "1GiB"', "retain_bytes must be an integer, got '1GiB'"),
        ("retain_seconds = true", "retain_seconds must be a number, got True"),
        ("retain = 5", "unknown key 'retain' (allowed: pattern, retain_bytes, retain_seconds, "),
    ],
)
def test_a_bad_topics_table_is_refused_naming_the_key(
    tmp_path: Path, table: str, says: str
) -> None:
    message = refusal(tmp_path, f'[broker]\n[[topics]]\npattern = "x.*"\n{table}\n')
    assert message.startswith(f"config {tmp_path / 'broker.toml'}: [[topics]]"), message
    assert says in message, message
    if "unknown" not in says:
        assert "pattern 'x.*'" in message


def test_a_table_without_pattern_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, '[[topics]]\npattern = "a"\n[[topics]]\nretain_bytes = 5\n')
    assert "[[topics]] #2 needs a pattern" in message
    assert 'pattern = "metrics.*"' in message
    assert "non-empty" in refusal(tmp_path, '[[topics]]\npattern = ""\n')


@pytest.mark.parametrize(
    ("pattern", "says"),
    [("a b", "U+0020 (a space, Zs)"), ("cafe\u0301.*", "not in Unicode NFC form")],
)
def test_a_pattern_no_topic_name_can_match_is_refused(
    tmp_path: Path, pattern: str, says: str
) -> None:
    """It was accepted, and its settings silently applied to no topic."""
    message = refusal(tmp_path, f'[[topics]]\npattern = "{pattern}"\n')
    assert f"[[topics]] pattern {pattern!r}: topic pattern" in message, message
    assert says in message, message


def test_topics_that_are_not_tables_are_refused(tmp_path: Path) -> None:
    assert "[[topics]] tables" in refusal(tmp_path, 'topics = ["a*"]\n')
    assert "[[topics]] tables" in refusal(tmp_path, '[topics]\npattern = "a*"\n')


def test_topics_are_not_a_flat_setting() -> None:
    with pytest.raises(ConfigError, match=r"\[\[topics\]\] tables of a config file"):
        load_config(environ={}, overrides={"topics": "a*"})
    # BROKER_TOPICS is not one of the broker's variables (ignored, like BROKER_TOKEN).
    assert load_config(environ={"BROKER_TOPICS": "x"}).topics == ()


def test_a_term_must_hold_the_largest_message() -> None:
    with pytest.raises(ConfigError, match=r"term_bytes of \[\[topics\]\] pattern 'small' \(8192\)"):
        BrokerConfig(topics=(TopicRule("small", term_bytes=8192),), max_frame=65536)
    with pytest.raises(ConfigError) as raised:
        BrokerConfig(
            max_frame=100 * MiB,
            publish_capacity=101 * MiB,
            connection_budget=1 << 30,
            global_budget=1 << 31,
        )
    assert str(raised.value) == (
        "term_bytes of topics without a [[topics]] table (16777216, the default) must hold "
        "the largest message: at least max_frame + 64 (104857664): set it in a [[topics]] "
        'table (pattern = "*" for every topic)'
    )
    BrokerConfig(topics=(TopicRule("small", term_bytes=8192),), max_frame=4096)
    # A memory-only broker keeps no log: its terms are no concern ("--memory-only
    # --set max_frame=16777216" was refused for them).
    BrokerConfig(memory_only=True, max_frame=100 * MiB, publish_capacity=101 * MiB,
                 connection_budget=1 << 30, global_budget=1 << 31)  # fmt: skip


def test_raising_max_frame_is_one_setting(caplog: pytest.LogCaptureFixture) -> None:
    """It took three refusals: publish_capacity, then connection_budget
    (which said no number), then global_budget; they now follow a
    max_frame set alone, and a budget set too is checked as it is."""
    config = load_config(environ={}, overrides={"max_frame": 8 * MiB, "memory_only": True})
    assert config.publish_capacity == 8 * MiB + 64
    assert config.connection_budget == 2 * config.bind_capacity + 8 * MiB + 64
    assert load_config(environ={}, overrides={"max_frame": 4096}).publish_capacity == 256 * 1024
    with pytest.raises(ConfigError) as raised:
        load_config(
            environ={},
            overrides={"max_frame": 8 * MiB, "memory_only": True, "connection_budget": MiB},
        )
    assert str(raised.value) == (
        "connection_budget (1048576) must fund both bind channels and one publish channel: "
        "at least 2 x bind_capacity + max_frame + 64 (8421440)"
    )


def test_a_value_of_the_wrong_type_says_where_it_came_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(environ={"BROKER_MAX_FRAME": "abc"})
    assert str(raised.value) == "max_frame: expected int, got 'abc' (set by BROKER_MAX_FRAME)"
    path = write(tmp_path, '[broker]\nmax_frame = "big"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"max_frame: expected int, got 'big' (set by config {path})"


def test_replace_keeps_the_topics() -> None:
    config = BrokerConfig(topics=(TopicRule("a"),), data_dir="/d")
    assert config.replace(listen="127.0.0.1:1").topics == (TopicRule("a"),)
    with pytest.raises(ConfigError, match="expected TopicRule"):
        BrokerConfig(topics=("a*",))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["heartbeat", "shutdown_deadline", "hello_timeout", "staging_ttl"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_time_that_is_not_a_finite_number_is_refused(name: str, value: str) -> None:
    """NaN passed every check (each comparison is false) and failed later,
    in every connection ("deadline must not be NaN")."""
    with pytest.raises(ConfigError, match=f"{name}: expected a finite number"):
        load_config(environ={f"BROKER_{name.upper()}": value})
    with pytest.raises(ConfigError, match=f"{name}: expected a finite number"):
        load_config(environ={}, overrides={name: float(value)})


def test_an_environment_variable_that_is_no_setting_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A misspelt BROKER_ name used to be ignored in silence; it is still
    not an error, but it is said with the setting meant. Names that are no
    likely misspelling belong to other software (Celery's BROKER_URL, a CI's
    BROKER_REQUIRE_TOOLS) and are not said: a warning at every start for
    them would be noise (and broke every one-line refusal's test under CI)."""
    with caplog.at_level(logging.WARNING, logger="broker"):
        config = load_config(
            environ={
                "BROKER_LISTN": "0.0.0.0:1",
                "BROKER_TOKEN": "t",
                "BROKER_MAX_FRAME": "70000",
                "BROKER_URL": "amqp://",
                "BROKER_REQUIRE_TOOLS": "1",
            }
        )
    assert config.max_frame == 70000
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        "ignoring the environment variable BROKER_LISTN: no such setting"
        " (did you mean BROKER_LISTEN?)"
    ]


def test_names_after_other_servers_habits_say_the_setting_they_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``BROKER_PORT`` or ``BROKER_METRICS_PORT`` are no misspelling that
    difflib finds, and used to be ignored in silence: each now says the
    setting it most likely means. ``BROKER_LOG_LEVEL`` is read by the
    command (not a setting) and not warned about."""
    with caplog.at_level(logging.WARNING, logger="broker"):
        load_config(
            environ={
                "BROKER_PORT": "7000",
                "BROKER_METRICS_PORT": "9000",
                "BROKER_DATA": "/var/lib/broker",
                "BROKER_LOG_LEVEL": "debug",
            }
        )
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring the environment variable BROKER_{name}: no such setting"
        f" (did you mean BROKER_{meant}?)"
        for name, meant in (
            ("DATA", "DATA_DIR"),
            ("METRICS_PORT", "METRICS_LISTEN"),
            ("PORT", "LISTEN"),
        )
    ]


def test_a_refused_value_names_its_setting_and_where_it_came_from(tmp_path: Path) -> None:
    """Several settings used to share one message ("max_unsent >= 64 KiB,
    max_connections >= 1, deadline >= 0": which one, and "deadline" is no
    setting), and a value from the environment did not say so."""
    with pytest.raises(ConfigError) as raised:
        load_config(environ={"BROKER_MAX_CONNECTIONS": "0"})
    assert str(raised.value) == (
        "max_connections must be >= 1, got 0 (set by BROKER_MAX_CONNECTIONS)"
    )
    path = write(tmp_path, "[broker]\nshutdown_deadline = -1.0\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"shutdown_deadline must be >= 0, got -1.0 (set by config {path})"
    with pytest.raises(ConfigError) as raised:
        load_config(environ={}, overrides={"max_unsent": 10})
    assert str(raised.value) == "max_unsent must be >= 64 KiB (65536), got 10"
