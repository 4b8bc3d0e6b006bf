"""MQTT topic names and filters: their rules, matching, shared
subscriptions, and the mapping to and from this broker's topic names and
patterns.

MQTT's rules (3.1.1 section 4.7, 5.0 section 4.7)
-------------------------------------------------
A topic *name* is 1-65,535 bytes of UTF-8 without U+0000, ``+`` or ``#``;
``/`` separates its levels, which may be empty. A topic *filter* is the
same, except that a level may be ``+`` (exactly one level) and the last
level may be ``#`` (that level's parent and everything below it:
``a/#`` matches ``a``, ``a/b`` and ``a/b/c``); a wildcard is always a
whole level. A filter whose first level is a wildcard does not match a
name starting with ``$`` (``#`` does not match ``$SYS/uptime``).
``$share/GROUP/FILTER`` is a shared subscription: GROUP is one non-empty
level without ``+`` or ``#``, FILTER a filter.

The mapping to the broker's names (``broker.protocol._names``, ``_patterns``)
-----------------------------------------------------------------------------
Broker topic names have ``.``-separated tokens and may hold any printable
non-space character, ``/``, ``+``, ``#`` and ``%`` included. The mapping
swaps the two separators and escapes what MQTT cannot carry, character by
character, so that **every valid broker topic name has exactly one MQTT
name and maps back to itself**:

============== ============= ================================================
broker name    MQTT name     note
============== ============= ================================================
``.``          ``/``         the level separator
``/``          ``.``         so MQTT names with dots keep them, swapped
``+``          ``%2B``       MQTT names cannot hold ``+``
``#``          ``%23``       MQTT names cannot hold ``#``
``%``          ``%25``       the escape character itself
anything else  itself
============== ============= ================================================

``orders.eu/1`` is ``orders/eu.1``; ``sensors/192.168.0.1/temp`` (MQTT) is
``sensors.192/168/0/1.temp``; ``a.b+c`` is ``a/b%2Bc``.

From MQTT, :func:`broker_topic_name` inverts the table (``%25``, ``%2B``,
``%23`` exactly, upper case). An MQTT name is refused with
:class:`TopicError` 0x90 Topic Name invalid when it has a ``%`` not starting
one of those three escapes, or when the broker name it maps to breaks the
broker's name rule: longer than 255 bytes of UTF-8, not NFC, or holding a
space, control, format, private-use, surrogate or unassigned character.

Filters map to broker *patterns* (``*`` one token, a last ``>`` one or
more), by :func:`broker_topic_filter`, into a :class:`BrokerFilter` of one
or two broker topics whose matches together are the filter's:

- a filter without wildcards is a name (the table above); it is refused
  (0x8F) if its broker name would read as a pattern (a token ``*`` or a
  last token ``>``);
- ``+`` is ``*``; other levels map as in the table; ``a/+/#`` (and
  ``+/#``) is ``a.>`` (``>``): one or more levels below ``a``;
- any other last ``#`` is two broker topics, the parent and its ``>``
  pattern: ``a/#`` is ``a`` and ``a.>``, ``+/x/#`` is ``*.x`` and
  ``*.x.>``; ``#`` alone is ``>``;
- a filter with a wildcard is refused (0x8F Topic Filter invalid) when a
  level maps to an empty token (the broker's patterns have none:
  ``a//+``), to a token holding ``*`` or ``>`` (a wildcard mixed with
  text), or when a pattern breaks the broker's name rule as above;
- the broker's patterns match ``$``-names at the first level; MQTT's do
  not: :attr:`BrokerFilter.skip_dollar` says to drop topics whose name
  starts with ``$`` (the filter's first level is a wildcard).

Back, :func:`mqtt_topic_filter` maps every valid broker pattern to an MQTT
filter (``*`` to ``+``, a last ``>`` to ``+/#``, other tokens by the
table) that :func:`broker_topic_filter` maps back to that one pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.protocol import is_topic_pattern, topic_pattern_error
from broker.protocol import topic_name_problem as broker_name_problem

from ._codes import ReasonCode
from ._errors import MQTTError

__all__ = [
    "BrokerFilter",
    "SharedSubscription",
    "TopicError",
    "broker_topic_filter",
    "broker_topic_name",
    "mqtt_topic_filter",
    "mqtt_topic_name",
    "parse_shared",
    "topic_filter_problem",
    "topic_matches",
    "topic_name_problem",
]

_MAX = 65_535
_SHARE = "$share/"


class TopicError(MQTTError):
    """An MQTT topic name (0x90 Topic Name invalid) or filter (0x8F Topic
    Filter invalid) that breaks MQTT's rules or has no broker topic."""


