"""A broker with a low open-file limit serves many more topics than the
limit: its topic logs' files stay open within a bound (least recently used
closed first), so publishes, new connections and reads all go on.

Before, each topic's log held its file until it had been idle for 30 s: a
broker with ``ulimit -n 1024`` served about 1,000 topics, then every new
topic ended its client's connection with Goodbye 3 and ``accept()`` failed.
Here the broker runs in its own process with ``RLIMIT_NOFILE`` 256 and
takes 2,000 topics (3 records each, every one confirmed), a new connection
meanwhile, a read of every topic, and a restart that reads them from disk.
Terms are small, so that each topic has a sealed term, which a read from
the first record maps (and a map keeps a descriptor: these count too).
Deadlines are hang guards only.
"""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from broker.client import Client, open_client

#: The child's soft and hard open-file limit.
LIMIT = 256
TOPICS = 2_000
RECORDS = 3
#: Topics published to between two flushes (confirmations).
FLUSH_EVERY = 100
#: Topics read back at once.
READERS = 20
#: Hang guard of the whole test (seconds).
DEADLINE = 600.0

pytestmark = pytest.mark.slow


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


@contextmanager
def broker_process(data_dir: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """``broker serve`` under :data:`LIMIT` open files: ``(process, client
    url, metrics url)``; stopped (SIGTERM, then killed) afterwards."""
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    command += ["--set", f"data_dir={data_dir}", "--config", str(data_dir.parent / "broker.toml")]
    with open(log, "ab") as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, preexec_fn=_low_limit
        )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
        second = process.stdout.readline().decode()
        if "listening on" not in first or "metrics on" not in second:
            process.kill()
            raise AssertionError(f"broker did not start: {first!r} {second!r}; {log.read_text()}")
        yield process, first.split("listening on", 1)[1].strip(), second.split()[-1]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


#: Small terms: two records each, so a topic's third starts its second term.
CONFIG = """
[broker]
max_frame = 4032

[[topics]]
pattern = "*"
term_bytes = 4096
"""


def topic(number: int) -> str:
    return f"t{number:05d}"


def payload(number: int, record: int) -> bytes:
    return b"%d.%d:" % (number, record) + b"." * 1900


async def scrape(metrics_url: str) -> dict[str, float]:
    def get() -> str:
        with urllib.request.urlopen(metrics_url, timeout=30) as response:
            return str(response.read().decode())

    text = await trio.to_thread.run_sync(get)
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(broker_log_\w+|broker_topic_logs) ([0-9.e+-]+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


async def publish_all(client: Client) -> None:
    for number in range(TOPICS):
        for record in range(RECORDS):
            await client.publish(topic(number), payload(number, record))
        if number % FLUSH_EVERY == FLUSH_EVERY - 1:
            await client.flush()  # every one confirmed: written to its log
    await client.flush()


async def read_all(url: str, numbers: range) -> dict[int, list[bytes]]:
    """The records of each topic of ``numbers``, read from the first."""
    got: dict[int, list[bytes]] = {}

    async def read(client: Client, number: int) -> None:
        records: list[bytes] = []
        async with client.subscribe(topic(number), options={"from": "earliest"}) as sub:
            async for message in sub:
                records.append(message.payload)
                if len(records) == RECORDS:
                    break
        got[number] = records

    async with open_client(url, name="reader") as client:
        for first in range(numbers.start, numbers.stop, READERS):
            async with trio.open_nursery() as nursery:
                for number in range(first, min(first + READERS, numbers.stop)):
                    nursery.start_soon(read, client, number)
    return got


def expected(numbers: range) -> dict[int, list[bytes]]:
    return {n: [payload(n, r) for r in range(RECORDS)] for n in numbers}


async def test_thousands_of_topics_under_a_low_open_file_limit(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log = tmp_path / "broker.log"
    (tmp_path / "broker.toml").write_text(CONFIG)
    everything = range(TOPICS)
    with trio.fail_after(DEADLINE):
        with broker_process(data_dir, log) as (_, url, metrics_url):
            async with open_client(url, name="publisher") as publisher:
                await publish_all(publisher)
                # A new connection, with the publisher's still open: served.
                async with open_client(url, name="late") as late:
                    await late.publish("late", b"hello")
                    await late.flush()
                assert await read_all(url, everything) == expected(everything)
            figures = await scrape(metrics_url)
            assert figures["broker_topic_logs"] >= TOPICS
            assert figures["broker_log_open_files_limit"] == LIMIT // 4
            assert figures["broker_log_open_files"] <= LIMIT // 4
            assert figures["broker_log_file_opens_total"] > TOPICS
            # (Most closed for room: an idle file is given back only after 30 s.)
            assert figures["broker_log_file_evictions_total"] >= TOPICS // 2
        # A restart reads them back from their files, under the same limit.
        with broker_process(data_dir, log) as (_, url, metrics_url):
            assert await read_all(url, everything) == expected(everything)
            figures = await scrape(metrics_url)
            assert figures["broker_log_open_files"] <= LIMIT // 4
    errors = log.read_text()
    assert "Too many open files" not in errors, errors[-3000:]
    assert "Traceback" not in errors, errors[-3000:]
