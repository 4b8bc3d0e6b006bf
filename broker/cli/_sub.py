"""``broker sub``: print the messages of one or more topics."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from ._output import PLACEHOLDERS, FormatError, json_line, raw, template_printer

if TYPE_CHECKING:  # (only for its type: ``broker --help`` need not import the client)
    from broker.client import ClusterClient, Start

EXAMPLES = r"""
  broker sub news                               # each payload on a line, as it is
  broker sub news --count 1 --timeout 5         # one message, or give up after 5 s
  broker sub news alerts --format '{topic} {seq} {key} {payload}'
  broker sub news --show-keys                   # KEY<TAB>PAYLOAD
  broker sub news --json | jq .payload          # one JSON object per line
  broker sub prices --mode latest --max-queued 100   # drops rather than slows publishers
  broker sub news --from earliest               # every record the topic's log still has
  broker sub news --from 1234 --format '{offset} {payload}'   # from offset 1234 on
  broker sub news --from 2026-11-25T10:00:00Z   # what arrived since then (give a timezone)
  broker sub news --from -10m                   # the last ten minutes (-30s, -2h, -1d, -1h30m)
  broker sub news --cursor billing              # go on where the cursor "billing" stopped
  broker sub jobs --group workers               # share the messages with other members

Where to start (--from, --cursor; reliable mode, on a broker with a data
directory, which keeps each topic's log): by default with the next message
published. --from earliest starts at the first record kept, --from OFFSET at
that record (a message's offset: {offset} in --format, "offset" in --json;
offset + 1 continues after it), --from TIME at the first record received at
or after TIME. --cursor NAME is a durable cursor the broker keeps: the next
`broker sub --cursor NAME` on the topic goes on after the last message this
one took (--from applies only to a cursor's first use).

Consumer groups (--group NAME): the members of a group, however many
`broker sub --group NAME` run on the topic, share its messages: each goes to
one member, which settles it (done) once printed. A member that stops gives
back what it held and did not print; the group goes on where it stopped
(--from applies only to a group's first use).

Output: by default each payload as it is, then a newline (a payload that
holds newlines spans lines). --format and --show-keys escape every field
(backslash, tab, CR, LF, other control characters and bytes that are not
UTF-8 become \\ \t \r \n \xNN), so each message is exactly one line and the
template's separators always separate. --json prints one object per line:
{"topic", "seq", "offset", "key", "headers": [[NAME, VALUE]...], "payload",
"encoding"}, where "offset" is null without a topic log and "encoding" is
"utf-8" (payload, key and header values as text) or "base64" (all of them
in base64, when one is not UTF-8).
Several topics: messages of each topic in order, topics interleaved as they
arrive. Exit status: 0 after --count messages or --timeout seconds of
silence, 1 on an error, 130 on Ctrl-C.
"""


def mqtt_hint(topic: str) -> str | None:
    """One line saying the NATS-style pattern of an MQTT wildcard topic
    (``#``, or a ``+`` token between ``/`` or ``.``), or None if it is none."""
    tokens = re.split(r"[/.]", topic)
    if "#" not in topic and "+" not in tokens:
        return None
    nats = ".".join("*" if token == "+" else ">" if token == "#" else token for token in tokens)
    return (
        f"{topic!r} is an MQTT wildcard: patterns here are NATS-style, over '.'-separated "
        f"tokens ('*' one token, a last '>' one or more): write {nats!r}"
    )


def refuse_wildcards(topics: list[str]) -> int | None:
    """2 after one line on the first TOPIC that is an MQTT wildcard or a
    broken pattern (a ``*``, or a ``>`` token, that breaks the pattern
    rule); None to go on."""
    from broker.protocol import topic_pattern_error

    for topic in topics:
        problem = mqtt_hint(topic)
        if problem is None and ("*" in topic or ">" in topic.split(".")):
            problem = topic_pattern_error(topic)
        if problem is not None:
            print(f"broker sub: {problem}", file=sys.stderr)
            return 2
    return None


def is_topic_pattern(topic: str) -> bool:
    """Whether TOPIC is a pattern (see :func:`broker.protocol.is_topic_pattern`)."""
    from broker.protocol import is_topic_pattern as is_pattern

    return is_pattern(topic)


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "sub",
        help="print the messages of one or more topics, one per line",
        description="Subscribe to each TOPIC and print its messages as they arrive "
        "(on stdout; what it does on stderr).",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "topics",
        nargs="+",
        metavar="TOPIC",
        help="a topic to subscribe to, or a pattern: orders.* (one token), orders.> (one or more)",
    )
    stop = parser.add_argument_group("when to stop (default: never)")
    stop.add_argument(
        "-c", "--count", type=positive_int, metavar="N", help="stop after N messages in all"
    )
    stop.add_argument(
        "-e",
        "--until-end",
        action="store_true",
        help="stop, status 0, once what each topic held when it started is printed "
        "(kcat -e; topics made later are left out; with --from latest, the default, "
        "that is nothing: give --from)",
    )
    stop.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="stop when nothing has arrived for SECONDS",
    )
    out = parser.add_argument_group("output (default: each payload as it is)")
    shape = out.add_mutually_exclusive_group()
    shape.add_argument(
        "-F",
        "--format",
        metavar="TEMPLATE",
        help="print each message through TEMPLATE, placeholders "
        + ", ".join("{" + name + "}" for name in PLACEHOLDERS)
        + r" (escaped; '\t' and '\n' in TEMPLATE are a tab and a newline)",
    )
    shape.add_argument(
        "--show-keys",
        action="store_true",
        help=r"print KEY<TAB>PAYLOAD (the same as --format '{key}\t{payload}')",
    )
    shape.add_argument("--json", action="store_true", help="print one JSON object per line")
    mode = parser.add_argument_group("delivery mode")
    mode.add_argument(
        "--mode",
        choices=("reliable", "lossy", "latest"),
        default="reliable",
        help="reliable: publishers slow down for this subscriber; lossy: the oldest waiting "
        "messages are dropped when it falls behind; latest: only the newest of each key "
        "waits (default: %(default)s)",
    )
    mode.add_argument(
        "--max-queued",
        type=positive_int,
        metavar="N",
        help="lossy/latest: messages that may wait at the broker (default: 1000)",
    )
    mode.add_argument(
        "--max-queued-bytes",
        type=positive_int,
        metavar="BYTES",
        help="lossy/latest: bytes that may wait at the broker (default: 1 MiB)",
    )
    start = parser.add_argument_group(
        "where to start (reliable mode, on a broker that keeps topic logs)"
    )
    start.add_argument(
        "--from",
        dest="start",
        type=start_value,
        metavar="WHERE",
        help="earliest, latest (the default), an OFFSET, -N (the last N records of each "
        "topic), a TIME with a timezone (2026-11-25T10:00:00Z) or a duration back "
        "(-10m, -2h, -30s)",
    )
    start.add_argument(
        "--cursor",
        type=cursor_name,
        metavar="NAME",
        help="a durable cursor: go on after the last message it took, and keep its place",
    )
    group = parser.add_argument_group(
        "consumer groups (reliable mode, on a broker that keeps topic logs)"
    )
    group.add_argument(
        "--group",
        type=group_name,
        metavar="NAME",
        help="join the consumer group NAME: its members share the topic's messages; "
        "each is settled (done) once printed",
    )
    group.add_argument(
        "--max-outstanding",
        type=positive_int,
        metavar="N",
        help="--group: messages this member may hold unsettled at once (default: 1000)",
    )
    # "--from -10m" is a value, not an unknown flag: every argument that
    # starts like a negative number is a value (no flag of sub looks so).
    parser._negative_number_matcher = re.compile(r"^-\.?\d")
    add_client_flags(parser)
    refuse_habits(
        parser, {("-t", "--topic"): "TOPIC is positional: broker sub news [more topics ...]"}
    )
    parser.set_defaults(func=run, parser=parser)


#: A duration back in time: ``-10m``, ``-1h30m``, ``-1.5d`` (units s, m, h, d).
_DURATION = re.compile(r"-(?:[0-9]+(?:\.[0-9]+)?[smhd])+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WHERE = (
    "expected earliest, latest, an offset, -N (the last N records), a time with a "
    "timezone (2026-11-25T10:00:00Z) or a duration back (-10m)"
)


def start_value(text: str) -> Start:
    """An argparse type: where ``--from`` starts (see :data:`_WHERE`); a
    duration back is counted from now."""
    value: Start
    if text in ("earliest", "latest"):
        value = "earliest" if text == "earliest" else "latest"
    elif re.fullmatch("[0-9]+", text):
        value = int(text)
    elif _DURATION.fullmatch(text):
        seconds = sum(float(n) * _SECONDS[u] for n, u in _DURATION_PART.findall(text))
        try:
            value = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
        except OverflowError:
            raise argparse.ArgumentTypeError(f"{text}: too far back") from None
    elif re.fullmatch("-[0-9]+", text):
        value = int(text)  # the last N records (of each topic)
        if value == 0:
            raise argparse.ArgumentTypeError(
                "-N is the last N records, N at least 1 (latest: none of them)"
            )
    elif _DURATION.fullmatch("-" + text):
        raise argparse.ArgumentTypeError(f"a duration back is negative: -{text}, not {text}")
    else:
        try:
            value = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_WHERE}, got {text!r}") from None
        if value.tzinfo is None:
            raise argparse.ArgumentTypeError(
                f"{text!r} has no timezone: add one, e.g. {text}Z (UTC) or {text}+01:00"
            )
    from broker.client._start import subscribe_options

    try:
        subscribe_options("reliable", None, value)
    except ValueError as error:  # (an offset or a time out of range)
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def group_name(text: str) -> str:
    """An argparse type: a consumer group's name (the topic-name rule)."""
    from broker.protocol import topic_name_problem

    problem = topic_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"a group name: {problem}")
    return text


