"""What the source does with the broker (no pyspark here): the first and
next offsets of the topics a query reads (on the driver), and one task's
read of exactly ``[start, end)`` of a topic (on an executor), through the
worker's cached client.

A task's read is a *bounded read* (``Subscribe`` option ``"until"``): the
broker sends the records of the range and then nothing more, and it never
holds publishers back for it. Records that retention deleted before the
task read them are told by a ``Gap`` (or seen as a jump in the offsets):
with ``failOnDataLoss`` the task fails with a :class:`SourceError` naming
the topic and the lost offsets, without it the loss is logged and skipped.
The read asks for the records' times (``"timestamps"``): each row's
``timestamp`` is the time the broker received its record.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterator

from ._source_options import SourceError, SourceOptions
from ._writer import cached_client

log = logging.getLogger("broker.spark")

#: The most messages a task takes from its subscription at once.
BATCH = 4096
#: Seconds a task waits for a delivery before it looks whether its range ended in a gap.
POLL = 0.2

#: A row: key, value, topic, partition, offset, timestamp, headers.
Row = tuple[bytes | None, bytes, str, int, int, datetime.datetime, list[tuple[str, bytes]] | None]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND = datetime.timedelta(milliseconds=1)


def record_time(ms: int) -> datetime.datetime:
    """The ``timestamp`` of a record received ``ms`` milliseconds after the
    Unix epoch: a timezone-aware UTC datetime, exact to the millisecond."""
    return _EPOCH + ms * _MILLISECOND


def topic_offsets(options: SourceOptions) -> dict[str, tuple[int, int]]:
    """``{topic: (first, end)}`` of the topics the query reads that have a
    log (``subscribe`` names not there are left out; nothing is created)."""
    client = cached_client(options.connection)
    names = list(options.topics) if options.topics is not None else None
    found = client.offsets(names, timeout=options.connection.timeout)
    return {topic: found[topic] for topic in options.wanted(found)}


def lost(options: SourceOptions, topic: str, first: int, end: int) -> None:
    """Records ``[first, end)`` of ``topic`` were deleted (or lost to
    damage of the broker's log) before being read: raise
    (``failOnDataLoss``) or log a warning."""
    what = (
        f"topic {topic!r}: records {first} to {end - 1} ({end - first}) were deleted by "
        "retention (or lost to damage of the broker's log) before this query read them"
    )
    if options.fail_on_data_loss:
        raise SourceError(
            f"{what}; the query fails rather than skip them. Read from a later offset, or set "
            'the option "failOnDataLoss" to "false" to skip lost records with a warning'
        )
    log.warning("%s: skipped (failOnDataLoss is false)", what)


def read_range(options: SourceOptions, topic: str, start: int, end: int) -> Iterator[Row]:
    """The records of ``topic`` from offset ``start`` up to ``end`` (not
    included), as rows, in order. Raises :class:`SourceError` for lost
    records (see :func:`lost`) or when no record came for ``broker.timeout``
    seconds."""
    if end <= start:
        return
    client = cached_client(options.connection)
    timeout = options.connection.timeout
    expected = start
    subscription = client.subscribe(
        topic, options={"from": start, "until": end, "timestamps": True}, timeout=timeout
    )
    last_ms, last_time = -1, _EPOCH
    with subscription:
        last_progress = time.monotonic()
        while expected < end:
            try:
                messages = subscription.receive_batch(BATCH, timeout=POLL)
            except TimeoutError:
                if subscription.skipped_to >= end and not subscription.pending:
                    lost(options, topic, expected, end)  # the range ended in a gap
                    return
                if time.monotonic() - last_progress > timeout:
                    raise SourceError(
                        f"topic {topic!r}: no record after offset {expected - 1} for {timeout:g} s "
                        f"(reading up to {end - 1}); raise broker.timeout if the broker is slow"
                    ) from None
                continue
            last_progress = time.monotonic()
            for message in messages:
                offset = message.offset
                stamp = message.timestamp
                # (A broker that lists offsets numbers by them, and sends times when asked.)
                assert offset is not None and stamp is not None
                if offset != expected:
                    lost(options, topic, expected, offset)
                if stamp != last_ms:  # (records appended together share their time)
                    last_ms, last_time = stamp, record_time(stamp)
                yield (message.key, message.payload, topic, 0, offset, last_time, message.headers)
                expected = offset + 1
