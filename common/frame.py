"""The wire frame: a fixed header, a small msgpack header, then the payload (pure: no I/O).

Every message between cairn processes (monitor, OSD, client) is one frame over TCP:

    offset  size  field
    0       4     magic b"CRN\\x01"
    4       1     format version (1)
    5       1     kind: REQUEST, REPLY, ERROR or PUSH
    6       2     flags (FLAG_MAC: a MAC ends the header; others reserved, refused)
    8       8     request id (a reply carries its request's id; pushes carry 0)
    16      4     header length in bytes (msgpack map)
    20      4     payload length in bytes
    24      4     crc32c of the payload
    28      4     crc32c of bytes 0..27 and the msgpack header

Rules:
1. The receiver trusts nothing: a bad magic, an unknown version or kind, a length over its
   limit, a header that is not a msgpack map, or a checksum mismatch raises
   `RemoteProtocolError`, and the receiver then reads nothing more, as h11's connection is after
   an error. The shell answers with one ERROR frame and drops the connection.
2. Lengths are checked against `HEADER_BYTES_MAX` / `PAYLOAD_BYTES_MAX` (or a connection's
   lower limits) before any byte of the body is buffered.
3. The header checksum covers the fixed fields, so a flipped or lying length is caught as soon
   as the header is in, before any payload is buffered; the payload has its own checksum, checked
   where the bytes land (zero-copy receive).

`encode()` returns the pieces to write (header bytes, then the payload untouched: no copy of the
payload is made here); `decode_prefix`, `decode_header` and `decode_payload` check a received
frame in three steps. The one parser that runs them over a byte stream is
`common/wire.FrameReceiver`.
"""

import enum
import hmac
import struct

import msgpack

from cairn.common.limits import OBJECT_SIZE_BYTES_MAX
from cairn.native.checksum import crc32c, crc_and_block_crcs

MAGIC = b"CRN\x01"
VERSION = 1
_FIXED = struct.Struct("<4sBBHQIII")
_CRC = struct.Struct("<I")
_PREFIX = struct.Struct("<4sBBHQIIII")       # the fixed fields and the header's crc32c
FIXED_BYTES = _FIXED.size + 4
assert FIXED_BYTES == _PREFIX.size == 32

# Message headers are small maps (an operation, a few ids); 1 MiB bounds a hostile one while
# leaving room for a list of a few thousand names. Bulk data (maps, objects) is payload.
HEADER_BYTES_MAX = 1 << 20
# One object plus slack for a batch of metadata; a larger frame is a protocol error, as in Ceph
# (osd_max_write_size 90 MiB) and gRPC (4 MiB default receive limit, configurable).
PAYLOAD_BYTES_MAX = OBJECT_SIZE_BYTES_MAX + (4 << 20)
# Payloads from this size on are checked block by block (Frame.block_crcs).
BLOCK_CRCS_BYTES_MIN = 64 * 1024


# Flags: the frame carries a MAC (common/auth.py) in the last MAC_BYTES of its header.
FLAG_MAC = 0x1
MAC_BYTES = 16


class Kind(enum.IntEnum):
    REQUEST = 1
    REPLY = 2
    ERROR = 3          # a reply saying the request failed: header {error, message}
    PUSH = 4           # unsolicited (map updates to subscribers); request id 0


class ProtocolError(Exception):
    """Base of framing errors."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something that is not a valid frame: drop the connection."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something that cannot be a frame (our bug or a misuse)."""


# Kind by its wire value: a dict lookup, where Kind(value) costs an enum call per frame.
_KINDS = {int(kind): kind for kind in Kind}


