"""`cairn bench checkpoint`: a model's state from accelerator memory into cairn, and back.

    cairn bench checkpoint --pool data [--size 4G] [--tensor-size 256M] [--device cuda|cpu]
        [--streams 2] [--chunk 256M] [--metadata-pool META [--local-dir /var/tmp]] [--json]

A training job stands still while its checkpoint leaves the GPU; how long depends on how the
state is staged. On --size bytes of tensors (--tensor-size each) on --device, in one run:

1. pageable: `tensor.cpu()` of every tensor, as torch.save does: the stall and its GB/s.
2. pinned: every tensor copied into one pinned host buffer (non_blocking copies, one
   synchronize): the stall when the host has room for the whole state.
3. write: that host copy into cairn, one object per tensor (put_stream), --streams tensors at
   once. The job could run again meanwhile.
4. restore: every object read back into the host buffer (zeroed first), copied to --device and
   compared there with the tensor it came from.
5. bounded: the tensors through two pinned buffers of --chunk bytes, one buffer's copy from the
   GPU overlapping the other's puts: end to end, for a host short of memory.
6. files (with --metadata-pool, the pool's file namespace): the tensors as one state dict
   through torch.distributed.checkpoint to cairn://POOL (FsspecWriter/FsspecReader):
   dcp.save, dcp.async_save (its stall and its total) and dcp.load, beside torch.save + fsync
   and DCP to --local-dir, and `cairn bench cluster --op write --size 4M --concurrency 16`
   in the same run: the ratios the checkpoint issue asks for (dcp_save_vs_local_torch_save,
   dcp_load_vs_local_load, dcp_async_vs_save, dcp_save_vs_bench_write).

Everything it writes is deleted at the end. It needs PyTorch; the CPU build runs it with
--device cpu (staging is then a plain memory copy). Progress goes to stderr.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

from cairn.client import admin, errors
from cairn.client.cluster import Cluster, run_loop
from cairn.common.monclient import ClusterNotFound, MonitorsUnavailable
from cairn.common.units import format_size, parse_size

PREFIX = "cairn-bench-checkpoint"


def add_parser(kinds):
    bench = kinds.add_parser(
        "checkpoint", help="staging a model's state from GPU (or CPU) memory into cairn",
        description="\n\n".join(__doc__.split("\n\n")[2:]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--cluster", default=argparse.SUPPRESS,
                       help="cluster directory, cluster.json or HOST:PORT,...")
    bench.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object on the last line")
    bench.add_argument("--pool", required=True, help="the pool written to")
    bench.add_argument("--size", default="4G", help="bytes of state (default 4G)")
    bench.add_argument("--tensor-size", default="256M", help="bytes per tensor (default 256M)")
    bench.add_argument("--device", default=None,
                       help="where the tensors live: cuda, cuda:N or cpu (default: cuda when "
                            "there is one)")
    bench.add_argument("--streams", type=int, default=2,
                       help="tensors written or read at once (default 2)")
    bench.add_argument("--chunk", default="256M",
                       help="each of the two staging buffers of the bounded phase (default 256M)")
    bench.add_argument("--metadata-pool",
                       help="the pool's file namespace metadata pool: adds the DCP phase "
                            "(cairn://POOL through fsspec; needs --pool's filesystem)")
    bench.add_argument("--local-dir", default="/var/tmp",
                       help="where the DCP phase's local comparison is written (default "
                            "/var/tmp; removed after)")
    bench.add_argument("--bench-seconds", type=int, default=10,
                       help="seconds of `bench cluster --op write` in the DCP phase (default 10)")


def say(message):
    print(f"bench checkpoint: {message}", file=sys.stderr, flush=True)


class Staging:
    """The tensors, the device's synchronisation and the host buffers, for one device."""

    def __init__(self, torch, device, size, tensor_size):
        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.tensor_size = tensor_size
        self.tensors = []
        for index in range(max(1, size // tensor_size)):
            generator = torch.Generator(device=self.device).manual_seed(index)
            self.tensors.append(torch.randint(0, 256, (tensor_size,), dtype=torch.uint8,
                                              device=self.device, generator=generator))
        self.size = len(self.tensors) * tensor_size
        self.synchronize()

    def synchronize(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def host_buffer(self, size):
        """A host buffer of `size` bytes, pinned where the device is a GPU, its pages touched
        (a staging buffer is made once and reused, so its page faults are not staging)."""
        buffer = self.torch.empty(size, dtype=self.torch.uint8, pin_memory=self.cuda)
        buffer.zero_()
        return buffer

    async def copied(self):
        """Wait, without blocking the loop, for the copies queued so far."""
        if self.cuda:
            event = self.torch.cuda.Event()
            event.record()
            await asyncio.get_running_loop().run_in_executor(None, event.synchronize)

    def slices(self, host):
        return [host[i * self.tensor_size:(i + 1) * self.tensor_size]
                for i in range(len(self.tensors))]


def _gbps(size, seconds):
    return round(size / seconds / 1e9, 2) if seconds > 0 else None


def pageable_stall(staging):
    began = time.monotonic()
    if staging.cuda:
        copies = [tensor.cpu() for tensor in staging.tensors]
    else:
        copies = [tensor.clone() for tensor in staging.tensors]
    staging.synchronize()
    seconds = time.monotonic() - began
    del copies
    return seconds


def pinned_stall(staging, host):
    began = time.monotonic()
    for tensor, part in zip(staging.tensors, staging.slices(host)):
        part.copy_(tensor, non_blocking=True)
    staging.synchronize()
    return time.monotonic() - began


async def _bounded_streams(jobs, streams):
    """Run the coroutine functions in `jobs`, at most `streams` at a time; the first error
    stops the others and is raised."""
    queue = list(reversed(jobs))

    async def worker():
        while queue:
            await queue.pop()()
    workers = [asyncio.ensure_future(worker()) for _ in range(min(streams, len(jobs)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def write(pool, staging, host, streams, prefix=PREFIX):
    names = [f"{prefix}-{index}" for index in range(len(staging.tensors))]
    jobs = [lambda name=name, part=part: pool.put_stream(name, memoryview(part.numpy()))
            for name, part in zip(names, staging.slices(host))]
    began = time.monotonic()
    await _bounded_streams(jobs, streams)
    return time.monotonic() - began, names


async def restore(pool, staging, host, names, streams):
    """Seconds to read every object back into `host` and onto the device; whether every tensor
    came back equal, and the first that did not."""
    torch = staging.torch
    host.zero_()
    unequal = []

    async def read(index, name, part):
        view = memoryview(part.numpy())
        offset = 0
        async for chunk in pool.get_stream(name):
            if offset + len(chunk) > len(view):
                unequal.append(name)
                return
            view[offset:offset + len(chunk)] = chunk
            offset += len(chunk)
        if offset != staging.tensor_size:
            unequal.append(name)
            return
        back = part.to(staging.device, non_blocking=True)
        await staging.copied()
        if not torch.equal(back, staging.tensors[index]):
            unequal.append(name)

    jobs = [lambda i=i, name=name, part=part: read(i, name, part)
            for i, (name, part) in enumerate(zip(names, staging.slices(host)))]
    began = time.monotonic()
    await _bounded_streams(jobs, streams)
    staging.synchronize()
    return time.monotonic() - began, unequal


async def bounded(pool, staging, chunk, prefix=PREFIX):
    """Seconds to take every tensor through two pinned buffers of `chunk` bytes: the copy into
    one overlaps the puts from the other. The object names written."""
    buffers = [staging.host_buffer(chunk) for _ in range(2)]
    writing = [None, None]
    names = []
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    try:
        for index, tensor in enumerate(staging.tensors):
            for offset in range(0, staging.tensor_size, chunk):
                which = len(names) % 2
                if writing[which] is not None:
                    await writing[which]
                length = min(chunk, staging.tensor_size - offset)
                part = buffers[which][:length]
                part.copy_(tensor[offset:offset + length], non_blocking=True)
                await staging.copied()
                name = f"{prefix}-bounded-{index}-{offset}"
                names.append(name)
                writing[which] = loop.create_task(
                    pool.put_stream(name, memoryview(part.numpy())))
        for task in writing:
            if task is not None:
                await task
    finally:
        for task in writing:
            if task is not None and not task.done():
                task.cancel()
    return time.monotonic() - began, names


def files_phase(args, staging):
    """Phase 6: the tensors as one state dict through DCP to cairn:// and to --local-dir, and
    the object layer's write rate, in one run; every load compared with the state."""
    torch = staging.torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from cairn.client.bench_mount import _bench_cluster
    from cairn.client.fsspec_fs import CairnFileSystem
    state = {f"tensor{index}": tensor for index, tensor in enumerate(staging.tensors)}
    options = dict(cluster=args.cluster, metadata_pool=args.metadata_pool)
    base = f"{args.pool}/{PREFIX}-{os.urandom(3).hex()}"
    local = tempfile.mkdtemp(prefix=f"{PREFIX}-", dir=args.local_dir)
    result = {}
    # DCP warns on every call that no process group is set up: this is one process on purpose.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    def timed(name, call):
        began = time.monotonic()
        call()
        seconds = time.monotonic() - began
        result[f"{name}_s"] = round(seconds, 2)
        say(f"{name.replace('_', ' ')}: {seconds:.2f} s, {_gbps(staging.size, seconds)} GB/s")
        return seconds

    def torch_save():
        path = os.path.join(local, "state.pt")
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(reader):
        """Load into tensors zeroed first; the keys that came back unequal."""
        for tensor in targets.values():
            tensor.zero_()
        dcp.load(targets, storage_reader=reader)
        return [key for key, tensor in state.items() if not torch.equal(targets[key], tensor)]

    try:
        bench = _bench_cluster(args, "write", "4M", 16, "--cleanup")
        result["bench_write_MBps"] = round(bench["MBps"], 1)
        say(f"cairn bench cluster --op write --size 4M --concurrency 16: {bench['MBps']:.0f} MB/s")
        local_save = timed("local_torch_save", torch_save)
        timed("local_dcp_save", lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(os.path.join(local, "dcp"))))
        save = timed("dcp_save", lambda: dcp.save(
            state, storage_writer=FsspecWriter(f"cairn://{base}/dcp", **options)))
        began = time.monotonic()
        future = dcp.async_save(
            state, storage_writer=FsspecWriter(f"cairn://{base}/dcp-async", **options))
        stall = time.monotonic() - began
        future.result()
        async_total = time.monotonic() - began
        result.update(dcp_async_stall_s=round(stall, 2), dcp_async_total_s=round(async_total, 2))
        say(f"dcp.async_save: {stall:.2f} s stall, {async_total:.2f} s in all")
        targets = {key: torch.zeros_like(tensor) for key, tensor in state.items()}
        local_unequal = []
        local_load = timed("local_dcp_load", lambda: local_unequal.extend(
            load(dcp.FileSystemReader(os.path.join(local, "dcp")))))
        unequal = []
        cairn_load = timed("dcp_load", lambda: unequal.extend(
            load(FsspecReader(f"cairn://{base}/dcp", **options))))
        unequal += load(FsspecReader(f"cairn://{base}/dcp-async", **options))
        del targets
        result.update(
            dcp_equal=not unequal and not local_unequal, dcp_unequal=(unequal + local_unequal)[:10],
            dcp_save_vs_local_torch_save=round(local_save / save, 2),
            dcp_load_vs_local_load=round(local_load / cairn_load, 2),
            dcp_async_vs_save=round(async_total / save, 2),
            dcp_save_vs_bench_write=round(staging.size / save / 1e6 / bench["MBps"], 2))
        say("DCP: " + ("every load equal" if result["dcp_equal"]
                       else f"{len(unequal + local_unequal)} tensors NOT EQUAL"))
    finally:
        say("removing what the DCP phase wrote")
        shutil.rmtree(local, ignore_errors=True)
        fs = CairnFileSystem(**options)         # fsspec's kept instance: the writers' client
        try:
            if fs.exists(base):
                fs.rm(base, recursive=True)
        finally:
            fs.close()
    return result


async def _delete(pool, names):
    async def one(name):
        try:
            await pool.delete(name)
        except errors.ObjectNotFound:
            pass
    await asyncio.gather(*(one(name) for name in names))


async def run(args, staging, chunk):
    result = {}
    prefix = f"{PREFIX}-{os.urandom(3).hex()}"         # benches run at once keep apart
    async with await Cluster.connect(args.cluster) as cluster:
        pool = cluster.pool(args.pool)
        host = staging.host_buffer(staging.size)
        stall = pinned_stall(staging, host)
        result.update(pinned_stall_s=round(stall, 3), pinned_GBps=_gbps(staging.size, stall))
        say(f"pinned staging: {stall:.2f} s stall, {_gbps(staging.size, stall)} GB/s")
        names = []
        try:
            seconds, names = await write(pool, staging, host, args.streams, prefix)
            result.update(write_s=round(seconds, 2), write_GBps=_gbps(staging.size, seconds))
            say(f"write to pool {args.pool}: {seconds:.2f} s, "
                f"{_gbps(staging.size, seconds)} GB/s")
            seconds, unequal = await restore(pool, staging, host, names, args.streams)
            result.update(restore_s=round(seconds, 2), restore_GBps=_gbps(staging.size, seconds),
                          restore_equal=not unequal, restore_unequal=unequal[:10])
            say(f"restore: {seconds:.2f} s, {_gbps(staging.size, seconds)} GB/s, "
                + ("every tensor equal" if not unequal else f"{len(unequal)} NOT EQUAL"))
            await _delete(pool, names)
            del host
            names = []
            seconds, names = await bounded(pool, staging, chunk, prefix)
            result.update(bounded_s=round(seconds, 2), bounded_GBps=_gbps(staging.size, seconds))
            say(f"bounded (2 x {format_size(chunk)} pinned): {seconds:.2f} s, "
                f"{_gbps(staging.size, seconds)} GB/s end to end")
        finally:
            say("removing what the benchmark wrote")
            await _delete(pool, names)
    return result


def main(args):
    def fail(code, message):
        return admin.fail(args, code, message, 2)
    try:
        size, tensor_size, chunk = (parse_size(args.size), parse_size(args.tensor_size),
                                    parse_size(args.chunk))
    except ValueError as exc:
        return fail("invalid", str(exc))
    if min(size, tensor_size, chunk) <= 0 or args.streams < 1 or args.bench_seconds < 1:
        return fail("invalid", "--size, --tensor-size, --chunk, --streams and --bench-seconds "
                    "must be positive")
    if args.metadata_pool and not os.path.isdir(args.local_dir):
        return fail("invalid", f"--local-dir {args.local_dir}: not a directory")
    tensor_size = min(tensor_size, size)
    try:
        import torch
    except ImportError:
        return fail("no_torch", "PyTorch is not installed (pip install torch; the CPU build "
                    "runs this with --device cpu)")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        return fail("no_device", f"--device {device}: this PyTorch sees no CUDA device")
    try:
        torch.device(device)
    except RuntimeError as exc:
        return fail("invalid", f"--device {device}: {exc}")
    say(f"making {format_size(size)} of tensors ({format_size(tensor_size)} each) on {device}")
    staging = Staging(torch, device, size, tensor_size)
    result = {"device": device, "device_name": (torch.cuda.get_device_name(staging.device)
                                                if staging.cuda else "cpu"),
              "size_bytes": staging.size, "tensors": len(staging.tensors),
              "chunk_bytes": chunk, "streams": args.streams}
    stall = pageable_stall(staging)
    result.update(pageable_stall_s=round(stall, 3), pageable_GBps=_gbps(staging.size, stall))
    say(f"pageable staging (tensor.cpu()): {stall:.2f} s stall, "
        f"{_gbps(staging.size, stall)} GB/s")
    try:
        result.update(run_loop(run(args, staging, chunk)))
    except errors.ClientError as exc:
        return fail("client_error", f"{type(exc).__name__}: {exc}")
    except (ClusterNotFound, MonitorsUnavailable) as exc:
        return fail("unavailable", str(exc))
    if args.metadata_pool:
        try:
            result.update(files_phase(args, staging))
        except OSError as exc:
            return fail("client_error", f"the DCP phase through cairn://{args.pool}: {exc}")
        except subprocess.CalledProcessError as exc:
            return fail("client_error", "cairn bench cluster in the DCP phase: "
                        + ((exc.stderr or "").strip().splitlines() or ["failed"])[-1])
    else:
        say("no --metadata-pool: the DCP phase through cairn:// is skipped")
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(f"{key}: {value}" for key, value in result.items()))
    return 0 if result.get("restore_equal") and result.get("dcp_equal", True) else 1
