"""The file namespace's format on objects (see client/fs.py for the layout it serves): object
names of inodes and stripes, the omap keys of an inode, directory entries, attributes, name and
prefix checks, and the errors the namespace raises (OSError with an errno).

Pure: no I/O; client/fs.py (directories and renames), client/fs_file.py (a file's bytes),
client/fs_check.py (fsck) and client/mount.py all read the format from here.
"""

import errno
import os
import stat as stat_module

import msgpack

from cairn.client import errors

ROOT_INO = 1
STRIPE_BYTES = 4 << 20
ATTR_KEY = b"\x00a"
SIZE_KEY = b"\x00s"
DIR_KEY = b"\x00D"
DEAD_KEY = b"\x00d"
# A directory's mtime and ctime as the last change of its entries set them: msgpack [mt, ct],
# written blind in the same update as the change (no read, and grouped updates keep the last).
DIR_TIMES_KEY = b"\x00t"
ENTRY_PREFIX = b"\x01"
# An embedded inode's record in its home directory: RECORD_PREFIX + its slot (4 bytes).
RECORD_PREFIX = b"\x02"
# A small file's bytes (attribute "i" set): INLINE_PREFIX + its slot, beside its record, so
# entries (listed and cached by every lookup) stay small.
INLINE_PREFIX = b"\x03"
# Inode numbers. A file, symlink or special file made in a directory whose number is below
# DIR_INO_LIMIT lives in that directory's object (embedded): its number is EMBED_BIT | home
# directory << 32 | slot. Directories (and inodes made before this layout) are objects of
# their own, numbered below EMBED_BIT (new directories below DIR_INO_LIMIT).
EMBED_BIT = 1 << 63
DIR_INO_LIMIT = 1 << 31
NAME_BYTES_MAX = 255
SYMLINK_BYTES_MAX = 4096
# A rename intent younger than this may still be in progress: readers wait for it.
INTENT_SETTLE_S = 5.0
# Stripe objects in flight per open file while writing back, and read ahead while reading.
WRITE_BEHIND = 8
READ_AHEAD = 4
# A reader asking for several stripes at once (DCP's torch.load of a whole tensor record, a
# library reader) streams records: as many stripes as its read, up to this many, are read
# ahead of it, so the next record arrives while the caller works on this one.
READ_AHEAD_MAX = 16
# Dirty stripes one open file holds before writing them back.
DIRTY_STRIPES_MAX = 16
# A file being written makes its size durable at least this often (so a crash loses at most
# this much of a long write, and fsck's grace period never takes its stripes for orphans).
FLUSH_INTERVAL_S = 20.0
LIST_PAGE = 1000
# A file of at most this many bytes keeps them in its home directory's object (attribute "i";
# the bytes under inline_key) when its inode is embedded there: a 4 KiB file is written with
# its size in one update, read with its attributes in one op, and removed with its entry. Past
# it the bytes go to stripes (the flush that makes the file longer drops "i" and the key, after
# stripe 0 is durable).
INLINE_BYTES_MAX = 4096
PREFIX_BYTES_MAX = 512
# The largest file: writes and truncates past it fail with EFBIG (as CephFS's max_file_size).
# 4 PiB, 2**30 stripes; a file costs what it holds, not its size (see STRIPES_BY_INDEX_MAX).
FILE_BYTES_MAX = 1 << 52
# A truncate or unlink deletes up to this many stripes one by one; past it, it lists the
# stripes the file holds (one listing per PG of the data pool) and deletes only those, so
# removing a sparse 1 PiB file costs its few stripes, not 268 million deletes.
STRIPES_BY_INDEX_MAX = 256


def inode_object(ino, prefix=""):
    return f"{prefix}i.{ino:016x}"


def is_embedded(ino):
    return ino >= EMBED_BIT


def embedded_ino(home, slot):
    return EMBED_BIT | home << 32 | slot


def _slot(ino):
    """An embedded inode's slot in its home directory, as the 4 bytes its keys end with."""
    return (ino & 0xFFFFFFFF).to_bytes(4, "big")


def embedded_home(ino):
    """(home directory, record key) of an embedded inode."""
    return (ino >> 32) & (DIR_INO_LIMIT - 1), RECORD_PREFIX + _slot(ino)


def inline_key(ino):
    """The key of an embedded file's bytes in its home directory (shorter than its size:
    zeros follow; absent: empty)."""
    return INLINE_PREFIX + _slot(ino)


def record_ino(home, key):
    """The inode number of record `key` of directory `home`."""
    return embedded_ino(home, int.from_bytes(key[len(RECORD_PREFIX):], "big"))


def stripe_object(ino, index, prefix=""):
    return f"{prefix}f.{ino:016x}.{index:x}"


def stripe_prefix(ino, prefix=""):
    """What every stripe object name of inode `ino` starts with."""
    return f"{prefix}f.{ino:016x}."


def check_file_size(size, what):
    """EFBIG when a file would end past FILE_BYTES_MAX."""
    if size > FILE_BYTES_MAX:
        raise fs_error(errno.EFBIG, f"{what} would end at byte {size}, past the largest file "
                       f"({FILE_BYTES_MAX} bytes, 4 PiB)")


