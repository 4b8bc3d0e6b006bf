"""What the pattern and administration tests share: taking messages."""

from __future__ import annotations

import trio

from broker.client import Message, Subscription
from tests.server.helpers import TIMEOUT


async def take(subscription: Subscription, count: int) -> list[Message]:
    """The next ``count`` messages (fails after ``TIMEOUT`` seconds)."""
    got: list[Message] = []
    with trio.fail_after(TIMEOUT):
        while len(got) < count:
            got.append(await subscription.receive())
    return got
