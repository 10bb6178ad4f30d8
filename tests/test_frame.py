"""The wire frame and the one parser the daemons run (common/wire.FrameReceiver): round trips,
split delivery, and garbage in -> only RemoteProtocolError, never a wrong frame.

Every test runs twice: on the native parser and encoder the daemons ship (common/_wire.pyx) and
on their Python twins (wire.FrameReceiverTwin, frame.encode); the two encoders must also produce
the same bytes.

Method: encode frames, feed the bytes to a FrameReceiver in random pieces through the calls the
event loop makes (get_buffer, then buffer_updated), and compare; then damage frames (flip any
byte, truncate, inflate lengths) and feed random bytes, checking that the receiver reports
RemoteProtocolError and nothing else, and reads nothing after (h11's fuzzing invariant).
Payloads of 64 KiB and more take the zero-copy path (their own buffer), so some are that big.
"""

import struct

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from cairn.common import auth, frame, wire
from cairn.common.frame import Kind, LocalProtocolError, RemoteProtocolError
from cairn.native.checksum import crc32c

pytestmark = pytest.mark.unit

IMPLEMENTATIONS = {"native": (wire.FrameReceiver, wire.encode, auth.FrameMac),
                   "twin": (wire.FrameReceiverTwin, frame.encode, auth.FrameMacTwin)}
current = {}


@pytest.fixture(autouse=True, scope="module", params=sorted(IMPLEMENTATIONS))
def implementation(request):
    """The parser, encoder and session MAC this round of the module's tests runs."""
    current["receiver"], current["encode"], current["mac"] = IMPLEMENTATIONS[request.param]
    yield request.param


def encode(*args, **kwargs):
    return current["encode"](*args, **kwargs)


def frame_mac(key):
    return current["mac"](key)


def encode_bytes(kind, request_id, header, payload=b"", mac=None):
    return b"".join(bytes(piece) for piece in encode(kind, request_id, header, payload, mac))

headers = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2**63, 2**63 - 1),
                                                         st.text(max_size=20), st.none(),
                                                         st.booleans(), st.binary(max_size=20)),
                          max_size=5)
payloads = st.one_of(st.binary(max_size=3000),
                     st.builds(lambda n, b: bytes([b]) * n,
                               st.integers(wire.PAYLOAD_DIRECT_BYTES_MIN - 2,
                                           wire.PAYLOAD_DIRECT_BYTES_MIN + 70_000),
                               st.integers(0, 255)))


class Fed:
    """A FrameReceiver and what it reported."""

    def __init__(self, limits=None):
        self.frames, self.errors, self.pauses = [], [], 0
        self.receiver = current["receiver"](self.frames.append, self.errors.append, limits,
                                            on_pause=self._paused)

    def _paused(self):
        self.pauses += 1

    def feed(self, data, cuts=()):
        """As the event loop does: each read fills at most what get_buffer offers."""
        position = 0
        for cut in list(cuts) + [len(data)]:
            while position < len(data) and cut > 0 and not self.receiver.failed:
                buffer = self.receiver.get_buffer(-1)
                count = min(len(buffer), cut, len(data) - position)
                buffer[:count] = data[position:position + count]
                self.receiver.buffer_updated(count)
                position += count
                cut -= count
        return self


def as_tuples(frames):
    return [(f.kind, f.request_id, f.header, bytes(f.payload)) for f in frames]


@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.integers(0, 2**64 - 1), headers,
                          payloads), min_size=1, max_size=4),
       st.lists(st.integers(1, 70_000), max_size=40))
@settings(max_examples=120, deadline=None)
def test_frames_round_trip_through_any_split(messages, cuts):
    data = b"".join(encode_bytes(kind, rid, header, payload)
                    for kind, rid, header, payload in messages)
    fed = Fed().feed(data, cuts)
    assert fed.errors == []
    assert as_tuples(fed.frames) == list(messages)
    assert not fed.receiver.frame_started


