"""An open file's reads (client/fs_file.py OpenInode) over a counting stand-in for the data
pool: read-ahead for a reader moving forward (including torch.load's zip reader, which seeks
about inside each record before reading its bytes), none for a random reader, and read_into
giving the same bytes as read across stripes, holes and the file's end."""

import asyncio
import random

import pytest

from cairn.client import errors
from cairn.client.fs_file import OpenInode
from cairn.client.fs_format import READ_AHEAD, READ_AHEAD_MAX, STRIPE_BYTES

pytestmark = pytest.mark.unit


class Pool:
    """Stripes in memory; counts the gets."""

    def __init__(self, stripes):
        self.stripes = stripes
        self.gets = []

    async def get_view(self, name):
        index = int(name.rsplit(".", 1)[1])
        self.gets.append(index)
        await asyncio.sleep(0)
        if index not in self.stripes:
            raise errors.ObjectNotFound(name)
        return memoryview(self.stripes[index])


class Fs:
    def __init__(self, stripes):
        self.data = Pool(stripes)

    def stripe_object(self, ino, index):
        return f"f.{ino:x}.{index}"


def stripes_of(count, rng, holes=()):
    return {index: rng.randbytes(STRIPE_BYTES) for index in range(count) if index not in holes}


def test_a_forward_reader_is_read_ahead_and_a_random_reader_is_not():
    rng = random.Random(5)
    count = 40
    stripes = stripes_of(count, rng)
    whole = b"".join(stripes[index] for index in range(count))

    async def main():
        # torch.load's pattern per record: small reads walking back from the record's end,
        # then its header at the start, then its bytes in one read.
        fs = Fs(stripes)
        inode = OpenInode(fs, 1, len(whole))
        record = STRIPE_BYTES + 1500
        waited = 0
        for start in range(0, len(whole) - record, record):
            end = start + record
            following = start // STRIPE_BYTES + 1
            if following not in inode.fetching and following not in inode.cache:
                waited += 1                             # its stripes not asked for yet
            for back in (22, 20, 56, 463, 4096):
                assert bytes(await inode.read(end - back, back)) == whole[end - back:end]
            assert bytes(await inode.read(start + 30, 100)) == whole[start + 30:start + 130]
            buffer = bytearray(record - 200)
            assert await inode.read_into(start + 200, buffer) == len(buffer)
            assert buffer == whole[start + 200:end]
        assert sorted(fs.data.gets) == list(range(count))      # each stripe fetched once
        assert waited <= 1, waited                      # only the first record waited

        # A random reader of 4 KiB pieces: about one get per read, not READ_AHEAD more.
        fs = Fs(stripes)
        inode = OpenInode(fs, 1, len(whole))
        reads = 200
        for _ in range(reads):
            offset = rng.randrange(0, len(whole) - 4096)
            assert bytes(await inode.read(offset, 4096)) == whole[offset:offset + 4096]
        print("random reader:", len(fs.data.gets), "gets for", reads, "reads")
        assert len(fs.data.gets) < reads * 1.2, len(fs.data.gets)

    asyncio.run(main())


def test_a_reader_of_whole_records_has_the_next_record_read_ahead_and_each_stripe_once():
    """DCP's load of 64 MiB tensors: a look at the end of the next record (16 stripes on),
    then the record's bytes in one read of 16 stripes. Each read of a record leaves the next
    one fetched or in flight, and no stripe is fetched twice (a read of more stripes than
    the cache keeps once fetched its first ones again)."""
    rng = random.Random(11)
    per_record = READ_AHEAD_MAX
    records = 4
    count = per_record * records + 1
    stripes = stripes_of(count, rng)
    whole = b"".join(stripes[index] for index in range(count))

    async def main():
        fs = Fs(stripes)
        inode = OpenInode(fs, 1, len(whole))
        record = per_record * STRIPE_BYTES
        for number in range(records):
            start, end = 700 + number * record, 700 + (number + 1) * record
            if number:
                last = (end - 1) // STRIPE_BYTES
                assert all(index in inode.fetching or index in inode.cache
                           for index in range(last - per_record + 2, last + 1)), number
            assert bytes(await inode.read(end - 4096, 4096)) == whole[end - 4096:end]
            buffer = bytearray(record - 100)
            assert await inode.read_into(start + 100, buffer) == len(buffer)
            assert buffer == whole[start + 100:end]
        assert len(fs.data.gets) == len(set(fs.data.gets)), sorted(fs.data.gets)

    asyncio.run(main())


def test_read_into_gives_what_read_gives_across_stripes_holes_and_the_end():
    rng = random.Random(9)
    stripes = stripes_of(6, rng, holes={2})
    size = 5 * STRIPE_BYTES + 1234                      # stripe 5 longer than the file
    stripes[4] = stripes[4][:100]                       # a short stripe: zeros after it
    whole = bytearray()
    for index in range(6):
        piece = stripes.get(index, b"")
        whole += piece + bytes(STRIPE_BYTES - len(piece))
    whole = bytes(whole[:size])

    async def main():
        inode = OpenInode(Fs(stripes), 1, size)
        for _ in range(60):
            offset = rng.randrange(0, size + 10)
            length = rng.choice([1, 4096, STRIPE_BYTES - 7, 2 * STRIPE_BYTES + 3])
            want = whole[offset:offset + length]
            assert bytes(await inode.read(offset, length)) == want
            buffer = bytearray(length)
            count = await inode.read_into(offset, buffer)
            assert count == len(want) and buffer[:count] == want

    asyncio.run(main())
