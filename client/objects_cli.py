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
COMMANDS = ("put", "get", "ls", "rm", "stat", "pg")


def _path_or_std(text):
    """A file argument: "-" means standard input or output, as for most Unix tools."""
    return None if text == "-" else text


def add_parsers(commands, common):
    put = commands.add_parser("put", parents=[common], help="store a file (or stdin) as an object")
    put.add_argument("pool")
    put.add_argument("name")
    put.add_argument("file", nargs="?", type=_path_or_std,
                     help="default (or -): standard input")
    get = commands.add_parser("get", parents=[common], help="read an object into a file (or "
                              "stdout)")
    get.add_argument("pool")
    get.add_argument("name")
    get.add_argument("file", nargs="?", type=_path_or_std,
                     help="default (or -): standard output")
    listing = commands.add_parser("ls", parents=[common], help="list object names in a pool")
    listing.add_argument("pool")
    listing.add_argument("--prefix", default="")
    remove = commands.add_parser("rm", parents=[common], help="delete an object")
    remove.add_argument("pool")
    remove.add_argument("name")
    stat = commands.add_parser("stat", parents=[common], help="an object's size and version "
                               "(and, erasure-coded, its shards present)")
    stat.add_argument("pool")
    stat.add_argument("name")
    pg = commands.add_parser("pg", help="placement group commands: scrub")
    pg_commands = pg.add_subparsers(dest="pg_command", required=True, metavar="SUBCOMMAND")
    scrub = pg_commands.add_parser(
        "scrub", parents=[common], help="compare every PG's copies or shards; --deep reads and "
        "checks every byte; --repair mends what it finds from good copies")
    scrub.add_argument("pool")
    scrub.add_argument("--deep", action="store_true", help="read every replica and shard, "
                       "check every 4 KiB checksum, compare replica crc32c and EC parity")
    scrub.add_argument("--repair", action="store_true", help="rewrite bad replicas and shards "
                       "from good ones")


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
        if args.command == "pg":
            def progress(done, total):
                if not args.json and (done == total or time.monotonic() - progress.shown >= 1):
                    progress.shown = time.monotonic()
                    print(f"  scrubbed {done} of {total} PGs", file=sys.stderr, flush=True)
            progress.shown = 0.0
            return await pool.scrub(args.deep, args.repair, progress)
        if args.command == "rm":
            await pool.delete(args.name)
            return {"pool": args.pool, "name": args.name, "deleted": True}
        info = await pool.stat(args.name)
        result = {"pool": args.pool, "name": info.name, "size": info.size,
                  "version": info.version, "mtime_ns": info.mtime_ns, "striped": info.striped}
        if info.shards is not None:
            result.update(shards=list(info.shards), shards_needed=info.shards_needed)
        return result
    finally:
        await cluster.close()


def main(args):
    try:
        result = _run_loop(run(args))
    except (errors.ObjectNotFound, errors.PoolNotFound) as exc:
        return fail(args, "not_found", str(exc), 1)
    except errors.PermissionDenied as exc:
        return fail(args, "permission_denied", str(exc), 1)
    except (errors.NoSpace, errors.QuotaExceeded, errors.PoolUnavailable,
            errors.ProtocolError, errors.DataUnavailable) as exc:
        return fail(args, type(exc).__name__, str(exc), 1)
    except (errors.Timeout, ClusterNotFound) as exc:
        return fail(args, "unavailable", str(exc), 2)
    except OSError as exc:
        return fail(args, "os_error", f"{exc.filename or ''}: {exc.strerror or exc}", 2)
    if args.json:
        print(json.dumps(result))
        if args.command == "pg":
            return 1 if len(result["errors"]) > result["repaired"] else 0
    elif args.command == "ls":
        print("\n".join(result["names"]) if result["names"] else "(no objects)")
    elif args.command in ("put", "get"):
        verb = "stored" if args.command == "put" else "read"
        print(f"{verb} {args.pool}/{args.name}: {format_size(result['size'])} in "
              f"{result['seconds']:.2f} s ({result['MBps']:.0f} MB/s)",
              file=sys.stderr if args.command == "get" and not args.file else sys.stdout)
    elif args.command == "rm":
        print(f"deleted {args.pool}/{args.name}")
    elif args.command == "pg":
        print(_format_scrub(result, args))
        return 1 if len(result["errors"]) > result["repaired"] else 0
    else:
        shards = ""
        if "shards" in result:
            shards = (f", shards {','.join(map(str, result['shards']))} present "
                      f"({result['shards_needed']} needed)")
        print(f"{args.pool}/{result['name']}: {result['size']} bytes, version "
              f"{result['version']}{', striped' if result['striped'] else ''}{shards}")
    return 0


def _format_scrub(report, args):
    kind = "deep scrub" if args.deep else "scrub"
    lines = [f"{kind} of pool {report['pool']}: {report['pgs']} PGs, {report['objects']} "
             f"objects, {report['bytes'] / 1e6:.1f} MB checked; {len(report['errors'])} errors"
             + (f", {report['repaired']} repaired" if args.repair else "")]
    for error in report["errors"][:50]:
        shard = f" shard {error['shard']}" if error["shard"] is not None else ""
        lines.append(f"  pg {error['pg']}: {error['kind']} {error['object']!r} on "
                     f"osd.{error['osd']}{shard}")
    if len(report["errors"]) > 50:
        lines.append(f"  ... and {len(report['errors']) - 50} more (--json lists all)")
    for skipped in report["skipped"]:
        lines.append(f"  pg {skipped['pg']} not scrubbed: {skipped['reason']}")
    if report["errors"] and not args.repair:
        lines.append(f"repair with: cairn pg scrub {report['pool']} --deep --repair")
    return "\n".join(lines)
