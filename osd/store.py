"""The OSD's object store: objects on a raw block device, metadata in RocksDB.

Theory of operation (BlueStore's shape, smaller):

1. A transaction (`Transaction`) lists operations on collections and objects. `Store.apply()`
   plans it at once, synchronously (osd/store_plan.py): every operation is checked against the
   current view of its object (the record of the latest transaction in flight that changes
   it, else the committed one) plus the transaction's own earlier operations, fresh blocks are
   reserved for all new data (copy-on-write: nothing committed or in flight is ever
   overwritten in place), and the data is written with its crc32c per 4 KiB block. No lock:
   transactions are planned in the order they start.
2. Once its writes completed, and every transaction whose uncommitted record it built on is
   queued before it, the transaction joins the commit queue. The committer takes
   everything queued and builds one metadata batch: every record, deletion and allocator-bitmap
   segment of the group. With a commit journal (format 2, osd/journal.py) it writes the batch as
   one record into the journal ring on the device, issues one device flush (the group's data
   and its record are then durable together), puts the batch into RocksDB without its WAL, and
   acknowledges the group; background checkpoints make RocksDB durable and free the ring.
   Without one (format 1) it flushes the device, then writes the batch synchronously to
   RocksDB in a thread, and acknowledges; the next group's flush runs meanwhile (a flush only
   makes unreferenced blocks durable). Either way many concurrent transactions share one
   flush, and everything after the flush stays strictly one group at a time.
3. Blocks a commit replaced or deleted are returned to the allocator only after the commit is
   durable and every read that started before it has finished (see `allocator.py`, rule 3).

Crash safety follows from the order: data writes, flush, metadata commit, acknowledgement. A crash
before the commit leaves the old records pointing at untouched old blocks, and the new blocks free
in the durable bitmap. RocksDB's write batch is atomic, and a journal record is replayed whole or
not at all, so a transaction is visible whole or not at all. With a journal, replay at open
(`_replay`) applies the records RocksDB's durable state lacks; only the last one can have been
written beside data its flush never made durable, so its objects' crc32c are checked first.
Reads check every block's crc32c and never return bytes that fail it.

Files: this one holds `Store`'s life cycle (open, load, close) and its transaction entry points
(`apply`, `start_apply`); the read side is osd/store_read.py, the planner osd/store_plan.py and
the committer osd/store_commit.py, each a part of `Store` (a class it inherits, so all three see
one state; which state each may change is in its docstring).

Rules:
- The committed state changes only in the committer (`_commit_loop`, one task); the view of
  transactions in flight (`_pending`) only when a plan is made, queued, committed or fails.
- One object's transactions commit in the order they were planned; a transaction built on one
  that failed before its commit fails too (StoreError), as its record names blocks that were
  never written.
- A failed flush or metadata write poisons the store (`StoreFailed`): the on-device state is
  unknown, so the OSD must restart and remount rather than guess.
"""

import asyncio
import collections
import concurrent.futures
import logging
import os
import shutil
import stat
import struct
import uuid as uuid_module

import msgpack
from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from cairn.common import limits
from cairn.common.limits import BLOCK_SIZE_BYTES, DEVICE_IO_BYTES_MAX
from cairn.native.errors import DeviceNoSpace
from cairn.osd import journal, records
from cairn.osd.allocator import Allocator
from cairn.osd.errors import (CollectionNotFound, InvalidArgument, StoreClosed,  # noqa: F401
                              StoreError, StoreExists, StoreFailed, StoreMismatch)
from cairn.osd.records import ObjectRecord
from cairn.osd.store_commit import StoreCommitter
from cairn.osd.store_plan import StorePlanner, _NeedBlocks
from cairn.osd.store_read import RECORD_ENTRY_BYTES, ReadCache, StoreReads  # noqa: F401
from cairn.osd.superblock import SUPERBLOCK_BYTES, Superblock
from cairn.osd.txn import (CreateCollection, RemoveCollection,  # noqa: F401
                           Rename, Transaction)

log = logging.getLogger("cairn.osd")

