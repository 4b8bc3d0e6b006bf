"""The source's options (those of Spark's Kafka source), checked on the
driver before any task runs, and its offsets: Kafka's JSON shape
``{"topic": {"0": 42}}``, where the number is the *next* offset to read
(a topic has one partition, ``0``).

``subscribePattern`` is a topic pattern with the broker's rules (see
:mod:`broker.protocol._patterns`: ``orders.*`` one token, ``orders.>`` one or
more), not Kafka's Java regular expression; a value that looks like one is
refused with a hint."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass

from broker.protocol import PATTERN_RULE, TopicPattern, topic_name_problem, topic_pattern_error

from ._options import CONNECTION_OPTIONS, SinkError, SinkOptions

#: Kafka's special offsets in ``startingOffsets``/``endingOffsets`` JSON.
EARLIEST = -2
LATEST = -1
#: The one partition of a topic.
PARTITION = "0"
#: Records one partition reads at most (unless ``minPartitions`` asks for more partitions).
PARTITION_RECORDS = 200_000

#: Source options (lower case, as Spark passes them) besides the ``broker.*`` ones.
SOURCE_KEYS = frozenset(
    {
        "subscribe",
        "subscribepattern",
        "startingoffsets",
        "endingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "minpartitions",
    }
)
#: Offsets as Spark checkpoints them: topic -> partition ("0") -> next offset.
OffsetMap = dict[str, dict[str, int]]
#: A start or an end: "earliest", "latest", or per topic an offset (or EARLIEST/LATEST).
Bound = str | dict[str, int]


class SourceError(SinkError):
    """A source option is not usable, or the query cannot go on (records it
    needed were deleted, with ``failOnDataLoss`` true)."""


@dataclass(frozen=True)
class SourceOptions:
    """What ``.option(...)`` said to ``spark.read(Stream).format("broker")``, checked."""

    connection: SinkOptions
    #: The topics of ``subscribe`` (None: ``subscribePattern``).
    topics: tuple[str, ...] | None
    #: The topic pattern of ``subscribePattern`` (None: ``subscribe``).
    pattern: TopicPattern | None
    starting: Bound
    ending: Bound
    max_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Options as Spark passes them (keys lower-case, values strings)."""
        unknown = sorted(
            key
            for key in options
            if key not in SOURCE_KEYS and key not in CONNECTION_OPTIONS and key != "path"
            if key.startswith(("broker.", "kafka.")) or key in _KAFKA_ONLY
        )
        if unknown:
            raise SourceError(
                f"unknown source option(s) {unknown}; known: "
                f"{sorted(CONNECTION_OPTIONS)} and subscribe, subscribePattern, startingOffsets, "
                "endingOffsets, maxOffsetsPerTrigger, failOnDataLoss, minPartitions"
            )
        connection = SinkOptions.parse(
            {key: value for key, value in options.items() if key in CONNECTION_OPTIONS}
        )
        subscribe, pattern = options.get("subscribe"), options.get("subscribepattern")
        if (subscribe is None) == (pattern is None):
            raise SourceError('give exactly one of the options "subscribe" and "subscribePattern"')
        topics = None
        if subscribe is not None:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
            if not topics:
                raise SourceError('option "subscribe" lists no topic')
            for topic in topics:
                if (problem := topic_name_problem(topic)) is not None:
                    raise SourceError(f'option "subscribe": {problem}')
        matcher = None
        if pattern is not None:
            if (problem := _pattern_problem(pattern)) is not None:
                raise SourceError(f'option "subscribePattern": {problem}')
            matcher = TopicPattern(pattern)
        starting = _bound(options.get("startingoffsets"), "startingOffsets", "earliest", topics)
        if streaming and "endingoffsets" in options:
            raise SourceError('"endingOffsets" is for batch queries; a stream has no end')
        ending = _bound(options.get("endingoffsets"), "endingOffsets", "latest", topics)
        if not streaming:
            if starting == "latest" or _has(starting, LATEST):
                raise SourceError('"startingOffsets" "latest" is not for batch queries (Kafka too)')
            if ending == "earliest" or _has(ending, EARLIEST):
                raise SourceError('"endingOffsets" "earliest" is not for batch queries (Kafka too)')
        if streaming and "startingoffsets" not in options:
            starting = "latest"  # a stream's default, as Kafka's
        return cls(
            connection=connection,
            topics=topics,
            pattern=matcher,
            starting=starting,
            ending=ending,
            max_per_trigger=_positive(options.get("maxoffsetspertrigger"), "maxOffsetsPerTrigger"),
            fail_on_data_loss=_flag(options.get("failondataloss", "true"), "failOnDataLoss"),
            min_partitions=_positive(options.get("minpartitions"), "minPartitions"),
        )

    def wanted(self, available: Mapping[str, object]) -> list[str]:
        """The topics to read among ``available`` (topic -> anything), sorted:
        those of ``subscribe`` present, or those ``subscribePattern`` matches."""
        if self.topics is not None:
            return sorted(t for t in self.topics if t in available)
        assert self.pattern is not None
        return sorted(t for t in available if self.pattern.matches(t))


#: Kafka source options this source does not take: said, not silently ignored.
_KAFKA_ONLY = frozenset({"assign", "topic", "includeheaders"})


#: Characters that mean something in a regular expression and nothing in a
#: topic pattern. Names may hold them, but in this option they almost always
#: are a Kafka regex, which read as a pattern would silently match nothing.
_REGEX_CHARACTERS = frozenset("\\()[]^$|+?")
#: How to write the usual Kafka regexes as patterns (a hint, not a converter).
_REGEX_HINT = (
    "it looks like a regular expression (what Kafka takes), which this option is not: "
    r"write orders\..* as orders.> and orders\.[^.]+ as orders.*"
)


