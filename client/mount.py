"""`cairn mount POOL[/PATH] MOUNTPOINT`: the file namespace (client/fs.py) as a FUSE mount.

Through pyfuse3's low-level asyncio API on libfuse3: low-level, because the namespace already
has inode numbers (FUSE's root is inode 1, as ours is) and the kernel then talks to us in
inodes, not paths; asyncio, because the client library is asyncio, so the mount serves many
requests at once on one loop with no thread hand-offs.

    cairn mount data /mnt/ckpt --metadata-pool meta     # returns once mounted; serves in the
                                                         # background (log: --log FILE)
    cairn umount /mnt/ckpt                               # also after a SIGKILL of the mount

What the kernel is told: attributes and entries are valid for ATTR_TIMEOUT_S (so another
client's changes show within that time); close and fsync return once the data and the size are
durable on the cluster; errors are errno values (client/fs.py maps the library's). Ops wait and
retry within the client's op deadline while OSDs fail or monitors change leader, then EIO.
"""

import argparse
import asyncio
import errno
import logging
import os
import signal
import stat as stat_module
import subprocess
import sys
import time

from cairn.client import errors
from cairn.client.fs import Filesystem
from cairn.client.fs_cache import EntryCache
from cairn.client.fs_format import ROOT_INO, _as_oserror, prefix_argument, split_path

log = logging.getLogger("cairn.mount")

ATTR_TIMEOUT_S = 1.0
MOUNT_WAIT_S = 30.0
# On SIGTERM or SIGINT, requests in flight get this long to finish before they are cancelled.
STOP_GRACE_S = 3.0
# What the kernel reads ahead of a sequential reader (the mount's bdi read_ahead_kb): two
# FUSE reads of 1 MiB; the mount reads stripes ahead of them itself (fs_format.READ_AHEAD).
# Cold 1 GiB dd, 2026-11-28: 128 KiB 487-496 MB/s, 1-4 MiB 538-730, 16 MiB 471-561.
READ_AHEAD_KB = 2048
# Entries whose attributes one readdir page fetches at once.
READDIR_CONCURRENCY = 64


def _fuse():
    try:
        import pyfuse3
        import pyfuse3.asyncio
    except ImportError as exc:
        raise SystemExit(f"cairn mount needs pyfuse3 and libfuse3 ({exc}); run "
                         "cluster-scripts/setup.sh, which installs both") from None
    pyfuse3.asyncio.enable()
    return pyfuse3


