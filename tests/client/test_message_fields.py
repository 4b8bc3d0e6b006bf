"""A payload, key or headers of the wrong type is the caller's error: every
client raises TypeError before anything is sent, and the connection goes on
(it used to be sent as a malformed frame: the broker ended the connection,
and every other publish and subscription on it, with Goodbye 1)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.client import BlockingClient, open_client
from broker.protocol.frames import check_publish_fields
from tests.server.helpers import TIMEOUT, running_broker, url, wait_subscribed

SAFETY = 10.0

BAD_FIELDS: dict[str, dict[str, Any]] = {
    "text payload": {"payload": "hello"},
    "no payload": {"payload": None},
    "int payload": {"payload": 5},
    "memoryview payload": {"payload": memoryview(b"x")},
    "text key": {"payload": b"x", "key": "k"},
    "int key": {"payload": b"x", "key": 3},
    "headers as a dict": {"payload": b"x", "headers": {"h": b"v"}},
    "text header value": {"payload": b"x", "headers": [("h", "v")]},
    "bytes header name": {"payload": b"x", "headers": [(b"h", b"v")]},
    "a header of one item": {"payload": b"x", "headers": [("h",)]},
}


@pytest.mark.parametrize("fields", BAD_FIELDS.values(), ids=list(BAD_FIELDS))
def test_the_check_names_what_to_pass(fields: dict[str, Any]) -> None:
    with pytest.raises(TypeError) as caught:
        check_publish_fields(fields["payload"], fields.get("key"), fields.get("headers"))
    assert "\n" not in str(caught.value)
    assert any(word in str(caught.value) for word in ("payload", "key", "header"))


def test_good_fields_pass_the_check() -> None:
    check_publish_fields(b"x", None, None)
    check_publish_fields(b"", b"k", [("h", b"v"), ("h", b"w")])
    check_publish_fields(b"x", None, (["h", b"v"],))


async def test_the_async_client_refuses_wrong_types_and_goes_on() -> None:
    async with (
        running_broker() as broker,
        open_client(url(broker)) as subscriber,
        open_client(url(broker), reconnect=0) as publisher,
        subscriber.subscribe("t") as subscription,
    ):
        with trio.fail_after(TIMEOUT):
            await wait_subscribed(broker, "t")
            for fields in BAD_FIELDS.values():
                with pytest.raises(TypeError):
                    await publisher.publish("t", **fields)
                with pytest.raises(TypeError):
                    publisher.publish_nowait("t", **fields)
            await publisher.publish("t", b"good", headers=[("h", b"v")])
            await publisher.flush()
            message = await subscription.receive()
        assert (message.payload, message.headers) == (b"good", [("h", b"v")])


async def test_the_blocking_client_refuses_wrong_types_and_goes_on() -> None:
    async with running_broker() as broker:

        def run() -> None:
            with (
                BlockingClient(url(broker), reconnect=0) as client,
                client.subscribe("t", timeout=SAFETY) as subscription,
            ):
                for fields in BAD_FIELDS.values():
                    with pytest.raises(TypeError):
                        client.publish("t", timeout=SAFETY, **fields)
                    with pytest.raises(TypeError):
                        client.publish_nowait("t", **fields)
                client.publish("t", b"good", key=b"k", timeout=SAFETY)
                client.flush(timeout=SAFETY)
                message = subscription.receive(timeout=SAFETY)
                assert (message.payload, message.key) == (b"good", b"k")

        await trio.to_thread.run_sync(run)
