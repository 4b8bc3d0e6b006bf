"""Many topics under a low open-file limit: how many a broker serves.

Runs ``broker serve`` with a data directory under ``RLIMIT_NOFILE`` =
``--nofile`` (default 1,024) and publishes ``--records`` records to each of
``--topics`` topics (default 10,000) on one connection, flushing (every
record confirmed) every 100 topics. A topic whose publish ends the
connection (a Goodbye) counts as failed, and the publisher reconnects.
Every 500 topics a new connection is tried (``connect_timeout`` 5 s).
Then every topic is read back from its first record. Prints the figures:
topics confirmed and read back, failed topics, failed connections, the
broker's failed accepts (from its log lines), its log file opens and
evictions (``/metrics``, where the broker has them), and the time taken.

    python tests/measure/open_files.py --nofile 1024 --topics 10000
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import trio

from broker.client import Client, ClientError, open_client

FLUSH_EVERY = 100
PROBE_EVERY = 500
READERS = 50
#: Failed topics in a row after which publishing stops.
GIVE_UP = 20


def topic(number: int) -> str:
    return f"t{number:05d}"


def payload(number: int, record: int) -> bytes:
    return b"%d.%d" % (number, record)


class Run:
    def __init__(self, url: str, topics: int, records: int) -> None:
        self.url = url
        self.topics = topics
        self.records = records
        self.confirmed = 0
        self.failed_topics: list[int] = []
        self.failed_connects = 0
        self.connects = 0
        self.read_ok = 0
        self.gave_up: int | None = None

    async def probe(self) -> None:
        self.connects += 1
        try:
            async with open_client(self.url, name="probe", connect_timeout=5) as client:
                await client.publish("probe", b"x")
                await client.flush()
        except (OSError, ClientError):
            self.failed_connects += 1

    async def publish(self) -> None:
        """Publish every topic's records, confirmed by a flush every
        :data:`FLUSH_EVERY` topics; after a failure (the connection ended),
        topic by topic from the batch's first, each failing one counted and
        skipped. Gives up after :data:`GIVE_UP` failures in a row."""
        number = 0
        every = FLUSH_EVERY
        in_a_row = 0
        while number < self.topics and in_a_row < GIVE_UP:
            try:
                async with open_client(self.url, name="pub", connect_timeout=5) as client:
                    while number < self.topics:
                        end = min(number + every, self.topics)
                        for one in range(number, end):
                            for record in range(self.records):
                                await client.publish(topic(one), payload(one, record))
                        await client.flush()
                        self.confirmed += end - number
                        in_a_row = 0
                        for one in range(number, end):
                            if one % PROBE_EVERY == PROBE_EVERY - 1:
                                await self.probe()
                        number = end
            except (OSError, ClientError):
                if every == 1:  # this topic failed
                    self.failed_topics.append(number)
                    number += 1
                    in_a_row += 1
                every = 1
        self.gave_up = number if number < self.topics else None

    async def read_back(self) -> None:
        async def read(client: Client, number: int) -> None:
            got: list[bytes] = []
            with trio.move_on_after(10), suppress(OSError, ClientError):
                async with client.subscribe(topic(number), options={"from": "earliest"}) as sub:
                    async for message in sub:
                        got.append(message.payload)
                        if len(got) == self.records:
                            break
            if got == [payload(number, r) for r in range(self.records)]:
                self.read_ok += 1

        for first in range(0, self.topics, READERS):
            try:
                async with (
                    open_client(self.url, name="reader", connect_timeout=5) as client,
                    trio.open_nursery() as nursery,
                ):
                    for number in range(first, min(first + READERS, self.topics)):
                        nursery.start_soon(read, client, number)
            except (OSError, ClientError):
                pass


def scrape(metrics_url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=30) as response:
            text = response.read().decode()
    except OSError as error:
        return {"scrape failed": str(error)}  # type: ignore[dict-item]
    found = {}
    for line in text.splitlines():
        match = re.match(r"^(broker_log_\w+|broker_topic_logs) ([0-9.e+-]+)$", line)
        if match and ("file" in line or "topic_logs" in line):
            found[match.group(1)] = float(match.group(2))
    return found


def failed_accepts(log_text: str) -> int:
    """Failed accepts the broker logged: one line per 10 s, each saying how
    many more it held back."""
    total = 0
    for line in log_text.splitlines():
        if "cannot accept a connection" in line:
            held = re.search(r"\((\d+) more since the last line\)", line)
            total += 1 + (int(held.group(1)) if held else 0)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=3)
    args = parser.parse_args()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "broker.log"
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        command += ["--set", f"data_dir={directory}/data"]
        with open(log, "wb") as errors:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, preexec_fn=limit
            )
        assert process.stdout is not None
        url = process.stdout.readline().decode().split("listening on", 1)[1].strip()
        metrics_url = process.stdout.readline().decode().split()[-1]
        run = Run(url, args.topics, args.records)
        started = time.monotonic()
        trio.run(run.publish)
        published = time.monotonic()
        trio.run(run.read_back)
        read = time.monotonic()
        figures = scrape(metrics_url)
        process.terminate()
        process.wait(60)
        text = log.read_text(errors="replace")
    print(f"RLIMIT_NOFILE {args.nofile}, {args.topics} topics x {args.records} records")
    print(f"topics confirmed:      {run.confirmed}")
    print(f"topics failed:         {len(run.failed_topics)}", end="")
    print(f" (first: {run.failed_topics[0]})" if run.failed_topics else "")
    if run.gave_up is not None:
        print(f"gave up at topic {run.gave_up} ({GIVE_UP} failed in a row)")
    print(f"topics read back:      {run.read_ok}")
    print(f"new connections:       {run.connects - run.failed_connects} of {run.connects}")
    print(f"failed accepts (log):  {failed_accepts(text)}")
    print(f"'Too many open files': {text.count('Too many open files')} log lines")
    for name, value in sorted(figures.items()):
        print(f"{name}: {value}")
    print(f"publish {published - started:.1f} s, read back {read - published:.1f} s")


if __name__ == "__main__":
    main()
