"""NATS headers: the multi-valued mapping, its wire form and status lines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.nats import HeaderError, Headers
from broker.nats._headers import decode_headers, encode_headers

_KEY = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
    min_size=1,
    max_size=12,
)
# Values lose their leading and trailing blanks on the wire (as NATS's own clients do).
_VALUE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20
).map(str.strip)


@given(st.lists(st.tuples(_KEY, _VALUE), max_size=8))
def test_headers_round_trip(pairs: list[tuple[str, str]]) -> None:
    headers = Headers(pairs)
    assert decode_headers(encode_headers(headers)) == headers


def test_multiple_values_keep_their_order() -> None:
    headers = Headers([("A", "1"), ("B", "x"), ("A", "2")])
    assert headers["A"] == "1"
    assert headers.get_all("A") == ["1", "2"]
    assert encode_headers(headers) == b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: x\r\n\r\n"
    assert Headers(headers) == headers  # (a copy keeps every value)
    headers["A"] = "3"
    assert headers.get_all("A") == ["3"]
    assert headers.get_all("missing") == []


@pytest.mark.parametrize(
    ("block", "status", "description", "items"),
    [
        (b"NATS/1.0 503\r\n\r\n", 503, "", {}),
        (b"NATS/1.0 408 Request Timeout\r\n\r\n", 408, "Request Timeout", {}),
        (b"NATS/1.0 404 No Messages\r\n\r\n", 404, "No Messages", {}),
        (
            b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 7\r\n\r\n",
            100,
            "Idle Heartbeat",
            {"Nats-Last-Consumer": "0", "Nats-Last-Stream": "7"},
        ),
        (b"NATS/1.0\r\nNats-Msg-Id: abc\r\n\r\n", None, "", {"Nats-Msg-Id": "abc"}),
    ],
)
def test_status_lines(
    block: bytes, status: int | None, description: str, items: dict[str, str]
) -> None:
    headers = decode_headers(block)
    assert headers is not None
    assert headers.status == status
    assert headers.description == description
    assert dict(headers) == items


def test_a_status_line_round_trips() -> None:
    headers = Headers(status=408, description="Request Timeout")
    assert encode_headers(headers) == b"NATS/1.0 408 Request Timeout\r\n\r\n"


def test_a_block_without_the_version_is_not_headers() -> None:
    assert decode_headers(b"HTTP/1.1 200 OK\r\n\r\n") is None


def test_lines_without_a_colon_are_skipped() -> None:
    headers = decode_headers(b"NATS/1.0\r\nnonsense\r\nK:  v \r\n\r\n")
    assert headers == Headers({"K": "v"})


@pytest.mark.parametrize(
    ("key", "value"), [("", "v"), ("a:b", "v"), ("a b", "v"), ("k", "a\r\nb"), ("k", "a\nb")]
)
def test_bad_keys_and_values_are_refused(key: str, value: str) -> None:
    with pytest.raises(HeaderError):
        Headers({key: value})
    with pytest.raises(HeaderError):
        encode_headers({key: value})
