"""The sans-IO record format: write, scan, torn and corrupt tails, names."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.log import HEADER_SIZE, RecordTooLarge
from broker.log._files import topic_dir_name
from broker.log._format import check_size, scan, write_record
from broker.protocol import MAX_TOPIC_NAME


def _term(bodies: list[bytes], first: int = 1, time_ms: int = 5) -> bytearray:
    buffer = bytearray(sum(len(b) + HEADER_SIZE for b in bodies))
    view = memoryview(buffer)
    pos = 0
    for index, item in enumerate(bodies):
        pos = write_record(view, pos, item, first + index, time_ms + index)
    return buffer


def test_a_record_is_its_documented_bytes() -> None:
    buffer = _term([b"hello"], first=7, time_ms=1234)
    rest = struct.pack("<IQQ", 5, 7, 1234) + b"hello"
    assert bytes(buffer) == struct.pack("<I", zlib.crc32(rest)) + rest


@given(st.lists(st.binary(max_size=40), max_size=20), st.integers(1, 2**40))
def test_scan_finds_every_record_written(bodies: list[bytes], first: int) -> None:
    buffer = _term(bodies, first)
    found = scan(buffer, len(buffer), first)
    assert found.count == len(bodies)
    assert found.cut == 0 and found.end == len(buffer)
    assert found.next_offset == first + len(bodies)
    ends = found.positions[1:]
    got = [
        bytes(buffer[a + HEADER_SIZE : b]) for a, b in zip(found.positions[:-1], ends, strict=True)
    ]
    assert got == bodies


@given(st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=10), st.data())
def test_a_torn_tail_is_cut_at_the_last_whole_record(
    bodies: list[bytes], data: st.DataObject
) -> None:
    buffer = _term(bodies)
    limit = data.draw(st.integers(0, len(buffer) - 1))
    found = scan(buffer, limit, 1)
    whole = 0
    end = 0
    for item in bodies:
        if end + HEADER_SIZE + len(item) > limit:
            break
        end += HEADER_SIZE + len(item)
        whole += 1
    assert (found.count, found.end, found.cut) == (whole, end, limit - end)


@given(st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=10), st.data())
def test_any_flipped_byte_is_caught(bodies: list[bytes], data: st.DataObject) -> None:
    buffer = _term(bodies)
    where = data.draw(st.integers(0, len(buffer) - 1))
    buffer[where] ^= data.draw(st.integers(1, 255))
    found = scan(buffer, len(buffer), 1)
    assert found.end <= where  # nothing from the damaged record on is served
    assert found.cut == len(buffer) - found.end > 0


def test_zeros_after_the_records_are_reported_as_such() -> None:
    buffer = _term([b"a", b"b"]) + bytes(100)
    found = scan(buffer, len(buffer), 1)
    assert found.count == 2 and found.cut == 100 and found.zeros


def test_offsets_and_times_must_follow() -> None:
    buffer = _term([b"a", b"b"], first=3)
    assert scan(buffer, len(buffer), 2).count == 0
    assert scan(buffer, len(buffer), 3, min_time=6).count == 0  # first time is 5
    assert scan(buffer, len(buffer), 3, min_time=5).count == 2


def test_check_size() -> None:
    check_size(100 - HEADER_SIZE, 100)
    with pytest.raises(RecordTooLarge):
        check_size(101 - HEADER_SIZE, 100)


NAMES = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=MAX_TOPIC_NAME,
)


@given(NAMES, NAMES)
def test_topic_dir_names_are_safe_and_distinct(one: str, two: str) -> None:
    for name in (one, two):
        encoded = topic_dir_name(name)
        assert 0 < len(encoded) <= 200 + 41
        assert encoded not in (".", "..") and not encoded.startswith(".")
        assert "/" not in encoded and "\0" not in encoded
        assert encoded.isascii()
    if one != two:
        assert topic_dir_name(one) != topic_dir_name(two)


def test_topic_dir_name_examples() -> None:
    assert topic_dir_name("orders") == "orders"
    assert topic_dir_name("a/b.c") == "a%2Fb%2Ec"
    assert topic_dir_name("..") == "%2E%2E"
    assert topic_dir_name("é") == "%C3%A9"
    long = topic_dir_name("é" * 127)
    assert "~" in long and len(long) <= 200
