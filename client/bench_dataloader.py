"""`cairn bench dataloader`: a PyTorch DataLoader reading a dataset of small files, through a
cairn mount, through `cairn://` (fsspec, no kernel in the way) and from a local directory,
in one run.

    cairn bench dataloader --mountpoint /mnt/c --pool data --metadata-pool meta \\
        [--files 10000] [--size 64K] [--workers 4] [--batch 32] [--local DIR] [--json]

It writes FILES files of SIZE bytes through the mount (the mount of POOL, without a prefix,
so `cairn://POOL/...` names the same files) and the same bytes into --local (default: a
directory under /var/tmp, on the machine's own disk), then reads every file once per source
in a shuffled order: a map-style Dataset whose item is one file read whole into a uint8
tensor, batched by a DataLoader with WORKERS worker processes. Each worker checks the bytes
it read (wrong reads are counted). The page cache is dropped before each source (root only),
so every read is cold. Reported per source: samples/s, MB/s, seconds, wrong; and each cairn
source's samples/s over the local disk's. Without --pool the cairn:// source is left out.
Everything it writes is removed at the end. With --json the last line of stdout is one JSON
object.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
import time

from cairn.client.bench_files import _drop_caches, content
from cairn.common.units import parse_size

SOURCES = ("local", "mount", "cairn")


def add_parser(kinds):
    bench = kinds.add_parser(
        "dataloader", help="a PyTorch DataLoader over small files: mount, cairn:// and local "
                           "disk side by side", description=__doc__.split("\n\n")[2])
    bench.add_argument("--cluster", default=argparse.SUPPRESS,
                       help="cluster directory, cluster.json or HOST:PORT,... (for cairn://)")
    bench.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object on the last line")
    bench.add_argument("--mountpoint", required=True, help="a cairn mount of --pool")
    bench.add_argument("--pool", help="the mount's data pool, for the cairn:// source")
    bench.add_argument("--metadata-pool", help="its metadata pool")
    bench.add_argument("--local", help="a local directory for the same files (default: one "
                                       "made under /var/tmp)")
    bench.add_argument("--files", type=int, default=10_000, help="how many (default 10000)")
    bench.add_argument("--size", default="64K", help="bytes per file (default 64K)")
    bench.add_argument("--workers", type=int, default=4,
                       help="DataLoader worker processes (default 4)")
    bench.add_argument("--batch", type=int, default=32, help="samples per batch (default 32)")


def say(message):
    print(f"bench dataloader: {message}", file=sys.stderr, flush=True)


def _digest(data):
    return hashlib.blake2b(data, digest_size=16).digest()


class FileDataset:
    """Item i: file i read whole, as a uint8 tensor, and whether its bytes were right. The
    cairn:// filesystem is made in each worker (a fork connects again: client/fsspec_fs.py)."""

    def __init__(self, source, root, files, size, options):
        self.source, self.root, self.files, self.size = source, root, files, size
        self.options = options
        self.expected = [_digest(content(i, size)) for i in range(files)]
        self._fs = None

    def __len__(self):
        return self.files

    def _read(self, i):
        path = f"{self.root}/f{i:08d}"
        if self.source != "cairn":
            with open(path, "rb", buffering=0) as handle:
                return handle.read()
        if self._fs is None:
            import fsspec
            self._fs = fsspec.filesystem("cairn", **self.options)
        return self._fs.cat_file(path)

    def __getitem__(self, i):
        import torch
        data = self._read(i)
        right = len(data) == self.size and _digest(data) == self.expected[i]
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), right


def _collate(samples):
    import torch
    return torch.stack([tensor for tensor, _ in samples]), sum(not right for _, right in samples)


def _epoch(dataset, args):
    import torch
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
        collate_fn=_collate, generator=torch.Generator().manual_seed(41))
    wrong = samples = 0
    started = time.perf_counter()
    for batch, bad in loader:
        samples += batch.shape[0]
        wrong += bad
    seconds = time.perf_counter() - started
    return {"samples": samples, "seconds": round(seconds, 3),
            "samples_per_s": round(samples / seconds, 1),
            "mb_per_s": round(samples * dataset.size / seconds / 1e6, 1), "wrong": wrong}


def _write(root, files, size, threads=16):
    os.makedirs(root)

    def one(i):
        with open(f"{root}/f{i:08d}", "wb") as handle:
            handle.write(content(i, size))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(files)))


def main(args):
    try:
        import torch.utils.data
        del torch
    except ImportError:
        print("cairn bench dataloader: needs PyTorch (pip install torch)", file=sys.stderr)
        return 2
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        print(f"cairn bench dataloader: {exc}", file=sys.stderr)
        return 2
    if args.files < 1 or args.workers < 0 or args.batch < 1 or size < 1:
        print("cairn bench dataloader: --files, --batch and --size are at least 1, --workers "
              "at least 0", file=sys.stderr)
        return 2
    if not os.path.ismount(args.mountpoint):
        print(f"cairn bench dataloader: {args.mountpoint} is not a mount point",
              file=sys.stderr)
        return 2
    name = f"cairn-bench-dataloader-{os.getpid()}"
    local_top = args.local or "/var/tmp"
    roots = {"local": os.path.join(local_top, name),
             "mount": os.path.join(args.mountpoint, name),
             "cairn": f"{args.pool}/{name}"}
    sources = [s for s in SOURCES if s != "cairn" or args.pool]
    options = {"cluster": getattr(args, "cluster", None), "metadata_pool": args.metadata_pool}
    say(f"{args.files} files of {size} bytes, {args.workers} workers, batches of "
        f"{args.batch}: {', '.join(sources)}")
    results = {}
    try:
        for where in ("local", "mount"):
            began = time.monotonic()
            _write(roots[where], args.files, size)
            say(f"wrote {where} in {time.monotonic() - began:.1f} s")
        for source in sources:
            _drop_caches(roots["mount"])
            results[source] = _epoch(FileDataset(source, roots[source], args.files, size,
                                                 options), args)
            r = results[source]
            say(f"{source}: {r['samples_per_s']} samples/s, {r['mb_per_s']} MB/s, wrong "
                f"{r['wrong']}")
    finally:
        for where in ("local", "mount"):
            shutil.rmtree(roots[where], ignore_errors=True)
    report = {"files": args.files, "size": size, "workers": args.workers,
              "batch": args.batch, "sources": results}
    for source in sources:
        if source != "local":
            report[f"{source}_vs_local"] = round(
                results[source]["samples_per_s"] / results["local"]["samples_per_s"], 2)
    for source in sources:
        r = results[source]
        ratio = report.get(f"{source}_vs_local")
        print(f"{source:6s} {r['samples_per_s']:>10} samples/s {r['mb_per_s']:>8} MB/s  wrong "
              f"{r['wrong']}" + (f"  {ratio}x local" if ratio is not None else ""))
    if getattr(args, "json", False):
        print(json.dumps(report))
    return 1 if any(results[s]["wrong"] for s in sources) else 0