def _pattern_problem(pattern: str) -> str | None:
    """``None`` if ``subscribePattern`` may take ``pattern``, else one line:
    the pattern rule it breaks, and a hint if it looks like a regex."""
    looks_regex = not _REGEX_CHARACTERS.isdisjoint(pattern)
    problem = topic_pattern_error(pattern)
    if problem is None and not looks_regex:
        return None
    if problem is None:
        problem = f"regex characters (\\()[]^$|+?) are not wildcards; {PATTERN_RULE}"
    if looks_regex or ".*" in pattern:
        problem = f"{problem}; {_REGEX_HINT}"
        if "|" in pattern:
            problem += ', and name alternatives (a|b) in option "subscribe" (a,b)'
    return problem


def _has(bound: Bound, special: int) -> bool:
    return isinstance(bound, dict) and special in bound.values()


def _positive(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise SourceError(f'option "{name}" must be a whole number, got {value!r}') from None
    if number < 1:
        raise SourceError(f'option "{name}" must be at least 1, got {number}')
    return number


def _flag(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise SourceError(f'option "{name}" must be true or false, got {value!r}')
    return text == "true"


def _bound(value: str | None, name: str, default: str, topics: tuple[str, ...] | None) -> Bound:
    """``"earliest"``, ``"latest"`` or Kafka's JSON ``{"topic": {"0": offset}}``."""
    if value is None:
        return default
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise SourceError(
            f'option "{name}" must be "earliest", "latest" or JSON like {{"topic": {{"0": 42}}}}'
        )
    bound: dict[str, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or set(partitions) != {PARTITION}:
            raise SourceError(
                f'option "{name}": topic {topic!r} has one partition, "0": '
                f'give {{"{topic}": {{"0": offset}}}}'
            )
        offset = partitions[PARTITION]
        if type(offset) is not int or offset < EARLIEST:
            raise SourceError(
                f'option "{name}": the offset of {topic!r} must be an offset, '
                f"-2 (earliest) or -1 (latest), got {offset!r}"
            )
        bound[topic] = offset
    if topics is not None:
        missing = sorted(set(topics) - set(bound))
        if missing:
            raise SourceError(f'option "{name}" gives no offset for {missing}')
        extra = sorted(set(bound) - set(topics))
        if extra:  # (a misspelt topic would otherwise read from the default, silently)
            raise SourceError(
                f'option "{name}" names {extra}, which the query does not read '
                f"(it reads {sorted(topics)})"
            )
    return bound


def resolve(bound: Bound, topic: str, first: int, end: int) -> int:
    """The offset ``bound`` stands for in a topic whose log keeps ``[first, end)``
    (a topic that a pattern found and the JSON does not name: earliest)."""
    if bound == "earliest":
        return first
    if bound == "latest":
        return end
    assert isinstance(bound, dict)
    offset = bound.get(topic, EARLIEST)
    if offset == EARLIEST:
        return first
    if offset == LATEST:
        return end
    return max(offset, 1)  # (offsets start at 1; 0 means the first record, as in "from")


def offset_map(positions: Mapping[str, int]) -> OffsetMap:
    """``{topic: {"0": offset}}`` (what Spark checkpoints)."""
    return {topic: {PARTITION: offset} for topic, offset in sorted(positions.items())}


def positions(offsets: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """``{topic: offset}`` of a checkpointed offset map."""
    return {topic: int(partitions[PARTITION]) for topic, partitions in offsets.items()}


def split(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``parts`` consecutive ranges of about equal
    size (fewer if it holds fewer records; none if it is empty)."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    bounds = [start + total * i // parts for i in range(parts + 1)]
    return list(itertools.pairwise(bounds))


def plan(
    ranges: Mapping[str, tuple[int, int]], min_partitions: int | None
) -> list[tuple[str, int, int]]:
    """The ``(topic, start, end)`` read by each task: every topic's range
    cut into pieces of at most :data:`PARTITION_RECORDS` records, and into
    more pieces (largest ranges first) until there are ``min_partitions``."""
    counts = {
        topic: -(-(end - start) // PARTITION_RECORDS)
        for topic, (start, end) in ranges.items()
        if end > start
    }
    total = sum(end - start for start, end in ranges.values() if end > start)
    if min_partitions is not None and total:
        for topic, (start, end) in ranges.items():
            if end > start:
                share = -(-min_partitions * (end - start) // total)
                counts[topic] = max(counts[topic], share)
    return [
        (topic, first, last)
        for topic in sorted(counts)
        for first, last in split(*ranges[topic], counts[topic])
    ]


def limit_ranges(
    starts: Mapping[str, int], ends: Mapping[str, int], most: int | None
) -> dict[str, int]:
    """The ends to read to from ``starts`` (every topic of ``ends``): at most
    ``most`` records in all (None: all), shared in proportion to what each
    topic has waiting, as Kafka's ``maxOffsetsPerTrigger``."""
    if most is None:
        return dict(ends)
    waiting = {t: max(0, end - starts.get(t, end)) for t, end in ends.items()}
    total = sum(waiting.values())
    if total <= most:
        return dict(ends)
    limited = {}
    for topic, end in ends.items():
        start = starts.get(topic, end)
        share = most * waiting[topic] // total
        limited[topic] = min(end, start + max(share, 1 if waiting[topic] else 0))
    return limited
