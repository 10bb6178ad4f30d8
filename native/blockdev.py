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
import os
import stat

from cairn.native.bufpool import ALIGN_BYTES, BufferPool
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

    def __init__(self, path, size_bytes, pool):
        self.path = path
        self.size_bytes = size_bytes - size_bytes % ALIGN_BYTES
        self.align = ALIGN_BYTES
        self.pool = pool if pool is not None else BufferPool()
        self.closed = False
        self.ops_total = {"read": 0, "write": 0, "flush": 0, "discard": 0}
        self.bytes_total = {"read": 0, "write": 0}

    def _check(self, op, offset, length):
        if self.closed:
            raise DeviceGone(f"{self.path}: {op} on a closed device", path=self.path,
                             offset=offset, length=length)
        if offset < 0 or length < 0 or offset + length > self.size_bytes:
            raise OutOfRange(f"{self.path}: {op} of {length} bytes at offset {offset} reaches "
                             f"past the end of the device ({self.size_bytes} bytes)",
                             path=self.path, offset=offset, length=length)
        if offset % ALIGN_BYTES or length % ALIGN_BYTES:
            raise MisalignedIO(f"{self.path}: {op} of {length} bytes at offset {offset} is not "
                               f"aligned to {ALIGN_BYTES} bytes (O_DIRECT)", path=self.path,
                               offset=offset, length=length)
        self.ops_total[op] += 1
        if op in self.bytes_total:
            self.bytes_total[op] += length

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

    def statistics(self):
        return {"kind": self.kind, "path": self.path, "size_bytes": self.size_bytes,
                "ops_total": dict(self.ops_total), "bytes_total": dict(self.bytes_total)}

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()

    async def aclose(self):
        self.close()


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

    async def read_into(self, offset, buffer):
        view = memoryview(buffer).cast("B")
        self._check("read", offset, len(view))
        try:
            count = os.preadv(self.fd, [view], offset)
        except OSError as exc:
            raise error_for_errno("read", exc.errno, path=self.path, offset=offset,
                                  length=len(view)) from None
        if count != len(view):
            raise OutOfRange(f"{self.path}: short read ({count} of {len(view)} bytes) at "
                             f"offset {offset}", path=self.path, offset=offset,
                             length=len(view))

    async def write(self, offset, buffer):
        view = memoryview(buffer).cast("B")
        self._check("write", offset, len(view))
        try:
            count = os.pwritev(self.fd, [view], offset)
        except OSError as exc:
            raise error_for_errno("write", exc.errno, path=self.path, offset=offset,
                                  length=len(view)) from None
        if count != len(view):
            raise error_for_errno("write", 28, path=self.path, offset=offset,
                                  length=len(view))

    async def flush(self):
        self._check("flush", 0, 0)
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise error_for_errno("flush", exc.errno, path=self.path, offset=0,
                                  length=0) from None

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
    """

    kind = "uring"

    def __init__(self, path, fd, size_bytes, is_block, ring, loop, pool=None):
        super().__init__(path, size_bytes, pool)
        self.fd = fd
        self.is_block = is_block
        self._ring = ring
        self._loop = loop
        self._submit_scheduled = False
        loop.add_reader(ring.eventfd, ring.complete)

    @classmethod
    def open(cls, path, queue_depth=QUEUE_DEPTH_DEFAULT, pool=None):
        """Open `path` on the running event loop's thread."""
        from cairn.native._uring import Ring
        loop = asyncio.get_running_loop()
        fd, size, is_block = _open_direct(path)

        def error_factory(op, err, offset, length):
            return error_for_errno(op, err, path=path, offset=offset, length=length)

        try:
            ring = Ring(queue_depth, error_factory, ALIGN_BYTES)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, size, is_block, ring, loop, pool)

    def _schedule_submit(self):
        if not self._submit_scheduled:
            self._submit_scheduled = True
            self._loop.call_soon(self._submit)

    def _submit(self):
        self._submit_scheduled = False
        self._ring.submit()

    async def read_into(self, offset, buffer):
        length = len(buffer) if not isinstance(buffer, memoryview) else buffer.nbytes
        self._check("read", offset, length)
        future = self._loop.create_future()
        self._ring.queue_read(self.fd, buffer, offset, future)
        self._schedule_submit()
        count = await future
        if count != length:
            raise OutOfRange(f"{self.path}: short read ({count} of {length} bytes) at offset "
                             f"{offset}", path=self.path, offset=offset, length=length)

    async def write(self, offset, buffer):
        length = len(buffer) if not isinstance(buffer, memoryview) else buffer.nbytes
        self._check("write", offset, length)
        future = self._loop.create_future()
        self._ring.queue_write(self.fd, buffer, offset, future)
        self._schedule_submit()
        count = await future
        if count != length:
            raise error_for_errno("write", 28, path=self.path, offset=offset, length=length)

    async def flush(self):
        self._check("flush", 0, 0)
        future = self._loop.create_future()
        self._ring.queue_flush(self.fd, future)
        self._schedule_submit()
        await future

    async def discard(self, offset, length):
        self._check("discard", offset, length)
        if length == 0:
            return
        future = self._loop.create_future()
        self._ring.queue_discard(self.fd, offset, length, future)
        self._schedule_submit()
        await future

    async def wait_idle(self):
        """Wait until nothing is in flight in the kernel (bounded: 10,000 polls of 1 ms)."""
        for _ in range(10_000):
            if self._ring.inflight == 0 and self._ring.backlog_count == 0:
                return
            await asyncio.sleep(0.001)
        raise DeviceGone(f"{self.path}: operations still in flight after 10 s", path=self.path)

    async def aclose(self):
        if not self.closed:
            await self.wait_idle()
        self.close()

    def close(self):
        """Close at once. Operations still in the kernel are abandoned (their buffers stay
        referenced by the ring); use `aclose()` to wait for them first."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._ring.eventfd)
        if self._ring.inflight == 0:
            self._ring.close()
            os.close(self.fd)
        # Otherwise the ring and fd stay open until the process ends: closing the ring under the
        # kernel's feet would let it complete into memory we no longer track.

    def statistics(self):
        stats = super().statistics()
        stats.update(inflight=self._ring.inflight, backlog=self._ring.backlog_count,
                     queue_depth=self._ring.depth)
        return stats
