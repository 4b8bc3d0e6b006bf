"""Retained messages: the last PUBLISH with the retain flag of each topic,
sent to every new subscription whose filter matches it (MQTT 3.1.1 and 5.0
section 3.3.1.3).

- A PUBLISH with retain 1 sets its topic's retained message (its payload,
  key and headers, as the stored record's tail, and its QoS); one with an
  empty payload clears it. Either way it is also published to the topic
  like any other message (a native reader sees it as a normal record, with
  the header ``mqtt-retain: 1``; see ``_messages``).
- A retained message is kept until it is replaced or cleared, or (5.0)
  its Message Expiry Interval passes: it does not depend on the topic
  log's retention. An expired one is dropped when a subscription's filter
  matches it (it is sent to none).
- Bounded: at most :data:`MAX_RETAINED_MESSAGES` topics and
  :data:`MAX_RETAINED_BYTES` bytes (topic names and tails) in all. A
  retained PUBLISH that would go past either is not retained, and the
  topic's previous retained message, if any, is cleared (so that no
  subscriber gets an older value than the one published); it is still
  published, and counted in :attr:`RetainedStore.refused`
  (``broker_mqtt_retained_refused_total``). Replacing a topic's message
  never counts against the count.
- On a broker with a data directory they are kept in the state journal
  (space ``mqtt.retained``, key the MQTT topic name, value ``[qos,
  tail]``) and survive a restart: each change is written to the journal
  file before the connection's next acknowledgement (:meth:`write`),
  like the durable cursors' positions. Memory-only, they live as long as
  the broker.

The messages are held once: the journal's map of its state is what is
kept in memory (on a memory-only broker, this class's own map).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.log import LogError, StateJournal
from broker.mqtt import topic_matches

from ._messages import expired, wall_ms

__all__ = ["MAX_RETAINED_BYTES", "MAX_RETAINED_MESSAGES", "RETAINED", "RetainedStore"]

log = logging.getLogger("broker.server")

#: The journal space of the retained messages.
RETAINED = "mqtt.retained"
#: At most this many topics have a retained message.
MAX_RETAINED_MESSAGES = 10_000
#: At most this many bytes of retained messages (topic names and stored tails).
MAX_RETAINED_BYTES = 64 * 1024 * 1024


def _size(topic: str, tail: bytes) -> int:
    return len(topic.encode()) + len(tail)


class RetainedStore:
    """The broker's retained messages, by MQTT topic name (see the module).

    ``journal``: where they are kept (None: a memory-only broker, in memory).
    """

    def __init__(
        self,
        journal: StateJournal | None,
        *,
        max_messages: int = MAX_RETAINED_MESSAGES,
        max_bytes: int = MAX_RETAINED_BYTES,
    ) -> None:
        self.journal = journal
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        #: Topic name -> (QoS, tail).
        self._messages: dict[str, tuple[int, bytes]] = {}
        self.bytes = 0
        #: Retained PUBLISHes not retained: past the bounds.
        self.refused = 0
        self._dirty = False
        if journal is not None:
            self._load(journal)

    def _load(self, journal: StateJournal) -> None:
        for topic, value in journal.items(RETAINED):
            if (
                isinstance(value, list)
                and len(value) == 2
                and value[0] in (0, 1, 2)
                and isinstance(value[1], bytes)
            ):
                self._messages[topic] = (value[0], value[1])
                self.bytes += _size(topic, value[1])
            else:  # (not ours: a damaged value is dropped, never a crash)
                log.warning("retained message of %r in the journal is malformed: dropped", topic)
                journal.delete(RETAINED, topic)
                self._dirty = True

    def __len__(self) -> int:
        return len(self._messages)

    def get(self, topic: str) -> tuple[int, bytes] | None:
        """The retained message of ``topic`` (QoS, tail), or None."""
        return self._messages.get(topic)

    def update(self, topic: str, tail: bytes, qos: int, *, clear: bool) -> bool:
        """A retained PUBLISH to ``topic``: keep ``tail`` at ``qos`` as its
        retained message, or (``clear``: an empty payload) clear it. Whether
        it is retained (False: cleared, or refused past the bounds)."""
        old = self._messages.get(topic)
        if clear:
            self._drop(topic, old)
            return False
        size = _size(topic, tail)
        freed = 0 if old is None else _size(topic, old[1])
        too_many = old is None and len(self._messages) >= self.max_messages
        if too_many or self.bytes - freed + size > self.max_bytes:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "retained message of %r not kept: past the bound of %d messages, "
                    "%d bytes (refused so far: %d)",
                    topic,
                    self.max_messages,
                    self.max_bytes,
                    self.refused,
                )
            self._drop(topic, old)
            return False
        self._messages[topic] = (qos, tail)
        self.bytes += size - freed
        if self.journal is not None:
            self.journal.put(RETAINED, topic, [qos, tail])
            self._dirty = True
        return True

    def _drop(self, topic: str, old: tuple[int, bytes] | None) -> None:
        if old is None:
            return
        del self._messages[topic]
        self.bytes -= _size(topic, old[1])
        if self.journal is not None:
            self.journal.delete(RETAINED, topic)
            self._dirty = True

    def matching(
        self, topic_filter: str, may_read: Callable[[str], bool]
    ) -> list[tuple[str, int, bytes]]:
        """The retained messages that MQTT ``topic_filter`` (not shared)
        matches and ``may_read`` allows (it is given the MQTT name), as
        ``(topic, qos, tail)``, in topic order."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._messages.get(topic_filter)
            matched = [] if found is None else [(topic_filter, found[0], found[1])]
        else:
            matched = [
                (topic, qos, tail)
                for topic, (qos, tail) in sorted(self._messages.items())
                if topic_matches(topic_filter, topic)
            ]
        now = wall_ms()
        result: list[tuple[str, int, bytes]] = []
        for message in matched:
            if expired(message[2], now):
                self._drop(message[0], self._messages.get(message[0]))
            elif may_read(message[0]):
                result.append(message)
        return result

    def write(self) -> None:
        """Write the changes to the journal's file (before anything that
        relies on them is acknowledged); a failure is logged, and the next
        write tries again."""
        journal = self.journal
        if not self._dirty or journal is None:
            return
        self._dirty = False
        if journal.pending:
            try:
                journal.write()
            except LogError as error:  # (logged; tried again at the next)
                self._dirty = True
                log.error("writing the state journal failed: %s", error)
