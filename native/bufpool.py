"""Aligned buffers for O_DIRECT, handed out as memoryviews and recycled.

O_DIRECT needs buffer addresses aligned to the device's logical block size; anonymous `mmap`
memory is page-aligned (4 KiB), so every buffer here comes from an `mmap`, in size classes (powers
of two, 4 KiB and up). Recycling matters: a fresh 4 MiB mapping costs 1,024 page faults on first
touch, which would cap a reader near a few GB/s.

Buffers from 64 KiB up are carved from slabs: one mapping of several buffers, aligned to
2 MiB, advised for transparent huge pages and touched in order when made. Why slabs at all: such
a buffer often leaves without `put()` (a read sent as it is, a received payload handed to the
caller), and a dropped mapping must be made and faulted in again for the next one. That cost
62 us per 64 KiB buffer on the development VM (mmap, 16 page faults, munmap), against 2 us for a
slab's buffer and its reclaim: 64 KiB gets paid it twice, once in the OSD's read and once in the
client's receive. Why large buffers want slabs besides: a device request
is a list of physically contiguous segments and the queue bounds how many (this machine's virtio
disk: 254 per request; NVMe PRP/SGL limits are similar), so a 1 MiB buffer of scattered 4 KiB
pages is split into several requests. Where THP works, a slab's buffers are 2 MiB pages and a
1 MiB request is one or two segments. On the development VM THP never engages (AnonHugePages
stays 0 even for advised mappings), and an A/B of 1 MiB reads at queue depth 16 there was
dominated by something else: a 64 MiB zero-filled mapping read at 3.6-4.0 GB/s while an 18 MiB
one, the pool, and fio itself all read at 0.8-1.4 GB/s in the same minute. Not understood yet.

A buffer not returned with `put()` is not lost: small ones are garbage-collected with their
mapping, large ones go back to their slab's free list when the last view of them is dropped (a
`weakref.finalize` on the numpy array behind the view). Returning one early is an optimisation,
never a requirement. A returned buffer must not be used again by the caller.
"""

import mmap
import weakref

import numpy as np

# O_DIRECT alignment: the page size, which is also the largest logical block size of the devices
# we target (4Kn NVMe). `cairn.common.limits` asserts that the store's block is a multiple of it.
ALIGN_BYTES = 4096

# Free buffers kept per small size class: enough for a queue depth of 4 KiB..32 KiB ops without
# holding memory forever.
POOL_BUFFERS_PER_CLASS_MAX = 64

