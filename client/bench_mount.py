"""`cairn bench mount`: a mounted namespace against the object path, in the same run.

    cairn mount data /mnt/c --metadata-pool meta
    cairn bench mount --pool data --metadata-pool meta --mountpoint /mnt/c [--size 4G]
        [--files 20000] [--file-size 64K] [--writers 16] [--entries 100000] [--json]

1. A file of --size random bytes: `cairn put` of it and `cairn get` of it to /dev/null (the
   commands, timed whole), then `dd bs=4M conv=fsync` into the mount and `dd bs=4M` out of it
   (through the kernel's page cache), and the same with oflag=direct / iflag=direct (no page
   cache, as `fio --direct=1`); ratios mount / command. For reference, the library's own
   put_stream / get_stream in this process (no file written, no process start). The same file
   through fsspec (`cairn://`, 4 MiB writes, then a cold read by a new client). And the
   object layer's rate in the same run, the denominator of the streams' targets: `cairn bench
   cluster --op write --size 4M --concurrency 16` and `--op seq` (--bench-seconds each);
   ratios mount and fsspec / bench.
2. --files files of --file-size each created, written and closed through the mount by --writers
   threads, then read back; files/s, against `cairn bench cluster --op write --size
   FILE_SIZE --concurrency WRITERS` (puts/s) in the same run.
3. A directory of --entries empty files (made through the library, 64 at a time), then `ls`
   of it through the mount: seconds.

Everything it makes is removed at the end. Progress goes to stderr, results to stdout.
"""

import argparse
import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import time

from cairn.client.cluster import Cluster, run_loop
from cairn.client.fs import Filesystem
from cairn.common.units import parse_size

BENCH_DIR = "cairn-bench-mount"


def add_parser(kinds):
    bench = kinds.add_parser(
        "mount", help="a mounted namespace against the object path (same run)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    bench.add_argument("--cluster", default=argparse.SUPPRESS,
                       help="cluster directory, cluster.json or HOST:PORT,...")
    bench.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object on the last line")
    bench.add_argument("--pool", required=True, help="the mounted data pool")
    bench.add_argument("--metadata-pool", help="its metadata pool (as mounted)")
    bench.add_argument("--mountpoint", required=True)
    bench.add_argument("--size", default="4G", help="the large file (default 4G)")
    bench.add_argument("--files", type=int, default=20_000)
    bench.add_argument("--file-size", default="64K")
    bench.add_argument("--writers", type=int, default=16)
    bench.add_argument("--entries", type=int, default=100_000,
                       help="entries of the directory listed (0: skip)")
    bench.add_argument("--scratch", default="/var/tmp", help="where the source file is made")
    bench.add_argument("--bench-seconds", type=int, default=15,
                       help="seconds of each `cairn bench cluster` run (default 15)")


def say(message):
    print(f"bench mount: {message}", file=sys.stderr, flush=True)


def _dd(source, target, fsync, *flags):
    command = ["dd", f"if={source}", f"of={target}", "bs=4M", "status=none", *flags]
    if fsync:
        command.append("conv=fsync")
    began = time.monotonic()
    subprocess.run(command, check=True)
    return time.monotonic() - began


def _drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        pass                                # not root: the mount reads with keep_cache off


def _cli(args, *command):
    base = [sys.executable, "-m", "cairn.client.cli"]
    if args.cluster:
        base += ["--cluster", args.cluster]
    return subprocess.run(base + list(command), check=True, capture_output=True, text=True)


