"""``broker serve``: run the broker (and its metrics endpoint) until SIGINT/SIGTERM/SIGHUP."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from broker.config import FIELDS, BrokerConfig, ConfigError, load_config
from broker.runtime import SHUTDOWN_SIGNALS, raise_open_file_limit, run_unwrapped, tune_gc

from ._common import Subparsers, add_command
from ._data_dir import prepare_data_dir, with_data_dir
from ._listen import CannotListen, check_free, check_metrics_free, metrics_unavailable
from ._stopping import stop_on_signals

if TYPE_CHECKING:
    from broker.server import Broker
    from broker.server._front_end import FrontEndRun

log = logging.getLogger("broker")

EXAMPLES = """
  broker serve                                  # clients on 127.0.0.1:7400, metrics on :9400
  broker serve --listen 0.0.0.0:7400 --config broker.toml
  broker serve --set connection_budget=8388608 --log-level DEBUG
  broker serve --metrics-listen ''              # no HTTP endpoint
  broker serve --mqtt-listen 127.0.0.1:1883     # MQTT 3.1.1 and 5.0 clients too
  broker serve --data-dir /var/lib/broker       # topic logs there (default: ~/.local/state/broker)
  broker serve --memory-only                    # no topic log: nothing survives a restart
  broker serve --workers auto                   # one worker process per core, one address
  broker serve --cluster nats://n1:4222,nats://n2:4222,nats://n3:4222
                                                # a front end: topics kept in JetStream
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "serve",
        help="run the broker",
        description="Run the broker until SIGINT/SIGTERM/SIGHUP (then: stop accepting, Goodbye 5, "
        "drain). Settings: defaults < --config TOML < BROKER_<NAME> environment < flags. "
        "Both addresses are bound before it says it listens.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="client address (default: 127.0.0.1:7400)"
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="HTTP address of /metrics, /stat.json, /healthz, /readyz "
        "(default: 127.0.0.1:9400; '' disables it)",
    )
    parser.add_argument(
        "--mqtt-listen",
        metavar="HOST:PORT",
        help="MQTT 3.1.1 and 5.0 clients' address, e.g. 127.0.0.1:1883 (default: '', no MQTT "
        "listener; see docs/mqtt.md)",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        help="worker processes behind the one address, each owning a share of the topics: "
        'a number, or "auto" for one per core (default: 1, a single process)',
    )
    parser.add_argument(
        "--cluster",
        metavar="URLS",
        help="cluster mode: the NATS servers of a JetStream cluster that keeps every topic "
        "(nats://HOST:PORT, comma-separated); this broker is then a front end whose data "
        "directory holds caches",
    )
    parser.add_argument(
        "--cluster-unsafe-sync",
        action="store_true",
        default=None,
        help="cluster mode: run even if JetStream does not fsync every write (records "
        "confirmed could be lost when servers lose power together)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="TOML file ([broker] table; default: $BROKER_CONFIG)"
    )
    storage = parser.add_mutually_exclusive_group()
    storage.add_argument(
        "--data-dir",
        metavar="DIR",
        help="directory of the topic logs, created if missing and locked while the broker "
        "runs (default: $STATE_DIRECTORY, else $XDG_STATE_HOME/broker, else "
        "~/.local/state/broker)",
    )
    storage.add_argument(
        "--memory-only",
        action="store_true",
        help="keep no topic log: topics are not retained and nothing survives a restart",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="any setting, e.g. --set connection_budget=8388608 (repeatable): " + ", ".join(FIELDS),
    )
    parser.set_defaults(func=run)


def _config_from(args: argparse.Namespace) -> BrokerConfig:
    overrides: dict[str, Any] = {
        "listen": args.listen,
        "metrics_listen": args.metrics_listen,
        "mqtt_listen": args.mqtt_listen,
        "workers": args.workers,
        "cluster": args.cluster,
        "cluster_unsafe_sync": args.cluster_unsafe_sync,
    }
    if args.data_dir is not None:
        # The flag wins over memory_only from the file or the environment too.
        overrides.update(data_dir=args.data_dir, memory_only=False)
    elif args.memory_only:
        overrides["memory_only"] = True
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects NAME=VALUE, got {item!r}")
        overrides[name.strip()] = value.strip()
    path = args.config or os.environ.get("BROKER_CONFIG") or None
    try:
        return load_config(path, overrides=overrides)
    except ConfigError as error:
        if args.config is None and path is not None and f"config {path}" in str(error):
            raise ConfigError(f"{error} (named by BROKER_CONFIG)") from None
        raise