@given(st.lists(st.tuples(headers, payloads), min_size=1, max_size=3), st.integers(0, 10**9),
       st.lists(st.integers(1, 5000), max_size=10))
@settings(max_examples=100, deadline=None)
def test_a_truncated_stream_gives_a_prefix_of_the_frames(messages, cut_seed, cuts):
    encoded = [encode_bytes(Kind.REQUEST, i, header, payload)
               for i, (header, payload) in enumerate(messages)]
    data = b"".join(encoded)
    cut = cut_seed % (len(data) + 1)
    fed = Fed().feed(data[:cut], cuts)
    assert fed.errors == []
    whole = 0
    for piece in encoded:
        if sum(len(p) for p in encoded[:whole + 1]) <= cut:
            whole += 1
    assert as_tuples(fed.frames) == [(Kind.REQUEST, i, header, payload)
                                     for i, (header, payload) in enumerate(messages[:whole])]
    assert fed.receiver.frame_started == (cut > sum(len(p) for p in encoded[:whole]))


@given(st.integers(0, 10**9), st.integers(0, 7), st.booleans(),
       st.lists(st.integers(1, 40_000), max_size=8))
@settings(max_examples=250, deadline=None)
def test_any_flipped_bit_is_a_remote_protocol_error(position_seed, bit, large, cuts):
    payload = b"payload bytes" * (6000 if large else 10)
    data = encode_bytes(Kind.REQUEST, 7, {"op": "osd_boot", "id": 3}, payload)
    position = position_seed % len(data)
    damaged = bytearray(data)
    damaged[position] ^= 1 << bit
    fed = Fed().feed(bytes(damaged) + data, cuts)
    if fed.errors:
        assert all(isinstance(e, RemoteProtocolError) for e in fed.errors)
        assert len(fed.errors) == 1 and fed.receiver.failed and fed.frames == []
        return
    # A flip in a length field can make the receiver wait for more bytes; never a frame.
    assert fed.frames == [] and fed.receiver.frame_started


@given(st.binary(min_size=0, max_size=5000), st.lists(st.integers(1, 700), max_size=10))
@settings(max_examples=400, deadline=None)
def test_random_bytes_never_raise_anything_else(data, cuts):
    fed = Fed().feed(data, cuts)
    assert all(isinstance(e, RemoteProtocolError) for e in fed.errors)
    assert fed.frames == []          # random bytes that happen to pass still form no frame
    fed.feed(b"more")                # after an error nothing more is read or reported
    assert len(fed.errors) <= 1


def lying_prefix(header_bytes, payload_bytes, kind=Kind.REQUEST):
    """32 bytes that pass the prefix checks: the header checksum cannot be checked yet."""
    return struct.pack("<4sBBHQIII", frame.MAGIC, frame.VERSION, kind, 0, 1, header_bytes,
                       payload_bytes, 0) + b"\0\0\0\0"


def test_a_lying_length_holds_nothing_before_its_header_checks():
    """The prefix's lengths are believed only once the header (whose checksum covers the
    prefix) is in: claiming a 64 MiB payload reserves nothing, and a wrong header checksum is
    an error before any payload buffer exists."""
    budget = wire.ByteBudget(1 << 20)
    fed = Fed(wire.Limits(budgets=(budget,)))
    fed.feed(lying_prefix(100, frame.PAYLOAD_BYTES_MAX))
    assert fed.errors == [] and budget.used == 0 and fed.receiver.frame_started
    fed.feed(b"\x81" + bytes(99))          # 100 header bytes whose checksum is wrong
    assert [type(e) for e in fed.errors] == [RemoteProtocolError]
    assert "header checksum" in str(fed.errors[0]) and budget.used == 0


