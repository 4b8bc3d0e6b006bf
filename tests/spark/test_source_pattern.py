"""The source's ``subscribePattern`` is a topic pattern with the broker's
rules (``*`` one token, a last ``>`` one or more), not Kafka's regex; a
value that looks like a regex is refused with a hint. Option parsing only:
no Spark session needed."""

from __future__ import annotations

import pytest

from broker.protocol import PATTERN_RULE
from broker.spark._source_options import SourceError, SourceOptions

#: Option parsing only: no Spark session, not slow (see conftest).
NEEDS_JVM = False

NAMES = ["orders", "orders.eu", "orders.us", "orders.eu.x", "ordersx.eu", "x.orders.eu"]
HINT = r"write orders\..* as orders.> and orders\.[^.]+ as orders.*"


def wanted(pattern: str) -> list[str]:
    options = SourceOptions.parse(
        {"broker.servers": "127.0.0.1:7400", "subscribepattern": pattern}, streaming=True
    )
    return options.wanted(dict.fromkeys(NAMES, (1, 1)))


def refusal(pattern: str) -> str:
    with pytest.raises(SourceError) as raised:
        wanted(pattern)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith('option "subscribePattern": ')
    return message


def test_a_star_matches_exactly_one_token() -> None:
    assert wanted("orders.*") == ["orders.eu", "orders.us"]  # not orders.eu.x, not orders
    assert wanted("*.eu") == ["orders.eu", "ordersx.eu"]


def test_a_last_greater_than_matches_one_or_more_tokens() -> None:
    assert wanted("orders.>") == ["orders.eu", "orders.eu.x", "orders.us"]  # not orders
    assert wanted(">") == sorted(NAMES)


def test_a_pattern_without_wildcards_matches_its_one_name() -> None:
    assert wanted("orders.eu") == ["orders.eu"]


@pytest.mark.parametrize(
    "regex", [r"orders\..*", r"orders\.[^.]+", ".*", "^orders$", r"orders\.(eu|us)"]
)
def test_a_regular_expression_is_refused_with_a_hint(regex: str) -> None:
    message = refusal(regex)
    assert PATTERN_RULE in message
    assert HINT in message


def test_alternatives_are_pointed_to_subscribe() -> None:
    assert refusal("orders|payments").endswith(
        'name alternatives (a|b) in option "subscribe" (a,b)'
    )


@pytest.mark.parametrize("pattern", ["orders..eu", "a..b", ".orders", "orders."])
def test_an_empty_token_is_refused_naming_the_rule(pattern: str) -> None:
    message = refusal(pattern)
    assert "empty token" in message
    assert PATTERN_RULE in message
    assert HINT not in message  # not a regex: no hint


@pytest.mark.parametrize(
    ("pattern", "says"),
    [("orders.>.eu", "'>' must be the pattern's last token"), ("orders*", "whole token")],
)
def test_misplaced_wildcards_are_refused_naming_the_rule(pattern: str, says: str) -> None:
    message = refusal(pattern)
    assert says in message
    assert PATTERN_RULE in message