def check_prefix(prefix):
    """A namespace's object-name prefix: '' or text ending in '/' (ValueError otherwise)."""
    if not isinstance(prefix, str) or (prefix and not prefix.endswith("/")) or \
            "\x00" in prefix or len(prefix.encode()) > PREFIX_BYTES_MAX:
        raise ValueError(f"a namespace prefix is empty or ends with '/', at most "
                         f"{PREFIX_BYTES_MAX} bytes (was {prefix!r})")
    return prefix


def prefix_argument(text):
    """argparse type of --prefix: a valid namespace prefix ('team-a' means 'team-a/')."""
    import argparse
    if text and not text.endswith("/"):
        text += "/"
    try:
        return check_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fs_error(code, what):
    return OSError(code, f"{os.strerror(code)}: {what}")


def _check_name(name):
    raw = name.encode() if isinstance(name, str) else bytes(name)
    if not raw or raw in (b".", b"..") or b"/" in raw or b"\x00" in raw:
        raise fs_error(errno.EINVAL, f"bad file name {name!r}")
    if len(raw) > NAME_BYTES_MAX:
        raise fs_error(errno.ENAMETOOLONG, f"{len(raw)}-byte name {name!r}")
    return raw


def split_path(path):
    """The names of an absolute or relative path ('/a/b' -> ['a', 'b'])."""
    return [part for part in path.split("/") if part and part != "."]


class Attr(dict):
    """An inode's attributes (the msgpack record), with friendlier names."""

    @property
    def kind(self):
        return self["t"]

    @property
    def size(self):
        return self.get("s", 0)

    @property
    def inline(self):
        """Whether the file's bytes are in its home directory (inline_key), not in stripes."""
        return bool(self.get("i"))

    @property
    def is_dir(self):
        return self["t"] == "d"

    @property
    def nlink(self):
        """Names the inode has (a directory: 1, as btrfs says "not counted")."""
        return 1 if self["t"] == "d" else self.get("n", 1)

    @property
    def atime_ns(self):
        return self.get("at", self.get("mt", 0))

    def st_mode(self):
        return KIND_TYPES[self["t"]] | (self.get("m", 0) & 0o7777)


# Inode kinds and their S_IF* types: f file, d directory, l symlink, and the special files
# (no data; the kernel serves their opens): p fifo, s socket, c and b device nodes (attr "r":
# the device number).
KIND_TYPES = {"f": stat_module.S_IFREG, "d": stat_module.S_IFDIR, "l": stat_module.S_IFLNK,
              "p": stat_module.S_IFIFO, "s": stat_module.S_IFSOCK, "c": stat_module.S_IFCHR,
              "b": stat_module.S_IFBLK}
SPECIAL_KINDS = {stat_module.S_IFIFO: "p", stat_module.S_IFSOCK: "s",
                 stat_module.S_IFCHR: "c", stat_module.S_IFBLK: "b"}


def decode_attr(found):
    """The Attr of an inode from its omap entries {ATTR_KEY, SIZE_KEY, DIR_TIMES_KEY} (None:
    no inode)."""
    raw = found.get(ATTR_KEY)
    if raw is None:
        return None
    attr = Attr(msgpack.unpackb(raw))
    sized = found.get(SIZE_KEY)
    if sized is not None:
        attr["s"], attr["mt"] = msgpack.unpackb(sized)
        attr["ct"] = max(attr.get("ct", 0), attr["mt"])        # a write changes both
    times = found.get(DIR_TIMES_KEY)
    if times is not None:
        attr["mt"], attr["ct"] = msgpack.unpackb(times)
    return attr


def _pack_entry(ino, kind, intent=None, attr=None):
    """An entry: [ino, kind], a rename's intent third; a primary entry (the inode embedded
    in it) carries its attributes fourth, and never an intent."""
    if attr is not None:
        return msgpack.packb([ino, kind, None, dict(attr)])
    return msgpack.packb([ino, kind] + ([intent] if intent is not None else []))


def _unpack_entry(raw):
    fields = msgpack.unpackb(raw)
    return fields[0], fields[1], (fields[2] if len(fields) > 2 else None)


def entry_attr(raw):
    """The Attr a primary entry carries (None: the inode lives elsewhere)."""
    fields = msgpack.unpackb(raw)
    return Attr(fields[3]) if len(fields) > 3 and fields[3] is not None else None


def _as_oserror(exc):
    """A client error as the errno a file system gives."""
    if isinstance(exc, OSError):
        return exc
    code = {errors.NoSpace: errno.ENOSPC, errors.QuotaExceeded: errno.EDQUOT,
            errors.ObjectNotFound: errno.ENOENT, errors.Timeout: errno.EIO,
            errors.PoolUnavailable: errno.EIO, errors.DataUnavailable: errno.EIO,
            errors.Unsupported: errno.EOPNOTSUPP,
            errors.PermissionDenied: errno.EACCES}.get(type(exc), errno.EIO)
    return OSError(code, f"{os.strerror(code)}: {exc}")


def _display(raw):
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
