"""`cairn bench cluster`: object throughput and latency through the client library, like
`rados bench`, and a dataloader's small-object load.

    cairn bench cluster --pool P --op write|seq|rand --size 4M --concurrency 16 --seconds 20
                        [--size-dist 10K-100K] [--objects N [--fill]] [--json] [--cleanup]

`write` puts objects `bench.RUN.N` for the given time and records the run in the object
`bench.last` so `seq` (reads them in order, cycling) and `rand` (reads them at random) find them;
`--cleanup` deletes them afterwards. Each op is one whole object, of `--size` bytes or, with
`--size-dist LO-HI`, of a size drawn uniformly from LO..HI for each object (the same sizes on
every read: they follow from the run and the object's number). `--objects N` cycles writes over N
names; with `--fill` the write stores each of the N once and stops (no time limit; progress on
stderr), the random-read set for `--op rand`. Without `--objects`, a timed write still never
fills the cluster: it writes at most half the objects the pool has room for below the nearfull
ratio (`room_objects`), then overwrites them in turn, and says so on stderr.

The JSON line has op, size_bytes (the mean with --size-dist), ops, seconds, MBps (10^6 bytes/s),
iops, lat_ms_avg, lat_ms_p50, lat_ms_p99, lat_ms_p999, lat_ms_max, and cpu_s_per_1000_ops: CPU
seconds per 1,000 ops of the client and, where the cluster is a local `cairn-cluster` directory
whose daemons this machine can see in /proc, of all its OSDs and all its monitors.
"""

import argparse
import asyncio
import json
import os
import random
import resource
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
    bench.add_argument("--op", choices=OPS, default="write",
                       help="write: new objects (or --objects N in turn) for --seconds; seq: "
                       "read each object of the last write run once, in order, stopping at "
                       "the end or after --seconds (as rados bench seq); rand: read them at "
                       "random for --seconds (default: write)")
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
    bench.add_argument("--fill", action="store_true", help="write: store each of the --objects "
                       "N objects once and stop (the set --op rand reads from)")
    bench.add_argument("--run-name", type=_run_name, default=None, metavar="NAME",
                       help="record the run as bench.last.NAME, not bench.last: benches run at "
                       "once on one pool each read back (and clean up) their own objects")
    bench.add_argument("--no-hedge", action="store_true",
                       help="seq/rand on a replicated pool: never send a late read to another "
                       "member (common/hedge.py); the JSON's `hedges` counts them otherwise")
    bench.add_argument("--size-dist", type=_size_range, default=None, metavar="LO-HI",
                       help="object sizes drawn uniformly from LO..HI (e.g. 10K-100K) instead "
                       "of --size")


def _run_name(text):
    if not text or len(text) > 64 or not all(c.isalnum() or c in "-_." for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: 1 to 64 letters, digits, '-', '_' or '.'")
    return text


def _last_run_object(args):
    return f"{LAST_RUN_OBJECT}.{args.run_name}" if args.run_name else LAST_RUN_OBJECT


async def _forget_run(pool, record):
    """Delete the run's record; another bench cleaning up the same record got there first."""
    try:
        await pool.delete(record)
    except ObjectNotFound:
        pass


def _size_range(text):
    low, sep, high = text.partition("-")
    try:
        low, high = parse_size(low), parse_size(high)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"a size range is LO-HI, e.g. 10K-100K (was {text!r})")
    if not sep or not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"a size range is LO-HI with 0 < LO <= HI (was {text!r})")
    return low, high


class Sizes:
    """The size of each object of a run: `size`, or drawn from `dist` (LO, HI) by the object's
    number, so a reader finds the same sizes without a list."""

    def __init__(self, size, dist=None, seed=0):
        self.size, self.dist, self.seed = size, tuple(dist) if dist else None, seed

    def __call__(self, index):
        if self.dist is None:
            return self.size
        low, high = self.dist
        mixed = (self.seed ^ (index * 0x9E3779B97F4A7C15)) & (1 << 64) - 1
        mixed = (mixed ^ (mixed >> 31)) * 0xBF58476D1CE4E5B9 & (1 << 64) - 1
        return low + (mixed ^ (mixed >> 29)) % (high - low + 1)

    @property
    def largest(self):
        return self.dist[1] if self.dist else self.size

    @property
    def mean(self):
        return (self.dist[0] + self.dist[1]) / 2 if self.dist else self.size


