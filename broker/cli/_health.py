"""``broker health``: ask a running broker's HTTP endpoint whether it is ready (or alive)."""

from __future__ import annotations

import argparse
import sys

from ._common import DEFAULT_METRICS, Subparsers, add_command, positive_float
from ._stat import metrics_url, not_http, unreachable

EXAMPLES = """
  broker health                                 # exit 0 if ready (accepting clients)
  broker health --live --metrics 10.0.0.5:9400  # exit 0 if its event loop answers
  HEALTHCHECK CMD broker health --timeout 2     # in a Dockerfile
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "health",
        help="exit 0 if a running broker is ready (or, with --live, alive), else 1",
        description="Ask a broker's HTTP endpoint: /readyz (accepting clients) or, with "
        "--live, /healthz (its event loop answers). For container health checks.",
        examples=EXAMPLES,
    )
    parser.add_argument("--live", action="store_true", help="liveness instead of readiness")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the answer (default: 5)",
    )
    parser.add_argument(
        "--metrics",
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help="the broker's metrics address (its metrics_listen) (default: %(default)s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import http.client
    import urllib.error
    import urllib.request

    url = metrics_url(args.metrics) + ("/healthz" if args.live else "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            print(f"{url}: {response.status} {response.read().decode(errors='replace').strip()}")
            return 0
    except urllib.error.HTTPError as error:
        print(f"broker health: {url}: {error.code} {error.reason}", file=sys.stderr)
    except OSError as error:
        print(f"broker health: {unreachable(url, error)}", file=sys.stderr)
    except http.client.HTTPException as error:
        print(f"broker health: {not_http(url, error)}", file=sys.stderr)
    return 1
