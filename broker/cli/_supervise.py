"""``broker serve --workers N``: a supervisor and N worker processes behind one address."""

from __future__ import annotations

import logging
from functools import partial

import trio

from broker.config import BrokerConfig
from broker.runtime import SHUTDOWN_SIGNALS
from broker.workers import Supervisor, serve_merged_metrics, serve_workers

from ._listen import CannotListen, check_metrics_free, metrics_unavailable
from ._stopping import stop_on_signals

log = logging.getLogger("broker")


def _check_files(config: BrokerConfig) -> None:
    """Load the TLS and auth files once here, so that a bad one stops the
    broker with its one line before any worker starts."""
    from broker.auth import load_auth_file
    from broker.tls import server_context

    if config.tls:
        server_context(config.tls_cert, config.tls_key, config.tls_client_ca)
    if config.auth_file:
        load_auth_file(config.auth_file)


async def supervise(config: BrokerConfig, log_level: str) -> None:
    """Run the workers until SIGINT/SIGTERM/SIGHUP, then drain them all."""
    _check_files(config)
    metrics = config.metrics_address
    check_metrics_free(metrics)
    count = config.worker_count
    supervisor = Supervisor(config, count, log_level=log_level)
    with trio.open_signal_receiver(*SHUTDOWN_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            # The metrics endpoint listens first: whoever sees the client port
            # accept (a probe, a test, a client) can scrape at once. Until the
            # workers are up it answers with each worker down (and /readyz 503).
            shown: tuple[str, int] | None = None
            if metrics is not None:
                try:
                    shown = await nursery.start(
                        partial(
                            serve_merged_metrics, supervisor.infos, *metrics, top=config.metrics_top
                        )
                    )
                except OSError as error:
                    raise metrics_unavailable(metrics, error) from None
            try:
                await nursery.start(
                    partial(
                        serve_workers, config, count, log_level=log_level, supervisor=supervisor
                    )
                )
            except OSError as error:
                if error.filename is not None:
                    raise
                raise CannotListen("clients", config.listen_address, "--listen", error) from None
            host, port = supervisor.address
            lines = [f"broker listening on {host}:{port}"]
            if shown is not None:
                lines.append(f"metrics on http://{shown[0]}:{shown[1]}/metrics")
            directs = ", ".join(f"{w.id} on {w.member.address}" for w in supervisor.workers)
            lines.append(f"{count} workers, direct: {directs}")
            print("\n".join(lines), flush=True)
            await stop_on_signals(signals, supervisor.shutdown, config.shutdown_deadline)
            nursery.cancel_scope.cancel()
