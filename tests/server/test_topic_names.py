"""A broker facing a client that binds a topic name breaking the rule, at the
level of bytes: Goodbye 1 naming the rule, a clean close, nothing bound, and
everybody else served as before."""

from __future__ import annotations

import pytest

from broker.protocol import TOPIC_NAME_RULE, BindTopic, Goodbye, GoodbyeCode, Publish
from broker.protocol.frames import encode

from .helpers import assert_round_trip, raw_client, running_broker, wait_idle

BAD_NAMES = {
    "empty": ("", "must not be empty"),
    "NUL": ("a\x00b", "U+0000"),
    "newline": ("news\nmore", "U+000A"),
    "bidi override": ("abc\u202edef", "U+202E"),
    "space": ("two words", "U+0020"),
    "not NFC": ("cafe\u0301", "NFC"),
    "256 bytes": ("x" * 256, "too long"),
    # Above the bind channel's 16 KiB of guarantees: before the rule existed
    # a client waited for guarantees that never came.
    "20 KB": ("x" * 20_000, "too long: 20000 characters"),
    "60 KB": ("y" * 60_000, "too long: 60000 characters"),
}


@pytest.mark.parametrize(("name", "says"), BAD_NAMES.values(), ids=list(BAD_NAMES))
async def test_a_bad_topic_name_gets_goodbye_1_naming_the_rule(name: str, says: str) -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake()
            # A Publish on the would-be handle follows in the same write: it
            # must not be applied either.
            await client.send(encode(BindTopic(name), max_frame=1 << 20), Publish(0, b"x"))
            frames = await client.read_until_eof()
            assert client.decode_error is None, client.decode_error
            assert not client.reset, "the broker reset the connection instead of closing it"
            goodbyes = client.goodbyes()
            assert [g.code for g in goodbyes] == [GoodbyeCode.PROTOCOL_ERROR], client.summary()
            assert isinstance(frames[-1], Goodbye), "the Goodbye is the broker's last frame"
            reason = goodbyes[0].reason
            assert reason.startswith("BindTopic: ") and says in reason, reason
            assert name not in reason or not name  # the reason never echoes the name
            assert not broker.topics
        await assert_round_trip(broker)
        await wait_idle(broker)


async def test_a_character_complaint_states_the_whole_rule() -> None:
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake()
            await client.send(BindTopic("a\u2028b"))
            await client.read_until_eof()
            (goodbye,) = client.goodbyes()
            assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
            assert goodbye.reason.endswith(TOPIC_NAME_RULE), goodbye.reason
        await wait_idle(broker)


async def test_a_name_at_the_limit_is_bound() -> None:
    name = "é" * 127 + "x"  # 255 bytes of UTF-8
    async with running_broker() as broker:
        async with raw_client(broker) as client:
            await client.handshake()
            await client.send(BindTopic(name), BindTopic("after"))
            await assert_round_trip(broker, topic=name)
            assert client.goodbyes() == []
            assert {name, "after"} <= set(broker.topics)
        await wait_idle(broker)
