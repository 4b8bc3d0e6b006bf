"""NATS message headers: a multi-valued mapping and its wire form.

A header block is ``NATS/1.0[ status[ description]]\\r\\n`` then
``Key: Value\\r\\n`` lines and an empty line. The status line is how the
server speaks in a message: ``503`` (no responders), ``404 No Messages``,
``408 Request Timeout``, ``409 ...``, ``100 Idle Heartbeat``. Keys keep
their case (JetStream matches ``Nats-Msg-Id`` and its kin as written).
Sans-IO: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping

__all__ = ["HeaderError", "Headers", "decode_headers", "encode_headers"]

_PREFIX = b"NATS/1.0"
_BAD_KEY = frozenset(":\r\n \t")


class HeaderError(ValueError):
    """A header key or value that cannot be sent (a key with ``:`` or
    whitespace, a value with a line break)."""


class Headers(MutableMapping[str, str]):
    """Headers: each key maps to its first value (``headers[key]``);
    :meth:`get_all` gives every value, :meth:`add` adds one, ``headers[key] =
    value`` replaces them all. ``status`` and ``description`` are the status
    line's (``None`` and ``""`` in a message a client sent)."""

    __slots__ = ("_values", "description", "status")

    def __init__(
        self,
        items: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        *,
        status: int | None = None,
        description: str = "",
    ) -> None:
        self._values: dict[str, list[str]] = {}
        self.status = status
        self.description = description
        if isinstance(items, Headers):  # (a copy keeps every value)
            pairs: Iterable[tuple[str, str]] = items.pairs()
        else:
            pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            self.add(key, value)

    def __getitem__(self, key: str) -> str:
        return self._values[key][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setitem__(self, key: str, value: str) -> None:
        _check(key, value)
        self._values[key] = [value]

    def __delitem__(self, key: str) -> None:
        del self._values[key]

    def add(self, key: str, value: str) -> None:
        """Add ``value`` to the values of ``key`` (after those it has)."""
        _check(key, value)
        self._values.setdefault(key, []).append(value)

    def get_all(self, key: str) -> list[str]:
        """Every value of ``key``, in order (``[]`` if none)."""
        return list(self._values.get(key, ()))

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (key, value), keys in insertion order."""
        for key, values in self._values.items():
            for value in values:
                yield key, value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Headers):
            return NotImplemented
        return (
            self._values == other._values
            and self.status == other.status
            and self.description == other.description
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        status = "" if self.status is None else f", status={self.status}"
        description = f", description={self.description!r}" if self.description else ""
        return f"Headers({list(self.pairs())!r}{status}{description})"


def _check(key: str, value: str) -> None:
    if not key or not _BAD_KEY.isdisjoint(key):
        raise HeaderError(f"header key {key!r} is empty or holds ':' or whitespace")
    if "\r" in value or "\n" in value:
        raise HeaderError(f"header {key!r}: its value holds a line break")


def encode_headers(headers: Headers | Mapping[str, str]) -> bytes:
    """The wire form of ``headers`` (keys and values as they were checked
    when added; a plain mapping is checked here)."""
    if isinstance(headers, Headers):
        pairs: Iterable[tuple[str, str]] = headers.pairs()
        status = "" if headers.status is None else f" {headers.status}"
        if headers.status is not None and headers.description:
            status += f" {headers.description}"
    else:
        for key, value in headers.items():
            _check(key, value)
        pairs = headers.items()
        status = ""
    lines = [f"NATS/1.0{status}\r\n"]
    lines.extend(f"{key}: {value}\r\n" for key, value in pairs)
    lines.append("\r\n")
    return "".join(lines).encode()


def decode_headers(block: bytes) -> Headers | None:
    """The headers of a header block, or None if it does not start with
    ``NATS/1.0``. Lenient about lines another client wrote: a line without
    ``:`` is skipped; values lose their leading and trailing blanks."""
    if not block.startswith(_PREFIX):
        return None
    lines = block.decode("utf-8", "surrogateescape").split("\r\n")
    headers = Headers.__new__(Headers)
    values: dict[str, list[str]] = {}
    headers._values = values
    headers.status = None
    headers.description = ""
    first = lines[0]
    if len(first) > 8:
        code, _, description = first[8:].strip().partition(" ")
        if code.isdigit():
            headers.status = int(code)
            headers.description = description.strip()
    for line in lines[1:]:
        if line:
            key, colon, value = line.partition(":")
            if colon and key:
                key = key.strip()
                if key in values:
                    values[key].append(value.strip())
                else:
                    values[key] = [value.strip()]
    return headers