def test_a_payload_waits_for_its_budget_with_reading_paused():
    budget = wire.ByteBudget(200_000)
    resumed = []
    frames, errors = [], []
    receiver = current["receiver"](frames.append, errors.append,
                                   wire.Limits(budgets=(budget,)),
                                   on_pause=lambda: resumed.append("pause"),
                                   on_resume=lambda: resumed.append("resume"))
    budget.force(150_000)                           # held by requests being answered
    big = bytes(range(256)) * 400                   # 102,400 bytes: a direct payload
    receiver.feed(encode_bytes(Kind.REQUEST, 1, {"op": "put"}, big)[:500])
    assert resumed == ["pause"] and budget.used == 150_000 and frames == []
    budget.give(150_000)                            # answered: the payload may come in
    assert resumed == ["pause", "resume"] and budget.used == len(big)
    receiver.feed(encode_bytes(Kind.REQUEST, 1, {"op": "put"}, big)[500:])
    assert [bytes(f.payload) for f in frames] == [big] and frames[0].reserved == len(big)
    receiver.release(frames[0])
    assert budget.used == 0 and errors == []


def test_a_connection_limit_below_the_frame_limit_is_enforced():
    fed = Fed(wire.Limits(header_bytes_max=64, payload_bytes_max=1000))
    fed.feed(encode_bytes(Kind.REQUEST, 1, {"op": "x" * 80}))
    assert "over this connection's limit" in str(fed.errors[0])
    fed = Fed(wire.Limits(header_bytes_max=64, payload_bytes_max=1000))
    fed.feed(encode_bytes(Kind.REQUEST, 1, {"op": "put"}, bytes(1001)))
    assert "over this connection's limit" in str(fed.errors[0])


def test_errors_name_the_problem():
    good = encode_bytes(Kind.REPLY, 1, {"ok": True}, b"abc")
    cases = [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(8), "not a cairn frame"),
        (good[:4] + b"\x09" + good[5:], "version 9"),
        (good[:5] + b"\x09" + good[6:], "unknown frame kind 9"),
        (good[:16] + struct.pack("<I", frame.HEADER_BYTES_MAX + 1) + good[20:], "over the"),
        (good[:20] + struct.pack("<I", frame.PAYLOAD_BYTES_MAX + 1) + good[24:], "over the"),
        (good[:-1] + bytes([good[-1] ^ 1]), "payload checksum"),
        (good[:33] + bytes([good[33] ^ 1]) + good[34:], "header checksum"),
    ]
    for data, message in cases:
        fed = Fed().feed(data)
        assert len(fed.errors) == 1 and message in str(fed.errors[0]), (message, fed.errors)


def test_a_header_that_is_not_a_map_is_refused():
    # Build a frame whose header is a msgpack list with correct checksums.
    packed = msgpack.packb([1, 2])
    fixed = struct.pack("<4sBBHQIII", frame.MAGIC, frame.VERSION, Kind.REQUEST, 0, 1,
                        len(packed), 0, 0)
    data = fixed + struct.pack("<I", crc32c(fixed + packed)) + packed
    fed = Fed().feed(data)
    assert "not a map" in str(fed.errors[0])


def test_local_errors_for_what_cannot_be_sent():
    with pytest.raises(LocalProtocolError, match="is a dict"):
        encode(Kind.REQUEST, 1, ["not", "a", "dict"])
    with pytest.raises(LocalProtocolError, match="cannot be packed"):
        encode(Kind.REQUEST, 1, {"x": object()})
    with pytest.raises(LocalProtocolError, match="64 bits"):
        encode(Kind.REQUEST, 2**64, {})
    with pytest.raises(LocalProtocolError, match="header is"):
        encode(Kind.REQUEST, 1, {"x": "y" * frame.HEADER_BYTES_MAX})


def test_payload_is_not_copied_by_encode():
    payload = memoryview(bytearray(1 << 20))
    pieces = encode(Kind.REQUEST, 1, {"op": "put"}, payload)
    assert pieces[1] is payload