def run(args: argparse.Namespace) -> int:
    from broker.auth import AuthError
    from broker.log import LogError
    from broker.server import ClusterUnavailable
    from broker.tls import TLSConfigError
    from broker.workers import WorkerFailed

    try:
        config = with_data_dir(_config_from(args))
        if config.log_dir is not None:
            prepare_data_dir(config.log_dir)
    except ConfigError as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 2
    try:
        if config.worker_count > 1:
            from ._supervise import supervise

            run_unwrapped(supervise, config, logging.getLevelName(log.getEffectiveLevel()))
        else:
            run_unwrapped(_serve, config)
    except (AuthError, TLSConfigError) as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 2
    except (CannotListen, WorkerFailed, ClusterUnavailable) as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 1
    except LogError as error:
        # The data directory is locked by another broker, or its logs cannot
        # be opened: one line, and a status a supervisor may retry on.
        print(f"broker serve: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: BrokerConfig) -> None:
    from broker.server import serve_broker

    tune_gc(config.gc_threshold)
    raise_open_file_limit()
    metrics = config.metrics_address
    # The metrics port is checked before the broker starts (and says it
    # listens): a taken port stops it with one line, not after a "listening".
    check_metrics_free(metrics)
    mqtt = config.mqtt_address
    if mqtt is not None and mqtt[1] != 0:  # (and the MQTT port, likewise)
        try:
            check_free(*mqtt)
        except OSError as error:
            raise CannotListen("MQTT clients", mqtt, "--mqtt-listen", error) from None
    if config.log_dir is None:
        log.info("memory-only: topics are not retained")
    else:
        log.info("data directory %s", config.log_dir)
    # Signals are taken from the start: a SIGINT or SIGTERM that comes while
    # the broker starts (or just as it says it listens) stops it gracefully.
    with trio.open_signal_receiver(*SHUTDOWN_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            if config.cluster:
                await _serve_front_end(config, signals, nursery)
                return
            broker: Broker = await _start(nursery, partial(serve_broker, config), config)
            serve = None
            if metrics is not None:
                from broker.metrics import serve_metrics

                serve = partial(serve_metrics, broker, *metrics)
            await _announce(nursery, broker, serve, config)
            await stop_on_signals(signals, broker.shutdown, config.shutdown_deadline)
            nursery.cancel_scope.cancel()


async def _start(
    nursery: trio.Nursery, start: Callable[..., Awaitable[None]], config: BrokerConfig
) -> Any:
    """What ``start`` reports once it serves (in ``nursery``); an address
    it cannot listen on raised as one line (:class:`CannotListen`)."""
    from broker.log import LogError
    from broker.server import MQTTCannotListen

    try:
        return await nursery.start(start)
    except LogError:
        raise  # the data directory: not an address (some are OSErrors too)
    except MQTTCannotListen as error:
        raise CannotListen("MQTT clients", error.address, "--mqtt-listen", error) from None
    except OSError as error:
        if error.filename is not None:
            raise  # a file (of the data directory), not the address
        raise CannotListen("clients", config.listen_address, "--listen", error) from None


async def _announce(
    nursery: trio.Nursery,
    broker: Broker,
    serve_metrics: Callable[..., Awaitable[None]] | None,
    config: BrokerConfig,
) -> None:
    """Start ``serve_metrics`` (if any) and say where the broker and its
    metrics listen, in the lines scripts wait for."""
    lines = [f"broker listening on {broker.address[0]}:{broker.address[1]}"]
    metrics = config.metrics_address
    if serve_metrics is not None and metrics is not None:
        try:
            host, port = await nursery.start(serve_metrics)
        except OSError as error:
            raise metrics_unavailable(metrics, error) from None
        lines.append(f"metrics on http://{host}:{port}/metrics")
    if broker.mqtt is not None:  # (last: scripts read the lines above first)
        tls = " (TLS)" if broker.mqtt.ssl_context is not None else ""
        lines.append(f"MQTT on {broker.mqtt.address[0]}:{broker.mqtt.address[1]}{tls}")
    print("\n".join(lines), flush=True)


async def _serve_front_end(
    config: BrokerConfig, signals: AsyncIterator[int], nursery: trio.Nursery
) -> None:
    """Cluster mode: serve as a front end (see ``broker.server._front_end``);
    the metrics follow the broker it serves with (a new one each time the
    front ends change)."""
    from broker.server._front_end import serve_front_end

    metrics = config.metrics_address
    scope = trio.CancelScope()

    async def serve_metrics_of(
        broker: Broker, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        from broker.metrics import serve_metrics

        assert metrics is not None
        with scope:
            await serve_metrics(broker, *metrics, task_status=task_status)

    def restarted(broker: Broker) -> None:
        nonlocal scope
        if metrics is not None:
            scope.cancel()
            scope = trio.CancelScope()
            nursery.start_soon(partial(_metrics_again, serve_metrics_of, broker))

    run: FrontEndRun = await _start(
        nursery, partial(serve_front_end, config, on_restart=restarted), config
    )
    serve = None if metrics is None else partial(serve_metrics_of, run.broker)
    await _announce(nursery, run.broker, serve, config)
    await stop_on_signals(signals, run.shutdown, config.shutdown_deadline)
    nursery.cancel_scope.cancel()


async def _metrics_again(serve: Callable[..., Awaitable[None]], broker: Broker) -> None:
    """Serve the metrics of ``broker`` (the front end's new one) on the same
    address once the old server let it go."""
    for _ in range(50):
        try:
            await serve(broker)
            return
        except OSError:
            await trio.sleep(0.1)
