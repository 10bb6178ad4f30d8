"""Renames in the file namespace (client/fs.py's `Filesystem`).

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
import time

import msgpack

from cairn.client import errors
from cairn.client.fs_format import (ATTR_KEY, DEAD_KEY, ENTRY_PREFIX, INTENT_SETTLE_S, ROOT_INO,
                                    _check_name, _display, _pack_entry, _unpack_entry,
                                    embedded_home, entry_attr, fs_error, inline_key)


class RenameOps:
    """Rename, a part of `Filesystem` (client/fs.py): its state and helpers are `self`'s."""

    async def rename(self, src_parent, src_name, dst_parent, dst_name, replace=True):
        """Move an entry, replacing a file (or an empty directory) at the target atomically,
        as POSIX rename does; `replace=False` refuses an existing target (EEXIST)."""
        src_raw, dst_raw = _check_name(src_name), _check_name(dst_name)
        ino, kind, source, _ = await self._lookup_entry(src_parent, src_name, fresh=True)
        await self._settle_name(dst_parent, dst_raw)
        if src_parent == dst_parent and src_raw == dst_raw:
            return
        target = replaced = None
        try:
            *target, replaced, _ = await self._lookup_entry(dst_parent, dst_name, fresh=True)
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
        try:
            if src_parent == dst_parent:
                await self._rename_within(src_parent, src_raw, dst_raw, source, replaced)
            else:
                await self._rename_across(src_parent, src_raw, dst_parent, dst_raw, source,
                                          replaced)
            self._forget_dir(src_parent, dst_parent)
        except BaseException:
            self._forget_dir(src_parent, dst_parent)
            if target is not None and target[1] == "d":
                await self.meta.omap_update(self.inode_object(target[0]), remove=[DEAD_KEY])
            raise
        if target is None:
            return
        if target[1] == "d":
            await self._drop_directory(target[0])
            return
        old = entry_attr(replaced)
        if old is not None and src_parent == dst_parent:
            await self._drop_data(target[0], old)   # its record went with the rename
        elif old is not None:
            await self._drop_inode(target[0], old)
        else:
            await self._unlink_inode(target[0])

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

    async def _rename_within(self, parent, src_raw, dst_raw, packed, replaced):
        """One update: the entry moves (an embedded inode with it, its record renamed), a
        replaced embedded inode's record goes."""
        src_key, dst_key = ENTRY_PREFIX + src_raw, ENTRY_PREFIX + dst_raw
        conditions = {"equals": {src_key: packed}}
        changes, remove = {dst_key: packed, **self._touched(parent)}, [src_key]
        if replaced is None:
            conditions["absent"] = [dst_key]
        else:
            conditions["equals"][dst_key] = replaced
            if entry_attr(replaced) is not None:
                gone = _unpack_entry(replaced)[0]
                remove += [embedded_home(gone)[1], inline_key(gone)]
        if entry_attr(packed) is not None:
            changes[embedded_home(_unpack_entry(packed)[0])[1]] = msgpack.packb(dst_raw)
        try:
            await self.meta.omap_update(self.inode_object(parent), changes, remove=remove,
                                        **conditions)
        except errors.PreconditionFailed as exc:
            found = await self.meta.omap_get(self.inode_object(parent), [src_key, dst_key])
            if exc.maybe_applied and src_key not in found and found.get(dst_key) == packed:
                return
            raise fs_error(errno.EAGAIN, f"{_display(src_raw)} or {_display(dst_raw)} changed "
                           "meanwhile; retry") from None

    async def _rename_across(self, src_parent, src_raw, dst_parent, dst_raw, source,
                             replaced):
        src_key, dst_key = ENTRY_PREFIX + src_raw, ENTRY_PREFIX + dst_raw
        ino, kind, _ = _unpack_entry(source)
        plain = _pack_entry(ino, kind)
        to_mark = _pack_entry(ino, kind, ["to", dst_parent, dst_raw, time.time()])
        from_mark = _pack_entry(ino, kind, ["from", src_parent, src_raw, replaced])
        src_obj, dst_obj = self.inode_object(src_parent), self.inode_object(dst_parent)
        # 1. Mark the source. An inode embedded in it moves into its record (in the same
        # directory, its home), where it stays wherever the entry goes.
        moved = {src_key: to_mark}
        attr = entry_attr(source)
        if attr is not None:
            moved[embedded_home(ino)[1]] = msgpack.packb(dict(attr))
        try:
            await self.meta.omap_update(src_obj, moved, equals={src_key: source})
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
            await self.meta.omap_update(dst_obj,
                                        {dst_key: from_mark, **self._touched(dst_parent)},
                                        **conditions)
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
            await self.meta.omap_update(src_obj, self._touched(src_parent), remove=[src_key],
                                        equals={src_key: to_mark})
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
        self._forget_dir(directory, intent[1])
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
