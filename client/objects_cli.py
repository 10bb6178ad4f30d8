"""`cairn put|get|ls|rm|stat POOL NAME [FILE]`: objects from the command line.

- `put POOL NAME [FILE]` stores FILE (or standard input) as NAME, striped over 4 MiB objects when
  it is larger than one; progress goes to stderr for transfers over 64 MiB.
- `get POOL NAME [FILE]` writes the object to FILE (or standard output).
- `ls POOL [--prefix P]`, `rm POOL NAME`, `stat POOL NAME`.
All take --cluster and --json like every cluster command.
"""

import json
import os
import sys
import time

from cairn.client import errors
from cairn.client.admin import fail
from cairn.client.cluster import Cluster, run_loop as _run_loop
from cairn.common.monclient import ClusterNotFound
from cairn.common.units import format_size

PROGRESS_FROM_BYTES = 64 * 1024 * 1024
PROGRESS_EVERY_S = 1.0
COMMANDS = ("put", "get", "ls", "rm", "stat")


def add_parsers(commands, common):
    put = commands.add_parser("put", parents=[common], help="store a file (or stdin) as an object")
    put.add_argument("pool")
    put.add_argument("name")
    put.add_argument("file", nargs="?", help="default: standard input")
    get = commands.add_parser("get", parents=[common], help="read an object into a file (or "
                              "stdout)")
    get.add_argument("pool")
    get.add_argument("name")
    get.add_argument("file", nargs="?", help="default: standard output")
    listing = commands.add_parser("ls", parents=[common], help="list object names in a pool")
    listing.add_argument("pool")
    listing.add_argument("--prefix", default="")
    remove = commands.add_parser("rm", parents=[common], help="delete an object")
    remove.add_argument("pool")
    remove.add_argument("name")
    stat = commands.add_parser("stat", parents=[common], help="an object's size and version")
    stat.add_argument("pool")
    stat.add_argument("name")


class _Progress:
    def __init__(self, verb, total):
        self.verb = verb
        self.total = total
        self.started = time.monotonic()
        self.shown = self.started

    def __call__(self, done):
        now = time.monotonic()
        if self.total and self.total >= PROGRESS_FROM_BYTES and now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            rate = done / max(now - self.started, 1e-9)
            print(f"  {self.verb} {format_size(done)} of {format_size(self.total)} "
                  f"({rate / 1e6:.0f} MB/s)", file=sys.stderr, flush=True)


async def run(args):
    cluster = await Cluster.connect(args.cluster)
    try:
        pool = cluster.pool(args.pool)
        started = time.monotonic()
        if args.command == "put":
            source = open(args.file, "rb") if args.file else sys.stdin.buffer
            try:
                total = os.fstat(source.fileno()).st_size if args.file else 0
                size = await pool.put_stream(args.name, source,
                                             progress=_Progress("stored", total))
            finally:
                if args.file:
                    source.close()
            seconds = time.monotonic() - started
            return {"pool": args.pool, "name": args.name, "size": size,
                    "seconds": round(seconds, 3), "MBps": round(size / max(seconds, 1e-9) / 1e6, 1)}
        if args.command == "get":
            info = await pool.stat(args.name)
            sink = open(args.file, "wb") if args.file else sys.stdout.buffer
            progress = _Progress("read", info.size)
            done = 0
            try:
                async for chunk in pool.get_stream(args.name):
                    sink.write(chunk)
                    done += len(chunk)
                    progress(done)
            finally:
                if args.file:
                    sink.close()
                else:
                    sink.flush()
            seconds = time.monotonic() - started
            return {"pool": args.pool, "name": args.name, "size": done,
                    "seconds": round(seconds, 3), "MBps": round(done / max(seconds, 1e-9) / 1e6, 1)}
        if args.command == "ls":
            names, page = [], None
            while True:
                batch, page = await pool.list(args.prefix, page)
                names.extend(batch)
                if page is None:
                    break
            return {"pool": args.pool, "names": sorted(names)}
        if args.command == "rm":
            await pool.delete(args.name)
            return {"pool": args.pool, "name": args.name, "deleted": True}
        info = await pool.stat(args.name)
        return {"pool": args.pool, "name": info.name, "size": info.size,
                "version": info.version, "mtime_ns": info.mtime_ns, "striped": info.striped}
    finally:
        await cluster.close()


def main(args):
    try:
        result = _run_loop(run(args))
    except (errors.ObjectNotFound, errors.PoolNotFound) as exc:
        return fail(args, "not_found", str(exc), 1)
    except (errors.NoSpace, errors.PoolUnavailable, errors.ProtocolError) as exc:
        return fail(args, type(exc).__name__, str(exc), 1)
    except (errors.Timeout, ClusterNotFound) as exc:
        return fail(args, "unavailable", str(exc), 2)
    except OSError as exc:
        return fail(args, "os_error", f"{exc.filename or ''}: {exc.strerror or exc}", 2)
    if args.json:
        print(json.dumps(result))
    elif args.command == "ls":
        print("\n".join(result["names"]) if result["names"] else "(no objects)")
    elif args.command in ("put", "get"):
        verb = "stored" if args.command == "put" else "read"
        print(f"{verb} {args.pool}/{args.name}: {format_size(result['size'])} in "
              f"{result['seconds']:.2f} s ({result['MBps']:.0f} MB/s)",
              file=sys.stderr if args.command == "get" and not args.file else sys.stdout)
    elif args.command == "rm":
        print(f"deleted {args.pool}/{args.name}")
    else:
        print(f"{args.pool}/{result['name']}: {result['size']} bytes, version "
              f"{result['version']}{', striped' if result['striped'] else ''}")
    return 0
