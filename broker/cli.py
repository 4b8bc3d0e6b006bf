"""The ``broker`` command line.

``broker serve`` runs the broker; ``broker pub`` / ``broker sub`` publish and
print messages; ``broker stat`` shows a running broker's connections,
accounts and channels; ``broker bench`` runs the project's own benchmarks and
prints a table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import trio

from . import __version__
from .config import FIELDS, BrokerConfig, ConfigError, load_config
from .errors import sole_exception
from .runtime import tune_gc

log = logging.getLogger("broker")

#: Benchmark suites: name -> (module, help). Imported lazily so that
#: ``broker --help`` stays fast and needs nothing beyond the core dependencies.
BENCH_SUITES: dict[str, tuple[str, str]] = {
    "actors": ("broker.bench.actors", "loaned sends through actor mailboxes"),
    "protocol": ("broker.bench.protocol", "frame encode/decode and the sans-IO connection"),
    "broker": (
        "broker.bench.broker",
        "a real broker process: 1->1, 1->10, latency, slow consumer",
    ),
}


def _config_from(args: argparse.Namespace) -> BrokerConfig:
    overrides: dict[str, Any] = {"listen": args.listen, "metrics_listen": args.metrics_listen}
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects NAME=VALUE, got {item!r}")
        overrides[name.strip()] = value.strip()
    return load_config(args.config or os.environ.get("BROKER_CONFIG") or None, overrides=overrides)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .auth import AuthError
    from .tls import TLSConfigError

    try:
        config = _config_from(args)
    except ConfigError as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 2
    try:
        try:
            trio.run(_serve, config)
        except BaseExceptionGroup as group:
            failure = sole_exception(group)
            if failure is group:
                raise
            raise failure from None
    except (AuthError, TLSConfigError) as error:
        print(f"broker serve: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"broker serve: cannot listen: {error}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: BrokerConfig) -> None:
    from .server import serve_broker

    tune_gc(config.gc_threshold)

    async with trio.open_nursery() as nursery:
        broker = await nursery.start(serve_broker, config)
        print(f"broker listening on {broker.address[0]}:{broker.address[1]}", flush=True)
        metrics = config.metrics_address
        if metrics is not None:
            from .metrics import serve_metrics

            host, port = await nursery.start(serve_metrics, broker, *metrics)
            print(f"metrics on http://{host}:{port}/metrics", flush=True)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                break
        await broker.shutdown()
        nursery.cancel_scope.cancel()


def _bad_topic(command: str, topic: str) -> bool:
    """Print one line and say so if ``topic`` breaks the topic-name rule
    (checked before connecting, so a bad name never reaches the broker)."""
    from .protocol import topic_name_problem

    problem = topic_name_problem(topic)
    if problem is not None:
        print(f"broker {command}: {problem}", file=sys.stderr)
    return problem is not None


def _cmd_pub(args: argparse.Namespace) -> int:
    from .errors import BrokerError

    if _bad_topic("pub", args.topic):
        return 2
    try:
        count = trio.run(_pub, args)
    except (BrokerError, OSError) as error:
        print(f"broker pub: {error}", file=sys.stderr)
        return 1
    print(f"published {count} message(s) to {args.topic!r}", file=sys.stderr)
    return 0


async def _pub(args: argparse.Namespace) -> int:
    from .client import open_client, parse_servers, route

    key = args.key.encode() if args.key is not None else None
    count = 0
    server = route(args.topic, parse_servers(args.broker))
    async with open_client(server, name="broker-pub", **_client_options(args)) as client:
        if args.message is not None:
            await client.publish(args.topic, args.message.encode(), key=key)
            count = 1
        else:
            async for line in _lines(sys.stdin.buffer):
                await client.publish(args.topic, line, key=key)
                count += 1
    return count


async def _lines(stream: Any) -> AsyncIterator[bytes]:
    """The lines of a binary ``stream`` (without their newline), read in
    64 KiB chunks in a worker thread: one thread hop per chunk, not per line."""
    pending = b""
    while chunk := await trio.to_thread.run_sync(stream.read1, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _cmd_sub(args: argparse.Namespace) -> int:
    from .errors import BrokerError

    if _bad_topic("sub", args.topic):
        return 2
    try:
        trio.run(_sub, args)
    except (BrokerError, OSError) as error:
        print(f"broker sub: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


async def _sub(args: argparse.Namespace) -> None:
    from .client import open_client, parse_servers, route

    out = sys.stdout.buffer
    async with (
        open_client(
            route(args.topic, parse_servers(args.broker)),
            name="broker-sub",
            **_client_options(args),
        ) as client,
        client.subscribe(args.topic) as subscription,
    ):
        print(f"subscribed to {args.topic!r}", file=sys.stderr, flush=True)
        received = 0
        async for message in subscription:
            if message.key is not None and args.show_keys:
                out.write(message.key + b"\t")
            out.write(message.payload + b"\n")
            out.flush()
            received += 1
            if args.count and received >= args.count:
                break


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    """``open_client`` keyword arguments from the client flags (token, TLS files)."""
    from .tls import client_context

    token = args.token if args.token is not None else os.environ.get("BROKER_TOKEN")
    options: dict[str, Any] = {"token": token or None}
    if args.tls or args.cafile or args.cert:
        options["ssl_context"] = client_context(args.cafile, args.cert, args.key_file)
    return options


def _metrics_url(address: str) -> str:
    url = address.rstrip("/")
    return url if "://" in url else "http://" + url


def _cmd_stat(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    url = _metrics_url(args.metrics)
    try:
        with urllib.request.urlopen(url + "/stat.json", timeout=10) as response:
            document = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        print(f"broker stat: cannot read {url}/stat.json: {error}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        _print_stat(document)
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    url = _metrics_url(args.metrics) + ("/healthz" if args.live else "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            print(f"{url}: {response.status} {response.read().decode(errors='replace').strip()}")
            return 0
    except urllib.error.HTTPError as error:
        print(f"{url}: {error.code} {error.reason}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as error:
        print(f"{url}: unreachable: {error}", file=sys.stderr)
    return 1


def _cmd_token(args: argparse.Namespace) -> int:
    import secrets

    from .auth import AuthError, check_principal_name, token_digest

    try:
        check_principal_name(args.principal, f"broker token: {args.principal!r}")
    except AuthError as error:
        print(error, file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(32)
    print(f"token: {token}", file=sys.stderr)
    print("# Give the client the token above (broker pub --token, BROKER_TOKEN, token=...).")
    print(f"[principals.{args.principal}]")
    print(f'token_sha256 = "{token_digest(token)}"')
    return 0


def _print_stat(document: dict[str, Any]) -> None:
    broker = document.get("broker", {})
    for key, value in broker.items():
        if isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items())
        print(f"{key:<12} {value}")
    connections = document.get("connections", [])
    print(f"\n{len(connections)} connection(s)")
    for connection in connections:
        account = connection.get("account", {})
        print(
            f"  {connection.get('name', '?'):<10} {connection.get('peer', '?'):<22} "
            f"client={connection.get('client', '')!r} "
            + "".join(
                f"{key}={connection[key]!r} "
                for key in ("principal", "identity")
                if connection.get(key) is not None
            )
            + f"debt={account.get('debt', 0)} "
            f"peak={account.get('peak_debt', 0)} blocked={account.get('blocked', False)}"
        )
        for channel in connection.get("channels", []):
            fields = ("capacity", "buffered", "sender_balance", "balance", "sent_frames")
            shown = " ".join(f"{k}={channel[k]}" for k in fields if k in channel)
            debt = channel.get("account", {}).get("debt")
            extra = f" topic={channel['topic']!r} debt={debt}" if "topic" in channel else ""
            print(f"      {channel.get('kind', '?'):<8} {channel.get('channel')} {shown}{extra}")
        for subscription in connection.get("subscriptions", []):
            print(
                f"      subscription {subscription.get('handle')} "
                f"topic={subscription.get('topic')!r} queued={subscription.get('queued')} "
                f"delivered={subscription.get('delivered')}"
            )


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    unknown = [suite for suite in args.suites if suite not in BENCH_SUITES]
    if unknown:
        print(
            f"broker bench: unknown suite {unknown[0]!r} (choose from {', '.join(BENCH_SUITES)})",
            file=sys.stderr,
        )
        return 2

    # Progress goes to a terminal's stderr only: stdout stays the result.
    def progress(step: str) -> None:
        print(f"  {step}...", file=sys.stderr, flush=True)

    on_terminal = sys.stderr.isatty()
    results: dict[str, Any] = {}
    suites = args.suites or list(BENCH_SUITES)
    for number, suite in enumerate(suites, 1):
        module = importlib.import_module(BENCH_SUITES[suite][0])
        run: Callable[..., dict[str, Any]] = module.run
        if on_terminal:
            print(f"[{number}/{len(suites)}] {suite}: {BENCH_SUITES[suite][1]}", file=sys.stderr)
        if suite == "broker" and on_terminal:
            results[suite] = run(quick=args.quick, progress=progress)
        else:
            results[suite] = run(quick=args.quick)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        for suite, result in results.items():
            print(f"== {suite}")
            width = max(len(k) for k in result)
            for key, value in result.items():
                shown = f"{value:,.0f}" if isinstance(value, float) and value > 100 else value
                print(f"  {key:<{width}}  {shown}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``broker`` command."""
    parser = argparse.ArgumentParser(
        prog="broker",
        description="A flow-controlled pub/sub broker of actors on trio.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the broker",
        description="Run the broker until SIGINT/SIGTERM (then: stop accepting, Goodbye 5, "
        "drain). Settings: defaults < --config TOML < BROKER_<NAME> environment < flags.",
    )
    serve.add_argument("--listen", metavar="HOST:PORT", help="client address (127.0.0.1:7400)")
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="Prometheus /metrics address (127.0.0.1:9400; empty to disable)",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="TOML file ([broker] table; default: $BROKER_CONFIG)"
    )
    serve.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="any setting, e.g. --set connection_budget=8388608 (repeatable): " + ", ".join(FIELDS),
    )
    serve.set_defaults(func=_cmd_serve)

    pub = sub.add_parser("pub", help="publish MESSAGE (or each line of stdin) to TOPIC")
    pub.add_argument("topic")
    pub.add_argument("message", nargs="?", help="the payload (default: lines from stdin)")
    pub.add_argument("--key", help="message key")
    pub.set_defaults(func=_cmd_pub)

    subscribe = sub.add_parser("sub", help="print the messages of TOPIC, one per line")
    subscribe.add_argument("topic")
    subscribe.add_argument("--count", type=int, default=0, help="stop after N messages")
    subscribe.add_argument("--show-keys", action="store_true", help="print KEY<TAB>PAYLOAD")
    subscribe.set_defaults(func=_cmd_sub)
    for client_parser in (pub, subscribe):
        _add_client_flags(client_parser)

    stat = sub.add_parser("stat", help="connections, accounts and channels of a running broker")
    stat.add_argument("--json", action="store_true", help="print the raw JSON")
    stat.set_defaults(func=_cmd_stat)

    health = sub.add_parser(
        "health",
        help="exit 0 if a running broker is ready (or, with --live, alive), else 1",
        description="Ask a broker's HTTP endpoint: /readyz (accepting clients) or, with "
        "--live, /healthz (its event loop answers). For container health checks.",
    )
    health.add_argument("--live", action="store_true", help="liveness instead of readiness")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds (default: 5)")
    health.set_defaults(func=_cmd_health)
    for http_parser in (stat, health):
        http_parser.add_argument(
            "--metrics", default="127.0.0.1:9400", help="the broker's metrics address"
        )

    token = sub.add_parser(
        "token",
        help="make a new client token and its auth-file entry",
        description="Print a new random token (on stderr) and the [principals.NAME] table "
        "that admits it (on stdout, for the auth_file; it holds only the token's SHA-256).",
    )
    token.add_argument("principal", help="the principal's name in the auth file")
    token.set_defaults(func=_cmd_token)

    bench = sub.add_parser("bench", help="run the project's benchmarks")
    bench.add_argument(
        "suites",
        nargs="*",
        # (Checked in _cmd_bench: Python 3.11's argparse refuses an empty list
        # against choices for nargs="*".)
        metavar="{" + ",".join(sorted(BENCH_SUITES)) + "}",
        help="which suites to run (default: all); "
        + "; ".join(f"{k}: {v[1]}" for k, v in BENCH_SUITES.items()),
    )
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--quick", action="store_true", help="short runs (for smoke tests)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        default="127.0.0.1:7400",
        help="broker address: HOST:PORT, or tls://HOST:PORT for TLS; several, comma-separated, "
        "for brokers that share the topics (the topic's owner is used) (default: %(default)s)",
    )
    parser.add_argument(
        "--token", help="credential for a broker that authenticates (or $BROKER_TOKEN)"
    )
    parser.add_argument("--tls", action="store_true", help="use TLS (system trust store)")
    parser.add_argument(
        "--cafile", help="PEM file of the CA that signed the broker (implies --tls)"
    )
    parser.add_argument("--cert", help="PEM client certificate for mutual TLS (implies --tls)")
    parser.add_argument("--key-file", help="PEM key of --cert (if not in the same file)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``broker`` command; returns the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)
