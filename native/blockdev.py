"""Block devices for the store: the io_uring device and its pread/pwrite reference twin.

Both open a block device or a regular file with O_DIRECT and share one awaitable interface:

    device = UringBlockDevice.open("/dev/nvme0n1")      # or FileBlockDevice.open(path)
    view = device.pool.get(4096)                        # aligned buffer, no copy later
    view[:5] = b"hello"
    await device.write(0, view)
    await device.flush()                                # completed writes are now durable
    data = await device.read(0, 4096)                   # a memoryview of a pool buffer
    await device.discard(0, 4096)
    device.close()

Offsets, lengths and buffer addresses must be multiples of 4 KiB (`ALIGN_BYTES`); buffers from
`device.pool` always are. Errors are the typed classes of `cairn.native.errors`, naming the device,
the offset and the likely fix. The in-memory fault-injecting twin lives in `memdev.py`.

Why two twins: the reference is short and obviously right, so tests can check the io_uring path
against it byte for byte; the io_uring path is the one daemons ship (`open_device` picks it and
says so).
"""

import asyncio
import errno
import os
import stat
import time

from cairn.native.bufpool import ALIGN_BYTES, BufferPool
from cairn.native.latency import LatencyRecorder, Snapshot
from cairn.native.errors import (DeviceGone, MisalignedIO, OutOfRange, describe_open_failure,
                                 error_for_errno)

# Queue depth of one device's ring. fio's sweet spot on NVMe is 32-128; 128 leaves headroom for a
# store that keeps 64 client puts plus their flushes in flight.
QUEUE_DEPTH_DEFAULT = 128


