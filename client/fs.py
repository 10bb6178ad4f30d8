"""A file namespace on pools: directories, files and symlinks (`cairn.client.fs`).

    cluster = await Cluster.connect()
    fs = await Filesystem.open(cluster, "data", metadata_pool="meta")   # makes the root once
    await fs.makedirs("/ckpt/step-1")
    async with await fs.open_path("/ckpt/step-1/model.pt", "wb") as f:
        await f.write(b"...")                   # durable on the cluster once closed
    await fs.rename_path("/ckpt/step-1", "/ckpt/step-2")
    print(await fs.listdir("/ckpt"))

Layout. Every inode is an object of the metadata pool (replicated), named `i.<ino, 16 hex>`,
whose omap (osd/omap.py) holds:

    b"\\x00a"             its attributes: msgpack {t: "f"|"d"|"l", m: mode bits, u, g,
                          s: size, mt, ct: ns, p: parent (directories), l: symlink target}
    b"\\x00s"             a file's size and mtime as its last flush set them: msgpack
                          [size, mtime ns] (a blind write: closing a file costs one update)
    b"\\x00D"             marks a directory (a create's condition: the parent is one)
    b"\\x00d"             a directory being removed: no entry may be added to it any more
    b"\\x01" + name       a directory entry: msgpack [ino, kind] (+ a rename intent, below)

A file's bytes live in the data pool (any kind, erasure-coded too) as stripe objects
`f.<ino>.<index, hex>` of STRIPE_BYTES each, written whole: a write at an offset rewrites the
stripes it touches, a stripe that does not exist reads as zeros, and the size in the attributes
(set at close and fsync, after every stripe of the write is durable) says where the file ends.
The root is inode 1 (as FUSE numbers it); inode numbers are random 63-bit integers, claimed by
creating their object only if it does not exist.

Atomicity. An op on one directory is one conditional omap update: a create inserts its entry
only if the name is absent and the directory is not being removed; a rename within a directory
removes the old name and sets the new one in one update (replacing a file there atomically);
rmdir first marks the directory removed only if it has no entry, so nothing can be created in
it afterwards, then unlinks it. Creates make the inode before the entry, unlinks remove the
entry before the inode: a crash leaves at most an orphaned inode, which `fsck` finds.

A rename across directories touches two objects, maybe in two PGs, so it goes in steps that
each leave a state every reader knows how to finish (an intent in the entries themselves):

    1. the source entry is marked   [ino, kind, ["to", dst dir, dst name, time]]
    2. the target entry is written  [ino, kind, ["from", src dir, src name, replaced entry]]
       (only if the target is absent or still the entry it replaces)
    3. the source entry is removed (only if still marked)
    4. the target's mark is cleared; a moved directory's parent is updated; a replaced
       inode is deleted

Whoever meets a marked entry (a lookup, a listing, fsck) finishes the rename first
(`_resolve`): a target marked "from" whose source is gone or still marked "to" it completes
steps 3-4; a source marked "to" whose target does not carry the mark is rolled back (unless the
mark is younger than INTENT_SETTLE_S: its writer may still be at step 2, so the reader waits).
Each step is conditional, so two clients finishing the same rename cannot do a step twice, and
a file is never visible in both directories, nor in neither.
"""

import asyncio
import errno
import os
import secrets
import time

import msgpack

from cairn.client import errors
from cairn.client.fs_file import FileHandle, OpenInode, _truncate_stripes
from cairn.client.fs_format import (ATTR_KEY, Attr, DEAD_KEY, DIR_KEY, ENTRY_PREFIX,
                                    INTENT_SETTLE_S, LIST_PAGE, ROOT_INO, SIZE_KEY, STRIPE_BYTES,
                                    STRIPES_BY_INDEX_MAX, SYMLINK_BYTES_MAX, _check_name,
                                    _display, _pack_entry, _unpack_entry, check_file_size,
                                    check_prefix, decode_attr, fs_error, inode_object,
                                    split_path, stripe_object, stripe_prefix)