def main(args):
    size = parse_size(args.size)
    file_size = parse_size(args.file_size)
    mount_dir = os.path.join(args.mountpoint, BENCH_DIR)
    if not os.path.ismount(args.mountpoint):
        print(f"cairn bench mount: {args.mountpoint} is not mounted ('cairn mount {args.pool} "
              f"{args.mountpoint}' first)", file=sys.stderr)
        return 2
    os.makedirs(mount_dir, exist_ok=True)
    source = os.path.join(args.scratch, f"cairn-bench-mount-{os.getpid()}.bin")
    result = {"size_bytes": size}
    try:
        say(f"making {size} random bytes in {source}")
        with open(source, "wb") as handle:
            left = size
            while left:
                chunk = os.urandom(min(left, 8 << 20))
                handle.write(chunk)
                left -= len(chunk)
        # 1. Large file: object path, then the mount.
        name = f"{BENCH_DIR}-object"
        began = time.monotonic()
        _cli(args, "put", args.pool, name, source)
        put_s = time.monotonic() - began
        began = time.monotonic()
        _cli(args, "get", args.pool, name, "/dev/null")
        get_s = time.monotonic() - began
        _cli(args, "rm", args.pool, name)
        lib_put_s, lib_get_s = run_loop(_object_path(args, source))
        say(f"cairn put {size / put_s / 1e6:.0f} MB/s, get {size / get_s / 1e6:.0f} MB/s "
            f"(library: {size / lib_put_s / 1e6:.0f}, {size / lib_get_s / 1e6:.0f})")
        say(f"cairn bench cluster --op write and --op seq, 4M, 16 in flight, "
            f"{args.bench_seconds} s each")
        bench_write = _bench_cluster(args, "write", "4M", 16)
        bench_seq = _bench_cluster(args, "seq", "4M", 16, "--cleanup")
        fsspec_write_s, fsspec_read_s = _fsspec_stream(args, source)
        target = os.path.join(mount_dir, "large.bin")
        write_s = _dd(source, target, True)
        _drop_caches()
        read_s = _dd(target, "/dev/null", False)
        os.unlink(target)
        write_direct_s = _dd(source, target, True, "oflag=direct")
        _drop_caches()
        read_direct_s = _dd(target, "/dev/null", False, "iflag=direct")
        os.unlink(target)
        say(f"mount dd: write {size / write_s / 1e6:.0f} MB/s ({size / write_direct_s / 1e6:.0f} "
            f"direct), read {size / read_s / 1e6:.0f} MB/s ({size / read_direct_s / 1e6:.0f} "
            "direct)")

        def rate(seconds):
            return round(size / seconds / 1e6, 1)
        result.update(put_MBps=rate(put_s), get_MBps=rate(get_s),
                      library_put_MBps=rate(lib_put_s), library_get_MBps=rate(lib_get_s),
                      mount_write_MBps=rate(write_s), mount_read_MBps=rate(read_s),
                      mount_write_direct_MBps=rate(write_direct_s),
                      mount_read_direct_MBps=rate(read_direct_s),
                      write_ratio=round(put_s / write_s, 2), read_ratio=round(get_s / read_s, 2),
                      write_direct_ratio=round(put_s / write_direct_s, 2),
                      read_direct_ratio=round(get_s / read_direct_s, 2),
                      fsspec_write_MBps=rate(fsspec_write_s),
                      fsspec_read_MBps=rate(fsspec_read_s),
                      bench_write_MBps=bench_write["MBps"], bench_seq_MBps=bench_seq["MBps"])
        result.update(
            mount_write_vs_bench_write=round(result["mount_write_MBps"] / bench_write["MBps"], 2),
            mount_read_vs_bench_seq=round(result["mount_read_MBps"] / bench_seq["MBps"], 2),
            fsspec_write_vs_bench_write=round(result["fsspec_write_MBps"] / bench_write["MBps"],
                                              2),
            fsspec_read_vs_bench_seq=round(result["fsspec_read_MBps"] / bench_seq["MBps"], 2))
        say(f"against bench cluster ({bench_write['MBps']:.0f} MB/s write, "
            f"{bench_seq['MBps']:.0f} seq): mount write {result['mount_write_vs_bench_write']}, "
            f"read {result['mount_read_vs_bench_seq']}; fsspec write "
            f"{result['fsspec_write_vs_bench_write']}, read {result['fsspec_read_vs_bench_seq']}")
        os.unlink(source)
        # 2. Small files through the mount, and puts of the same size.
        result.update(_small_files(args, mount_dir, file_size))
        bench = _bench_cluster(args, "write", args.file_size, args.writers, "--cleanup")
        result["bench_put_iops"] = bench["iops"]
        result["small_write_ratio"] = round(result["small_write_files_per_s"] / bench["iops"], 2)
        say(f"cairn bench cluster --op write --size {args.file_size}: {bench['iops']:.0f} "
            f"puts/s")
        # 3. ls of a large directory.
        if args.entries:
            result.update(run_loop(_listing(args, mount_dir)))
    finally:
        if os.path.exists(source):
            os.unlink(source)
        say("removing what the benchmark made")
        run_loop(_remove(args))
    print(json.dumps(result) if args.json else
          "\n".join(f"{key}: {value}" for key, value in result.items()))
    return 0


def _bench_cluster(args, op, size, concurrency, *extra):
    """`cairn bench cluster`'s JSON for one op on the benchmark's pool."""
    output = _cli(args, "bench", "cluster", "--pool", args.pool, "--op", op, "--size", size,
                  "--concurrency", str(concurrency), "--seconds", str(args.bench_seconds),
                  "--json", *extra).stdout
    return json.loads(output.strip().splitlines()[-1])


