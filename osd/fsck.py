"""fsck: check a store's allocator against its object records, and with `deep` every checksum.

Checks, each reported as a line naming what is wrong:
- every record decodes, its extents lie inside the data area, and its block count fits its size;
- no block is referenced by two objects (double allocation);
- every referenced block is marked used in the durable bitmap, and every used block is referenced
  (no leaks);
- every object's collection exists;
- every omap entry belongs to an object's omap (no orphaned entries), and no two objects share
  one omap id, and every id is below the next id to hand out;
- every collection key table entry belongs to a collection that exists;
- with `deep`: every block's data matches its crc32c (the object and offset are named).
"""

import dataclasses
import struct

import numpy as np

from cairn.osd import records
from cairn.osd.errors import ChecksumError
from cairn.osd.records import ObjectRecord

# Problems listed in full per check; beyond this only a count is kept, so fsck of a badly broken
# store still prints a readable report.
PROBLEMS_LISTED_MAX = 50


@dataclasses.dataclass
class FsckReport:
    objects: int = 0
    bytes: int = 0
    blocks_referenced: int = 0
    blocks_marked_used: int = 0
    blocks_checked: int = 0
    problems: list = dataclasses.field(default_factory=list)
    problems_total: int = 0

    @property
    def clean(self):
        return self.problems_total == 0

    def problem(self, message):
        self.problems_total += 1
        if len(self.problems) < PROBLEMS_LISTED_MAX:
            self.problems.append(message)

    def as_dict(self):
        return dataclasses.asdict(self) | {"clean": self.clean}


async def fsck(store, deep=False, progress=None):
    """Check `store` (opened, idle). `progress(done_objects, total_bytes_checked)` is called
    now and then during a deep check. Returns an FsckReport."""
    report = FsckReport()
    allocator = store.allocator
    block_count = allocator.block_count
    references = np.zeros(block_count, dtype=np.uint16)
    collections = set(store.list_collections())
    objects = []
    counted = {}                          # collection -> [objects, bytes] found
    prefix_length = len(records.PREFIX_OBJECT)
    omap_owners = {}                      # omap id -> "collection/name"
    for key, raw in store._iterate(records.PREFIX_OBJECT):
        collection, _, name = key[prefix_length:].partition(b"\x00")
        collection, name = collection.decode(), name.decode()
        try:
            record = ObjectRecord.decode(raw)
        except Exception as exc:          # a record that fails to decode is a finding
            report.problem(f"object {name!r} in {collection!r}: record does not decode ({exc})")
            continue
        report.objects += 1
        report.bytes += record.size
        if record.omap_id:
            owner = omap_owners.setdefault(record.omap_id, f"{collection}/{name}")
            if owner != f"{collection}/{name}":
                report.problem(f"object {name!r} in {collection!r} shares omap id "
                               f"{record.omap_id} with {owner}")
            if record.omap_id >= store._omap_next:
                report.problem(f"object {name!r} in {collection!r}: omap id {record.omap_id} "
                               f"is not below the next id ({store._omap_next})")
        found = counted.setdefault(collection, [0, 0])
        found[0] += 1
        found[1] += record.size
        if collection not in collections:
            report.problem(f"object {name!r} is in collection {collection!r}, which does not "
                           "exist")
        expected_blocks = -(-record.size // store.block_size)
        if record.block_count != expected_blocks:
            report.problem(f"object {name!r} in {collection!r}: {record.block_count} blocks for "
                           f"{record.size} bytes (expected {expected_blocks})")
        inside = True
        for start, length in record.extents:
            if start < 0 or length <= 0 or start + length > block_count:
                report.problem(f"object {name!r} in {collection!r}: extent ({start}, {length}) "
                               f"lies outside the data area ({block_count} blocks)")
                inside = False
        if inside:
            for start, length in record.extents:
                references[start:start + length] += 1
            objects.append((collection, name, record))
    for collection in sorted(collections):
        found = tuple(counted.get(collection, (0, 0)))
        if store.usage(collection) != found:
            report.problem(f"collection {collection!r} counts {store.usage(collection)} "
                           f"(objects, bytes) but holds {found}")
    _check_omaps(store, omap_owners, report)
    _check_key_tables(store, collections, report)
    report.blocks_referenced = int(np.count_nonzero(references))
    report.blocks_marked_used = int(np.count_nonzero(allocator.committed))
    shared = np.flatnonzero(references > 1)
    if shared.size:
        shared_set = set(shared[:PROBLEMS_LISTED_MAX].tolist())
        owners = {}
        for collection, name, record in objects:
            for start, length in record.extents:
                for block in shared_set.intersection(range(start, start + length)):
                    owners.setdefault(block, []).append(f"{collection}/{name}")
        report.problem(f"double allocation: {shared.size} blocks are referenced by more than one "
                       "object")
        for block in sorted(owners):
            report.problem(f"block {block} is referenced by {', '.join(owners[block])}")
    referenced_free = np.flatnonzero((references > 0) & (allocator.committed == 0))
    if referenced_free.size:
        report.problem(f"{referenced_free.size} referenced blocks are marked free in the "
                       f"allocator (first: {referenced_free[:8].tolist()})")
    leaked = np.flatnonzero((references == 0) & (allocator.committed != 0))
    if leaked.size:
        report.problem(f"leak: {leaked.size} blocks are marked used but referenced by no object "
                       f"(first: {leaked[:8].tolist()})")
    if deep:
        await _check_data(store, objects, report, progress)
    return report


def _check_omaps(store, owners, report):
    """Every omap entry's id must belong to an object (an orphan is an entry that a delete or
    a replacing put should have dropped)."""
    orphans = {}
    for key, _ in store._iterate(records.PREFIX_OMAP):
        (omap_id,) = struct.unpack(">Q", key[1:9])
        if omap_id not in owners:
            orphans[omap_id] = orphans.get(omap_id, 0) + 1
    for omap_id, count in sorted(orphans.items()):
        report.problem(f"omap id {omap_id}: {count} entries belong to no object")


def _check_key_tables(store, collections, report):
    """Every key table entry's collection must exist (removing a collection drops its table)."""
    orphans = {}
    for key, _ in store._iterate(records.PREFIX_KEYS):
        collection = key[len(records.PREFIX_KEYS):].partition(b"\x00")[0].decode(
            errors="replace")
        if collection not in collections:
            orphans[collection] = orphans.get(collection, 0) + 1
    for collection, count in sorted(orphans.items()):
        report.problem(f"key table of {collection!r}: {count} entries, and no such collection")


async def _check_data(store, objects, report, progress):
    for done, (collection, name, record) in enumerate(objects, 1):
        per_read = 1024          # blocks per read: 4 MiB
        for first in range(0, record.block_count, per_read):
            count = min(per_read, record.block_count - first)
            try:
                view = await store._read_blocks(collection, name, record, first, count)
            except ChecksumError as exc:
                report.problem(f"object {name!r} in {collection!r}: checksum mismatch at offset "
                               f"{exc.offset}")
                continue
            except Exception as exc:      # a device error is a finding too; keep checking
                report.problem(f"object {name!r} in {collection!r}: read failed at block "
                               f"{first}: {exc}")
                continue
            store.device.pool.put(view)
            report.blocks_checked += count
        if progress is not None and done % 256 == 0:
            progress(done, report.blocks_checked * store.block_size)
