"""The worked examples of docs/protocol.md are what the encoder produces."""

from __future__ import annotations

import re
from pathlib import Path

import broker.protocol
import broker.protocol.frames

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
PAIR = re.compile(r"```python\n(.+?)\n```\s*```hex\n(.+?)\n```", re.DOTALL)


def test_every_hex_example_is_the_encoders_output() -> None:
    pairs = PAIR.findall(DOC.read_text(encoding="utf-8"))
    assert len(pairs) >= 4, "docs/protocol.md lost its worked examples"
    names = {
        name: getattr(module, name)
        for module in (broker.protocol, broker.protocol.frames)
        for name in module.__all__
    }
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


REPO = DOC.parent.parent
#: Every Markdown file a user reads: the README, docs/, deploy/ and examples/.
USER_DOCS = sorted(
    [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("deploy/**/*.md")],
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"shared/|\bseeds?/|\b(?:PROTOCOL|ARCHITECTURE|BENCHMARKS|SPARK-NOTES)\.md")


def test_the_docs_stand_alone() -> None:
    """No page cites a file outside the repository (the design notes it
    started from are not shipped), and every relative link resolves."""
    assert len(USER_DOCS) >= 6
    for page in USER_DOCS:
        text = page.read_text(encoding="utf-8")
        outside = OUTSIDE.findall(text)
        assert not outside, f"{page.relative_to(REPO)} cites files outside the repo: {outside}"
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.exists(), f"{page.relative_to(REPO)} links to missing {target}"
            assert resolved.is_relative_to(REPO), f"{page.relative_to(REPO)}: {target} is outside"
