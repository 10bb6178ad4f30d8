"""`cairn bench files`: small files through a mount (or the library): create, stat, read, ls and
unlink of N files, each phase timed apart.

    cairn bench files --mountpoint /mnt/c [--files 20000] [--size 64K] [--threads 16]
        [--dirs 1] [--fsync] [--json]
    cairn bench files --pool data --metadata-pool meta ...      # the library, no mount

Phases (file i lives in directory i % DIRS): create (exclusive create, write SIZE bytes,
[fsync,] close), stat, read (the whole file, checked against what was written), ls (each
directory listed with every entry's attributes, as `ls -l`, one thread), unlink. Through a
mount the kernel's caches are dropped before stat, read and ls (root only). Each phase gives
ops/s and the p50 and p99 of one op; wrong reads are counted. Through the library a close is
durable (as an fsync), so --fsync changes nothing there. Everything it makes is removed at the
end. Progress goes to stderr; with --json the last line of stdout is one JSON object.
"""

import argparse
import asyncio
import concurrent.futures
import hashlib
import json
import os
import sys
import time

from cairn.client.cluster import Cluster, run_loop
from cairn.client.fs import Filesystem
from cairn.common.units import parse_size

PHASES = ("create", "stat", "read", "ls", "unlink")


def add_parser(kinds):
    bench = kinds.add_parser(
        "files", help="small files through a mount or the library: create, stat, read, ls, "
                      "unlink", description=__doc__.split("\n\n")[2])
    bench.add_argument("--cluster", default=argparse.SUPPRESS,
                       help="cluster directory, cluster.json or HOST:PORT,... (library mode)")
    bench.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object on the last line")
    where = bench.add_mutually_exclusive_group(required=True)
    where.add_argument("--mountpoint", help="a cairn mount to work in")
    where.add_argument("--pool", help="the data pool, through the library (no mount)")
    bench.add_argument("--metadata-pool", help="with --pool: its metadata pool")
    bench.add_argument("--files", type=int, default=20_000, help="how many (default 20000)")
    bench.add_argument("--size", default="64K", help="bytes per file (default 64K)")
    bench.add_argument("--threads", type=int, default=16, help="ops in flight (default 16)")
    bench.add_argument("--dirs", type=int, default=1, help="directories (default 1)")
    bench.add_argument("--fsync", action="store_true", help="fsync each file before close")


def content(i, size):
    seed = hashlib.blake2b(b"%d" % i, digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


def summary(latencies, seconds, wrong=0, errors=0):
    ordered = sorted(latencies)

    def pick(q):
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3) \
            if ordered else None
    return {"ops": len(ordered), "seconds": round(seconds, 3),
            "ops_per_s": round(len(ordered) / seconds, 1) if seconds else None,
            "p50_ms": pick(0.50), "p99_ms": pick(0.99), "wrong": wrong, "errors": errors}


def _plan(args, *ops):
    """(phase, op, items, ops in flight) in order: ls one directory at a time, the others
    one file each, --threads at once."""
    for phase, op in zip(PHASES, ops):
        if phase == "ls":
            yield phase, op, range(args.dirs), 1
        else:
            yield phase, op, range(args.files), args.threads


def _per_entry(phase, result, files):
    """ls counts entries listed per second (its p50/p99 are of one directory's listing)."""
    if phase == "ls" and result["seconds"]:
        result["ops_per_s"] = round(files / result["seconds"], 1)
    return result


def say(message):
    print(f"bench files: {message}", file=sys.stderr, flush=True)


# -- through a mount: threads and system calls, as any program --------------------------------

