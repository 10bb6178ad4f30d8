"""Fault injection: flip bits in one object's bytes on an OSD's device (`cairn-osd bitrot`).

Real bit rot for tests and drills: the bytes change on the device itself, under the store, so
only the per-4 KiB crc32c can notice. It works beside a running OSD: the metadata is opened
read-only (RocksDB allows that while the OSD holds it open), the object's first extent is found,
and the byte is rewritten and synced through the device path; the OSD reads with O_DIRECT, which
sees the change. Nothing here is reachable over the network.
"""

import os
import uuid as uuid_module

from rocksdict import AccessType, Options, Rdict

from cairn.osd import journal, records
from cairn.osd.records import ObjectRecord
from cairn.osd.superblock import SUPERBLOCK_BYTES, Superblock


class BitrotError(Exception):
    """The object or its metadata could not be found; the message says where it looked."""


def find_object(meta_dir, name, collection=None, device_path=None, superblock=None):
    """[(collection, ObjectRecord)] of every object called `name` (in `collection` if given).
    With `device_path` and its `superblock`, the commit journal's records that RocksDB's files
    do not hold yet count too (a running OSD keeps them in memory until a checkpoint)."""
    options = Options(raw_mode=True)
    db = Rdict(meta_dir, options=options, access_type=AccessType.read_only())
    prefix_length = len(records.PREFIX_OBJECT)

    def wanted(key):
        raw_collection, _, raw_name = key[prefix_length:].partition(b"\x00")
        return raw_name.decode() == name and (collection is None or
                                              raw_collection.decode() == collection)
    try:
        changes = {}
        if device_path is not None and superblock.journal_bytes:
            changes = _journal_changes(device_path, superblock, db)
        found = {key: value for key, value in changes.items() if value is not None and
                 wanted(key)}
        iterator = db.iter()
        iterator.seek(records.PREFIX_OBJECT)
        while iterator.valid() and iterator.key().startswith(records.PREFIX_OBJECT):
            if iterator.key() not in changes and wanted(iterator.key()):
                found[iterator.key()] = iterator.value()
            iterator.next()
    finally:
        db.close()
    return [(key[prefix_length:].partition(b"\x00")[0].decode(), ObjectRecord.decode(value))
            for key, value in sorted(found.items())]


def _journal_changes(device_path, superblock, db):
    """{object key: record bytes, or None if deleted} of the journal past RocksDB's files."""
    sequence, start = records.durable_point(db)
    with open(device_path, "rb") as handle:
        handle.seek(superblock.journal_start_bytes)
        region = handle.read(superblock.journal_bytes)
    changes = {}
    for record in journal.scan(region, superblock.journal_bytes, start, sequence + 1,
                               uuid_module.UUID(superblock.uuid).bytes):
        for op in record.ops:
            if op[1].startswith(records.PREFIX_OBJECT) and op[0] != journal.DELETE_RANGE:
                changes[op[1]] = op[2] if op[0] == journal.PUT else None
    return changes


def flip_bits(device_path, name, *, collection=None, meta_dir=None, offset=0, mask=0x01):
    """XOR the byte at `offset` of object `name` with `mask` on the device. Returns {collection,
    object, device_offset}. Raises BitrotError when the object is not found or is empty, or
    several collections hold it and none was named."""
    with open(device_path, "rb") as handle:
        superblock = Superblock.decode(handle.read(SUPERBLOCK_BYTES), device_path)
    if meta_dir is None:
        from cairn.osd.store import default_meta_dir
        meta_dir = default_meta_dir(device_path, superblock.uuid)
    found = find_object(meta_dir, name, collection, device_path, superblock)
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
