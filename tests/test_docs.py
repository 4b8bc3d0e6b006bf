"""The worked examples of docs/protocol.md are what the encoder produces."""

from __future__ import annotations

import re
from pathlib import Path

import broker.protocol

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
PAIR = re.compile(r"```python\n(.+?)\n```\s*```hex\n(.+?)\n```", re.DOTALL)


def test_every_hex_example_is_the_encoders_output() -> None:
    pairs = PAIR.findall(DOC.read_text(encoding="utf-8"))
    assert len(pairs) >= 4, "docs/protocol.md lost its worked examples"
    names = {name: getattr(broker.protocol, name) for name in broker.protocol.__all__}
    for expression, hex_text in pairs:
        value = eval(expression, {"__builtins__": {"bytes": bytes, "range": range}}, names)
        expected = bytes.fromhex(hex_text.replace("\n", " "))
        assert value == expected, f"{expression} no longer encodes as documented"


def test_the_examples_cover_hello_bind_publish_and_guarantee() -> None:
    text = DOC.read_text(encoding="utf-8")
    for example in (
        "encode(Hello(",
        "encode(BindTopic(",
        "encode(Publish(",
        "encode(IssueGuarantee(",
    ):
        assert example in text
