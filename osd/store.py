"""The OSD's object store: objects on a raw block device, metadata in RocksDB.

Theory of operation (BlueStore's shape, smaller):

1. A transaction (`Transaction`) lists operations on collections and objects. `Store.apply()`
   locks the objects it touches, validates every operation against the committed state plus the
   transaction's own earlier operations, reserves fresh blocks for all new data (copy-on-write:
   nothing committed is ever overwritten in place), and writes the data with its crc32c per
   4 KiB block.
2. Once its writes completed, the transaction joins the commit queue. The committer takes
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

Rules:
- Every store-wide mutation happens in the committer (`_commit_loop`, one task) or under an
  object lock.
- A failed flush or metadata write poisons the store (`StoreFailed`): the on-device state is
  unknown, so the OSD must restart and remount rather than guess.
"""

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import os
import shutil
import stat
import struct
import time
import uuid as uuid_module

import msgpack
import numpy as np
from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from cairn.common import limits
from cairn.common.keylocks import KeyLocks
from cairn.common.limits import (BLOCK_SIZE_BYTES, COMMIT_GROUP_TRANSACTIONS_MAX,
                                 DEVICE_IO_BYTES_MAX, LIST_PAGE_ENTRIES_MAX,
                                 OMAP_PAGE_ENTRIES_MAX)
from cairn.native.bufpool import aligned_copy, is_aligned
from cairn.native.checksum import FOLD_BLOCK_BYTES, block_crcs, range_crc
from cairn.native.errors import DeviceNoSpace
from cairn.osd import journal, records
from cairn.osd.allocator import Allocator
from cairn.osd.errors import (ChecksumError, CollectionExists, CollectionNotEmpty,
                              CollectionNotFound, InvalidArgument, NoSpace, ObjectNotFound,
                              StoreError, StoreExists, StoreMismatch)
from cairn.osd.records import ObjectRecord
from cairn.osd.txn import (CreateCollection, Delete, KeysUpdate, OmapUpdate,  # noqa: F401
                           Put, RemoveCollection, Rename, SetAttrs, Transaction, Write)
from cairn.osd.superblock import SUPERBLOCK_BYTES, Superblock

log = logging.getLogger("cairn.osd")

META_ROOT_DEFAULT = "/var/lib/cairn"

# Decoded object records kept in memory (BlueStore's onode cache), bounded in bytes
# (limits.RECORD_CACHE_BYTES_DEFAULT): each entry is costed at RECORD_ENTRY_BYTES (the decoded
# record with its attrs, its key and the cache's node: 775 bytes for a 4 KiB object, measured
# with tracemalloc) plus its crcs (4 bytes a block: 16 KiB for a 16 MiB object). It was 16,384
# entries whatever their size: a 4 KiB write run of more objects than that, read back in order,
# missed on every get (each read evicted the record the next read wanted).
RECORD_ENTRY_BYTES = 1024
# Small objects' bytes kept after a read (BlueStore's buffered reads, on by default there:
# `bluestore_default_buffered_read`), so an object read again is answered from memory. Filled
# by reads only, never by writes; every commit that touches a key drops its entry, and an
# entry is used only for the record version it was read at. Bounded in bytes (the OSD's
# --read-cache, READ_CACHE_BYTES_DEFAULT; 0: none); objects up to READ_CACHE_OBJECT_BYTES_MAX
# (both in common/limits.py).
_UNCACHED = object()       # a record cache miss (None in the cache: known absent)
# A store with a journal makes RocksDB durable (a checkpoint) when the ring is half used, and
# after this long without a commit, so replay after a crash stays short and read-only readers
# of the metadata (cairn-osd bitrot) see recent objects.
JOURNAL_IDLE_CHECKPOINT_S = 5.0
# The buffer journal records are written from (larger ones take a pool buffer).
JOURNAL_BUFFER_BYTES = 64 << 10


class StoreFailed(StoreError):
    """A device flush or metadata commit failed: the store refuses further work until it is
    remounted."""


class StoreClosed(StoreError):
    """The store is closing or closed: open it again to use it."""


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


@dataclasses.dataclass(frozen=True)
class ObjectStat:
    name: str
    size: int
    version: int
    mtime_ns: int
    attrs: dict
    omap: bool = False            # the object has an omap (maybe empty)


class ReadCache:
    """Whole small objects' bytes (and crc32c) by object key, each for the record version it
    was read at, least recently used first, within `limit_bytes`."""

    def __init__(self, limit_bytes):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self.hits_total = 0
        self._entries = collections.OrderedDict()      # key -> (version, data, crc)

    def __len__(self):
        return len(self._entries)

    def get(self, key, version):
        """(data, crc) of `key` at `version`, or None."""
        entry = self._entries.get(key)
        if entry is None or entry[0] != version:
            return None
        self._entries.move_to_end(key)
        self.hits_total += 1
        return entry[1], entry[2]

    def put(self, key, version, data, crc):
        if len(data) > self.limit_bytes:
            return
        self.drop(key)
        self._entries[key] = (version, data, crc)
        self.bytes += len(data)
        while self.bytes > self.limit_bytes:
            self.bytes -= len(self._entries.popitem(last=False)[1][1])

    def drop(self, key):
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(entry[1])