async def run(args, say):
    if args.objects < 0:
        raise SystemExit(f"cairn bench cluster: --objects must be 0 or more (was {args.objects})")
    if args.fill and (args.op != "write" or not args.objects):
        raise SystemExit("cairn bench cluster: --fill writes the --objects N objects once; give "
                         "--op write and --objects N")
    if args.concurrency < 1:
        raise SystemExit(f"cairn bench cluster: --concurrency must be 1 or more (was "
                         f"{args.concurrency})")
    cluster = await Cluster.connect(args.cluster)
    cluster.hedging = not args.no_hedge
    cpu = CpuMeter(args.cluster)
    try:
        pool = cluster.pool(args.pool)
        if args.op == "write":
            sizes = Sizes(args.size, args.size_dist, random.getrandbits(64))
            what = (f"{format_size(sizes.dist[0])}-{format_size(sizes.dist[1])}"
                    if sizes.dist else format_size(args.size))
            span = (f"each of {args.objects} objects once" if args.fill else
                    f"for {args.seconds:g} s")
            say(f"cairn bench cluster: write {what} x {args.concurrency} in flight {span} on "
                f"pool {args.pool}")
            cycle = 0
            if not args.objects:
                room = await room_objects(cluster, args.pool, sizes.largest)
                if room is not None:
                    cycle = max(room, args.concurrency)
                    say(f"  at most {cycle} objects (half the pool's room below the nearfull "
                        "ratio); later writes overwrite them in turn")
            cpu.start()
            run_id, count, result = await _write(pool, args, sizes, cycle)
            result.update(cpu.per_1000(result["ops"]))
            last = {"run": run_id, "count": count, "size": sizes.size, "dist": sizes.dist,
                    "seed": sizes.seed}
            await pool.put(_last_run_object(args), msgpack.packb(last))
            if args.cleanup:
                await _delete_all(pool, _names(last))
                await _forget_run(pool, _last_run_object(args))
        else:
            try:
                last = msgpack.unpackb(await pool.get(_last_run_object(args)))
            except ObjectNotFound:
                run = f" with --run-name {args.run_name}" if args.run_name else ""
                raise SystemExit(f"cairn bench cluster: no objects to read in pool {args.pool}; "
                                 f"run --op write{run} first") from None
            names = _names(last)
            sizes = Sizes(last["size"], last.get("dist"), last.get("seed", 0))
            span = "each once, in order, for at most" if args.op == "seq" else "at random for"
            say(f"cairn bench cluster: {args.op} of {len(names)} objects x {args.concurrency} "
                f"in flight ({span} {args.seconds:g} s) on pool {args.pool}")
            cpu.start()
            result = await _read(pool, args, names, sizes, "names" not in last)
            result.update(cpu.per_1000(result["ops"]))
            if cluster.map.pools[args.pool]["kind"] == "replicated":
                result["hedges"] = cluster.hedger.counts() if cluster.hedging else None
            if args.cleanup:
                await _delete_all(pool, names)
                await _forget_run(pool, _last_run_object(args))
        return result
    finally:
        await cluster.close()


def _names(last):
    """The object names of a recorded write run (older runs recorded the list itself)."""
    if "names" in last:
        return last["names"]
    return [f"bench.{last['run']}.{index}" for index in range(last["count"])]


