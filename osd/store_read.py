"""The object store's read side: committed records through the record cache, object reads
(whole, by range, or begun from a callback for the OSD's fast gets), the read cache of small
objects, omaps, key tables, listings and usage.

Theory of operation: every read sees committed state only. A record comes from the record cache
(decoded committed records, absence too, bounded in bytes) or RocksDB; the blocks it names are
read from the device and every 4 KiB is checked against its crc32c before a byte is returned
(ChecksumError names the object and offset otherwise). A read pins the store's sequence while
it runs, so blocks a later commit frees are not reused under it (osd/allocator.py, rule 3).
Small objects read whole are kept in the read cache for the record version they were read at;
every commit that touches a key drops its entry.
"""

import collections
import dataclasses

import numpy as np

from cairn.common import limits
from cairn.common.limits import DEVICE_IO_BYTES_MAX, LIST_PAGE_ENTRIES_MAX, OMAP_PAGE_ENTRIES_MAX
from cairn.native.checksum import FOLD_BLOCK_BYTES, block_crcs, range_crc
from cairn.osd import blockio, records
from cairn.osd.errors import ChecksumError, InvalidArgument, ObjectNotFound
from cairn.osd.records import ObjectRecord


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


class StoreReads:
    """The read side of `Store` (osd/store.py): it reads the store's device, database (`_db`),
    record cache (`_cache`, `_cache_bytes`), read cache, collections, usage and read pins, and
    changes only the caches and the pins."""

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
            for chunk_start, chunk_length in blockio.chunks(start, length, self.block_size):
                target = view[position:position + chunk_length * self.block_size]
                source = blockio.staged_bytes(staged, chunk_start, chunk_length, self.block_size)
                if source is not None:
                    target[:] = source
                else:
                    reads.append(self.device.read_into(
                        self._data_start + chunk_start * self.block_size, target))
                position += chunk_length * self.block_size
        if len(reads) == 1:
            await reads[0]
        elif reads:
            await blockio.gather_all(reads)

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