def _drop_caches(top):
    fd = os.open(top, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        pass                            # not root: the kernel keeps what it has


def _mount_phases(args, top, size):
    paths = [os.path.join(top, f"d{i % args.dirs:04d}", f"f{i:08d}") for i in range(args.files)]
    for d in range(args.dirs):
        os.mkdir(os.path.join(top, f"d{d:04d}"))

    def create(i):
        fd = os.open(paths[i], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, content(i, size))
            if args.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def stat(i):
        if os.stat(paths[i]).st_size != size:
            return 1

    def read(i):
        with open(paths[i], "rb") as handle:
            return int(handle.read() != content(i, size))

    def ls(d):
        directory = os.path.join(top, f"d{d:04d}")
        with os.scandir(directory) as entries:
            return sum(int(entry.stat(follow_symlinks=False).st_size != size)
                       for entry in entries) if size else 0

    def unlink(i):
        os.unlink(paths[i])

    results = {}
    for phase, op, items, threads in _plan(args, create, stat, read, ls, unlink):
        if phase in ("stat", "read", "ls"):
            _drop_caches(top)
        results[phase] = _per_entry(phase, _threaded(op, items, threads), args.files)
        say(f"{phase}: {results[phase]['ops_per_s']} ops/s")
    return results


def _threaded(op, items, threads):
    latencies, wrong, errors = [], 0, 0

    def timed(i):
        started = time.perf_counter()
        try:
            bad = op(i)
        except OSError:
            return None, 0, 1
        return time.perf_counter() - started, bad or 0, 0
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for took, bad, failed in pool.map(timed, items):
            if took is not None:
                latencies.append(took)
            wrong += bad
            errors += failed
    return summary(latencies, time.perf_counter() - started, wrong, errors)


# -- through the library: one event loop, ops in flight --------------------------------------

async def _library_phases(args, size):
    cluster = await Cluster.connect(getattr(args, "cluster", None))
    try:
        fs = await Filesystem.open(cluster, args.pool, metadata_pool=args.metadata_pool)
        top = f"/cairn-bench-files-{os.getpid()}"
        await fs.makedirs(top)
        try:
            return await _library_run(fs, args, top, size)
        finally:
            await _library_remove(fs, top)
    finally:
        await cluster.close()


async def _library_run(fs, args, top, size):
    paths = [f"{top}/d{i % args.dirs:04d}/f{i:08d}" for i in range(args.files)]
    for d in range(args.dirs):
        await fs.mkdir_path(f"{top}/d{d:04d}")

    async def create(i):
        async with await fs.open_path(paths[i], "xb") as handle:
            await handle.write(content(i, size))

    async def stat(i):
        return int((await fs.stat(paths[i])).size != size)

    async def read(i):
        async with await fs.open_path(paths[i], "rb") as handle:
            return int(await handle.read() != content(i, size))

    async def ls(d):
        entries = await fs.scandir_attrs(f"{top}/d{d:04d}")
        return sum(int(attr.size != size) for _, _, attr in entries)

    async def unlink(i):
        await fs.unlink_path(paths[i])

    results = {}
    for phase, op, items, inflight in _plan(args, create, stat, read, ls, unlink):
        results[phase] = _per_entry(phase, await _in_flight(op, items, inflight), args.files)
        say(f"{phase}: {results[phase]['ops_per_s']} ops/s")
    return results


async def _in_flight(op, items, inflight):
    latencies, counts = [], {"wrong": 0, "errors": 0}
    queue = iter(items)

    async def worker():
        for i in queue:
            started = time.perf_counter()
            try:
                bad = await op(i)
            except OSError:
                counts["errors"] += 1
                continue
            latencies.append(time.perf_counter() - started)
            counts["wrong"] += bad or 0
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return summary(latencies, time.perf_counter() - started, counts["wrong"], counts["errors"])


async def _library_remove(fs, path):
    for name, _, kind in await fs.scandir(path):
        child = f"{path}/{name}"
        if kind == "d":
            await _library_remove(fs, child)
        else:
            await fs.unlink_path(child)
    await fs.rmdir_path(path)


def main(args):
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        print(f"cairn bench files: {exc}", file=sys.stderr)
        return 2
    if args.files < 1 or args.threads < 1 or args.dirs < 1 or args.dirs > args.files:
        print("cairn bench files: --files, --threads and --dirs are at least 1, and --dirs at "
              "most --files", file=sys.stderr)
        return 2
    say(f"{args.files} files of {size} bytes in {args.dirs} directories, {args.threads} "
        f"threads, {'through ' + args.mountpoint if args.mountpoint else 'the library'}")
    if args.mountpoint:
        if not os.path.ismount(args.mountpoint):
            print(f"cairn bench files: {args.mountpoint} is not a mount point", file=sys.stderr)
            return 2
        top = os.path.join(args.mountpoint, f"cairn-bench-files-{os.getpid()}")
        os.mkdir(top)
        try:
            results = _mount_phases(args, top, size)
        finally:
            _mount_remove(top)
    else:
        results = run_loop(_library_phases(args, size))
    report = {"files": args.files, "size": size, "threads": args.threads, "dirs": args.dirs,
              "fsync": args.fsync, "via": "mount" if args.mountpoint else "library",
              "phases": results}
    for phase in PHASES:
        r = results[phase]
        print(f"{phase:7s} {r['ops_per_s']:>10} ops/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} "
              f"ms  wrong {r['wrong']}  errors {r['errors']}")
    if getattr(args, "json", False):
        print(json.dumps(report))
    bad = any(results[phase]["wrong"] or results[phase]["errors"] for phase in PHASES)
    return 1 if bad else 0


def _mount_remove(top):
    for root, dirs, files in os.walk(top, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except FileNotFoundError:
                pass
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(top)
