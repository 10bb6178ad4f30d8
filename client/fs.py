"""A file namespace on pools: directories, files and symlinks (`cairn.client.fs`).

    cluster = await Cluster.connect()
    fs = await Filesystem.open(cluster, "data", metadata_pool="meta")   # makes the root once
    await fs.makedirs("/ckpt/step-1")
    async with await fs.open_path("/ckpt/step-1/model.pt", "wb") as f:
        await f.write(b"...")                   # durable on the cluster once closed
    await fs.rename_path("/ckpt/step-1", "/ckpt/step-2")
    print(await fs.listdir("/ckpt"))

Layout. A directory is an object of the metadata pool (replicated), named `i.<ino, 16 hex>`,
whose omap (osd/omap.py) holds:

    b"\\x00a"             its attributes: msgpack {t: "d", m: mode bits, u, g, mt, ct: ns,
                          p: parent}
    b"\\x00D"             marks a directory (a create's condition: the parent is one)
    b"\\x00d"             a directory being removed: no entry may be added to it any more
    b"\\x01" + name       an entry: msgpack [ino, kind] (+ a rename intent, below); a primary
                          entry is [ino, kind, None, attributes]: the inode lives in it
    b"\\x02" + slot       the record of an inode born here (slot: 4 bytes): the name of its
                          primary entry here, or its attributes once no entry holds them

Files and symlinks are embedded, as CephFS's primary dentries: one made in directory D is
numbered EMBED_BIT | D << 32 | slot, and its attributes {t: "f"|"l", m, u, g, s: size, mt,
ct, l: symlink target} live in its entry. A create is one conditional update of D (the entry
and the record, only if the name and the slot are free), a lookup one read that returns the
attributes with the number, an unlink one update, and a listing carries every embedded
inode's attributes (readdirplus for free). By number, an inode is found through its record
in D (the number says which D), which names the entry holding it. A rename within D moves
the entry and renames the record in one update; a rename to another directory moves the
attributes into the record (in D, for good), and the entries naming it carry the number
only. D may then be removed: its object stays, unnamed, while records remain in it.

Directories, and files made before this layout (or in a directory made before it, numbered at
or above DIR_INO_LIMIT), are inodes of their own: objects `i.<ino>` holding b"\\x00a" and,
for a file, b"\\x00s": its size and mtime as its last flush set them, [size, mtime ns] (a
blind write). Namespaces made before this layout mount as they are; new files in their old
directories are made the old way, in new directories (and the root) embedded.

A file's bytes live in the data pool (any kind, erasure-coded too) as stripe objects
`f.<ino>.<index, hex>` of STRIPE_BYTES each, written whole: a write at an offset rewrites the
stripes it touches, a stripe that does not exist reads as zeros, and the size in the attributes
(set at close and fsync, after every stripe of the write is durable) says where the file ends.
The root is inode 1 (as FUSE numbers it); new directories get random numbers below
DIR_INO_LIMIT, claimed by creating their object only if it does not exist.

Atomicity. An op on one directory is one conditional omap update: a create inserts its entry
only if the name is absent and the directory is not being removed; a rename within a directory
removes the old name and sets the new one in one update (replacing a file there atomically);
rmdir first marks the directory removed only if it has no entry, so nothing can be created in
it afterwards, then unlinks it. An embedded inode comes and goes with its entry; an inode of
its own is made before its entry and removed after it: a crash leaves at most an orphaned
inode (or a removed file's stripes), which `fsck` finds. Updates to one directory sent while
another is in flight go to the OSD together (client/omap_batch.py).

A rename across directories goes in steps: client/fs_rename.py.
"""

import asyncio
import collections
import errno
import logging
import os
import secrets
import stat as stat_module
import time

import msgpack

from cairn.client import errors
from cairn.client.fs_cache import PAGE_ENTRIES, key_before
from cairn.client.fs_file import FileHandle, OpenInode
from cairn.client.fs_format import (ATTR_KEY, Attr, DEAD_KEY, DIR_INO_LIMIT, DIR_KEY,
                                    DIR_TIMES_KEY, EMBED_BIT, ENTRY_PREFIX, LIST_PAGE, ROOT_INO,
                                    SIZE_KEY, SPECIAL_KINDS, STRIPE_BYTES, STRIPES_BY_INDEX_MAX,
                                    SYMLINK_BYTES_MAX, _check_name, _display, _pack_entry,
                                    _unpack_entry, check_prefix, decode_attr, embedded_home,
                                    embedded_ino, entry_attr, fs_error, inline_key, inode_object,
                                    is_embedded, stripe_object, stripe_prefix)