def _name_error(message: str) -> TopicError:
    return TopicError(ReasonCode.TOPIC_NAME_INVALID, message)


def _filter_error(message: str) -> TopicError:
    return TopicError(ReasonCode.TOPIC_FILTER_INVALID, message)


def _size_problem(text: str, what: str) -> str | None:
    if not text:
        return f"an empty {what}"
    if "\x00" in text:
        return f"a {what} holding U+0000"
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        return f"a {what} holding a surrogate"
    if size > _MAX:
        return f"a {what} of {size} bytes, longer than 65535"
    return None


def topic_name_problem(name: str) -> str | None:
    """``None`` if ``name`` is a valid MQTT topic name, else why not."""
    problem = _size_problem(name, "topic name")
    if problem is None and ("+" in name or "#" in name):
        return "a topic name may not hold the wildcards + or #"
    return problem


def topic_filter_problem(topic_filter: str) -> str | None:
    """``None`` if ``topic_filter`` is a valid MQTT topic filter (shared or
    not), else why not."""
    problem = _size_problem(topic_filter, "topic filter")
    if problem is not None:
        return problem
    if topic_filter.startswith(_SHARE):
        try:
            parse_shared(topic_filter)
        except TopicError as error:
            return error.message
        return None
    return _levels_problem(topic_filter)


def _levels_problem(topic_filter: str) -> str | None:
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == "#":
            if index != len(levels) - 1:
                return "# must be a topic filter's last level"
        elif level != "+" and ("+" in level or "#" in level):
            return "a wildcard must be a whole level of a topic filter"
    return None


@dataclass(frozen=True, slots=True)
class SharedSubscription:
    """A ``$share/GROUP/FILTER`` subscription, taken apart."""

    group: str
    topic_filter: str


def parse_shared(topic_filter: str) -> SharedSubscription | None:
    """The group and filter of a ``$share/`` filter, ``None`` for any other
    filter; a malformed shared filter raises :class:`TopicError` (0x8F)."""
    if not topic_filter.startswith(_SHARE):
        return None
    group, slash, inner = topic_filter[len(_SHARE) :].partition("/")
    if not group or "+" in group or "#" in group:
        raise _filter_error("a shared subscription's group must be one level without + or #")
    if not slash or not inner:
        raise _filter_error("a shared subscription needs a topic filter after its group")
    problem = _levels_problem(inner)
    if problem is not None:
        raise _filter_error(problem)
    return SharedSubscription(group, inner)


def topic_matches(topic_filter: str, name: str) -> bool:
    """Whether MQTT ``topic_filter`` (valid, not shared) matches topic ``name``."""
    if name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = name.split("/")
    filter_levels = topic_filter.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(levels) or level not in ("+", levels[index]):
            return False
    return len(filter_levels) == len(levels)


# -- the mapping -------------------------------------------------------------

_TO_MQTT = str.maketrans({".": "/", "/": ".", "+": "%2B", "#": "%23", "%": "%25"})
_SWAP = str.maketrans({".": "/", "/": "."})
_UNESCAPE = {"%25": "%", "%2B": "+", "%23": "#"}


def mqtt_topic_name(broker_name: str) -> str:
    """The MQTT topic name of a valid broker topic name (total; the table
    of the module)."""
    return broker_name.translate(_TO_MQTT)


