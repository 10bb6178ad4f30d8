"""`cairn-osd`: make, check and benchmark an OSD's store.

    cairn-osd mkfs  --device PATH [--meta DIR] [--force] [--no-journal]
    cairn-osd fsck  --device PATH [--meta DIR] [--deep] [--json]
    cairn-osd bench device --device PATH --op write|read|randwrite|randread --size 4K ...
    cairn-osd bench store  --device PATH --op put|get --size 4M ...
    cairn-osd demo  [--device PATH] [--data 1G] [--size 4M]
    cairn-osd run   --device PATH --mon ADDRS|--cluster DIR --bind HOST:PORT --host H [--rack R]
                    [--id N] [--weight W] [--mkfs] [--ready-file PATH]

Exit status: 0 success; 1 fsck found problems or the demo read back wrong bytes; 2 bad usage or
an operating error (the message says what and how to fix it).
"""

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import os
import sys
import time

from cairn.common import auth
from cairn.common.tls import TlsError
from cairn.common.units import format_size, parse_size
from cairn.native import DeviceError, implementation, open_device
from cairn.native.erasure import tune_malloc
from cairn.osd import bench
from cairn.common.limits import READ_CACHE_BYTES_DEFAULT
from cairn.osd.errors import StoreError

log = logging.getLogger("cairn.osd")