META_ROOT_DEFAULT = "/var/lib/cairn"
# The buffer journal records are written from (larger ones take a pool buffer).
JOURNAL_BUFFER_BYTES = 64 << 10
# A partial write plans again after each old block it had to read; this many attempts means
# other transactions keep replacing the object meanwhile.
PLAN_ATTEMPTS_MAX = 64




# -- mkfs / mount ---------------------------------------------------------------------------

def default_meta_dir(device_path, uuid):
    """Where a device's RocksDB lives unless told: beside a file device; under
    /var/lib/cairn for a block device (its directory is /dev)."""
    try:
        is_block = stat.S_ISBLK(os.stat(device_path).st_mode)
    except OSError:
        is_block = False
    if is_block:
        root = os.environ.get("CAIRN_META_ROOT", META_ROOT_DEFAULT)
        return os.path.join(root, f"osd-{uuid}.meta")
    return os.fspath(device_path) + ".meta"


# Bloom filters, in table files and in the memtable: every put looks up its object's record
# first, and a new object's key is in no file. Measured with rocksdict (12 table files of 20,000
# keys, lookups of absent keys between present ones): 3.7 us without a filter, 1.2 us with; in
# a memtable of 200,000 keys 0.9 us without, 0.3 us with. Ten bits per key: 1% false positives.
BLOOM_BITS_PER_KEY = 10
MEMTABLE_BLOOM_RATIO = 0.02


def _open_db(meta_dir, create):
    options = Options(raw_mode=True)
    options.create_if_missing(create)
    table = BlockBasedOptions()
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    options.set_block_based_table_factory(table)
    options.set_memtable_whole_key_filtering(True)
    options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    return Rdict(meta_dir, options=options)


def _sync_write_options():
    write_options = WriteOptions()
    write_options.sync = True
    return write_options


async def read_superblock(device):
    view = await device.read(0, SUPERBLOCK_BYTES)
    try:
        return Superblock.decode(view, device.path)
    finally:
        device.pool.put(view)


async def mkfs(device, meta_dir=None, *, force=False, journal=True):
    """Make an empty store on `device`. Refuses a device that already holds one unless
    `force`. `journal=False`: no commit journal (each commit group then syncs RocksDB; for
    tests and comparisons). Returns the new superblock."""
    try:
        old = await read_superblock(device)
    except StoreError:
        old = None
    if old is not None and not force:
        raise StoreExists(f"{device.path} already holds a cairn store (uuid {old.uuid}); "
                          "pass --force to destroy it")
    superblock = Superblock.new(device.size_bytes, journal)
    if superblock.block_count < 1:
        raise InvalidArgument(f"{device.path} is too small ({device.size_bytes} bytes) for a "
                              f"store: it needs more than {superblock.data_start_bytes} bytes")
    try:
        # A device that is a sparse file takes room in its filesystem only as it is written. The
        # journal ring is written at every commit, with nothing else to fail first: a ring
        # position meeting a full filesystem would fail a commit (and the store with it) where
        # a data write answers `no_space`. So the superblock and the ring take their room now.
        device.allocate(0, superblock.data_start_bytes)
    except DeviceNoSpace as exc:
        raise DeviceNoSpace(f"{exc}: the filesystem under {device.path} has no room for the "
                            f"store's superblock and journal ({superblock.data_start_bytes} "
                            "bytes)", path=device.path, offset=0,
                            length=superblock.data_start_bytes, errno=exc.errno) from None
    meta_dir = meta_dir or default_meta_dir(device.path, superblock.uuid)
    if old is not None:
        old_meta = default_meta_dir(device.path, old.uuid)
        if old_meta != meta_dir and os.path.isdir(old_meta):
            shutil.rmtree(old_meta)
    if os.path.exists(meta_dir):
        shutil.rmtree(meta_dir)
    os.makedirs(os.path.dirname(os.path.abspath(meta_dir)), exist_ok=True)
    db = _open_db(meta_dir, create=True)
    try:
        batch = WriteBatch(raw_mode=True)
        batch.put(records.KEY_IDENTITY, msgpack.packb(
            {"uuid": superblock.uuid, "format_version": superblock.format_version}))
        batch.put(records.KEY_SEQUENCE, struct.pack(">Q", 0))
        db.write(batch, _sync_write_options())
    finally:
        db.close()
    # The superblock goes last: a device whose mkfs was interrupted has no valid superblock.
    view = device.pool.get(SUPERBLOCK_BYTES)
    view[:] = superblock.encode()
    await device.write(0, view)
    await device.flush()
    device.pool.put(view)
    return superblock


