"""Every bound in cairn, with its reason (STYLE.md 2.6). Relations are asserted at import.

`cairn.native` imports nothing of ours, so its two bounds (O_DIRECT alignment, pooled buffers)
live in `native/bufpool.py`; a test checks that its alignment divides BLOCK_SIZE_BYTES. (Importing
it here would pull the whole native package, asyncio included, into every pure core.)"""

# The unit of allocation, of checksumming and of O_DIRECT alignment. 4 KiB matches NVMe's
# native sector on modern drives and the page size, as in BlueStore (min_alloc_size 4 KiB on SSD)
# and 3FS.
BLOCK_SIZE_BYTES = 4096

# Queue depth of one device's io_uring. fio's sweet spot on NVMe is 32-128; 128 leaves headroom
# for a store that keeps 64 client puts and their flushes in flight.
DEVICE_QUEUE_DEPTH_DEFAULT = 128

# Largest single device operation. Linux splits larger bios anyway; 8 MiB keeps one op's buffer
# small next to memory while covering a whole 4 MiB stripe object in one write.
DEVICE_IO_BYTES_MAX = 8 * 1024 * 1024

# Largest object the store accepts in one piece. Clients stripe larger data into 4 MiB objects
# (DESIGN.md); 64 MiB leaves room for bigger stripes while bounding one transaction's memory.
OBJECT_SIZE_BYTES_MAX = 64 * 1024 * 1024

# Names and attributes are metadata, kept in RocksDB records; bound them like Ceph
# (osd_max_object_name_len 2048, osd_max_attr_size 64 KiB, but smaller: attrs are hints here).
OBJECT_NAME_BYTES_MAX = 1024
COLLECTION_NAME_BYTES_MAX = 256
ATTR_NAME_BYTES_MAX = 256
ATTRS_BYTES_MAX = 64 * 1024

# Omaps (per-object sorted key/value tables: directory entries) live in RocksDB too. A key is
# at most a long object name; a value a small record. One update (a client op, or a page of a
# recovery push) travels in a message header (common/frame.py bounds those at 1 MiB), so its
# entries are bounded in bytes; a table itself is unbounded (a directory of millions).
OMAP_KEY_BYTES_MAX = 1024
OMAP_VALUE_BYTES_MAX = 64 * 1024
OMAP_UPDATE_BYTES_MAX = 512 * 1024
OMAP_PAGE_ENTRIES_MAX = 10_000

# Transactions grouped into one device flush and one metadata commit. More amortises the flush
# better; 512 keeps one RocksDB batch at a few MB.
COMMIT_GROUP_TRANSACTIONS_MAX = 512

# Listing page size bound: a client asking for more gets at most this many per call.
LIST_PAGE_ENTRIES_MAX = 10_000

assert BLOCK_SIZE_BYTES & (BLOCK_SIZE_BYTES - 1) == 0
assert DEVICE_IO_BYTES_MAX % BLOCK_SIZE_BYTES == 0
assert OBJECT_SIZE_BYTES_MAX % BLOCK_SIZE_BYTES == 0
assert COMMIT_GROUP_TRANSACTIONS_MAX > 0

# Memory an OSD keeps for decoded object records (osd/store.py: BlueStore's onode cache): about
# 65,000 small objects' records, or 13,000 of 4 MiB objects (their crcs are 4 KiB each).
RECORD_CACHE_BYTES_DEFAULT = 64 << 20
# Memory an OSD keeps for small objects' bytes after a read (osd/store.py ReadCache; the OSD's
# --read-cache), and the largest object it would keep: in practice those under 64 KiB, the ones
# a get copies (from 64 KiB up a reply is sent from its device buffer as it is).
READ_CACHE_BYTES_DEFAULT = 64 << 20
READ_CACHE_OBJECT_BYTES_MAX = 64 * 1024
