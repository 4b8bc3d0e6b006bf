"""Will messages: published when a client's connection ends without a
normal DISCONNECT (its CONNECT's will), at once or, with 5.0's Will Delay
Interval, later unless the client comes back first.

A will goes to its topic as a QoS 0 publish of the connection would (the
same topic mapping and principal permissions); with its retain flag, it
is its topic's retained message too (see ``_retained``). A delayed one waits in the
broker's nursery, charged to nobody until it is sent (a few bytes), and is
cancelled when a connection with the same client id is accepted. Nothing
is published once the broker shuts down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from accounts import unlimited

from .._services import BrokerServices
from ._publishing import MQTTPublishing, Pending
from ._retained import RetainedStore

__all__ = ["Wills"]

log = logging.getLogger("broker.server")


class Wills:
    """The broker's delayed wills, by client id."""

    def __init__(self, services: BrokerServices, retained: RetainedStore) -> None:
        self.services = services
        self.retained = retained
        self._pending: dict[str, trio.CancelScope] = {}
        #: Wills published since the broker started.
        self.published = 0

    def publish(
        self, topic: str, tail: bytes, key: bytes | None, retain: tuple[str, int, bool] | None
    ) -> None:
        """Publish a will now (charged to an account of its own under the
        broker's, repaid once routed); ``retain``: (its MQTT topic, QoS,
        whether its payload is empty) if it has the retain flag."""
        services = self.services
        if services.life.closing:
            return
        if retain is not None:
            mqtt_topic, qos, clear = retain
            self.retained.update(mqtt_topic, tail, qos, clear=clear)
            self.retained.write()
        account = unlimited("mqtt-will", parent=services.resources.account, kind="mqtt")
        publisher = MQTTPublishing(services.config, services.life, services.topics, account, _none)
        publisher.add(topic, tail, key, None, 0)
        publisher.close()  # (forwards it, then lets the topic go)
        account.close()
        self.published += 1

    def later(self, client_id: str, delay: float, publish: Callable[[], None]) -> None:
        """Call ``publish`` after ``delay`` seconds unless :meth:`cancel`
        (a new connection of ``client_id``) comes first."""
        self.cancel(client_id)
        scope = trio.CancelScope()
        self._pending[client_id] = scope

        async def wait() -> None:
            with scope:
                await trio.sleep(delay)
                if self._pending.get(client_id) is scope:
                    del self._pending[client_id]
                publish()

        self.services.life.start_soon(wait)

    def cancel(self, client_id: str) -> None:
        """``client_id`` is back: its delayed will is not sent."""
        scope = self._pending.pop(client_id, None)
        if scope is not None:
            scope.cancel()

    @property
    def waiting(self) -> int:
        """Delayed wills not sent yet."""
        return len(self._pending)


def _none(routed: list[Pending]) -> None:
    """(A will is QoS 0 to its topic: nothing acknowledges it.)"""