# Size classes from SLAB_CLASS_MIN_BYTES up come from slabs of at least SLAB_BYTES_MIN (below
# 1 MiB: SMALL_SLAB_BYTES, one huge page) and at least SLAB_BUFFERS_MIN buffers, aligned to
# HUGE_PAGE_BYTES. A class takes another slab only when all of its buffers are lent, so a size
# that is never used costs nothing. Classes above SLAB_CLASS_MAX_BYTES
# (objects over 16 MiB: rare) get a mapping each, not touched in advance, and at most
# HUGE_BUFFERS_PER_CLASS_MAX are kept: a frame that claims 64 MiB and sends nothing then costs
# address space, not memory (a slab of four 128 MiB buffers, touched, cost 512 MiB of RSS).
SLAB_CLASS_MIN_BYTES = 64 << 10
SLAB_CLASS_MAX_BYTES = 16 << 20
HUGE_BUFFERS_PER_CLASS_MAX = 2
SLAB_BYTES_MIN = 16 << 20
SMALL_SLAB_BYTES = 2 << 20
SLAB_BUFFERS_MIN = 4
HUGE_PAGE_BYTES = 2 << 20


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
        self._free = {}                     # small class size -> list of mmap
        self._slots = {}                    # large class size -> list of (slab array, offset)
        self._lent = {}                     # id(array) -> (class size, slab, offset, finalizer)
        self._slabs = []                    # every slab made (they stay mapped)
        self._slab_listeners = []
        self._buffers_per_class_max = buffers_per_class_max
        self.allocated_total = 0
        self.reused_total = 0
        self.slab_bytes_total = 0

    def add_slab_listener(self, listener):
        """Call `listener(slab)` for every slab made, those before included: a device's
        io_uring registers them (native/_uring.pyx `register_region`)."""
        self._slab_listeners.append(listener)
        for slab in self._slabs:
            listener(slab)

    def remove_slab_listener(self, listener):
        if listener in self._slab_listeners:
            self._slab_listeners.remove(listener)

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
        if SLAB_CLASS_MIN_BYTES <= size <= SLAB_CLASS_MAX_BYTES:
            return self._get_large(size, rounded)
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
        if isinstance(backing, mmap.mmap):              # small buffers, the common case
            size = len(backing)
            free = self._free.get(size)
            if free is None:
                free = self._free[size] = []
            kept = self._buffers_per_class_max if size <= SLAB_CLASS_MAX_BYTES else \
                HUGE_BUFFERS_PER_CLASS_MAX
            if len(free) < kept:
                free.append(backing)
            return
        if isinstance(backing, np.ndarray):
            lent = self._lent.pop(id(backing), None)
            if lent is not None:
                size, slab, offset, finalizer = lent
                finalizer.detach()
                self._slots[size].append((slab, offset))

    def _get_large(self, size, rounded):
        slots = self._slots.setdefault(size, [])
        if slots:
            self.reused_total += 1
        else:
            self._new_slab(size, slots)
        slab, offset = slots.pop()
        array = slab[offset:offset + size]          # a new array object for every loan
        finalizer = weakref.finalize(array, self._reclaim, id(array), size, slab, offset)
        finalizer.atexit = False
        self._lent[id(array)] = (size, slab, offset, finalizer)
        return memoryview(array)[:rounded]

    def _reclaim(self, key, size, slab, offset):
        # The last view of a large buffer was dropped without put(): take it back.
        self._lent.pop(key, None)
        self._slots[size].append((slab, offset))

    def _new_slab(self, size, slots):
        count = max(SLAB_BUFFERS_MIN,
                    (SLAB_BYTES_MIN if size >= 1 << 20 else SMALL_SLAB_BYTES) // size)
        backing = mmap.mmap(-1, count * size + HUGE_PAGE_BYTES)
        try:
            backing.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass        # no THP: the in-order touch below still gives mostly contiguous pages
        whole = np.frombuffer(backing, dtype=np.uint8)
        skip = -whole.ctypes.data % HUGE_PAGE_BYTES
        slab = whole[skip:skip + count * size]
        slab[:] = 0                                 # fault every page in now, in order
        slots.extend((slab, index * size) for index in reversed(range(count)))
        self.allocated_total += count
        self.slab_bytes_total += count * size
        self._slabs.append(slab)
        for listener in self._slab_listeners:
            listener(slab)

    def statistics(self):
        return {"allocated_total": self.allocated_total, "reused_total": self.reused_total,
                "slab_bytes_total": self.slab_bytes_total, "lent_large": len(self._lent),
                "free": {size: len(free) for size, free in self._free.items()},
                "free_large": {size: len(slots) for size, slots in self._slots.items()}}


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
        def buffer_address(view):
            return np.frombuffer(view.cast("B"), dtype=np.uint8).ctypes.data
    _buffer_address = buffer_address        # resolved once: this runs on every put
    return buffer_address(view)


def aligned_copy(pool, data):
    """Copy `data` (a buffer, or a tuple of buffers to join) into a pool buffer padded with
    zeros to whole blocks; returns the view."""
    pieces = data if isinstance(data, tuple) else (data,)
    length = sum(memoryview(piece).nbytes for piece in pieces)
    view = pool.get(max(length, 1))
    at = 0
    for piece in pieces:
        size = memoryview(piece).nbytes
        view[at:at + size] = piece
        at += size
    if length < len(view):
        view[length:] = bytes(len(view) - length)
    return view
