"""Aligned buffers for O_DIRECT, handed out as memoryviews and recycled.

O_DIRECT needs buffer addresses aligned to the device's logical block size; anonymous `mmap`
memory is page-aligned (4 KiB), so every buffer here is an `mmap` of a size class (a power of two,
4 KiB and up). Recycling matters: a fresh 4 MiB mapping costs 1,024 page faults on first touch,
which would cap a reader near a few GB/s.

A buffer not returned with `put()` is simply garbage-collected; returning one is an optimisation,
never a requirement, so a caller cannot leak device memory by forgetting. A returned buffer must
not be used again by the caller.
"""

import mmap

# O_DIRECT alignment: the page size, which is also the largest logical block size of the devices
# we target (4Kn NVMe). `cairn.common.limits` asserts that the store's block is a multiple of it.
ALIGN_BYTES = 4096

# Free buffers kept per size class: enough for a queue depth of 4 MiB ops (64 x 4 MiB = 256 MiB)
# without holding memory forever.
POOL_BUFFERS_PER_CLASS_MAX = 64


class BufferPool:
    """Free lists of aligned buffers by size class.

    >>> pool = BufferPool()
    >>> view = pool.get(10_000)     # writable, page-aligned
    >>> len(view)                   # rounded up to whole 4 KiB blocks
    12288
    >>> pool.put(view)
    """

    def __init__(self, buffers_per_class_max=POOL_BUFFERS_PER_CLASS_MAX):
        assert buffers_per_class_max >= 0
        self._free = {}                     # class size -> list of mmap
        self._buffers_per_class_max = buffers_per_class_max
        self.allocated_total = 0
        self.reused_total = 0

    @staticmethod
    def class_size(length):
        size = ALIGN_BYTES
        while size < length:
            size <<= 1
        return size

    def get(self, length):
        """A writable, page-aligned memoryview of `length` rounded up to whole blocks.

        The contents are undefined (recycled buffers keep old bytes)."""
        if length <= 0:
            raise ValueError(f"buffer length must be positive (was {length})")
        rounded = -(-length // ALIGN_BYTES) * ALIGN_BYTES
        size = self.class_size(rounded)
        free = self._free.get(size)
        if free:
            backing = free.pop()
            self.reused_total += 1
        else:
            backing = mmap.mmap(-1, size)
            self.allocated_total += 1
        return memoryview(backing)[:rounded]

    def put(self, view):
        """Return a buffer obtained from `get()` (any slice of it)."""
        backing = view.obj
        if not isinstance(backing, mmap.mmap):
            return
        size = len(backing)
        free = self._free.setdefault(size, [])
        if len(free) < self._buffers_per_class_max:
            free.append(backing)

    def statistics(self):
        return {"allocated_total": self.allocated_total, "reused_total": self.reused_total,
                "free": {size: len(free) for size, free in self._free.items()}}


def is_aligned(view):
    """True if `view` (a buffer) starts on an ALIGN_BYTES boundary and is whole blocks long,
    so O_DIRECT can use it as it is."""
    view = memoryview(view)
    if view.nbytes == 0 or view.nbytes % ALIGN_BYTES or not view.c_contiguous:
        return False
    return _buffer_address(view) % ALIGN_BYTES == 0


def _buffer_address(view):
    global _buffer_address
    try:
        from cairn.native._blockcrc import buffer_address
    except ImportError:             # the reference path (CAIRN_NO_EXTENSIONS or no build)
        import numpy as np

        def buffer_address(view):
            return np.frombuffer(view.cast("B"), dtype=np.uint8).ctypes.data
    _buffer_address = buffer_address        # resolved once: this runs on every put
    return buffer_address(view)


def aligned_copy(pool, data):
    """Copy `data` into a pool buffer padded with zeros to whole blocks; returns the view."""
    length = len(data)
    view = pool.get(max(length, 1))
    view[:length] = data
    if length < len(view):
        view[length:] = bytes(len(view) - length)
    return view