@given(st.lists(st.binary(max_size=2000), max_size=5), st.integers(0, 2**64 - 1))
@settings(max_examples=100, deadline=None)
def test_a_payload_in_pieces_is_one_payload_on_the_wire(pieces, request_id):
    """A tuple payload goes out piece by piece, uncopied, and decodes exactly as the joined
    bytes would (same length and checksum)."""
    views = tuple(memoryview(bytearray(piece)) for piece in pieces)
    written = encode(Kind.REPLY, request_id, {"op": "get"}, views)
    assert all(sent is view for sent, view in zip(written[1:], views))
    joined = b"".join(pieces)
    assert encode_bytes(Kind.REPLY, request_id, {"op": "get"}, views) == \
        encode_bytes(Kind.REPLY, request_id, {"op": "get"}, joined)
    (received,) = Fed().feed(encode_bytes(Kind.REPLY, request_id, {"op": "get"}, views)).frames
    assert bytes(received.payload) == joined


def test_a_session_accepts_only_its_own_macs_in_order():
    key = auth.new_secret()
    sender = frame_mac(key)
    frames = [encode_bytes(Kind.REQUEST, i, {"op": "get", "i": i}, b"x" * (i * 40_000),
                           mac=sender) for i in range(3)]
    fed = Fed()
    fed.receiver.mac = frame_mac(key)
    fed.feed(b"".join(frames), [7, 70_000])
    assert [f.header["i"] for f in fed.frames] == [0, 1, 2] and fed.errors == []
    for stream, message in ((frames[1], "MAC does not check"),              # out of order
                            (encode_bytes(Kind.REQUEST, 1, {"op": "get"}), "without a MAC"),
                            (encode_bytes(Kind.REQUEST, 1, {"op": "get"},
                                          mac=frame_mac(auth.new_secret())),
                             "MAC does not check")):                      # another session
        fed = Fed()
        fed.receiver.mac = frame_mac(key)
        fed.feed(stream)
        assert len(fed.errors) == 1 and message in str(fed.errors[0]), fed.errors
    fed = Fed().feed(frames[0])                 # a MAC where no session exists
    assert "has no session" in str(fed.errors[0])


@given(st.lists(st.tuples(headers, payloads), min_size=1, max_size=4),
       st.lists(st.integers(1, 70_000), max_size=30))
@settings(max_examples=100, deadline=None)
def test_maced_frames_survive_any_split(messages, cuts):
    """Each frame's MAC is checked once, however its bytes arrive (a header checked while its
    payload is still coming must not be checked again: the check advances the counter)."""
    key = auth.new_secret()
    sender = frame_mac(key)
    data = b"".join(encode_bytes(Kind.REPLY, i, header, payload, mac=sender)
                    for i, (header, payload) in enumerate(messages))
    fed = Fed()
    fed.receiver.mac = frame_mac(key)
    fed.feed(data, cuts)
    assert fed.errors == []
    assert as_tuples(fed.frames) == [(Kind.REPLY, i, header, payload)
                                     for i, (header, payload) in enumerate(messages)]


def test_a_large_payload_is_checked_block_by_block_and_keeps_its_block_crcs():
    """The crcs a member's store takes instead of reading the shard again, and the crc a
    primary forwards a replica with, come from the one check of the received payload."""
    import os
    from cairn.common.frame import BLOCK_CRCS_BYTES_MIN
    from cairn.native import block_crcs
    payload = os.urandom(BLOCK_CRCS_BYTES_MIN + 4096 * 3 + 100)
    fed = Fed().feed(encode_bytes(Kind.REQUEST, 1, {"op": "rep_put"}, payload), [70_000])
    received = fed.frames[0]
    assert bytes(received.payload) == payload
    whole = len(payload) // 4096 * 4096
    assert received.block_crcs == block_crcs(payload[:whole], 4096)
    assert received.payload_crc == crc32c(payload)
    small = Fed().feed(encode_bytes(Kind.REQUEST, 2, {"op": "put"}, b"x" * 1000), []).frames[0]
    assert small.block_crcs is None and small.payload_crc is None
    # A sender that passes the crc it knows sends it as it is: a wrong one is caught on receipt.
    wrong = b"".join(bytes(piece) for piece in
                     encode(Kind.REQUEST, 3, {"op": "rep_put"}, payload,
                                  payload_crc=12345))
    fed = Fed().feed(wrong, [])
    assert fed.frames == [] and "checksum mismatch" in str(fed.errors[0])


