"""The superblock: the first 4 KiB of a cairn device (pure encode/decode, no I/O).

Layout, little-endian, then zero padding to 4 KiB:

    offset  size  field
    0       8     magic b"CAIRNOSD"
    8       4     format version
    12      16    uuid
    28      8     device size in bytes
    36      4     block size in bytes
    40      8     data start offset (bytes; the data area runs from here to the device end)
    48      4     crc32c of bytes 0..47

Format 2 (this version's mkfs) keeps the commit journal (osd/journal.py) between 1 MiB and the
data start; format 1 stores (data start at 1 MiB) have none and commit with a synchronous
RocksDB write instead. Both open; an older cairn refuses format 2, whose journal it would
ignore.

The metadata (object records, allocator) lives in RocksDB in a directory beside the device; the
uuid ties the two together so a store never mounts someone else's metadata.
"""

import dataclasses
import struct
import uuid as uuid_module

from cairn.common.limits import BLOCK_SIZE_BYTES
from cairn.native.checksum import crc32c
from cairn.osd.errors import NotAStore

MAGIC = b"CAIRNOSD"
FORMAT_VERSION = 2
FORMAT_VERSIONS_READ = (1, 2)
SUPERBLOCK_BYTES = 4096
# The data area starts 1 MiB in: room for the superblock and future labels, and 1 MiB aligned,
# as partitioning tools align.
DATA_START_BYTES = 1024 * 1024
# The journal: 1/32 of the device, at most 64 MiB, a multiple of 64 KiB; a device too small for
# 128 KiB of it gets none (commits then sync RocksDB, as format 1 stores do).
JOURNAL_BYTES_MAX = 64 << 20
JOURNAL_BYTES_MIN = 128 << 10
_JOURNAL_ALIGN_BYTES = 64 << 10

_LAYOUT = struct.Struct("<8sI16sQIQ")
assert _LAYOUT.size == 48


@dataclasses.dataclass(frozen=True)
class Superblock:
    uuid: str
    device_size_bytes: int
    block_size_bytes: int = BLOCK_SIZE_BYTES
    data_start_bytes: int = DATA_START_BYTES
    format_version: int = FORMAT_VERSION

    @classmethod
    def new(cls, device_size_bytes, journal=True):
        """A new store's superblock; `journal=False` makes one without a commit journal."""
        journal = min(JOURNAL_BYTES_MAX, device_size_bytes // 32) // _JOURNAL_ALIGN_BYTES * \
            _JOURNAL_ALIGN_BYTES if journal else 0
        if journal < JOURNAL_BYTES_MIN:
            journal = 0
        return cls(uuid=str(uuid_module.uuid4()), device_size_bytes=device_size_bytes,
                   data_start_bytes=DATA_START_BYTES + journal)

    @property
    def journal_start_bytes(self):
        return DATA_START_BYTES

    @property
    def journal_bytes(self):
        """Bytes of the commit journal (0: none)."""
        return self.data_start_bytes - DATA_START_BYTES if self.format_version >= 2 else 0

    @property
    def block_count(self):
        """Blocks in the data area."""
        return (self.device_size_bytes - self.data_start_bytes) // self.block_size_bytes

    def encode(self):
        head = _LAYOUT.pack(MAGIC, self.format_version, uuid_module.UUID(self.uuid).bytes,
                            self.device_size_bytes, self.block_size_bytes,
                            self.data_start_bytes)
        body = head + struct.pack("<I", crc32c(head))
        return body + bytes(SUPERBLOCK_BYTES - len(body))

    @classmethod
    def decode(cls, data, device):
        data = bytes(data[:SUPERBLOCK_BYTES])
        magic = data[:8]
        if magic != MAGIC:
            raise NotAStore(f"{device} holds no cairn store (no superblock magic; found "
                            f"{magic!r}); make one with 'cairn-osd mkfs --device {device}'")
        head = data[:_LAYOUT.size]
        (stored_crc,) = struct.unpack_from("<I", data, _LAYOUT.size)
        if crc32c(head) != stored_crc:
            raise NotAStore(f"{device}: the superblock is corrupt (crc32c mismatch)")
        _, version, raw_uuid, size, block_size, data_start = _LAYOUT.unpack(head)
        if version not in FORMAT_VERSIONS_READ:
            raise NotAStore(f"{device}: superblock format version {version} is not supported "
                            f"(this cairn reads versions "
                            f"{', '.join(map(str, FORMAT_VERSIONS_READ))})")
        if data_start < DATA_START_BYTES or data_start % block_size or \
                (version == 1 and data_start != DATA_START_BYTES):
            raise NotAStore(f"{device}: the superblock's data start {data_start} is not valid "
                            f"for format {version}")
        return cls(uuid=str(uuid_module.UUID(bytes=raw_uuid)), device_size_bytes=size,
                   block_size_bytes=block_size, data_start_bytes=data_start,
                   format_version=version)
