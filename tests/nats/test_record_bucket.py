"""The sessions' records in a real JetStream KV bucket
(``sessions/_kv_bucket.py``): writes are compare-and-set on the key's last
revision (a stale one is a conflict, a deleted key can be made again), and
the bucket reads back as its keys' last values (a session's, or every
key of a prefix: a scan)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from broker.nats import JetStream, open_nats
from broker.server.sessions._cluster_records import RecordConflict
from broker.server.sessions._kv_bucket import (
    SCAN_BATCH,
    JetStreamRecordBucket,
    open_record_bucket,
)


@pytest.fixture
async def bucket(nats_url: str) -> AsyncIterator[JetStreamRecordBucket]:
    async with open_nats(nats_url, name="test") as client:
        yield await open_record_bucket(JetStream(client), replicas=1)


async def test_writes_are_compare_and_set(bucket: JetStreamRecordBucket) -> None:
    first = await bucket.write("S.ab", b"one", 0)
    second = await bucket.write("S.ab", b"two", first)
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", b"stale", first)
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", b"made again", 0)  # (it has a value)
    assert await bucket.session("ab") == {"S.ab": (b"two", second)}
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", None, first)  # (a stale deletion)
    await bucket.write("S.ab", None, second)
    assert await bucket.session("ab") == {}
    again = await bucket.write("S.ab", b"new session", 0)  # (deleted: made again)
    assert await bucket.session("ab") == {"S.ab": (b"new session", again)}


async def test_a_session_reads_back_as_its_keys_last_values(
    bucket: JetStreamRecordBucket,
) -> None:
    revisions: dict[str, int] = {}
    for n in range(30):
        for key in ("S.cd", "P.cd", "A.cd", "P.other"):
            revisions[key] = await bucket.write(key, b"%d" % n, revisions.get(key, 0))
    await bucket.write("A.cd", None, revisions.pop("A.cd"))
    assert await bucket.session("cd") == {
        "S.cd": (b"29", revisions["S.cd"]),
        "P.cd": (b"29", revisions["P.cd"]),
    }


async def test_a_scan_reads_every_key_s_last_value_past_a_batch(
    nats_url: str,
) -> None:
    async with open_nats(nats_url, name="test") as client:
        bucket = await open_record_bucket(JetStream(client), replicas=1, bucket="scan-test")
        revisions: dict[str, int] = {}
        for n in range(SCAN_BATCH + 20):
            key = f"t.{n}"
            revisions[key] = await bucket.write(key, b"%d" % n, 0)
        for n in range(5):  # (written again: the last value counts)
            revisions["t.0"] = await bucket.write("t.0", b"again %d" % n, revisions["t.0"])
        await bucket.write("t.1", None, revisions.pop("t.1"))  # (deleted: left out)
        await bucket.write("u.1", b"other prefix", 0)
        found = await bucket.scan("t.")
        assert await bucket.scan("v.") == {}
    expected = {key: (b"%d" % int(key[2:]), revision) for key, revision in revisions.items()}
    expected["t.0"] = (b"again 4", revisions["t.0"])
    assert found == expected
