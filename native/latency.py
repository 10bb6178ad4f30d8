"""Device op latency histograms: the layout the io_uring ring fills in C, and their summaries.

Every device op that completes is counted in one cell of a (kind, size class, bucket) array:
- kind: read, write, flush, discard (the ring's op codes, in that order);
- size class: up to 4 KiB, up to 64 KiB, up to 1 MiB, larger (a flush is class 0): a 1 MiB write
  is not slow beside a 4 KiB one, so latency is compared within a class;
- bucket: the bit length of the latency in microseconds (bucket b holds [2^(b-1), 2^b) us,
  bucket 0 under 1 us), the last bucket open-ended (2^24 us is 16.8 s).
Beside the counts, the sum of latencies (ns) and of bytes per (kind, class).

The ring (native/_uring.pyx) records in C at completion, from a clock read once per reaped
batch: no Python per op. Latency there is from placing the op in the submission queue to reaping
its completion, so an event loop too busy to reap adds to it (on every OSD of a busy cluster
alike; the detector compares OSDs). The twins record through `LatencyRecorder` here, the same
bucketing in Python, which the tests compare with the ring's.

`summarise(before, after)` turns two snapshots into what an OSD reports per interval.
"""

import numpy as np

KINDS = ("read", "write", "flush", "discard")
SIZE_CLASS_LIMITS = (4096, 65536, 1 << 20)          # upper bounds; the last class is open
SIZE_CLASSES = len(SIZE_CLASS_LIMITS) + 1
SIZE_CLASS_NAMES = ("4K", "64K", "1M", "big")
BUCKETS = 26


def size_class(length):
    for index, limit in enumerate(SIZE_CLASS_LIMITS):
        if length <= limit:
            return index
    return SIZE_CLASSES - 1


def bucket(latency_ns):
    return min(int(latency_ns // 1000).bit_length(), BUCKETS - 1)


def bucket_bounds_s(index):
    """(low, high) seconds of a bucket (high of the last one: its low doubled)."""
    low = 0.0 if index == 0 else (1 << (index - 1)) * 1e-6
    return low, (1 << index) * 1e-6


class Snapshot:
    """Counts (kinds, classes, buckets), summed ns and bytes (kinds, classes), as uint64."""

    def __init__(self, counts=None, sum_ns=None, bytes_=None):
        self.counts = np.zeros((len(KINDS), SIZE_CLASSES, BUCKETS), np.uint64) \
            if counts is None else counts
        self.sum_ns = np.zeros((len(KINDS), SIZE_CLASSES), np.uint64) if sum_ns is None else sum_ns
        self.bytes = np.zeros((len(KINDS), SIZE_CLASSES), np.uint64) if bytes_ is None else bytes_

    @classmethod
    def from_raw(cls, counts, sum_ns, bytes_):
        """From the ring's three byte strings of native uint64."""
        return cls(np.frombuffer(counts, np.uint64).reshape(len(KINDS), SIZE_CLASSES, BUCKETS)
                   .copy(), np.frombuffer(sum_ns, np.uint64).reshape(len(KINDS), SIZE_CLASSES)
                   .copy(), np.frombuffer(bytes_, np.uint64).reshape(len(KINDS), SIZE_CLASSES)
                   .copy())

    def copy(self):
        return Snapshot(self.counts.copy(), self.sum_ns.copy(), self.bytes.copy())


class LatencyRecorder:
    """The twins' recorder (Python per op: the twins are references, not the shipped path)."""

    def __init__(self):
        self._snapshot = Snapshot()

    def record(self, kind, length, latency_ns):
        k, c = KINDS.index(kind), size_class(length)
        self._snapshot.counts[k, c, bucket(latency_ns)] += 1
        self._snapshot.sum_ns[k, c] += int(latency_ns)
        self._snapshot.bytes[k, c] += length

    def snapshot(self):
        return self._snapshot.copy()


def _quantile_s(counts, q):
    total = int(counts.sum())
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for index, count in enumerate(counts.tolist()):
        if count and seen + count >= rank:
            low, high = bucket_bounds_s(index)
            return low + (high - low) * (rank - seen) / count
        seen += count
    return bucket_bounds_s(BUCKETS - 1)[1]


def summarise(before, after):
    """{kind: {size class name: {count, mean_ms, p50_ms, p99_ms, bytes}}} of the ops completed
    between two snapshots (kinds and classes with no op left out)."""
    counts = after.counts - before.counts
    sum_ns = after.sum_ns - before.sum_ns
    moved = after.bytes - before.bytes
    out = {}
    for k, kind in enumerate(KINDS):
        for c, name in enumerate(SIZE_CLASS_NAMES):
            count = int(counts[k, c].sum())
            if not count:
                continue
            out.setdefault(kind, {})[name] = {
                "count": count, "mean_ms": round(int(sum_ns[k, c]) / count / 1e6, 3),
                "p50_ms": round(_quantile_s(counts[k, c], 0.5) * 1e3, 3),
                "p99_ms": round(_quantile_s(counts[k, c], 0.99) * 1e3, 3),
                "bytes": int(moved[k, c])}
    return out
