"""`cairn bench device` and `cairn bench store`: our I/O paths next to fio, in the same run.

Targets are ratios against fio measured on the same file (or a scratch file beside a store's
device) in the same run, because these machines are shared and noisy: absolute figures drift,
ratios much less (DEVELOPERS.md).

- device: the native block path alone (`open_device()`), ops write | read | randwrite | randread,
  each worker keeping one op in flight; fio runs the same op, block size and iodepth.
- store: object operations through the engine on a device made by mkfs, ops put | get. put
  cycles over a bounded set of names so a timed run never fills the device; get reads what put
  left (or writes its own set first). fio runs against a scratch file of the same size beside the
  device (a store's device cannot be overwritten): the same block size (the object's) and depth
  as our ops, sequential for objects of 1 MiB and up, else random. A put is compared with that
  job and with its durable twin, which adds an fdatasync after every `concurrency` writes: 4 MiB
  puts at 16 in flight against `fio --bs=4M --iodepth=16 --fdatasync=16`.
"""

import asyncio
import itertools
import json
import os
import shutil
import stat
import statistics
import subprocess
import tempfile
import time

import numpy as np

from cairn.common.units import format_size
from cairn.native import open_device

# A bench touches at most this much of a device: enough to defeat any cache in front of the
# disk on these machines, small enough to lay out in seconds before read tests.
REGION_BYTES_DEFAULT = 1 << 30

# Put cycles over names covering at most this fraction of the store's free space, so a timed run
# never fills the device however fast it goes.
STORE_FILL_FRACTION_MAX = 0.25

# Our run is split into this many rounds, each between two fio runs (see _FioBaseline).
ROUNDS_DEFAULT = 3


def _summary(op, size_bytes, latencies_ns, seconds):
    ops = len(latencies_ns)
    latencies = np.array(latencies_ns, dtype=np.int64) if ops else np.zeros(1, dtype=np.int64)
    return {
        "op": op, "size_bytes": size_bytes, "ops": ops, "seconds": round(seconds, 3),
        "MBps": round(ops * size_bytes / seconds / 1e6, 1),
        "iops": round(ops / seconds, 1),
        "lat_us_avg": round(float(latencies.mean()) / 1e3, 1),
        "lat_us_p50": round(float(np.percentile(latencies, 50)) / 1e3, 1),
        "lat_us_p99": round(float(np.percentile(latencies, 99)) / 1e3, 1),
        "lat_us_max": round(float(latencies.max()) / 1e3, 1),
    }


async def _timed_workers(concurrency, seconds, one_op, baselines=(), log=print, rounds=1,
                         before_round=None):
    """Run `one_op(worker_index, op_index)` in `concurrency` workers for `seconds` in all,
    split into `rounds` runs; each fio baseline runs before every round and once after the last,
    so each of our rounds sits between two runs of each; `before_round()`, if given, runs before
    each of ours. Returns (latencies_ns, elapsed seconds); each round's rate goes to every
    baseline's `ours`."""
    latencies, elapsed = [], 0.0
    for round_index in range(rounds):
        for baseline in baselines:
            if round_index:
                log(f"{baseline.label}, before round {round_index + 1} of {rounds} ...")
            baseline.runs.append(baseline.job())
        if before_round is not None:
            before_round()
        round_latencies, round_seconds = await _timed_run(concurrency, seconds / rounds, one_op)
        latencies += round_latencies
        elapsed += round_seconds
        for baseline in baselines:
            baseline.ours.append(len(round_latencies) / round_seconds)
    for baseline in baselines:
        log(f"{baseline.label} again, after our last round ...")
        baseline.runs.append(baseline.job())
    return latencies, elapsed


