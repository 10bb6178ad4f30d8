"""The file namespace by path (client/fs.py's `Filesystem`): resolve, stat, list, make,
remove, rename and open by a path from the root.
"""

import asyncio
import errno

from cairn.client.fs_format import ROOT_INO, fs_error, split_path


class PathOps:
    """Path operations, a part of `Filesystem` (client/fs.py): each resolves its path and
    calls the inode operation."""

    async def resolve(self, path, follow=True, depth=0):
        """(ino, kind) of a path from the root; symlinks followed in directories and, with
        `follow`, at the end."""
        return (await self._resolve_path(path, follow, depth))[:2]

    async def _resolve_path(self, path, follow=True, depth=0):
        """As resolve, with the last name's Attr when its entry held the inode (else None)."""
        ino, kind, attr = ROOT_INO, "d", None
        names = split_path(path)
        for index, name in enumerate(names):
            if name == "..":
                ino, kind, attr = (await self.getattr(ino)).get("p", ROOT_INO), "d", None
                continue
            if kind != "d":
                raise fs_error(errno.ENOTDIR, path)
            ino, kind, _, attr = await self._lookup_entry(ino, name)
            if kind == "l" and (follow or index < len(names) - 1):
                if depth > 40:
                    raise fs_error(errno.ELOOP, path)
                target = await self.readlink(ino)
                rest = "/".join(names[index + 1:])
                base = "/".join(names[:index]) if not target.startswith("/") else ""
                return await self._resolve_path(f"{base}/{target}/{rest}", follow, depth + 1)
        return ino, kind, attr

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
        return [entry[:3] for entry in await self._scan(path)]

    async def scandir_attrs(self, path="/"):
        """[(name, ino, Attr)] of a directory (entries removed meanwhile left out)."""
        entries = await self._scan(path)

        async def one(ino, attr):
            try:
                return attr if attr is not None else await self.getattr(ino)
            except FileNotFoundError:
                return None
        out = []
        for start in range(0, len(entries), 64):
            batch = entries[start:start + 64]
            attrs = await asyncio.gather(*(one(ino, attr) for _, ino, _, attr in batch))
            out.extend((name, ino, attr) for (name, ino, _, _), attr in zip(batch, attrs)
                       if attr is not None)
        return out

    async def _scan(self, path):
        ino, kind = await self.resolve(path)
        if kind != "d":
            raise fs_error(errno.ENOTDIR, path)
        out, after = [], None
        while True:
            entries, more = await self.readdir_plus(ino, after)
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
        ino, kind, attr = await self._resolve_path(path)
        if self.entry_cache is not None or kind != "f":
            attr = None                     # maybe a cached page: open reads it fresh
        # else the lookup just read the attributes: the open needs no read of its own
        return await self.open_file(ino, writable=writable, attr=attr)
