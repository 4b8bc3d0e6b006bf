"""Frames: the wire messages, encoding, decoding and framing (sans-IO).

``_messages`` (one class per type code), ``_encode``, ``_decode`` (the
general decoder) and ``_decode_fast`` (the commonest frames first),
``_framing`` (bytes split anywhere in, whole messages out), ``_settle``
(Settle's rules).
"""

from ._decode import decode_body, decode_deliver_tail
from ._encode import (
    MAX_DELIVER_GROUP,
    MAX_DELIVER_MANY,
    MAX_DELIVER_TIMED,
    MAX_PUBLISH_MANY,
    deliver_group_head,
    deliver_many_head,
    deliver_many_head_size,
    deliver_timed_head,
    encode,
    encode_body,
    encode_deliver,
    encode_deliver_tail,
    publish_many_head,
)
from ._framing import FrameDecoder
from ._messages import check_publish_fields
from ._settle import MAX_SETTLE_REASON, max_settle_ranges, settle_ranges

__all__ = [
    "MAX_DELIVER_GROUP",
    "MAX_DELIVER_MANY",
    "MAX_DELIVER_TIMED",
    "MAX_PUBLISH_MANY",
    "MAX_SETTLE_REASON",
    "FrameDecoder",
    "check_publish_fields",
    "decode_body",
    "decode_deliver_tail",
    "deliver_group_head",
    "deliver_many_head",
    "deliver_many_head_size",
    "deliver_timed_head",
    "encode",
    "encode_body",
    "encode_deliver",
    "encode_deliver_tail",
    "max_settle_ranges",
    "publish_many_head",
    "settle_ranges",
]
