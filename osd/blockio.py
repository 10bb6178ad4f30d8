"""Extents of device blocks: splitting them for I/O, finding a transaction's own staged bytes,
and set arithmetic on block lists (the store's planner and reader share these; pure but for
`gather_all`, which awaits the reads or writes it is given).
"""

import asyncio

from cairn.common.limits import DEVICE_IO_BYTES_MAX


def chunks(start, length, block_size):
    """Split an extent into pieces of at most DEVICE_IO_BYTES_MAX."""
    per_io = DEVICE_IO_BYTES_MAX // block_size
    while length > 0:
        take = min(length, per_io)
        yield start, take
        start += take
        length -= take


def staged_bytes(staged, first, count, block_size):
    """The new bytes of device blocks [first, first + count) if this transaction wrote them
    (they lie inside one staged extent), else None."""
    if not staged:
        return None
    for start, (length, view) in staged.items():
        if start <= first and first + count <= start + length:
            offset = (first - start) * block_size
            return view[offset:offset + count * block_size]
    return None


def runs(start, length, own_blocks):
    """Split extent [start, start + length) into runs by membership in `own_blocks`:
    yields (run_start, run_length, is_own)."""
    run_start = start
    run_own = start in own_blocks
    for block in range(start + 1, start + length):
        is_own = block in own_blocks
        if is_own != run_own:
            yield run_start, block - run_start, run_own
            run_start, run_own = block, is_own
    yield run_start, start + length - run_start, run_own


def blocks(extents):
    return {block for start, length in extents for block in range(start, start + length)}


def remove_blocks(extents, start, length):
    """Remove blocks [start, start + length) from a list of extents, in place."""
    out = []
    end = start + length
    for first, count in extents:
        last = first + count
        if last <= start or first >= end:
            out.append((first, count))
            continue
        if first < start:
            out.append((first, start - first))
        if last > end:
            out.append((end, last - end))
    extents[:] = out


async def gather_all(awaitables):
    """Await all; if any fails, wait for the rest (their buffers are in the kernel) and raise
    the first failure."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
