"""Topic patterns: NATS-style wildcards over ``.``-separated tokens.

A topic name is read as tokens separated by ``.`` (``orders.eu.new`` has
three). A *pattern* is tokens too, where a token ``*`` matches exactly one
token of a name (any text without a dot, the empty one included) and a
last token ``>`` matches one or more trailing tokens:

- ``orders.*`` matches ``orders.eu`` and ``orders.us``, not ``orders`` or
  ``orders.eu.new``;
- ``orders.>`` matches ``orders.eu`` and ``orders.eu.new``, not ``orders``;
- ``*.new`` matches ``eu.new``; ``>`` matches every topic;
- a pattern without a wildcard matches the one topic of that name.

A pattern follows the topic-name rule as text (1-255 bytes of UTF-8, NFC,
printable), and more: no empty token (``a..b``, ``.a``, ``a.``), a
wildcard is a whole token (``orders*`` is refused, not read as a prefix),
``>`` only last. A pattern that breaks these could match nothing (a
name's shortest match is the pattern itself with each wildcard one
character, so the length limit holds for both). Anything else is refused with one line that
names the rule (:func:`topic_pattern_problem`, :class:`TopicPatternError`).

Nothing here depends on the rest of the protocol but its error class and
the name rule.
"""

from __future__ import annotations

from ._names import TopicNameError, topic_name_problem

__all__ = [
    "PATTERN_RULE",
    "TopicPattern",
    "TopicPatternError",
    "check_topic_pattern",
    "is_topic_pattern",
    "topic_pattern_error",
]

#: The rule in one line (ends every complaint about a pattern's form).
PATTERN_RULE = (
    "patterns are '.'-separated tokens where '*' is exactly one token and a last '>' "
    "one or more (orders.*, orders.>)"
)


class TopicPatternError(TopicNameError):
    """A topic pattern breaks the pattern rule (one line naming the rule)."""


def is_topic_pattern(text: str) -> bool:
    """Whether ``text`` has a wildcard token (``*`` or a last ``>``): what a
    client subscribes to by pattern rather than by name."""
    tokens = text.split(".")
    return "*" in tokens or tokens[-1] == ">"


def topic_pattern_error(pattern: object) -> str | None:
    """``None`` if ``pattern`` is a valid topic pattern, else one line saying
    which rule it breaks (it never echoes the pattern)."""
    problem = topic_name_problem(pattern)
    if problem is not None:
        return problem.replace("topic name", "topic pattern", 1)
    assert isinstance(pattern, str)
    tokens = pattern.split(".")
    for index, token in enumerate(tokens):
        if not token:
            return f"topic pattern has an empty token (token {index + 1}); {PATTERN_RULE}"
        if token == ">":
            if index != len(tokens) - 1:
                return f"'>' must be the pattern's last token; {PATTERN_RULE}"
        elif token != "*" and ("*" in token or ">" in token):
            return (
                f"a wildcard must be a whole token (token {index + 1} mixes one with text); "
                f"{PATTERN_RULE}"
            )
    return None


def check_topic_pattern(pattern: object) -> None:
    """Raise :class:`TopicPatternError` unless ``pattern`` is a valid topic pattern."""
    problem = topic_pattern_error(pattern)
    if problem is not None:
        raise TopicPatternError(problem)


class TopicPattern:
    """A checked topic pattern, ready to match names (see the module)."""

    __slots__ = ("_fixed", "_rest", "_tokens", "text")

    def __init__(self, text: str) -> None:
        check_topic_pattern(text)
        #: The pattern as given.
        self.text = text
        tokens = text.split(".")
        #: Whether the last token is ``>`` (one or more tokens follow the others).
        self._rest = tokens[-1] == ">"
        self._tokens = tokens[:-1] if self._rest else tokens
        #: No wildcard at all: it matches its own text only.
        self._fixed = not self._rest and "*" not in tokens

    @property
    def literal(self) -> str | None:
        """The one topic it matches if it has no wildcard (else None)."""
        return self.text if self._fixed else None

    def matches(self, name: str) -> bool:
        """Whether topic ``name`` matches this pattern."""
        if self._fixed:
            return name == self.text
        parts = name.split(".")
        tokens = self._tokens
        if self._rest:
            if len(parts) <= len(tokens):
                return False
        elif len(parts) != len(tokens):
            return False
        return all(token in ("*", part) for token, part in zip(tokens, parts, strict=False))

    def __repr__(self) -> str:
        return f"TopicPattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicPattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)
