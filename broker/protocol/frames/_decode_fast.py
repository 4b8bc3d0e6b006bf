"""The fast way through the commonest frames: a Publish, Deliver,
DeliverMany, DeliverTimed or DeliverGroup of the usual shape, and the Ack and
IssueGuarantee that answer them, are read here directly, without the
general CBOR decoder of :mod:`._codec`; anything else, well formed or not,
gives None and goes the general way."""

from __future__ import annotations

import struct

from .._origins import MAX_SESSION_ID, OriginRun
from .._types import (
    U64_MAX,
    Channel,
    ChannelKind,
)
from ._messages import (
    Ack,
    Deliver,
    DeliverGroup,
    DeliverMany,
    DeliverMatched,
    DeliverTimed,
    EncodedDeliveries,
    Entry,
    IssueGuarantee,
    Publish,
    PublishMany,
)

# The two frames that carry messages are most of the traffic. Their usual
# shape (no headers) is read here directly, without the general decoder;
# anything else, well-formed or not, goes the general way. Both ways give
# the same message for the same bytes (tests/protocol/test_codec_fast.py).

_NULL_BYTE = 0xF6


def _fast_uint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned integer at ``pos`` and the position after it; (-1, pos) if none."""
    head = data[pos]
    if head < 24:
        return head, pos + 1
    if head == 24:
        return data[pos + 1], pos + 2
    if head == 25:
        return data[pos + 1] << 8 | data[pos + 2], pos + 3
    if head == 26:
        return int.from_bytes(data[pos + 1 : pos + 5], "big"), pos + 5
    if head == 27:
        return int.from_bytes(data[pos + 1 : pos + 9], "big"), pos + 9
    return -1, pos


def _fast_blob(data: bytes, pos: int) -> tuple[int, int]:
    """Where the byte string at ``pos`` starts and stops; (-1, -1) if there is none."""
    head = data[pos]
    if 0x40 <= head <= 0x57:
        return pos + 1, pos + 1 + head - 0x40
    if head == 0x58:
        return pos + 2, pos + 2 + data[pos + 1]
    if 0x59 <= head <= 0x5B:
        width = 1 << (head - 0x58)
        start = pos + 1 + width
        return start, start + int.from_bytes(data[pos + 1 : start], "big")
    return -1, -1


def _fast_entry(data: bytes, pos: int) -> tuple[bytes, bytes | None, int] | None:
    """The payload and key of a ``payload, key, null`` run of fields (the
    tail of a message without headers) at ``pos``, and the position after
    it; None for anything else."""
    start, stop = _fast_blob(data, pos)
    if start < 0:
        return None
    payload = data[start:stop]
    if data[stop] == _NULL_BYTE:
        key = None
        pos = stop + 1
    else:
        start, pos = _fast_blob(data, stop)
        if start < 0:
            return None
        key = data[start:pos]
    if data[pos] != _NULL_BYTE:
        return None
    return payload, key, pos + 1


def _fast_tail(data: bytes, pos: int, end: int) -> tuple[bytes, bytes | None] | None:
    """The payload and key of a message whose headers are null, read from
    ``pos`` to exactly ``end``; None for anything else."""
    entry = _fast_entry(data, pos)
    if entry is None or entry[2] != end:
        return None
    return entry[0], entry[1]


def _fast_headers(data: bytes, pos: int, end: int) -> list[tuple[str, bytes]] | None:
    """The headers at ``pos`` filling the bytes to exactly ``end``: an
    array of fewer than 24 ``[text, bytes]`` pairs, each name shorter than
    256 bytes (what messages usually carry); None for anything else."""
    count = data[pos] - 0x80
    if not 0 <= count < 24:
        return None
    pos += 1
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        if data[pos] != 0x82:
            return None
        head = data[pos + 1]
        if 0x60 <= head <= 0x77:
            start = pos + 2
            stop = start + head - 0x60
        elif head == 0x78:
            start = pos + 3
            stop = start + data[pos + 2]
        else:
            return None
        if stop > end:
            return None
        try:
            name = data[start:stop].decode()
        except UnicodeDecodeError:
            return None
        start, stop = _fast_blob(data, stop)
        if start < 0 or stop > end:
            return None
        headers.append((name, data[start:stop]))
        pos = stop
    return headers if pos == end else None


def _fast_tail_headers(data: bytes, pos: int, end: int) -> Entry | None:
    """The payload, key and headers of a message's fields from ``pos`` to
    exactly ``end``, headers null or as :func:`_fast_headers` reads them;
    None for anything else."""
    start, stop = _fast_blob(data, pos)
    if start < 0 or stop > end:
        return None
    payload = data[start:stop]
    if data[stop] == _NULL_BYTE:
        key = None
        pos = stop + 1
    else:
        start, pos = _fast_blob(data, stop)
        if start < 0 or pos > end:
            return None
        key = data[start:pos]
    if data[pos] == _NULL_BYTE:
        return (payload, key, None) if pos + 1 == end else None
    headers = _fast_headers(data, pos, end)
    return None if headers is None else (payload, key, headers)


def _short_and_plain(data: bytes, pos: int, end: int) -> bool:
    """From ``pos``, a payload of 24 to 255 bytes, a null key and null
    headers fill the frame exactly (the commonest tail)."""
    return (
        data[pos] == 0x58
        and pos + 4 + data[pos + 1] == end
        and data[end - 2] == _NULL_BYTE
        and data[end - 1] == _NULL_BYTE
    )


def _fast_run_fields(
    data: bytes, pos: int, count: int, smallest: int, end: int
) -> tuple[int, int, int] | None:
    """The subscription and first sequence number at ``pos`` of a frame of
    ``count`` entries of at least ``smallest`` bytes each, and where its
    entries start; None if they are not those of such a frame."""
    subscription, pos = _fast_uint(data, pos)
    if subscription < 0:
        return None
    first_seq, pos = _fast_uint(data, pos)
    # A count longer than the bytes left could hold is not this frame's.
    if first_seq < 0 or first_seq + count - 1 > U64_MAX or smallest * count > end - pos:
        return None
    return subscription, first_seq, pos


def _array_head(data: bytes, start: int) -> tuple[int, int] | None:
    """The item count of the array at ``start`` (1 to 65,535 items) and
    where its first item starts, or None for another head."""
    first = data[start]
    if 0x81 <= first <= 0x97:
        return first - 0x80, start + 1
    if first == 0x98:
        return data[start + 1], start + 2
    if first == 0x99:
        return data[start + 1] << 8 | data[start + 2], start + 3
    return None


def _many_head(data: bytes, start: int) -> tuple[int, int] | None:
    """The item count of the array a DeliverMany or PublishMany frame is (5
    to 65,535 items) and where its first item starts, or None for another
    head."""
    found = _array_head(data, start)
    return found if found is not None and found[0] >= 5 else None


def _fast_many(data: bytes, start: int, end: int) -> DeliverMany | PublishMany | None:
    """The DeliverMany (or DeliverTimed, DeliverGroup, PublishMany) without headers in
    ``data[start:end]``, or None for any other frame (which the general
    decoder then reads)."""
    found = _many_head(data, start)
    if found is None:
        return None
    items, pos = found
    count, extra = divmod(items - 3, 3)
    if count < 1 or extra or data[pos] != 0x18 or data[pos + 1] != 34:
        if data[pos] == 0x18 and data[pos + 1] == 35:
            return _fast_timed(data, pos + 2, items, end)
        if data[pos] == 0x18 and data[pos + 1] == 36:
            return _fast_publish_many(data, pos + 2, items, end)
        if data[pos] == 0x18 and data[pos + 1] == 38:
            return _fast_group(data, pos + 2, items, end, DeliverGroup)
        if data[pos] == 0x18 and data[pos + 1] == 46:
            return _fast_group(data, pos + 2, items, end, DeliverMatched)
        return None
    fields = _fast_run_fields(data, pos + 2, count, 3, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    entries: list[Entry] = []
    append = entries.append
    for _ in range(count):
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 2 + data[pos + 1]
            if data[stop] == _NULL_BYTE and data[stop + 1] == _NULL_BYTE:
                append((data[pos + 2 : stop], None, None))
                pos = stop + 2
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        payload, key, pos = entry
        append((payload, key, None))
    if pos != end:
        return None
    return DeliverMany(subscription, first_seq, entries)


def _fast_encoded(data: bytes, start: int, end: int) -> EncodedDeliveries | None:
    """The DeliverMany without headers in ``data[start:end]`` as
    :class:`EncodedDeliveries` (each entry's tail sliced, not decoded), or
    None for any other frame."""
    found = _many_head(data, start)
    if found is None:
        return None
    items, pos = found
    count, extra = divmod(items - 3, 3)
    if count < 1 or extra or data[pos] != 0x18 or data[pos + 1] != 34:
        return None
    fields = _fast_run_fields(data, pos + 2, count, 3, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    sliced = _slice_entries(data, pos, count, end, None)
    if sliced is None or sliced[1] != end:
        return None
    return EncodedDeliveries(subscription, first_seq, sliced[0])


def _slice_entries(
    data: bytes, pos: int, count: int, end: int, keys: list[bytes | None] | None
) -> tuple[list[bytes], int] | None:
    """The ``count`` entries (``payload, key, null`` each) from ``pos``,
    each sliced whole, not decoded, with each key written into ``keys``
    where it is given, and where they end (at ``end`` or before); None if
    they are not such entries."""
    tails: list[bytes] = []
    append = tails.append
    for index in range(count):
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 4 + data[pos + 1]
            if data[stop - 2] == _NULL_BYTE and data[stop - 1] == _NULL_BYTE:
                append(data[pos:stop])
                pos = stop
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        append(data[pos : entry[2]])
        if keys is not None:
            keys[index] = entry[1]
        pos = entry[2]
    return (tails, pos) if pos <= end else None


def _fast_message_encoded(
    data: bytes, start: int, end: int
) -> (
    Publish | PublishMany | Deliver | DeliverMany | EncodedDeliveries | Ack | IssueGuarantee | None
):
    """:func:`_fast_message`, but a DeliverMany without headers is read as
    :class:`EncodedDeliveries` (for a client that passes deliveries on)."""
    if end - start >= 7 and 0x86 <= data[start] <= 0x99:
        try:
            encoded = _fast_encoded(data, start, end)
        except (IndexError, struct.error):
            return None  # truncated: the general decoder says how
        if encoded is not None:
            return encoded
    return _fast_message(data, start, end)


def _fast_publish_many(data: bytes, pos: int, items: int, end: int) -> PublishMany | None:
    """The PublishMany without headers whose fields start at ``pos`` after
    its head of ``items`` elements, up to ``end``, its entries sliced (not
    decoded); None for anything else."""
    count, extra = divmod(items - 2, 3)
    if count < 1 or extra > 1:
        return None
    topic, pos = _fast_uint(data, pos)
    # A count longer than the bytes left could hold is not this frame's.
    if topic < 0 or 3 * count > end - pos:
        return None
    keys: list[bytes | None] = [None] * count
    sliced = _slice_entries(data, pos, count, end, keys)
    if sliced is None:
        return None
    tails, pos = sliced
    if not extra:
        return PublishMany(topic, tails, keys) if pos == end else None
    # A worker link's: its origin runs follow the entries.
    origins = _fast_origins(data, pos, end, count)
    return None if origins is None else PublishMany(topic, tails, keys, origins)


def _fast_origins(data: bytes, pos: int, end: int, count: int) -> list[OriginRun] | None:
    """The origin runs at exactly ``data[pos:end]`` of a PublishMany of
    ``count`` entries (each ``[session, handle, first, count]``: what a link
    sends), or None (the general way tells)."""
    found = _array_head(data, pos)
    if found is None:
        return None
    runs_count, pos = found
    runs: list[OriginRun] = []
    total = 0
    for _ in range(runs_count):
        if data[pos] != 0x84:
            return None
        start, stop = _fast_blob(data, pos + 1)
        if start < 0 or stop - start > MAX_SESSION_ID:
            return None
        handle, pos = _fast_uint(data, stop)
        first, pos = _fast_uint(data, pos)
        size, pos = _fast_uint(data, pos)
        if handle < 0 or first < 1 or size < 1:
            return None
        runs.append((data[start:stop], handle, first, size))
        total += size
    return runs if pos == end and total == count else None


_U64_AT = struct.Struct(">Q")
_U32_AT = struct.Struct(">I")


def _fast_timed(data: bytes, pos: int, items: int, end: int) -> DeliverTimed | None:
    """The DeliverTimed without headers whose fields start at ``pos`` after
    its head of ``items`` elements, up to ``end``; None for anything else."""
    count, extra = divmod(items - 3, 4)
    if count < 1 or extra:
        return None
    fields = _fast_run_fields(data, pos, count, 4, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    times: list[int] = []
    entries: list[Entry] = []
    add_time = times.append
    append = entries.append
    read_u64 = _U64_AT.unpack_from
    for _ in range(count):
        if data[pos] == 0x1B:  # the usual time: a uint of 8 bytes
            add_time(read_u64(data, pos + 1)[0])
            pos += 9
        else:
            time_ms, pos = _fast_uint(data, pos)
            if time_ms < 0:
                return None
            add_time(time_ms)
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 2 + data[pos + 1]
            if data[stop] == _NULL_BYTE and data[stop + 1] == _NULL_BYTE:
                append((data[pos + 2 : stop], None, None))
                pos = stop + 2
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        payload, key, pos = entry
        append((payload, key, None))
    if pos != end:
        return None
    return DeliverTimed(subscription, first_seq, entries, times)


def _fast_group(
    data: bytes,
    pos: int,
    items: int,
    end: int,
    make: type[DeliverGroup] | type[DeliverMatched],
) -> DeliverGroup | DeliverMatched | None:
    """The DeliverGroup (or DeliverMatched: ``make``) without headers whose
    fields start at ``pos`` after its head of ``items`` elements, up to
    ``end``; None for anything else. (Each entry's two uints are read into
    ``offsets`` and ``delivered`` here, whatever they mean.)"""
    count, extra = divmod(items - 3, 5)
    if count < 1 or extra:
        return None
    fields = _fast_run_fields(data, pos, count, 5, end)
    if fields is None:
        return None
    subscription, first_seq, pos = fields
    offsets: list[int] = []
    delivered: list[int] = []
    entries: list[Entry] = []
    add_offset = offsets.append
    add_delivered = delivered.append
    append = entries.append
    read_u32 = _U32_AT.unpack_from
    read_u64 = _U64_AT.unpack_from
    for _ in range(count):
        head = data[pos]
        if head == 0x1A:  # the usual offset: a uint of 4 bytes (or 8)
            add_offset(read_u32(data, pos + 1)[0])
            pos += 5
        elif head == 0x1B:
            add_offset(read_u64(data, pos + 1)[0])
            pos += 9
        else:
            offset, pos = _fast_uint(data, pos)
            if offset < 0:
                return None
            add_offset(offset)
        before = data[pos]
        if before < 24:  # the usual count: a small uint, one byte
            add_delivered(before)
            pos += 1
        else:
            before, pos = _fast_uint(data, pos)
            if before < 0:
                return None
            add_delivered(before)
        if data[pos] == 0x58:  # the commonest entry: 24 to 255 bytes, no key, no headers
            stop = pos + 2 + data[pos + 1]
            if data[stop] == _NULL_BYTE and data[stop + 1] == _NULL_BYTE:
                append((data[pos + 2 : stop], None, None))
                pos = stop + 2
                continue
        entry = _fast_entry(data, pos)
        if entry is None:
            return None
        payload, key, pos = entry
        append((payload, key, None))
    if pos != end:
        return None
    return make(subscription, first_seq, entries, offsets, delivered)


#: Channel kinds by their number (a look-up, not an enum call, per frame).
_KINDS = tuple(ChannelKind)
_ACK_CODE = 21
_ISSUE_GUARANTEE_CODE = 10


def _fast_control(data: bytes, start: int, end: int) -> Ack | IssueGuarantee | None:
    """The Ack or IssueGuarantee in ``data[start:end]`` (whose head says an
    array of three), or None for anything else."""
    code = data[start + 1]
    if code == _ACK_CODE:
        subscription, pos = _fast_uint(data, start + 2)
        if subscription < 0:
            return None
        seq, pos = _fast_uint(data, pos)
        if seq < 0 or pos != end:
            return None
        return Ack(subscription, seq)
    if code == _ISSUE_GUARANTEE_CODE and data[start + 2] == 0x82:
        kind = data[start + 3]
        if kind > ChannelKind.DELIVER:
            return None
        index, pos = _fast_uint(data, start + 4)
        if index < 0 or (kind <= ChannelKind.SUBSCRIPTION_BINDS and index != 0):
            return None
        amount, pos = _fast_uint(data, pos)
        if amount < 0 or pos != end:
            return None
        return IssueGuarantee(Channel(_KINDS[kind], index), amount)
    return None


def _fast_message(
    data: bytes, start: int, end: int
) -> Publish | PublishMany | Deliver | DeliverMany | Ack | IssueGuarantee | None:
    """The Publish, Deliver, DeliverMany, DeliverTimed or DeliverGroup
    without headers, or the Ack or IssueGuarantee, in ``data[start:end]``,
    or None for any other frame (which the general decoder then reads)."""
    size = end - start
    if size >= 4 and data[start] == 0x83:
        try:
            return _fast_control(data, start, end)
        except IndexError:
            return None  # truncated: the general decoder says how
    if size < 7:
        return None
    first = data[start]
    try:
        if first >= 0x98 or data[start + 1] != 0x18 or data[start + 2] >= 34:
            return _fast_many(data, start, end) if first >= 0x85 else None
        code = data[start + 2]
        if first == 0x86 and code == 33:
            subscription, pos = _fast_uint(data, start + 3)
            if subscription < 0:
                return None
            seq, pos = _fast_uint(data, pos)
            if seq < 0:
                return None
            if _short_and_plain(data, pos, end):
                return Deliver(subscription, seq, data[pos + 2 : end - 2], None, None)
            tail = _fast_tail(data, pos, end)
            if tail is None:
                return None
            return Deliver(subscription, seq, tail[0], tail[1], None)
        if first == 0x85 and code == 32:
            topic, pos = _fast_uint(data, start + 3)
            if topic < 0:
                return None
            if _short_and_plain(data, pos, end):
                return Publish(topic, data[pos + 2 : end - 2], None, None)
            tail = _fast_tail(data, pos, end)
            if tail is None:
                return None
            return Publish(topic, tail[0], tail[1], None)
    except (IndexError, struct.error):
        return None  # truncated: the general decoder says how
    return None