def _fsspec_stream(args, source):
    """(write seconds, read seconds) of the file through `cairn://`: 4 MiB writes, close
    durable; then a cold read (a new client) in 4 MiB readinto calls."""
    from cairn.client.fsspec_fs import CairnFileSystem
    path = f"{args.pool}/{BENCH_DIR}/fsspec.bin"
    options = dict(cluster=args.cluster, metadata_pool=args.metadata_pool,
                   skip_instance_cache=True)
    chunk = bytearray(4 << 20)
    writer = CairnFileSystem(**options)
    try:
        with open(source, "rb", buffering=0) as handle:
            began = time.monotonic()
            with writer.open(path, "wb") as out:
                while count := handle.readinto(chunk):
                    out.write(memoryview(chunk)[:count])
            write_s = time.monotonic() - began
    finally:
        writer.close()
    reader = CairnFileSystem(**options)
    try:
        began = time.monotonic()
        with reader.open(path, "rb") as handle:
            while handle.readinto(chunk):
                pass
        read_s = time.monotonic() - began
        reader.rm(path)
    finally:
        reader.close()
    say(f"fsspec: write {os.path.getsize(source) / write_s / 1e6:.0f} MB/s, "
        f"read {os.path.getsize(source) / read_s / 1e6:.0f} MB/s")
    return write_s, read_s


async def _remove(args):
    """Delete the benchmark's directory through the library, 64 unlinks at a time (rm -rf
    through the mount goes one file at a time)."""
    async with await Cluster.connect(args.cluster) as cluster:
        fs = await Filesystem.open(cluster, args.pool, metadata_pool=args.metadata_pool)
        limit = asyncio.Semaphore(64)

        async def unlink(parent, name):
            async with limit:
                await fs.unlink(parent, name)

        async def remove(path):
            parent, _ = await fs.resolve(path)
            entries = await fs.scandir(path)
            await asyncio.gather(*(unlink(parent, name) for name, _, kind in entries
                                   if kind != "d"))
            for name, _, kind in entries:
                if kind == "d":
                    await remove(f"{path}/{name}")
            await fs.rmdir_path(path)
        if await fs.exists(f"/{BENCH_DIR}"):
            await remove(f"/{BENCH_DIR}")


async def _object_path(args, source):
    """(put seconds, get seconds) of the file through the client library."""
    name = f"{BENCH_DIR}-object"
    async with await Cluster.connect(args.cluster) as cluster:
        pool = cluster.pool(args.pool)
        with open(source, "rb") as handle:
            began = time.monotonic()
            await pool.put_stream(name, handle)
            put_s = time.monotonic() - began
        began = time.monotonic()
        async for _ in pool.get_stream(name):
            pass
        get_s = time.monotonic() - began
        await pool.delete(name)
    return put_s, get_s


def _small_files(args, mount_dir, file_size):
    payload = os.urandom(file_size)
    directories = [os.path.join(mount_dir, f"small-{w}") for w in range(args.writers)]
    for directory in directories:
        os.makedirs(directory, exist_ok=True)
    per_writer = -(-args.files // args.writers)

    def write(writer):
        for i in range(min(per_writer, args.files - writer * per_writer)):
            with open(os.path.join(directories[writer], f"f{i:06d}"), "wb") as handle:
                handle.write(payload)

    def read(writer):
        for i in range(min(per_writer, args.files - writer * per_writer)):
            with open(os.path.join(directories[writer], f"f{i:06d}"), "rb") as handle:
                assert handle.read() == payload
    say(f"{args.files} files of {file_size} bytes, {args.writers} writers")
    with concurrent.futures.ThreadPoolExecutor(args.writers) as pool:
        began = time.monotonic()
        list(pool.map(write, range(args.writers)))
        write_s = time.monotonic() - began
        _drop_caches()
        began = time.monotonic()
        list(pool.map(read, range(args.writers)))
        read_s = time.monotonic() - began
    say(f"small files: {args.files / write_s:.0f} created/s, {args.files / read_s:.0f} read/s")
    return {"small_files": args.files, "small_write_files_per_s": round(args.files / write_s),
            "small_read_files_per_s": round(args.files / read_s)}


async def _listing(args, mount_dir):
    async with await Cluster.connect(args.cluster) as cluster:
        fs = await Filesystem.open(cluster, args.pool, metadata_pool=args.metadata_pool)
        directory = await fs.makedirs(f"/{BENCH_DIR}/listing")
        limit = asyncio.Semaphore(64)
        made = 0

        async def create(index):
            nonlocal made
            async with limit:
                await fs.create(directory, f"entry-{index:07d}")
                made += 1
                if made % 10_000 == 0:
                    say(f"  {made} entries made")
        say(f"making a directory of {args.entries} entries")
        await asyncio.gather(*(create(i) for i in range(args.entries)))
    began = time.monotonic()
    listed = subprocess.run(["ls", os.path.join(mount_dir, "listing")], check=True,
                            capture_output=True, text=True).stdout.count("\n")
    ls_s = time.monotonic() - began
    say(f"ls of {listed} entries: {ls_s:.1f} s")
    return {"ls_entries": listed, "ls_s": round(ls_s, 2)}
