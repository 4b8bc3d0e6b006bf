r"""How ``broker sub`` prints a message: as it is, through a ``--format``
template, or as one JSON object per line.

Text fields (``--format``, ``--show-keys``) are escaped so that a message is
always one line and a separator in the template always separates:
backslash, tab, CR, LF and other control characters become ``\\``, ``\t``,
``\r``, ``\n``, ``\xNN``, and bytes that are not UTF-8 become ``\xNN``.
"""

from __future__ import annotations

import base64
import json
import string
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (only for its type: ``broker --help`` need not import the client)
    from broker.client import Message

#: Placeholders of ``--format`` and what they stand for.
PLACEHOLDERS = {
    "topic": "the topic",
    "seq": "the subscription's sequence number of the message",
    "offset": "the record's offset in the topic's log (empty if the broker keeps no log)",
    "key": "the key (empty if none)",
    "payload": "the payload",
    "headers": "the headers, NAME=VALUE separated by commas (empty if none)",
    "size": "the payload's size in bytes",
}

_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127)}
_CONTROL.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})


def escape(data: bytes) -> str:
    """``data`` as one line of text (see the module documentation)."""
    text = data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL)


def _text_fields(message: Message) -> dict[str, object]:
    headers = ",".join(
        f"{escape(name.encode())}={escape(value)}" for name, value in message.headers or []
    )
    return {
        "topic": escape(message.topic.encode()),
        "seq": message.seq,
        "offset": "" if message.offset is None else message.offset,
        "key": escape(message.key or b""),
        "payload": escape(message.payload),
        "headers": headers,
        "size": len(message.payload),
    }


class FormatError(ValueError):
    """A ``--format`` template that cannot be used (the message says why)."""


def template_printer(template: str) -> Callable[[Message], bytes]:
    """A function that renders a message through ``template`` (``str.format``
    syntax with :data:`PLACEHOLDERS`), a newline added. Raises
    :class:`FormatError` for an unknown placeholder or a malformed template."""
    try:
        names = [
            field for _, field, _, _ in string.Formatter().parse(template) if field is not None
        ]
    except ValueError as error:
        raise FormatError(f"malformed template: {error}") from None
    for name in names:
        if name not in PLACEHOLDERS:
            known = ", ".join("{" + key + "}" for key in PLACEHOLDERS)
            shown = "{" + name + "}" if name else "{}"
            raise FormatError(f"unknown placeholder {shown} (known: {known})")
    sample: dict[str, object] = {name: "" for name in PLACEHOLDERS} | {"seq": 0, "size": 0}
    try:
        template.format_map(sample | {"offset": 0})
    except (ValueError, TypeError) as error:
        raise FormatError(f"malformed template: {error}") from None
    try:
        template.format_map(sample)
    except (ValueError, TypeError) as error:
        raise FormatError(
            f"malformed template: {{offset}} is empty for a message without an offset, "
            f"so its format must take text too ({error})"
        ) from None

    def render(message: Message) -> bytes:
        return (template.format_map(_text_fields(message)) + "\n").encode()

    return render


def raw(message: Message) -> bytes:
    """The payload as it is, and a newline."""
    return message.payload + b"\n"


def json_line(message: Message) -> bytes:
    """One JSON object on a line: ``topic``, ``seq``, ``offset`` (null if
    none), ``key`` (null if none),
    ``headers`` (``[[name, value], ...]``), ``payload``, and ``encoding``:
    ``"utf-8"`` when the payload, key and header values are all valid UTF-8
    and given as text, else ``"base64"`` (all three in base64)."""
    values = [message.payload, message.key or b""]
    values += [value for _, value in message.headers or []]
    try:
        for value in values:
            value.decode("utf-8")
    except UnicodeDecodeError:
        encoding = "base64"

        def text(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")

    else:
        encoding = "utf-8"

        def text(data: bytes) -> str:
            return data.decode("utf-8")

    document = {
        "topic": message.topic,
        "seq": message.seq,
        "offset": message.offset,
        "key": None if message.key is None else text(message.key),
        "headers": [[name, text(value)] for name, value in message.headers or []],
        "payload": text(message.payload),
        "encoding": encoding,
    }
    return (json.dumps(document, ensure_ascii=False) + "\n").encode("utf-8")
