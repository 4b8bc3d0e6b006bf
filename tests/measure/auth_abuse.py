"""Measure two attacks on an authenticating broker (``broker serve``).

``guess``: 50 connections at once guess tokens from one address for a few
seconds; prints the guesses answered per second.

``log``: one authenticated client is denied a 15,000-character topic name
again and again for a few seconds; prints the bytes the broker logged.

``squat``: one address opens connections that never say Hello, up to
``max_connections`` (200) and beyond, while a client from another address
(127.0.0.2) connects 50 times; prints how many of those were refused.

    python tests/measure/auth_abuse.py guess|log|squat
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import trio
from _process import free_port, serve_command, wait_listening  # (tests/measure is sys.path[0])

from broker.client import ConnectionLost, open_client
from broker.protocol import Connection, ConnectionClosed, Role, WelcomeReceived

AUTH_FILE = """
[principals.app]
token = "the-right-token"

[principals.narrow]
token = "narrow-token"
publish = ["allowed.*"]
subscribe = ["allowed.*"]
"""


async def guess(url: str, seconds: float) -> None:
    answered = 0
    deadline = trio.current_time() + seconds

    async def guesser(index: int) -> None:
        nonlocal answered
        attempt = 0
        while trio.current_time() < deadline:
            attempt += 1
            try:
                async with open_client(url, token=f"guess-{index}-{attempt}", connect_timeout=30):
                    pass
            except ConnectionLost as error:
                if error.code == 6:
                    answered += 1

    async with trio.open_nursery() as nursery:
        nursery.cancel_scope.deadline = deadline + 0.5
        for index in range(50):
            nursery.start_soon(guesser, index)
    print(f"{answered} wrong tokens answered in {seconds:.0f} s: {answered / seconds:.1f}/s")


async def hello_from(source: str, host: str, port: int) -> bool:
    """Whether a client connecting from ``source`` is welcomed."""
    try:
        stream = await trio.open_tcp_stream(host, port, local_address=source)
    except OSError:
        return False
    try:
        conn = Connection(Role.CLIENT, now=trio.current_time())
        conn.hello("legit", token="the-right-token")
        await stream.send_all(conn.data_to_send())
        with trio.move_on_after(10):
            while data := await stream.receive_some(65536):
                for event in conn.receive_data(data, trio.current_time()):
                    if isinstance(event, WelcomeReceived):
                        return True
                    if isinstance(event, ConnectionClosed):
                        return False
        return False
    except trio.BrokenResourceError:
        return False
    finally:
        await trio.aclose_forcefully(stream)


async def deny(url: str, seconds: float) -> int:
    attempts = 0
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        attempts += 1
        try:
            async with open_client(url, token="narrow-token") as client:
                await client.publish("x" * 15_000, b"x")
                await client.flush()
        except ConnectionLost:
            pass
    return attempts


async def squat(host: str, port: int) -> None:
    held: list[trio.SocketStream] = []
    refused = welcomed = 0

    async def squatter() -> None:
        while True:
            with contextlib.suppress(OSError):
                held.append(await trio.open_tcp_stream(host, port))
            await trio.sleep(0.005)

    async def legit() -> None:
        nonlocal refused, welcomed
        for _ in range(50):
            if await hello_from("127.0.0.2", host, port):
                welcomed += 1
            else:
                refused += 1
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(squatter)
        await trio.sleep(2.0)  # the squatter fills what it can
        await legit()
        nursery.cancel_scope.cancel()
    for stream in held:
        await trio.aclose_forcefully(stream)
    print(f"legitimate connections: {welcomed} welcomed, {refused} refused of 50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=["guess", "log", "squat"])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        auth = Path(tmp) / "auth.toml"
        auth.write_text(AUTH_FILE)
        level = "INFO" if args.attack == "log" else "ERROR"
        command = serve_command(port, level, f"auth_file={auth}", "max_connections=200")
        log = Path(tmp) / "broker.log"
        with log.open("wb") as output:
            broker = subprocess.Popen(command, env=os.environ.copy(), stderr=output)
        try:
            wait_listening(port)
            if args.attack == "guess":
                trio.run(guess, f"127.0.0.1:{port}", args.seconds)
            elif args.attack == "log":
                before = log.stat().st_size
                attempts = trio.run(deny, f"127.0.0.1:{port}", args.seconds)
                time.sleep(0.5)
                logged = log.stat().st_size - before
                print(
                    f"{attempts} denied attempts in {args.seconds:.0f} s: {logged} bytes "
                    f"logged ({logged / attempts:.0f} per attempt, {logged / args.seconds:.0f}/s)"
                )
            else:
                trio.run(squat, "127.0.0.1", port)
        finally:
            broker.terminate()
            broker.wait(30)


if __name__ == "__main__":
    main()
