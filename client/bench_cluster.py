"""`cairn bench cluster`: object throughput and latency through the client library, like
`rados bench`.

    cairn bench cluster --pool P --op write|seq|rand --size 4M --concurrency 16 --seconds 20
                        [--json] [--cleanup]

`write` puts objects `bench.RUN.N` for the given time and records what it wrote in the object
`bench.last` so `seq` (reads them in order, cycling) and `rand` (reads them at random) find them;
`--cleanup` deletes them afterwards. Each op is one whole object. The JSON line has op,
size_bytes, ops, seconds, MBps (10^6 bytes/s), iops, lat_ms_avg, lat_ms_p50, lat_ms_p99,
lat_ms_max.
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time

import msgpack
import numpy as np

from cairn.client.cluster import Cluster, run_loop as _run_loop
from cairn.client import errors
from cairn.client.admin import fail
from cairn.client.errors import ObjectNotFound
from cairn.common.monclient import ClusterNotFound, MonitorsUnavailable
from cairn.common.units import format_size, parse_size

LAST_RUN_OBJECT = "bench.last"
OPS = ("write", "seq", "rand")


def add_parser(kinds):
    bench = kinds.add_parser("cluster", help="object throughput through the client library "
                             "(like rados bench)")
    # --cluster and --json only override what was given before `bench` (cairn --json bench ...).
    bench.add_argument("--cluster", default=argparse.SUPPRESS,
                       help="cluster directory, cluster.json or HOST:PORT,...")
    bench.add_argument("--pool", required=True)
    bench.add_argument("--op", choices=OPS, default="write")
    bench.add_argument("--size", type=parse_size, default=parse_size("4M"))
    bench.add_argument("--concurrency", type=int, default=16)
    bench.add_argument("--seconds", type=float, default=20.0)
    bench.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object on the last line")
    bench.add_argument("--cleanup", action="store_true", help="delete the written objects at "
                       "the end")
    bench.add_argument("--objects", type=int, default=0, metavar="N",
                       help="write: cycle over N object names, overwriting them (a steady load "
                       "that does not fill the OSDs; default 0: a new object per op)")


async def run(args, say):
    if args.objects < 0:
        raise SystemExit(f"cairn bench cluster: --objects must be 0 or more (was {args.objects})")
    cluster = await Cluster.connect(args.cluster)
    try:
        pool = cluster.pool(args.pool)
        say(f"cairn bench cluster: {args.op} {format_size(args.size)} x {args.concurrency} in "
            f"flight for {args.seconds:g} s on pool {args.pool}")
        if args.op == "write":
            result, names = await _write(pool, args)
            await pool.put(LAST_RUN_OBJECT, msgpack.packb({"names": names, "size": args.size}))
            if args.cleanup:
                await _delete_all(pool, names)
                await pool.delete(LAST_RUN_OBJECT)
        else:
            try:
                last = msgpack.unpackb(await pool.get(LAST_RUN_OBJECT))
            except ObjectNotFound:
                raise SystemExit(f"cairn bench cluster: no objects to read in pool {args.pool}; "
                                 "run --op write first") from None
            result = await _read(pool, args, last["names"], last["size"])
            if args.cleanup:
                await _delete_all(pool, last["names"])
                await pool.delete(LAST_RUN_OBJECT)
        return result
    finally:
        await cluster.close()


async def _timed(args, op):
    """Run `op(index)` with `concurrency` workers for `seconds`; (ops, elapsed, latencies)."""
    latencies = []
    stop_at = time.perf_counter() + args.seconds
    counter = iter(range(1 << 62))

    async def worker():
        while time.perf_counter() < stop_at:
            index = next(counter)
            started = time.perf_counter()
            await op(index)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return len(latencies), time.perf_counter() - started, latencies


async def _write(pool, args):
    run_id = os.urandom(3).hex()
    data = os.urandom(args.size)
    names = []

    async def put(index):
        name = f"bench.{run_id}.{index % args.objects if args.objects else index}"
        await pool.put(name, data)
        if not args.objects:
            names.append(name)

    ops, elapsed, latencies = await _timed(args, put)
    if args.objects:            # every op ran to its end, so the first `ops` names exist
        names = [f"bench.{run_id}.{index}" for index in range(min(ops, args.objects))]
    return _result("write", args.size, ops, elapsed, latencies), names


async def _read(pool, args, names, size):
    if not names:
        raise SystemExit("cairn bench cluster: the last write run left no objects")
    chooser = random.Random(1)

    async def get(index):
        name = names[index % len(names)] if args.op == "seq" else chooser.choice(names)
        data = await pool.get(name)
        assert len(data) == size, (name, len(data), size)

    ops, elapsed, latencies = await _timed(args, get)
    return _result(args.op, size, ops, elapsed, latencies)


async def _delete_all(pool, names):
    for start in range(0, len(names), 64):
        await asyncio.gather(*(pool.delete(name) for name in names[start:start + 64]))


def _result(op, size, ops, elapsed, latencies):
    lat = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {"op": op, "size_bytes": size, "ops": ops, "seconds": round(elapsed, 3),
            "MBps": round(ops * size / elapsed / 1e6, 1), "iops": round(ops / elapsed, 1),
            "lat_ms_avg": round(float(lat.mean()), 3),
            "lat_ms_p50": round(float(np.percentile(lat, 50)), 3),
            "lat_ms_p99": round(float(np.percentile(lat, 99)), 3),
            "lat_ms_max": round(float(lat.max()), 3)}


# What a typed error is called in the one line `cairn bench` prints for it.
_ERROR_WORDS = {errors.NoSpace: "no space", errors.QuotaExceeded: "quota exceeded",
                errors.PoolNotFound: "no such pool",
                errors.PoolUnavailable: "pool unavailable", errors.Timeout: "timed out",
                errors.DataUnavailable: "data unavailable", errors.ObjectNotFound: "not found",
                errors.ProtocolError: "protocol error"}


def main(args):
    say = (lambda message: print(message, file=sys.stderr)) if args.json else print
    try:
        result = _run_loop(run(args, say))
    except errors.ClientError as exc:
        words = _ERROR_WORDS.get(type(exc), "error")
        message = str(exc) if str(exc).startswith(f"{words}:") else f"{words}: {exc}"
        return fail(args, words.replace(" ", "_"), message, 1)
    except (ClusterNotFound, MonitorsUnavailable) as exc:
        return fail(args, "unavailable", str(exc), 2)
    line = (f"{result['op']} {format_size(result['size_bytes'])}: {result['ops']} ops in "
            f"{result['seconds']} s = {result['MBps']} MB/s, {result['iops']} IOPS, latency avg "
            f"{result['lat_ms_avg']} ms, p99 {result['lat_ms_p99']} ms, max "
            f"{result['lat_ms_max']} ms")
    print(line, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))
    return 0