class CpuMeter:
    """CPU seconds used between start() and per_1000(): by this process, and by the OSDs and
    monitors of a local cluster directory whose processes /proc shows (pids from cluster.json,
    each checked to be that cluster's daemon by its command line)."""

    def __init__(self, where):
        from cairn.cluster.cli import ClusterError, is_ours, load
        self.daemons = {"osd": [], "mon": []}
        where = where or os.environ.get("CAIRN_CLUSTER") or ""
        try:
            description = load(where) if os.path.isdir(where) else {}
        except ClusterError:
            description = {}            # not a local cluster directory: the client's CPU only
        for kind in self.daemons:
            self.daemons[kind] = [entry["pid"] for entry in description.get(kind + "s", [])
                                  if is_ours(entry.get("pid"), where)]
        self._before = None

    def _sample(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        sample = {"client": usage.ru_utime + usage.ru_stime}
        ticks = os.sysconf("SC_CLK_TCK")
        for kind, pids in self.daemons.items():
            if not pids:
                continue
            total = 0.0
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as handle:
                        fields = handle.read().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / ticks
                except (OSError, IndexError, ValueError):
                    pass            # a daemon that stopped: what it used is lost
            sample[kind] = total
        return sample

    def start(self):
        self._before = self._sample()

    def per_1000(self, ops):
        after = self._sample()
        used = {kind: after[kind] - self._before.get(kind, 0.0) for kind in after}
        return {"cpu_s_per_1000_ops": {kind: round(1000 * seconds / ops, 3) if ops else None
                                       for kind, seconds in used.items()}}


async def _timed(args, op, count=1 << 62):
    """Run `op(index)` for index 0, 1, ... with `concurrency` workers for `seconds`, or until
    `count` ops have started; (ops, elapsed, latencies)."""
    latencies = []
    stop_at = time.perf_counter() + args.seconds
    counter = iter(range(count))

    async def worker():
        while time.perf_counter() < stop_at:
            index = next(counter, None)
            if index is None:
                return
            started = time.perf_counter()
            await op(index)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return len(latencies), time.perf_counter() - started, latencies


async def room_objects(cluster, pool_name, object_bytes):
    """About how many objects of `object_bytes` the pool takes before its fullest OSD could
    reach the nearfull ratio: half the room below nearfull over the OSDs (placement is not
    perfectly even), in the pool's copies. None when no OSD has reported its capacity yet."""
    df = (await cluster.monc.request({"op": "df"})).header
    reported = [osd for osd in df["osds"] if osd["total_bytes"] and osd["in"]]
    if not reported:
        return None
    pool = cluster.map.pools[pool_name]
    copies = pool["size"] / pool["k"] if pool["kind"] == "erasure" else pool["size"]
    room = sum(max(0.0, df["ratios"]["nearfull"] * osd["total_bytes"] - osd["used_bytes"])
               for osd in reported)
    return int(room / 2 / copies // max(object_bytes, 1))


async def _write(pool, args, sizes, cycle=0):
    """(run id, objects written, result) of a timed write, or of a fill of --objects N.
    `cycle`: without --objects, the number of names a timed write cycles over (0: no bound)."""
    run_id = os.urandom(3).hex()
    data = memoryview(os.urandom(sizes.largest))
    written = [0]
    cycle = args.objects or cycle

    async def put(index):
        number = index % cycle if cycle else index
        size = sizes(number)
        await pool.put(f"bench.{run_id}.{number}", data[:size])
        written[0] += size

    if args.fill:
        ops, elapsed, latencies = await _filled(args, put)
    else:
        ops, elapsed, latencies = await _timed(args, put)
    # Every op ran to its end, so objects 0 .. count - 1 exist.
    count = min(ops, cycle) if cycle else ops
    return run_id, count, _result("write", sizes.mean, ops, elapsed, latencies, written[0])


async def _filled(args, op, progress_s=2.0):
    """Run `op(index)` for index 0 .. --objects - 1 once each, `concurrency` at a time."""
    latencies = []
    counter = iter(range(args.objects))
    began = last_said = time.perf_counter()

    async def worker():
        nonlocal last_said
        for index in counter:
            started = time.perf_counter()
            await op(index)
            now = time.perf_counter()
            latencies.append(now - started)
            if now - last_said >= progress_s:
                last_said = now
                print(f"  filled {len(latencies)}/{args.objects} objects "
                      f"({len(latencies) / (now - began):.0f}/s)", file=sys.stderr)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return len(latencies), time.perf_counter() - began, latencies


async def _read(pool, args, names, sizes, numbered):
    if not names:
        raise SystemExit("cairn bench cluster: the last write run left no objects")
    chooser = random.Random(1)
    read = [0]

    async def get(index):
        number = index if args.op == "seq" else chooser.randrange(len(names))
        data = await pool.get(names[number])
        expected = sizes(number) if numbered else sizes.size
        if len(data) != expected:
            raise errors.ProtocolError(f"{names[number]} is {len(data)} bytes; the write run "
                                       f"stored {expected}")
        read[0] += len(data)

    # seq reads each object once, as rados bench's seq does: a second pass would measure the
    # OSDs' read cache (osd/store.py ReadCache), not the read path.
    ops, elapsed, latencies = await _timed(args, get,
                                           len(names) if args.op == "seq" else 1 << 62)
    return _result(args.op, sizes.mean, ops, elapsed, latencies, read[0])


async def _delete_all(pool, names):
    for start in range(0, len(names), 64):
        await asyncio.gather(*(pool.delete(name) for name in names[start:start + 64]))


def _result(op, size, ops, elapsed, latencies, nbytes):
    lat = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {"op": op, "size_bytes": int(size), "ops": ops, "seconds": round(elapsed, 3),
            "MBps": round(nbytes / elapsed / 1e6, 1), "iops": round(ops / elapsed, 1),
            "lat_ms_avg": round(float(lat.mean()), 3),
            "lat_ms_p50": round(float(np.percentile(lat, 50)), 3),
            "lat_ms_p99": round(float(np.percentile(lat, 99)), 3),
            "lat_ms_p999": round(float(np.percentile(lat, 99.9)), 3),
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
            f"{result['lat_ms_avg']} ms, p99 {result['lat_ms_p99']} ms, p999 "
            f"{result['lat_ms_p999']} ms, max {result['lat_ms_max']} ms; CPU s per 1000 ops "
            + ", ".join(f"{kind} {value}" for kind, value in
                        result["cpu_s_per_1000_ops"].items()))
    print(line, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))
    return 0