def cursor_name(text: str) -> str:
    """An argparse type: a durable cursor's name (the topic-name rule)."""
    from broker.client._start import subscribe_options

    try:
        subscribe_options("reliable", None, cursor=text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


@dataclass
class _Tally:
    received: int = 0
    missed: int = 0
    duplicates: int = 0
    timed_out: bool = False
    pipe_closed: bool = False


def _printer(args: argparse.Namespace) -> Callable[[Any], bytes]:
    if args.json:
        return json_line
    if args.show_keys:
        return template_printer("{key}\t{payload}")
    if args.format is not None:
        return template_printer(unescape(args.format))
    return raw


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    options: dict[str, int | str | bool | float | None] = {}
    if args.max_queued is not None:
        options["max_queued"] = args.max_queued
    if args.max_queued_bytes is not None:
        options["max_queued_bytes"] = args.max_queued_bytes
    if options and args.mode == "reliable":
        parser.error("--max-queued and --max-queued-bytes need --mode lossy or latest")
    if (args.start is not None or args.cursor is not None) and args.mode != "reliable":
        parser.error("--from and --cursor need --mode reliable")
    if args.group is not None and (args.mode != "reliable" or args.cursor is not None):
        parser.error("--group needs --mode reliable, without --cursor (a group keeps its place)")
    if args.max_outstanding is not None and args.group is None:
        parser.error("--max-outstanding needs --group")
    try:
        printer = _printer(args)
    except FormatError as error:
        parser.error(f"--format: {error}")
    refused = refuse_brokers("sub", args)
    if refused is not None:
        return refused
    refused = refuse_topics("sub", args.topics) or refuse_wildcards(args.topics)
    if refused is not None:
        return refused
    if args.group is not None and any(is_topic_pattern(topic) for topic in args.topics):
        parser.error("--group shares one topic's messages: name a topic, not a pattern")
    if args.until_end and (args.group is not None or args.cursor is not None):
        parser.error("--until-end reads from --from: not with --group or --cursor")
    tally = _Tally()

    async def body(interrupt: Interrupt) -> None:
        await _sub(args, options or None, printer, tally, interrupt)

    interrupt, status = run_interruptibly("sub", body)
    if tally.pipe_closed:
        # The reader of stdout went away (`| head -1`): that ends it, quietly
        # (what is still buffered for stdout goes nowhere instead of failing).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    counts = f", {tally.missed} missed (dropped by the broker)" if tally.missed else ""
    if tally.duplicates:  # (delivered again after a lost session: not printed twice)
        counts += f", {tally.duplicates} delivered again (not printed twice)"
    if status is not None:
        return status
    if interrupt.interrupted:
        print(f"broker sub: interrupted: {tally.received} message(s){counts}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if tally.timed_out:
        print(
            f"broker sub: nothing for {args.timeout:g} s: stopping after "
            f"{tally.received} message(s){counts}",
            file=sys.stderr,
        )
    elif counts:
        print(f"broker sub: {tally.received} message(s){counts}", file=sys.stderr)
    return 0


async def _sub(
    args: argparse.Namespace,
    options: dict[str, int | str | bool | float | None] | None,
    printer: Callable[[Any], bytes],
    tally: _Tally,
    interrupt: Interrupt,
) -> None:
    from broker.client import Subscription, open_cluster_client, parse_servers, route
    from broker.client._subscription import BATCH_MOST

    topics = list(dict.fromkeys(args.topics))
    names = [topic for topic in topics if not is_topic_pattern(topic)]
    patterns = [topic for topic in topics if is_topic_pattern(topic)]
    servers = parse_servers(args.broker)
    # A pattern's topics may be on every broker: it is subscribed on each.
    owners = servers if patterns else sorted({route(topic, servers) for topic in names})
    out = sys.stdout.buffer
    async with (
        open_cluster_client(owners, name="broker-sub", **client_options(args)) as cluster,
        AsyncExitStack() as stack,
    ):
        clients = list(cluster.clients.values())
        interrupt.reconnecting = lambda: any(client.reconnecting for client in clients)
        # --until-end: per topic, the offset of the last record to print
        # (what each held when it started; read before subscribing).
        pending = await _ends(cluster, names, patterns, args.start) if args.until_end else {}
        subscriptions: list[Subscription] = []
        for topic in topics:
            chosen = [cluster.client_for(topic)] if topic in names else clients
            for client in chosen:
                context = client.subscribe(
                    topic,
                    mode=args.mode,
                    options=options,
                    start=args.start,
                    cursor=args.cursor,
                    group=args.group,
                    max_outstanding=args.max_outstanding,
                )
                subscriptions.append(await stack.enter_async_context(context))
        shown = ", ".join(repr(topic) for topic in topics)
        print(f"subscribed to {shown}", file=sys.stderr, flush=True)
        # Cancelled when nothing arrived for --timeout seconds (each batch moves it on).
        silence = trio.CancelScope()

        def heard() -> None:
            if args.timeout is not None:
                silence.deadline = trio.current_time() + args.timeout

        def reached(subscription: Subscription, batch: list[Any]) -> bool:
            """Whether --until-end has all it waits for (after ``batch``)."""
            for message in batch:
                last = pending.get(message.topic)
                if last is not None and message.offset is not None and message.offset >= last:
                    del pending[message.topic]
            last = pending.get(subscription.topic)
            if last is not None and not subscription.pattern and subscription.skipped_to > last:
                del pending[subscription.topic]  # (deleted before it was sent: a Gap)
            return not pending

        async def pump(subscription: Subscription, done: trio.CancelScope) -> None:
            while True:
                # Never more than --count wants: what is taken is acknowledged
                # (and a --cursor moves past it).
                left = BATCH_MOST if args.count is None else max(1, args.count - tally.received)
                batch = await subscription.receive_batch(left)
                if args.count is not None:
                    batch = batch[: args.count - tally.received]
                try:
                    out.write(b"".join(printer(message) for message in batch))
                    out.flush()
                except BrokenPipeError:
                    tally.pipe_closed = True
                    done.cancel()
                    return
                if args.group is not None:
                    for message in batch:
                        message.ack()  # (printed: done; one Settle per batch)
                tally.received += len(batch)
                heard()
                if args.count is not None and tally.received >= args.count:
                    done.cancel()
                    return
                if args.until_end and reached(subscription, batch):
                    done.cancel()
                    return

        heard()
        try:
            with interrupt.working(), silence:
                if args.until_end and not pending:
                    return  # (nothing there to read from --from on)
                async with trio.open_nursery() as nursery:
                    for subscription in subscriptions:
                        nursery.start_soon(pump, subscription, nursery.cancel_scope)
            tally.timed_out = silence.cancelled_caught
        finally:
            tally.missed = sum(subscription.missed for subscription in subscriptions)
            tally.duplicates = sum(s.duplicates_dropped for s in subscriptions)


async def _ends(
    cluster: ClusterClient, names: list[str], patterns: list[str], start: Start | None
) -> dict[str, int]:
    """For ``--until-end``: per topic that holds records from ``start`` on
    (now), the offset of its last record; the topics of ``names`` and those
    ``patterns`` match now. A pattern's topics come from the topic
    administration (``admin("topics")``), or, for a principal without the
    ``admin`` permission, from the offsets of every topic it may read."""
    from broker.client import AdminRefused
    from broker.protocol import AdminStatus, TopicPattern

    if start is None or start == "latest":
        return {}
    # topic -> (first, end, last append ms or None)
    found: dict[str, tuple[int, int, int | None]] = {}
    for client in cluster.clients.values():
        mine = [name for name in names if cluster.client_for(name) is client]
        if mine:
            for name, (first, end) in (await client.offsets(mine)).items():
                found[name] = (first, end, None)
        for pattern in patterns:
            try:
                rows = await client.admin("topics", pattern=pattern)
            except AdminRefused as refusal:
                if refusal.status != AdminStatus.NOT_PERMITTED:
                    raise
                matcher = TopicPattern(pattern)
                spans = await client.offsets()
                rows = [
                    {"topic": t, "first": span[0], "end": span[1]}
                    for t, span in spans.items()
                    if matcher.matches(t)
                ]
            # (A log not open is listed as of its last flush: its offsets
            # are asked again, which reads them exactly.)
            matched = [t for row in rows if isinstance(t := row.get("topic"), str)]
            exact = await client.offsets(matched) if matched else {}
            for row in rows:
                topic, ms = row.get("topic"), row.get("last_append_ms")
                if isinstance(topic, str) and topic in exact:
                    low, high = exact[topic]
                    found[topic] = (low, high, ms if isinstance(ms, int) else None)
    if isinstance(start, datetime.datetime) and names:
        # (When each named topic was last appended to, where the broker says.)
        for name in names:
            try:
                rows = await cluster.client_for(name).admin("topics", pattern=name)
            except (AdminRefused, ValueError):
                continue
            for row in rows:
                ms = row.get("last_append_ms")
                if row.get("topic") == name and name in found and isinstance(ms, int):
                    first, end, _ = found[name]
                    found[name] = (first, end, ms)
    ends: dict[str, int] = {}
    for topic, (first, end, last_ms) in found.items():
        if end <= first:
            continue  # (it holds nothing)
        if isinstance(start, int) and end <= start:
            continue  # (its records are all before --from)
        since = start.timestamp() * 1000 if isinstance(start, datetime.datetime) else None
        if since is not None and last_ms is not None and last_ms < since:
            continue  # (nothing arrived since --from)
        ends[topic] = end - 1
    return ends