class Filesystem:
    """A namespace whose directories live in `metadata_pool` (replicated) and whose file data
    lives in `data_pool`. Make one with `await Filesystem.open(cluster, data_pool, ...)`.

    With a `prefix` ("team-a/") every object of the namespace is named under it, so the
    namespace is a tree of its own (a subvolume) that a key with `osd=rw prefix=team-a/` on
    both pools can use, and nothing else can be reached with that key."""

    def __init__(self, cluster, data_pool, metadata_pool, prefix=""):
        self.cluster = cluster
        self.data = cluster.pool(data_pool)
        self.meta = cluster.pool(metadata_pool)
        self.prefix = check_prefix(prefix)
        self._open = {}                 # ino -> OpenInode (files open in this process)

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
        try:
            found = await self.meta.omap_get(self.inode_object(ino), [ATTR_KEY, SIZE_KEY])
        except errors.ObjectNotFound:
            found = {}
        attr = decode_attr(found)
        if attr is None:
            raise fs_error(errno.ENOENT, f"inode {ino:x}")
        handle = self._open.get(ino)
        if handle is not None:
            attr["s"] = handle.size
        return attr

    async def _new_inode(self, attr):
        """Claim a fresh inode number and write its attributes; the number."""
        entries = {ATTR_KEY: msgpack.packb(attr)}
        if attr["t"] == "d":
            entries[DIR_KEY] = b""
        while True:
            ino = secrets.randbits(63)
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

    async def _set_attr(self, ino, change):
        """Apply change(attr) to the inode's attributes, retrying if another client changed
        them meanwhile (compare-and-swap on the object's version)."""
        name = self.inode_object(ino)
        while True:
            try:
                reply = await self.meta.omap_read(name, [ATTR_KEY, SIZE_KEY])
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"inode {ino:x}") from None
            values, version = reply
            attr = decode_attr(values)
            if attr is None:
                raise fs_error(errno.ENOENT, f"inode {ino:x}")
            change(attr)
            try:
                # The size moves into the attributes (one record again).
                await self.meta.omap_update(name, {ATTR_KEY: msgpack.packb(dict(attr))},
                                            remove=[SIZE_KEY], if_version=version)
                return attr
            except errors.PreconditionFailed:
                continue

    async def _drop_inode(self, ino, attr):
        """Delete an inode no entry names any more: its object and, for a file, its data."""
        if attr is not None and attr.get("t") == "f":
            await self._delete_stripes(ino, 0, -(-attr.get("s", 0) // STRIPE_BYTES))
        try:
            await self.meta.delete(self.inode_object(ino), plain=True)
        except errors.ObjectNotFound:
            pass

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
        key = ENTRY_PREFIX + _check_name(name)
        for _ in range(50):
            try:
                found = await self.meta.omap_get(self.inode_object(parent), [key, ATTR_KEY])
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
            await self._check_dir(parent, found.get(ATTR_KEY))
            raw = found.get(key)
            if raw is None:
                raise fs_error(errno.ENOENT, _display(name))
            ino, kind, intent = _unpack_entry(raw)
            if intent is None:
                return ino, kind
            await self._resolve(parent, key, raw)
        raise fs_error(errno.EAGAIN, f"{_display(name)}: a rename of it did not settle")

    async def _check_dir(self, ino, raw_attr):
        if raw_attr is None:
            raise fs_error(errno.ENOENT, f"inode {ino:x}")
        if msgpack.unpackb(raw_attr)["t"] != "d":
            raise fs_error(errno.ENOTDIR, f"inode {ino:x}")

    async def readdir(self, ino, start_after=None, limit=LIST_PAGE):
        """([(name, ino, kind)], more) of directory `ino`, in name order after `start_after`
        (a name). Entries caught mid-rename are finished first."""
        attr = await self.getattr(ino)
        if not attr.is_dir:
            raise fs_error(errno.ENOTDIR, f"inode {ino:x}")
        after = ENTRY_PREFIX + _check_name(start_after) if start_after is not None else None
        for _ in range(50):
            entries, more = await self.meta.omap_list(self.inode_object(ino), after,
                                                      prefix=ENTRY_PREFIX, limit=limit)
            marked = [(key, raw) for key, raw in entries if _unpack_entry(raw)[2] is not None]
            if not marked:
                return [(key[1:].decode(errors="surrogateescape"), *_unpack_entry(raw)[:2])
                        for key, raw in entries], more
            for key, raw in marked:
                await self._resolve(ino, key, raw)
        raise fs_error(errno.EAGAIN, f"directory {ino:x}: renames in it did not settle")

    async def _insert(self, parent, raw_name, ino, kind):
        """Add entry raw_name -> ino to directory `parent` (EEXIST, ENOENT: removed)."""
        key = ENTRY_PREFIX + raw_name
        packed = _pack_entry(ino, kind)
        try:
            await self.meta.omap_update(self.inode_object(parent), {key: packed},
                                        absent=[key, DEAD_KEY], present=[DIR_KEY])
        except errors.ObjectNotFound:
            raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(self.inode_object(parent), [key, DEAD_KEY, ATTR_KEY])
            if exc.maybe_applied and found.get(key) == packed:
                return                              # our first attempt did it
            await self._check_dir(parent, found.get(ATTR_KEY))
            if key in found:
                raise fs_error(errno.EEXIST, _display(raw_name)) from None
            raise fs_error(errno.ENOENT, f"directory inode {parent:x} is being removed") \
                from None

    async def _make(self, parent, name, attr):
        """(ino, Attr) of a new inode named `name` in `parent`: the inode first, then the
        entry (only if the parent is a directory, not being removed, without that name)."""
        raw = _check_name(name)
        ino = await self._new_inode(attr)
        try:
            await self._insert(parent, raw, ino, attr["t"])
        except BaseException:
            await self._drop_inode(ino, None)
            raise
        return ino, Attr(attr)

    async def lookup_parent_ok(self, parent):
        attr = await self.getattr(parent)
        if not attr.is_dir:
            raise fs_error(errno.ENOTDIR, f"inode {parent:x}")
        return attr

    def _new_attr(self, kind, mode, uid, gid, **extra):
        now = time.time_ns()
        attr = {"t": kind, "m": mode & 0o7777, "u": os.getuid() if uid is None else uid,
                "g": os.getgid() if gid is None else gid, "s": 0, "mt": now, "ct": now}
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

    async def readlink(self, ino):
        attr = await self.getattr(ino)
        if attr.kind != "l":
            raise fs_error(errno.EINVAL, f"inode {ino:x} is not a symlink")
        return attr["l"]

    async def unlink(self, parent, name):
        """Remove a file or symlink (EISDIR for a directory). Its data goes once the entry is
        gone (a file unlinked while open is not kept alive: its readers get errors after)."""
        raw = _check_name(name)
        ino, kind = await self.lookup(parent, name)
        if kind == "d":
            raise fs_error(errno.EISDIR, _display(raw))
        await self._remove_entry(parent, raw, _pack_entry(ino, kind))
        attr = await self._attr_or_none(ino)
        await self._drop_inode(ino, attr)

    async def _attr_or_none(self, ino):
        try:
            return await self.getattr(ino)
        except FileNotFoundError:
            return None

    async def _remove_entry(self, parent, raw_name, packed):
        key = ENTRY_PREFIX + raw_name
        try:
            await self.meta.omap_update(self.inode_object(parent), remove=[key],
                                        equals={key: packed})
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(self.inode_object(parent), [key])
            if exc.maybe_applied and key not in found:
                return
            raise fs_error(errno.ENOENT if key not in found else errno.EAGAIN,
                           f"{_display(raw_name)} changed meanwhile") from None

    async def rmdir(self, parent, name):
        """Remove an empty directory (ENOTEMPTY, ENOTDIR)."""
        raw = _check_name(name)
        ino, kind = await self.lookup(parent, name)
        if kind != "d":
            raise fs_error(errno.ENOTDIR, _display(raw))
        if ino == ROOT_INO:
            raise fs_error(errno.EBUSY, "the root")
        await self._mark_dead(ino, raw)
        try:
            await self._remove_entry(parent, raw, _pack_entry(ino, kind))
        except OSError:
            await self.meta.omap_update(self.inode_object(ino), remove=[DEAD_KEY])
            raise
        await self._drop_inode(ino, None)

    async def _mark_dead(self, ino, raw_name):
        try:
            await self.meta.omap_update(self.inode_object(ino), {DEAD_KEY: b"1"},
                                        empty=[ENTRY_PREFIX])
        except errors.PreconditionFailed:
            raise fs_error(errno.ENOTEMPTY, _display(raw_name)) from None

    # -- rename -------------------------------------------------------------------------------------

    async def rename(self, src_parent, src_name, dst_parent, dst_name, replace=True):
        """Move an entry, replacing a file (or an empty directory) at the target atomically,
        as POSIX rename does; `replace=False` refuses an existing target (EEXIST)."""
        src_raw, dst_raw = _check_name(src_name), _check_name(dst_name)
        ino, kind = await self.lookup(src_parent, src_name)
        if src_parent == dst_parent and src_raw == dst_raw:
            return
        target = None
        try:
            target = await self.lookup(dst_parent, dst_name)
        except FileNotFoundError:
            await self.lookup_parent_ok(dst_parent)
        if target is not None:
            if not replace:
                raise fs_error(errno.EEXIST, _display(dst_raw))
            if target[0] == ino:
                return
            if kind == "d" and target[1] != "d":
                raise fs_error(errno.ENOTDIR, _display(dst_raw))
            if kind != "d" and target[1] == "d":
                raise fs_error(errno.EISDIR, _display(dst_raw))
        if kind == "d" and dst_parent != src_parent:
            await self._check_not_inside(ino, dst_parent)
        if target is not None and target[1] == "d":
            await self._mark_dead(target[0], dst_raw)
        replaced = _pack_entry(*target) if target is not None else None
        try:
            if src_parent == dst_parent:
                await self._rename_within(src_parent, src_raw, dst_raw, ino, kind, replaced)
            else:
                await self._rename_across(src_parent, src_raw, dst_parent, dst_raw, ino, kind,
                                          replaced)
        except BaseException:
            if target is not None and target[1] == "d":
                await self.meta.omap_update(self.inode_object(target[0]), remove=[DEAD_KEY])
            raise
        if target is not None:
            await self._drop_inode(target[0], await self._attr_or_none(target[0]))

    async def _check_not_inside(self, ino, directory):
        """EINVAL if `directory` is `ino` or below it (a directory moved into itself)."""
        seen = 0
        while True:
            if directory == ino:
                raise fs_error(errno.EINVAL, "a directory cannot move below itself")
            if directory == ROOT_INO or seen > 4096:
                return
            directory = (await self.getattr(directory)).get("p", ROOT_INO)
            seen += 1

    async def _rename_within(self, parent, src_raw, dst_raw, ino, kind, replaced):
        src_key, dst_key = ENTRY_PREFIX + src_raw, ENTRY_PREFIX + dst_raw
        packed = _pack_entry(ino, kind)
        conditions = {"equals": {src_key: packed}}
        if replaced is None:
            conditions["absent"] = [dst_key]
        else:
            conditions["equals"][dst_key] = replaced
        try:
            await self.meta.omap_update(self.inode_object(parent), {dst_key: packed},
                                        remove=[src_key], **conditions)
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(self.inode_object(parent), [src_key, dst_key])
            if exc.maybe_applied and src_key not in found and found.get(dst_key) == packed:
                return
            raise fs_error(errno.EAGAIN, f"{_display(src_raw)} or {_display(dst_raw)} changed "
                           "meanwhile; retry") from None

    async def _rename_across(self, src_parent, src_raw, dst_parent, dst_raw, ino, kind,
                             replaced):
        src_key, dst_key = ENTRY_PREFIX + src_raw, ENTRY_PREFIX + dst_raw
        plain = _pack_entry(ino, kind)
        to_mark = _pack_entry(ino, kind, ["to", dst_parent, dst_raw, time.time()])
        from_mark = _pack_entry(ino, kind, ["from", src_parent, src_raw, replaced])
        src_obj, dst_obj = self.inode_object(src_parent), self.inode_object(dst_parent)
        # 1. Mark the source.
        try:
            await self.meta.omap_update(src_obj, {src_key: to_mark}, equals={src_key: plain})
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(src_obj, [src_key])
            if not (exc.maybe_applied and found.get(src_key) == to_mark):
                raise fs_error(errno.EAGAIN, f"{_display(src_raw)} changed meanwhile") \
                    from None
        # 2. Write the target, marked.
        conditions = {"absent": [DEAD_KEY], "present": [ATTR_KEY]}
        if replaced is None:
            conditions["absent"].append(dst_key)
        else:
            conditions["equals"] = {dst_key: replaced}
        try:
            await self.meta.omap_update(dst_obj, {dst_key: from_mark}, **conditions)
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(dst_obj, [dst_key, DEAD_KEY])
            if not (exc.maybe_applied and found.get(dst_key) == from_mark):
                await self._unmark_source(src_obj, src_key, to_mark, plain)
                if DEAD_KEY in found:
                    raise fs_error(errno.ENOENT, "the target directory is being removed") \
                        from None
                raise fs_error(errno.EAGAIN, f"{_display(dst_raw)} changed meanwhile; retry") \
                    from None
        # 3 and 4.
        if not await self._finish_rename(src_parent, src_key, to_mark, dst_parent, dst_key,
                                         from_mark, ino, kind):
            raise fs_error(errno.EAGAIN, "the rename was rolled back by another client "
                           "(it took too long); retry")

    async def _unmark_source(self, src_obj, src_key, to_mark, plain):
        try:
            await self.meta.omap_update(src_obj, {src_key: plain}, equals={src_key: to_mark})
        except errors.PreconditionFailed:
            pass                            # someone resolved it already

    async def _finish_rename(self, src_parent, src_key, to_mark, dst_parent, dst_key,
                             from_mark, ino, kind):
        """Steps 3 and 4 (both conditional: safe to run twice). False if the source was no
        longer marked for this rename (a reader rolled it back): the target is then removed
        again, the replaced entry restored."""
        src_obj, dst_obj = self.inode_object(src_parent), self.inode_object(dst_parent)
        try:
            await self.meta.omap_update(src_obj, remove=[src_key], equals={src_key: to_mark})
        except errors.PreconditionFailed:
            found = await self.meta.omap_get(src_obj, [src_key])
            if src_key in found:                # rolled back: undo step 2
                replaced = _unpack_entry(from_mark)[2][3]
                try:
                    if replaced is None:
                        await self.meta.omap_update(dst_obj, remove=[dst_key],
                                                    equals={dst_key: from_mark})
                    else:
                        await self.meta.omap_update(dst_obj, {dst_key: replaced},
                                                    equals={dst_key: from_mark})
                except errors.PreconditionFailed:
                    pass
                return False
        await self._settle_target(dst_parent, dst_key, from_mark, ino, kind)
        return True

    async def _settle_target(self, directory, key, from_mark, ino, kind):
        """Step 4: clear the target entry's mark (if nobody did yet) and point a moved
        directory at its new parent."""
        try:
            await self.meta.omap_update(self.inode_object(directory), {key: _pack_entry(ino, kind)},
                                        equals={key: from_mark})
        except errors.PreconditionFailed:
            pass                                # someone else cleared it
        if kind == "d":
            def move(attr):
                attr["p"] = directory
            try:
                await self._set_attr(ino, move)
            except FileNotFoundError:
                pass

    async def _resolve(self, directory, key, raw):
        """Finish (or roll back) the rename whose intent marks entry `key` of `directory`."""
        ino, kind, intent = _unpack_entry(raw)
        if intent[0] == "to":
            _, dst_parent, dst_raw, when = intent
            dst_key = ENTRY_PREFIX + bytes(dst_raw)
            found = await self._omap_get_quiet(dst_parent, [dst_key])
            other = found.get(dst_key)
            if other is not None:
                o_ino, o_kind, o_intent = _unpack_entry(other)
                if o_ino == ino and o_intent is not None and o_intent[0] == "from" and \
                        o_intent[1] == directory and bytes(o_intent[2]) == key[1:]:
                    await self._finish_rename(directory, key, raw, dst_parent, dst_key, other,
                                              ino, kind)
                    return
            if time.time() - when < INTENT_SETTLE_S:
                await asyncio.sleep(0.2)            # its writer may be at step 2
                return
            await self._unmark_source(self.inode_object(directory), key, raw,
                                      _pack_entry(ino, kind))
            return
        _, src_parent, src_raw, replaced = intent
        src_key = ENTRY_PREFIX + bytes(src_raw)
        found = await self._omap_get_quiet(src_parent, [src_key])
        source = found.get(src_key)
        if source is not None:
            s_ino, s_kind, s_intent = _unpack_entry(source)
            marked_here = s_ino == ino and s_intent is not None and s_intent[0] == "to" and \
                s_intent[1] == directory and bytes(s_intent[2]) == key[1:]
            if marked_here:
                await self._finish_rename(src_parent, src_key, source, directory, key, raw,
                                          ino, kind)
                return
            # The source is plain again: the rename was rolled back; undo this half.
            dst_obj = self.inode_object(directory)
            try:
                if replaced is None:
                    await self.meta.omap_update(dst_obj, remove=[key], equals={key: raw})
                else:
                    await self.meta.omap_update(dst_obj, {key: replaced}, equals={key: raw})
            except errors.PreconditionFailed:
                pass
            return
        # The source is gone: step 3 happened; clear the mark.
        await self._settle_target(directory, key, raw, ino, kind)

    async def _omap_get_quiet(self, ino, keys):
        try:
            return await self.meta.omap_get(self.inode_object(ino), keys)
        except errors.ObjectNotFound:
            return {}

    # -- attributes ----------------------------------------------------------------------------------

    async def setattr(self, ino, mode=None, uid=None, gid=None, size=None, mtime_ns=None):
        """Change attributes; `size` truncates or extends a file (zeros)."""
        if size is not None:
            handle = self._open.get(ino)
            if handle is not None:
                await handle.truncate(size)         # checks the size itself
            else:
                check_file_size(size, f"a truncate of inode {ino:x}")
                attr = await self.getattr(ino)
                if attr.kind != "f":
                    raise fs_error(errno.EISDIR if attr.is_dir else errno.EINVAL,
                                   f"inode {ino:x}")
                await _truncate_stripes(self, ino, attr.size, size)

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
            attr["ct"] = time.time_ns()
        return await self._set_attr(ino, change)

    # -- files --------------------------------------------------------------------------------------

    async def open_file(self, ino, writable=False, truncate=False, attr=None):
        """A FileHandle on file `ino` (EISDIR for a directory); `attr`: its Attr if the caller
        just made or read it."""
        handle = self._open.get(ino)
        if handle is None:
            attr = attr if attr is not None else await self.getattr(ino)
            if attr.kind != "f":
                raise fs_error(errno.EISDIR if attr.is_dir else errno.EINVAL, f"inode {ino:x}")
            handle = self._open[ino] = OpenInode(self, ino, attr.size)
        handle.users += 1
        file = FileHandle(handle, writable)
        if truncate and writable:
            await handle.truncate(0)
        return file

    def _closed(self, handle):
        handle.users -= 1
        if handle.users == 0 and self._open.get(handle.ino) is handle:
            del self._open[handle.ino]

    # -- paths -------------------------------------------------------------------------------------

    async def resolve(self, path, follow=True, depth=0):
        """(ino, kind) of a path from the root; symlinks followed in directories and, with
        `follow`, at the end."""
        ino, kind = ROOT_INO, "d"
        names = split_path(path)
        for index, name in enumerate(names):
            if name == "..":
                ino = (await self.getattr(ino)).get("p", ROOT_INO)
                kind = "d"
                continue
            if kind != "d":
                raise fs_error(errno.ENOTDIR, path)
            ino, kind = await self.lookup(ino, name)
            if kind == "l" and (follow or index < len(names) - 1):
                if depth > 40:
                    raise fs_error(errno.ELOOP, path)
                target = await self.readlink(ino)
                rest = "/".join(names[index + 1:])
                base = "/".join(names[:index]) if not target.startswith("/") else ""
                return await self.resolve(f"{base}/{target}/{rest}", follow, depth + 1)
        return ino, kind

    async def _parent_of(self, path):
        names = split_path(path)
        if not names:
            raise fs_error(errno.EBUSY, "the root")
        parent, kind = await self.resolve("/".join(names[:-1]))
        if kind != "d":
            raise fs_error(errno.ENOTDIR, path)
        return parent, names[-1]

    async def stat(self, path, follow=True):
        return await self.getattr((await self.resolve(path, follow))[0])

    async def exists(self, path):
        try:
            await self.resolve(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    async def listdir(self, path="/"):
        """Every name in a directory, in order."""
        return [name for name, _, _ in await self.scandir(path)]

    async def scandir(self, path="/"):
        """[(name, ino, kind)] of a directory."""
        ino, kind = await self.resolve(path)
        if kind != "d":
            raise fs_error(errno.ENOTDIR, path)
        out, after = [], None
        while True:
            entries, more = await self.readdir(ino, after)
            out.extend(entries)
            if not more:
                return out
            after = entries[-1][0]

    async def mkdir_path(self, path, mode=0o755):
        parent, name = await self._parent_of(path)
        return await self.mkdir(parent, name, mode)

    async def makedirs(self, path, exist_ok=True):
        """Make `path` and its missing parents; the inode of `path`. Existing directories are
        looked up (a read), not made again (three writes and a failed insert)."""
        ino = ROOT_INO
        for name in split_path(path):
            try:
                found, kind = await self.lookup(ino, name)
            except FileNotFoundError:
                try:
                    ino = await self.mkdir(ino, name)
                    continue
                except FileExistsError:             # made meanwhile by another client
                    found, kind = await self.lookup(ino, name)
            if kind != "d":
                raise fs_error(errno.ENOTDIR, path)
            ino = found
        return ino

    async def rmdir_path(self, path):
        parent, name = await self._parent_of(path)
        await self.rmdir(parent, name)

    async def unlink_path(self, path):
        parent, name = await self._parent_of(path)
        await self.unlink(parent, name)

    async def rename_path(self, source, target, replace=True):
        src_parent, src_name = await self._parent_of(source)
        dst_parent, dst_name = await self._parent_of(target)
        await self.rename(src_parent, src_name, dst_parent, dst_name, replace)

    async def symlink_path(self, target, path):
        parent, name = await self._parent_of(path)
        return await self.symlink(parent, name, target)

    async def open_path(self, path, mode="rb"):
        """A FileHandle for `path`: modes r, w (create/truncate), x (exclusive), a, with +."""
        writable = any(flag in mode for flag in "wxa+")
        if "w" in mode or "x" in mode or "a" in mode:
            parent, name = await self._parent_of(path)
            try:
                ino, attr = await self.create_attr(parent, name)
                return await self.open_file(ino, writable=True, attr=attr)
            except FileExistsError:
                if "x" in mode:
                    raise
            ino, kind = await self.resolve(path)
            handle = await self.open_file(ino, writable=True, truncate="w" in mode)
            if "a" in mode:
                handle.position = handle.inode.size
            return handle
        ino, kind = await self.resolve(path)
        return await self.open_file(ino, writable=writable)
