"""crc32c (Castagnoli), the checksum of every 4 KiB of stored data and of every frame.

One function, `crc32c(data, value=0)`, through the `crc32c` package: it uses the CPU's crc32
instructions and reads memoryviews without copying (DESIGN.md: 13.5 GB/s; google-crc32c would
force a copy, and crcmod, 30x slower, is the oracle in tests only).

`block_crcs(view, block_size)` checksums each block of a buffer into a numpy uint32 array, the
per-4-KiB form the store keeps.
"""

import numpy as np
from crc32c import crc32c as _crc32c


def crc32c(data, value=0):
    """crc32c of `data` (any buffer), continuing from `value`."""
    return _crc32c(data, value)


def block_crcs(view, block_size):
    """crc32c of each `block_size` block of `view` (its length a multiple of `block_size`)."""
    length = len(view)
    assert length % block_size == 0, (length, block_size)
    count = length // block_size
    out = np.empty(count, dtype=np.uint32)
    view = memoryview(view).cast("B")
    for index in range(count):
        start = index * block_size
        out[index] = _crc32c(view[start:start + block_size])
    return out
