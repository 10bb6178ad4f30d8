"""Metadata keys and object records of the store (pure encode/decode and extent arithmetic).

Key layout in RocksDB (bytes sort in this order, so a collection's objects list in name order):

    b"S"                          store identity: msgpack {uuid, format_version}
    b"Q"                          last committed transaction sequence (u64 big-endian)
    b"C" + collection             a collection: msgpack {created_ns, objects, bytes} (its
                                  objects and the sum of their sizes, as of each commit)
    b"O" + collection + 0 + name  an object record (below)
    b"B" + segment (u32 BE)       allocator bitmap segment (`allocator.SEGMENT_BLOCKS` bits)
    b"M" + omap id (u64 BE) + key one entry of an object's omap (its sorted key/value table)
    b"K" + collection + 0 + key   one entry of a collection's own key table (below)
    b"N"                          the next omap id to hand out (u64 big-endian)
    b"J"                          where journal replay starts: the ring position after the
                                  last commit group this state holds (u64 big-endian;
                                  osd/journal.py)

An object record maps logical 4 KiB blocks to device blocks with a list of extents
(`(first_block, block_count)` in logical order), keeps a crc32c per logical block (the last
block's crc covers its zero padding), the object's size, version (the sequence of the
transaction that last changed it), small attributes, the modification time and its omap id.

An object's omap lives in its own key range (`omap_range`), named by an id rather than by the
object's name, so a rename moves a table of a million entries by rewriting one record, and a
delete drops it with one range deletion. Id 0: the object has no omap yet.

A collection's key table holds small entries that belong to no object (a PG's log: one entry
per write, osd/pgs.py). Changing an entry takes no object lock, looks nothing up and leaves no
record to cache: one metadata key per entry, gone with its collection.
"""

import dataclasses
import struct

import msgpack

from cairn.common.limits import (ATTR_NAME_BYTES_MAX, ATTRS_BYTES_MAX,
                                 COLLECTION_NAME_BYTES_MAX, OBJECT_NAME_BYTES_MAX,
                                 OMAP_KEY_BYTES_MAX, OMAP_VALUE_BYTES_MAX)
from cairn.osd.errors import InvalidArgument

KEY_IDENTITY = b"S"
KEY_SEQUENCE = b"Q"
PREFIX_COLLECTION = b"C"
PREFIX_OBJECT = b"O"
PREFIX_BITMAP = b"B"
PREFIX_OMAP = b"M"
KEY_OMAP_NEXT = b"N"
KEY_JOURNAL = b"J"
PREFIX_KEYS = b"K"


def collection_key(collection):
    return PREFIX_COLLECTION + collection.encode()


def object_prefix(collection, name_prefix=""):
    return PREFIX_OBJECT + collection.encode() + b"\x00" + name_prefix.encode()


# The key prefix of each collection seen (a few hundred PG collections per OSD): every op
# makes its object's key several times. Bounded: cleared when it reaches _PREFIXES_MAX.
# One packer for every record: packb makes a Packer per call (0.49 against 0.18 µs for a small
# map). Packing lists, dicts, ints and bytes runs no Python code, so no other thread can start
# a pack on it before this one ends; its buffer is reset after each.
_PACK = msgpack.Packer(use_bin_type=True).pack
_PREFIXES = {}
_PREFIXES_MAX = 65536


def object_key(collection, name):
    prefix = _PREFIXES.get(collection)
    if prefix is None:
        prefix = object_prefix(collection)
        try:
            check_collection_name(collection)
        except InvalidArgument:
            return prefix + name.encode()   # a bad name's key finds nothing; never cached
        if len(_PREFIXES) >= _PREFIXES_MAX:
            _PREFIXES.clear()
        _PREFIXES[collection] = prefix
    return prefix + name.encode()


def keys_prefix(collection):
    """The prefix of every entry of `collection`'s key table."""
    return PREFIX_KEYS + collection.encode() + b"\x00"


def keys_range(collection):
    """[start, end) of `collection`'s key table (NUL sorts first, so SOH ends it)."""
    return keys_prefix(collection), PREFIX_KEYS + collection.encode() + b"\x01"


def bitmap_key(segment_index):
    return PREFIX_BITMAP + struct.pack(">I", segment_index)


def omap_prefix(omap_id):
    return PREFIX_OMAP + struct.pack(">Q", omap_id)


def omap_key(omap_id, key):
    return PREFIX_OMAP + struct.pack(">Q", omap_id) + key


def omap_range(omap_id):
    """[start, end) of the keys of omap `omap_id`."""
    return omap_prefix(omap_id), omap_prefix(omap_id + 1)


def check_omap_key(key):
    if not isinstance(key, (bytes, bytearray)) or not key or len(key) > OMAP_KEY_BYTES_MAX:
        raise InvalidArgument(f"an omap key is 1..{OMAP_KEY_BYTES_MAX} bytes (was "
                              f"{_describe(key)})")


def check_omap_value(value):
    if not isinstance(value, (bytes, bytearray)) or len(value) > OMAP_VALUE_BYTES_MAX:
        raise InvalidArgument(f"an omap value is at most {OMAP_VALUE_BYTES_MAX} bytes (was "
                              f"{_describe(value)})")


def _describe(value):
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return type(value).__name__


def _check_name(kind, name, bytes_max):
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{kind} name must be a non-empty string (was {name!r})")
    raw = name.encode()
    if len(raw) > bytes_max:
        raise InvalidArgument(f"{kind} name is {len(raw)} bytes; the limit is {bytes_max}")
    return raw


def check_collection_name(collection):
    if type(collection) is str and collection in _PREFIXES:
        return                          # only names that passed are cached (object_key)
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
    omap_id: int = 0        # 0: no omap

    def __post_init__(self):
        block_count = sum(count for _, count in self.extents)
        assert len(self.crcs) == 4 * block_count, (len(self.crcs), block_count)

    @property
    def block_count(self):
        return len(self.crcs) // 4

    def copy(self, attrs=None):
        return ObjectRecord(size=self.size, extents=self.extents, crcs=self.crcs,
                            attrs=dict(self.attrs if attrs is None else attrs),
                            version=self.version, mtime_ns=self.mtime_ns,
                            omap_id=self.omap_id)

    def encode(self):
        flat = [value for extent in self.extents for value in extent]
        fields = [self.size, self.version, self.mtime_ns, flat, self.crcs, self.attrs]
        if self.omap_id:
            fields.append(self.omap_id)
        return _PACK(fields)

    @classmethod
    def decode(cls, raw):
        # Records written before omaps existed have six fields.
        size, version, mtime_ns, flat, crcs, attrs, *rest = msgpack.unpackb(raw, raw=False)
        extents = tuple(zip(flat[0::2], flat[1::2]))
        return cls(size=size, extents=extents, crcs=crcs, attrs=attrs, version=version,
                   mtime_ns=mtime_ns, omap_id=rest[0] if rest else 0)


def durable_point(db):
    """(last sequence, journal ring position to replay from) of a store's metadata `db`."""
    (sequence,) = struct.unpack(">Q", db.get(KEY_SEQUENCE))
    raw = db.get(KEY_JOURNAL)
    return sequence, struct.unpack(">Q", raw)[0] if raw else 0


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