class Store(StoreReads, StorePlanner, StoreCommitter):
    """An open store. Make one with `await Store.open(device)`; close with `await close()`."""

    def __init__(self, device, superblock, meta_dir, db):
        self.device = device
        self.superblock = superblock
        self.meta_dir = meta_dir
        self.block_size = superblock.block_size_bytes
        assert self.block_size == BLOCK_SIZE_BYTES
        self._data_start = superblock.data_start_bytes
        self._db = db
        self._sync = _sync_write_options()
        self._unsynced = WriteOptions()     # into the memtable only: the journal holds it
        self._unsynced.disable_wal = True
        self._uuid_bytes = uuid_module.UUID(superblock.uuid).bytes
        self._journal = journal.Ring(superblock.journal_bytes, 0) \
            if superblock.journal_bytes else None
        self._record_bytes_max = min(superblock.journal_bytes // 4, DEVICE_IO_BYTES_MAX)
        self._checkpoint = None             # the task of the running or last checkpoint
        # Journal records are written from this buffer (larger ones take a pool buffer).
        self._journal_buffer = device.pool.get(JOURNAL_BUFFER_BYTES) \
            if superblock.journal_bytes else None
        self.checkpoints_total = 0
        self.records_past_journal_total = 0
        self.replayed_records = 0
        self._db_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cairn-store-meta")
        self.allocator = Allocator(superblock.block_count)
        self.sequence = 0
        self.known_crcs_total = 0       # puts that took their block crcs from the caller
        self.built_on_in_flight_total = 0   # plans made on another one's uncommitted record
        # object key -> the latest plan in flight that changes it (osd/store_plan.py)
        self._pending = {}
        self._collection_writers = collections.Counter()
        self._collections = set()            # committed collection names (loaded at open)
        # collection -> [objects, bytes of their sizes, created_ns]: kept in the collection's
        # record, updated in the commit that changes them (after the batch is built).
        self._usage = {}
        self._omap_next = 1                 # the next omap id (persisted with each commit)
        self._omap_persisted = 1
        # object key -> committed ObjectRecord, least recently used first. An OrderedDict, not a
        # dict: evicting a plain dict's first key scans every slot deleted before it, which made
        # each put at 4 KiB cost more the longer a run went.
        self._cache = collections.OrderedDict()
        self._cache_bytes = 0               # what its entries cost (RECORD_ENTRY_BYTES + crcs)
        self.record_cache_limit_bytes = limits.RECORD_CACHE_BYTES_DEFAULT
        self.record_cache_misses_total = 0  # lookups that went to RocksDB
        self.read_cache = ReadCache(limits.READ_CACHE_BYTES_DEFAULT)
        self._commit_queue = []
        self._commit_wanted = asyncio.Event()
        self._committer = None
        self._loop = None                   # set by open()
        self._committing = False            # a group is between its flush and its ack
        self._applying = 0                  # apply() calls between their start and their ack
        self._closing = False
        self._failure = None
        self._read_pins = collections.Counter()     # sequence at read start -> reads running
        self._deferred_frees = collections.deque()  # (sequence, extents)
        self.commits_total = 0
        self.transactions_total = 0
        self.flush_ns_total = 0           # device flushes of the commit groups
        self.meta_commit_ns_total = 0     # building and writing their RocksDB batches

    @classmethod
    async def open(cls, device, meta_dir=None):
        superblock = await read_superblock(device)
        if superblock.device_size_bytes > device.size_bytes:
            raise StoreMismatch(f"{device.path} is {device.size_bytes} bytes but its store was "
                                f"made for {superblock.device_size_bytes}")
        meta_dir = meta_dir or default_meta_dir(device.path, superblock.uuid)
        if not os.path.isdir(meta_dir):
            raise StoreMismatch(f"metadata directory {meta_dir} of {device.path} (uuid "
                                f"{superblock.uuid}) is missing; pass --meta if it moved")
        db = _open_db(meta_dir, create=False)
        identity_raw = db.get(records.KEY_IDENTITY)
        identity = msgpack.unpackb(identity_raw) if identity_raw is not None else {}
        if identity.get("uuid") != superblock.uuid:
            db.close()
            raise StoreMismatch(f"metadata in {meta_dir} belongs to store "
                                f"{identity.get('uuid')}, not to {device.path} "
                                f"({superblock.uuid})")
        store = cls(device, superblock, meta_dir, db)
        if store._journal is not None:
            try:
                device.allocate(0, superblock.data_start_bytes)     # a store made before mkfs did
            except DeviceNoSpace as exc:
                log.warning("%s: could not reserve the journal's room in the device file (%s); "
                            "a commit may fail if its filesystem fills", device.path, exc)
            try:
                await store._replay()
            except BaseException:
                store._put_journal_buffer()
                db.close()
                raise
        store._load()
        # The loop the store runs on, kept: asyncio.get_running_loop() makes a getpid system
        # call on Python 3.11, twice per transaction here (1.8% of a busy OSD's time).
        store._loop = asyncio.get_running_loop()
        store._committer = store._loop.create_task(store._commit_loop())
        return store

    def _load(self):
        (self.sequence,) = struct.unpack(">Q", self._db.get(records.KEY_SEQUENCE))
        raw = self._db.get(records.KEY_OMAP_NEXT)
        self._omap_next = self._omap_persisted = struct.unpack(">Q", raw)[0] if raw else 1
        self._collections = set()
        for key, value in self._iterate(records.PREFIX_COLLECTION):
            name = key[1:].decode()
            self._collections.add(name)
            meta = msgpack.unpackb(value)
            if "objects" not in meta:           # a store made before collections kept usage
                meta["objects"] = meta["bytes"] = 0
                for _, raw in self._iterate(records.object_prefix(name)):
                    meta["objects"] += 1
                    meta["bytes"] += ObjectRecord.decode(raw).size
            self._usage[name] = [meta["objects"], meta["bytes"], meta.get("created_ns", 0)]
        for key, value in self._iterate(records.PREFIX_BITMAP):
            (index,) = struct.unpack(">I", key[1:])
            self.allocator.load_segment(index, value)
        self.allocator.loaded()

    async def close(self):
        """Wait for queued commits, stop the committer and close the metadata store."""
        if self._committer is not None:
            # Bounded: a commit group takes a flush and a RocksDB write; 30 s of waiting means
            # the device hangs, and close() must not hang with it.
            self._closing = True
            for _ in range(30_000):
                idle = not self._applying and not self._commit_queue and not self._committing
                if idle or self._failure is not None:
                    break
                await asyncio.sleep(0.001)
            self._committer.cancel()
            try:
                await self._committer
            except asyncio.CancelledError:
                pass
            self._committer = None
        if self._checkpoint is not None:
            await asyncio.gather(self._checkpoint, return_exceptions=True)
        self._db_thread.shutdown(wait=True)
        if self._journal is not None and self._failure is None:
            self._db.flush()
        self._db.close()
        self._put_journal_buffer()

    def _put_journal_buffer(self):
        if self._journal_buffer is not None:
            self.device.pool.put(self._journal_buffer)
            self._journal_buffer = None

    async def abandon(self):
        """Stop at once without waiting (simulated crash): nothing more reaches RocksDB, and
        with a journal, what RocksDB held only in memory is lost as a crash loses it (its
        durable files are kept as they were; replay at the next open brings the rest back
        from the journal)."""
        self._failure = self._failure or StoreFailed("store abandoned")
        if self._committer is not None:
            self._committer.cancel()
            try:
                await self._committer
            except (asyncio.CancelledError, Exception):
                pass
            self._committer = None
        if self._checkpoint is not None:
            await asyncio.gather(self._checkpoint, return_exceptions=True)
        self._db_thread.shutdown(wait=True)
        self._put_journal_buffer()
        if self._journal is None:
            self._db.close()
            return
        # RocksDB's files as they are, without its memtable (closing, or cancelling its
        # background work, would flush the memtable first), copied once no compaction runs.
        self._db.set_options({"disable_auto_compactions": "true"})
        while self._db.property_int_value("rocksdb.num-running-compactions") or \
                self._db.property_int_value("rocksdb.num-running-flushes"):
            await asyncio.sleep(0.005)
        durable = self.meta_dir.rstrip("/") + ".durable"
        shutil.rmtree(durable, ignore_errors=True)
        shutil.copytree(self.meta_dir, durable)
        self._db.close()
        shutil.rmtree(self.meta_dir)
        os.rename(durable, self.meta_dir)

    # -- reads ------------------------------------------------------------------------------

    def _require_collection(self, collection):
        if collection not in self._collections:
            raise CollectionNotFound(collection)

    def _check_open(self):
        if self._closing:
            raise StoreClosed(f"the store on {self.device.path} is closed")

    def _check_usable(self):
        self._check_open()
        if self._failure is not None:
            raise self._failed_earlier() from self._failure

    def _failed_earlier(self):
        return StoreFailed(f"the store failed earlier and must be remounted: {self._failure}")

    # -- single-operation helpers -------------------------------------------------------------

    async def create_collection(self, collection):
        return await self.apply(Transaction().create_collection(collection))

    async def remove_collection(self, collection):
        return await self.apply(Transaction().remove_collection(collection))

    async def put(self, collection, name, data, attrs=None):
        return await self.apply(Transaction().put(collection, name, data, attrs))

    async def write(self, collection, name, offset, data):
        return await self.apply(Transaction().write(collection, name, offset, data))

    async def delete(self, collection, name):
        return await self.apply(Transaction().delete(collection, name))

    async def set_attrs(self, collection, name, attrs):
        return await self.apply(Transaction().set_attrs(collection, name, attrs))

    # -- transactions -----------------------------------------------------------------------

    async def apply(self, txn, then=None):
        """Apply `txn` atomically and durably; returns its sequence number (the version of
        every object it changed). Raises the errors named in `read()` plus CollectionExists,
        CollectionNotEmpty, NoSpace (nothing changed) and StoreFailed.

        `then()` is called once the transaction is durable, before this returns: the caller's
        own record of what it did (a PG's last_update) is kept there, because the transaction
        runs to its end in a task of its own even when the caller is cancelled (a dropped
        request, a peering stopped by a new map). A cancelled caller must not leave key locks
        half taken, blocks half written, or a change on the device that the daemon does not
        know of (a replica that did not count a write it holds once told the next primary it
        lacked it, and that primary served an older value)."""
        task = self.start_apply(txn, then)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_outcome_unwanted)
            raise

    def start_apply(self, txn, then=None):
        """`apply` without waiting: the task it runs the transaction in (to its end, whoever
        waits), for a caller that is told of the outcome by a done callback instead (a
        replica's write answered without a task of its own, osd/service.py)."""
        self._check_usable()
        if not txn.ops:
            raise InvalidArgument("empty transaction")
        return self._loop.create_task(self._apply_counted(txn, then))

    async def _apply_counted(self, txn, then):
        self._applying += 1
        try:
            sequence = await self._apply(txn)
        finally:
            self._applying -= 1
        if then is not None:
            then()
        return sequence

    async def _apply(self, txn):
        collections_written = set()
        for op in txn.ops:
            kind = type(op)
            if kind is not CreateCollection and kind is not RemoveCollection:
                collections_written.add(op.collection)
                if kind is Rename:
                    collections_written.add(op.target_collection)
        writers = self._collection_writers
        for collection in collections_written:
            writers[collection] += 1
        try:
            try:
                plan = self._prepare(txn, {})
            except _NeedBlocks:
                plan = await self._plan_reading(txn)
            for key in plan.records:
                self._pending[key] = plan
            if plan.after:
                self.built_on_in_flight_total += 1
            try:
                await self._write_data(plan)
                for earlier in plan.after:
                    await self._queued(earlier)
            except BaseException as exc:
                self.allocator.unreserve(plan.allocated + plan.dropped)
                self._plan_ended(plan, exc)
                raise
            finally:
                for view in plan.buffers:
                    self.device.pool.put(view)
            if plan.dropped:
                self.allocator.unreserve(plan.dropped)
            plan.future = self._loop.create_future()
            self._commit_queue.append(plan)
            self._commit_wanted.set()
            self._plan_queued(plan)
            return await plan.future
        finally:
            for collection in collections_written:
                writers[collection] -= 1
                if not writers[collection]:
                    del writers[collection]

    async def _plan_reading(self, txn):
        """`_prepare` for a transaction that needs old blocks (a partial Write): plan, read the
        block the attempt asked for (once the plans it built on wrote their data), plan again
        against the view as it is then. One read pin covers every attempt, so no block read
        for an earlier one is freed and reused meanwhile (each is checked by its crc32c too)."""
        fetched = {}
        pin = self._pin()
        try:
            for _ in range(PLAN_ATTEMPTS_MAX):
                try:
                    return self._prepare(txn, fetched)
                except _NeedBlocks as need:
                    for earlier in need.after:
                        await self._queued(earlier)
                    fetched[need.start] = await self._read_blocks(need.collection, need.name,
                                                                  need.record, need.block, 1)
            raise StoreError(f"the object changed under {PLAN_ATTEMPTS_MAX} attempts to plan a "
                             "partial write of it; retry")
        finally:
            self._unpin(pin)
            for view in fetched.values():
                self.device.pool.put(view)

    async def _queued(self, plan):
        """Wait until the in-flight `plan` is in the commit queue; raise StoreError if it
        failed before (a plan built on it cannot commit)."""
        if plan.queued is None:
            if plan.queued_waiters is None:
                plan.queued_waiters = self._loop.create_future()
            await asyncio.shield(plan.queued_waiters)
        if plan.queued is not True:
            raise StoreError(f"an earlier transaction on the same object failed: "
                             f"{plan.queued!r}")

    def _plan_queued(self, plan):
        plan.queued = True
        if plan.queued_waiters is not None:
            plan.queued_waiters.set_result(None)

    def _plan_ended(self, plan, failure=None):
        """The plan committed (or failed: `failure`): the view of its objects is the committed
        state again, unless a later plan changes them too."""
        if failure is not None and plan.queued is None:
            plan.queued = failure
            if plan.queued_waiters is not None:
                plan.queued_waiters.set_result(None)
        pending = self._pending
        for key in plan.records:
            if pending.get(key) is plan:
                del pending[key]

    # -- the committer ------------------------------------------------------------------------

    def statistics(self):
        return {"sequence": self.sequence, "commits_total": self.commits_total,
                "transactions_total": self.transactions_total,
                "known_crcs_total": self.known_crcs_total,
                "built_on_in_flight_total": self.built_on_in_flight_total,
                "transactions_per_commit": (self.transactions_total / self.commits_total
                                            if self.commits_total else 0.0),
                "flush_ms_avg": (self.flush_ns_total / self.commits_total / 1e6
                                 if self.commits_total else 0.0),
                "meta_commit_ms_avg": (self.meta_commit_ns_total / self.commits_total / 1e6
                                       if self.commits_total else 0.0),
                "journal": None if self._journal is None else {
                    "bytes": self._journal.ring_bytes, "used_bytes": self._journal.used,
                    "checkpoints_total": self.checkpoints_total,
                    "past_journal_total": self.records_past_journal_total,
                    "replayed_records": self.replayed_records},
                "record_cache": {"limit_bytes": self.record_cache_limit_bytes,
                                 "bytes": self._cache_bytes, "records": len(self._cache),
                                 "misses_total": self.record_cache_misses_total},
                "read_cache": {"limit_bytes": self.read_cache.limit_bytes,
                               "bytes": self.read_cache.bytes,
                               "objects": len(self.read_cache),
                               "hits_total": self.read_cache.hits_total},
                "device": self.device.statistics()}


def _outcome_unwanted(task):
    """A transaction whose caller was cancelled: its outcome is logged, not left unretrieved."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a transaction whose caller went away failed: %r", task.exception())
