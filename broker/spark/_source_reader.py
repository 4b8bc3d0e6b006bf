"""The source half of ``format("broker")``: ``spark.read`` (batch) and
``spark.readStream`` (micro-batches), in the shape of Spark's Kafka source.

Offsets are Kafka's JSON, ``{"topic": {"0": next_offset}}``; Spark keeps
them in the query's checkpoint, so a restarted query reads again exactly
the micro-batch it had not committed. Each task reads one range of one
topic (:func:`~._source_options.plan` splits large ranges so that several
executors read in parallel) with a bounded read, which holds no publisher
back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ._source_client import Row, read_range, topic_offsets
from ._source_options import (
    OffsetMap,
    SourceError,
    SourceOptions,
    limit_ranges,
    offset_map,
    plan,
    positions,
    resolve,
)

try:  # Spark >= 4.2: admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1: latestOffset() takes no limit
    ReadLimit = ReadAllAvailable = ReadMaxRows = object  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger("broker.spark")

#: The source's columns: those of Spark's Kafka source (``timestampType`` aside).
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, headers array<struct<key:string,value:binary>>"
)


class RangePartition(InputPartition):
    """One task's read: records ``[start, end)`` of ``topic``."""

    def __init__(self, topic: str, start: int, end: int) -> None:
        super().__init__((topic, start, end))
        self.topic = topic
        self.start = start
        self.end = end


def _partitions(options: SourceOptions, ranges: dict[str, tuple[int, int]]) -> list[RangePartition]:
    return [RangePartition(*piece) for piece in plan(ranges, options.min_partitions)]


def _missing(options: SourceOptions, offsets: dict[str, tuple[int, int]]) -> None:
    for topic in sorted(set(options.topics or ()) - set(offsets)):
        log.warning("topic %r has no log on %s: nothing to read", topic, options.connection.servers)


class BrokerReader(DataSourceReader):
    """Batch reads: ``startingOffsets`` (default earliest) to
    ``endingOffsets`` (default latest) of every topic, fixed when the query
    is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        offsets = topic_offsets(options)
        _missing(options, offsets)
        ranges = {}
        for topic, (first, end) in offsets.items():
            start = resolve(options.starting, topic, first, end)
            stop = resolve(options.ending, topic, first, end)
            if stop > end:
                log.warning(
                    "topic %r: endingOffsets %d is past its end %d: reading to %d",
                    topic,
                    stop,
                    end,
                    end,
                )
                stop = end
            if start > stop:
                raise SourceError(
                    f"topic {topic!r}: starting offset {start} is after ending offset {stop}"
                )
            ranges[topic] = (start, stop)
        return _partitions(options, ranges) or [RangePartition("", 0, 0)]

    def read(self, partition: Any) -> Iterator[Row]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition.topic, partition.start, partition.end)


class BrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches: each reads from where the last one ended to the
    topics' ends when it is planned (at most ``maxOffsetsPerTrigger``
    records in all). Topics that appear later (``subscribePattern``, or a
    ``subscribe`` topic that had no log yet) are read from their first
    record."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        #: The ends a Trigger.AvailableNow query stops at (None: no such trigger).
        self._available_now: dict[str, int] | None = None
        #: The last offsets returned (for Spark < 4.2, whose latestOffset() has no start).
        self._last: dict[str, int] | None = None

    def initialOffset(self) -> OffsetMap:
        options = self.options
        offsets = topic_offsets(options)
        _missing(options, offsets)
        starts = {t: resolve(options.starting, t, *kept) for t, kept in offsets.items()}
        for topic, start in starts.items():
            end = offsets[topic][1]
            if start > end and options.fail_on_data_loss:
                raise SourceError(
                    f'option "startingOffsets" starts topic {topic!r} at offset {start}, past '
                    f"its end ({end}: the offset its next record gets); start at most there, "
                    'or set "failOnDataLoss" to "false" to wait for it'
                )
        return offset_map(starts)

    def getDefaultReadLimit(self) -> Any:
        most = self.options.max_per_trigger
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {t: end for t, (_, end) in topic_offsets(self.options).items()}

    def latestOffset(self, start: OffsetMap | None = None, limit: Any = None) -> OffsetMap:
        offsets = topic_offsets(self.options)
        starts = positions(start) if start is not None else dict(self._last or {})
        ends = {t: end for t, (_, end) in offsets.items()}
        if self._available_now is not None:
            ends = {t: min(end, self._available_now.get(t, end)) for t, end in ends.items()}
        for topic, position in starts.items():
            end = ends.get(topic)
            if end is None:
                ends[topic] = position  # its log is gone: nothing more to read
            elif end < position:
                # The log is shorter than what was read (deleted and made again).
                self._shrunk(topic, position, end)
                ends[topic] = position
        begins = {t: starts.get(t, offsets[t][0] if t in offsets else e) for t, e in ends.items()}
        if start is None:
            most = self.options.max_per_trigger
        elif isinstance(limit, ReadMaxRows):
            most = limit.max_rows
        else:
            most = None
        self._last = limit_ranges(begins, ends, most)
        return offset_map(self._last)

    def _shrunk(self, topic: str, position: int, end: int) -> None:
        what = (
            f"topic {topic!r} ends at offset {end}, before the {position} this query "
            "had reached (was its log deleted?)"
        )
        if self.options.fail_on_data_loss:
            raise SourceError(f'{what}; set "failOnDataLoss" to "false" to wait for new records')
        log.warning("%s: waiting until it passes %d", what, position)

    def partitions(self, start: OffsetMap, end: OffsetMap) -> Sequence[InputPartition]:
        starts, ends = positions(start), positions(end)
        new = [t for t in ends if t not in starts]
        firsts = topic_offsets(self.options) if new else {}
        ranges = {}
        for topic, stop in ends.items():
            begin = starts[topic] if topic in starts else firsts.get(topic, (stop, stop))[0]
            ranges[topic] = (begin, stop)
        return _partitions(self.options, ranges)

    def read(self, partition: Any) -> Iterator[Row]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition.topic, partition.start, partition.end)

    def commit(self, end: OffsetMap) -> None:
        """Nothing to release: reads hold nothing in the broker."""
