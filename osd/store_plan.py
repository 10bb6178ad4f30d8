"""The object store's transaction planner: from a Transaction and the store's state as the
transactions before it leave it, what to write and what the commit will change.

Theory of operation: `_prepare` runs synchronously when a transaction starts (no I/O, no
waiting), so transactions are planned one at a time in the order they were started. It checks
every operation against the *current view* of each object: the record of the latest transaction
still in flight that changes it (`Store._pending`), else the committed record, then the
transaction's own earlier operations. It reserves fresh blocks for all new data in the allocator
(copy-on-write: nothing committed or in flight is overwritten in place), stages the data writes
with their crc32c per block, and returns a `_Plan`: the records to write or delete, the
collections made or removed, the extents reserved, dropped and freed, the omap changes, and
`after`, the in-flight transactions whose records it built on. `_write_data` then writes the
staged blocks; the store (osd/store.py) queues the plan for commit only after every plan in its
`after` is queued, so the commits of one object keep the order of their plans; the committer
(osd/store_commit.py) turns the plan into the group's metadata batch. A plan that fails before
its commit returns its reservations, and so fails every plan built on it.

There is no lock: the OSD serialises its writes to an object in the PG's one lock table
(osd/pgs.py), and the store orders what remains (a replica's writes, pushes, the log's tail
object) by plan order, as BlueStore's sequencers do. The one operation that must read old data to
plan, a partial `Write` of a block it does not cover whole, asks for the block (`_NeedBlocks`);
the store reads it outside the planner and plans the transaction again (tests and tools use
`Write`; the OSD writes whole objects).
"""

import dataclasses
import time

from cairn.native.bufpool import aligned_copy, is_aligned
from cairn.native.checksum import FOLD_BLOCK_BYTES, block_crcs
from cairn.osd import blockio, records
from cairn.osd.errors import (CollectionExists, CollectionNotEmpty, CollectionNotFound, NoSpace,
                              ObjectNotFound)
from cairn.osd.records import ObjectRecord
from cairn.osd.txn import (CreateCollection, Delete, KeysUpdate, OmapUpdate, Put,
                           RemoveCollection, Rename, Write)


@dataclasses.dataclass(eq=False)
class _Plan:
    """What `_prepare` decided for one transaction; the committer turns it into one batch."""
    records: dict                 # object key -> ObjectRecord, or None for a deletion
    collections: dict             # collection key -> True (create) / False (remove)
    allocated: list               # extents reserved and now referenced
    dropped: list                 # extents reserved but superseded within the transaction
    freed: list                   # committed extents no longer referenced
    writes: list                  # (device offset, view) to write before the commit
    buffers: list                 # pool buffers to return after the writes
    before: dict = dataclasses.field(default_factory=dict)  # object key -> (collection,
                                  # record before this plan, or None) of every object it touches
    omap: list = dataclasses.field(default_factory=list)    # omap changes, in order:
                                  # ("put", key, value) / ("delete", key) / ("range", start, end)
    after: set = dataclasses.field(default_factory=set)     # in-flight plans it built on
    future: object = None
    sequence: int = 0
    # Whether it reached the commit queue: None (not yet), True, or the exception that ended it
    # before; `queued_waiters`: the future a later plan waits on meanwhile (made on demand).
    queued: object = None
    queued_waiters: object = None


class _NeedBlocks(Exception):
    """The plan needs logical block `block` of `record`, device block `start` (the old bytes a
    partial Write keeps): read it and plan again. `after`: the in-flight plans the attempt had
    built on (one of them may be writing that block still)."""

    def __init__(self, collection, name, record, block, start, after):
        super().__init__(collection, name, block)
        self.collection, self.name, self.record, self.block = collection, name, record, block
        self.start, self.after = start, after


