"""A TLS resume that lands on the wrong worker cannot be handed over (its TLS
state is in the accepting process): that worker answers Goodbye 8 "resume
at HOST:PORT" and the client resumes at the session's home, losing nothing."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import BlockingClient, open_client
from tests.proxy import proxied
from tests.workers.test_supervisor import (
    DEADLINE,
    across_a_break,
    running_workers,
    topics_of,
    worker_config,
)

from .conftest import Pki


async def test_a_tls_resume_on_another_worker_is_redirected_to_the_sessions_home(
    tmp_path: Path, pki: Pki
) -> None:
    config = worker_config(tmp_path, tls_cert=str(pki.server_cert), tls_key=str(pki.server_key))
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        topic = topics_of("w0", ["w0", "w1"], 1)[0]
        async with proxied(("127.0.0.1", w0.direct.getsockname()[1])) as proxy:

            def lead_elsewhere() -> None:  # the resumes reach w1 first: it sends them to w0
                proxy.target = ("127.0.0.1", w1.direct.getsockname()[1])
                proxy.cut()

            got = await across_a_break(proxy.url, topic, lead_elsewhere, ssl_context=pki.client())
        assert got == [b"%d" % n for n in range(200)]


async def test_a_blocking_clients_tls_resume_is_redirected_too(tmp_path: Path, pki: Pki) -> None:
    config = worker_config(tmp_path, tls_cert=str(pki.server_cert), tls_key=str(pki.server_key))
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        topic = topics_of("w0", ["w0", "w1"], 1)[0]
        async with proxied(("127.0.0.1", w0.direct.getsockname()[1])) as proxy:

            def publish_across_a_cut() -> dict[str, int]:
                with BlockingClient(
                    proxy.url, ssl_context=pki.client(), reconnect=DEADLINE
                ) as client:
                    for n in range(50):
                        client.publish(topic, b"%d" % n)
                    client.flush(DEADLINE)
                    proxy.target = ("127.0.0.1", w1.direct.getsockname()[1])
                    trio.from_thread.run_sync(proxy.cut)
                    for n in range(50, 100):
                        client.publish(topic, b"%d" % n, timeout=DEADLINE)
                    client.flush(DEADLINE)
                    return client.statistics()

            statistics = await trio.to_thread.run_sync(publish_across_a_cut)
        assert statistics["sessions_lost"] == 0 and statistics["resumes"] >= 1
        async with (
            open_client(
                f"127.0.0.1:{w0.direct.getsockname()[1]}", ssl_context=pki.client()
            ) as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(DEADLINE):
                got = [(await subscription.receive()).payload for _ in range(100)]
        assert got == [b"%d" % n for n in range(100)]