class Frame:
    """One received (or built) frame. A plain slotted class, not a dataclass: one is made per
    message, and a frozen dataclass's __init__ costs a setattr call per field (a profile of 4 KiB
    reads put frame objects at ~3% of an OSD's CPU).

    `reserved`: bytes of the receiver's budgets this frame holds until it is answered
    (common/wire.py). `block_crcs`, `payload_crc`: a payload of BLOCK_CRCS_BYTES_MIN or more was
    checked block by block: the crc32c of each of its whole 4 KiB blocks (checksum.block_crcs)
    and of the whole payload, for a store that writes the buffer as it is and a primary that
    forwards it (one read of the bytes). Equality compares kind, id, header and payload."""

    __slots__ = ("kind", "request_id", "header", "payload", "reserved", "block_crcs",
                 "payload_crc")

    def __init__(self, kind, request_id, header, payload=b"", reserved=0, block_crcs=None,
                 payload_crc=None):
        self.kind = kind
        self.request_id = request_id
        self.header = header
        self.payload = payload
        self.reserved = reserved
        self.block_crcs = block_crcs
        self.payload_crc = payload_crc

    def replace(self, **changes):
        """A copy with some fields changed (as dataclasses.replace)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Frame(**fields)

    def __eq__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.kind, self.request_id, self.header, self.payload) == \
            (other.kind, other.request_id, other.header, other.payload)

    __hash__ = None

    def __repr__(self):
        return (f"Frame({self.kind!r}, {self.request_id}, {self.header!r}, "
                f"<{len(self.payload)} payload bytes>)")


def encode(kind, request_id, header, payload=b"", mac=None, payload_crc=None):
    """[fixed + msgpack header, payload...]: the buffers to write, in order (payload not copied).

    `payload` is one bytes-like object or a tuple of them, sent one after another as one payload
    (a read gathered from several shards goes out without being joined first). `mac`: the
    session's sending `auth.FrameMac`; the frame then carries FLAG_MAC and its MAC after the
    msgpack header (counted in the header length, covered by the header checksum).
    `payload_crc`: the payload's crc32c where the caller already has it (a payload received and
    checked, forwarded as it is); else it is computed here."""
    if not isinstance(header, dict):
        raise LocalProtocolError(f"a frame header is a dict (got {type(header).__name__})")
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"frame header cannot be packed: {exc}") from None
    if len(packed) > HEADER_BYTES_MAX:
        raise LocalProtocolError(f"frame header is {len(packed)} bytes; the limit is "
                                 f"{HEADER_BYTES_MAX}")
    if type(payload) is tuple:
        pieces = payload
        payload_bytes = sum(memoryview(piece).nbytes for piece in pieces)
    else:
        pieces = (payload,)
        payload_bytes = len(payload) if type(payload) is bytes else memoryview(payload).nbytes
    if payload_bytes > PAYLOAD_BYTES_MAX:
        raise LocalProtocolError(f"frame payload is {payload_bytes} bytes; the limit is "
                                 f"{PAYLOAD_BYTES_MAX}")
    if not 0 <= request_id < 1 << 64:
        raise LocalProtocolError(f"request id {request_id} does not fit 64 bits")
    if kind not in _KINDS:
        raise LocalProtocolError(f"unknown frame kind {kind!r}")
    if payload_crc is None:
        payload_crc = 0
        for piece in pieces:
            payload_crc = crc32c(piece, payload_crc)
    if mac is not None:
        fixed = _FIXED.pack(MAGIC, VERSION, kind, FLAG_MAC, request_id,
                            len(packed) + MAC_BYTES, payload_bytes, payload_crc)
        tag = mac.next(fixed, packed)
        head = b"".join((fixed, _CRC.pack(crc32c(tag, crc32c(packed, crc32c(fixed)))), packed,
                         tag))
    else:
        fixed = _FIXED.pack(MAGIC, VERSION, kind, 0, request_id, len(packed), payload_bytes,
                            payload_crc)
        head = b"".join((fixed, _CRC.pack(crc32c(packed, crc32c(fixed))), packed))
    return [head, *pieces]


def encode_bytes(kind, request_id, header, payload=b"", mac=None):
    """The whole frame as one bytes object (tests and small messages)."""
    return b"".join(bytes(piece) for piece in encode(kind, request_id, header, payload, mac))


class Prefix:
    """The decoded fixed part of a frame: what to read next and how to check it (`fixed`: its
    first 28 bytes, which the header checksum and a MAC cover)."""

    __slots__ = ("kind", "request_id", "header_bytes", "payload_bytes", "payload_crc",
                 "header_crc", "fixed", "flags")

    def __init__(self, kind, request_id, header_bytes, payload_bytes, payload_crc, header_crc,
                 fixed, flags=0):
        self.kind = kind
        self.request_id = request_id
        self.header_bytes = header_bytes
        self.payload_bytes = payload_bytes
        self.payload_crc = payload_crc
        self.header_crc = header_crc
        self.fixed = fixed
        self.flags = flags


def decode_prefix(buffer, offset=0):
    """Check the 32 fixed bytes at `offset` of `buffer` (at least that many must be there);
    RemoteProtocolError names what is wrong."""
    magic, version, kind, flags, request_id, header_bytes, payload_bytes, payload_crc, \
        header_crc = _PREFIX.unpack_from(buffer, offset)
    known = _KINDS.get(kind)
    if magic == MAGIC and version == VERSION and known is not None and not flags & ~FLAG_MAC \
            and (header_bytes >= MAC_BYTES or not flags & FLAG_MAC) \
            and header_bytes <= HEADER_BYTES_MAX and payload_bytes <= PAYLOAD_BYTES_MAX:
        return Prefix(known, request_id, header_bytes, payload_bytes, payload_crc, header_crc,
                      bytes(buffer[offset:offset + _FIXED.size]), flags)
    fixed = bytes(buffer[offset:offset + FIXED_BYTES])
    if magic != MAGIC:
        raise RemoteProtocolError(f"not a cairn frame (starts {bytes(fixed[:8])!r}); is this "
                                  "a cairn daemon's port?")
    if version != VERSION:
        raise RemoteProtocolError(f"frame version {version} is not supported (this build "
                                  f"speaks {VERSION})")
    try:
        kind = Kind(kind)
    except ValueError:
        raise RemoteProtocolError(f"unknown frame kind {kind}") from None
    if flags & ~FLAG_MAC:
        raise RemoteProtocolError(f"unknown frame flags {flags:#x}")
    if flags & FLAG_MAC and header_bytes < MAC_BYTES:
        raise RemoteProtocolError("a frame flagged as MACed is too short to hold its MAC")
    if header_bytes > HEADER_BYTES_MAX:
        raise RemoteProtocolError(f"frame header of {header_bytes} bytes is over the limit "
                                  f"({HEADER_BYTES_MAX})")
    if payload_bytes > PAYLOAD_BYTES_MAX:
        raise RemoteProtocolError(f"frame payload of {payload_bytes} bytes is over the limit "
                                  f"({PAYLOAD_BYTES_MAX})")
    return Prefix(kind, request_id, header_bytes, payload_bytes, payload_crc, header_crc,
                  fixed[:_FIXED.size], flags)


def decode_header(prefix, header_raw, mac=None):
    """The header (a dict) of a checked prefix, once its bytes are in: its checksum covers the
    prefix too, so a lying length is caught here, before any payload is buffered. `mac`: the
    session's receiving `auth.FrameMac`: the frame must carry a MAC, and the right one."""
    if crc32c(header_raw, crc32c(prefix.fixed)) != prefix.header_crc:
        raise RemoteProtocolError("frame header checksum mismatch (corrupted in flight?)")
    if mac is not None:
        if not prefix.flags & FLAG_MAC:
            raise RemoteProtocolError("frame without a MAC on an authenticated connection")
        header_raw, tag = header_raw[:-MAC_BYTES], header_raw[-MAC_BYTES:]
        if not hmac.compare_digest(mac.next(prefix.fixed, header_raw), tag):
            raise RemoteProtocolError("frame MAC does not check (forged, replayed or from "
                                      "another session)")
    elif prefix.flags & FLAG_MAC:
        raise RemoteProtocolError("frame with a MAC on a connection that has no session")
    try:
        header = msgpack.unpackb(header_raw, raw=False, strict_map_key=False)
    except Exception as exc:        # msgpack raises several unrelated types on garbage
        raise RemoteProtocolError(f"frame header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise RemoteProtocolError(f"frame header is a {type(header).__name__}, not a map")
    return header


def decode_payload(prefix, header, payload, reserved=0):
    """The Frame, once its payload is in; RemoteProtocolError if the payload does not check."""
    crc, crcs = 0, None
    if prefix.payload_bytes >= BLOCK_CRCS_BYTES_MIN:
        crc, crcs = crc_and_block_crcs(payload)
    elif prefix.payload_bytes:
        crc = crc32c(payload)
    if crc != prefix.payload_crc:
        raise RemoteProtocolError(f"frame payload checksum mismatch ({prefix.payload_bytes} "
                                  "bytes)")
    return Frame(prefix.kind, prefix.request_id, header, payload, reserved, crcs,
                 crc if crcs is not None else None)
