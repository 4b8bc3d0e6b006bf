"""``broker pub``: publish a message, a file, or stdin (whole or line by line) to a topic."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import trio

from ._common import (
    EXIT_INTERRUPTED,
    Interrupt,
    Subparsers,
    add_client_flags,
    add_command,
    client_options,
    positive_float,
    positive_int,
    refuse_brokers,
    refuse_habits,
    refuse_topics,
    run_interruptibly,
    unescape,
)

#: Bytes read from stdin at a time (one worker-thread hop per chunk, not per line).
CHUNK = 65536

EXAMPLES = r"""
  broker pub news hello                         # one message
  broker pub news hello --key user-7 -H source=cli -H lang=en
  some-command | broker pub news                # each line of stdin is a message
  printf 'user-7:hi\nuser-8:ho\n' | broker pub news -K :   # KEY:PAYLOAD lines
  broker pub images --file cat.jpg              # a whole file as one message
  broker pub docs -s < report.json              # all of stdin as one message
  broker pub ticks tick --repeat 1000 --rate 100   # 1000 messages at 100/s

Lines: without MESSAGE, --file or -s, every line of stdin is one message,
published as it is read (Ctrl-C stops at once and says how many went). The
newline is not part of the message, nor is one '\r' before it (CRLF files).
An empty line is an empty message (so `broker sub t | broker pub u` copies
every message of a single line); --skip-empty skips them, as mosquitto_pub -l
does.

