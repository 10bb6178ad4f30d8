"""The in-memory, fault-injecting block device: the simulation twin.

Same interface and errors as `UringBlockDevice`, plus the faults real hardware shows, in the style
of TigerBeetle's `src/testing/storage.zig`:

- latency per operation (`latency_s`, or a callable returning seconds);
- EIO on reads or writes touching chosen byte ranges (`fail_reads`, `fail_writes`);
- bit rot (`flip_bit`);
- a crash: `crash(rng)` freezes the device (every later call raises `DeviceGone`) and decides the
  fate of every write not yet covered by a completed flush, independently per write: lost whole,
  kept whole, or torn at 4 KiB granularity (a random subset of its blocks reaches the media).
  `image()` then returns the bytes a remount would see, and `MemoryBlockDevice(image=...)` opens
  them. `crash_after_ops` crashes by itself when that many operations have been issued.

The model: `media` holds what survives power loss; `cache` is what reads see (the media plus
every completed write). A flush applies to `media` the writes that completed before it was issued;
a crash decides only over the writes not yet so applied.
"""

import asyncio
import time

from cairn.native.blockdev import _DeviceBase
from cairn.native.bufpool import ALIGN_BYTES
from cairn.native.errors import DeviceGone, DeviceIOError


class MemoryBlockDevice(_DeviceBase):
    kind = "memory"

    def __init__(self, size_bytes=None, *, image=None, path="memory", latency_s=0.0,
                 crash_after_ops=None, rng=None, pool=None):
        if image is not None:
            size_bytes = len(image)
        assert size_bytes is not None and size_bytes % ALIGN_BYTES == 0, size_bytes
        super().__init__(path, size_bytes, pool)
        self.cache = bytearray(image) if image is not None else bytearray(size_bytes)
        self.media = bytearray(self.cache)
        self.unflushed = []                # (offset, bytes) of completed, unflushed writes
        self.inflight_writes = []          # (offset, bytes) issued, not yet completed
        self.latency_s = latency_s
        self.fail_reads = []               # (offset, length) ranges that return EIO
        self.fail_writes = []
        self.crash_after_ops = crash_after_ops
        self.rng = rng
        self.crashed = False
        self.issued_ops = 0

    # -- fault controls -------------------------------------------------------------------

    def flip_bit(self, offset, bit=0):
        """Flip one bit in both the cache and the media (bit rot at rest)."""
        self.cache[offset] ^= 1 << bit
        self.media[offset] ^= 1 << bit

    def crash(self, rng=None):
        """Power loss now. Every unflushed or in-flight write is lost, kept or torn."""
        if self.crashed:
            return
        rng = rng or self.rng
        assert rng is not None, "a crash needs a seeded random.Random to decide fates"
        self.crashed = True
        for offset, data in self.unflushed + self.inflight_writes:
            fate = rng.randrange(3)
            if fate == 0:                                     # lost
                continue
            block_count = len(data) // ALIGN_BYTES
            for index in range(block_count):
                if fate == 1 or rng.randrange(2):             # kept whole, or this torn block
                    start = index * ALIGN_BYTES
                    self.media[offset + start:offset + start + ALIGN_BYTES] = \
                        data[start:start + ALIGN_BYTES]
        self.unflushed.clear()
        self.inflight_writes.clear()

    def image(self):
        """The bytes a remount after a crash (or a clean shutdown) would see."""
        if not self.crashed:
            return bytes(self.cache)
        return bytes(self.media)

    # -- the device interface -------------------------------------------------------------

    async def _enter(self, op, offset, length):
        if self.crashed:
            raise DeviceGone(f"{self.path}: {op} after a crash", path=self.path, offset=offset,
                             length=length)
        self._check(op, offset, length)
        self.issued_ops += 1
        if self.crash_after_ops is not None and self.issued_ops >= self.crash_after_ops:
            self.crash()
            raise DeviceGone(f"{self.path}: crashed during {op}", path=self.path,
                             offset=offset, length=length)
        latency = self.latency_s() if callable(self.latency_s) else self.latency_s
        started = time.perf_counter_ns()
        await asyncio.sleep(latency)
        if self.crashed:
            raise DeviceGone(f"{self.path}: crashed during {op}", path=self.path,
                             offset=offset, length=length)
        self._record(op, length, started)

    @staticmethod
    def _overlaps(ranges, offset, length):
        return any(start < offset + length and offset < start + size for start, size in ranges)

    async def read_into(self, offset, buffer):
        view = memoryview(buffer).cast("B")
        await self._enter("read", offset, len(view))
        if self._overlaps(self.fail_reads, offset, len(view)):
            raise DeviceIOError(f"{self.path}: read of {len(view)} bytes at offset {offset} "
                                "failed: Input/output error (injected)", path=self.path,
                                offset=offset, length=len(view), errno=5)
        view[:] = self.cache[offset:offset + len(view)]

    async def write(self, offset, buffer):
        data = bytes(memoryview(buffer).cast("B"))
        entry = (offset, data)
        self.inflight_writes.append(entry)
        try:
            await self._enter("write", offset, len(data))
        finally:
            if not self.crashed:
                self.inflight_writes.remove(entry)
        if self._overlaps(self.fail_writes, offset, len(data)):
            raise DeviceIOError(f"{self.path}: write of {len(data)} bytes at offset {offset} "
                                "failed: Input/output error (injected)", path=self.path,
                                offset=offset, length=len(data), errno=5)
        self.cache[offset:offset + len(data)] = data
        self.unflushed.append(entry)

    async def flush(self):
        covered = len(self.unflushed)
        await self._enter("flush", 0, 0)
        # Only writes completed before the flush was issued are made durable by it.
        for offset, data in self.unflushed[:covered]:
            self.media[offset:offset + len(data)] = data
        del self.unflushed[:covered]

    async def discard(self, offset, length):
        await self._enter("discard", offset, length)
        zeros = bytes(length)
        self.cache[offset:offset + length] = zeros
        self.unflushed.append((offset, zeros))

    def close(self):
        self.closed = True