from cairn.client.fs_paths import PathOps
from cairn.client.fs_remove import RemoveOps
from cairn.client.fs_rename import RenameOps

log = logging.getLogger("cairn.fs")

# Removed files whose stripes are being deleted in the background at once (a mount's unlinks
# return once the entry is gone); past it an unlink deletes its stripes before it returns.
PURGES_MAX = 1024
# Inodes whose last-read attributes (and where they were) this process remembers: the next
# change of one is tried as a compare-and-swap against them before anything is read.
HINTS_MAX = 4096


class _Where:
    """Where an inode's attributes were read from, for a compare-and-swap: its own object
    (`key` ATTR_KEY, at `version`), a primary entry, or its home directory's record (`key`,
    with the value `raw` read); `data`: a small file's bytes read with them, if asked."""

    __slots__ = ("obj", "key", "raw", "version", "data")

    def __init__(self, obj, key, raw=None, version=None, data=None):
        self.obj, self.key, self.raw, self.version = obj, key, raw, version
        self.data = data


class Filesystem(RemoveOps, RenameOps, PathOps):
    """A namespace whose directories live in `metadata_pool` (replicated) and whose file data
    lives in `data_pool`. Make one with `await Filesystem.open(cluster, data_pool, ...)`.

    With a `prefix` ("team-a/") every object of the namespace is named under it, so the
    namespace is a tree of its own (a subvolume) that a key with `osd=rw prefix=team-a/` on
    both pools can use, and nothing else can be reached with that key.

    Inodes, entries, attributes and files are here; removing names (unlink, rmdir) is in
    client/fs_remove.py, rename in client/fs_rename.py, the operations by path in
    client/fs_paths.py: parts of this one class, sharing its state."""

    def __init__(self, cluster, data_pool, metadata_pool, prefix=""):
        self.cluster = cluster
        self.data = cluster.pool(data_pool)
        self.meta = cluster.pool(metadata_pool)
        self.prefix = check_prefix(prefix)
        self._open = {}                 # ino -> OpenInode (files open in this process)
        self._hints = collections.OrderedDict()     # ino -> (Attr, _Where), last read
        self._recent = collections.OrderedDict()    # (dir, raw name) -> its entry, last read
        # Delete a removed file's stripes after the unlink returns (the mount sets this: the
        # kernel holds the directory's lock for the whole unlink). A crash leaves them to
        # fsck's orphan_data; drain_purges() waits for them.
        self.purge_in_background = False
        # A mount's EntryCache (client/fs_cache.py): lookups answered from pages of entries
        # read within the kernel's own attribute timeout. None: every lookup reads.
        self.entry_cache = None
        self._purges = set()
        # Answer an unlink of a file's only name before its update lands (the mount sets
        # this; the kernel holds the directory's lock for the whole unlink, so one directory's
        # unlinks would each wait a replicated update). This process then sees the name as
        # absent at once and waits for the update before anything makes the name again,
        # lists or removes the directory, or fsyncs it (which reports an update that failed);
        # other clients see the name until it lands (milliseconds); a crash of this process
        # before then leaves the file, as a crash before a directory's fsync may.
        self.unlink_in_background = False
        self._unlinking = {}            # (dir, raw name) -> task of its update
        self._unlink_errors = {}        # dir -> the first error since its last fsync
        self._meta_written = False      # an update of the namespace has been accepted
        self.unlinks_early = self.unlinks_early_failed = 0     # answered early; of them failed

    def inode_object(self, ino):
        return inode_object(ino, self.prefix)

    def stripe_object(self, ino, index):
        return stripe_object(ino, index, self.prefix)

    @classmethod
    async def open(cls, cluster, data_pool, metadata_pool=None, uid=None, gid=None, prefix=""):
        fs = cls(cluster, data_pool, metadata_pool or data_pool, prefix)
        pool = cluster.map.pools[fs.meta.name]
        if pool["kind"] != "replicated":
            raise errors.Unsupported(f"pool {fs.meta.name} is {pool['kind']}: directories need a "
                                     "replicated metadata pool (--metadata-pool)")
        try:
            found = await fs.meta.omap_get(fs.inode_object(ROOT_INO), [ATTR_KEY, DIR_KEY])
        except errors.ObjectNotFound:
            found = {}
        if ATTR_KEY in found and DIR_KEY not in found:       # a root made before the mark
            await fs.meta.omap_update(fs.inode_object(ROOT_INO), {DIR_KEY: b""})
        if ATTR_KEY not in found:
            now = time.time_ns()
            root = {"t": "d", "m": 0o755, "u": os.getuid() if uid is None else uid,
                    "g": os.getgid() if gid is None else gid, "mt": now, "ct": now,
                    "p": ROOT_INO}
            try:
                await fs.meta.omap_update(fs.inode_object(ROOT_INO),
                                          {ATTR_KEY: msgpack.packb(root), DIR_KEY: b""},
                                          create=True, if_version=0)
            except errors.PreconditionFailed:
                pass                        # another client made it first
        return fs

    # -- inodes ---------------------------------------------------------------------------------

    async def getattr(self, ino):
        """The inode's Attr (the open file's own size while this process writes it)."""
        attr, _ = await self._locate(ino)
        return self._with_open_size(ino, attr)

    def _with_open_size(self, ino, attr):
        handle = self._open.get(ino)
        if handle is not None:
            attr["s"] = handle.size
        return attr

    async def _locate(self, ino, data=False):
        """(Attr, _Where) of inode `ino` as stored now (ENOENT); with `data`, a small file's
        bytes come in the same read (`_Where.data`)."""
        if not is_embedded(ino):
            name = self.inode_object(ino)
            try:
                values, version = await self.meta.omap_read(name, [ATTR_KEY, SIZE_KEY,
                                                                   DIR_TIMES_KEY])
            except errors.ObjectNotFound:
                values, version = {}, 0
            attr = decode_attr(values)
            if attr is None:
                raise fs_error(errno.ENOENT, f"inode {ino:x}")
            return self._hint(ino, attr, _Where(name, ATTR_KEY, version=version))
        home, record_key = embedded_home(ino)
        obj = self.inode_object(home)
        wanted = [inline_key(ino)] if data else []          # a small file's bytes, if asked

        def small(found):
            return found.get(inline_key(ino), b"") if data else None
        for _ in range(8):
            hinted = self._hints.get(ino)
            keys = [record_key, *wanted]
            if hinted is not None and hinted[1].key.startswith(ENTRY_PREFIX):
                keys.append(hinted[1].key)          # its entry, if it was not renamed
            try:
                found = await self.meta.omap_get(obj, keys)
            except errors.ObjectNotFound:
                found = {}
            record = found.get(record_key)
            if record is None:
                raise fs_error(errno.ENOENT, f"inode {ino:x}")
            value = msgpack.unpackb(record)
            if isinstance(value, dict):             # the inode lives in the record
                return self._hint(ino, Attr(value), _Where(obj, record_key, record,
                                                             data=small(found)))
            key = ENTRY_PREFIX + value              # ... or in its primary entry
            raw = found.get(key)
            if raw is None:
                found = await self._omap_get_quiet(home, [key, *wanted])
                raw = found.get(key)
            attr = entry_attr(raw) if raw is not None else None
            if attr is not None and _unpack_entry(raw)[0] == ino:
                return self._hint(ino, attr, _Where(obj, key, raw, data=small(found)))
            # renamed within its directory between the two reads: read again
        raise fs_error(errno.EAGAIN, f"inode {ino:x} kept moving")

    def _touched(self, *directories):
        """The update that sets a directory's mtime and ctime to now (with a change of its
        entries, as POSIX says); the mount's cache of the directories' attributes follows."""
        now = time.time_ns()
        if self.entry_cache is not None:
            for directory in directories:
                self.entry_cache.touch_dir(directory, now)
        return {DIR_TIMES_KEY: msgpack.packb([now, now])}

    def cached_dir_attr(self, ino):
        """(Attr, seconds it stays fresh) of a directory whose attributes this process read
        within the entry cache's time (None: read them): the mount answers the kernel's
        requests for them from here (client/fs_cache.py)."""
        if self.entry_cache is None or is_embedded(ino):
            return None
        held = self.entry_cache.dir_attr(ino)
        return None if held is None else (Attr(held[0]), held[1])

    def _hint(self, ino, attr, where):
        if self.entry_cache is not None and not is_embedded(ino) and attr.get("t") == "d":
            self.entry_cache.put_dir_attr(ino, attr)
        self._hints[ino] = (attr, where)
        self._hints.move_to_end(ino)
        if len(self._hints) > HINTS_MAX:
            self._hints.popitem(last=False)
        return attr, where

    async def _new_inode(self, attr, below=DIR_INO_LIMIT):
        """Claim a fresh inode number (below `below`) for an inode of its own and write its
        attributes; the number."""
        entries = {ATTR_KEY: msgpack.packb(attr)}
        if attr["t"] == "d":
            entries[DIR_KEY] = b""
        while True:
            ino = secrets.randbelow(below)
            if ino <= ROOT_INO:
                continue
            try:
                await self.meta.omap_update(self.inode_object(ino), entries, create=True,
                                            if_version=0)
                return ino
            except errors.PreconditionFailed as exc:
                if exc.maybe_applied:
                    found = await self.meta.omap_get(self.inode_object(ino), [ATTR_KEY])
                    if found.get(ATTR_KEY) == msgpack.packb(attr):
                        return ino
                # that number is taken: draw another

    async def _set_attr(self, ino, change, data=None):
        """Apply change(attr) to the inode's attributes: a compare-and-swap against what was
        last read (this process's hint, else a fresh read), again on a read if another
        client changed them meanwhile. `data`: a small file's bytes to store in the same
        update (False: drop them)."""
        hinted = self._hints.pop(ino, None)
        for _ in range(100):
            if hinted is not None:
                attr, where = Attr(hinted[0]), hinted[1]
                hinted = None
            else:
                attr, where = await self._locate(ino)
                attr = Attr(attr)
            change(attr)
            try:
                self._hint(ino, attr, await self._store_attr(ino, where, attr, data))
                return attr
            except errors.PreconditionFailed:
                continue
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"inode {ino:x}") from None
        raise fs_error(errno.EAGAIN, f"inode {ino:x}: its attributes kept changing")

    async def _store_attr(self, ino, where, attr, data=None):
        """Write `attr` where it was read, only if unchanged since (and a small file's bytes,
        `data`, beside it: False drops them); the new _Where."""
        if where.key == ATTR_KEY:
            # The size and a directory's times move into the attributes (one record again).
            version = await self.meta.omap_update(where.obj,
                                                  {ATTR_KEY: msgpack.packb(dict(attr))},
                                                  remove=[SIZE_KEY, DIR_TIMES_KEY],
                                                  if_version=where.version)
            return _Where(where.obj, ATTR_KEY, version=version)
        if where.key.startswith(ENTRY_PREFIX):
            new = _pack_entry(ino, attr.kind, attr=attr)
        else:
            new = msgpack.packb(dict(attr))
        sets, removes = {where.key: new}, []
        if data:
            sets[inline_key(ino)] = data
        elif data is not None:
            removes.append(inline_key(ino))
        try:
            await self.meta.omap_update(where.obj, sets, remove=removes,
                                        equals={where.key: where.raw})
        except errors.PreconditionFailed:
            if where.key.startswith(ENTRY_PREFIX):
                self._forget_dir(embedded_home(ino)[0])
            raise
        if where.key.startswith(ENTRY_PREFIX):
            self._note(embedded_home(ino)[0], where.key, new)
        return _Where(where.obj, where.key, new)

    async def _drop_inode(self, ino, attr):
        """Delete an inode no entry names any more: its object (or record) and its data."""
        await self._drop_data(ino, attr)
        try:
            if is_embedded(ino):
                home, record_key = embedded_home(ino)
                await self.meta.omap_update(self.inode_object(home),
                                            remove=[record_key, inline_key(ino)])
                await self._drop_husk(home)
            else:
                await self.meta.delete(self.inode_object(ino), plain=True)
        except errors.ObjectNotFound:
            pass

    async def _drop_data(self, ino, attr):
        """Delete a removed file's stripes (up to its size here if it is open here; none
        for a small file, whose bytes went with its record)."""
        self._hints.pop(ino, None)
        if attr is not None and attr.get("t") == "f":
            size = 0 if attr.get("i") else attr.get("s", 0)
            handle = self._open.get(ino)
            if handle is not None and handle.inline is None:
                size = max(size, handle.size)
            end = -(-size // STRIPE_BYTES)
            if end and self.purge_in_background and len(self._purges) < PURGES_MAX:
                task = asyncio.ensure_future(self._purge(ino, end))
                self._purges.add(task)
                task.add_done_callback(self._purges.discard)
                return
            await self._delete_stripes(ino, 0, end)

    async def _purge(self, ino, end):
        try:
            await self._delete_stripes(ino, 0, end)
        except Exception as exc:                # left for fsck (orphan_data)
            log.warning("the stripes of removed file %x were not all deleted: %s", ino, exc)

    async def drain_purges(self):
        """Wait until every stripe deletion started in the background has finished."""
        while self._purges:
            await asyncio.gather(*list(self._purges), return_exceptions=True)

    async def _delete_stripes(self, ino, first, end):
        """Delete the file's stripes with index in [first, end): one by one when they are few,
        else those a listing finds (a sparse file costs what it holds, not its size)."""
        async def one(index):
            try:
                await self.data.delete(self.stripe_object(ino, index), plain=True)
            except errors.ObjectNotFound:
                pass
        indices = range(first, end) if end - first <= STRIPES_BY_INDEX_MAX else \
            await self._stripes_held(ino, first, end)
        for start in range(0, len(indices), 64):
            await asyncio.gather(*(one(i) for i in indices[start:start + 64]))

    async def _stripes_held(self, ino, first, end):
        """The indices in [first, end) of the stripes the data pool holds for file `ino`."""
        prefix = stripe_prefix(ino, self.prefix)
        held, page = [], None
        while True:
            names, page = await self.data.list(prefix=prefix, page=page, limit=LIST_PAGE)
            for name in names:
                try:
                    index = int(name[len(prefix):], 16)
                except ValueError:
                    continue                    # not a stripe of this file
                if first <= index < end:
                    held.append(index)
            if page is None:
                return sorted(held)

    # -- directory entries ------------------------------------------------------------------------

    async def lookup(self, parent, name):
        """(ino, kind) of `name` in directory `parent`; ENOENT, ENOTDIR."""
        ino, kind, _, _ = await self._lookup_entry(parent, name)
        return ino, kind

    async def lookup_attr(self, parent, name):
        """(ino, Attr) of `name` in directory `parent`: one read when the inode is embedded
        in its entry."""
        ino, _, _, attr = await self._lookup_entry(parent, name)
        if attr is None:
            return ino, await self.getattr(ino)
        return ino, self._with_open_size(ino, attr)

    async def _lookup_entry(self, parent, name, fresh=False, own=False):
        """(ino, kind, entry, Attr or None) of `name` in `parent`; the Attr when the entry is
        primary (the inode embedded in it). `fresh`: not from the entry cache (for a change
        whose conditions would fail on a stale entry and that does not read again). A name
        whose unlink was answered is absent (`own`: for that unlink itself)."""
        raw_name = _check_name(name)
        if not own and (parent, raw_name) in self._unlinking:
            raise fs_error(errno.ENOENT, _display(raw_name))
        key = ENTRY_PREFIX + raw_name
        if self.entry_cache is not None and not fresh:
            # Only entries found: the kernel keeps those for 1 s too, but it is never told
            # that a name is absent, so a file another client has just made is seen at once
            # (close-to-open), and so are the cache's absent answers not used.
            raw = await self._cached_entry(parent, key)
            if raw and _unpack_entry(raw)[2] is None:
                return self._found(parent, raw_name, key, raw)
        for _ in range(50):
            try:
                found = await self.meta.omap_get(self.inode_object(parent), [key, ATTR_KEY])
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
            await self._check_dir(parent, found.get(ATTR_KEY))
            raw = found.get(key)
            if raw is None:
                raise fs_error(errno.ENOENT, _display(name))
            if _unpack_entry(raw)[2] is None:
                return self._found(parent, raw_name, key, raw)
            await self._resolve(parent, key, raw)
        raise fs_error(errno.EAGAIN, f"{_display(name)}: a rename of it did not settle")

    def _found(self, parent, raw_name, key, raw):
        ino, kind, _ = _unpack_entry(raw)
        attr = entry_attr(raw)
        if attr is not None:
            self._hint(ino, attr, _Where(self.inode_object(parent), key, raw))
        self._remember(parent, raw_name, raw)
        return ino, kind, raw, attr

    async def _cached_entry(self, parent, key):
        """The entry `key` of directory `parent` as the entry cache has it: its value, False
        (absent), or None (not known: read it). A miss reads a page of entries from `key` on."""
        cache = self.entry_cache
        if is_embedded(parent):
            raise fs_error(errno.ENOTDIR, f"inode {parent:x}")
        hit, raw = cache.find(parent, key)
        if not hit:
            after = key_before(key)
            try:
                entries, more = await self.meta.omap_list(self.inode_object(parent), after,
                                                          prefix=ENTRY_PREFIX,
                                                          limit=PAGE_ENTRIES)
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
            cache.put(parent, after, entries, more)
            hit, raw = cache.find(parent, key)
            if not hit:
                return None
        return False if raw is None else raw

    def _note(self, directory, key, entry):
        if self.entry_cache is not None:
            self.entry_cache.note(directory, key, entry)

    def _forget_dir(self, *directories):
        if self.entry_cache is not None:
            for directory in directories:
                self.entry_cache.forget(directory)

    def _remember(self, parent, raw_name, raw):
        self._recent[parent, raw_name] = raw
        self._recent.move_to_end((parent, raw_name))
        if len(self._recent) > HINTS_MAX:
            self._recent.popitem(last=False)

    async def _check_dir(self, ino, raw_attr):
        if raw_attr is None:
            raise fs_error(errno.ENOENT, f"inode {ino:x}")
        if msgpack.unpackb(raw_attr)["t"] != "d":
            raise fs_error(errno.ENOTDIR, f"inode {ino:x}")

    async def readdir(self, ino, start_after=None, limit=LIST_PAGE):
        """([(name, ino, kind)], more) of directory `ino`, in name order after `start_after`
        (a name). Entries caught mid-rename are finished first."""
        entries, more = await self.readdir_plus(ino, start_after, limit)
        return [entry[:3] for entry in entries], more

    async def readdir_plus(self, ino, start_after=None, limit=LIST_PAGE):
        """As readdir, each entry with its Attr when the inode is embedded in it (else None:
        ask getattr)."""
        await self.settle_dir(ino)
        attr = await self.getattr(ino)
        if not attr.is_dir:
            raise fs_error(errno.ENOTDIR, f"inode {ino:x}")
        after = ENTRY_PREFIX + _check_name(start_after) if start_after is not None else None
        for _ in range(50):
            entries, more = await self.meta.omap_list(self.inode_object(ino), after,
                                                      prefix=ENTRY_PREFIX, limit=limit)
            marked = [(key, raw) for key, raw in entries if _unpack_entry(raw)[2] is not None]
            if not marked:
                if self.entry_cache is not None:
                    self.entry_cache.put(ino, after or ENTRY_PREFIX, entries, more)
                out = []
                for key, raw in entries:
                    child, kind, _ = _unpack_entry(raw)
                    attr = entry_attr(raw)
                    if attr is not None:
                        attr = self._with_open_size(child, attr)
                    out.append((key[1:].decode(errors="surrogateescape"), child, kind, attr))
                return out, more
            for key, raw in marked:
                await self._resolve(ino, key, raw)
        raise fs_error(errno.EAGAIN, f"directory {ino:x}: renames in it did not settle")

    async def _insert(self, parent, raw_name, ino, kind):
        """Add entry raw_name -> ino to directory `parent` (EEXIST, ENOENT: removed)."""
        key = ENTRY_PREFIX + raw_name
        packed = _pack_entry(ino, kind)
        await self._settle_name(parent, raw_name)
        try:
            await self.meta.omap_update(self.inode_object(parent),
                                        {key: packed, **self._touched(parent)},
                                        absent=[key, DEAD_KEY], present=[DIR_KEY])
            self._note(parent, key, packed)
        except errors.ObjectNotFound:
            raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
        except errors.PreconditionFailed as exc:
            self._forget_dir(parent)
            found = await self.meta.omap_get(self.inode_object(parent), [key, DEAD_KEY, ATTR_KEY])
            if exc.maybe_applied and found.get(key) == packed:
                return                              # our first attempt did it
            await self._check_dir(parent, found.get(ATTR_KEY))
            if key in found:
                raise fs_error(errno.EEXIST, _display(raw_name)) from None
            raise fs_error(errno.ENOENT, f"directory inode {parent:x} is being removed") \
                from None

    async def _make(self, parent, name, attr):
        """(ino, Attr) of a new inode named `name` in `parent` (only if the parent is a
        directory, not being removed, without that name). A file, symlink or special file
        in a directory numbered below DIR_INO_LIMIT is embedded in its entry: one update.
        Otherwise the inode's own object first, then the entry."""
        raw = _check_name(name)
        if attr["t"] != "d" and parent < DIR_INO_LIMIT:
            if attr["t"] == "f":
                attr["i"] = 1               # its bytes beside its record while it is small
            return await self._make_embedded(parent, raw, Attr(attr))
        ino = await self._new_inode(attr, DIR_INO_LIMIT if attr["t"] == "d" else EMBED_BIT)
        try:
            await self._insert(parent, raw, ino, attr["t"])
        except BaseException:
            await self._drop_inode(ino, None)
            raise
        return ino, Attr(attr)

    async def _make_embedded(self, parent, raw_name, attr):
        """The entry with the inode in it, and the inode's record in the same directory
        (naming the entry), in one conditional update; a record slot already taken is drawn
        again."""
        key, obj = ENTRY_PREFIX + raw_name, self.inode_object(parent)
        await self._settle_name(parent, raw_name)
        for _ in range(100):
            ino = embedded_ino(parent, secrets.randbits(32))
            record_key = embedded_home(ino)[1]
            entry = _pack_entry(ino, attr.kind, attr=attr)
            try:
                await self.meta.omap_update(obj, {key: entry, record_key: msgpack.packb(raw_name),
                                                  **self._touched(parent)},
                                            absent=[key, record_key, DEAD_KEY],
                                            present=[DIR_KEY])
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
            except errors.PreconditionFailed as exc:
                self._forget_dir(parent)
                found = await self.meta.omap_get(obj, [key, record_key, DEAD_KEY, ATTR_KEY])
                if not (exc.maybe_applied and found.get(key) == entry):
                    await self._check_dir(parent, found.get(ATTR_KEY))
                    if key in found:
                        raise fs_error(errno.EEXIST, _display(raw_name)) from None
                    if DEAD_KEY in found:
                        raise fs_error(errno.ENOENT, f"directory inode {parent:x} is being "
                                       "removed") from None
                    continue                    # the slot is taken: draw another
            self._hint(ino, attr, _Where(obj, key, entry))
            self._remember(parent, raw_name, entry)
            self._note(parent, key, entry)
            self._meta_written = True
            return ino, attr
        raise fs_error(errno.EAGAIN, f"{_display(raw_name)}: no free inode slot found")

    async def lookup_parent_ok(self, parent):
        attr = await self.getattr(parent)
        if not attr.is_dir:
            raise fs_error(errno.ENOTDIR, f"inode {parent:x}")
        return attr

    def _new_attr(self, kind, mode, uid, gid, **extra):
        now = time.time_ns()
        attr = {"t": kind, "m": mode & 0o7777, "u": os.getuid() if uid is None else uid,
                "g": os.getgid() if gid is None else gid, "s": 0, "mt": now, "ct": now,
                "at": now}
        attr.update(extra)
        return attr

    async def mkdir(self, parent, name, mode=0o755, uid=None, gid=None):
        """A new directory in `parent`; its inode number (EEXIST, ENOENT, ENOTDIR)."""
        return (await self.mkdir_attr(parent, name, mode, uid, gid))[0]

    async def mkdir_attr(self, parent, name, mode=0o755, uid=None, gid=None):
        """(ino, Attr) of a new directory."""
        return await self._make(parent, name, self._new_attr("d", mode, uid, gid, p=parent))

    async def create(self, parent, name, mode=0o644, uid=None, gid=None):
        """A new empty file in `parent` (EEXIST if the name is taken)."""
        return (await self.create_attr(parent, name, mode, uid, gid))[0]

    async def create_attr(self, parent, name, mode=0o644, uid=None, gid=None):
        """(ino, Attr) of a new empty file."""
        return await self._make(parent, name, self._new_attr("f", mode, uid, gid))

    async def symlink(self, parent, name, target, uid=None, gid=None):
        raw = target.encode() if isinstance(target, str) else bytes(target)
        if not raw or len(raw) > SYMLINK_BYTES_MAX:
            raise fs_error(errno.ENAMETOOLONG if raw else errno.ENOENT, "symlink target")
        return (await self._make(parent, name, self._new_attr(
            "l", 0o777, uid, gid, l=raw.decode(errors="surrogateescape"), s=len(raw))))[0]

    async def mknod(self, parent, name, mode, rdev=0, uid=None, gid=None):
        """(ino, Attr) of a new fifo, socket or device node (`mode` carries its S_IF* type;
        a regular file's type makes an empty file)."""
        kind = SPECIAL_KINDS.get(stat_module.S_IFMT(mode))
        if kind is None:
            if stat_module.S_IFMT(mode) not in (0, stat_module.S_IFREG):
                raise fs_error(errno.EINVAL, f"mknod of type {stat_module.S_IFMT(mode):o}")
            return await self.create_attr(parent, name, mode, uid, gid)
        return await self._make(parent, name, self._new_attr(kind, mode, uid, gid, r=rdev))

    async def link(self, ino, parent, name):
        """Another name for inode `ino` (not a directory: EPERM) in `parent`; its Attr.

        The link is counted first (an embedded inode's attributes moving from its entry into
        its record, as the entries naming it can no longer hold them), then the entry is
        added: a crash in between leaves the count one too high, which fsck mends."""
        raw = _check_name(name)
        if (await self.getattr(ino)).is_dir:
            raise fs_error(errno.EPERM, f"a hard link to directory inode {ino:x}")
        attr = await self._count_link(ino, +1)
        try:
            await self._insert(parent, raw, ino, attr.kind)
        except BaseException:
            await self._count_link(ino, -1)
            raise
        return self._with_open_size(ino, attr)

    async def _count_link(self, ino, delta):
        """The inode's link count moved by `delta` (and its ctime); its new Attr."""
        for _ in range(100):
            attr, where = await self._locate(ino)
            new = Attr(attr)
            new["n"], new["ct"] = attr.nlink + delta, time.time_ns()
            try:
                if where.key.startswith(ENTRY_PREFIX):
                    record_key = embedded_home(ino)[1]
                    await self.meta.omap_update(where.obj, {
                        where.key: _pack_entry(ino, new.kind),
                        record_key: msgpack.packb(dict(new))}, equals={where.key: where.raw})
                    self._hints.pop(ino, None)
                    self._forget_dir(embedded_home(ino)[0])
                    self._recent.pop((embedded_home(ino)[0], where.key[1:]), None)
                else:
                    self._hint(ino, new, await self._store_attr(ino, where, new))
                return new
            except errors.PreconditionFailed:
                if is_embedded(ino):
                    self._forget_dir(embedded_home(ino)[0])
                continue
        raise fs_error(errno.EAGAIN, f"inode {ino:x}: its attributes kept changing")

    async def _unlink_inode(self, ino):
        """One name of inode `ino` is gone: its count moves down, or at the last one the
        inode goes (its record only if unchanged, so a link made meanwhile keeps it)."""
        for _ in range(100):
            try:
                attr, where = await self._locate(ino)
            except FileNotFoundError:
                return
            if attr.nlink > 1:
                new = Attr(attr)
                new["n"], new["ct"] = attr.nlink - 1, time.time_ns()
                try:
                    self._hint(ino, new, await self._store_attr(ino, where, new))
                    return
                except errors.PreconditionFailed:
                    continue
            await self._drop_data(ino, attr)
            try:
                if is_embedded(ino):
                    await self.meta.omap_update(where.obj, remove=[where.key, inline_key(ino)],
                                                equals={where.key: where.raw})
                    await self._drop_husk(embedded_home(ino)[0])
                else:
                    await self.meta.delete(self.inode_object(ino), plain=True)
            except errors.ObjectNotFound:
                pass
            except errors.PreconditionFailed:
                continue
            return

    async def readlink(self, ino):
        attr = await self.getattr(ino)
        if attr.kind != "l":
            raise fs_error(errno.EINVAL, f"inode {ino:x} is not a symlink")
        return attr["l"]

    async def _omap_get_quiet(self, ino, keys):
        try:
            return await self.meta.omap_get(self.inode_object(ino), keys)
        except errors.ObjectNotFound:
            return {}

    # -- attributes ----------------------------------------------------------------------------------

    async def setattr(self, ino, mode=None, uid=None, gid=None, size=None, mtime_ns=None,
                      atime_ns=None):
        """Change attributes; `size` truncates or extends a file (zeros). The access time
        is kept apart from mtime and changes only here (reads leave it, as noatime)."""
        if size is not None:
            # One path for every truncate: the open file's (opened for it if need be), made
            # durable here; it checks the size, and moves a small file's bytes out or cuts them.
            handle, opened = self._open.get(ino), None
            if handle is None:
                opened = await self.open_file(ino, writable=True)
                handle = opened.inode
            try:
                await handle.truncate(size)
                await handle.flush()
            finally:
                if opened is not None:
                    await opened.close()
            if mode is uid is gid is mtime_ns is atime_ns is None:
                return await self.getattr(ino)      # the flush stored the size and times

        def change(attr):
            if mode is not None:
                attr["m"] = mode & 0o7777
            if uid is not None:
                attr["u"] = uid
            if gid is not None:
                attr["g"] = gid
            if size is not None:
                attr["s"] = size
            if mtime_ns is not None or size is not None:
                attr["mt"] = mtime_ns if mtime_ns is not None else time.time_ns()
            if atime_ns is not None:
                attr["at"] = atime_ns
            attr["ct"] = time.time_ns()
        return await self._set_attr(ino, change)

    # -- files --------------------------------------------------------------------------------------

    async def open_file(self, ino, writable=False, truncate=False, attr=None):
        """A FileHandle on file `ino` (EISDIR for a directory); `attr`: its Attr if the caller
        just made or read it."""
        handle = self._open.get(ino)
        if handle is None:
            data = b""
            if attr is None or (attr.inline and attr.size):
                attr, where = await self._locate(ino, data=True)    # a small file's bytes too
                data = where.data
            if attr.kind != "f":
                raise fs_error(errno.EISDIR if attr.is_dir else errno.EINVAL, f"inode {ino:x}")
            handle = self._open.get(ino)        # opened meanwhile by another caller
            if handle is None:
                handle = OpenInode(self, ino, attr.size, data if attr.inline else None)
                self._open[ino] = handle
        handle.users += 1
        file = FileHandle(handle, writable)
        if truncate and writable:
            await handle.truncate(0)
        return file

    def _closed(self, handle):
        handle.users -= 1
        if handle.users == 0 and self._open.get(handle.ino) is handle:
            del self._open[handle.ino]