class StorePlanner:
    """The planner of `Store` (osd/store.py): it reads the committed state and the in-flight
    plans (`_pending`), reserves blocks in the allocator and hands out omap ids; the committed
    state itself changes only in the committer."""

    def _prepare(self, txn, fetched):
        """Plan `txn` against the current view. `fetched`: device blocks read for an earlier
        attempt (first block -> view); raises `_NeedBlocks` for one more."""
        plan = _Plan(records={}, collections={}, allocated=[], dropped=[], freed=[], writes=[],
                     buffers=[])
        staged = {}            # see _stage()
        try:
            for op in txn.ops:
                if isinstance(op, CreateCollection):
                    self._plan_create_collection(plan, op)
                elif isinstance(op, RemoveCollection):
                    self._plan_remove_collection(plan, op)
                elif isinstance(op, Rename):
                    self._plan_rename(plan, op)
                elif isinstance(op, KeysUpdate):
                    self._plan_keys(plan, op)
                else:
                    if not self._collection_exists(plan, op.collection):
                        raise CollectionNotFound(op.collection)
                    key = records.object_key(op.collection, op.name)
                    old = plan.records[key] if key in plan.records else \
                        self._before(plan, key, op.collection, op.name)
                    if isinstance(op, Put):
                        new = self._plan_put(plan, staged, op, old)
                    elif isinstance(op, OmapUpdate):
                        new = self._plan_omap(plan, op, old)
                    elif isinstance(op, Write):
                        new = self._plan_write(plan, staged, fetched, op, old)
                    elif isinstance(op, Delete):
                        if old is None:
                            raise ObjectNotFound(op.collection, op.name)
                        self._drop(plan, old.extents)
                        self._drop_omap(plan, old)
                        new = None
                    else:
                        if old is None:
                            raise ObjectNotFound(op.collection, op.name)
                        attrs = dict(old.attrs)
                        for attr_name, value in op.attrs.items():
                            if value is None:
                                attrs.pop(attr_name, None)
                            else:
                                attrs[attr_name] = bytes(value)
                        records.check_attrs(attrs)
                        new = old.copy(attrs=attrs)
                    plan.records[key] = new
        except BaseException:
            self.allocator.unreserve(plan.allocated + plan.dropped)
            for view in plan.buffers:
                self.device.pool.put(view)
            raise
        return plan

    def _before(self, plan, key, collection, name):
        """The record of an object a transaction touches first (None: none) in the current
        view, noted so that the commit can count what changed in each collection. An object an
        in-flight plan changes has that plan's record, and this plan then commits after it."""
        owner = self._pending.get(key)
        if owner is not None:
            record = owner.records[key]
            plan.after.add(owner)
        else:
            record = self._record(collection, name)
        plan.before[key] = (collection, record)
        return record

    def _collection_exists(self, plan, collection):
        key = records.collection_key(collection)
        if key in plan.collections:
            return plan.collections[key]
        return collection in self._collections

    def _plan_create_collection(self, plan, op):
        if self._collection_exists(plan, op.collection):
            raise CollectionExists(op.collection)
        plan.collections[records.collection_key(op.collection)] = True

    def _plan_remove_collection(self, plan, op):
        if not self._collection_exists(plan, op.collection):
            raise CollectionNotFound(op.collection)
        prefix = records.object_prefix(op.collection)
        planned_live = any(key.startswith(prefix) and record is not None
                           for key, record in plan.records.items())
        committed_live = any(
            plan.records.get(key, True) is not None for key, _ in self._iterate(prefix))
        table = records.keys_prefix(op.collection)
        writers = self._collection_writers[op.collection] - (
            1 if any(key.startswith(prefix) for key in plan.records) or
            any(change[1].startswith(table) for change in plan.omap) else 0)
        if planned_live or committed_live or writers > 0:
            raise CollectionNotEmpty(op.collection)
        plan.collections[records.collection_key(op.collection)] = False
        plan.omap.append(("range", *records.keys_range(op.collection)))   # its key table

    def _plan_rename(self, plan, op):
        for collection in (op.collection, op.target_collection):
            if not self._collection_exists(plan, collection):
                raise CollectionNotFound(collection)
        key = records.object_key(op.collection, op.name)
        target = records.object_key(op.target_collection, op.target_name)
        old = plan.records[key] if key in plan.records else \
            self._before(plan, key, op.collection, op.name)
        if old is None:
            raise ObjectNotFound(op.collection, op.name)
        if key == target:
            return
        replaced = plan.records[target] if target in plan.records else \
            self._before(plan, target, op.target_collection, op.target_name)
        if replaced is not None:
            self._drop(plan, replaced.extents)
            if replaced.omap_id != old.omap_id:
                self._drop_omap(plan, replaced)
        plan.records[target] = old.copy()       # the same extents: nothing is copied or freed
        plan.records[key] = None

    def _plan_omap(self, plan, op, old):
        if old is None:
            raise ObjectNotFound(op.collection, op.name)
        new = old.copy()
        if not new.omap_id:
            new.omap_id = self._omap_next
            self._omap_next += 1
        elif op.clear:
            plan.omap.append(("range", *records.omap_range(new.omap_id)))
        for key in op.removes:
            plan.omap.append(("delete", records.omap_key(new.omap_id, key)))
        for key, value in op.sets:
            plan.omap.append(("put", records.omap_key(new.omap_id, key), value))
        new.mtime_ns = time.time_ns()
        return new

    def _plan_keys(self, plan, op):
        if not self._collection_exists(plan, op.collection):
            raise CollectionNotFound(op.collection)
        prefix = records.keys_prefix(op.collection)
        for key in op.removes:
            plan.omap.append(("delete", prefix + key))
        for key, value in op.sets:
            plan.omap.append(("put", prefix + key, value))

    def _drop_omap(self, plan, record):
        """The omap of a record going away (deleted, replaced by a put or a rename)."""
        if record is not None and record.omap_id:
            plan.omap.append(("range", *records.omap_range(record.omap_id)))

    def _drop(self, plan, extents):
        """Extents no longer referenced: committed ones are freed at commit; ones this same
        transaction reserved (an object written twice in one transaction) are dropped."""
        if not plan.allocated:
            plan.freed.extend(extents)
            return
        own_blocks = blockio.blocks(plan.allocated)
        for start, length in extents:
            for run_start, run_length, own in blockio.runs(start, length, own_blocks):
                if own:
                    plan.dropped.append((run_start, run_length))
                    blockio.remove_blocks(plan.allocated, run_start, run_length)
                else:
                    plan.freed.append((run_start, run_length))

    def _reserve(self, plan, block_count):
        extents = self.allocator.reserve(block_count)
        if extents is None:
            raise NoSpace(block_count * self.block_size,
                          self.allocator.free_count * self.block_size, self.device.path)
        plan.allocated.extend(extents)
        return extents

    def _stage(self, plan, staged, extents, view):
        """Queue writes of `view` (whole blocks) to `extents` and remember where each extent's
        new bytes are (`staged`: first device block -> (block count, view)), so a later
        operation of the same transaction reads them from memory."""
        position = 0
        for start, length in extents:
            for chunk_start, chunk_length in blockio.chunks(start, length, self.block_size):
                size = chunk_length * self.block_size
                chunk = view[position:position + size]
                plan.writes.append((self._data_start + chunk_start * self.block_size, chunk))
                staged[chunk_start] = (chunk_length, chunk)
                position += size

    def _plan_put(self, plan, staged, op, old):
        source = memoryview(op.data).cast("B")
        length = source.nbytes if op.size is None else op.size
        if old is not None:
            self._drop(plan, old.extents)
            self._drop_omap(plan, old)
        if length == 0:
            return ObjectRecord(size=0, extents=(), crcs=b"", attrs=dict(op.attrs),
                                mtime_ns=time.time_ns())
        if is_aligned(source):
            # Zero-copy: the caller's buffer (a pool buffer a message was received into) goes
            # to the device as it is, with its zero padding if any (Transaction.put's size);
            # apply() holds it until the write completed.
            view = source
        else:
            view = aligned_copy(self.device.pool, source[:length])
            plan.buffers.append(view)
        block_count = len(view) // self.block_size
        extents = self._reserve(plan, block_count)
        self._stage(plan, staged, extents, view)
        crcs = op.crcs
        if view is not source or crcs is None or len(crcs) != 4 * block_count or \
                self.block_size != FOLD_BLOCK_BYTES:
            crcs = block_crcs(view, self.block_size)
        else:
            self.known_crcs_total += 1
        return ObjectRecord(size=length, extents=records.merge_extents(extents), crcs=crcs,
                            attrs=dict(op.attrs), mtime_ns=time.time_ns())

    def _plan_write(self, plan, staged, fetched, op, old):
        data = memoryview(op.data).cast("B")
        length = len(data)
        old_size = old.size if old is not None else 0
        if length == 0:
            if old is not None:
                return old.copy()       # plan records are always fresh: commit sets version
            return ObjectRecord(size=0, extents=(), crcs=b"", attrs={},
                                mtime_ns=time.time_ns())
        # Logical blocks to rewrite: from the first block touched (or the old end, to zero a
        # gap) to the last block touched.
        old_blocks = old.block_count if old is not None else 0
        first = min(op.offset // self.block_size, old_blocks)
        end = -(-(op.offset + length) // self.block_size)
        count = end - first
        view = self.device.pool.get(count * self.block_size)
        plan.buffers.append(view)
        view[:] = bytes(len(view))
        # Keep the old bytes of partly covered blocks (head and tail), verified by crc. Blocks
        # past the old end need nothing: the old last block's padding is already zeros.
        base = first * self.block_size
        write_end = op.offset + length
        for block in sorted({op.offset // self.block_size, end - 1}):
            fully_covered = (op.offset <= block * self.block_size
                             and (block + 1) * self.block_size <= write_end)
            if first <= block < min(end, old_blocks) and not fully_covered:
                index = block - first
                view[index * self.block_size:(index + 1) * self.block_size] = \
                    self._old_block(plan, staged, fetched, op, old, block)
        view[op.offset - base:write_end - base] = data
        new_size = max(old_size, write_end)
        extents = self._reserve(plan, count)
        self._stage(plan, staged, extents, view)
        new_crcs = block_crcs(view, self.block_size)
        if old is None:
            return ObjectRecord(size=new_size, extents=records.merge_extents(extents),
                                crcs=new_crcs, attrs={}, mtime_ns=time.time_ns())
        merged, replaced = records.splice_extents(old.extents, first, count, extents)
        self._drop(plan, replaced)
        crcs = old.crcs[:first * 4] + new_crcs + old.crcs[(first + count) * 4:]
        return ObjectRecord(size=new_size, extents=merged, crcs=crcs,
                            attrs=dict(old.attrs), mtime_ns=time.time_ns(),
                            omap_id=old.omap_id)

    def _old_block(self, plan, staged, fetched, op, old, block):
        """Logical block `block` of `old`, verified by its crc32c: staged by this transaction,
        or read for this attempt; else `_NeedBlocks`."""
        (start, _), = records.slice_extents(old.extents, block, 1)
        data = blockio.staged_bytes(staged, start, 1, self.block_size)
        if data is None:
            data = fetched.get(start)
            if data is None:
                raise _NeedBlocks(op.collection, op.name, old, block, start, set(plan.after))
        self._verify(op.collection, op.name, old, block, 1, data)
        return data

    async def _write_data(self, plan):
        if not plan.writes:
            return
        if len(plan.writes) == 1:
            offset, view = plan.writes[0]
            await self.device.write(offset, view)
            return
        await blockio.gather_all([self.device.write(offset, view) for offset, view in plan.writes])
