"""crc32c (Castagnoli), the checksum of every 4 KiB of stored data and of every frame.

One function, `crc32c(data, value=0)`, through the `crc32c` package: it uses the CPU's crc32
instructions and reads memoryviews without copying (DESIGN.md: 13.5 GB/s; google-crc32c would
force a copy, and crcmod, 30x slower, is the oracle in tests only).

`block_crcs(view, block_size)` checksums each block of a buffer and returns the bytes of a
little-endian uint32 array, the per-4-KiB form the store keeps in its records. It is native (`_blockcrc.pyx`, three blocks at a time with the
crc32 instruction): a profile of store puts spent 21% in the Python loop that is now
`block_crcs_reference`, kept as the twin the tests compare it with. `CAIRN_NO_EXTENSIONS=1`
selects the reference.

`crc_and_block_crcs(view)` reads a received payload once for both checksums: the block crcs,
folded into the crc of the whole (`fold`: crc(A || B) is crc(A) advanced over len(B) zero bytes,
xor crc(B); for 4 KiB blocks that advance is four table lookups, no bytes read). The frame layer
checks a large payload's checksum that way and hands the block crcs on, so a store that writes
the buffer as it is need not read it again.
"""

import os


import numpy as np
from crc32c import crc32c as _crc32c


# crc32c(data, value=0): crc32c of `data` (any buffer), continuing from `value`. The package's
# own C function, not a wrapper: frames call it several times each, and a Python wrapper's
# call cost more than checksumming a small header.
crc32c = _crc32c


FOLD_BLOCK_BYTES = 4096


def fold_reference(crcs, crc=0):
    """crc32c of bytes whose crc32c is `crc` then FOLD_BLOCK_BYTES blocks whose crc32cs are
    `crcs` (a little-endian uint32 array's bytes): the register advanced bit by bit."""
    for block_crc in np.frombuffer(bytes(crcs), dtype="<u4"):
        for _ in range(FOLD_BLOCK_BYTES * 8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        crc ^= int(block_crc)
    return crc


def crc_and_block_crcs(view):
    """(crc32c of `view`, crc32c of each of its whole FOLD_BLOCK_BYTES blocks as `block_crcs`
    gives them); the bytes are read once (a tail short of a block is checksummed on its own)."""
    view = memoryview(view).cast("B")
    whole = view.nbytes - view.nbytes % FOLD_BLOCK_BYTES
    crcs = block_crcs(view[:whole], FOLD_BLOCK_BYTES) if whole else b""
    crc = fold(crcs)
    if whole < view.nbytes:
        crc = _crc32c(view[whole:], crc)
    return crc, crcs


def range_crc(view, crcs, start, length):
    """crc32c of `view[start:start + length]`, where `view` holds FOLD_BLOCK_BYTES blocks whose
    crc32cs are `crcs` (as `block_crcs` gives them; a stored object's, just verified): the
    blocks wholly inside the range are folded from their crcs without reading them, and only
    a partial first or last block is read. A get's reply needs this checksum of data the store
    has just checked block by block, so the data is read once, not twice."""
    view = memoryview(view).cast("B")
    end = start + length
    first = -(-start // FOLD_BLOCK_BYTES)           # the first block wholly inside the range
    stop = end // FOLD_BLOCK_BYTES                  # ... and the block after the last one
    if first >= stop or fold is fold_reference:     # (the reference folds bit by bit)
        return _crc32c(view[start:end])
    crc = _crc32c(view[start:first * FOLD_BLOCK_BYTES])           # empty slices: crc as it is
    crc = fold(memoryview(crcs)[first * 4:stop * 4], crc)
    return _crc32c(view[stop * FOLD_BLOCK_BYTES:end], crc)


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
    block_crcs, fold = block_crcs_reference, fold_reference
else:
    try:
        from cairn.native._blockcrc import block_crcs, fold  # noqa: F401 (the selected twins)
        from cairn.native._blockcrc import FOLD_BLOCK_BYTES as _NATIVE_FOLD_BLOCK_BYTES
    except ImportError as exc:
        raise ImportError("cairn's native checksum extension (cairn.native._blockcrc) is not "
                          "built; run 'pip install -e .' in the source tree, or set "
                          "CAIRN_NO_EXTENSIONS=1 for the slow reference") from exc
    assert _NATIVE_FOLD_BLOCK_BYTES == FOLD_BLOCK_BYTES, "the native fold's tables are for " \
        f"{_NATIVE_FOLD_BLOCK_BYTES}-byte blocks"
