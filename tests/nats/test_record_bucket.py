"""The sessions' records in a real JetStream KV bucket
(``sessions/_kv_bucket.py``): writes are compare-and-set on the key's last
revision (a stale one is a conflict, a deleted key can be made again), and
the bucket reads back as its keys' last values."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from broker.nats import JetStream, open_nats
from broker.nats._servers import open_nats_servers
from broker.server.sessions._cluster_records import RecordConflict
from broker.server.sessions._kv_bucket import JetStreamRecordBucket, open_record_bucket

from .raw import require_nats_server


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_nats_server()
    with open_nats_servers(tmp_path_factory.mktemp("nats"), count=1) as servers:
        yield servers.urls[0]


@pytest.fixture
async def bucket(nats_url: str) -> AsyncIterator[JetStreamRecordBucket]:
    async with open_nats(nats_url, name="test") as client:
        js = JetStream(client)
        made = await open_record_bucket(js, replicas=1)
        for key in list(await made.entries()):  # (the module's server is shared)
            await made.kv.purge(key)
        yield made


async def test_writes_are_compare_and_set(bucket: JetStreamRecordBucket) -> None:
    first = await bucket.write("S.ab", b"one", 0)
    second = await bucket.write("S.ab", b"two", first)
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", b"stale", first)
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", b"made again", 0)  # (it has a value)
    assert await bucket.entries() == {"S.ab": (b"two", second)}
    with pytest.raises(RecordConflict):
        await bucket.write("S.ab", None, first)  # (a stale deletion)
    await bucket.write("S.ab", None, second)
    assert await bucket.entries() == {}
    again = await bucket.write("S.ab", b"new session", 0)  # (deleted: made again)
    assert await bucket.entries() == {"S.ab": (b"new session", again)}


async def test_the_bucket_reads_back_as_each_key_s_last_value(
    bucket: JetStreamRecordBucket,
) -> None:
    revisions = {}
    for n in range(50):
        key = f"A.cd.{n % 7}"
        revisions[key] = await bucket.write(key, b"%d" % n, revisions.get(key, 0))
    await bucket.write("A.cd.3", None, revisions.pop("A.cd.3"))
    entries = await bucket.entries()
    assert {key: revision for key, (_, revision) in entries.items()} == revisions
    assert entries["A.cd.6"][0] == b"48"
