"""The sink's ``topic`` option follows the topic-name rule, checked on the
driver when the options are read (no Spark session needed)."""

from __future__ import annotations

import re

import pytest

from broker.spark._options import SinkError, SinkOptions

#: Option parsing only: no Spark session, not slow (see conftest).
NEEDS_JVM = False


@pytest.mark.parametrize(
    ("topic", "says"), [("a\nb", "U+000A"), ("x" * 256, "too long"), ("a b", "U+0020")]
)
def test_a_bad_topic_option_fails_before_any_task(topic: str, says: str) -> None:
    with pytest.raises(SinkError, match=f'option "topic": .*{re.escape(says)}'):
        SinkOptions.parse({"broker.servers": "127.0.0.1:7400", "topic": topic})


def test_a_good_topic_option_is_kept() -> None:
    options = SinkOptions.parse({"broker.servers": "127.0.0.1:7400", "topic": "events.eu"})
    assert options.topic == "events.eu"
