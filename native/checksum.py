"""crc32c (Castagnoli), the checksum of every 4 KiB of stored data and of every frame.

One function, `crc32c(data, value=0)`, through the `crc32c` package: it uses the CPU's crc32
instructions and reads memoryviews without copying (DESIGN.md: 13.5 GB/s; google-crc32c would
force a copy, and crcmod, 30x slower, is the oracle in tests only).

`block_crcs(view, block_size)` checksums each block of a buffer and returns the bytes of a
little-endian uint32 array, the per-4-KiB form the store keeps in its records. It is native (`_blockcrc.pyx`, three blocks at a time with the
crc32 instruction): a profile of store puts spent 21% in the Python loop that is now
`block_crcs_reference`, kept as the twin the tests compare it with. `CAIRN_NO_EXTENSIONS=1`
selects the reference.
"""

import os


import numpy as np
from crc32c import crc32c as _crc32c


def crc32c(data, value=0):
    """crc32c of `data` (any buffer), continuing from `value`."""
    return _crc32c(data, value)


def block_crcs_reference(view, block_size):
    """crc32c of each `block_size` block of `view` (its length a multiple of `block_size`)."""
    length = memoryview(view).nbytes
    if block_size <= 0 or length % block_size != 0:
        raise ValueError(f"buffer of {length} bytes is not a whole number of {block_size}-byte "
                         "blocks")
    count = length // block_size
    out = np.empty(count, dtype="<u4")
    view = memoryview(view).cast("B")
    for index in range(count):
        start = index * block_size
        out[index] = _crc32c(view[start:start + block_size])
    return out.tobytes()


if os.environ.get("CAIRN_NO_EXTENSIONS", "") not in ("", "0"):
    block_crcs = block_crcs_reference
else:
    try:
        from cairn.native._blockcrc import block_crcs  # noqa: F401 (the selected twin)
    except ImportError as exc:
        raise ImportError("cairn's native checksum extension (cairn.native._blockcrc) is not "
                          "built; run 'pip install -e .' in the source tree, or set "
                          "CAIRN_NO_EXTENSIONS=1 for the slow reference") from exc
