"""The object store's transaction planner: from a Transaction and the committed state, what to
write and what the commit will change.

Theory of operation: `_prepare` takes the objects' locks (in key order), then checks every
operation against the committed records plus the transaction's own earlier operations,
reserves fresh blocks for all new data in the allocator (copy-on-write: nothing committed is
overwritten in place), stages the data writes with their crc32c per block, and returns a
`_Plan`: the records to write or delete, the collections made or removed, the extents reserved,
dropped and freed, the omap changes. `_write_data` then writes the staged blocks; the committer
(osd/store_commit.py) turns the plan into the group's metadata batch. A plan that fails before
its commit returns its reservations; nothing of the committed state changes here.
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


@dataclasses.dataclass


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
                                  # committed record or None) of every object it touches
    omap: list = dataclasses.field(default_factory=list)    # omap changes, in order:
                                  # ("put", key, value) / ("delete", key) / ("range", start, end)
    future: object = None
    sequence: int = 0


class StorePlanner:
    """The planner of `Store` (osd/store.py): it reads the committed state (records, collections)
    and the object locks, reserves blocks in the allocator and writes staged data to the
    device; the committed state itself changes only in the committer."""

    async def _lock(self, keys):
        """Take the keys' locks in order (sorted keys: no deadlock between transactions)."""
        taken = 0
        try:
            for key in keys:
                await self._object_locks.acquire(key)
                taken += 1
        except BaseException:
            self._unlock(keys[:taken])
            raise

    def _unlock(self, keys):
        for key in keys:
            self._object_locks.release(key)

    async def _prepare(self, txn):
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
                        new = await self._plan_write(plan, staged, op, old)
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
        """The committed record of an object a transaction touches first (None: none), noted
        so that the commit can count what changed in each collection."""
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

    async def _plan_write(self, plan, staged, op, old):
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
                old_view = await self._read_blocks(op.collection, op.name, old, block, 1, staged)
                index = block - first
                view[index * self.block_size:(index + 1) * self.block_size] = old_view
                self.device.pool.put(old_view)
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

    async def _write_data(self, plan):
        if not plan.writes:
            return
        if len(plan.writes) == 1:
            offset, view = plan.writes[0]
            await self.device.write(offset, view)
            return
        await blockio.gather_all([self.device.write(offset, view) for offset, view in plan.writes])
