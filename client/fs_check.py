"""`cairn fsck POOL`: check a file namespace (client/fs.py) and repair it.

The check walks every directory from the root (finishing renames caught midway, as any reader
does), then lists the metadata pool's inode objects and the data pool's stripe objects, and
reports, as {"kind", "path", "ino", "object"}:

- dangling: an entry whose inode object is gone (repair: the entry is removed);
- kind: an entry whose kind differs from its inode's (repair: the entry is corrected);
- twice: a directory named by a second entry (repair: the later entry in the walk is
  removed);
- nlink: a file whose link count differs from the entries naming it (a link or unlink
  interrupted between its two steps; repair: the count set);
- parent: a directory whose parent pointer is not the directory that names it (repair: set);
- removing: a directory marked for removal that is still named (an rmdir interrupted; repair:
  finished if it is empty, the mark dropped otherwise);
- record: a file embedded in its entry whose record in the directory is missing or names
  another entry (repair: the record set);
- orphan_inode: an inode no entry names (a create or unlink interrupted, or an embedded
  inode's record left by one; repair: deleted with its data);
- orphan_data: a stripe object of no file, or past its file's end (repair: deleted).

Orphans younger than `grace_s` are left alone (not reported): a client may be creating them
right now.
"""

import dataclasses
import time

from cairn.client import errors
import msgpack

from cairn.client.fs_format import (ATTR_KEY, DEAD_KEY, ENTRY_PREFIX, RECORD_PREFIX, ROOT_INO,
                                    SIZE_KEY, STRIPE_BYTES, _pack_entry, decode_attr,
                                    embedded_home, is_embedded, record_ino)

GRACE_S_DEFAULT = 60.0


@dataclasses.dataclass
class FsckReport:
    directories: int = 0
    files: int = 0
    symlinks: int = 0
    special: int = 0                    # fifos, sockets, device nodes
    bytes: int = 0
    errors: list = dataclasses.field(default_factory=list)
    repaired: int = 0

    @property
    def clean(self):
        return not self.errors

    def to_dict(self):
        return dataclasses.asdict(self) | {"clean": self.clean}


async def check(fs, repair=False, grace_s=GRACE_S_DEFAULT, progress=None):
    """Check (and with `repair` mend) the namespace of Filesystem `fs`; an FsckReport."""
    report = FsckReport()
    seen = {ROOT_INO: "/"}              # ino -> path of the entry naming it
    links = {}                          # ino -> [entries naming it, its link count]
    files = {}                          # ino -> size
    queue = [(ROOT_INO, "/")]
    records = []                        # (directory, key, value) of records not yet accounted
    while queue:
        directory, path = queue.pop()
        report.directories += 1
        if progress is not None and report.directories % 100 == 0:
            progress(report)
        dead = (await fs.meta.omap_get(fs.inode_object(directory), [DEAD_KEY])).get(DEAD_KEY)
        if dead is not None and directory != ROOT_INO:
            await _interrupted_rmdir(fs, report, directory, path, repair)
            continue
        held = dict([pair async for pair in fs.meta.omap_items(fs.inode_object(directory),
                                                                prefix=RECORD_PREFIX)])
        after = None
        while True:
            entries, more = await fs.readdir_plus(directory, after)
            for name, ino, kind, attr in entries:
                child = path.rstrip("/") + "/" + name
                if attr is not None:
                    await _check_primary(fs, report, directory, name, ino, attr, child, seen,
                                         files, held, repair)
                    continue
                await _check_entry(fs, report, directory, name, ino, kind, child, seen, files,
                                   queue, repair, links)
            if not more:
                break
            after = entries[-1][0]
        records.extend((directory, key, value) for key, value in held.items())
    await _check_links(fs, report, links, seen, repair)
    await _check_records(fs, report, records, seen, grace_s, repair)
    await _check_orphans(fs, report, seen, files, grace_s, repair)
    return report


async def _check_links(fs, report, links, seen, repair):
    for ino, (named, counted) in links.items():
        if named == counted:
            continue
        _error(report, "nlink", seen.get(ino), ino, None)
        if repair:
            def fix(attr):
                attr["n"] = named
            try:
                await fs._set_attr(ino, fix)
                report.repaired += 1
            except FileNotFoundError:
                pass


async def _check_primary(fs, report, directory, name, ino, attr, path, seen, files, held,
                         repair):
    """An entry with its inode in it: its record, in the same directory, names it."""
    raw_name = name.encode(errors="surrogateescape")
    home, key = embedded_home(ino) if is_embedded(ino) else (None, None)
    if home != directory:
        _error(report, "record", path, ino, fs.inode_object(directory))
        return                              # not made by cairn: reported, left alone
    if held.pop(key, None) != msgpack.packb(raw_name):
        _error(report, "record", path, ino, fs.inode_object(directory))
        if repair:
            entry_key = ENTRY_PREFIX + raw_name
            await _conditional(fs.meta.omap_update(
                fs.inode_object(directory), {key: msgpack.packb(raw_name)},
                equals={entry_key: _pack_entry(ino, attr.kind, attr=attr)}), report)
    seen[ino] = path
    _count(report, files, ino, attr)


def _count(report, files, ino, attr):
    if attr.kind == "f":
        report.files += 1
        report.bytes += attr.size
        files[ino] = 0 if attr.inline else attr.size      # inline: no stripes
    elif attr.kind == "l":
        report.symlinks += 1
    else:
        report.special += 1