async def _timed_run(concurrency, seconds, one_op):
    """`one_op(worker, op_index)` returns an awaitable: a coroutine or the device's future."""
    latencies = []
    record = latencies.append
    clock = time.perf_counter_ns
    start = clock()
    deadline = start + int(seconds * 1e9)

    async def worker(index):
        op_index = 0
        now = clock()
        while now < deadline:
            await one_op(index, op_index)
            done = clock()
            record(done - now)
            now = done
            op_index += 1

    async with asyncio.TaskGroup() as group:
        for index in range(concurrency):
            group.create_task(worker(index))
    return latencies, (clock() - start) / 1e9


# -- fio ----------------------------------------------------------------------------------------

def fio_available():
    return shutil.which("fio") is not None


def _fio_room(fio_file, region):
    """Make `fio_file` hold `region` bytes for fio: a file grows (sparse); a block device must
    already be that large (its size is not what fstat says, so ask it by seeking)."""
    if os.path.exists(fio_file) and stat.S_ISBLK(os.stat(fio_file).st_mode):
        with open(fio_file, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
        if size < region:
            raise ValueError(f"--fio-file {fio_file} holds {size} bytes; fio needs {region}")
        return
    with open(fio_file, "ab") as handle:
        if os.fstat(handle.fileno()).st_size < region:
            handle.truncate(region)


def run_fio(filename, rw, block_size, iodepth, seconds, region_bytes, fdatasync=0):
    """Run fio (io_uring, O_DIRECT) and return {MBps, iops, lat_us_p50, lat_us_p99}, or raise
    RuntimeError with fio's message. `fdatasync=N` makes fio flush after every N writes."""
    command = ["fio", "--name=cairn", f"--filename={filename}", f"--rw={rw}",
               f"--bs={block_size}", f"--iodepth={iodepth}", "--ioengine=io_uring",
               "--direct=1", f"--size={region_bytes}", "--time_based",
               f"--runtime={max(1000, int(seconds * 1000))}ms", "--randrepeat=0",
               "--norandommap", *([f"--fdatasync={fdatasync}"] if fdatasync else []),
               "--output-format=json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed: {done.stderr.strip() or done.stdout.strip()}")
    job = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    percentiles = side.get("clat_ns", {}).get("percentile", {})
    return {"rw": rw, "bs": block_size, "iodepth": iodepth, "fdatasync": fdatasync,
            "MBps": round(side["bw_bytes"] / 1e6, 1), "iops": round(side["iops"], 1),
            "lat_us_p50": round(percentiles.get("50.000000", 0) / 1e3, 1),
            "lat_us_p99": round(percentiles.get("99.000000", 0) / 1e3, 1)}


def lay_out(filename, region_bytes):
    """Write the region once (fio, 1 MiB sequential) so read tests read real blocks, not holes
    of a sparse file."""
    run_fio_once = ["fio", "--name=layout", f"--filename={filename}", "--rw=write", "--bs=1M",
                    "--iodepth=16", "--ioengine=io_uring", "--direct=1",
                    f"--size={region_bytes}", "--output-format=json"]
    done = subprocess.run(run_fio_once, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"fio layout failed: {done.stderr.strip()}")


def _with_ratio(result, fio, name="fio", rounds_field="rounds"):
    """Add baseline `name` (its combined figures), its per-round comparison and
    `ratio_vs_<name>`, the median ratio over rounds."""
    result[name] = fio.combined if fio else None
    if fio and fio.runs and fio.runs[0].get("iops"):
        ratios = fio.round_ratios(result["size_bytes"])
        result[rounds_field] = ratios
        result[f"ratio_vs_{name}"] = round(
            statistics.median(round_["ratio"] for round_ in ratios), 3)
    return result


class _FioBaseline:
    """fio interleaved with our rounds: fio, ours, fio, ours, ..., fio.

    Why: on these shared virtual disks the host caches writes and other tenants come and go, so
    the same fio job moved between 1,511 and 3,581 MB/s within five minutes. Each of our rounds
    is compared with the mean of the fio runs just before and after it, and the reported ratio is
    the median over rounds, so one disturbed round cannot decide it. Every run's figures are kept
    in the result (`fio.runs`, `rounds`)."""

    def __init__(self, job, label="fio"):
        self.job = job
        self.label = label
        self.runs = []      # fio result dicts, one more than our rounds
        self.ours = []      # our ops per second, per round

    @property
    def combined(self):
        if not self.runs:
            return {}
        first = self.runs[0]
        mean = {key: round(sum(run[key] for run in self.runs) / len(self.runs), 1)
                for key in ("MBps", "iops", "lat_us_p50", "lat_us_p99")}
        return {"rw": first["rw"], "bs": first["bs"], "iodepth": first["iodepth"],
                "fdatasync": first.get("fdatasync", 0), **mean,
                "runs": [{"MBps": run["MBps"], "iops": run["iops"]} for run in self.runs]}

    def round_ratios(self, size_bytes):
        """Per round: our MB/s, the mean MB/s of the fio runs around it, and their ratio."""
        rounds = []
        for index, ops_per_second in enumerate(self.ours):
            ours = ops_per_second * size_bytes / 1e6
            around = (self.runs[index]["MBps"] + self.runs[index + 1]["MBps"]) / 2
            rounds.append({"MBps": round(ours, 1), "fio_MBps": round(around, 1),
                           "ratio": round(ours / around, 3) if around else 0.0})
        return rounds


# -- device -------------------------------------------------------------------------------------

DEVICE_OPS = ("write", "read", "randwrite", "randread")


async def bench_device(path, op, size_bytes, concurrency, seconds, region_bytes=None,
                       queue_depth=None, compare_fio=True, rounds=ROUNDS_DEFAULT, log=print):
    """Benchmark the native block path on `path` (destroys its contents in the region)."""
    assert op in DEVICE_OPS
    device = open_device(path, queue_depth=queue_depth or max(128, concurrency))
    try:
        region = min(region_bytes or REGION_BYTES_DEFAULT, device.size_bytes)
        region -= region % size_bytes
        if region < size_bytes * concurrency:
            raise ValueError(f"{path} is too small for {concurrency} x {size_bytes}-byte ops")
        fio = None
        if compare_fio and fio_available():
            if "read" in op:
                log(f"laying out {format_size(region)} of {path} for the read test ...")
                lay_out(path, region)
            log(f"fio: {op} {format_size(size_bytes)} iodepth {concurrency}, {seconds} s ...")
            fio = _FioBaseline(
                lambda: run_fio(path, op, size_bytes, concurrency, seconds / rounds, region))
        elif compare_fio:
            log("fio is not installed: no comparison (apt-get install -y fio)")
        buffers = [device.pool.get(size_bytes) for _ in range(concurrency)]
        for buffer in buffers:
            buffer[:] = os.urandom(size_bytes)
        # Offsets are drawn before the clock starts and each op is the device's own call (it
        # returns a future), so the timed loop carries as little Python as fio carries C.
        slots = region // size_bytes
        if op.startswith("rand"):
            drawn = np.random.default_rng(1).integers(0, slots, size=1 << 16) * size_bytes
            offsets = drawn.tolist()
        else:
            offsets = list(range(0, region, size_bytes))
        call = device.write if op.endswith("write") else device.read_into
        stride = len(offsets)
        issued = [itertools.count()]

        def one_op(worker, _):
            # One shared cursor, like fio's: whichever worker is free takes the next offset,
            # so a sequential run reaches the device (and any host read-ahead) in order.
            return call(offsets[next(issued[0]) % stride], buffers[worker])

        def restart():
            # Every round starts at the region's start, as every fio run does.
            issued[0] = itertools.count()

        log(f"cairn: {op} {format_size(size_bytes)} concurrency {concurrency}, {seconds} s "
            f"({device.kind}) ...")
        latencies, elapsed = await _timed_workers(concurrency, seconds, one_op,
                                                  [fio] if fio else [], log, rounds, restart)
        result = _summary(op, size_bytes, latencies, elapsed)
        result.update(device=path, concurrency=concurrency, implementation=device.kind)
        return _with_ratio(result, fio)
    finally:
        await device.aclose()


# -- store --------------------------------------------------------------------------------------

STORE_OPS = ("put", "get")
BENCH_COLLECTION = "bench"


def _fio_rw(op, size_bytes):
    """fio's --rw for a store op of objects of `size_bytes`, which is also its block size (see
    the module docstring)."""
    if size_bytes >= 1 << 20:
        return "write" if op == "put" else "read"
    return "randwrite" if op == "put" else "randread"


async def bench_store(path, op, size_bytes, concurrency, seconds, meta_dir=None,
                      compare_fio=True, fio_file=None, rounds=ROUNDS_DEFAULT, log=print):
    """Benchmark store puts or gets on a store made by mkfs at `path`."""
    from cairn.osd.errors import CollectionExists
    from cairn.osd.store import Store, Transaction
    assert op in STORE_OPS
    device = open_device(path, queue_depth=max(128, 2 * concurrency))
    store = None
    scratch = None
    try:
        store = await Store.open(device, meta_dir)
        free = store.statfs()["free_bytes"]
        name_count = max(concurrency, int(free * STORE_FILL_FRACTION_MAX) // max(size_bytes, 4096))
        name_count = min(name_count, max(concurrency, REGION_BYTES_DEFAULT // size_bytes))
        name_count -= name_count % concurrency
        fio = fio_durable = None
        if compare_fio and fio_available():
            fio_rw = _fio_rw(op, size_bytes)
            if fio_file is None and not device.is_block:
                scratch = fio_file = os.fspath(path) + ".fio-scratch"
            if fio_file is None:
                log("no fio comparison: pass --fio-file PATH (a scratch file or device on the "
                    "same kind of disk) for a block device")
            else:
                region = min(REGION_BYTES_DEFAULT, device.size_bytes)
                _fio_room(fio_file, region)
                if "read" in fio_rw:
                    log(f"laying out {format_size(region)} of {fio_file} for fio's read test ...")
                    lay_out(fio_file, region)
                log(f"fio on {fio_file}: {fio_rw} {format_size(size_bytes)} iodepth "
                    f"{concurrency}, {seconds} s ...")
                fio = _FioBaseline(
                    lambda: run_fio(fio_file, fio_rw, size_bytes, concurrency, seconds / rounds,
                                    region))
                if op == "put":
                    # Our puts are durable when acknowledged, fio's writes are not. The fair
                    # twin: the same fio job with an fdatasync after every `concurrency`
                    # objects, the most a store can batch into one flush when `concurrency`
                    # clients each wait for their acknowledgement.
                    every = concurrency
                    log(f"fio durable twin: the same job with --fdatasync={every}")
                    fio_durable = _FioBaseline(
                        lambda: run_fio(fio_file, fio_rw, size_bytes, concurrency,
                                        seconds / rounds, region, fdatasync=every),
                        label="fio --fdatasync")
        try:
            await store.create_collection(BENCH_COLLECTION)
        except CollectionExists:
            pass
        # Payloads sit in aligned pool buffers, as the messenger will receive them, so puts take
        # the store's zero-copy path; other sizes are copied into aligned buffers by the store.
        payloads = []
        for _ in range(concurrency):
            if size_bytes % 4096 == 0:
                payload = device.pool.get(size_bytes)
                payload[:] = os.urandom(size_bytes)
            else:
                payload = os.urandom(size_bytes)
            payloads.append(payload)
        names = [f"bench-{size_bytes}-{index:08d}" for index in range(name_count)]
        per_worker = name_count // concurrency

        async def one_put(worker, op_index):
            name = names[worker + concurrency * (op_index % per_worker)]
            await store.apply(Transaction().put(BENCH_COLLECTION, name, payloads[worker]))

        if op == "get":
            existing, _ = store.list_objects(BENCH_COLLECTION, prefix=f"bench-{size_bytes}-",
                                             limit=min(name_count, 10_000))
            if len(existing) < concurrency:
                log(f"writing {name_count} objects of {format_size(size_bytes)} to read back ...")

                async def fill(worker):
                    for index in range(per_worker):
                        await one_put(worker, index)

                async with asyncio.TaskGroup() as group:
                    for worker in range(concurrency):
                        group.create_task(fill(worker))
                existing = names
            # Names drawn before the clock starts, as for the device bench.
            drawn = np.random.default_rng(2).integers(0, len(existing), size=1 << 16).tolist()
            picks = [existing[index] for index in drawn]
            read, give_back = store.read, device.pool.put

            async def one_get(worker, op_index):
                give_back(await read(BENCH_COLLECTION,
                                     picks[(op_index * concurrency + worker) & 0xFFFF]))

            one_op = one_get
        else:
            one_op = one_put
        log(f"cairn store: {op} {format_size(size_bytes)} concurrency {concurrency}, {seconds} s "
            f"({device.kind}, {name_count} names) ...")
        baselines = [baseline for baseline in (fio, fio_durable) if baseline is not None]
        latencies, elapsed = await _timed_workers(concurrency, seconds, one_op, baselines, log,
                                                  rounds)
        result = _summary(op, size_bytes, latencies, elapsed)
        stats = store.statistics()
        result.update(device=path, concurrency=concurrency, implementation=device.kind,
                      transactions_per_commit=round(stats["transactions_per_commit"], 1),
                      flush_ms_avg=round(stats["flush_ms_avg"], 2),
                      meta_commit_ms_avg=round(stats["meta_commit_ms_avg"], 2))
        if fio_durable is not None:
            _with_ratio(result, fio_durable, "fio_durable", "rounds_durable")
        return _with_ratio(result, fio)
    finally:
        if store is not None:
            await store.close()
        await device.aclose()
        if scratch is not None and os.path.exists(scratch):
            os.unlink(scratch)


def format_result(result):
    line = (f"{result['op']} {format_size(result['size_bytes'])}: {result['ops']} ops in "
            f"{result['seconds']} s = {result['MBps']} MB/s, {result['iops']} IOPS, latency "
            f"p50 {result['lat_us_p50']} us, p99 {result['lat_us_p99']} us")
    fio = result.get("fio")
    if fio:
        line += (f"\nfio {fio['rw']} {format_size(fio['bs'])} iodepth {fio['iodepth']}: "
                 f"{fio['MBps']} MB/s, {fio['iops']} IOPS, p50 {fio['lat_us_p50']} us, p99 "
                 f"{fio['lat_us_p99']} us")
        for index, round_ in enumerate(result.get("rounds", ()), 1):
            line += (f"\n  round {index}: cairn {round_['MBps']} MB/s, fio around it "
                     f"{round_['fio_MBps']} MB/s, ratio {round_['ratio']}")
        line += f"\nratio cairn/fio (median over rounds): {result.get('ratio_vs_fio')}"
    durable = result.get("fio_durable")
    if durable:
        line += (f"\nfio with --fdatasync={durable['fdatasync']} (durable like our puts): "
                 f"{durable['MBps']} MB/s, {durable['iops']} IOPS; ratio cairn/durable fio: "
                 f"{result.get('ratio_vs_fio_durable')}")
    return line


def make_scratch_device(size_bytes):
    """A sparse file on disk (not tmpfs, which refuses O_DIRECT) for benches and demos."""
    directory = os.environ.get("CAIRN_SCRATCH_DIR") or tempfile.gettempdir()
    handle, path = tempfile.mkstemp(prefix="cairn-", suffix=".img", dir=directory)
    os.ftruncate(handle, size_bytes)
    os.close(handle)
    return path
