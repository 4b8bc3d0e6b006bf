"""The broker never calls into its protocol while the protocol handles a read.

Opening a receiver asks the policy for its capacity while ``receive_data``
runs; the policy (``BrokerPolicy`` over ``ConnectionBudget``) must only
compute over the budget's ledger. Shrinking idle channels, topping up and
funding starved ones wait until ``receive_data`` has returned. Here every
public method and property of the broker's ``Connection`` reports a call
made from outside ``broker.protocol`` while that connection is inside
``receive_data``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from broker.client import open_client
from broker.protocol import Connection, Role

from .helpers import running_broker, url, wait_idle

KiB = 1024

#: Budget for two bind channels and three publish channels: a fourth and
#: fifth topic need idle channels shrunk (and wait, starved, meanwhile).
CONFIG = {
    "max_frame": 1024,
    "publish_capacity": 8 * KiB,
    "bind_capacity": 1024,
    "connection_budget": 2 * 1024 + 3 * 8 * KiB,
}


@contextmanager
def reentry_watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Patch :class:`Connection` to list re-entering calls (broker side only)."""
    inside: set[int] = set()
    calls: list[str] = []
    watched: list[str] = []

    def from_outside() -> bool:
        caller = sys._getframe(2).f_globals.get("__name__", "")
        return not caller.startswith("broker.protocol")

    def watch(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def watched_call(self: Connection, *args: Any, **kwargs: Any) -> Any:
            if id(self) in inside and from_outside():
                calls.append(name)
            return function(self, *args, **kwargs)

        return watched_call

    real_receive = Connection.receive_data

    def receive_data(self: Connection, data: bytes, now: float, **limit: Any) -> Any:
        if self.role is not Role.BROKER:
            return real_receive(self, data, now, **limit)
        inside.add(id(self))
        try:
            return real_receive(self, data, now, **limit)
        finally:
            inside.discard(id(self))

    for name in dir(Connection):  # the class and every part it is assembled from
        if name.startswith("_") or name == "receive_data":
            continue
        value = inspect.getattr_static(Connection, name)
        if isinstance(value, property) and value.fget is not None:
            monkeypatch.setattr(Connection, name, property(watch(name, value.fget)))
            watched.append(name)
        elif callable(value) and not isinstance(value, type | staticmethod | classmethod):
            monkeypatch.setattr(Connection, name, watch(name, value))
            watched.append(name)
    monkeypatch.setattr(Connection, "receive_data", receive_data)
    assert {"set_capacity", "grow", "receiver", "receiving_channels", "throttled"} <= set(watched)
    yield calls


async def test_binding_topics_beyond_the_budget_never_reenters_the_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with reentry_watch(monkeypatch) as calls:
        async with running_broker(**CONFIG) as broker:
            async with (
                open_client(url(broker), name="five") as client,
                client.subscribe("topic-0") as subscription,
            ):
                for index in range(5):
                    with trio.fail_after(5):
                        await client.publish(f"topic-{index}", b"x")
                        await client.flush()
                message = await subscription.receive()
                assert message.payload == b"x"
            await wait_idle(broker)
    assert calls == []


def test_the_watch_sees_a_reentering_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """(The watch itself works: a call from a policy while reading is seen.)"""
    from broker.protocol import Channel, ChannelKind, Policy

    seen: list[Connection] = []

    class Nosy(Policy):
        def initial_capacity(self, channel: Channel) -> int:
            if seen and channel.kind == ChannelKind.PUBLISH:
                _ = seen[0].receiving_channels  # re-entry
            return super().initial_capacity(channel)

    with reentry_watch(monkeypatch) as calls:
        from broker.protocol import PROTOCOL_VERSION, BindTopic, Hello
        from broker.protocol.frames import encode

        broker_side = Connection(Role.BROKER, policy=Nosy(), now=0.0)
        seen.append(broker_side)
        broker_side.receive_data(encode(Hello(PROTOCOL_VERSION, "c")), 0.0)
        broker_side.welcome(session=b"s" * 16, epoch=b"e" * 8)
        broker_side.receive_data(encode(BindTopic("t")), 0.0)
    assert calls == ["receiving_channels"]
