"""Records are the exact Deliver tails: a run read from the log, behind a
per-subscription head, is byte for byte the Deliver frame."""

from __future__ import annotations

from pathlib import Path

from broker.protocol import Deliver
from broker.protocol.frames import decode_body, encode, encode_deliver, encode_deliver_tail
from tests.log.helpers import T0, open_log

MESSAGES: list[tuple[bytes, bytes | None, list[tuple[str, bytes]] | None]] = [
    (b"", None, None),
    (b"x" * 100, None, None),
    (b"payload", b"key", None),
    (bytes(range(256)) * 3, b"k" * 30, [("trace", b"abc"), ("h", b"")]),
]


def test_a_run_of_tails_makes_the_deliver_frames(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        log.append_many([encode_deliver_tail(p, k, h) for p, k, h in MESSAGES], T0)
        run = log.read(1)
        assert len(run.tails) == len(MESSAGES)
        for index, (tail, (payload, key, headers)) in enumerate(
            zip(run.tails, MESSAGES, strict=True)
        ):
            seq = run.first_offset + index
            head, _ = encode_deliver(7, seq, bytes(tail))
            frame = head + tail  # the head, then the log's own bytes
            message = Deliver(7, seq, payload, key, headers)
            assert frame == encode(message)
            assert decode_body(frame[4:]) == message
