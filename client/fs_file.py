"""A file's bytes on the data pool: an open inode's stripes, read-ahead and write-behind, and
the handle a caller reads and writes through (client/fs.py opens them).

Theory of operation: a file is stripe objects of STRIPE_BYTES, each written whole. An
`OpenInode` (one per file open in this process, shared by its handles) keeps the stripes
written here and not yet flushed (at most DIRTY_STRIPES_MAX, written back WRITE_BEHIND at a
time), the stripes being written back, and clean stripes read or read ahead (READ_AHEAD
beyond a sequential read, up to READ_AHEAD_MAX beyond a read of whole records). A file
written in order with immutable bytes (the mount's FUSE requests) keeps its writes to the
stripe at its end as they came, and sends that stripe as those pieces (`_gather`). A flush (close, fsync, or every FLUSH_INTERVAL_S) writes every dirty
stripe, then the size in the inode's omap: the size never covers bytes not yet durable. A
truncate deletes the stripes past the new end and cuts the last one, so bytes past the end
never come back when the file grows again.

A small file keeps its bytes beside its inode instead (`inline`: attribute "i", the bytes under
inline_key in its home directory, at most INLINE_BYTES_MAX; for inodes embedded there): its
flush writes bytes, size and mtime in one update, its open reads them with the attributes, and
it has no stripes. A write or truncate past INLINE_BYTES_MAX moves it out: its bytes become
dirty stripe 0, and the flush that writes that stripe drops "i" and the bytes with the new
size (never before the stripe is durable).
"""

import asyncio
import collections
import errno
import time

import msgpack

from cairn.client import errors
from cairn.client.fs_format import (ATTR_KEY, DIRTY_STRIPES_MAX, FLUSH_INTERVAL_S,
                                    INLINE_BYTES_MAX, READ_AHEAD, READ_AHEAD_MAX, SIZE_KEY,
                                    STRIPE_BYTES, WRITE_BEHIND, _as_oserror, check_file_size,
                                    fs_error, is_embedded)


