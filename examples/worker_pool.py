"""A pool of workers sharing one topic's jobs: a consumer group.

    broker serve --data-dir /tmp/broker &               # a broker that keeps topic logs
    python examples/worker_pool.py --workers 4 &        # four members of the group "pool"
    seq 1000 | broker pub jobs                          # a thousand jobs, one per line

Each worker is a member of the consumer group ``--group`` on ``--topic``:
the broker gives each job to one member at a time, as that member has room
(at most ``--max-outstanding`` unsettled each). A worker settles each job:
``ack()`` when done, ``retry(delay=...)`` when it failed for now (another
member, or the same, gets it again later), ``reject(reason)`` when it can
never succeed (it goes to ``<topic>.dead-letters`` with the reason in its
headers). A job whose worker dies, stops answering for the group's
``ack_wait``, or leaves is given to another; one retried ``max_deliveries``
times goes to the dead letters instead of blocking the rest.

The work here is idempotent by offset (it records each job's offset, so a
job delivered twice, after a crash between the work and the ``ack()``, is
done once): what makes at-least-once delivery effectively once.
"""

from __future__ import annotations

import argparse
import random

import trio

from broker.client import Message, open_client


async def work(message: Message, done: set[int]) -> None:
    """One job: done once per offset, whatever the deliveries."""
    assert message.offset is not None
    if message.offset in done:
        message.ack()  # (done before its ack was lost: do not do it twice)
        return
    if message.payload.startswith(b"poison"):
        message.reject("cannot parse the job")
        return
    if random.random() < 0.05:  # a transient failure: try again in a second
        message.retry(delay=1.0)
        return
    await trio.sleep(0.001)  # the work
    done.add(message.offset)
    message.ack()


async def worker(url: str, topic: str, group: str, outstanding: int, name: int) -> None:
    done: set[int] = set()
    async with (
        open_client(url) as client,
        client.subscribe(topic, group=group, max_outstanding=outstanding) as jobs,
    ):
        async for message in jobs:
            await work(message, done)
            if message.deliveries:
                print(
                    f"worker {name}: offset {message.offset}, delivered before {message.deliveries}"
                )


async def main(args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        for name in range(args.workers):
            nursery.start_soon(worker, args.url, args.topic, args.group, args.max_outstanding, name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:7400")
    parser.add_argument("--topic", default="jobs")
    parser.add_argument("--group", default="pool")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--max-outstanding", type=int, default=100)
    trio.run(main, parser.parse_args())
