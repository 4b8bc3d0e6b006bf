"""merge_expositions: real expositions of prometheus_client registries merged
into one, parsed back with prometheus_client's parser."""

from __future__ import annotations

import re
from collections import Counter as Tally

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from broker.workers import WorkerInfo, merge_expositions
from broker.workers._merge import parse_exposition, write_exposition

#: Label values that need escaping in the text format, and one that does not.
AWKWARD = ('quote " here', "back\\slash", "new\nline", "plain")


def registry(scale: int, *, extra: bool = False) -> CollectorRegistry:
    """A registry with a labelled counter, a gauge, a labelled histogram
    (each with ``_created`` samples where prometheus_client adds them), an
    info, an enum and a summary; ``extra``: one more family the others lack."""
    reg = CollectorRegistry()
    requests = Counter("broker_test_requests", "Requests.", ["path"], registry=reg)
    for index, value in enumerate(AWKWARD):
        requests.labels(path=value).inc(scale * (index + 1))
    Gauge("broker_test_depth", "Depth.\nSecond line \\ too.", registry=reg).set(scale * 0.5)
    latency = Histogram(
        "broker_test_latency_seconds", "Latency.", ["kind"], buckets=(0.1, 1.0), registry=reg
    )
    latency.labels(kind='a"b').observe(0.05 * scale)
    latency.labels(kind="c").observe(2.0)
    Info("broker_test_build", "Build.", registry=reg).info({"version": f"1.{scale}"})
    Enum("broker_test_state", "State.", states=["on", "off"], registry=reg).state("off")
    Summary("broker_test_size_bytes", "Sizes.", registry=reg).observe(10 * scale)
    if extra:
        Gauge("broker_test_only_here", "Only one worker has it.", ["worker"], registry=reg).labels(
            worker="spoofed"
        ).set(7)
    return reg


def text(reg: CollectorRegistry) -> str:
    return generate_latest(reg).decode("utf-8")


def samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"duplicate series {key}"
            found[key] = sample.value
    return found


def info(worker: str, *, up: bool = True, restarts: int = 0) -> WorkerInfo:
    return WorkerInfo(worker, 100, up, restarts, "127.0.0.1:7400", ("127.0.0.1", 9400))


def test_the_writer_writes_what_generate_latest_writes() -> None:
    """Parsed and written back, an exposition is the same bytes (its labels
    were sorted by generate_latest, and the writer keeps their order)."""
    for reg in (registry(1), registry(3, extra=True)):
        original = text(reg)
        assert "_created" in original  # the OpenMetrics samples are covered
        assert write_exposition(parse_exposition(original)) == original


def test_every_sample_of_every_worker_is_there_with_its_worker_label() -> None:
    texts = {"w0": text(registry(1)), "w1": text(registry(2, extra=True))}
    merged = merge_expositions(texts)
    found = samples(merged)
    expected = 0
    for worker, exposition in texts.items():
        for (name, labels), value in samples(exposition).items():
            mine = {k: v for k, v in labels if k != "worker"}
            key = (name, frozenset({**mine, "worker": worker}.items()))
            assert found[key] == value, key
            expected += 1
    assert len(found) == expected
    # The worker's own `worker` label gave way to the worker's id.
    assert found["broker_test_only_here", frozenset({("worker", "w1")})] == 7
    # The escaped label values came back intact.
    for value in AWKWARD:
        key = frozenset({("worker", "w0"), ("path", value)})
        assert found["broker_test_requests_total", key] == 1 + AWKWARD.index(value)


def test_each_family_once_contiguous_with_worker_first() -> None:
    texts = {"w0": text(registry(1)), "w1": text(registry(2, extra=True))}
    merged = merge_expositions(texts, [info("w0"), info("w1")])
    types = Tally(line.split()[2] for line in merged.splitlines() if line.startswith("# TYPE "))
    helps = Tally(line.split()[2] for line in merged.splitlines() if line.startswith("# HELP "))
    assert types and max(types.values()) == 1
    assert helps == types
    names = [family.name for family in text_string_to_metric_families(merged)]
    # The parser starts a new family at a sample of another: a family split
    # in two would be named twice.
    assert len(names) == len(set(names))
    assert "broker_test_only_here" in names
    labelled = [line for line in merged.splitlines() if "{" in line and not line.startswith("#")]
    assert labelled
    for line in labelled:
        assert re.match(r'^[a-zA-Z_:][a-zA-Z0-9_:]*\{worker="w[01]"', line), line
    histogram = next(
        f for f in text_string_to_metric_families(merged) if f.name == "broker_test_latency_seconds"
    )
    assert histogram.type == "histogram"
    assert {s.labels["worker"] for s in histogram.samples} == {"w0", "w1"}


def test_the_supervisor_families() -> None:
    texts = {"w0": text(registry(1)), "w1": "this is not an exposition {"}
    workers = [info("w0", restarts=2), info("w1"), info("w2", up=False, restarts=5)]
    found = samples(merge_expositions(texts, workers))
    assert found["broker_workers", frozenset()] == 3
    up = {w: found["broker_worker_up", frozenset({("worker", w)})] for w in ("w0", "w1", "w2")}
    assert up == {"w0": 1, "w1": 0, "w2": 0}  # w1's text did not parse: as if silent
    restarts = "broker_worker_restarts_total"
    assert found[restarts, frozenset({("worker", "w0")})] == 2
    assert found[restarts, frozenset({("worker", "w2")})] == 5
    assert not any(
        dict(labels).get("worker") == "w1"
        for name, labels in found
        if name != restarts and name != "broker_worker_up"
    )


def test_no_worker_answered() -> None:
    found = samples(merge_expositions({}, [info("w0")]))
    assert found == {
        ("broker_workers", frozenset()): 1,
        ("broker_worker_up", frozenset({("worker", "w0")})): 0,
        ("broker_worker_restarts_total", frozenset({("worker", "w0")})): 0,
    }
    assert merge_expositions({}) == ""


def test_a_family_of_another_type_under_a_known_name_is_left_out() -> None:
    counter = "# HELP x_total X.\n# TYPE x_total counter\nx_total 1.0\n"
    gauge = "# HELP x_total X.\n# TYPE x_total gauge\nx_total 2.0\n"
    found = samples(merge_expositions({"a": counter, "b": gauge}))
    assert found == {("x_total", frozenset({("worker", "a")})): 1.0}


def test_a_workers_family_named_like_the_supervisors_is_left_out() -> None:
    spoof = (
        "# HELP broker_worker_up Spoofed.\n# TYPE broker_worker_up gauge\nbroker_worker_up 1.0\n"
        "# HELP broker_worker_restarts_total X.\n# TYPE broker_worker_restarts_total gauge\n"
        "broker_worker_restarts_total 9.0\n"
    )
    merged = merge_expositions({"w0": spoof}, [info("w0", restarts=1)])
    assert merged.count("# TYPE broker_worker_up ") == 1
    assert merged.count("# TYPE broker_worker_restarts_total ") == 1
    found = samples(merged)
    assert found["broker_worker_restarts_total", frozenset({("worker", "w0")})] == 1
    assert len(found) == 3
