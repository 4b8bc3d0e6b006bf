"""The topic-name rule, shared by the wire protocol, the clients, the CLI and auth.

A topic name is 1 to :data:`MAX_TOPIC_NAME` bytes of UTF-8, in Unicode
normalisation form NFC, made only of letters, marks, numbers, punctuation
and symbols (Unicode general categories ``L*``, ``M*``, ``N*``, ``P*``,
``S*``): no spaces or other separators (``Z*``), no control (``Cc``) or
format characters (``Cf``: bidi overrides, zero-width joiners...), no
surrogates, private-use or unassigned code points. Names are compared as
they are (exact code points, case-sensitive); nothing is normalised for the
caller, a name that is not NFC is refused.

"Unassigned" is judged by the Unicode database of the Python that checks
(:data:`unicodedata.unidata_version`): a character added in a later Unicode
version is refused by a side that does not know it yet.

Nothing here depends on the rest of the protocol but its error class.
"""

from __future__ import annotations

import unicodedata

from ._errors import ProtocolError

__all__ = [
    "MAX_TOPIC_NAME",
    "MIN_TOPIC_NAME",
    "TOPIC_NAME_RULE",
    "TopicNameError",
    "check_topic_name",
    "topic_name_problem",
    "topic_pattern_problem",
]

#: Shortest topic name, in bytes of UTF-8.
MIN_TOPIC_NAME = 1
#: Longest topic name, in bytes of UTF-8.
MAX_TOPIC_NAME = 255

#: The rule in one line (ends every complaint about a character).
TOPIC_NAME_RULE = (
    f"topic names are {MIN_TOPIC_NAME}-{MAX_TOPIC_NAME} bytes of UTF-8 in NFC, "
    "without spaces, control, format or unassigned characters"
)

#: What the refused general categories are called in a complaint.
_CATEGORY_NAMES = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zs": "a space",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


class TopicNameError(ProtocolError, ValueError):
    """A topic name (or an auth topic pattern) breaks the topic-name rule.

    Raised before anything is sent or changed; the message is one line that
    names the rule that was broken.
    """


def _allowed(text: str) -> bool:
    # str.isprintable() is false exactly for the categories C* and Z* except
    # the ASCII space, which is refused separately.
    return text.isprintable() and " " not in text


def _bad_character(text: str) -> str:
    """The complaint about the first refused character of ``text``."""
    for index, char in enumerate(text):
        if not _allowed(char):
            category = unicodedata.category(char)
            what = _CATEGORY_NAMES.get(category, category)
            return f"U+{ord(char):04X} ({what}, {category}) at index {index}"
    raise AssertionError("no refused character")  # pragma: no cover


def topic_name_problem(name: object) -> str | None:
    """``None`` if ``name`` is a valid topic name, else one line saying which
    part of the rule it breaks (it never echoes the name itself)."""
    if type(name) is not str:
        return f"a topic name must be a str, not {type(name).__name__}"
    if not name:
        return f"a topic name must not be empty ({TOPIC_NAME_RULE})"
    if len(name) > MAX_TOPIC_NAME:  # each character is at least one byte
        return (
            f"topic name too long: {len(name)} characters, "
            f"the limit is {MAX_TOPIC_NAME} bytes of UTF-8"
        )
    if not _allowed(name):
        return f"topic name has {_bad_character(name)}; {TOPIC_NAME_RULE}"
    size = len(name.encode())
    if size > MAX_TOPIC_NAME:
        return f"topic name too long: {size} bytes of UTF-8, the limit is {MAX_TOPIC_NAME}"
    if not unicodedata.is_normalized("NFC", name):
        return "topic name is not in Unicode NFC form: pass unicodedata.normalize('NFC', name)"
    return None


def check_topic_name(name: object) -> None:
    """Raise :class:`TopicNameError` unless ``name`` is a valid topic name."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise TopicNameError(problem)


def topic_pattern_problem(pattern: str) -> str | None:
    """``None`` unless the shell-style (``fnmatch``) ``pattern`` could never
    match a valid topic name; then one line saying why.

    A pattern may use only characters a topic name may hold (``* ? [ ] !``
    are among them), must be NFC, and its shortest match must fit in
    :data:`MAX_TOPIC_NAME` bytes.
    """
    if not pattern:
        return "a topic pattern must not be empty"
    if not _allowed(pattern):
        return f"topic pattern has {_bad_character(pattern)}, which no topic name may hold"
    if not unicodedata.is_normalized("NFC", pattern):
        return "topic pattern is not in Unicode NFC form, so it would never match"
    shortest = _shortest_match(pattern)
    if shortest > MAX_TOPIC_NAME:
        return (
            f"topic pattern only matches names of {shortest} bytes or more; "
            f"the limit is {MAX_TOPIC_NAME}"
        )
    return None


def _shortest_match(pattern: str) -> int:
    """The fewest bytes of UTF-8 a name matching ``pattern`` can have
    (``fnmatch`` syntax: ``*`` any run, ``?`` one character, ``[...]`` one
    character of a set, ``[`` without a closing ``]`` a literal)."""
    total = index = 0
    end = len(pattern)
    while index < end:
        char = pattern[index]
        index += 1
        if char == "*":
            continue
        if char == "[":
            close = index
            if close < end and pattern[close] == "!":
                close += 1
            if close < end and pattern[close] == "]":
                close += 1
            while close < end and pattern[close] != "]":
                close += 1
            if close < end:  # a set: one character, at least one byte
                index = close + 1
                total += 1
                continue
        total += 1 if char == "?" else len(char.encode())
    return total
