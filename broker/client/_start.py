"""Where a reliable subscription starts: the Subscribe options that the
``start=`` and ``cursor=`` arguments of ``subscribe()`` stand for, sans-IO.

On the wire (see "Topic logs and offsets" in ``docs/protocol.md``):
``"from"``: ``"earliest"``, ``"latest"`` or an offset; ``"from_time"``: ms
since the Unix epoch; ``"cursor"``: a durable cursor's name, which follows
the topic-name rule; ``"timestamps"``: true to receive each record's
receive time (``Message.timestamp``). Only a broker that keeps topic logs
takes them.
"""

from __future__ import annotations

import datetime
from typing import Literal, TypeAlias

from broker.protocol import (
    Options,
    check_topic_name,
    check_topic_pattern,
    is_topic_pattern,
    topic_name_problem,
)

__all__ = [
    "GROUP_KEY",
    "LOG_KEYS",
    "START_KEYS",
    "Start",
    "check_subscription_target",
    "group_options",
    "subscribe_options",
    "without_log_problem",
]

#: What ``start=`` takes: the first record, the next one published, a record's
#: offset, or the first record received at or after a (timezone-aware) time.
Start: TypeAlias = Literal["earliest", "latest"] | int | datetime.datetime

#: The option names ``start=`` and ``cursor=`` stand for.
START_KEYS = ("from", "from_time")
CURSOR_KEY = "cursor"
#: A bounded read's end: the offset it stops before.
UNTIL_KEY = "until"
#: Deliveries carry their records' receive times.
TIMESTAMPS_KEY = "timestamps"
#: The options only a broker that keeps topic logs takes.
LOG_KEYS = (*START_KEYS, CURSOR_KEY, UNTIL_KEY, TIMESTAMPS_KEY)

#: A consumer group's name (the member's Subscribe joins it).
GROUP_KEY = "group"


def group_options(
    options: Options | None, mode: str, group: str | None, max_outstanding: int | None
) -> Options | None:
    """``options`` with what ``group=`` and ``max_outstanding=`` stand for
    (raises :class:`ValueError` for another mode, a bad name, or an option
    given both ways)."""
    if group is None:
        if max_outstanding is not None:
            raise ValueError("max_outstanding= is for a consumer group's member: give group= too")
        return options
    if mode != "reliable":
        raise ValueError(f"group= needs mode='reliable', not {mode!r}")
    problem = topic_name_problem(group)
    if problem is not None:
        raise ValueError(f"group={group!r}: {problem}")
    merged: Options = dict(options or {})
    for key, value in ((GROUP_KEY, group), ("max_outstanding", max_outstanding)):
        if value is None:
            continue
        if key in merged:
            raise ValueError(f"{key}= and options[{key!r}] say the same thing: give one of them")
        merged[key] = value
    return merged


#: The largest integer an option carries (options are signed 64-bit on the wire).
_OPTION_MAX = 2**63 - 1
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND = datetime.timedelta(milliseconds=1)


def subscribe_options(
    mode: str,
    options: Options | None,
    start: Start | None = None,
    cursor: str | None = None,
    timestamps: bool = False,
) -> Options | None:
    """The options of a Subscribe in ``mode``: ``options`` (not changed), with
    what ``start``, ``cursor`` and ``timestamps`` stand for added (None,
    None and False: ``options`` as given).

    ``start`` is ``"earliest"``, ``"latest"``, an offset (an int >= 0; 0 and
    1 both mean the first record) or a timezone-aware
    :class:`datetime.datetime` (the first record received at or after it,
    to the millisecond, rounded down). ``cursor`` names a durable cursor
    (the topic-name rule applies). ``timestamps`` asks for each record's
    receive time. All are only for ``mode="reliable"``.

    Raises :class:`ValueError` (one line saying what to change) for a value
    out of range, a naive datetime, a bad cursor name, another mode, or an
    option given both ways; :class:`TypeError` for a ``start`` of another type.
    """
    if start is None and cursor is None and not timestamps:
        return options
    if mode != "reliable":
        names = [
            name
            for name, value in (("start=", start), ("cursor=", cursor), ("timestamps=", timestamps))
            if value is not None and value is not False
        ]
        given = f"{' and '.join(names)} {'needs' if len(names) == 1 else 'need'}"
        raise ValueError(
            f"{given} mode='reliable', not {mode!r}: only a reliable subscription "
            "reads the topic's log"
        )
    merged: Options = dict(options or {})
    if start is not None:
        clash = [key for key in START_KEYS if key in merged]
        if clash:
            raise ValueError(
                f"start= and options[{clash[0]!r}] say the same thing: give one of them"
            )
        merged.update(start_option(start))
    if cursor is not None:
        if CURSOR_KEY in merged:
            raise ValueError("cursor= and options['cursor'] say the same thing: give one of them")
        problem = topic_name_problem(cursor)
        if problem is not None:
            raise ValueError(f"cursor names follow the topic-name rule: {problem}")
        merged[CURSOR_KEY] = cursor
    if timestamps:
        if TIMESTAMPS_KEY in merged:
            raise ValueError(
                "timestamps= and options['timestamps'] say the same thing: give one of them"
            )
        merged[TIMESTAMPS_KEY] = True
    return merged