def _open_direct(path):
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        raise describe_open_failure(path, exc) from None
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise describe_open_failure(path, exc) from None
    if not (stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
        os.close(fd)
        raise DeviceGone(f"{path}: not a block device or regular file", path=path)
    return fd, size, stat.S_ISBLK(mode)


class _DeviceBase:
    """What every twin shares: range and alignment checks, statistics, the buffer pool."""

    kind = "base"
    # `submit_read(offset, buffer, then)`: read_into without a coroutine or a future, calling
    # `then(None)` when done or `then(error)` with what read_into would raise (a read answered
    # from callbacks, osd/store.py `begin_read`); None where reads are coroutines.
    submit_read = None

    def __init__(self, path, size_bytes, pool):
        self.path = path
        self.size_bytes = size_bytes - size_bytes % ALIGN_BYTES
        self.align = ALIGN_BYTES
        self.pool = pool if pool is not None else BufferPool()
        self.closed = False
        self._ops_total = {"read": 0, "write": 0, "flush": 0, "discard": 0}
        self._bytes_total = {"read": 0, "write": 0}
        self._latency = LatencyRecorder()

    def latency_snapshot(self):
        """The device's latency histograms so far (native/latency.py `Snapshot`)."""
        return self._latency.snapshot()

    def _record(self, op, length, started_ns):
        self._latency.record(op, length, time.perf_counter_ns() - started_ns)

    def _check(self, op, offset, length):
        if self.closed:
            raise self.refused(op, "closed", offset, length)
        if offset < 0 or length < 0 or offset + length > self.size_bytes:
            raise self.refused(op, "range", offset, length)
        if offset % ALIGN_BYTES or length % ALIGN_BYTES:
            raise self.refused(op, "align", offset, length)
        self._ops_total[op] += 1
        if op in self._bytes_total:
            self._bytes_total[op] += length

    def refused(self, op, reason, offset, length):
        """The error for a request refused before it reaches the device: `reason` is "closed",
        "range" or "align"."""
        if reason == "closed":
            return DeviceGone(f"{self.path}: {op} on a closed device", path=self.path,
                              offset=offset, length=length)
        if reason == "range":
            return OutOfRange(f"{self.path}: {op} of {length} bytes at offset {offset} reaches "
                              f"past the end of the device ({self.size_bytes} bytes)",
                              path=self.path, offset=offset, length=length)
        return MisalignedIO(f"{self.path}: {op} of {length} bytes at offset {offset} is not "
                            f"aligned to {ALIGN_BYTES} bytes (O_DIRECT): take buffers from "
                            f"device.pool", path=self.path, offset=offset, length=length)

    def failed(self, op, err, offset, length):
        """The error for an operation the device failed with errno `err`."""
        return error_for_errno(op, err, path=self.path, offset=offset, length=length)

    def short(self, op, count, offset, length):
        """The error for a read or write that moved only `count` of `length` bytes."""
        if op == "read":
            return OutOfRange(f"{self.path}: short read ({count} of {length} bytes) at offset "
                              f"{offset}", path=self.path, offset=offset, length=length)
        return error_for_errno(op, 28, path=self.path, offset=offset, length=length)

    async def read(self, offset, length):
        """Read `length` bytes at `offset` into a fresh pool buffer; returns its memoryview."""
        if length <= 0 or length % ALIGN_BYTES:
            raise MisalignedIO(f"{self.path}: read of {length} bytes at offset {offset}: the "
                               f"length must be a positive multiple of {ALIGN_BYTES} (O_DIRECT)",
                               path=self.path, offset=offset, length=length)
        view = self.pool.get(length)
        try:
            await self.read_into(offset, view)
        except BaseException:
            self.pool.put(view)
            raise
        return view

    @property
    def ops_total(self):
        """Operations accepted since open, by kind."""
        return dict(self._ops_total)

    @property
    def bytes_total(self):
        """Bytes read and written since open."""
        return dict(self._bytes_total)

    def statistics(self):
        return {"kind": self.kind, "path": self.path, "size_bytes": self.size_bytes,
                "ops_total": dict(self.ops_total), "bytes_total": dict(self.bytes_total),
                "buffers": self.pool.statistics()}

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()

    async def aclose(self):
        self.close()

    def allocate(self, offset, length):
        """Make the host filesystem hold [offset, offset + length) of a device that is a file,
        so that later writes there cannot fail for want of room in it (a sparse file only
        takes space as it is written). Nothing to do for a block device or in memory; raises
        DeviceNoSpace when the filesystem has no room."""


def _allocate_file_range(device, offset, length):
    """`allocate` of the devices opened on a path (posix_fallocate: the file's size stays or
    grows to cover the range; blocks it already holds are kept). A filesystem that cannot
    allocate ahead (its fallocate is missing, and glibc's fallback cannot read through
    O_DIRECT) is left as it is: the range then takes its room as it is written, as before."""
    if device.is_block or length <= 0:
        return
    try:
        os.posix_fallocate(device.fd, offset, length)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise error_for_errno("allocate", exc.errno, path=device.path, offset=offset,
                                  length=length) from None


class FileBlockDevice(_DeviceBase):
    """The reference twin: plain `os.preadv` / `os.pwritev` / `os.fdatasync`, one at a time.

    It blocks the event loop for each call, which is what makes it obviously right and slow."""

    kind = "file"

    def __init__(self, path, fd, size_bytes, is_block, pool=None):
        super().__init__(path, size_bytes, pool)
        self.fd = fd
        self.is_block = is_block

    @classmethod
    def open(cls, path, pool=None):
        fd, size, is_block = _open_direct(path)
        return cls(path, fd, size, is_block, pool)

    allocate = _allocate_file_range

    async def read_into(self, offset, buffer):
        view = memoryview(buffer).cast("B")
        self._check("read", offset, len(view))
        started = time.perf_counter_ns()
        try:
            count = os.preadv(self.fd, [view], offset)
        except OSError as exc:
            raise error_for_errno("read", exc.errno, path=self.path, offset=offset,
                                  length=len(view)) from None
        if count != len(view):
            raise self.short("read", count, offset, len(view))
        self._record("read", len(view), started)

    async def write(self, offset, buffer):
        view = memoryview(buffer).cast("B")
        self._check("write", offset, len(view))
        started = time.perf_counter_ns()
        try:
            count = os.pwritev(self.fd, [view], offset)
        except OSError as exc:
            raise error_for_errno("write", exc.errno, path=self.path, offset=offset,
                                  length=len(view)) from None
        if count != len(view):
            raise self.short("write", count, offset, len(view))
        self._record("write", len(view), started)

    async def flush(self):
        self._check("flush", 0, 0)
        started = time.perf_counter_ns()
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise error_for_errno("flush", exc.errno, path=self.path, offset=0,
                                  length=0) from None
        self._record("flush", 0, started)

    async def discard(self, offset, length):
        self._check("discard", offset, length)
        if length == 0:
            return
        try:
            _punch_hole(self.fd, offset, length)
        except OSError as exc:
            raise error_for_errno("discard", exc.errno, path=self.path, offset=offset,
                                  length=length) from None

    def close(self):
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def _punch_hole(fd, offset, length):
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    falloc_fl_keep_size, falloc_fl_punch_hole = 0x01, 0x02
    rc = libc.fallocate(fd, falloc_fl_keep_size | falloc_fl_punch_hole,
                        ctypes.c_longlong(offset), ctypes.c_longlong(length))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class UringBlockDevice(_DeviceBase):
    """The shipped device: io_uring from Cython, completions through an eventfd.

    Every operation queued during one event-loop turn is submitted with one syscall at the start
    of the next turn; at most `queue_depth` are in the kernel at once, the rest wait in a FIFO.
    `read_into`, `write`, `flush` and `discard` are the ring's own methods: each checks its request
    in C and returns a future, so no Python runs per operation on the fast path; `submit_read`
    is the ring's `read_then` (a callback, no future).
    """

    kind = "uring"

    def __init__(self, path, fd, size_bytes, is_block, queue_depth, loop, pool=None):
        from cairn.native._uring import Ring
        super().__init__(path, size_bytes, pool)
        self.fd = fd
        self.is_block = is_block
        self._loop = loop
        self._ring = Ring(fd, self.size_bytes, queue_depth, loop, self, ALIGN_BYTES)
        loop.add_reader(self._ring.eventfd, self._ring.complete)
        self.pool.add_slab_listener(self._ring.register_region)
        self.read_into = self._ring.read
        self.submit_read = self._ring.read_then
        self.write = self._ring.write
        self.flush = self._ring.flush
        self.discard = self._ring.discard

    allocate = _allocate_file_range

    @classmethod
    def open(cls, path, queue_depth=QUEUE_DEPTH_DEFAULT, pool=None):
        """Open `path` on the running event loop's thread."""
        loop = asyncio.get_running_loop()
        fd, size, is_block = _open_direct(path)
        try:
            return cls(path, fd, size, is_block, queue_depth, loop, pool)
        except BaseException:
            os.close(fd)
            raise

    @property
    def ops_total(self):
        return self._ring.counters()[0]

    def latency_snapshot(self):
        return Snapshot.from_raw(*self._ring.latency())

    @property
    def bytes_total(self):
        return self._ring.counters()[1]

    async def wait_idle(self):
        """Wait until nothing is in flight in the kernel (bounded: 10,000 polls of 1 ms)."""
        for _ in range(10_000):
            if self._ring.inflight == 0 and self._ring.backlog_count == 0:
                return
            await asyncio.sleep(0.001)
        raise DeviceGone(f"{self.path}: operations still in flight after 10 s", path=self.path)

    async def aclose(self):
        if not self.closed:
            self._ring.stop_accepting()
            await self.wait_idle()
        self.close()

    def close(self):
        """Close at once. Operations still in the kernel are abandoned (their buffers stay
        referenced by the ring); use `aclose()` to wait for them first."""
        if self.closed:
            return
        self.closed = True
        self._ring.stop_accepting()
        self.pool.remove_slab_listener(self._ring.register_region)
        self._loop.remove_reader(self._ring.eventfd)
        if self._ring.inflight == 0:
            self._ring.close()
            os.close(self.fd)
        # Otherwise the ring and fd stay open until the process ends: closing the ring under the
        # kernel's feet would let it complete into memory we no longer track.

    def statistics(self):
        stats = super().statistics()
        stats.update(inflight=self._ring.inflight,
                     backlog=self._ring.backlog_count, queue_depth=self._ring.depth,
                     fixed_buffers=self._ring.fixed_count,
                     fixed_buffer_ops_total=self._ring.fixed_ops_total)
        return stats