async def _truncate_stripes(fs, ino, old_size, new_size):
    """Make the stripes fit a new size: stripes past it deleted, the last one cut (so bytes
    past the end never come back when the file grows again)."""
    if new_size >= old_size:
        return
    keep = -(-new_size // STRIPE_BYTES)
    await fs._delete_stripes(ino, keep, -(-old_size // STRIPE_BYTES))
    cut = new_size % STRIPE_BYTES
    if cut:
        name = fs.stripe_object(ino, new_size // STRIPE_BYTES)
        try:
            data = await fs.data.get(name)
        except errors.ObjectNotFound:
            return
        if len(data) > cut:
            await fs.data.put(name, data[:cut])


async def _bytes_of(source):
    """A stripe's bytes from `OpenInode._source`: as they are, or once its read is done (the
    read shielded: a cancelled reader leaves it for the others)."""
    if isinstance(source, asyncio.Future):
        return await asyncio.shield(source)
    return source


class OpenInode:
    """A file open in this process: its size as written here, its dirty stripes, stripes being
    written back, and clean stripes read (or read ahead)."""

    def __init__(self, fs, ino, size, inline=None):
        self.fs = fs
        self.ino = ino
        self.size = size
        self.inline = inline            # bytes: a small file's, kept beside its record (as
                                        # stored, or as the next flush stores them: dirty[0])
        self.moved_out = False          # was small; its attributes say so until a flush
        self.users = 0
        self.dirty = {}                 # stripe index -> bytearray (whole stripe, or shorter)
        self.gathering = None           # [index, views, bytes]: a stripe not in `dirty`, its
                                        # writes kept as they came (see `_gather`)
        self.pending = {}               # stripe index -> bytes (or views) being written back
        self.cache = collections.OrderedDict()     # stripe index -> bytes (clean), LRU
        self.fetching = {}              # stripe index -> task reading it
        self.generation = 0             # moves on every write and truncate
        self.writing = set()            # tasks writing stripes back
        self.lock = asyncio.Lock()
        self.failure = None             # a write-back error, raised at the next flush
        self.changed = False            # size or data changed since the last flush
        self.flushed_at = time.monotonic()
        self.next_offset = 0            # where a sequential reader goes next
        self.last_stripe = 0            # the last stripe the last read touched
        self.ahead = READ_AHEAD         # stripes read ahead (more for readers of whole records)

    def _known(self, index):
        """The stripe's bytes if this process has them (dirty, being written, cached)."""
        if self.gathering is not None and self.gathering[0] == index:
            self._settle()
        if index in self.dirty:
            return self.dirty[index]
        if index in self.pending:
            data = self.pending[index]
            return b"".join(data) if type(data) is tuple else data
        if self.inline is not None:
            return self.inline if index == 0 else b""
        data = self.cache.get(index)
        if data is not None:
            self.cache.move_to_end(index)
        return data

    def _source(self, index):
        """The stripe's bytes if this process has them, else the task reading it (started
        here if none is)."""
        data = self._known(index)
        if data is not None:
            return data
        return self.fetching.get(index) or self._fetch(index)

    async def _stripe(self, index):
        return await _bytes_of(self._source(index))

    def _fetch(self, index):
        task = asyncio.ensure_future(self._get(index, self.generation))
        self.fetching[index] = task
        return task

    async def _get(self, index, generation):
        try:
            data = await self.fs.data.get_view(self.fs.stripe_object(self.ino, index))
        except errors.ObjectNotFound:
            data = b""
        finally:
            self.fetching.pop(index, None)
        if generation == self.generation:       # no write since: safe to keep
            self.cache[index] = data
            while len(self.cache) > 2 * self.ahead + 4:     # what is read ahead stays
                self.cache.popitem(last=False)
        return data

    def _read_ahead(self, after):
        """Start reading the `ahead` stripes after stripe `after` (not awaited)."""
        for index in range(after + 1, after + 1 + self.ahead):
            if index * STRIPE_BYTES >= self.size:
                break
            self._want(index)

    def _want(self, index):
        """Start reading stripe `index` unless this process has it or is reading it."""
        if self._known(index) is None and index not in self.fetching:
            self._fetch(index)

    def _start_reads(self, offset, first, last):
        """Start fetching stripes first..last, and read ahead when the reader moves forward:
        from offset 0, where the last read ended, or in the stripe the last read ended in or
        the next (a zip reader such as torch.load's seeks about inside a record before it
        reads its bytes). A random reader seldom lands there twice in a row. A read of
        several stripes reads as many ahead (up to READ_AHEAD_MAX) wherever it lands: DCP
        reads a checkpoint's records in order, each after a look at the record's end."""
        for index in range(first, last + 1):
            self._want(index)
        span = last - first + 1
        if span > 1:
            self.ahead = max(self.ahead, min(span, READ_AHEAD_MAX))
        if span > 1 or offset == 0 or offset == self.next_offset or \
                self.last_stripe <= first <= self.last_stripe + 1:
            self._read_ahead(last)
        self.last_stripe = last

    async def read(self, offset, size):
        """The bytes of [offset, offset + size) (fewer at the end): a buffer, maybe a view."""
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        first, last = offset // STRIPE_BYTES, (end - 1) // STRIPE_BYTES
        if first != last:
            out = bytearray(end - offset)
            await self.read_into(offset, out)
            return out
        self._start_reads(offset, first, last)
        self.next_offset = end
        data = await self._stripe(first)        # the common case: a view, no copy
        lo = offset - first * STRIPE_BYTES
        piece = memoryview(data)[lo:lo + end - offset]
        if len(piece) == end - offset:
            return piece
        return bytes(piece) + bytes(end - offset - len(piece))      # a short stripe: zeros

    async def read_into(self, offset, buffer):
        """Read [offset, offset + len(buffer)) into `buffer` (fewer at the end), one copy
        from the stripes; the count of bytes read."""
        view = memoryview(buffer).cast("B")
        end = min(offset + len(view), self.size)
        if offset >= end:
            return 0
        first, last = offset // STRIPE_BYTES, (end - 1) // STRIPE_BYTES
        self._start_reads(offset, first, last)
        self.next_offset = end
        # Held here, not left to the cache: a read of more stripes than it keeps would fetch
        # the first ones again.
        sources = [self._source(index) for index in range(first, last + 1)]
        position = 0
        for index, source in enumerate(sources, first):
            data = await _bytes_of(source)
            lo = max(offset, index * STRIPE_BYTES) - index * STRIPE_BYTES
            hi = min(end, (index + 1) * STRIPE_BYTES) - index * STRIPE_BYTES
            piece = memoryview(data)[lo:hi]
            view[position:position + len(piece)] = piece
            if len(piece) < hi - lo:                # a hole or a short stripe: zeros
                view[position + len(piece):position + hi - lo] = bytes(hi - lo - len(piece))
            piece.release()                         # (a dirty stripe may grow meanwhile)
            position += hi - lo
        return position

    async def write(self, offset, data):
        if self.failure is not None:
            raise self.failure
        view = memoryview(data).cast("B")
        check_file_size(offset + len(view), f"a write to inode {self.ino:x}")
        if self.inline is not None and offset + len(view) > INLINE_BYTES_MAX:
            self._move_out()
        self.generation += 1
        keep = type(data) is bytes and self.inline is None     # (views of it stay valid)
        position = 0
        while position < len(view):
            index = (offset + position) // STRIPE_BYTES
            within = (offset + position) % STRIPE_BYTES
            take = min(len(view) - position, STRIPE_BYTES - within)
            if self._gather(keep, index, within, take, view[position:position + take]):
                position += take
                continue
            stripe = self.dirty.get(index)
            if stripe is None:
                if (within == 0 and take == STRIPE_BYTES) or index * STRIPE_BYTES >= self.size:
                    stripe = bytearray()
                else:
                    stripe = bytearray(await self._stripe(index))
                self.dirty[index] = stripe
                self.cache.pop(index, None)
            if len(stripe) < within:
                stripe.extend(bytes(within - len(stripe)))
            stripe[within:within + take] = view[position:position + take]
            position += take
            if within + take == STRIPE_BYTES:
                self._write_back(index)
        self.size = max(self.size, offset + len(view))
        self.changed = True
        if len(self.dirty) > DIRTY_STRIPES_MAX:
            for index in sorted(self.dirty)[:len(self.dirty) - DIRTY_STRIPES_MAX]:
                self._write_back(index)
        while len(self.writing) >= WRITE_BEHIND:
            await asyncio.wait(self.writing, return_when=asyncio.FIRST_COMPLETED)
        if self.failure is not None:
            raise self.failure
        if time.monotonic() - self.flushed_at > FLUSH_INTERVAL_S:
            await self.flush()
        return len(view)

    def _gather(self, keep, index, within, take, piece):
        """Keep `piece` (a view of an immutable write) as it is if it carries on the stripe
        being gathered, or starts one that needs no bytes from before (from the stripe's start,
        past the file's end or replacing the stripe whole); a whole stripe goes to the
        write-back as its pieces, one frame, no copy. The mount's 1 MiB FUSE writes of a file
        written in order skip the copy into a stripe this way. Whether it was kept."""
        gathering = self.gathering
        if gathering is not None and (gathering[0] != index or gathering[2] != within):
            self._settle()
            gathering = None
        if not keep or index in self.dirty:
            return False
        if gathering is None:
            if within != 0 or (take < STRIPE_BYTES and index * STRIPE_BYTES < self.size):
                return False
            gathering = self.gathering = [index, [], 0]
            self.cache.pop(index, None)
        gathering[1].append(piece)
        gathering[2] += take
        if gathering[2] == STRIPE_BYTES:
            self.gathering = None
            self._write_back(index, tuple(gathering[1]))
        return True

    def _settle(self):
        """The stripe being gathered becomes a dirty stripe like any other (one copy)."""
        if self.gathering is not None:
            index, pieces, _ = self.gathering
            self.gathering = None
            stripe = bytearray()
            for piece in pieces:
                stripe += piece
            self.dirty[index] = stripe

    def _move_out(self):
        """The file outgrows its inode: its bytes become stripe 0 (dirty)."""
        if 0 not in self.dirty and self.inline:
            self.dirty[0] = bytearray(self.inline)
        self.inline = None
        self.moved_out = True

    def inline_changed(self):
        """Whether the next flush changes the bytes the inode holds (or drops them)."""
        return self.changed and (self.inline is not None or self.moved_out)

    def _write_back(self, index, data=None):
        # No copy: once popped from `dirty` the stripe's bytearray is never changed again (a
        # later write to this stripe starts a new one from these bytes), so it goes out as is;
        # a gathered stripe goes as its pieces (`data`, a tuple: one frame's payload).
        if data is None:
            data = self.dirty.pop(index)
        self.pending[index] = data              # reads see it until it is stored
        task = asyncio.ensure_future(self._put(index, data))
        self.writing.add(task)
        task.add_done_callback(self.writing.discard)

    async def _put(self, index, data):
        try:
            await self.fs.data.put(self.fs.stripe_object(self.ino, index), data)
        except Exception as exc:            # kept for the next write or flush to raise
            self.failure = self.failure or _as_oserror(exc)
        finally:
            if self.pending.get(index) is data:
                del self.pending[index]

    async def truncate(self, size):
        check_file_size(size, f"a truncate of inode {self.ino:x}")
        async with self.lock:
            await self._drain()
            self._settle()
            self.generation += 1
            if self.inline is not None and size > INLINE_BYTES_MAX:
                self._move_out()
            elif self.inline is not None:
                stripe = self.dirty.get(0)
                stripe = bytearray(self.inline) if stripe is None else stripe
                del stripe[size:]
                self.dirty[0] = stripe
                self.size = size
                self.changed = True
                return
            for index in [i for i in self.dirty if i * STRIPE_BYTES >= size]:
                del self.dirty[index]
            cut = size % STRIPE_BYTES
            if cut and size // STRIPE_BYTES in self.dirty:
                del self.dirty[size // STRIPE_BYTES][cut:]
            self.cache.clear()
            await _truncate_stripes(self.fs, self.ino, self.size, size)
            self.size = size
            self.changed = True

    async def _commit_size(self):
        """Record the size and mtime: in the attributes of an embedded inode (a
        compare-and-swap against what this process last read, which for a file it just made
        needs no read), as a blind write of its own record for an inode of its own."""
        size, now = self.size, time.time_ns()
        if is_embedded(self.ino):
            inline, moved_out = None, self.moved_out
            if self.inline is not None:
                # The bytes as now (writes made while this update is out start from them).
                stripe = self.dirty.pop(0, None)
                inline = self.inline = bytes(self.inline if stripe is None else stripe[:size])

            def sized(attr):
                attr["s"], attr["mt"], attr["ct"] = size, now, now     # a write's times
                if moved_out:
                    attr.pop("i", None)
            try:
                await self.fs._set_attr(self.ino, sized, False if moved_out else inline)
            except FileNotFoundError:
                raise fs_error(errno.ENOENT, f"file {self.ino:x} was removed") from None
            except BaseException:
                if inline is not None and self.inline is not None and 0 not in self.dirty:
                    self.dirty[0] = bytearray(inline)       # still to be written
                raise
            if moved_out:
                self.moved_out = False
            return
        try:
            await self.fs.meta.omap_update(self.fs.inode_object(self.ino),
                                           {SIZE_KEY: msgpack.packb([size, now])},
                                           present=[ATTR_KEY])
        except (errors.PreconditionFailed, errors.ObjectNotFound):
            raise fs_error(errno.ENOENT, f"file {self.ino:x} was removed") from None

    async def _drain(self):
        while self.writing:
            await asyncio.gather(*list(self.writing))

    async def flush(self):
        """Write every dirty stripe, then the size and mtime: durable on the cluster when it
        returns."""
        async with self.lock:
            self._settle()
            for index in sorted(self.dirty) if self.inline is None else ():
                self._write_back(index)
                while len(self.writing) >= WRITE_BEHIND:
                    await asyncio.wait(self.writing, return_when=asyncio.FIRST_COMPLETED)
            await self._drain()
            if self.failure is not None:
                failure, self.failure = self.failure, None
                raise failure
            if self.changed:
                self.changed = False        # a write while the size is stored sets it again
                try:
                    await self._commit_size()
                except BaseException:
                    self.changed = True
                    raise
            self.flushed_at = time.monotonic()


class FileHandle:
    """An open file: `read`, `write` (at the position or at an offset), `flush`, `close`."""

    def __init__(self, inode, writable):
        self.inode = inode
        self.writable = writable
        self.position = 0
        self.closed = False

    @property
    def ino(self):
        return self.inode.ino

    @property
    def size(self):
        return self.inode.size

    async def read(self, size=-1, offset=None):
        """Up to `size` bytes (all to the end: -1) from the position or `offset`."""
        return bytes(await self.read_buffer(size, offset))

    async def read_buffer(self, size=-1, offset=None):
        """As read(), as a bytes-like buffer that may be a view of a cached stripe (no copy;
        the FUSE layer hands it to the kernel as it is)."""
        start = self.position if offset is None else offset
        if size is None or size < 0:
            size = max(0, self.inode.size - start)
        data = await self.inode.read(start, size)
        if offset is None:
            self.position += len(data)
        return data

    async def read_into(self, buffer, offset=None):
        """As read(), into `buffer` (as many bytes as it holds, fewer at the end); the count."""
        start = self.position if offset is None else offset
        count = await self.inode.read_into(start, buffer)
        if offset is None:
            self.position += count
        return count

    async def write(self, data, offset=None):
        if not self.writable:
            raise fs_error(errno.EBADF, "file not open for writing")
        start = self.position if offset is None else offset
        written = await self.inode.write(start, data)
        if offset is None:
            self.position += written
        return written

    async def truncate(self, size):
        if not self.writable:
            raise fs_error(errno.EBADF, "file not open for writing")
        await self.inode.truncate(size)

    async def flush(self):
        await self.inode.flush()

    fsync = flush

    async def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            if self.writable:
                await self.inode.flush()
        finally:
            self.inode.fs._closed(self.inode)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()
