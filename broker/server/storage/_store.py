"""The storage seam: what a topic and its readers use of a topic's storage.

A topic (``Topic``), its reliable subscriptions (``LogSubscription``), its
consumer groups and the admin requests talk to a topic's records only
through :class:`TopicStore`, and hold their place in them through
:class:`StoreReader`. The local topic log (:class:`broker.log.TopicLog`, one
directory of term files per topic, managed by ``TopicLogs``) is the first
implementation; a second storage engine implements these two protocols
(and comes with its own manager, the topics' ``TopicLogHost``) without
touching the topics.

The value types and errors of the seam are re-exported here, so that the
topics import nothing of the engine: :class:`Start` (where a reader
starts), :class:`Run` (what a read returns) and :class:`LogError` (every
failure of a store; :class:`LogFull` when it refuses an append for a
reader it must not overrun).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from broker.log import LogError, LogFull, Reader, Run, Start, TopicLog

__all__ = ["LogError", "LogFull", "Run", "Start", "StoreReader", "TopicStore"]


class StoreReader(Protocol):
    """A registered position in a :class:`TopicStore`: the next offset its
    holder wants. While it is open it holds back the deletion of records
    from :attr:`position` on where the store's retention waits for readers
    (``when_full="block"``); a purge overrides it."""

    @property
    def position(self) -> int:
        """The next offset this reader wants (where it was made, then
        wherever :meth:`advance_to` moved it)."""
        ...

    def advance_to(self, offset: int) -> None:
        """Move to ``offset``: forward only, at most the store's next offset
        (raises ``ValueError`` otherwise); records before it may then go."""
        ...

    def close(self) -> None:
        """Stop holding anything back (idempotent)."""
        ...


class TopicStore(Protocol):
    """One topic's records, as the topic and its readers see them.

    Promises (every implementation keeps them):

    - Appends get consecutive offsets from 1, never reused, even after a
      purge, a crash or a restart; a record's bytes and receive time never change.
    - ``durable_offset <= written_offset <= next_offset - 1`` and
      ``first_offset <= next_offset``. A record appended is readable at
      once; *written* (:meth:`write`) it survives the process being
      killed; *durable* it survives the machine losing power. After a
      crash every record up to :attr:`durable_offset` (after a process
      crash, up to :attr:`written_offset`) is there, in order, once.
    - A record appended is readable until retention or :meth:`purge_before`
      deletes it; a reader that asks for deleted (or lost) records is told
      how many with :attr:`Run.gap`, never served torn or foreign bytes.
    - Not thread-safe: one owner (the event loop) calls it all; the time
      is passed in (``now_ms``), never read.
    """

    @property
    def first_offset(self) -> int:
        """The offset of the first record kept (:attr:`next_offset` if none)."""
        ...

    @property
    def next_offset(self) -> int:
        """The offset the next append gets (1 for an empty new store)."""
        ...

    @property
    def written_offset(self) -> int:
        """The last offset written: it survives the process being killed, and
        readers deliver no further. With :attr:`sync_later`, the last
        durable offset (nothing is delivered before it is durable)."""
        ...

    @property
    def durable_offset(self) -> int:
        """The last offset made durable (fsynced): it survives the machine
        losing power."""
        ...

    @property
    def closed(self) -> bool:
        """Whether it is closed (the broker stops, the topic was deleted):
        reads, appends and purges then raise :class:`LogError`."""
        ...

    @property
    def sync_later(self) -> bool:
        """Whether records become durable only when the manager syncs the
        store (``flush="always"``): the topic confirms and routes a batch
        once :attr:`durable_offset` covers it (the manager's ``sync_soon``
        and ``Topic.synced``), not when it is written."""
        ...

    def append_many(self, tails: Sequence[bytes], now_ms: int) -> int:
        """Append ``tails`` as consecutive records received at ``now_ms``
        (times never decrease: a later record never gets an earlier time),
        from the :attr:`next_offset` the call found; return how many went
        in. Fewer than all only when the store filled (or its disk failed)
        part way: the next call raises why. Raises :class:`LogError`
        (:class:`LogFull`: refused for a reader it must not overrun) with
        nothing appended. Appended records are readable at once, and not
        yet written."""
        ...

    def write(self) -> None:
        """Write every appended record (hand it to the OS, no fsync):
        :attr:`written_offset` reaches :attr:`next_offset` - 1. Raises
        :class:`LogError` if it cannot (the records stay readable, appends
        fail until a write works)."""
        ...

    def read(self, offset: int, max_records: int, max_bytes: int) -> Run:
        """Consecutive records from ``offset`` on: at most ``max_records``
        and about ``max_bytes`` (at least one record if there is one), each
        tail the exact bytes appended. Below the first record kept, or in
        offsets lost inside the store, the run starts at the next record
        there is and its ``gap`` counts those skipped; at or past the end it
        is empty. Records past :attr:`written_offset` may be returned: the
        caller cuts them. Raises :class:`LogError` once closed."""
        ...

    def times(self, offset: int, count: int) -> list[int]:
        """The receive times (ms since the epoch) of the ``count`` records
        from ``offset`` on, as appended (records just read or appended);
        raises :class:`LogError` for records not kept."""
        ...

    def reader(self, start: Start, *, register: bool) -> StoreReader:
        """A reader at ``start`` resolved now (earliest: :attr:`first_offset`;
        latest: :attr:`next_offset`; an offset; the last N records; the
        first record at or after a time). Registered, it holds back
        deletion until closed; unregistered, only its position is wanted."""
        ...

    def purge_before(self, offset: int) -> int:
        """Delete every record below ``offset`` (clamped to
        :attr:`first_offset` .. :attr:`written_offset` + 1), whatever
        readers hold, durably (a restart does not bring them back); how many
        were deleted. Readers behind get a gap. Raises :class:`LogError`
        with nothing deleted."""
        ...


def _local(topic_log: TopicLog) -> TopicStore:
    """The local topic log is a :class:`TopicStore` (mypy checks it here)."""
    return topic_log


def _local_reader(reader: Reader) -> StoreReader:
    """Its reader is a :class:`StoreReader` (mypy checks it here)."""
    return reader