class PendingRead:
    """A read `Store.begin_read` started, and what `finish_read` needs to check and cut its
    result (the store is pinned until then). `done` once its one device read has completed
    (`error`: what it failed with, else None); set `then` (no arguments) before that to be
    called at that moment, from the device's completion handling. `cached`: the object's
    (bytes, crc) from the read cache instead (no device read, no pin, no buffer; done at
    once)."""

    __slots__ = ("collection", "name", "record", "view", "pin", "first", "count", "start",
                 "length", "cached", "done", "error", "then")

    def __init__(self, collection, name, record, view, first, count, start, length,
                 cached=None):
        self.cached = cached
        self.collection = collection
        self.name = name
        self.record = record
        self.view = view
        self.pin = None                 # the store's pin, taken once the read is submitted
        self.first = first
        self.count = count
        self.start = start
        self.length = length
        self.done = cached is not None
        self.error = None
        self.then = None

    def completed(self, error):
        """The device read's callback."""
        self.error = error
        self.done = True
        then, self.then = self.then, None
        if then is not None:
            then()


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


class Store:
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
        self._object_locks = KeyLocks()  # by object key
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

    def _iterate(self, prefix, start=None):
        """(key, value) pairs whose key starts with `prefix`, from `start` on, in key order."""
        iterator = self._db.iter()
        iterator.seek(start if start is not None else prefix)
        while iterator.valid():
            key = iterator.key()
            if not key.startswith(prefix):
                break
            yield key, iterator.value()
            iterator.next()

    def _record(self, collection, name):
        """The committed record of an object, or None; through the record cache.

        The cache holds decoded records of committed state only, absence too (None: a new
        object's put looks its key up on the primary and again in the store; RocksDB answers a
        key it does not hold only after its filters): `_finish_group` replaces or
        drops the entries of every key it commits, right after the RocksDB write and before
        anything else runs on the loop, so a lookup can never see a stale entry. (A lookup
        racing the write in the metadata thread may cache the old record, which the commit's
        update then overwrites.)"""
        return self._record_at(records.object_key(collection, name))

    def _record_at(self, key):
        """`_record` of an object key."""
        record = self._cache.get(key, _UNCACHED)
        if record is not _UNCACHED:
            self._cache.move_to_end(key)
            return record
        self.record_cache_misses_total += 1
        raw = self._db.get(key)
        record = ObjectRecord.decode(raw) if raw is not None else None
        self._cache_put(key, record)
        return record

    def _cache_put(self, key, record):
        cache = self._cache
        old = cache.pop(key, _UNCACHED)
        if old is not _UNCACHED:
            self._cache_bytes -= _cached_bytes(old)
        cache[key] = record
        self._cache_bytes += _cached_bytes(record)
        while self._cache_bytes > self.record_cache_limit_bytes and cache:
            self._cache_bytes -= _cached_bytes(cache.popitem(last=False)[1])

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

    async def read(self, collection, name, offset=0, length=None):
        """Read an object whole or by range; returns a memoryview (of a pool buffer: hand it
        back with `device.pool.put()` when done, or just drop it).

        Raises ObjectNotFound, CollectionNotFound, InvalidArgument (bad range), ChecksumError
        (the stored bytes fail their crc32c; they are never returned), and device errors."""
        return (await self._read(collection, name, offset, length))[1]

    async def read_with_stat(self, collection, name, offset=0, length=None, copy_below=0):
        """(ObjectStat, data) from one lookup of the object's record: `read()`'s view, or,
        for an object smaller than `copy_below` bytes, its bytes (the buffer handed back at
        once). What a get needs: the stat for its reply, the data to send."""
        record, view = await self._read(collection, name, offset, length)
        stat = _stat_of(name, record)
        return stat, (view if record.size >= copy_below else self._copied(view))

    async def _read(self, collection, name, offset, length):
        """(record, view) of `read()`."""
        self._check_usable()
        # An existing collection's name was checked when it was created.
        if type(collection) is not str or collection not in self._collections:
            records.check_collection_name(collection)
        records.check_object_name(name)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidArgument(f"bad range: offset {offset}, length {length}")
        pin = self._pin()
        try:
            record = self._record(collection, name)
            if record is None:
                self._require_collection(collection)
                raise ObjectNotFound(collection, name)
            end, first, count = self._span(record, offset, length)
            if count <= 0:
                return record, memoryview(b"")
            view = await self._read_blocks(collection, name, record, first, count)
            start = offset - first * self.block_size
            return record, view[start:start + end - offset]
        finally:
            self._unpin(pin)

    def _span(self, record, offset, length):
        """(end, first block, block count) of a read of `record` from `offset`; a count of 0
        or less: the range holds no byte."""
        end = record.size if length is None else min(record.size, offset + length)
        if offset >= end:
            return end, 0, 0
        first = offset // self.block_size
        return end, first, -(-end // self.block_size) - first

    def begin_read(self, collection, name, offset=0, length=None):
        """The first half of `read_with_stat` without a coroutine, for a get answered from
        callbacks (osd/service.py `fast_get`): a PendingRead, `done` when its one device read
        has (its `then` is called; then `finish_read`), or None when the read is not that
        simple (an object or collection that is not there, a store that failed, an empty
        range, an object in several pieces, a device without `submit_read`): the caller then
        reads the usual way, which also gives the error. A device that refuses the submission
        raises its DeviceError."""
        submit = self.device.submit_read
        if submit is None or self._closing or self._failure is not None or \
                collection not in self._collections or offset < 0 or \
                (length is not None and length < 0):
            return None
        key = records.object_key(collection, name)
        record = self._record_at(key)
        if record is None:
            return None
        end, first, count = self._span(record, offset, length)
        if count <= 0:
            return None
        if record.size <= limits.READ_CACHE_OBJECT_BYTES_MAX:
            cached = self.read_cache.get(key, record.version)
            if cached is not None:
                return PendingRead(collection, name, record, None, first, count, offset,
                                   end - offset, cached)
        pieces = records.slice_extents(record.extents, first, count)
        if len(pieces) != 1 or count * self.block_size > DEVICE_IO_BYTES_MAX:
            return None
        view = self.device.pool.get(count * self.block_size)
        pending = PendingRead(collection, name, record, view, first, count,
                              offset - first * self.block_size, end - offset)
        try:
            submit(self._data_start + pieces[0][0] * self.block_size, view, pending.completed)
        except BaseException:
            self.device.pool.put(view)
            raise
        pending.pin = self._pin()
        return pending

    def abandon_read(self, pending):
        """Give up a PendingRead (its data unwanted): the buffer and the pin go back once its
        device read is done."""
        if pending.cached is not None:
            return
        if pending.done:
            self._forget_read(pending)
        else:
            pending.then = lambda: self._forget_read(pending)

    def _forget_read(self, pending):
        self.device.pool.put(pending.view)
        self._unpin(pending.pin)

    def finish_read(self, pending, copy_below=0):
        """(data, its crc32c) of a PendingRead that is `done`: the data as
        `read_with_stat` gives it (its record is `pending.record`), the crc folded from the
        block crcs just checked (`checksum.range_crc`: the bytes are not read again; None where
        the store's blocks are not the fold's size). Raises what that read would
        (ChecksumError, device errors). A small object read whole is kept in the read cache."""
        if pending.cached is not None:
            data, data_crc = pending.cached
            if pending.start or pending.length != len(data):
                data = data[pending.start:pending.start + pending.length]
                data_crc = None
            return data, data_crc
        view = pending.view
        try:
            try:
                if pending.error is not None:
                    raise pending.error
                self._verify(pending.collection, pending.name, pending.record, pending.first,
                             pending.count, view)
            except BaseException:
                self.device.pool.put(view)
                raise
        finally:
            self._unpin(pending.pin)
        data_crc = None
        if self.block_size == FOLD_BLOCK_BYTES:
            data_crc = range_crc(
                view, pending.record.crcs[pending.first * 4:(pending.first + pending.count) * 4],
                pending.start, pending.length)
        view = view[pending.start:pending.start + pending.length]
        record = pending.record
        if record.size >= copy_below:
            return view, data_crc
        data = self._copied(view)
        if pending.start == 0 and pending.length == record.size and \
                record.size <= limits.READ_CACHE_OBJECT_BYTES_MAX and data_crc is not None:
            self.read_cache.put(records.object_key(pending.collection, pending.name),
                                record.version, data, data_crc)
        return data, data_crc

    async def read_bytes(self, collection, name, offset=0, length=None):
        """`read()` copied into bytes, the buffer handed back to the pool."""
        return self._copied(await self.read(collection, name, offset, length))

    def _copied(self, view):
        """A read's view as bytes, its buffer handed back to the pool."""
        try:
            return bytes(view)
        finally:
            if view.obj is not None:
                self.device.pool.put(view)

    async def _read_blocks(self, collection, name, record, first, count, staged=None):
        """Read logical blocks [first, first + count) of `record` and verify their crc32c.
        `staged` (single blocks only) supplies blocks this transaction wrote itself."""
        assert staged is None or count == 1
        view = self.device.pool.get(count * self.block_size)
        try:
            pieces = records.slice_extents(record.extents, first, count)
            if staged is None and len(pieces) == 1 and len(view) <= DEVICE_IO_BYTES_MAX:
                # The common case, one device read (every small object): no per-chunk planning.
                await self.device.read_into(self._data_start + pieces[0][0] * self.block_size,
                                            view)
            else:
                await self._read_pieces(view, pieces, staged)
            self._verify(collection, name, record, first, count, view)
        except BaseException:
            self.device.pool.put(view)
            raise
        return view

    def _verify(self, collection, name, record, first, count, view):
        """ChecksumError unless `view` (logical blocks [first, first + count) of `record`, just
        read) matches the record's crc32c of each block."""
        actual = block_crcs(view, self.block_size)
        expected = record.crcs[first * 4:(first + count) * 4]
        if actual != expected:
            actual_array = np.frombuffer(actual, dtype="<u4")
            expected_array = np.frombuffer(expected, dtype="<u4")
            index = int(np.flatnonzero(actual_array != expected_array)[0])
            raise ChecksumError(collection, name, (first + index) * self.block_size,
                                int(expected_array[index]), int(actual_array[index]))

    async def _read_pieces(self, view, pieces, staged):
        """Fill `view` from device extents `pieces`, in chunks of at most DEVICE_IO_BYTES_MAX,
        taking blocks this transaction staged from memory."""
        reads = []
        position = 0
        for start, length in pieces:
            for chunk_start, chunk_length in _chunks(start, length, self.block_size):
                target = view[position:position + chunk_length * self.block_size]
                source = _staged_bytes(staged, chunk_start, chunk_length, self.block_size)
                if source is not None:
                    target[:] = source
                else:
                    reads.append(self.device.read_into(
                        self._data_start + chunk_start * self.block_size, target))
                position += chunk_length * self.block_size
        if len(reads) == 1:
            await reads[0]
        elif reads:
            await _gather_all(reads)

    def stat(self, collection, name):
        self._check_open()
        return _stat_of(name, self._existing(collection, name))

    def size_of(self, collection, name):
        """The committed size of an object, or None if there is none (no checks, no copies:
        what a read reserves reply room by)."""
        if self._closing or type(name) is not str or type(collection) is not str:
            return None
        try:
            record = self._record(collection, name)
        except UnicodeError:            # a name no object can have (the read then says why)
            return None
        return record.size if record is not None else None

    def omap_get(self, collection, name, keys):
        """{key: value} of those `keys` the object's omap holds (committed state)."""
        self._check_open()
        omap_id = self._omap_id(collection, name)
        found = {}
        if omap_id:
            for key in keys:
                records.check_omap_key(key)
                value = self._db.get(records.omap_key(omap_id, bytes(key)))
                if value is not None:
                    found[bytes(key)] = value
        return found

    def omap_list(self, collection, name, start_after=None, prefix=b"", limit=1000,
                  max_bytes=None):
        """([(key, value)] in key order, more): the object's omap entries starting with
        `prefix`, after `start_after`, at most `limit` of them and (when given) about
        `max_bytes` of keys and values (at least one entry). `more`: a later page has some."""
        self._check_open()
        _check_page_limit("omap list", limit, OMAP_PAGE_ENTRIES_MAX)
        omap_id = self._omap_id(collection, name)
        if not omap_id:
            return [], False
        return self._page(records.omap_prefix(omap_id), prefix, start_after, limit, max_bytes)

    def _page(self, base, prefix, start_after, limit, max_bytes=None):
        """([(key without `base`, value)] in key order, more) of the keys under `base` that
        start with `prefix`, after `start_after`: at most `limit`, and (when given) about
        `max_bytes` of keys and values (at least one entry)."""
        start = base + bytes(prefix)
        if start_after is not None:
            start = max(start, base + bytes(start_after) + b"\x00")
        entries, size = [], 0
        for key, value in self._iterate(base + bytes(prefix), start):
            if len(entries) == limit or (max_bytes is not None and entries
                                         and size + len(key) + len(value) > max_bytes):
                return entries, True
            entries.append((key[len(base):], value))
            size += len(key) - len(base) + len(value)
        return entries, False

    def keys_get(self, collection, key):
        """The value of `key` in `collection`'s key table (committed state), or None."""
        self._check_open()
        records.check_collection_name(collection)
        records.check_omap_key(key)
        self._require_collection(collection)
        return self._db.get(records.keys_prefix(collection) + bytes(key))

    def keys_list(self, collection, start_after=None, limit=1000):
        """([(key, value)] in key order, more) of `collection`'s key table after
        `start_after`, at most `limit` entries; `more`: a later page has some."""
        self._check_listable(collection, "key list", limit, OMAP_PAGE_ENTRIES_MAX)
        return self._page(records.keys_prefix(collection), b"", start_after, limit)

    def _check_listable(self, collection, what, limit, limit_max):
        self._check_open()
        records.check_collection_name(collection)
        self._require_collection(collection)
        _check_page_limit(what, limit, limit_max)

    def _omap_id(self, collection, name):
        return self._existing(collection, name).omap_id

    def _existing(self, collection, name):
        """The committed record of an object that must exist (names checked)."""
        records.check_collection_name(collection)
        records.check_object_name(name)
        record = self._record(collection, name)
        if record is None:
            self._require_collection(collection)
            raise ObjectNotFound(collection, name)
        return record

    def list_objects(self, collection, prefix="", start_after=None, limit=1000):
        """Names in `collection` starting with `prefix`, in name order, after `start_after`.

        Returns (names, next_start_after): pass the second back to get the next page; it is
        None on the last page."""
        self._check_listable(collection, "list", limit, LIST_PAGE_ENTRIES_MAX)
        key_prefix = records.object_prefix(collection, prefix)
        name_offset = len(records.object_prefix(collection))
        start = None
        if start_after is not None:
            start = records.object_key(collection, start_after) + b"\x00"
        names = []
        for key, _ in self._iterate(key_prefix, max(start or key_prefix, key_prefix)):
            if len(names) == limit:
                return names, names[-1]
            names.append(key[name_offset:].decode())
        return names, None

    def count_objects(self, collection):
        """How many objects `collection` holds (a scan of its metadata keys)."""
        self._check_open()
        records.check_collection_name(collection)
        self._require_collection(collection)
        return sum(1 for _ in self._iterate(records.object_prefix(collection)))

    def list_collections(self):
        return sorted(self._collections)

    def has_collection(self, collection):
        """True once a transaction creating `collection` has committed."""
        return collection in self._collections

    def usage(self, collection):
        """(objects, bytes: the sum of their sizes) of a committed collection; (0, 0) if there
        is none. Counted by each commit, so it costs nothing to ask."""
        usage = self._usage.get(collection)
        return (usage[0], usage[1]) if usage is not None else (0, 0)

    def statfs(self):
        allocator = self.allocator
        return {"total_bytes": allocator.block_count * self.block_size,
                "used_bytes": allocator.committed_count * self.block_size,
                "free_bytes": allocator.free_count * self.block_size,
                "sequence": self.sequence}

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
        keys, collections_written = set(), set()
        for op in txn.ops:
            kind = type(op)
            if kind is CreateCollection or kind is RemoveCollection:
                continue
            collections_written.add(op.collection)
            if kind is KeysUpdate:
                continue                    # no object: nothing to lock
            keys.add(records.object_key(op.collection, op.name))
            if kind is Rename:
                keys.add(records.object_key(op.target_collection, op.target_name))
                collections_written.add(op.target_collection)
        keys = sorted(keys)
        await self._lock(keys)
        writers = self._collection_writers
        for collection in collections_written:
            writers[collection] += 1
        try:
            plan = await self._prepare(txn)
            try:
                await self._write_data(plan)
            except BaseException:
                self.allocator.unreserve(plan.allocated + plan.dropped)
                raise
            finally:
                for view in plan.buffers:
                    self.device.pool.put(view)
            if plan.dropped:
                self.allocator.unreserve(plan.dropped)
            plan.future = self._loop.create_future()
            self._commit_queue.append(plan)
            self._commit_wanted.set()
            return await plan.future
        finally:
            for collection in collections_written:
                writers[collection] -= 1
                if not writers[collection]:
                    del writers[collection]
            self._unlock(keys)

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
        own_blocks = _blocks(plan.allocated)
        for start, length in extents:
            for run_start, run_length, own in _runs(start, length, own_blocks):
                if own:
                    plan.dropped.append((run_start, run_length))
                    _remove_blocks(plan.allocated, run_start, run_length)
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
            for chunk_start, chunk_length in _chunks(start, length, self.block_size):
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
        await _gather_all([self.device.write(offset, view) for offset, view in plan.writes])

    # -- the committer ------------------------------------------------------------------------

    async def _commit_loop(self):
        """Runs for the store's lifetime, until cancelled by close() or abandon()."""
        if self._journal is None:
            await self._commit_loop_synced()
        else:
            await self._commit_loop_journaled()

    async def _commit_loop_journaled(self):
        """One group at a time: the group's journal record is written (its data already is),
        one device flush makes both durable, RocksDB takes the batch without its WAL, and the
        group is acknowledged. The next group's record is written only after that flush
        completed, which replay relies on (osd/journal.py). A checkpoint starts when the ring is
        half used, and after JOURNAL_IDLE_CHECKPOINT_S without commits."""
        while True:
            if not self._commit_queue:
                try:
                    async with asyncio.timeout(JOURNAL_IDLE_CHECKPOINT_S if self._journal.used
                                               else None):
                        await self._commit_wanted.wait()
                except TimeoutError:
                    self._start_checkpoint()
                    continue
                self._commit_wanted.clear()
                continue
            # One loop turn first: transactions that the same burst of messages started join
            # this group instead of the next (measured in a 3-OSD cluster at 16 4 KiB writes in
            # flight: 3.9 to 4.5 transactions per group).
            await asyncio.sleep(0)
            group = self._commit_queue[:COMMIT_GROUP_TRANSACTIONS_MAX]
            del self._commit_queue[:len(group)]
            self._committing = True
            try:
                await self._commit_journaled(group)
            finally:
                self._committing = False

    async def _commit_journaled(self, group):
        if self._refused_after_failure(group):
            return
        began_ns = time.perf_counter_ns()
        try:
            ops, sequence = self._group_ops(group)
            payload = journal.encode_payload(ops)
            if journal.padded_length(len(payload)) > self._record_bytes_max:
                # Too big for the ring (a group of large omap pages): made durable the way a
                # store without a journal does, after a checkpoint of everything before it.
                await self.device.flush()
                flushed_ns = time.perf_counter_ns()
                await asyncio.get_running_loop().run_in_executor(
                    self._db_thread, self._write_past_journal, _batch(ops, self._journal.head))
                self._journal.tail = self._journal.head
                self.records_past_journal_total += 1
            else:
                head = await self._write_record(sequence - len(group) + 1, sequence, payload)
                await self.device.flush()
                flushed_ns = time.perf_counter_ns()
                self._db.write(_batch(ops, head), self._unsynced)
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.flush_ns_total += flushed_ns - began_ns
        self.meta_commit_ns_total += time.perf_counter_ns() - flushed_ns
        self._publish(group, sequence)
        if 2 * self._journal.used >= self._journal.ring_bytes:
            self._start_checkpoint()

    def _write_past_journal(self, batch):
        self._db.flush()
        self._db.write(batch, self._sync)

    async def _write_record(self, first, last, payload):
        """Write one group's record at the ring's head (after a wrap marker when it does not
        fit before the ring's end), waiting for a checkpoint when the ring is full; returns
        the new head."""
        length = journal.padded_length(len(payload))
        while (placed := self._journal.place(length)) is None:
            await asyncio.shield(self._start_checkpoint())
            if self._failure is not None:
                raise self._failed_earlier()
        position, skip = placed
        if skip:
            await self._write_journal_bytes(self._journal.head, journal.encode(
                journal.KIND_WRAP, self._uuid_bytes, self._journal.head, first, first))
        await self._write_journal_bytes(position, journal.encode(
            journal.KIND_GROUP, self._uuid_bytes, position, first, last, payload))
        self._journal.head = position + length
        return self._journal.head

    async def _write_journal_bytes(self, position, data):
        """Write `data` (whole blocks) at ring `position`, from the store's own journal buffer
        when it fits (one aligned buffer kept for the store's life), else from a pool one."""
        own = len(data) <= len(self._journal_buffer)
        view = self._journal_buffer[:len(data)] if own else self.device.pool.get(len(data))
        try:
            view[:] = data
            await self.device.write(self.superblock.journal_start_bytes +
                                    position % self._journal.ring_bytes, view)
        finally:
            if not own:
                self.device.pool.put(view)

    def _start_checkpoint(self):
        """Make RocksDB's state durable (a memtable flush in the metadata thread), after which
        the ring up to today's head is free; returns the task doing it (one at a time)."""
        if self._checkpoint is None or self._checkpoint.done():
            self._checkpoint = asyncio.get_running_loop().create_task(
                self._run_checkpoint(self._journal.head))
        return self._checkpoint

    async def _run_checkpoint(self, head):
        try:
            await asyncio.get_running_loop().run_in_executor(self._db_thread, self._db.flush)
        except Exception as exc:
            log.error("store checkpoint (RocksDB flush) failed: %s", exc)
            self._failure = self._failure or exc
            return
        self._journal.tail = max(self._journal.tail, head)
        self.checkpoints_total += 1

    async def _replay(self):
        """Apply the journal's records that RocksDB's durable state does not hold yet (see
        osd/journal.py), then make them durable in RocksDB."""
        sequence, start = records.durable_point(self._db)
        ring_bytes = self._journal.ring_bytes
        first = await self.device.read(self.superblock.journal_start_bytes +
                                       start % ring_bytes, self.block_size)
        try:
            anything = journal.starts(first, start, sequence + 1, self._uuid_bytes)
        finally:
            self.device.pool.put(first)
        if not anything:        # a clean close, or a checkpoint after the last commit
            self._journal.head = self._journal.tail = start
            return
        region = bytearray(ring_bytes)
        for offset in range(0, ring_bytes, DEVICE_IO_BYTES_MAX):
            length = min(DEVICE_IO_BYTES_MAX, ring_bytes - offset)
            view = await self.device.read(self.superblock.journal_start_bytes + offset, length)
            region[offset:offset + length] = view
            self.device.pool.put(view)
        found = journal.scan(region, ring_bytes, start, sequence + 1, self._uuid_bytes)
        if found and not await self._data_durable(found[-1]):
            dropped = found.pop()
            log.warning("store: the last journal record (sequences %d-%d) references data "
                        "that did not reach the device; it was never acknowledged and is "
                        "dropped", dropped.first, dropped.last)
        for record in found:
            self._db.write(_batch(record.ops, record.end), self._unsynced)
        if found:
            self._db.flush()
            log.info("store: replayed %d journal records (sequences %d-%d)", len(found),
                     found[0].first, found[-1].last)
        self._journal.head = self._journal.tail = found[-1].end if found else start
        self.replayed_records = len(found)

    async def _data_durable(self, record):
        """Whether every object the journal record writes has its blocks on the device."""
        for op in record.ops:
            if op[0] != journal.PUT or not op[1].startswith(records.PREFIX_OBJECT):
                continue
            object_record = ObjectRecord.decode(op[2])
            if not object_record.block_count:
                continue
            collection, _, name = op[1][len(records.PREFIX_OBJECT):].partition(b"\x00")
            try:
                view = await self._read_blocks(collection.decode(), name.decode(),
                                               object_record, 0, object_record.block_count)
            except ChecksumError:
                return False
            self.device.pool.put(view)
        return True

    async def _commit_loop_synced(self):
        """The commit loop of a store without a journal (format 1, or a tiny device).

        Two groups overlap: while group N's metadata write runs in the metadata thread, group
        N+1's device flush runs in the kernel. Everything else stays in order: N is acknowledged
        before N+1's metadata batch is even built, so sequences, the allocator and RocksDB see
        groups one at a time, and the metadata thread never holds two writes."""
        writing = None          # (group, sequence, write future, flush timings) of group N
        try:
            while True:
                if not self._commit_queue:
                    if writing is not None:
                        group_n, writing = writing, None
                        await self._finish_group(*group_n)
                        self._committing = False
                        continue
                    await self._commit_wanted.wait()
                    self._commit_wanted.clear()
                    continue
                group = self._commit_queue[:COMMIT_GROUP_TRANSACTIONS_MAX]
                del self._commit_queue[:len(group)]
                self._committing = True
                timings = await self._flush_group(group)
                if writing is not None:
                    group_n, writing = writing, None
                    await self._finish_group(*group_n)
                if timings is not None:
                    writing = self._start_group_write(group, timings)
                self._committing = writing is not None
        except BaseException:
            if writing is not None:
                self._fail_group(writing[0], StoreFailed(
                    "the store stopped before this commit was confirmed"))
            raise

    def _refused_after_failure(self, group):
        """After the store failed, a group is refused whole (its reservations returned)."""
        if self._failure is None:
            return False
        for plan in group:
            self.allocator.unreserve(plan.allocated)
        self._fail_group(group, self._failed_earlier())
        return True

    def _fail_group(self, group, error):
        for plan in group:
            if not plan.future.done():
                plan.future.set_exception(error)

    def _poison(self, group, exc):
        # The device or RocksDB failed mid-commit: what is durable is unknown, and the in-memory
        # allocator may be ahead of it. Poison the store (STYLE.md 2.5).
        self._failure = self._failure or exc
        self._fail_group(group, StoreFailed(f"commit failed, the store must be remounted: {exc}"))

    async def _flush_group(self, group):
        """Make the group's data durable; returns (start, end) in perf_counter ns, or None if
        the group failed (its futures then hold the error)."""
        if self._refused_after_failure(group):
            return None
        began_ns = time.perf_counter_ns()
        try:
            await self.device.flush()
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return None
        return began_ns, time.perf_counter_ns()

    def _start_group_write(self, group, timings):
        """Build the group's metadata batch and hand it to the metadata thread (a store without
        a journal); returns what `_finish_group` needs, or None if the group failed."""
        if self._failure is not None:
            self._fail_group(group, self._failed_earlier())
            return None
        try:
            ops, sequence = self._group_ops(group)
            write = asyncio.get_running_loop().run_in_executor(
                self._db_thread, self._db.write, _batch(ops), self._sync)
        except Exception as exc:
            self._poison(group, exc)
            return None
        return group, sequence, write, timings

    def _group_ops(self, group):
        """The group's metadata changes as journal ops (osd/journal.py), and its last sequence.
        Numbers the group's transactions and commits their blocks in the allocator."""
        ops = []
        dirty = set()
        sequence = self.sequence
        now_ns = time.time_ns()
        changed = set()
        for plan in group:
            sequence += 1
            plan.sequence = sequence
            for key, created in plan.collections.items():
                name = key[len(records.PREFIX_COLLECTION):].decode()
                if created:
                    self._usage[name] = [0, 0, now_ns]
                    changed.add(name)
                else:
                    self._usage.pop(name, None)
                    changed.discard(name)
                    ops.append((journal.DELETE, key))
            for key, (collection, old) in plan.before.items():
                new = plan.records.get(key, old)    # a rename onto itself changes nothing
                usage = self._usage.get(collection)
                if usage is not None and new is not old:
                    usage[0] += (new is not None) - (old is not None)
                    usage[1] += (new.size if new is not None else 0) - \
                        (old.size if old is not None else 0)
                    changed.add(collection)
            for change in plan.omap:
                if change[0] == "put":
                    ops.append((journal.PUT, change[1], change[2]))
                elif change[0] == "delete":
                    ops.append((journal.DELETE, change[1]))
                else:
                    ops.append((journal.DELETE_RANGE, change[1], change[2]))
            for key, record in plan.records.items():
                if record is None:
                    ops.append((journal.DELETE, key))
                else:
                    record.version = sequence       # a fresh record of this plan
                    ops.append((journal.PUT, key, record.encode()))
            dirty |= self.allocator.commit(plan.allocated, plan.freed)
        for name in changed:
            objects, size, created_ns = self._usage[name]
            ops.append((journal.PUT, records.collection_key(name), msgpack.packb(
                {"created_ns": created_ns, "objects": objects, "bytes": size})))
        for index in sorted(dirty):
            ops.append((journal.PUT, records.bitmap_key(index),
                        self.allocator.segment_bytes(index)))
        ops.append((journal.PUT, records.KEY_SEQUENCE, struct.pack(">Q", sequence)))
        if self._omap_next != self._omap_persisted:
            # Ids handed out by transactions not yet committed are covered too: an id is
            # never reused, whatever happens to the transaction that took it.
            self._omap_persisted = self._omap_next
            ops.append((journal.PUT, records.KEY_OMAP_NEXT, struct.pack(">Q", self._omap_next)))
        return ops, sequence

    async def _finish_group(self, group, sequence, write, timings):
        """Wait for the group's metadata write, then publish it and acknowledge its
        transactions."""
        try:
            await write
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        began_ns, flushed_ns = timings
        self.flush_ns_total += flushed_ns - began_ns
        self.meta_commit_ns_total += time.perf_counter_ns() - flushed_ns
        self._publish(group, sequence)

    def _publish(self, group, sequence):
        """The group is durable: make it the committed state and acknowledge it."""
        self.sequence = sequence
        for plan in group:
            for key, record in plan.records.items():
                self._cache_put(key, record)      # None: known absent
                self.read_cache.drop(key)
            for key, created in plan.collections.items():
                name = key[len(records.PREFIX_COLLECTION):].decode()
                if created:
                    self._collections.add(name)
                else:
                    self._collections.discard(name)
        self.commits_total += 1
        self.transactions_total += len(group)
        for plan in group:
            if plan.freed:
                self._deferred_frees.append((plan.sequence, plan.freed))
        self._release_frees()
        for plan in group:
            if not plan.future.done():
                plan.future.set_result(plan.sequence)

    def _pin(self):
        self._read_pins[self.sequence] += 1
        return self.sequence

    def _unpin(self, pin):
        self._read_pins[pin] -= 1
        if self._read_pins[pin] == 0:
            del self._read_pins[pin]
        self._release_frees()

    def _release_frees(self):
        if not self._deferred_frees:
            return
        oldest = min(self._read_pins) if self._read_pins else None
        while self._deferred_frees:
            sequence, extents = self._deferred_frees[0]
            if oldest is not None and oldest < sequence:
                break
            self._deferred_frees.popleft()
            self.allocator.release(extents)

    def statistics(self):
        return {"sequence": self.sequence, "commits_total": self.commits_total,
                "transactions_total": self.transactions_total,
                "known_crcs_total": self.known_crcs_total,
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


def _check_page_limit(what, limit, limit_max):
    if not 1 <= limit <= limit_max:
        raise InvalidArgument(f"{what} limit must be within 1..{limit_max} (was {limit})")


def _cached_bytes(record):
    """What a record cache entry is counted as (None: a key known absent)."""
    return RECORD_ENTRY_BYTES + (len(record.crcs) if record is not None else 0)


def _stat_of(name, record):
    """What `stat` tells of a committed record (its attrs copied: the record is the cache's)."""
    return ObjectStat(name=name, size=record.size, version=record.version,
                      mtime_ns=record.mtime_ns, attrs=dict(record.attrs),
                      omap=record.omap_id != 0)


def _batch(ops, journal_at=None):
    """A RocksDB write batch of journal ops (osd/journal.py); `journal_at`: the ring position
    replay starts from once this batch is durable (records.KEY_JOURNAL)."""
    batch = WriteBatch(raw_mode=True)
    if journal_at is not None:
        batch.put(records.KEY_JOURNAL, struct.pack(">Q", journal_at))
    for op in ops:
        if op[0] == journal.PUT:
            batch.put(op[1], op[2])
        elif op[0] == journal.DELETE:
            batch.delete(op[1])
        else:
            batch.delete_range(op[1], op[2])
    return batch


def _chunks(start, length, block_size):
    """Split an extent into pieces of at most DEVICE_IO_BYTES_MAX."""
    per_io = DEVICE_IO_BYTES_MAX // block_size
    while length > 0:
        take = min(length, per_io)
        yield start, take
        start += take
        length -= take


def _staged_bytes(staged, first, count, block_size):
    """The new bytes of device blocks [first, first + count) if this transaction wrote them
    (they lie inside one staged extent), else None."""
    if not staged:
        return None
    for start, (length, view) in staged.items():
        if start <= first and first + count <= start + length:
            offset = (first - start) * block_size
            return view[offset:offset + count * block_size]
    return None


def _runs(start, length, own_blocks):
    """Split extent [start, start + length) into runs by membership in `own_blocks`:
    yields (run_start, run_length, is_own)."""
    run_start = start
    run_own = start in own_blocks
    for block in range(start + 1, start + length):
        is_own = block in own_blocks
        if is_own != run_own:
            yield run_start, block - run_start, run_own
            run_start, run_own = block, is_own
    yield run_start, start + length - run_start, run_own


def _blocks(extents):
    return {block for start, length in extents for block in range(start, start + length)}


def _remove_blocks(extents, start, length):
    """Remove blocks [start, start + length) from a list of extents, in place."""
    out = []
    end = start + length
    for first, count in extents:
        last = first + count
        if last <= start or first >= end:
            out.append((first, count))
            continue
        if first < start:
            out.append((first, start - first))
        if last > end:
            out.append((end, last - end))
    extents[:] = out


def _outcome_unwanted(task):
    """A transaction whose caller was cancelled: its outcome is logged, not left unretrieved."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a transaction whose caller went away failed: %r", task.exception())


async def _gather_all(awaitables):
    """Await all; if any fails, wait for the rest (their buffers are in the kernel) and raise
    the first failure."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
