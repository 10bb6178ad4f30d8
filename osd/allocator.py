"""Block allocator: a bitmap over the data area (pure: no I/O, no clock).

Theory of operation. Two bitmaps, one byte per block in memory (packed to bits when persisted):

- `committed` is the truth as of the last durable metadata commit. It is what RocksDB holds, in
  segments of `SEGMENT_BLOCKS` bits (`segment_bytes()`), and what fsck checks against the object
  records.
- `in_use` is `committed` plus blocks reserved by transactions not yet committed, plus blocks
  freed by commits that readers may still be reading. Allocation searches `in_use`.

Rules:
1. A block is reserved (`reserve`) before its data is written, so concurrent transactions never
   share a block.
2. `commit(allocated, freed)` moves a transaction's blocks into and out of `committed`; it is
   called while building the metadata batch, and the dirty segments it returns go in that batch.
3. Freed blocks leave `in_use` only through `release()`, which the store calls once the commit is
   durable and no read that started before it is still running. So a crash can never expose a
   block that a durable record still references, and a slow reader never reads reused blocks.
4. A failed transaction gives its reservations back with `unreserve()`; they never reached
   `committed`.

This is BlueStore's split between the allocator and the freelist manager, in one small class.

Each bitmap is a bytearray with a numpy view over the same memory: per-transaction checks and
updates of a few blocks use the bytearray (`find` is a C memchr, slice assignment a memset, both
well under a microsecond), whole-range scans use numpy. A numpy call on a small slice costs a few
microseconds, which at 4 KiB puts was a third of the store's CPU.
"""

import numpy as np

# Blocks per persisted bitmap segment: 32,768 bits = 4 KiB per RocksDB value, covering 128 MiB.
SEGMENT_BLOCKS = 32768


class Allocator:
    def __init__(self, block_count):
        assert block_count > 0
        self.block_count = block_count
        self._committed = bytearray(block_count)
        self._in_use = bytearray(block_count)
        self.committed = np.frombuffer(self._committed, dtype=np.uint8)   # same memory
        self.in_use = np.frombuffer(self._in_use, dtype=np.uint8)
        self.in_use_count = 0
        self.committed_count = 0
        self.cursor = 0

    # -- persistence ------------------------------------------------------------------------

    @property
    def segment_count(self):
        return -(-self.block_count // SEGMENT_BLOCKS)

    def segment_bytes(self, index):
        assert 0 <= index < self.segment_count
        start = index * SEGMENT_BLOCKS
        return np.packbits(self.committed[start:start + SEGMENT_BLOCKS]).tobytes()

    def load_segment(self, index, data):
        assert 0 <= index < self.segment_count
        start = index * SEGMENT_BLOCKS
        stop = min(start + SEGMENT_BLOCKS, self.block_count)
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[:stop - start]
        self.committed[start:stop] = bits
        self.in_use[start:stop] = bits

    def loaded(self):
        """Call once after every segment is loaded: recount."""
        self.committed_count = int(np.count_nonzero(self.committed))
        self.in_use_count = int(np.count_nonzero(self.in_use))

    # -- allocation -------------------------------------------------------------------------

    @property
    def free_count(self):
        return self.block_count - self.in_use_count

    def reserve(self, count):
        """Reserve `count` blocks; returns a list of (start, count) extents, or None when too
        few blocks are free. Contiguous when possible (next-fit from a cursor), else the free
        runs in address order."""
        assert count > 0
        if count > self.free_count:
            return None
        start = self._find_run(count)
        if start is not None:
            extents = [(start, count)]
        else:
            extents = self._gather_runs(count)
        in_use = self._in_use
        for first, length in extents:
            in_use[first:first + length] = _ones(length)
        self.in_use_count += count
        last_first, last_length = extents[-1]
        self.cursor = (last_first + last_length) % self.block_count
        return extents

    def unreserve(self, extents):
        """Give back blocks reserved by a transaction that will not commit."""
        self._free_uncommitted(extents)

    def commit(self, allocated, freed):
        """Apply one transaction to `committed`; returns the set of dirty segment indices."""
        dirty = set()
        committed = self._committed
        for first, length in allocated:
            end = first + length
            # Pairs with reserve(): a reserved block was free in `in_use`, hence in `committed`.
            assert committed.find(1, first, end) == -1, (first, length)
            committed[first:end] = _ones(length)
            self.committed_count += length
            dirty.update(range(first // SEGMENT_BLOCKS, (end - 1) // SEGMENT_BLOCKS + 1))
        for first, length in freed:
            end = first + length
            assert committed.find(0, first, end) == -1, (first, length)
            committed[first:end] = bytes(length)
            self.committed_count -= length
            dirty.update(range(first // SEGMENT_BLOCKS, (end - 1) // SEGMENT_BLOCKS + 1))
        return dirty

    def release(self, freed):
        """Make blocks freed by a durable commit available again (rule 3)."""
        self._free_uncommitted(freed)

    def _free_uncommitted(self, extents):
        # Blocks in use and not committed (reserved and dropped, or freed by a durable commit)
        # become free.
        in_use, committed = self._in_use, self._committed
        for first, length in extents:
            end = first + length
            assert in_use.find(0, first, end) == -1, (first, length)
            assert committed.find(1, first, end) == -1, (first, length)
            in_use[first:end] = bytes(length)
            self.in_use_count -= length

    # -- search -----------------------------------------------------------------------------

    def _find_run(self, count):
        cursor = self.cursor
        if cursor + count <= self.block_count and self._in_use.find(1, cursor,
                                                                    cursor + count) == -1:
            return cursor
        for low, high in ((cursor, self.block_count), (0, min(cursor + count,
                                                               self.block_count))):
            starts, lengths = self._free_runs(low, high)
            fits = np.flatnonzero(lengths >= count)
            if fits.size:
                return low + int(starts[fits[0]])
        return None

    def _gather_runs(self, count):
        starts, lengths = self._free_runs(0, self.block_count)
        extents = []
        remaining = count
        for start, length in zip(starts.tolist(), lengths.tolist()):
            take = min(length, remaining)
            extents.append((start, take))
            remaining -= take
            if remaining == 0:
                return extents
        raise AssertionError("free_count said enough blocks were free")

    def _free_runs(self, low, high):
        """(starts relative to `low`, lengths) of the free runs of `in_use[low:high]`."""
        free = (self.in_use[low:high] == 0).astype(np.int8)
        edges = np.diff(np.concatenate(([0], free, [0])))
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1)
        return starts, ends - starts


_ONES = b"\x01" * 4096


def _ones(length):
    return _ONES[:length] if length <= len(_ONES) else b"\x01" * length
