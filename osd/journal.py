"""The commit journal: a ring of metadata records on the store's own device (pure: no I/O).

Why. A durable commit used to pay two flushes on two devices: the data device's flush, then a
synchronous RocksDB write (its WAL's fsync on the metadata filesystem), handed to a thread and
back. With the journal, a commit group writes its metadata batch as one record into a ring
between the superblock and the data area, and one device flush makes the group's data and its
record durable together. RocksDB then takes the same batch without its WAL (a memtable insert,
in the event loop's thread), and is made durable in the background from time to time by a
checkpoint (a memtable flush), after which the ring space behind it is reused. This is
BlueStore's "one flush for data and metadata" lever, on a ring of our own.

Layout. Positions are logical byte offsets that only grow; the record at position P lies at
P mod ring size. Each record starts on a 4 KiB boundary with a 56-byte header, little-endian:

    offset  size  field
    0       4     magic b"CJR1"
    4       4     kind: 1 a commit group, 2 a wrap marker (the ring goes on at the next lap)
    8       16    the store's uuid (a record of an earlier store on the same device never
                  matches)
    24      8     the record's own position (a record left from an earlier lap never matches)
    32      8     first sequence of the group (a wrap marker: the sequence expected next)
    40      8     last sequence of the group
    48      4     payload length
    52      4     crc32c of bytes 0..51 and the payload

and its payload, msgpack `[[kind, key, value-or-end], ...]`: 0 put, 1 delete, 2 delete range.

Replay (at open). RocksDB's durable state names where to start (`records.KEY_JOURNAL`) and the
last sequence it holds; records are read from there while each is whole (magic, uuid, position,
crc) and carries the next sequence. Every record but the last was written after the previous
group's flush completed, so the data it references was durable before it was; the last one may
have been written beside its data with the flush never done, so its objects' blocks are checked
against their crc32c before it is applied, and it is dropped (it was never acknowledged) when one
does not match (`Store._replay`).
"""

import struct

import msgpack

from cairn.common.limits import BLOCK_SIZE_BYTES
from cairn.native.checksum import crc32c

MAGIC = b"CJR1"
KIND_GROUP = 1
KIND_WRAP = 2
_HEADER = struct.Struct("<4sI16sQQQI")
HEADER_BYTES = _HEADER.size + 4
assert HEADER_BYTES == 56

PUT, DELETE, DELETE_RANGE = 0, 1, 2


class Record:
    __slots__ = ("position", "end", "first", "last", "ops")

    def __init__(self, position, end, first, last, ops):
        self.position, self.end, self.first, self.last, self.ops = position, end, first, last, ops


def padded_length(payload_bytes):
    return -(-(HEADER_BYTES + payload_bytes) // BLOCK_SIZE_BYTES) * BLOCK_SIZE_BYTES


# One packer for every group (see records._PACK).
_PACK = msgpack.Packer(use_bin_type=True).pack


def encode_payload(ops):
    return _PACK(ops)


def encode(kind, uuid_bytes, position, first, last, payload=b""):
    """One record (header, payload, zero padding to whole blocks)."""
    head = _HEADER.pack(MAGIC, kind, uuid_bytes, position, first, last, len(payload))
    crc = crc32c(payload, crc32c(head))
    body = head + struct.pack("<I", crc) + payload
    return body + bytes(padded_length(len(payload)) - len(body))


def _header(region, offset, position, next_sequence, uuid_bytes):
    """(kind, first, last, payload length) if a record of this store for `position`, carrying
    `next_sequence`, starts at `offset` of `region`; else None. The crc is not checked here."""
    magic, kind, uuid, at, first, last, length = _HEADER.unpack_from(region, offset)
    if magic != MAGIC or uuid != uuid_bytes or at != position or first != next_sequence or \
            kind not in (KIND_GROUP, KIND_WRAP):
        return None
    return kind, first, last, length


def starts(block, position, next_sequence, uuid_bytes):
    """Whether the ring block read at `position` begins the record replay wants next (by its
    header; `scan` checks the rest). False where a clean close or a checkpoint left the ring."""
    return _header(block, 0, position, next_sequence, uuid_bytes) is not None


def scan(region, ring_bytes, start, next_sequence, uuid_bytes):
    """The whole records of `region` (the ring's bytes) from logical position `start` on, with
    consecutive sequences from `next_sequence`, in order: [Record]. Stops at the first place
    that does not hold one."""
    found = []
    position = start
    while position - start < ring_bytes:
        offset = position % ring_bytes
        if ring_bytes - offset < HEADER_BYTES:
            break
        fields = _header(region, offset, position, next_sequence, uuid_bytes)
        if fields is None:
            break
        kind, first, last, length = fields
        if length > ring_bytes - offset - HEADER_BYTES:
            break
        head = bytes(region[offset:offset + _HEADER.size])
        (stored_crc,) = struct.unpack_from("<I", region, offset + _HEADER.size)
        payload = bytes(region[offset + HEADER_BYTES:offset + HEADER_BYTES + length])
        if crc32c(payload, crc32c(head)) != stored_crc:
            break
        if kind == KIND_WRAP:
            position += ring_bytes - offset
            continue
        if last < first:
            break
        try:
            ops = msgpack.unpackb(payload, raw=False)
        except (ValueError, msgpack.UnpackException):
            break
        end = position + padded_length(length)
        found.append(Record(position, end, first, last, ops))
        position = end
        next_sequence = last + 1
    return found


class Ring:
    """Where the next record goes and how much room is left (positions only; no I/O).

    `tail` is the position RocksDB's durable state replays from; everything from `tail` to
    `head` must stay on the device until a checkpoint moves `tail` up."""

    def __init__(self, ring_bytes, head):
        self.ring_bytes = ring_bytes
        self.head = self.tail = head

    @property
    def used(self):
        return self.head - self.tail

    def place(self, length):
        """(position, bytes of a wrap marker first or 0) for a record of `length` padded
        bytes, or None if it needs room a checkpoint must free first."""
        offset = self.head % self.ring_bytes
        skip = self.ring_bytes - offset if offset + length > self.ring_bytes else 0
        if self.used + skip + length > self.ring_bytes:
            return None
        return self.head + skip, skip
