"""The Spark source's options, offsets and planning (no Spark needed:
``broker.spark._source_options`` imports no pyspark)."""

from __future__ import annotations

import re

import pytest

from broker.spark._source_options import (
    EARLIEST,
    LATEST,
    SourceError,
    SourceOptions,
    limit_ranges,
    offset_map,
    plan,
    positions,
    resolve,
    split,
)

BASE = {"broker.servers": "127.0.0.1:7400"}

#: Option parsing only: no Spark session, not slow (see conftest).
NEEDS_JVM = False


def parse(streaming: bool = False, **options: str) -> SourceOptions:
    return SourceOptions.parse(
        {**BASE, **{k.lower(): v for k, v in options.items()}}, streaming=streaming
    )


def test_defaults_follow_kafka() -> None:
    batch = parse(subscribe="a, b")
    assert batch.topics == ("a", "b")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.fail_on_data_loss is True
    assert parse(True, subscribe="a").starting == "latest"  # a stream's default
    assert parse(True, subscribe="a", maxOffsetsPerTrigger="5").max_per_trigger == 5


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({}, "exactly one of"),
        ({"subscribe": "a", "subscribePattern": "a.*"}, "exactly one of"),
        ({"subscribe": " , "}, "lists no topic"),
        ({"subscribe": "bad topic"}, '"subscribe"'),
        ({"subscribePattern": "("}, "looks like a regular expression"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "not for batch"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "not for batch"),
        ({"subscribe": "a", "startingOffsets": "soon"}, "must be"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"1": 3}}'}, 'one partition, "0"'),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "-2 (earliest)"),
        ({"subscribe": "a,b", "startingOffsets": '{"a": {"0": 3}}'}, "no offset for ['b']"),
        (
            {"subscribe": "a", "startingOffsets": '{"a": {"0": 5}, "zzz": {"0": 1}}'},
            "names ['zzz'], which the query does not read (it reads ['a'])",
        ),
        (
            {"subscribe": "a", "endingOffsets": '{"a": {"0": 5}, "b": {"0": 1}}'},
            "\"endingOffsets\" names ['b']",
        ),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"subscribe": "a", "minPartitions": "0"}, "at least 1"),
        ({"subscribe": "a", "broker.unknown": "1"}, "unknown source option"),
        ({"subscribe": "a", "assign": "x"}, "unknown source option"),
    ],
)
def test_bad_options_say_what_to_change(options: dict[str, str], words: str) -> None:
    with pytest.raises(SourceError, match=re.escape(words)):
        parse(**options)


def test_a_stream_has_no_ending_offsets() -> None:
    with pytest.raises(SourceError, match="a stream has no end"):
        parse(True, subscribe="a", endingOffsets="latest")


def test_offsets_resolve_like_kafkas() -> None:
    json_bound = parse(subscribe="a", startingOffsets='{"a": {"0": 7}}').starting
    assert resolve(json_bound, "a", 3, 10) == 7
    assert resolve({"a": EARLIEST}, "a", 3, 10) == 3
    assert resolve({"a": LATEST}, "a", 3, 10) == 10
    assert resolve({"a": 0}, "a", 3, 10) == 1  # 0 means the first record, as "from" does
    assert resolve({}, "new", 3, 10) == 3  # a topic a pattern found later: earliest
    assert resolve("latest", "a", 3, 10) == 10
    assert positions(offset_map({"b": 2, "a": 5})) == {"a": 5, "b": 2}
    assert offset_map({"a": 5}) == {"a": {"0": 5}}


def test_a_pattern_matches_whole_names() -> None:
    options = parse(subscribePattern="events.>")
    assert options.wanted({"events.a": 0, "xevents.b": 0, "events.b": 0}) == [
        "events.a",
        "events.b",
    ]
    assert parse(subscribe="b,z").wanted({"a": 0, "b": 0}) == ["b"]


def test_ranges_are_split_into_tasks() -> None:
    assert split(1, 11, 3) == [(1, 4), (4, 7), (7, 11)]
    assert split(5, 5, 3) == []
    assert split(1, 3, 5) == [(1, 2), (2, 3)]
    assert plan({"a": (1, 11), "b": (4, 4)}, None) == [("a", 1, 11)]
    pieces = plan({"a": (1, 301), "b": (1, 101)}, 4)
    assert [p for p in pieces if p[0] == "a"] == [("a", 1, 101), ("a", 101, 201), ("a", 201, 301)]
    assert [p for p in pieces if p[0] == "b"] == [("b", 1, 101)]
    big = plan({"a": (1, 450_001)}, None)
    assert len(big) == 3 and big[0] == ("a", 1, 150_001) and big[-1][2] == 450_001


def test_max_offsets_per_trigger_is_shared_in_proportion() -> None:
    assert limit_ranges({"a": 1}, {"a": 100}, None) == {"a": 100}
    assert limit_ranges({"a": 1, "b": 1}, {"a": 301, "b": 101}, 40) == {"a": 31, "b": 11}
    assert limit_ranges({"a": 1}, {"a": 5, "b": 9}, 100) == {"a": 5, "b": 9}
    # Every topic with records waiting moves on by one at least.
    assert limit_ranges({"a": 1, "b": 1}, {"a": 10_001, "b": 2}, 10) == {"a": 10, "b": 2}


def test_sink_headers_take_a_null_value_as_empty_and_refuse_a_null_element() -> None:
    """A null header value is published as an empty one (the broker's header
    values are bytes; docs/spark.md says so); a null element or key used to
    fail the task with a bare "'NoneType' object is not subscriptable"."""
    from broker.spark._writer import _header

    assert _header(("h", None)) == ("h", b"")
    assert _header(("h", bytearray(b"v"))) == ("h", b"v")
    for bad in (None, (None, b"v")):
        with pytest.raises(ValueError, match='null element or a null key in its "headers"'):
            _header(bad)
