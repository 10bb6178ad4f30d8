"""Fault injection: flip bits in one object's bytes on an OSD's device (`cairn-osd bitrot`).

Real bit rot for tests and drills: the bytes change on the device itself, under the store, so
only the per-4 KiB crc32c can notice. It works beside a running OSD: the metadata is opened
read-only (RocksDB allows that while the OSD holds it open), the object's first extent is found,
and the byte is rewritten and synced through the device path; the OSD reads with O_DIRECT, which
sees the change. Nothing here is reachable over the network.
"""

import os

from rocksdict import AccessType, Options, Rdict

from cairn.osd import records
from cairn.osd.records import ObjectRecord
from cairn.osd.superblock import SUPERBLOCK_BYTES, Superblock


class BitrotError(Exception):
    """The object or its metadata could not be found; the message says where it looked."""


def find_object(meta_dir, name, collection=None):
    """[(collection, ObjectRecord)] of every object called `name` (in `collection` if given)."""
    options = Options(raw_mode=True)
    db = Rdict(meta_dir, options=options, access_type=AccessType.read_only())
    try:
        found = []
        iterator = db.iter()
        iterator.seek(records.PREFIX_OBJECT)
        prefix_length = len(records.PREFIX_OBJECT)
        while iterator.valid() and iterator.key().startswith(records.PREFIX_OBJECT):
            raw_collection, _, raw_name = iterator.key()[prefix_length:].partition(b"\x00")
            if raw_name.decode() == name and (collection is None or
                                               raw_collection.decode() == collection):
                found.append((raw_collection.decode(), ObjectRecord.decode(iterator.value())))
            iterator.next()
        return found
    finally:
        db.close()


def flip_bits(device_path, name, *, collection=None, meta_dir=None, offset=0, mask=0x01):
    """XOR the byte at `offset` of object `name` with `mask` on the device. Returns {collection,
    object, device_offset}. Raises BitrotError when the object is not found or is empty, or
    several collections hold it and none was named."""
    with open(device_path, "rb") as handle:
        superblock = Superblock.decode(handle.read(SUPERBLOCK_BYTES), device_path)
    if meta_dir is None:
        from cairn.osd.store import default_meta_dir
        meta_dir = default_meta_dir(device_path, superblock.uuid)
    found = find_object(meta_dir, name, collection)
    if not found:
        raise BitrotError(f"no object {name!r} on {device_path} (metadata {meta_dir})")
    if len(found) > 1:
        raise BitrotError(f"{name!r} is in several collections "
                          f"({', '.join(c for c, _ in found)}); name one with --collection")
    collection, record = found[0]
    if not 0 <= offset < record.size:
        raise BitrotError(f"offset {offset} is outside {name!r} ({record.size} bytes)")
    block_size = superblock.block_size_bytes
    block = offset // block_size
    for start, length in record.extents:
        if block < length:
            break
        block -= length
    device_offset = superblock.data_start_bytes + (start + block) * block_size + \
        offset % block_size
    descriptor = os.open(device_path, os.O_RDWR)
    try:
        (value,) = os.pread(descriptor, 1, device_offset)
        os.pwrite(descriptor, bytes([value ^ mask]), device_offset)
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
    return {"collection": collection, "object": name, "device_offset": device_offset}
