"""Framing: bytes split anywhere in, whole messages out.

A frame is a ``u32`` big-endian body length followed by the body (see
:mod:`._codec` for the body). :class:`FrameDecoder` buffers what arrives and
decodes each frame once it is whole.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

from .._errors import RemoteProtocolError
from .._types import DEFAULT_MAX_FRAME, LENGTH_PREFIX, GoodbyeCode
from ._decode import _decode_item, _new_decoder
from ._decode_fast import _fast_message, _fast_message_encoded
from ._messages import EncodedDeliveries, Message

#: The length prefix. (Made here, not imported: Python 3.11 compiles a method
#: call on an imported name as an attribute load, a bound method per frame.)
_LENGTH = struct.Struct(">I")


class FrameDecoder:
    """Incremental decoder: feed bytes split anywhere, take whole messages out.

    Each message comes with its frame size (length prefix plus body), the
    amount a channel message counts against guarantees. A length prefix of 0
    or above ``max_frame`` is refused as soon as its four bytes arrive,
    before the body is buffered.

    The work is linear in the bytes fed, however they are split: nothing is
    copied out of the buffer until its first frame is whole, and what a
    :meth:`messages` stopped at its ``limit`` leaves copied is decoded from
    that copy next time, so each byte is copied at most twice
    (:attr:`copied` counts them).
    """

    __slots__ = (
        "_buffer",
        "_copy",
        "_copy_pos",
        "copied",
        "encoded_deliveries",
        "extend",
        "max_frame",
    )

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        #: A DeliverMany without headers is given as :class:`EncodedDeliveries`.
        self.encoded_deliveries = False
        self._buffer = bytearray()
        #: A copy whose frames from ``_copy_pos`` on are the buffer's first
        #: bytes, not decoded yet (a ``limit`` stopped :meth:`messages`), or None.
        self._copy: bytes | None = None
        self._copy_pos = 0
        #: Bytes copied out of the buffer for decoding, in all.
        self.copied = 0
        #: Past its ``limit``, :meth:`messages` goes on while the next frame's
        #: body starts with ``extend[0]`` and fewer than ``extend[1]`` frames
        #: were taken (None: it stops at the limit). The caller sets it
        #: between frames: a run of one handle's frames is finished rather
        #: than cut at the limit (see ``Connection.receive_data``).
        self.extend: tuple[bytes, int] | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._buffer += data

    @property
    def frame_ready(self) -> bool:
        """A whole frame (or a length prefix to refuse) waits at the front:
        :meth:`messages` has something to give."""
        buffer = self._buffer
        if len(buffer) < LENGTH_PREFIX:
            return False
        (length,) = _LENGTH.unpack_from(buffer)
        return LENGTH_PREFIX + length <= len(buffer) or not 0 < length <= self.max_frame

    def messages(
        self, limit: int | None = None
    ) -> Iterator[tuple[Message | EncodedDeliveries, int]]:
        """Yield ``(message, frame_size)`` for every whole frame buffered, or
        for the first ``limit`` of them (and those :attr:`extend` allows).

        A frame counts as consumed once it is yielded (or found malformed);
        stopping early (or at ``limit``) leaves the frames after it buffered.
        """
        buffer = self._buffer
        taken = 0
        while True:
            data = self._copy
            if data is not None:
                pos = self._copy_pos
                self._copy = None
            elif self.frame_ready:
                data = bytes(buffer)
                self.copied += len(data)
                pos = 0
            else:
                return  # the first frame is not whole yet: nothing to copy
            front = pos  # (where the buffer begins in data)
            available = len(data)
            fast_message = _fast_message_encoded if self.encoded_deliveries else _fast_message
            stream: io.BytesIO | None = None  # the general decoder's, made on first need
            decoder: Any = None
            try:
                while available - pos >= LENGTH_PREFIX:
                    if limit is not None and taken >= limit:
                        extend = self.extend
                        if (
                            extend is None
                            or taken >= extend[1]
                            or not data.startswith(extend[0], pos + LENGTH_PREFIX)
                        ):
                            self._copy, self._copy_pos = data, pos  # (the rest, next time)
                            return
                    (length,) = _LENGTH.unpack_from(data, pos)
                    if length == 0:
                        raise RemoteProtocolError("malformed frame: empty frame")
                    if length > self.max_frame:
                        raise RemoteProtocolError(
                            f"frame of {length} bytes exceeds max_frame {self.max_frame}",
                            GoodbyeCode.FRAME_TOO_LARGE,
                        )
                    end = pos + LENGTH_PREFIX + length
                    if end > available:
                        break
                    start, pos = pos, end
                    taken += 1
                    fast = fast_message(data, start + LENGTH_PREFIX, end)
                    if fast is not None:
                        yield fast, end - start
                    else:
                        if stream is None:
                            stream = io.BytesIO(data)
                            decoder = _new_decoder(stream)
                        yield (
                            _decode_item(decoder, stream, start + LENGTH_PREFIX, end),
                            end - start,
                        )
            finally:
                del buffer[: pos - front]