def start_option(start: Start) -> Options:
    """The one option ``start`` stands for (see :func:`subscribe_options`)."""
    if isinstance(start, str):
        if start in ("earliest", "latest"):
            return {"from": start}
        raise ValueError(
            f"start must be 'earliest', 'latest', an offset or a datetime, not {start!r}"
        )
    if isinstance(start, bool):  # (an int to Python, not an offset to anyone)
        raise TypeError("start must be 'earliest', 'latest', an offset or a datetime, not a bool")
    if isinstance(start, int):
        # (-N: the last N records of the topic, or of each topic a pattern matches)
        if start < -_OPTION_MAX:
            raise ValueError(f"the last N records: N is at most 2**63 - 1, got {-start}")
        if start > _OPTION_MAX:
            raise ValueError(f"an offset is at most 2**63 - 1, got {start}")
        return {"from": start}
    if isinstance(start, datetime.datetime):
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError(
                "start datetime is naive (no timezone): give it one, e.g. "
                "datetime.now(timezone.utc) or when.replace(tzinfo=timezone.utc) "
                "(or when.astimezone() for the local time)"
            )
        ms = (start - _EPOCH) // _MILLISECOND
        if ms < 0:
            raise ValueError(f"start time {start.isoformat()} is before 1970 (the Unix epoch)")
        return {"from_time": ms}
    raise TypeError(
        f"start must be 'earliest', 'latest', an offset or a datetime, not {type(start).__name__}"
    )


def check_subscription_target(
    topic: str, group: str | None, timestamps: bool, options: Options | None
) -> None:
    """Check what a subscribe names: a topic name, or a topic pattern
    (``orders.*``, ``orders.>``), which takes no ``group`` or
    ``timestamps``. Raises :class:`~broker.protocol.TopicNameError` (a
    :class:`~broker.protocol.TopicPatternError` for a pattern) or
    :class:`ValueError`, in one line."""
    if not is_topic_pattern(topic):
        check_topic_name(topic)
        return
    check_topic_pattern(topic)
    opts = options or {}
    if group is not None or GROUP_KEY in opts:
        raise ValueError(
            f"{topic!r} is a pattern: a consumer group shares one topic, subscribe to a name"
        )
    if timestamps or opts.get(TIMESTAMPS_KEY):
        raise ValueError(f"{topic!r} is a pattern: its deliveries carry no timestamps")


def without_log_problem(options: Options | None) -> str | None:
    """Why a broker that keeps no topic log (its Welcome did not say
    ``offsets``) would refuse a Subscribe with ``options``, in one line; None
    if it would not (no start option, or ``"from": "latest"``)."""
    if not options:
        return None
    asked = [key for key in LOG_KEYS if key in options]
    if options.get(TIMESTAMPS_KEY) is False:
        asked.remove(TIMESTAMPS_KEY)  # (what every subscription gets anyway)
    if not asked or (asked == ["from"] and options["from"] == "latest"):
        return (
            None
            if GROUP_KEY not in options
            else (
                "the broker keeps no topic log (it runs without a data directory), so "
                "it keeps no consumer groups: subscribe without group="
            )
        )
    if asked == [TIMESTAMPS_KEY]:
        return (
            "the broker keeps no topic log (it runs without a data directory), so "
            "it keeps no record times to send: subscribe without timestamps"
        )
    return (
        "the broker keeps no topic log (it runs without a data directory), so "
        f"a subscription cannot start elsewhere than at the next message ({', '.join(asked)})"
    )