async def _check_records(fs, report, records, seen, grace_s, repair):
    """Records no entry accounted for: an inode living in its home's record that no entry
    names, or a record naming an entry that no longer holds its inode."""
    old_enough = time.time_ns() - int(grace_s * 1e9)
    for directory, key, value in records:
        ino = record_ino(directory, key)
        if ino in seen:
            continue                        # named by a remote entry (a rename moved it)
        attr = msgpack.unpackb(value)
        if isinstance(attr, dict) and attr.get("ct", 0) > old_enough:
            continue                        # maybe being renamed right now
        _error(report, "orphan_inode", None, ino, fs.inode_object(directory))
        if repair:
            if isinstance(attr, dict) and attr.get("t") == "f":
                await fs._drop_data(ino, attr)
            await _conditional(fs.meta.omap_update(fs.inode_object(directory), remove=[key],
                                                   equals={key: value}), report)


def _error(report, kind, path, ino=None, object_name=None):
    report.errors.append({"kind": kind, "path": path, "ino": f"{ino:x}" if ino else None,
                          "object": object_name})


async def _check_entry(fs, report, directory, name, ino, kind, path, seen, files, queue,
                       repair, links):
    key = ENTRY_PREFIX + name.encode(errors="surrogateescape")
    packed = _pack_entry(ino, kind)
    try:
        attr = await fs.getattr(ino)
    except FileNotFoundError:
        _error(report, "dangling", path, ino, fs.inode_object(ino))
        if repair:
            await _conditional(fs.meta.omap_update(fs.inode_object(directory), remove=[key],
                                                   equals={key: packed}), report)
        return
    if ino in seen and attr.kind != "d" and ino in links:
        links[ino][0] += 1                  # a hard link
        return
    if ino in seen:
        _error(report, "twice", path, ino, fs.inode_object(ino))
        if repair:
            await _conditional(fs.meta.omap_update(fs.inode_object(directory), remove=[key],
                                                   equals={key: packed}), report)
        return
    seen[ino] = path
    if attr.kind != "d":
        links[ino] = [1, attr.nlink]
    if attr.kind != kind:
        _error(report, "kind", path, ino, fs.inode_object(ino))
        if repair:
            await _conditional(fs.meta.omap_update(
                fs.inode_object(directory), {key: _pack_entry(ino, attr.kind)},
                equals={key: packed}), report)
    if attr.kind == "d":
        if attr.get("p") != directory:
            _error(report, "parent", path, ino, fs.inode_object(ino))
            if repair:
                def fix(record):
                    record["p"] = directory
                await fs._set_attr(ino, fix)
                report.repaired += 1
        queue.append((ino, path))
    else:
        _count(report, files, ino, attr)


async def _interrupted_rmdir(fs, report, directory, path, repair):
    _error(report, "removing", path, directory, fs.inode_object(directory))
    if not repair:
        return
    entries, _ = await fs.readdir(directory, limit=1)
    parent = (await fs.getattr(directory)).get("p", ROOT_INO)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if entries:
        await fs.meta.omap_update(fs.inode_object(directory), remove=[DEAD_KEY])
    else:
        key = ENTRY_PREFIX + name.encode(errors="surrogateescape")
        await _conditional(fs.meta.omap_update(fs.inode_object(parent), remove=[key],
                                               equals={key: _pack_entry(directory, "d")}),
                           report, count=False)
        await fs._drop_inode(directory, None)
    report.repaired += 1


async def _check_orphans(fs, report, seen, files, grace_s, repair):
    now_ns = time.time_ns()
    old_enough = now_ns - int(grace_s * 1e9)
    async for name in _names(fs.meta, fs.prefix + "i."):
        try:
            ino = int(name[len(fs.prefix) + 2:], 16)
        except ValueError:
            continue
        if ino in seen:
            continue
        try:
            attr = decode_attr(await fs.meta.omap_get(name, [ATTR_KEY, SIZE_KEY])) or {}
            held = [pair async for pair in fs.meta.omap_items(name, prefix=RECORD_PREFIX)]
        except errors.ObjectNotFound:
            continue                            # removed meanwhile
        if held:
            # A removed directory's object kept for the records of inodes born in it.
            await _check_records(fs, report, [(ino, key, value) for key, value in held], seen,
                                 grace_s, repair)
            continue
        if attr.get("ct", 0) > old_enough:
            continue                            # maybe being created right now
        _error(report, "orphan_inode", None, ino, name)
        if repair:
            await fs._drop_inode(ino, attr)
            report.repaired += 1
    async for name in _names(fs.data, fs.prefix + "f."):
        parts = name[len(fs.prefix):].split(".")
        try:
            ino, index = int(parts[1], 16), int(parts[2], 16)
        except (IndexError, ValueError):
            continue
        size = files.get(ino)
        if size is not None and index * STRIPE_BYTES < size:
            continue
        try:
            stat = await fs.data.stat(name)
        except errors.ObjectNotFound:
            continue
        if stat.mtime_ns > old_enough:
            continue                            # maybe being written right now
        _error(report, "orphan_data", seen.get(ino), ino, name)
        if repair:
            try:
                await fs.data.delete(name, plain=True)
            except errors.ObjectNotFound:
                pass
            report.repaired += 1


async def _names(pool, prefix):
    page = None
    while True:
        names, page = await pool.list(prefix=prefix, page=page, limit=1000)
        for name in names:
            yield name
        if page is None:
            return


async def _conditional(update, report, count=True):
    try:
        await update
    except errors.PreconditionFailed:
        return                                  # changed meanwhile: the next check sees it
    if count:
        report.repaired += 1
