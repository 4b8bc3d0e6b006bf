"""Frames: the wire messages, encoding, decoding and framing (sans-IO).

``_messages`` (one class per type code), ``_encode``, ``_decode`` (the
general decoder) and ``_decode_fast`` (the commonest frames first),
``_framing`` (bytes split anywhere in, whole messages out), ``_settle``
(Settle's rules).
"""
