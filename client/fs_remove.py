"""Removing names from the file namespace (client/fs.py's `Filesystem`): unlink, rmdir,
and the unlinks a mount answers before their updates land.
"""

import asyncio
import errno
import logging

from cairn.client import errors
from cairn.client.fs_format import (DEAD_KEY, ENTRY_PREFIX, RECORD_PREFIX, ROOT_INO, _check_name,
                                    _display, _pack_entry, _unpack_entry, embedded_home,
                                    entry_attr, fs_error, inline_key)

log = logging.getLogger("cairn.fs")

# Unlinks answered before their updates landed, at most (then an unlink waits for its own).
UNLINKS_MAX = 1024


class RemoveOps:
    """Unlink and rmdir, a part of `Filesystem` (client/fs.py): its state and helpers are
    `self`'s."""

    async def unlink(self, parent, name):
        """Remove a name (EISDIR for a directory); at the last name of a file its data goes
        once the entry is gone (after the unlink returns with purge_in_background; a file
        unlinked while open is not kept alive: its readers get errors after).

        With unlink_in_background (a mount) the last name of a file embedded in it is answered
        at once and removed by a task; see the attribute's comment for the rule."""
        raw_name = _check_name(name)
        if (parent, raw_name) in self._unlinking:
            raise fs_error(errno.ENOENT, _display(raw_name))
        entry = self._recent.pop((parent, raw_name), None)     # read by the lookup before
        if entry is not None and entry_attr(entry) is None:
            entry = None                        # only a primary one is removed on its word
        if entry is None and self.unlink_in_background:
            entry = (await self._lookup_entry(parent, raw_name))[2]
        if entry is not None and self._answers_early(entry):
            ino = _unpack_entry(entry)[0]
            task = asyncio.ensure_future(self._unlink_later(parent, raw_name, entry, ino,
                                                            self._touched(parent)))
            self._unlinking[parent, raw_name] = task
            self.unlinks_early += 1
            self._note(parent, ENTRY_PREFIX + raw_name, None)
            self._hints.pop(ino, None)
            return
        await self._unlink_entry(parent, raw_name, entry)

    def _answers_early(self, entry):
        """Whether an unlink of this entry may return before its update lands: a mount's,
        of a file's only name held in the entry itself, once this process has had an update
        of the namespace accepted (its key may change it), with room in the queue."""
        if not (self.unlink_in_background and self._meta_written and
                len(self._unlinking) < UNLINKS_MAX):
            return False
        _, kind, intent = _unpack_entry(entry)
        attr = entry_attr(entry)
        return intent is None and kind != "d" and attr is not None and attr.nlink <= 1

    async def _unlink_later(self, parent, raw_name, entry, ino, touched):
        """The update of an unlink already answered. Its outcome is the one it would have
        had in place: the entry is gone (or was already, or the name now holds another
        inode: ours is gone). An error is logged and kept for the directory's fsync."""
        try:
            await self._unlink_entry(parent, raw_name, entry, expect=ino, touched=touched)
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.warning("the unlink of %s in directory %x did not land: %s",
                        _display(raw_name), parent, exc)
            self._forget_dir(parent)
            self._unlink_errors.setdefault(parent, exc)
            self.unlinks_early_failed += 1
        finally:
            self._unlinking.pop((parent, raw_name), None)

    async def settle_dir(self, ino, report=False):
        """Wait until every unlink answered early in directory `ino` has landed; `report`:
        raise the first error one of them met since the last report (a directory's fsync)."""
        while True:
            waiting = [task for (directory, _), task in self._unlinking.items()
                       if directory == ino]
            if not waiting:
                break
            await asyncio.wait(waiting)
        if report and ino in self._unlink_errors:
            exc = self._unlink_errors.pop(ino)
            raise fs_error(errno.EIO, f"an unlink in directory {ino:x} did not land: {exc}")

    async def _settle_name(self, parent, raw_name):
        """Wait for an unlink of this name answered early (before the name is made again)."""
        task = self._unlinking.get((parent, raw_name))
        if task is not None:
            await asyncio.wait([task])

    async def drain_unlinks(self):
        """Wait until every unlink answered early has landed (a mount's stop)."""
        while self._unlinking:
            await asyncio.wait(list(self._unlinking.values()))

    async def _unlink_entry(self, parent, raw_name, entry, expect=None, touched=None):
        """The unlink itself (`entry`: as last read, or None). `expect`: the inode whose
        name this is; if the name has come to hold another, ours is gone already."""
        key = ENTRY_PREFIX + raw_name
        for _ in range(50):
            if entry is None:
                entry = (await self._lookup_entry(parent, raw_name, own=True))[2]
            ino, kind, intent = _unpack_entry(entry)
            if expect is not None and ino != expect:
                return
            if intent is not None:
                entry = None                    # caught mid-rename: look it up (finishes it)
                continue
            if kind == "d":
                raise fs_error(errno.EISDIR, _display(raw_name))
            attr = entry_attr(entry)
            if attr is None:                    # the inode lives elsewhere
                try:
                    await self._remove_entry(parent, raw_name, entry)
                except BlockingIOError:         # changed since it was read: read it again
                    entry = None
                    continue
                await self._unlink_inode(ino)
                return
            # Primary: the entry and the inode's record go in one update, then the data.
            try:
                await self.meta.omap_update(self.inode_object(parent),
                                            touched or self._touched(parent),
                                            remove=[key, embedded_home(ino)[1],
                                                    inline_key(ino)],
                                            equals={key: entry})
            except errors.ObjectNotFound:
                raise fs_error(errno.ENOENT, f"directory inode {parent:x}") from None
            except errors.PreconditionFailed as exc:
                self._forget_dir(parent)
                if not (exc.maybe_applied and
                        key not in await self._omap_get_quiet(parent, [key])):
                    entry = None                # changed since it was read: read it again
                    continue
            self._note(parent, key, None)
            self._meta_written = True
            await self._drop_data(ino, attr)
            return
        raise fs_error(errno.EAGAIN, f"{_display(raw_name)} kept changing")

    async def _attr_or_none(self, ino):
        try:
            return await self.getattr(ino)
        except FileNotFoundError:
            return None

    async def _remove_entry(self, parent, raw_name, packed):
        key = ENTRY_PREFIX + raw_name
        try:
            await self.meta.omap_update(self.inode_object(parent), self._touched(parent),
                                        remove=[key], equals={key: packed})
            self._note(parent, key, None)
        except errors.PreconditionFailed as exc:
            self._forget_dir(parent)
            found = await self.meta.omap_get(self.inode_object(parent), [key])
            if exc.maybe_applied and key not in found:
                return
            raise fs_error(errno.ENOENT if key not in found else errno.EAGAIN,
                           f"{_display(raw_name)} changed meanwhile") from None

    async def rmdir(self, parent, name):
        """Remove an empty directory (ENOTEMPTY, ENOTDIR)."""
        raw = _check_name(name)
        ino, kind, _, _ = await self._lookup_entry(parent, name, fresh=True)
        if kind != "d":
            raise fs_error(errno.ENOTDIR, _display(raw))
        if ino == ROOT_INO:
            raise fs_error(errno.EBUSY, "the root")
        await self.settle_dir(ino)
        await self._mark_dead(ino, raw)
        try:
            await self._remove_entry(parent, raw, _pack_entry(ino, kind))
        except OSError:
            await self.meta.omap_update(self.inode_object(ino), remove=[DEAD_KEY])
            raise
        await self._drop_directory(ino)

    async def _drop_directory(self, ino):
        """Delete a removed directory's object, unless inodes born in it that now live
        elsewhere keep their records there (then it stays, unnamed, until fsck finds it
        holds none)."""
        self._hints.pop(ino, None)
        try:
            records, _ = await self.meta.omap_list(self.inode_object(ino), None,
                                                   prefix=RECORD_PREFIX, limit=1)
        except errors.ObjectNotFound:
            return                              # gone already (its last record took it)
        if not records:
            try:
                await self.meta.delete(self.inode_object(ino), plain=True)
            except errors.ObjectNotFound:
                pass

    async def _drop_husk(self, home):
        """After a record left directory `home`: if that directory was removed and this was
        its last record, its object goes too (nothing can add a record to it any more)."""
        if DEAD_KEY in await self._omap_get_quiet(home, [DEAD_KEY]):
            await self._drop_directory(home)

    async def _mark_dead(self, ino, raw_name):
        try:
            await self.meta.omap_update(self.inode_object(ino), {DEAD_KEY: b"1"},
                                        empty=[ENTRY_PREFIX])
        except errors.PreconditionFailed:
            raise fs_error(errno.ENOTEMPTY, _display(raw_name)) from None
