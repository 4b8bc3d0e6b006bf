"""The ``broker`` command line.

``broker serve`` runs the broker (the server lands with the broker-core work;
until then it says so and exits non-zero). ``broker bench`` runs the project's
own benchmarks and prints a table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__

log = logging.getLogger("broker")

#: Benchmark suites: name -> (module, help). Imported lazily so that
#: ``broker --help`` stays fast and needs nothing beyond the core dependencies.
BENCH_SUITES: dict[str, tuple[str, str]] = {
    "actors": ("broker.bench.actors", "loaned sends through actor mailboxes"),
    "protocol": ("broker.bench.protocol", "frame encode/decode and the sans-IO connection"),
}


def _cmd_serve(args: argparse.Namespace) -> int:
    print(
        "broker serve: not yet - the network server is not implemented in this "
        "version (it arrives with the broker-core milestone). Nothing is listening.",
        file=sys.stderr,
    )
    return 2


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    results: dict[str, Any] = {}
    for suite in args.suites or list(BENCH_SUITES):
        module = importlib.import_module(BENCH_SUITES[suite][0])
        run: Callable[..., dict[str, Any]] = module.run
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

    serve = sub.add_parser("serve", help="run the broker (not yet implemented)")
    serve.set_defaults(func=_cmd_serve)

    bench = sub.add_parser("bench", help="run the project's benchmarks")
    bench.add_argument(
        "suites",
        nargs="*",
        choices=sorted(BENCH_SUITES),
        help="which suites to run (default: all); "
        + "; ".join(f"{k}: {v[1]}" for k, v in BENCH_SUITES.items()),
    )
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--quick", action="store_true", help="short runs (for smoke tests)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``broker`` command; returns the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)
