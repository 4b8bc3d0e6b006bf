"""The sessions' records in a JetStream KV bucket (a
:class:`~._cluster_records.RecordBucket` for ``broker serve --cluster``).

The bucket is ``broker-sessions`` (its stream ``KV_broker-sessions``),
one value per key (history 1), with the topics' replicas. Writes are
compare-and-set on the key's last revision (JetStream's expected last
subject sequence); a refusal is a :class:`RecordConflict`. Anything else
that goes wrong (no answer, no leader, no connection) is a
:class:`RecordsUnavailable`, tried again by the caller.
"""

from __future__ import annotations

from dataclasses import replace

from broker.nats import (
    ERR_WRONG_LAST_SEQUENCE,
    Headers,
    JetStream,
    JetStreamError,
    KeyValue,
    NatsError,
)
from broker.nats._jetstream import ERR_STREAM_NAME_IN_USE, KV_OPERATION, kv_stream_config

from ._cluster_records import RecordConflict, RecordsUnavailable

__all__ = ["BUCKET", "JetStreamRecordBucket", "open_record_bucket"]

#: The bucket's name.
BUCKET = "broker-sessions"
#: Values read at a time by a scan.
SCAN_BATCH = 256


async def open_record_bucket(
    js: JetStream, replicas: int, bucket: str = BUCKET, max_values: int = -1
) -> JetStreamRecordBucket:
    """The bucket (``bucket``: another of the same kind, e.g. the durable
    cursors'), made if it is not there (``replicas`` copies). Raises
    :class:`RecordsUnavailable` if JetStream does not answer or cannot make
    it now (no leader, a peer offline), and :class:`JetStreamError` if a
    bucket of that name has another configuration.

    With ``max_values`` the bucket keeps at most that many values, the
    oldest dropped first (and a bucket made with another such limit is
    given this one: the commit registry's, ``staging_remember``)."""
    config = kv_stream_config(bucket, history=1, replicas=replicas)
    if max_values > 0:
        config = replace(config, max_msgs=max_values, discard="old")
    try:
        try:
            await js.add_stream(config)
        except JetStreamError as error:
            if error.err_code != ERR_STREAM_NAME_IN_USE or max_values <= 0:
                raise
            await js.update_stream(config)  # (its limit changed: this one's)
    except JetStreamError as error:
        if error.err_code == ERR_STREAM_NAME_IN_USE:
            raise  # (a bucket of that name made otherwise: asking again won't help)
        # (No leader yet, a peer offline while the cluster forms: ask again.)
        raise RecordsUnavailable(f"making KV bucket {bucket}: {error}") from None
    except NatsError as error:
        raise RecordsUnavailable(f"making KV bucket {bucket}: {error}") from None
    return JetStreamRecordBucket(js.key_value(bucket))


class JetStreamRecordBucket:
    """Bucket :data:`BUCKET` (see the module)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        kv = self.kv
        try:
            if value is None:
                return await kv.delete(key, last_revision=last_revision)
            if last_revision == 0:
                return await kv.create(key, value)
            return await kv.update(key, value, last_revision)
        except JetStreamError as error:
            if error.err_code == ERR_WRONG_LAST_SEQUENCE:
                raise RecordConflict(f"{key[:80]}: {error}") from None
            raise RecordsUnavailable(f"{key[:80]}: {error}") from None
        except NatsError as error:
            raise RecordsUnavailable(f"{key[:80]}: {error}") from None

    async def session(self, session: str) -> dict[str, tuple[bytes, int]]:
        """(Read from the bucket's leader, never a follower's older copy.)"""
        js = self.kv.js
        prefix = f"$KV.{self.kv.bucket}."
        found: dict[str, tuple[bytes, int]] = {}
        try:
            for kind in "SPA":
                key = f"{kind}.{session}"
                stored = await js.get_last_msg(self.kv.stream, prefix + key)
                if stored is not None and _is_value(stored.headers):
                    found[key] = (bytes(stored.payload), stored.seq)
        except NatsError as error:
            raise RecordsUnavailable(f"reading KV bucket {self.kv.bucket}: {error}") from None
        return found

    async def read(self, key: str) -> tuple[bytes, int] | None:
        js = self.kv.js
        try:
            stored = await js.get_last_msg(self.kv.stream, f"$KV.{self.kv.bucket}.{key}")
        except NatsError as error:
            raise RecordsUnavailable(f"reading KV bucket {self.kv.bucket}: {error}") from None
        if stored is None or not _is_value(stored.headers):
            return None
        return bytes(stored.payload), stored.seq

    async def scan(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """(Read in order by a consumer on the bucket's stream, up to its last
        message when the scan began: one value per key, history 1.)"""
        js = self.kv.js
        subjects = f"$KV.{self.kv.bucket}."
        found: dict[str, tuple[bytes, int]] = {}
        try:
            last = await js.get_last_msg(self.kv.stream, f"{subjects}{prefix}>")
            if last is None:
                return found
            reader = js.ordered(self.kv.stream, filter_subject=f"{subjects}{prefix}>")
            while reader.next_seq <= last.seq:
                messages = await reader.fetch(SCAN_BATCH)
                if not messages and reader.consumer is not None:
                    break  # (nothing more: the last one was replaced meanwhile)
                for message in messages:
                    key = message.subject[len(subjects) :]
                    if _is_value(message.headers):
                        found[key] = (bytes(message.payload), message.stream_seq)
                    else:
                        found.pop(key, None)
        except NatsError as error:
            raise RecordsUnavailable(f"reading KV bucket {self.kv.bucket}: {error}") from None
        return found


def _is_value(headers: Headers | None) -> bool:
    """Whether a bucket message is a value (not a deletion's or purge's marker)."""
    return headers is None or headers.get(KV_OPERATION, "PUT") == "PUT"