def _size(text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (was {value})")
    return value


def build_parser(prog="cairn-osd"):
    parser = argparse.ArgumentParser(prog=prog, description="Make, check and benchmark a cairn "
                                     "OSD's object store on a raw block device or file.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mkfs = commands.add_parser("mkfs", help="make an empty store on a device")
    mkfs.add_argument("--device", required=True, help="block device or file (not on tmpfs)")
    mkfs.add_argument("--meta", help="metadata (RocksDB) directory; default: DEVICE.meta for a "
                      "file, /var/lib/cairn/osd-UUID.meta for a block device")
    mkfs.add_argument("--force", action="store_true", help="overwrite an existing store")
    mkfs.add_argument("--no-journal", action="store_true",
                      help="no commit journal on the device: every commit group syncs RocksDB "
                           "instead (slower; for comparisons)")

    fsck = commands.add_parser("fsck", help="check allocator against metadata (and checksums)")
    fsck.add_argument("--device", required=True)
    fsck.add_argument("--meta")
    fsck.add_argument("--deep", action="store_true", help="also read every block and check "
                      "its crc32c")
    fsck.add_argument("--json", action="store_true", help="print one JSON object")

    bitrot = commands.add_parser(
        "bitrot", help="fault injection: flip bits in one object's bytes on this device (works "
        "beside a running OSD; its checksums must catch it)")
    bitrot.add_argument("--device", required=True)
    bitrot.add_argument("--meta")
    bitrot.add_argument("--object", required=True, help="object name (a replica or a shard)")
    bitrot.add_argument("--collection", help="e.g. pg.1.a, when several PGs hold the name")
    bitrot.add_argument("--offset", type=int, default=0, help="byte of the object to change "
                        "(default 0)")
    bitrot.add_argument("--mask", type=lambda text: int(text, 0), default=0x01,
                        help="XOR mask for that byte (default 0x01: one bit)")
    bitrot.add_argument("--json", action="store_true", help="print one JSON object")

    add_bench_parser(commands)

    run = commands.add_parser("run", help="run the OSD daemon on a device until SIGTERM")
    run.add_argument("--device", required=True, help="block device or file made by mkfs")
    run.add_argument("--meta", help="metadata directory (as for mkfs)")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--mon", help="monitor addresses, HOST:PORT[,HOST:PORT...]")
    where.add_argument("--cluster", help="cluster directory or cluster.json (monitors from it)")
    run.add_argument("--bind", required=True, help="HOST:PORT to serve on (port 0: any)")
    run.add_argument("--host", required=True, help="failure-domain host name, e.g. h1")
    run.add_argument("--rack", help="rack name (optional)")
    run.add_argument("--room", help="room name (optional)")
    run.add_argument("--id", type=int, help="the OSD id (default: the monitor assigns one "
                     "from the store's uuid and keeps it)")
    run.add_argument("--weight", type=float, default=1.0, help="placement weight (default 1)")
    run.add_argument("--keyring", help="this OSD's keyring (osd.N's key, written by "
                     "cairn-cluster up or 'cairn auth get-key osd.N'); needs --id N; without "
                     "it the OSD works only in a cluster with auth none")
    run.add_argument("--tls", metavar="DIR", help="serve TLS, and speak it to monitors and "
                     "peers, with the cluster certificate in DIR (cluster.crt, cluster.key; "
                     "made by cairn-cluster up --tls)")
    run.add_argument("--mkfs", action="store_true", help="make a store first if the device "
                     "holds none (never overwrites one)")
    run.add_argument("--ready-file", help="write {name, id, addr, pid, uuid, metrics} as JSON "
                     "here once up")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port "
                     "of the --bind address (0: any free port; default: none)")
    run.add_argument("--read-cache", type=_size, default=READ_CACHE_BYTES_DEFAULT,
                     metavar="SIZE", help="memory for small objects' bytes after a read, so a "
                     "read again is answered without the device (as BlueStore's buffered "
                     f"reads; default {READ_CACHE_BYTES_DEFAULT >> 20}M, 0: none)")
    run.add_argument("--verbose", action="store_true")

    demo = commands.add_parser("demo", help="single-device demo: mkfs, put and get real "
                               "objects, verify, fsck, print throughput")
    demo.add_argument("--device", help="device or file to use (default: a new sparse file in "
                      "$CAIRN_SCRATCH_DIR or /tmp, removed afterwards)")
    demo.add_argument("--device-size", type=_size, default=parse_size("4G"))
    demo.add_argument("--data", type=_size, default=parse_size("1G"),
                      help="total bytes to write and read back (default 1G)")
    demo.add_argument("--size", type=_size, default=parse_size("4M"), help="object size")
    demo.add_argument("--concurrency", type=_positive, default=16)
    return parser


def add_bench_parser(commands):
    bench_parser = commands.add_parser("bench", help="benchmark the device path or the store "
                                       "next to fio")
    kinds = bench_parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, ops, default_op in (("device", bench.DEVICE_OPS, "write"),
                                  ("store", bench.STORE_OPS, "put")):
        sub = kinds.add_parser(kind, help=("the native block path alone (destroys data in its "
                                           "region)" if kind == "device" else
                                           "object puts/gets through the engine on a device "
                                           "made by mkfs"))
        sub.add_argument("--device", required=True)
        sub.add_argument("--op", choices=ops, default=default_op)
        sub.add_argument("--size", type=_size, default=parse_size("4M"),
                         help="bytes per op, e.g. 4K, 4M (default 4M)")
        sub.add_argument("--concurrency", type=_positive, default=16,
                         help="ops in flight (default 16)")
        sub.add_argument("--seconds", type=float, default=10.0)
        sub.add_argument("--json", action="store_true",
                         help="print one JSON object on the last line")
        sub.add_argument("--no-fio", action="store_true", help="skip the fio comparison")
        sub.add_argument("--rounds", type=_positive, default=bench.ROUNDS_DEFAULT,
                         help="split the run into this many rounds, each between two fio runs; "
                              "the ratio is the median over rounds (default "
                              f"{bench.ROUNDS_DEFAULT})")
        if kind == "store":
            sub.add_argument("--meta")
            sub.add_argument("--fio-file", help="where fio runs (default: a scratch file beside "
                             "a file device; required for a block device)")
        else:
            sub.add_argument("--region", type=_size, help="bytes of the device to use "
                             "(default 1G)")


async def run_bench(args):
    say = (lambda message: print(message, file=sys.stderr)) if args.json else print
    # The collector as an OSD runs it: with Python's default thresholds a young-generation
    # collection every 700 allocations took 10% of a 4 KiB store put bench (py-spy).
    from cairn.common import daemon
    daemon.tune_collector()
    if args.kind == "device" and (args.size == 0 or args.size % 4096):
        raise ValueError(f"--size must be a positive multiple of 4K for the device path "
                         f"(O_DIRECT; was {args.size})")
    if args.kind == "device":
        result = await bench.bench_device(args.device, args.op, args.size, args.concurrency,
                                          args.seconds, region_bytes=args.region,
                                          compare_fio=not args.no_fio, rounds=args.rounds,
                                          log=say)
    else:
        result = await bench.bench_store(args.device, args.op, args.size, args.concurrency,
                                         args.seconds, meta_dir=args.meta,
                                         compare_fio=not args.no_fio, fio_file=args.fio_file,
                                         rounds=args.rounds, log=say)
    result["gc_thresholds"] = list(gc.get_threshold())      # the conditions it ran under
    print(bench.format_result(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))
    return 0


async def run_mkfs(args):
    from cairn.osd.store import default_meta_dir, mkfs
    device = open_device(args.device)
    try:
        superblock = await mkfs(device, args.meta, force=args.force,
                                journal=not args.no_journal)
    finally:
        await device.aclose()
    meta = args.meta or default_meta_dir(args.device, superblock.uuid)
    journal = f"{format_size(superblock.journal_bytes)} commit journal" \
        if superblock.journal_bytes else "no commit journal"
    print(f"made a cairn store on {args.device}: uuid {superblock.uuid}, "
          f"{format_size(superblock.block_count * superblock.block_size_bytes)} of data blocks "
          f"({superblock.block_count} x {superblock.block_size_bytes} bytes), {journal}, "
          f"metadata in {meta}")
    return 0


async def run_fsck(args):
    from cairn.osd.fsck import fsck
    from cairn.osd.store import Store
    device = open_device(args.device)
    store = None
    try:
        store = await Store.open(device, args.meta)

        def progress(objects, checked_bytes):
            print(f"  checked {objects} objects, {format_size(checked_bytes)}", file=sys.stderr)

        started = time.perf_counter()
        report = await fsck(store, deep=args.deep, progress=progress)
        elapsed = time.perf_counter() - started
    finally:
        if store is not None:
            await store.close()
        await device.aclose()
    if args.json:
        print(json.dumps(report.as_dict() | {"deep": args.deep, "seconds": round(elapsed, 3)}))
    else:
        verdict = "clean" if report.clean else f"{report.problems_total} problem(s)"
        print(f"fsck{' --deep' if args.deep else ''} {args.device}: {report.objects} objects, "
              f"{report.bytes} bytes, {report.blocks_marked_used} blocks used, "
              f"{report.blocks_checked} blocks checksummed: {verdict} ({elapsed:.2f} s)")
        for problem in report.problems:
            print(f"  {problem}")
        if report.problems_total > len(report.problems):
            print(f"  ... and {report.problems_total - len(report.problems)} more")
    return 0 if report.clean else 1


async def run_demo(args):
    """mkfs, put `--data` bytes of random objects, read them back and compare, fsck --deep."""
    from cairn.osd.fsck import fsck
    from cairn.osd.store import Store, Transaction, default_meta_dir, mkfs
    import shutil
    made_here = args.device is None
    path = args.device or bench.make_scratch_device(args.device_size)
    device = open_device(path)
    store = None
    meta = None
    try:
        print(f"cairn demo: device {path} ({format_size(device.size_bytes)}, "
              f"{implementation()} path)")
        superblock = await mkfs(device, force=True)
        meta = default_meta_dir(path, superblock.uuid)
        store = await Store.open(device)
        await store.create_collection("demo")
        count = max(1, args.data // args.size)
        digests = {}
        source = os.urandom(args.size + 4096 * 64)

        async def put_range(worker):
            for index in range(worker, count, args.concurrency):
                shift = (index * 4096) % (4096 * 64)
                payload = memoryview(source)[shift:shift + args.size]
                digests[index] = hashlib.blake2b(payload, digest_size=16).digest()
                await store.apply(Transaction().put("demo", f"obj-{index:06d}", payload))

        started = time.perf_counter()
        progress = asyncio.create_task(_progress("  written", store, count, started))
        try:
            async with asyncio.TaskGroup() as group:
                for worker in range(args.concurrency):
                    group.create_task(put_range(worker))
        finally:
            progress.cancel()
        put_seconds = time.perf_counter() - started
        total = count * args.size
        print(f"put {count} objects of {format_size(args.size)} ({format_size(total)}) in "
              f"{put_seconds:.2f} s: {total / put_seconds / 1e6:.0f} MB/s, durable on "
              f"acknowledgement ({store.statistics()['transactions_per_commit']:.1f} "
              "transactions per flush+commit)")
        mismatches = []

        async def get_range(worker):
            for index in range(worker, count, args.concurrency):
                view = await store.read("demo", f"obj-{index:06d}")
                if hashlib.blake2b(view, digest_size=16).digest() != digests[index]:
                    mismatches.append(index)
                device.pool.put(view)

        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for worker in range(args.concurrency):
                group.create_task(get_range(worker))
        get_seconds = time.perf_counter() - started
        print(f"got {count} objects back in {get_seconds:.2f} s: "
              f"{total / get_seconds / 1e6:.0f} MB/s, {count - len(mismatches)} of {count} "
              "byte-identical")
        started = time.perf_counter()
        report = await fsck(store, deep=True)
        print(f"fsck --deep: {report.objects} objects, {report.blocks_checked} blocks "
              f"checksummed in {time.perf_counter() - started:.2f} s: "
              f"{'clean' if report.clean else report.problems}")
        print(f"space: {store.statfs()}")
        return 0 if not mismatches and report.clean else 1
    finally:
        if store is not None:
            await store.close()
        await device.aclose()
        if made_here:
            os.unlink(path)
            if meta and os.path.isdir(meta):
                shutil.rmtree(meta)


async def _progress(label, store, count, started):
    # Prints until cancelled by its owner (run_demo), every 2 s.
    while True:
        await asyncio.sleep(2)
        done = store.statistics()["transactions_total"]
        print(f"{label} {done}/{count} objects ({time.perf_counter() - started:.0f} s)")


async def run_bitrot(args):
    from cairn.osd.bitrot import BitrotError, flip_bits
    try:
        done = flip_bits(args.device, args.object, collection=args.collection, meta_dir=args.meta,
                         offset=args.offset, mask=args.mask)
    except BitrotError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        print(json.dumps(done))
    else:
        print(f"flipped bits {args.mask:#04x} of byte {args.offset} of {done['collection']}/"
              f"{done['object']} at device offset {done['device_offset']}")
    return 0


COMMANDS = {"mkfs": run_mkfs, "fsck": run_fsck, "bench": run_bench, "demo": run_demo,
            "bitrot": run_bitrot}


def run_daemon(args, prog):
    from cairn.common import daemon
    from cairn.common.monclient import ClusterNotFound, MonitorsUnavailable, load_cluster
    from cairn.common.messenger import RequestFailed
    from cairn.osd.daemon import OsdDaemon
    from cairn.osd.errors import StoreExists
    from cairn.osd.store import mkfs
    name = f"osd.{args.id}" if args.id is not None else "osd"
    daemon.setup_logging(name, args.verbose)
    try:
        mons = load_cluster(args.mon or args.cluster)
    except ClusterNotFound as exc:
        print(f"{prog} run: error: {exc}", file=sys.stderr)
        return 2
    location = {kind: value for kind, value in (("host", args.host), ("rack", args.rack),
                                                 ("room", args.room)) if value}
    secret = None
    if args.keyring:
        try:
            keys = auth.read_keyring(args.keyring)
        except auth.AuthError as exc:
            print(f"{prog} run: error: {exc}", file=sys.stderr)
            return 2
        secret = keys.get(f"osd.{args.id}") if args.id is not None else None
        if secret is None:
            print(f"{prog} run: error: {args.keyring} holds no key for osd.{args.id} (it has "
                  f"{', '.join(sorted(keys))}); --id and the keyring must agree",
                  file=sys.stderr)
            return 2

    async def serve(stop):
        # pyeclib allocates fresh buffers on every call: without this, erasure coding runs 5x
        # slower (native/erasure.py).
        log.info("malloc thresholds for erasure coding: %s",
                 "set" if tune_malloc() else "not set (no glibc mallopt)")
        if args.mkfs:
            device = open_device(args.device)
            try:
                await mkfs(device, args.meta)
                log.info("made a new store on %s", args.device)
            except StoreExists:
                pass                        # --mkfs never overwrites: use the store there
            finally:
                await device.aclose()
        try:
            osd = OsdDaemon(args.device, mons, args.bind, location, meta_dir=args.meta,
                            weight=args.weight, osd_id=args.id, metrics_port=args.metrics_port,
                            secret=secret, tls_dir=args.tls, read_cache_bytes=args.read_cache)
        except TlsError as exc:
            log.error("cannot start: %s", exc)
            return 2
        try:
            await osd.start()
        except (StoreError, DeviceError, MonitorsUnavailable, RequestFailed, OSError) as exc:
            log.error("cannot start: %s", exc)
            await osd.stop()
            return 2
        try:
            if args.ready_file:
                daemon.write_ready_file(args.ready_file, {
                    "name": osd.name, "id": osd.id, "addr": osd.addr, "pid": os.getpid(),
                    "uuid": osd.store.superblock.uuid, "metrics": osd.metrics_url})
            await stop.wait()
        finally:
            await osd.stop()
        log.info("%s stopped cleanly", osd.name)
        return 0

    return daemon.run(serve, name)


def main(argv=None, prog="cairn-osd"):
    args = build_parser(prog).parse_args(argv)
    if args.command == "run":
        return run_daemon(args, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(COMMANDS[args.command](args))
    except (StoreError, DeviceError, ValueError, RuntimeError) as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
