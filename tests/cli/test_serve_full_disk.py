"""A broker stopped (SIGTERM) while its disk is full stops as any other
(issue 40, item 7): it drains its clients, says in one line what it could
not write (never confirmed: the clients keep it), and exits with status 0.
Before, closing the topic logs raised ``No space left on device`` and
``broker serve`` exited with status 1.

The disk is made full by fault injection: the broker runs with the topic
log's one writing function (``broker.log._files.pwrite``, which writes the
term files and the state journal) failing with ``ENOSPC`` while a flag
file exists.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import trio

from broker.client import ConnectionLost, open_client

from .helpers import TIMEOUT, broker_command

#: ``broker`` with a full disk while the file named by its first argument exists.
FULL_DISK_BROKER = """
import errno, sys
from pathlib import Path
from broker.log import _files
from broker.cli import main

flag = Path(sys.argv.pop(1))
real_pwrite = _files.pwrite

def pwrite(fd, data, offset):
    if flag.exists():
        flag.with_suffix(".hit").touch()
        raise OSError(errno.ENOSPC, "No space left on device")
    return real_pwrite(fd, data, offset)

_files.pwrite = pwrite
sys.exit(main())
"""

SERVE = ("--log-level", "INFO", "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "")


def start(*command: str) -> tuple[subprocess.Popen[str], str]:
    """Start a broker process; it and its client address once it listens."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    listening = process.stdout.readline()
    assert listening.startswith("broker listening on "), listening + process.communicate()[1]
    return process, listening.split()[-1]


async def wait_for_file(path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        while True:
            if await trio.Path(path).exists():
                return
            await trio.sleep(0.01)


async def test_sigterm_on_a_full_disk_drains_says_so_in_one_line_and_exits_0(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    flag = tmp_path / "full"
    confirmed = [b"c%d" % i for i in range(10)]
    process, address = start(
        sys.executable, "-c", FULL_DISK_BROKER, str(flag), *SERVE, "--data-dir", str(data_dir)
    )
    try:
        lost: ConnectionLost | None = None
        try:
            async with open_client(address, name="pub") as client:
                for payload in confirmed:
                    await client.publish("t", payload)
                with trio.fail_after(TIMEOUT):
                    await client.flush()
                flag.touch()  # the disk is full from now on
                for i in range(10):
                    await client.publish("t", b"u%d" % i)
                await wait_for_file(flag.with_suffix(".hit"))  # (they reached the log)
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(TIMEOUT):
                    await client.flush()  # (never confirmed: the broker says Goodbye)
        except ConnectionLost as error:
            lost = error
        assert lost is not None and lost.code == 5, lost  # Goodbye 5: shutting down
        status = await trio.to_thread.run_sync(lambda: process.wait(TIMEOUT))
        stderr = process.communicate(timeout=TIMEOUT)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert status == 0, stderr
    assert "Traceback" not in stderr and "broker serve:" not in stderr, stderr
    assert "SIGTERM: shutting down gracefully" in stderr
    assert "shutting down: 1 connections to drain" in stderr
    assert "closed: goodbye 5: broker shutting down" in stderr
    (said,) = [line for line in stderr.splitlines() if "stopping:" in line]
    assert "ERROR" in said and "the disk is full" in said and "No space left" in said, said
    assert "never confirmed" in said, said

    # With room again, a restart finds every confirmed record (and nothing
    # else: the disk took none of the rest).
    flag.unlink()
    process, address = start(*broker_command(*SERVE, "--data-dir", str(data_dir)))
    try:
        async with open_client(address, name="reader") as client:
            assert await client.offsets(["t"]) == {"t": (1, len(confirmed) + 1)}
            async with client.subscribe("t", options={"from": "earliest"}) as subscription:
                got = []
                with trio.fail_after(TIMEOUT):
                    async for message in subscription:
                        got.append(message.payload)
                        if len(got) == len(confirmed):
                            break
            assert got == confirmed
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(TIMEOUT) == 0
        process.communicate()
