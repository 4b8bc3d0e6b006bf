"""Count confirmed messages lost by a graceful shutdown (SIGTERM).

Each run starts ``broker serve``, subscribes a client that reads about 5,000
messages a second, publishes flat out from another client, sends SIGTERM
after a second and counts the messages the broker confirmed to the
publisher that never reached the subscriber.

    python tests/measure/shutdown_loss.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess

import trio
from _process import free_port, serve_command, wait_listening  # (tests/measure is sys.path[0])

from broker.client import ConnectionLost, open_client

#: The subscriber sleeps this long after every ten messages (about 5,000/s).
PACE = 0.002
PAYLOAD = b"x" * 100


async def one_run(url: str, broker: subprocess.Popen[bytes]) -> tuple[int, int, int]:
    """``(confirmed, received, lost)`` of one shutdown under load."""
    received: list[int] = []
    confirmed = 0
    async with trio.open_nursery() as nursery:

        async def subscriber(task_status: trio.TaskStatus[None]) -> None:
            async with open_client(url, name="sub") as client:
                try:
                    async with client.subscribe("loss") as subscription:
                        task_status.started()
                        async for message in subscription:
                            received.append(int(message.payload.split(b" ")[0]))
                            if len(received) % 10 == 0:
                                await trio.sleep(PACE)
                except ConnectionLost:
                    await client.aclose(flush=False)

        await nursery.start(subscriber)
        async with open_client(url, name="pub") as publisher:

            async def terminate_later() -> None:
                await trio.sleep(1.0)
                broker.send_signal(signal.SIGTERM)

            nursery.start_soon(terminate_later)
            index = 0
            try:
                while True:
                    await publisher.publish("loss", b"%d " % index + PAYLOAD)
                    index += 1
            except ConnectionLost:
                confirmed = publisher.statistics()["confirmed"]
                await publisher.aclose(flush=False)
    seen = set(received)
    lost = sum(1 for i in range(confirmed) if i not in seen)
    return confirmed, len(received), lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    total = with_loss = 0
    for run in range(args.runs):
        port = free_port()
        broker = subprocess.Popen(
            serve_command(port, "ERROR"),
            env=os.environ.copy(),
        )
        try:
            wait_listening(port)
            confirmed, received, lost = trio.run(one_run, f"127.0.0.1:{port}", broker)
            broker.wait(30)
        finally:
            if broker.poll() is None:
                broker.kill()
                broker.wait()
        total += lost
        with_loss += lost > 0
        print(f"run {run + 1:2d}: confirmed {confirmed:6d}, received {received:6d}, lost {lost:5d}")
    print(f"{with_loss} of {args.runs} runs lost confirmed messages; {total} lost in all")


if __name__ == "__main__":
    main()