def build_operations(pyfuse3):
    class Operations(pyfuse3.Operations):
        """The kernel's requests, carried out by a Filesystem."""

        def __init__(self, fs, root, read_only, mountpoint=None):
            super().__init__()
            self.mountpoint = mountpoint
            self.tuned = mountpoint is None
            self.fs = fs
            self.root = root                # the namespace inode mounted as FUSE's root
            self.read_only = read_only
            self._files = {}                # fh -> FileHandle
            self._dirs = {}                 # fh -> [ino, entries, more]
            self._next_fh = 1

        # -- helpers ------------------------------------------------------------------------

        def _ino(self, inode):
            return self.root if inode == pyfuse3.ROOT_INODE else inode

        def _kernel_ino(self, ino):
            return pyfuse3.ROOT_INODE if ino == self.root else ino

        def _attributes(self, ino, attr):
            entry = pyfuse3.EntryAttributes()
            entry.st_ino = self._kernel_ino(ino)
            entry.st_mode = attr.st_mode()
            entry.st_nlink = attr.nlink
            entry.st_uid = attr.get("u", 0)
            entry.st_gid = attr.get("g", 0)
            entry.st_size = attr.size if attr.kind != "d" else 0
            entry.st_mtime_ns = attr.get("mt", 0)
            entry.st_ctime_ns = attr.get("ct", 0)
            entry.st_atime_ns = attr.atime_ns
            entry.st_rdev = attr.get("r", 0)
            entry.st_blksize = 4 << 20
            entry.st_blocks = -(-entry.st_size // 512)
            entry.attr_timeout = entry.entry_timeout = ATTR_TIMEOUT_S
            return entry

        async def _entry(self, ino):
            return self._attributes(ino, await self.fs.getattr(ino))

        def _writable(self):
            if self.read_only:
                raise pyfuse3.FUSEError(errno.EROFS)

        def _handle(self, fh):
            return self._take(self._files, fh)

        def _take(self, table, value):
            fh = self._next_fh
            self._next_fh += 1
            table[fh] = value
            return fh

        # -- namespace ------------------------------------------------------------------------

        async def lookup(self, parent_inode, name, ctx=None):
            with _errno():
                if name == b".":
                    return await self._entry(self._ino(parent_inode))
                if name == b"..":
                    parent = (await self.fs.getattr(self._ino(parent_inode))).get("p", ROOT_INO)
                    return await self._entry(parent)
                ino, attr = await self.fs.lookup_attr(self._ino(parent_inode), name)
                return self._attributes(ino, attr)

        async def getattr(self, inode, ctx=None):
            with _errno():
                ino = self._ino(inode)
                cached = self.fs.cached_dir_attr(ino)
                if cached is not None:
                    # A directory this mount read or changed within the kernel's own
                    # attribute time, for no longer than is left of it (client/fs_cache.py).
                    entry = self._attributes(ino, cached[0])
                    entry.attr_timeout = cached[1]
                    return entry
                return await self._entry(ino)

        async def setattr(self, inode, attr, fields, fh, ctx):
            with _errno():
                ino = self._ino(inode)
                changes = {}
                if fields.update_mode:
                    changes["mode"] = stat_module.S_IMODE(attr.st_mode)
                if fields.update_uid:
                    changes["uid"] = attr.st_uid
                if fields.update_gid:
                    changes["gid"] = attr.st_gid
                if fields.update_size:
                    changes["size"] = attr.st_size
                if fields.update_mtime:
                    changes["mtime_ns"] = attr.st_mtime_ns
                if fields.update_atime:
                    changes["atime_ns"] = attr.st_atime_ns
                if changes:
                    self._writable()
                    await self.fs.setattr(ino, **changes)
                return await self._entry(ino)

        async def readlink(self, inode, ctx):
            with _errno():
                return os.fsencode(await self.fs.readlink(self._ino(inode)))

        async def opendir(self, inode, ctx):
            with _errno():
                ino = self._ino(inode)
                if not (await self.fs.getattr(ino)).is_dir:
                    raise OSError(errno.ENOTDIR, "not a directory")
                return self._take(self._dirs, [ino, [], True])

        async def readdir(self, fh, start_id, token):
            with _errno():
                state = self._dirs[fh]
                ino, entries, _ = state
                index = start_id
                while True:
                    while index >= len(entries) and state[2]:
                        after = entries[-1][0] if entries else None
                        page, state[2] = await self.fs.readdir_plus(ino, after)
                        entries.extend(await self._with_attributes(page))
                    if index >= len(entries):
                        return
                    name, attributes = entries[index]
                    if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes,
                                                 index + 1):
                        return
                    index += 1

        async def _with_attributes(self, page):
            """[(name, EntryAttributes)] of a readdir page: the kernel keeps the attributes
            it is given (readdirplus), so they are the real ones: those of inodes embedded in
            their entries came with the page, the others are fetched in parallel."""
            limit = asyncio.Semaphore(READDIR_CONCURRENCY)

            async def one(name, ino, attr):
                if attr is not None:
                    return name, self._attributes(ino, attr)
                async with limit:
                    try:
                        return name, await self._entry(ino)
                    except FileNotFoundError:
                        return None                     # removed meanwhile
            found = await asyncio.gather(*(one(name, ino, attr) for name, ino, _, attr in page))
            return [item for item in found if item is not None]

        async def fsyncdir(self, fh, datasync):
            with _errno():
                handle = self._dirs.get(fh)
                if handle is not None:
                    await self.fs.settle_dir(handle[0], report=True)

        async def releasedir(self, fh):
            self._dirs.pop(fh, None)

        async def mkdir(self, parent_inode, name, mode, ctx):
            self._writable()
            with _errno():
                ino, attr = await self.fs.mkdir_attr(self._ino(parent_inode), name,
                                                     mode & ~ctx.umask, ctx.uid, ctx.gid)
                return self._attributes(ino, attr)

        async def rmdir(self, parent_inode, name, ctx):
            self._writable()
            with _errno():
                await self.fs.rmdir(self._ino(parent_inode), name)

        async def unlink(self, parent_inode, name, ctx):
            self._writable()
            with _errno():
                await self.fs.unlink(self._ino(parent_inode), name)

        async def symlink(self, parent_inode, name, target, ctx):
            self._writable()
            with _errno():
                ino = await self.fs.symlink(self._ino(parent_inode), name, target, ctx.uid,
                                            ctx.gid)
                return await self._entry(ino)

        async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                         ctx):
            self._writable()
            if flags & pyfuse3.RENAME_EXCHANGE:
                raise pyfuse3.FUSEError(errno.EINVAL)
            with _errno():
                await self.fs.rename(self._ino(parent_inode_old), name_old,
                                     self._ino(parent_inode_new), name_new,
                                     replace=not flags & pyfuse3.RENAME_NOREPLACE)

        async def link(self, inode, new_parent_inode, new_name, ctx):
            self._writable()
            with _errno():
                ino = self._ino(inode)
                attr = await self.fs.link(ino, self._ino(new_parent_inode), new_name)
                return self._attributes(ino, attr)

        async def mknod(self, parent_inode, name, mode, rdev, ctx):
            self._writable()
            with _errno():
                ino, attr = await self.fs.mknod(self._ino(parent_inode), name,
                                                mode & ~ctx.umask, rdev, ctx.uid, ctx.gid)
                return self._attributes(ino, attr)

        # -- files --------------------------------------------------------------------------

        async def open(self, inode, flags, ctx):
            if not self.tuned:              # after the kernel's INIT, which sets its own
                self.tuned = True
                _tune_readahead(self.mountpoint)
            writable = flags & os.O_ACCMODE != os.O_RDONLY
            if writable or flags & os.O_TRUNC:
                self._writable()
            with _errno():
                handle = await self.fs.open_file(self._ino(inode), writable,
                                                 truncate=bool(flags & os.O_TRUNC))
                return pyfuse3.FileInfo(fh=self._handle(handle))

        async def create(self, parent_inode, name, mode, flags, ctx):
            self._writable()
            with _errno():
                parent = self._ino(parent_inode)
                try:
                    ino, attr = await self.fs.create_attr(parent, name, mode & ~ctx.umask,
                                                          ctx.uid, ctx.gid)
                    handle = await self.fs.open_file(ino, writable=True, attr=attr)
                except FileExistsError:
                    if flags & os.O_EXCL:
                        raise
                    # Made by another client since our lookup said absent: open it, as
                    # open(O_CREAT) without O_EXCL does.
                    ino, attr = await self.fs.lookup_attr(parent, name)
                    if attr.kind != "f":
                        raise
                    handle = await self.fs.open_file(ino, writable=True,
                                                     truncate=bool(flags & os.O_TRUNC))
                    attr = await self.fs.getattr(ino)
                return pyfuse3.FileInfo(fh=self._handle(handle)), self._attributes(ino, attr)

        async def read(self, fh, off, size):
            with _errno():
                return await self._files[fh].read_buffer(size, off)

        async def write(self, fh, off, buf):
            with _errno():
                return await self._files[fh].write(buf, off)

        async def flush(self, fh):
            with _errno():
                handle = self._files.get(fh)
                if handle is not None and handle.writable:
                    await handle.flush()

        async def fsync(self, fh, datasync):
            await self.flush(fh)

        async def release(self, fh):
            handle = self._files.pop(fh, None)
            if handle is not None:
                with _errno():
                    await handle.close()

        async def statfs(self, ctx):
            result = pyfuse3.StatvfsData()
            result.f_bsize = result.f_frsize = 4096
            total = free = 0
            for osd in self.fs.cluster.map.osds.values():
                capacity = osd.get("capacity") or {}
                total += capacity.get("total_bytes", 0)
                free += capacity.get("free_bytes", 0)
            result.f_blocks = total // 4096
            result.f_bfree = result.f_bavail = free // 4096
            result.f_files, result.f_ffree = 1 << 40, 1 << 40
            result.f_favail = result.f_ffree
            result.f_namemax = 255
            return result

        async def forget(self, inode_list):
            pass

    return Operations


