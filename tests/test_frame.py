"""The wire frame codec: round trips, split delivery, and garbage in -> only RemoteProtocolError.

Method: encode frames, feed the bytes to a decoder in random pieces, and compare; then damage
frames (flip any byte, truncate, inflate lengths) and feed random bytes, checking that the decoder
raises RemoteProtocolError and nothing else, and stays poisoned after (h11's fuzzing invariant).
"""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from cairn.common import frame
from cairn.common.frame import (FrameDecoder, Kind, LocalProtocolError, RemoteProtocolError,
                                encode_bytes)

pytestmark = pytest.mark.unit

headers = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2**63, 2**63 - 1),
                                                         st.text(max_size=20), st.none(),
                                                         st.booleans(), st.binary(max_size=20)),
                          max_size=5)


@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.integers(0, 2**64 - 1), headers,
                          st.binary(max_size=3000)), min_size=1, max_size=5),
       st.lists(st.integers(1, 500), max_size=40))
@settings(max_examples=150, deadline=None)
def test_frames_round_trip_through_any_split(messages, cuts):
    wire = b"".join(encode_bytes(kind, rid, header, payload)
                    for kind, rid, header, payload in messages)
    decoder = FrameDecoder()
    received = []
    position = 0
    for cut in cuts:
        received += decoder.feed(wire[position:position + cut])
        position += cut
    received += decoder.feed(wire[position:])
    assert [(f.kind, f.request_id, f.header, bytes(f.payload)) for f in received] == \
        [(kind, rid, header, payload) for kind, rid, header, payload in messages]
    assert decoder.buffered_bytes == 0


@given(st.integers(0, 10_000), st.integers(0, 7))
@settings(max_examples=200, deadline=None)
def test_any_flipped_bit_is_a_remote_protocol_error(position_seed, bit):
    wire = encode_bytes(Kind.REQUEST, 7, {"op": "osd_boot", "id": 3}, b"payload bytes" * 10)
    position = position_seed % len(wire)
    damaged = bytearray(wire)
    damaged[position] ^= 1 << bit
    decoder = FrameDecoder()
    try:
        frames = decoder.feed(bytes(damaged))
    except RemoteProtocolError:
        with pytest.raises(RemoteProtocolError, match="earlier error"):
            decoder.feed(b"x")
        return
    # A flip in a length field can make the decoder wait for more bytes; never a wrong frame.
    assert frames == []


@given(st.binary(min_size=0, max_size=2000))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_raise_anything_else(data):
    decoder = FrameDecoder()
    try:
        frames = decoder.feed(data)
    except RemoteProtocolError:
        return
    assert frames == []          # random bytes that happen to pass still form no frame


def test_errors_name_the_problem():
    good = encode_bytes(Kind.REPLY, 1, {"ok": True}, b"abc")
    cases = [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(8), "not a cairn frame"),
        (good[:4] + b"\x09" + good[5:], "version 9"),
        (good[:5] + b"\x09" + good[6:], "unknown frame kind 9"),
        (good[:16] + struct.pack("<I", frame.HEADER_BYTES_MAX + 1) + good[20:], "over the limit"),
        (good[:20] + struct.pack("<I", frame.PAYLOAD_BYTES_MAX + 1) + good[24:],
         "over the limit"),
        (good[:-1] + bytes([good[-1] ^ 1]), "payload checksum"),
        (good[:33] + bytes([good[33] ^ 1]) + good[34:], "header checksum"),
    ]
    for wire, message in cases:
        with pytest.raises(RemoteProtocolError, match=message):
            FrameDecoder().feed(wire)


def test_a_header_that_is_not_a_map_is_refused():
    # Build a frame whose header is a msgpack list with correct checksums.
    import msgpack
    from cairn.native.checksum import crc32c
    packed = msgpack.packb([1, 2])
    fixed = struct.pack("<4sBBHQIII", frame.MAGIC, frame.VERSION, Kind.REQUEST, 0, 1,
                        len(packed), 0, 0)
    wire = fixed + struct.pack("<I", crc32c(fixed + packed)) + packed
    with pytest.raises(RemoteProtocolError, match="not a map"):
        FrameDecoder().feed(wire)


def test_local_errors_for_what_cannot_be_sent():
    with pytest.raises(LocalProtocolError, match="is a dict"):
        frame.encode(Kind.REQUEST, 1, ["not", "a", "dict"])
    with pytest.raises(LocalProtocolError, match="cannot be packed"):
        frame.encode(Kind.REQUEST, 1, {"x": object()})
    with pytest.raises(LocalProtocolError, match="64 bits"):
        frame.encode(Kind.REQUEST, 2**64, {})
    with pytest.raises(LocalProtocolError, match="header is"):
        frame.encode(Kind.REQUEST, 1, {"x": "y" * frame.HEADER_BYTES_MAX})


def test_payload_is_not_copied_by_encode():
    payload = memoryview(bytearray(1 << 20))
    pieces = frame.encode(Kind.REQUEST, 1, {"op": "put"}, payload)
    assert pieces[1] is payload


@given(st.lists(st.binary(max_size=2000), max_size=5), st.integers(0, 2**64 - 1))
@settings(max_examples=100, deadline=None)
def test_a_payload_in_pieces_is_one_payload_on_the_wire(pieces, request_id):
    """A tuple payload goes out piece by piece, uncopied, and decodes exactly as the joined
    bytes would (same length and checksum)."""
    views = tuple(memoryview(bytearray(piece)) for piece in pieces)
    written = frame.encode(Kind.REPLY, request_id, {"op": "get"}, views)
    assert all(sent is view for sent, view in zip(written[1:], views))
    joined = b"".join(pieces)
    assert encode_bytes(Kind.REPLY, request_id, {"op": "get"}, views) == \
        encode_bytes(Kind.REPLY, request_id, {"op": "get"}, joined)
    (received,) = FrameDecoder().feed(encode_bytes(Kind.REPLY, request_id, {"op": "get"}, views))
    assert bytes(received.payload) == joined
