"""``examples/spark_publish.py`` runs as the README says and publishes what it reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.client import BlockingClient

from .conftest import TIMEOUT
from .test_sink import fresh_topic, run_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_job_publishes_every_row_exactly_once(broker_address: str) -> None:
    topic = fresh_topic()
    rows = 2000
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        done = run_script(
            [
                "examples/spark_publish.py",
                "--broker",
                broker_address,
                "--topic",
                topic,
                "--rows",
                str(rows),
                "--delivery",
                "exactly-once",
            ],
            ROOT,
        )
        assert f"published {rows} rows to {topic!r} (exactly-once)" in done.stdout
        messages = [subscription.receive(timeout=TIMEOUT) for _ in range(rows)]
    ids = sorted(int(m.payload.split(b",")[0].removeprefix(b'{"id":')) for m in messages)
    assert ids == list(range(rows))
    assert all(len(m.payload) == 100 and m.key is not None for m in messages)


def test_the_read_example_reads_every_record_and_ends_without_a_traceback(
    log_broker: str,
) -> None:
    """``examples/spark_read.py`` ended a successful run with a BrokenPipeError
    traceback from pyspark's worker daemon: its ``show(3)`` stopped reading a
    task's rows while the task was still sending (2 of 2 runs, 300,000 rows)."""
    from .test_source import publish, topic

    name = topic("read.example")
    publish(log_broker, name, 20_000, size=200)
    args = ["examples/spark_read.py", "--broker", log_broker, "--topic", name, "--runs", "1"]
    done = run_script(args, ROOT)
    assert f"run 1: read 20000 rows of {name!r}" in done.stdout
    assert "|     1|" in done.stdout  # the first rows, by offset
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_the_pipeline_example_copies_every_record_once(engine_broker: str, tmp_path: Path) -> None:
    """``examples/spark_pipeline.py`` reads one topic and writes to another,
    exactly once; run again on the same checkpoint it writes nothing more
    (with either storage engine)."""
    log_broker = engine_broker
    from .test_source import publish, topic

    source, sink = topic("orders"), topic("orders.checked")
    publish(log_broker, source, 3000)
    args = [
        "examples/spark_pipeline.py",
        "--broker",
        log_broker,
        "--source",
        source,
        "--sink",
        sink,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--max-per-trigger",
        "1000",
        "--available-now",
    ]
    done = run_script(args, ROOT)
    assert f"read 3000 rows from {source!r}, wrote them to {sink!r} (exactly-once)" in done.stdout
    again = run_script(args, ROOT)
    assert f"read 0 rows from {source!r}" in again.stdout
    with BlockingClient(log_broker) as client:
        assert client.offsets([sink], timeout=TIMEOUT) == {sink: (1, 3001)}
        with client.subscribe(sink, start="earliest", timeout=TIMEOUT) as subscription:
            messages = [subscription.receive(timeout=TIMEOUT) for _ in range(3000)]
    values = sorted(m.payload for m in messages)
    assert values == sorted(b"ID=%d; <- %s@%d" % (n, source.encode(), n + 1) for n in range(3000))


def test_the_pipeline_killed_with_sigkill_and_restarted_writes_each_record_once(
    log_broker: str, tmp_path: Path
) -> None:
    """The whole Spark application (driver, JVM, Python workers) is killed
    with SIGKILL while its micro-batches run; started again on the same
    checkpoint it writes every input record to the output topic once."""
    from .test_source import publish, topic

    source, sink = topic("orders"), topic("orders.checked")
    total = 20_000
    publish(log_broker, source, total)
    checkpoint = tmp_path / "checkpoint"
    args = [
        sys.executable,
        "examples/spark_pipeline.py",
        "--broker",
        log_broker,
        "--source",
        source,
        "--sink",
        sink,
        "--checkpoint",
        str(checkpoint),
        "--max-per-trigger",
        "1000",
    ]
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    running = subprocess.Popen(
        args,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the JVM and workers die with it
    )
    try:
        deadline = time.monotonic() + 3 * TIMEOUT
        while len(list((checkpoint / "commits").glob("[0-9]*"))) < 3:
            assert running.poll() is None, "the pipeline ended by itself"
            assert time.monotonic() < deadline, "no three micro-batches committed in time"
            time.sleep(0.05)
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait(timeout=TIMEOUT)
    with BlockingClient(log_broker) as client:
        written = client.offsets([sink], timeout=TIMEOUT).get(sink, (1, 1))[1] - 1
    assert written < total  # killed mid-way
    done = run_script([*args[1:], "--available-now"], ROOT)
    assert "(exactly-once)" in done.stdout
    with BlockingClient(log_broker) as client:
        assert client.offsets([sink], timeout=TIMEOUT) == {sink: (1, total + 1)}
        with client.subscribe(sink, start="earliest", timeout=TIMEOUT) as subscription:
            messages = [subscription.receive(timeout=TIMEOUT) for _ in range(total)]
    numbers = sorted(int(m.payload.split(b";")[0].removeprefix(b"ID=")) for m in messages)
    assert numbers == list(range(total))


def test_without_a_broker_the_example_says_so_in_one_line_before_spark_starts() -> None:
    """It printed about 250 lines: a traceback from every task, then the job's."""
    import socket

    with socket.socket() as unused:  # (a port nothing listens on: bound, never listening)
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "examples/spark_publish.py", "--broker", f"127.0.0.1:{port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr == (
        f"spark_publish: cannot connect to the broker at 127.0.0.1:{port}: "
        "Connection refused (is it running?)\n"
    )
