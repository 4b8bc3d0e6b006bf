"""``decode_deliver_tail`` reads back what ``encode_deliver_tail`` wrote (what
a worker forwarding a publish to its topic's owner relies on)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import Headers, RemoteProtocolError
from broker.protocol.frames import decode_deliver_tail, encode_deliver_tail

headers = st.none() | st.lists(
    st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3
).map(lambda items: [(name, value) for name, value in items])


@given(st.binary(max_size=300), st.none() | st.binary(max_size=20), headers)
def test_a_tail_reads_back_as_written(
    payload: bytes, key: bytes | None, written: Headers | None
) -> None:
    tail = encode_deliver_tail(payload, key, written)
    read = decode_deliver_tail(tail)
    assert read[:2] == (payload, key)
    assert (read[2] or None) == (written or None)


@pytest.mark.parametrize(
    "tail", [b"", b"\x41", b"\x41x\xf6", b"\x41x\xf6\xf6\xf6", b"\x01\xf6\xf6"]
)
def test_what_is_not_a_tail_is_refused(tail: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_deliver_tail(tail)
