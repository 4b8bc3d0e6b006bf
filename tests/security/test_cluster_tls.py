"""Cluster mode over TLS: a client resuming its session on a front end
that does not hold it is claimed from the cluster after the TLS handshake
(the Hello is read there and given again to the connection), so the
session resumes rather than starting afresh."""

from __future__ import annotations

from pathlib import Path

from tests.server.cluster_resume import resume_on_another_broker
from tests.server.run_streams import MemoryBucket, MemoryStreams

from .conftest import Pki


async def test_a_tls_resume_on_another_front_end_is_claimed(tmp_path: Path, pki: Pki) -> None:
    streams, bucket = MemoryStreams(), MemoryBucket()
    moved = await resume_on_another_broker(
        tmp_path,
        streams,
        bucket,
        [b"one", b"two"],
        [b"three"],
        ssl_context=pki.client(),
        tls_cert=str(pki.server_cert),
        tls_key=str(pki.server_key),
    )
    assert (moved.lost, moved.resumed) == (0, 1)
    assert sum(m.count for m in streams.streams["orders"].messages) == 3  # (each once)