class _errno:
    """Turns errors of the namespace into FUSEError(errno) for the kernel."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, traceback):
        if exc is None:
            return False
        import pyfuse3
        if isinstance(exc, pyfuse3.FUSEError):
            return False
        if isinstance(exc, (OSError, errors.ClientError)):
            code = _as_oserror(exc).errno or errno.EIO
            if code == errno.EIO:
                log.warning("EIO: %s", exc)
            raise pyfuse3.FUSEError(code) from None
        log.exception("unexpected error in a FUSE request")
        raise pyfuse3.FUSEError(errno.EIO) from None


# -- the command ----------------------------------------------------------------------------------

def add_parsers(commands, common):
    mount = commands.add_parser(
        "mount", parents=[common], help="mount a pool's file namespace with FUSE",
        description="Mount POOL (its files' data) at MOUNTPOINT. Directories live in "
                    "--metadata-pool (a replicated pool; default: POOL itself). Returns once "
                    "the mount is ready and keeps serving in the background; 'cairn umount "
                    "MOUNTPOINT' ends it.")
    mount.add_argument("source", metavar="POOL[/PATH]",
                       help="the data pool, and optionally a directory in it to mount")
    mount.add_argument("mountpoint")
    mount.add_argument("--metadata-pool", help="replicated pool holding the directories")
    mount.add_argument("--prefix", default="", type=prefix_argument, metavar="PATH", help="the namespace whose "
                       "objects are named under PATH (ending in '/'; a tree of its own, as a "
                       "subvolume): a key with prefix=PATH caps on both pools mounts only "
                       "that (default: the pool's main namespace)")
    mount.add_argument("--read-only", action="store_true", help="refuse writes (EROFS)")
    mount.add_argument("--foreground", action="store_true",
                       help="serve in this process until unmounted or interrupted")
    mount.add_argument("--op-timeout", type=float, default=None, metavar="S",
                       help="how long an op waits and retries while OSDs or monitors fail "
                       "before it answers EIO (default: the client library's, 30 s)")
    mount.add_argument("--log", help="where a background mount logs (default: "
                       "/tmp/cairn-mount-<mountpoint>.log)")
    umount = commands.add_parser("umount", parents=[common],
                                 help="unmount a cairn mount (also one whose process died)")
    umount.add_argument("mountpoint")


COMMANDS = ("mount", "umount")


def main(args):
    if args.command == "umount":
        return umount(args.mountpoint)
    mountpoint = os.path.abspath(args.mountpoint)
    if not os.path.isdir(mountpoint):
        print(f"cairn mount: mount point {mountpoint} does not exist (or is not a directory); "
              f"make it with 'mkdir -p {mountpoint}'", file=sys.stderr)
        return 2
    if os.path.ismount(mountpoint) or _stale(mountpoint):
        print(f"cairn mount: {mountpoint} is already a mount point; unmount it first "
              f"('cairn umount {mountpoint}')", file=sys.stderr)
        return 2
    if args.foreground:
        return _serve(args, mountpoint)
    return _background(args, mountpoint)


def _stale(path):
    try:
        os.stat(path)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOTCONN


def _background(args, mountpoint):
    log_path = args.log or f"/tmp/cairn-mount-{mountpoint.strip('/').replace('/', '-')}.log"
    command = [sys.executable, "-m", "cairn.client.cli"]
    if args.cluster:
        command += ["--cluster", args.cluster]
    command += ["mount", args.source, mountpoint, "--foreground"]
    if args.metadata_pool:
        command += ["--metadata-pool", args.metadata_pool]
    if args.prefix:
        command += ["--prefix", args.prefix]
    if args.read_only:
        command.append("--read-only")
    if args.op_timeout is not None:
        command += ["--op-timeout", str(args.op_timeout)]
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                 stderr=log_file, start_new_session=True)
    deadline = time.monotonic() + MOUNT_WAIT_S
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            print(f"mounted {args.source} at {mountpoint} (pid {child.pid}, log {log_path}); "
                  f"unmount with 'cairn umount {mountpoint}'")
            return 0
        if child.poll() is not None:
            tail = _tail(log_path)
            print(f"cairn mount: the mount process exited ({child.returncode}): {tail}",
                  file=sys.stderr)
            return 1
        time.sleep(0.05)
    child.terminate()
    print(f"cairn mount: {mountpoint} not mounted within {MOUNT_WAIT_S:g} s; see {log_path}",
          file=sys.stderr)
    return 1


def _tail(path):
    try:
        with open(path, "rb") as handle:
            lines = handle.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"
    except OSError:
        return "(no log)"


def _serve(args, mountpoint):
    pyfuse3 = _fuse()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from cairn.client.cluster import Cluster, new_event_loop
    pool, _, path = args.source.partition("/")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)

    async def run():
        options = {"op_timeout_s": args.op_timeout} if args.op_timeout else {}
        cluster = await Cluster.connect(args.cluster, **options)
        try:
            fs = await Filesystem.open(cluster, pool, metadata_pool=args.metadata_pool,
                                       prefix=args.prefix)
            fs.purge_in_background = fs.unlink_in_background = True
            fs.entry_cache = EntryCache(ATTR_TIMEOUT_S)
            root = ROOT_INO
            if split_path(path):
                root, kind = await fs.resolve(path)
                if kind != "d":
                    raise OSError(errno.ENOTDIR, f"{path} is not a directory")
            operations = build_operations(pyfuse3)(fs, root, args.read_only, mountpoint)
            options = set(pyfuse3.default_options)
            options |= {"fsname=cairn", f"subtype={pool}"}
            if args.read_only:
                options.add("ro")
            if os.geteuid() == 0:
                options.add("allow_other")
            pyfuse3.init(operations, mountpoint, options)
            stop = asyncio.get_running_loop().create_future()
            for signum in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(
                    signum, lambda: stop.done() or stop.set_result(None))
            log.info("serving %s at %s", args.source, mountpoint)
            serving = asyncio.ensure_future(pyfuse3.main())
            await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                # Requests still running get STOP_GRACE_S to finish, then are cancelled: a
                # stop never waits on whatever is in flight (a cluster that does not answer).
                pyfuse3.terminate()
                done, _ = await asyncio.wait([serving], timeout=STOP_GRACE_S)
                if not done:
                    log.warning("stopping with requests still in flight: they are cancelled")
                    serving.cancel()
                    await asyncio.wait([serving])
            pyfuse3.close(unmount=True)
            # Unlinks answered but not landed, then removed files' stripes still being
            # deleted, get the same grace (then the files stay, or fsck finds the stripes).
            for drain in (fs.drain_unlinks, fs.drain_purges):
                await asyncio.wait([asyncio.ensure_future(drain())], timeout=STOP_GRACE_S)
            log.info("stopped: %d unlinks answered before they landed, %d of them failed, %d "
                     "not landed", fs.unlinks_early, fs.unlinks_early_failed, len(fs._unlinking))
        finally:
            await cluster.close()
    try:
        loop.run_until_complete(run())
    except (OSError, errors.ClientError) as exc:
        print(f"cairn mount: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    return 0


def _tune_readahead(mountpoint):
    """Let the kernel read ahead READ_AHEAD_KB of a file being read in order (its default,
    128 KiB, makes a sequential reader wait on one small request after another). Root only;
    without it reads still work, slower."""
    # Not os.stat(mountpoint): that would be a FUSE request to this process, which does not
    # serve yet. /proc/self/mountinfo names the mount's device.
    device = None
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                if fields[4] == mountpoint:
                    device = fields[2]
    except OSError:
        pass
    if device is None:
        return
    path = f"/sys/class/bdi/{device}/read_ahead_kb"
    try:
        with open(path, "w") as handle:
            handle.write(f"{READ_AHEAD_KB}\n")
    except OSError as exc:
        log.info("read-ahead left at the kernel's default (%s)", exc)


def umount(mountpoint):
    mountpoint = os.path.abspath(mountpoint)
    if not (os.path.ismount(mountpoint) or _stale(mountpoint)):
        print(f"cairn umount: {mountpoint} is not mounted", file=sys.stderr)
        return 2
    for command in (["fusermount3", "-u", mountpoint], ["umount", mountpoint],
                    ["fusermount3", "-uz", mountpoint]):
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if result.returncode == 0:
            print(f"unmounted {mountpoint}")
            return 0
    print(f"cairn umount: could not unmount {mountpoint} (busy? close the files open in it "
          "and retry)", file=sys.stderr)
    return 1


def parse(argv):
    """For running this module alone (tests): `python -m cairn.client.mount ARGS`."""
    parser = argparse.ArgumentParser(prog="cairn-mount")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cluster")
    add_parsers(commands, common)
    return parser.parse_args(argv)
