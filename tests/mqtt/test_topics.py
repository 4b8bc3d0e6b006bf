"""MQTT topic rules, matching, $share, and the mapping to broker topics:
every broker name and pattern maps to MQTT and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt import (
    BrokerFilter,
    ReasonCode,
    SharedSubscription,
    TopicError,
    broker_topic_filter,
    broker_topic_name,
    mqtt_topic_filter,
    mqtt_topic_name,
    parse_shared,
    topic_filter_problem,
    topic_matches,
    topic_name_problem,
)
from broker.protocol import TopicPattern, is_topic_pattern, topic_pattern_error
from broker.protocol import topic_name_problem as broker_name_problem

_CHARS = st.sampled_from([*"ab.%/+#*>$é2", "%2B", "%25", "%23", "%2F"])
broker_names = (
    st.lists(_CHARS, min_size=1, max_size=12)
    .map("".join)
    .filter(lambda name: broker_name_problem(name) is None)
)
_TOKENS = st.sampled_from(["a", "b/c", "%", "+", "#", "x%2B", "é", "$s"])
broker_patterns = (
    st.lists(st.sampled_from(["*"]) | _TOKENS, min_size=1, max_size=5)
    .flatmap(lambda tokens: st.sampled_from([tokens, [*tokens, ">"]]))
    .map(".".join)
    .filter(lambda pattern: topic_pattern_error(pattern) is None)
)


@given(broker_names)
def test_every_broker_name_maps_to_mqtt_and_back(name: str) -> None:
    mqtt = mqtt_topic_name(name)
    assert topic_name_problem(mqtt) is None
    assert broker_topic_name(mqtt) == name


@given(broker_patterns)
def test_every_broker_pattern_maps_to_an_mqtt_filter_and_back(pattern: str) -> None:
    mqtt = mqtt_topic_filter(pattern)
    assert topic_filter_problem(mqtt) is None
    assert broker_topic_filter(mqtt).topics == (pattern,)


@given(st.text(max_size=20))
def test_mapping_any_mqtt_name_is_exact_or_refused(name: str) -> None:
    try:
        mapped = broker_topic_name(name)
    except TopicError as error:
        assert error.reason is ReasonCode.TOPIC_NAME_INVALID
    else:
        assert mqtt_topic_name(mapped) == name


@given(st.text(alphabet="ab/+#.%2B", max_size=12))
def test_mapping_any_mqtt_filter_is_exact_or_refused(topic_filter: str) -> None:
    try:
        result = broker_topic_filter(topic_filter)
    except TopicError as error:
        assert error.reason is ReasonCode.TOPIC_FILTER_INVALID
        return
    # The broker topics match what the filter matches, on sample names.
    for name in ("a", "a/b", "a/b/c", "b", "a/a", "ab/b", "a.b/b"):
        try:
            broker = broker_topic_name(name)
        except TopicError:
            continue
        hit = any(_matches(topic, broker) for topic in result.topics)
        assert hit == topic_matches(topic_filter, name), (topic_filter, name, result)


def _matches(topic: str, name: str) -> bool:
    """Whether a broker topic name or pattern matches a broker name."""
    return TopicPattern(topic).matches(name) if is_topic_pattern(topic) else topic == name


def test_the_mapping_table() -> None:
    assert mqtt_topic_name("orders.eu/1") == "orders/eu.1"
    assert broker_topic_name("sensors/192.168.0.1/temp") == "sensors.192/168/0/1.temp"
    assert mqtt_topic_name("a.b+c#%") == "a/b%2Bc%23%25"
    assert broker_topic_filter("a/#") == BrokerFilter(("a", "a.>"), False)
    assert broker_topic_filter("#") == BrokerFilter((">",), True)
    assert broker_topic_filter("a/+/#") == BrokerFilter(("a.>",), False)
    assert broker_topic_filter("+/x/#") == BrokerFilter(("*.x", "*.x.>"), True)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a%41", "a % starting no escape"),
        ("a b", "a space"),
        ("x" * 256, "longer than the broker's 255 bytes"),
        ("e\u0301", "not NFC"),
        ("a/+", "a wildcard"),
        ("", "empty"),
    ],
)
def test_mqtt_names_without_a_broker_name_are_refused(name: str, why: str) -> None:
    with pytest.raises(TopicError) as caught:
        broker_topic_name(name)
    assert caught.value.reason is ReasonCode.TOPIC_NAME_INVALID, why


@pytest.mark.parametrize(
    ("topic_filter", "why"),
    [
        ("a//+", "an empty level beside a wildcard"),
        ("a*/+", "a * inside a level beside a wildcard"),
        ("x/*", "reads as a broker pattern"),
        ("a/#/b", "# not last"),
        ("a+/b", "+ inside a level"),
        ("$share/g/a", "a shared filter is parsed first"),
    ],
)
def test_filters_without_broker_topics_are_refused(topic_filter: str, why: str) -> None:
    with pytest.raises(TopicError) as caught:
        broker_topic_filter(topic_filter)
    assert caught.value.reason is ReasonCode.TOPIC_FILTER_INVALID, why


def test_matching_follows_mqtt() -> None:
    assert topic_matches("a/#", "a")
    assert topic_matches("a/#", "a/b/c")
    assert topic_matches("a/+/c", "a//c")
    assert not topic_matches("a/+", "a/b/c")
    assert not topic_matches("#", "$SYS/x")
    assert not topic_matches("+/x", "$SYS/x")
    assert topic_matches("$SYS/#", "$SYS/x")


def test_shared_subscriptions() -> None:
    assert parse_shared("$share/g/a/+") == SharedSubscription("g", "a/+")
    assert parse_shared("a/b") is None
    for bad in ("$share/g", "$share//a", "$share/g+/a", "$share/g/"):
        with pytest.raises(TopicError):
            parse_shared(bad)
        assert topic_filter_problem(bad) is not None
