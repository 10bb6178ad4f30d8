"""An open file's writes (client/fs_file.py OpenInode) over an in-memory stand-in for the data
and metadata pools: a file written in order with immutable `bytes` (the mount's FUSE
requests) goes out stripe by stripe as the requests themselves, one frame of pieces and no
copy; mixed with writes of mutable buffers, overwrites, reads of the stripe being gathered,
truncates and flushes, every byte stored equals a bytearray model."""

import asyncio
import random

import pytest

from cairn.client import errors
from cairn.client.fs_file import OpenInode
from cairn.client.fs_format import STRIPE_BYTES

pytestmark = pytest.mark.unit

MiB = 1 << 20


class Pool:
    """Stripes in memory; keeps each put's payload as it was handed over."""

    def __init__(self):
        self.stripes = {}
        self.payloads = []

    @staticmethod
    def index(name):
        return int(name.rsplit(".", 1)[1])

    async def put(self, name, data):
        await asyncio.sleep(0)
        self.payloads.append(data)
        self.stripes[self.index(name)] = b"".join(data) if type(data) is tuple else bytes(data)

    async def get(self, name):
        if self.index(name) not in self.stripes:
            raise errors.ObjectNotFound(name)
        return self.stripes[self.index(name)]

    async def get_view(self, name):
        await asyncio.sleep(0)
        return memoryview(await self.get(name))


class Meta:
    async def omap_update(self, name, values, present=()):
        await asyncio.sleep(0)


class Fs:
    def __init__(self):
        self.data = Pool()
        self.meta = Meta()

    def stripe_object(self, ino, index):
        return f"f.{ino:x}.{index}"

    def inode_object(self, ino):
        return f"i.{ino:x}"

    async def _delete_stripes(self, ino, keep, end):
        for index in range(keep, end):
            self.data.stripes.pop(index, None)


def stored(fs, size):
    out = bytearray()
    for index in range(-(-size // STRIPE_BYTES)):
        piece = fs.data.stripes.get(index, b"")
        out += piece + bytes(STRIPE_BYTES - len(piece))
    return bytes(out[:size])


def test_a_file_written_in_order_with_bytes_goes_out_as_its_requests():
    async def main():
        fs = Fs()
        inode = OpenInode(fs, 1, 0)
        requests = [random.Random(index).randbytes(MiB) for index in range(10)]
        for index, request in enumerate(requests):
            assert await inode.write(index * MiB, request) == MiB
        await inode.flush()
        whole = b"".join(requests)
        assert stored(fs, len(whole)) == whole
        full, last = fs.data.payloads[:2], fs.data.payloads[2]
        for number, payload in enumerate(full):
            # Each full stripe is the four requests themselves: views, not copies.
            assert type(payload) is tuple and len(payload) == 4
            assert [piece.obj for piece in payload] == requests[4 * number:4 * number + 4]
        assert isinstance(last, bytearray) and len(last) == 2 * MiB    # the tail, settled
        assert inode.gathering is None and not inode.dirty

    asyncio.run(main())


def test_gathered_writes_mixed_with_everything_else_match_a_bytearray():
    rng = random.Random(42)

    async def main():
        fs = Fs()
        inode = OpenInode(fs, 1, 0)
        model = bytearray()
        cursor = 0
        for step in range(400):
            roll = rng.random()
            if roll < 0.45:                     # the mount's pattern: in order, 1 MiB, bytes
                for _ in range(rng.randrange(1, 9)):
                    data = rng.randbytes(rng.choice([MiB, MiB, MiB, 512 * 1024, 3000]))
                    await inode.write(cursor, data)
                    model.extend(bytes(max(0, cursor - len(model))))
                    model[cursor:cursor + len(data)] = data
                    cursor += len(data)
                continue
            elif roll < 0.65:                   # anywhere, bytes or a mutable buffer
                data = rng.randbytes(rng.choice([100, 70_000, MiB, STRIPE_BYTES]))
                offset = rng.randrange(0, len(model) + 2 * MiB)
                if rng.random() < 0.5:
                    data = bytearray(data)
            elif roll < 0.8:                    # a read, maybe of the stripe being gathered
                offset = rng.randrange(0, len(model) + 10)
                length = rng.choice([1, 4096, MiB, 2 * STRIPE_BYTES + 5])
                buffer = bytearray(length)
                count = await inode.read_into(offset, buffer)
                assert buffer[:count] == model[offset:offset + length], step
                continue
            elif roll < 0.85:
                size = rng.randrange(0, len(model) + MiB)
                await inode.truncate(size)
                del model[size:]
                model.extend(bytes(size - len(model)))
                cursor = min(cursor, size)
                continue
            elif roll < 0.9:
                await inode.flush()
                assert stored(fs, len(model)) == model, step
                continue
            else:                               # a new run in order from a stripe's start
                cursor = rng.randrange(0, len(model) // STRIPE_BYTES + 2) * STRIPE_BYTES
                continue
            await inode.write(offset, data)
            if len(model) < offset:
                model.extend(bytes(offset - len(model)))
            model[offset:offset + len(data)] = data
            if isinstance(data, bytearray):
                data[:] = bytes(len(data))      # the caller reuses its buffer at once
            cursor = offset + len(data)
            assert inode.size == len(model)
        await inode.flush()
        assert stored(fs, len(model)) == model
        kept = sum(1 for payload in fs.data.payloads if type(payload) is tuple)
        print(f"{len(fs.data.payloads)} puts, {kept} of them gathered requests")
        assert kept > 0

    asyncio.run(main())
