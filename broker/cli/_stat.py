"""``broker stat``: a running broker's budgets, topics, connections, accounts
and channels (its ``/stat.json``), once or refreshed like ``top``."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import time
from typing import Any

from ._common import DEFAULT_METRICS, Subparsers, add_command, positive_float
from ._stat_text import render

#: Seconds between refreshes of ``--watch`` without a number.
WATCH_DEFAULT = 2.0
#: Moves to the top left and clears the terminal (ANSI), as ``top`` redraws.
CLEAR = "\x1b[H\x1b[2J"

EXAMPLES = """
  broker stat                                   # once, as text
  broker stat --watch                           # refresh every 2 s until Ctrl-C
  broker stat --watch 0.5 --metrics 10.0.0.5:9400
  broker stat --json | jq '.topics[] | select(.queued > 0)'
  broker stat --json | jq '.logs.topics[] | select(.blocked)'
  broker stat --json --watch 10 >> stat.jsonl   # a snapshot a line, every 10 s

The text shows the sections of the JSON by their names: broker (address,
statistics, account), budgets, principals, topics (publishers,
subscriptions, queued, messages_in), topic logs (a broker with a data
directory: free disk, appends, errors; per topic first_offset, last_offset,
bytes, terms, held batches and lag in records; each reliable subscription's
position, acked and lag; the durable cursors), then each connection with its
account (debt), buffer_reserved and unsent_bytes, its channels and its
subscriptions (mode, queued, delivered). A merged document (the endpoint
of a supervisor of several workers) also has a workers section (id, pid, up,
restarts, direct address, client connections now and accepted since it
started, topics, messages in) and tags each connection and topic with
@worker. --watch redraws the screen on a terminal; into a file or pipe it
appends each snapshot after a line with its time. A broker that does not
answer is said, and watched for again.
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "stat",
        help="budgets, topics, connections, accounts and channels of a running broker",
        description="Show what a running broker's /stat.json holds (from its metrics "
        "address), as text or JSON, once or every few seconds.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "--metrics",
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help="the broker's metrics address (its metrics_listen) (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument(
        "-w",
        "--watch",
        nargs="?",
        const=WATCH_DEFAULT,
        type=positive_float,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {WATCH_DEFAULT:g}) until Ctrl-C",
    )
    parser.set_defaults(func=run)


def not_http(url: str, error: http.client.HTTPException) -> str:
    """Why ``url`` gave no HTTP answer (a bad address, or not the metrics
    listener: the broker's client port, say), in one line."""
    if isinstance(error, http.client.InvalidURL):
        return f"bad --metrics address in {url}: {error}"
    return (
        f"{url} did not answer as HTTP (is it the broker's client port? "
        "give --metrics the address of metrics_listen, 127.0.0.1:9400 by default)"
    )


def unreachable(url: str, error: OSError) -> str:
    """Why ``url`` could not be read (``urllib``'s error), in one line that
    says what to check."""
    import socket
    import urllib.error

    reason: object = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, ConnectionRefusedError):
        why = "connection refused (is a broker running there? give --metrics its metrics_listen)"
    elif isinstance(reason, socket.gaierror):
        why = f"cannot find the host: {reason.strerror} (check the host of --metrics)"
    elif isinstance(reason, TimeoutError | socket.timeout):
        why = "no answer in time (is the broker's event loop stuck, or the address wrong?)"
    elif isinstance(reason, OSError) and reason.strerror:
        why = reason.strerror
    else:
        why = str(reason)
    return f"cannot read {url}: {why}"


def metrics_url(address: str) -> str:
    """``HOST:PORT`` (or a URL) -> the endpoint's base URL."""
    url = address.rstrip("/")
    return url if "://" in url else "http://" + url


def fetch(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """``url/stat.json`` as a dict; raises :class:`OSError` or :class:`ValueError`."""
    import urllib.request

    with urllib.request.urlopen(url + "/stat.json", timeout=timeout) as response:
        document = json.load(response)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _snapshot(url: str, as_json: bool, *, compact: bool) -> tuple[str, bool]:
    """One snapshot as text (newline-terminated), and whether it was read."""
    try:
        document = fetch(url)
    except OSError as error:
        return f"broker stat: {unreachable(url + '/stat.json', error)}\n", False
    except ValueError as error:
        return f"broker stat: cannot read {url}/stat.json: {error}\n", False
    except http.client.HTTPException as error:
        return f"broker stat: {not_http(url, error)}\n", False
    if as_json:
        return json.dumps(document, indent=None if compact else 2) + "\n", True
    return render(document), True


def run(args: argparse.Namespace) -> int:
    url = metrics_url(args.metrics)
    if args.watch is None:
        text, ok = _snapshot(url, args.json, compact=False)
        (sys.stdout if ok else sys.stderr).write(text)
        return 0 if ok else 1
    on_terminal = sys.stdout.isatty()
    # Ctrl-C stops watching even when started with SIGINT ignored (as a
    # background job of a script is), like `broker pub` and `broker serve`.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            text, ok = _snapshot(url, args.json, compact=True)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            if on_terminal:
                head = f"{stamp}  {url}  every {args.watch:g} s (Ctrl-C to stop)\n\n"
                sys.stdout.write(CLEAR + head + text)
            elif not ok:
                sys.stderr.write(f"{stamp} {text}")
            elif args.json:
                sys.stdout.write(text)
            else:
                sys.stdout.write(f"--- {stamp}\n{text}")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0  # the way to stop watching
    except BrokenPipeError:  # the reader went away (`| head`): that ends it, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        signal.signal(signal.SIGINT, previous)