def _from_mqtt(text: str) -> str | None:
    """The broker text of MQTT ``text`` (the table inverted), ``None`` if
    a ``%`` starts no escape."""
    swapped = text.translate(_SWAP)
    if "%" not in swapped:
        return swapped
    parts = swapped.split("%")
    out = [parts[0]]
    for part in parts[1:]:
        char = _UNESCAPE.get("%" + part[:2])
        if char is None:
            return None
        out.append(char + part[2:])
    return "".join(out)


def broker_topic_name(name: str) -> str:
    """The broker topic name of MQTT topic ``name``; :class:`TopicError`
    0x90 if ``name`` is not a valid MQTT name or has no broker name."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise _name_error(problem)
    mapped = _from_mqtt(name)
    if mapped is None:
        raise _name_error("a % in a topic name must start %25, %2B or %23")
    problem = broker_name_problem(mapped)
    if problem is not None:
        raise _name_error(f"no broker topic: {problem}")
    return mapped


@dataclass(frozen=True, slots=True)
class BrokerFilter:
    """What an MQTT filter subscribes to on the broker: the union of
    ``topics`` (broker topic names or patterns), less the topics whose MQTT
    name starts with ``$`` when ``skip_dollar``."""

    topics: tuple[str, ...]
    skip_dollar: bool


def broker_topic_filter(topic_filter: str) -> BrokerFilter:
    """The broker topics of an MQTT (non-shared) ``topic_filter``, by the
    module's rules; :class:`TopicError` 0x8F if it has none."""
    problem = topic_filter_problem(topic_filter)
    if problem is None and topic_filter.startswith(_SHARE):
        problem = "a shared subscription is parsed with parse_shared first"
    if problem is not None:
        raise _filter_error(problem)
    levels = topic_filter.split("/")
    skip_dollar = levels[0] in ("+", "#")
    if "+" not in levels and "#" not in levels:
        mapped = _from_mqtt(topic_filter)
        if mapped is None:
            raise _filter_error("a % in a topic filter must start %25, %2B or %23")
        problem = broker_name_problem(mapped)
        if problem is None and is_topic_pattern(mapped):
            problem = "it would read as a broker pattern ('*' level or last '>')"
        if problem is not None:
            raise _filter_error(f"no broker topic: {problem}")
        return BrokerFilter((mapped,), skip_dollar)
    rest = levels[-1] == "#"
    body = levels[:-1] if rest else levels
    collapse = rest and body[-1:] == ["+"]
    if collapse:
        body = body[:-1]
    tokens = [_pattern_token(level) for level in body]
    parent = ".".join(tokens)
    if collapse or (rest and not body):
        patterns: tuple[str, ...] = (f"{parent}.>" if parent else ">",)
    elif rest:
        patterns = (parent, f"{parent}.>")
    else:
        patterns = (parent,)
    for pattern in patterns:
        problem = topic_pattern_error(pattern)
        if problem is not None:
            raise _filter_error(f"no broker pattern: {problem}")
    return BrokerFilter(patterns, skip_dollar)


def _pattern_token(level: str) -> str:
    if level == "+":
        return "*"
    token = _from_mqtt(level)
    if token is None:
        raise _filter_error("a % in a topic filter must start %25, %2B or %23")
    if not token:
        raise _filter_error("a filter with wildcards may not have an empty level")
    if "*" in token or ">" in token:
        raise _filter_error("a filter with wildcards may not have * or > in a level")
    return token


def mqtt_topic_filter(pattern: str) -> str:
    """The MQTT topic filter of a valid broker topic pattern or name (total;
    :func:`broker_topic_filter` maps it back to ``(pattern,)``)."""
    if not is_topic_pattern(pattern):
        return mqtt_topic_name(pattern)
    tokens = pattern.split(".")
    levels = ["+" if token == "*" else token.translate(_TO_MQTT) for token in tokens]
    if levels[-1] == ">":
        levels[-1:] = ["+", "#"]
    return "/".join(levels)
