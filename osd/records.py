"""Metadata keys and object records of the store (pure encode/decode and extent arithmetic).

Key layout in RocksDB (bytes sort in this order, so a collection's objects list in name order):

    b"S"                          store identity: msgpack {uuid, format_version}
    b"Q"                          last committed transaction sequence (u64 big-endian)
    b"C" + collection             a collection: msgpack {created_ns, objects, bytes} (its
                                  objects and the sum of their sizes, as of each commit)
    b"O" + collection + 0 + name  an object record (below)
    b"B" + segment (u32 BE)       allocator bitmap segment (`allocator.SEGMENT_BLOCKS` bits)

An object record maps logical 4 KiB blocks to device blocks with a list of extents
(`(first_block, block_count)` in logical order), keeps a crc32c per logical block (the last
block's crc covers its zero padding), the object's size, version (the sequence of the
transaction that last changed it), small attributes and the modification time.
"""

import dataclasses
import struct

import msgpack

from cairn.common.limits import (ATTR_NAME_BYTES_MAX, ATTRS_BYTES_MAX,
                                 COLLECTION_NAME_BYTES_MAX, OBJECT_NAME_BYTES_MAX)
from cairn.osd.errors import InvalidArgument

KEY_IDENTITY = b"S"
KEY_SEQUENCE = b"Q"
PREFIX_COLLECTION = b"C"
PREFIX_OBJECT = b"O"
PREFIX_BITMAP = b"B"


def collection_key(collection):
    return PREFIX_COLLECTION + collection.encode()


def object_prefix(collection, name_prefix=""):
    return PREFIX_OBJECT + collection.encode() + b"\x00" + name_prefix.encode()


def object_key(collection, name):
    return object_prefix(collection, name)


def bitmap_key(segment_index):
    return PREFIX_BITMAP + struct.pack(">I", segment_index)


def _check_name(kind, name, bytes_max):
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{kind} name must be a non-empty string (was {name!r})")
    raw = name.encode()
    if len(raw) > bytes_max:
        raise InvalidArgument(f"{kind} name is {len(raw)} bytes; the limit is {bytes_max}")
    return raw


def check_collection_name(collection):
    # NUL separates collection from object name in object keys (see the module docstring).
    if b"\x00" in _check_name("collection", collection, COLLECTION_NAME_BYTES_MAX):
        raise InvalidArgument("collection name must not contain NUL")


def check_object_name(name):
    _check_name("object", name, OBJECT_NAME_BYTES_MAX)


def check_attrs(attrs):
    total = 0
    for key, value in attrs.items():
        if not isinstance(key, str) or not key or len(key.encode()) > ATTR_NAME_BYTES_MAX:
            raise InvalidArgument(f"attribute name must be a non-empty string of at most "
                                  f"{ATTR_NAME_BYTES_MAX} bytes (was {key!r})")
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"attribute {key!r} must be bytes (was {type(value).__name__})")
        total += len(key) + (len(value) if value is not None else 0)
    if total > ATTRS_BYTES_MAX:
        raise InvalidArgument(f"attributes total {total} bytes; the limit is {ATTRS_BYTES_MAX}")


@dataclasses.dataclass(slots=True)
class ObjectRecord:
    """One object's metadata. Committed records (the store's cache) are never changed: a
    transaction plans fresh ones (`copy()`), and the commit sets their version."""
    size: int
    extents: tuple          # ((first_block, block_count), ...) in logical order
    crcs: bytes             # little-endian uint32 per logical block
    attrs: dict
    version: int = 0
    mtime_ns: int = 0

    def __post_init__(self):
        block_count = sum(count for _, count in self.extents)
        assert len(self.crcs) == 4 * block_count, (len(self.crcs), block_count)

    @property
    def block_count(self):
        return len(self.crcs) // 4

    def copy(self, attrs=None):
        return ObjectRecord(size=self.size, extents=self.extents, crcs=self.crcs,
                            attrs=dict(self.attrs if attrs is None else attrs),
                            version=self.version, mtime_ns=self.mtime_ns)

    def encode(self):
        flat = [value for extent in self.extents for value in extent]
        return msgpack.packb([self.size, self.version, self.mtime_ns, flat, self.crcs,
                              self.attrs], use_bin_type=True)

    @classmethod
    def decode(cls, raw):
        size, version, mtime_ns, flat, crcs, attrs = msgpack.unpackb(raw, raw=False)
        extents = tuple(zip(flat[0::2], flat[1::2]))
        return cls(size=size, extents=extents, crcs=crcs, attrs=attrs, version=version,
                   mtime_ns=mtime_ns)


def slice_extents(extents, first, count):
    """The device extents covering logical blocks [first, first + count), in order."""
    assert first >= 0 and count >= 0
    if len(extents) == 1:                  # most objects: one contiguous extent
        start, length = extents[0]
        assert first + count <= length, (extents, first, count)
        return [(start + first, count)]
    out = []
    logical = 0
    end = first + count
    for start, length in extents:
        lo = max(first, logical)
        hi = min(end, logical + length)
        if lo < hi:
            out.append((start + lo - logical, hi - lo))
        logical += length
        if logical >= end:
            break
    assert sum(length for _, length in out) == count, (extents, first, count)
    return out


def splice_extents(extents, first, count, new_extents):
    """Replace logical blocks [first, first + count) with `new_extents` (the same number of
    blocks, or more when the range runs past the end). Returns (extents, replaced extents)."""
    total = sum(length for _, length in extents)
    assert 0 <= first <= total
    head = slice_extents(extents, 0, first)
    replaced_count = min(count, total - first)
    replaced = slice_extents(extents, first, replaced_count)
    tail_first = first + replaced_count
    tail = slice_extents(extents, tail_first, total - tail_first)
    return merge_extents(head + list(new_extents) + tail), replaced


def merge_extents(extents):
    out = []
    for start, length in extents:
        if length == 0:
            continue
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((start, length))
    return tuple(out)