Size: a message may be as large as the broker's max_message (8 MiB by
default; `broker serve --set max_message=...` raises it, up to what its topic
logs' term_bytes hold). One larger than a frame (max_frame, 64 KiB by
default) is sent in parts and arrives whole; one larger than max_message is
refused before it is sent. Exit status: 0 when everything was published, 1 on an error (saying
how many were published before it), 130 when interrupted.
"""


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value.encode()


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "pub",
        help="publish MESSAGE, a file, or stdin (each line, or all of it) to TOPIC",
        description="Publish to TOPIC: MESSAGE, or a file (--file), or all of stdin as one "
        "message (-s), or else each line of stdin. Leaving waits until the broker has "
        "routed every message, then prints how many were published (on stderr).",
        examples=EXAMPLES,
    )
    parser.add_argument("topic", metavar="TOPIC", help="the topic to publish to")
    parser.add_argument(
        "message",
        nargs="?",
        metavar="MESSAGE",
        help="the payload (default: read stdin, one message per line)",
    )
    what = parser.add_argument_group("message")
    what.add_argument(
        "-k",
        "--key",
        help="message key of every message (the TLS key file is --key-file)",
    )
    what.add_argument(
        "-H",
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="NAME=VALUE",
        help="a header on every message (repeatable)",
    )
    source = parser.add_argument_group("where the payload comes from")
    source.add_argument("-f", "--file", metavar="PATH", help="send the whole file as one message")
    source.add_argument(
        "-s",
        "--stdin-whole",
        action="store_true",
        help="send all of stdin as one message (mosquitto_pub -s)",
    )
    source.add_argument(
        "-K",
        "--key-separator",
        metavar="SEP",
        help=r"stdin lines are KEY SEP PAYLOAD, split at the first SEP (kcat -K; '\t' is a "
        "tab); a line without SEP has no key (or --key)",
    )
    source.add_argument(
        "--skip-empty", action="store_true", help="skip empty stdin lines (default: send them)"
    )
    pace = parser.add_argument_group("how many, how fast")
    pace.add_argument(
        "--repeat", type=positive_int, default=1, metavar="N", help="send each message N times"
    )
    pace.add_argument(
        "--rate",
        type=positive_float,
        metavar="R",
        help="at most R messages per second (default: as fast as the broker takes them)",
    )
    add_client_flags(parser)
    refuse_habits(
        parser,
        {
            ("-t", "--topic"): "TOPIC is positional, first: broker pub news hello",
            ("-m", "--message"): "MESSAGE is positional, after TOPIC: broker pub news hello",
        },
    )
    parser.set_defaults(func=run, parser=parser)


#: After a Ctrl-C, how long the flush may take before it is said what it waits for.
FLUSH_NOTICE_AFTER = 1.0


@dataclass
class _Tally:
    published: int = 0
    #: What the broker confirmed (routed), read from the client once it is done.
    confirmed: Callable[[], int] = lambda: 0


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    sources = [args.message is not None, args.file is not None, args.stdin_whole]
    if sum(sources) > 1:
        parser.error("give only one of MESSAGE, --file and -s/--stdin-whole")
    if any(sources) and (args.key_separator is not None or args.skip_empty):
        parser.error("-K/--key-separator and --skip-empty apply to stdin lines only")
    if args.key_separator == "":
        parser.error("-K/--key-separator must not be empty")
    refused = refuse_brokers("pub", args)
    if refused is not None:
        return refused
    refused = refuse_topics("pub", [args.topic])
    if refused is not None:
        return refused
    payload: bytes | None = None
    if args.file is not None:
        try:
            with open(args.file, "rb") as file:
                payload = file.read()
        except OSError as error:
            print(f"broker pub: cannot read {args.file}: {error.strerror}", file=sys.stderr)
            return 1
    elif args.message is not None:
        payload = args.message.encode()
    elif sys.stdin.isatty():  # (no MESSAGE: without this a terminal just waits)
        what = "all of stdin is one message" if args.stdin_whole else "each line is a message"
        print(f"broker pub: reading stdin ({what}); Ctrl-D to end", file=sys.stderr)
    tally = _Tally()

    async def body(interrupt: Interrupt) -> None:
        await _pub(args, payload, tally, interrupt)

    interrupt, status = run_interruptibly("pub", body)
    said = f"published {tally.published} message(s) to {args.topic!r}"
    if status is not None:
        if tally.published:
            # Only what the broker confirmed is certain to be published: the
            # rest may or may not have been (send it again to be sure).
            print(
                f"broker pub: (the broker confirmed {tally.confirmed()} of the "
                f"{tally.published} message(s) given for {args.topic!r} before that)",
                file=sys.stderr,
            )
        return status
    if interrupt.interrupted:
        print(f"broker pub: interrupted: {said}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(said, file=sys.stderr)
    return 0


async def _pub(
    args: argparse.Namespace, payload: bytes | None, tally: _Tally, interrupt: Interrupt
) -> None:
    from broker.client import open_client, parse_servers, route
    from broker.protocol import LocalProtocolError

    key = args.key.encode() if args.key is not None else None
    if payload is None and args.stdin_whole:
        payload = await _read_all(_stdin_reader())
    server = route(args.topic, parse_servers(args.broker))
    async with open_client(server, name="broker-pub", **client_options(args)) as client:
        tally.confirmed = lambda: client.statistics()["confirmed"]
        interrupt.reconnecting = lambda: client.reconnecting
        headers = args.header or None
        started = trio.current_time()

        async def publish(message_key: bytes | None, message: bytes) -> None:
            for _ in range(args.repeat):
                if args.rate is not None:
                    await trio.sleep_until(started + tally.published / args.rate)
                await client.publish(args.topic, message, key=message_key, headers=headers)
                tally.published += 1

        async def publish_all() -> None:
            if payload is not None:
                await publish(key, payload)
                return
            separator = None if args.key_separator is None else unescape(args.key_separator)
            async for line in _lines(_stdin_reader()):
                line = line.removesuffix(b"\r")
                if not line and args.skip_empty:
                    continue
                line_key = key
                if separator is not None:
                    before, sep, after = line.partition(separator.encode())
                    if sep:
                        line_key, line = before, after
                await publish(line_key, line)

        # Ctrl-C stops publishing at once; leaving the client then flushes
        # what was published (unless a second Ctrl-C cuts that short too).
        with interrupt.working():
            try:
                await publish_all()
            except LocalProtocolError:
                # A message refused before it was sent (larger than the
                # broker's max_message): the connection is fine, so what went
                # before is confirmed first, and the count said is true (a
                # user told "confirmed 0" would send those again: twice).
                await client.flush()
                raise
        if interrupt.interrupted:
            # The flush waits for the broker, which may throttle this topic for
            # long (a subscriber that does not keep up): say so, and how to leave.
            with trio.move_on_after(FLUSH_NOTICE_AFTER) as waiting:
                await client.flush()
            if waiting.cancelled_caught:
                print(
                    "broker pub: interrupted: waiting for the broker to confirm what was "
                    "published (Ctrl-C again to leave without)",
                    file=sys.stderr,
                )


async def _read_all(read: Callable[[int], bytes]) -> bytes:
    """Everything ``read`` returns until it returns nothing (end of input);
    see :func:`_lines`."""
    chunks = []
    while chunk := await trio.to_thread.run_sync(read, CHUNK, abandon_on_cancel=True):
        chunks.append(chunk)
    return b"".join(chunks)


async def _lines(read: Callable[[int], bytes]) -> AsyncIterator[bytes]:
    """The lines (without their newline) of what ``read(size)`` returns until
    it returns nothing, read in 64 KiB chunks in a worker thread: one thread
    hop per chunk, not per line.

    Cancelling (Ctrl-C) does not wait for the read under way (a terminal's
    read returns only at Enter): the thread is abandoned. So ``read`` must
    hold no lock the interpreter needs at exit: ``os.read`` on the file
    descriptor, not ``sys.stdin.buffer`` (whose lock, held by an abandoned
    read, aborts the interpreter's shutdown)."""
    pending = b""
    while chunk := await trio.to_thread.run_sync(read, CHUNK, abandon_on_cancel=True):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _stdin_reader() -> Callable[[int], bytes]:
    """``read(size)`` of stdin's file descriptor (see :func:`_lines`)."""
    return functools.partial(os.read, sys.stdin.fileno())