def test_payload_buffers_dropped_by_whoever_took_them_are_received_into_again():
    """A 64 KiB payload the receiver hands on is dropped by its taker without `put()` (a client
    keeps a get's bytes, a store has written them): its buffer returns to the pool and the next
    payload is received into it, not into a new mapping (62 us a buffer, made and faulted in)."""
    import gc
    payload = bytes(range(256)) * 256
    data = encode_bytes(Kind.REQUEST, 1, {"op": "put"}, payload)
    gc.collect()
    before = wire.receive_pool().statistics()
    for round_ in range(300):
        fed = Fed().feed(data, [4096])
        assert bytes(fed.frames[0].payload) == payload, round_
        fed.frames.clear()
    after = wire.receive_pool().statistics()
    assert after["reused_total"] - before["reused_total"] >= 290
    assert after["allocated_total"] - before["allocated_total"] <= 32     # one slab at most


@given(st.sampled_from(list(Kind)), st.integers(0, 2**64 - 1), headers,
       st.one_of(payloads, st.lists(st.binary(max_size=3000), max_size=3).map(tuple)),
       st.booleans(), st.one_of(st.none(), st.integers(0, 2**32 - 1)))
@settings(max_examples=150, deadline=None)
def test_the_native_encoder_writes_the_twins_bytes(kind, request_id, header, payload, maced,
                                                   payload_crc):
    """Byte for byte, MACs (the shipped MAC and its twin, senders of one session key in step)
    and given crcs included; the payload pieces are passed on as they are by both."""
    key = auth.new_secret()
    macs = (auth.FrameMac(key), auth.FrameMacTwin(key)) if maced else (None, None)
    native = wire.encode(kind, request_id, header, payload, macs[0], payload_crc)
    twin = frame.encode(kind, request_id, header, payload, macs[1], payload_crc)
    assert bytes(native[0]) == bytes(twin[0])
    assert all(a is b for a, b in zip(native[1:], twin[1:])) and len(native) == len(twin)


def test_the_native_crc_matches_the_package():
    from cairn.common import _wire
    import os
    for size in (0, 1, 7, 8, 9, 100, 4096, 70_001):
        data = os.urandom(size)
        for start in (0, 1, 0xFFFFFFFF, 0x12345678):
            assert _wire.crc32c(data, start) == crc32c(data, start), (size, start)


def test_the_native_module_works_whichever_is_imported_first():
    """Any of common/_wire.pyx, common/wire.py and common/auth.py may be imported first, and
    the shipped receiver runs the native loop with the native MAC (run without
    CAIRN_NO_EXTENSIONS, which this test is not about)."""
    import os
    import subprocess
    import sys
    environment = {k: v for k, v in os.environ.items() if k != "CAIRN_NO_EXTENSIONS"}
    for first in ("cairn.common._wire", "cairn.common.wire", "cairn.common.auth"):
        done = subprocess.run(
            [sys.executable, "-c", f"import {first}\n"
             "from cairn.common import _wire, auth, frame, wire\n"
             "assert auth.FrameMac is _wire.FrameMac\n"
             "got = []\n"
             "receiver = wire.FrameReceiver(got.append, print)\n"
             "receiver.feed(b''.join(wire.encode(frame.Kind.REQUEST, 1, {'op': 'x'}, b'p' * 70000)))\n"
             "assert wire.FrameReceiver._parse is _wire.cut_frames\n"
             "assert bytes(got[0].payload) == b'p' * 70000"],
            capture_output=True, text=True, timeout=60, env=environment)
        assert done.returncode == 0, (first, done.stderr)
