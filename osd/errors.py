"""Errors of the object store (operating errors; programmer errors are assertions).

Modelled on Swift's `DiskFileNotExist` / `DiskFileNoSpace` / `DiskFileQuarantined`: the type says
what happened and what the caller should do next. Device errors from `cairn.native.errors` pass
through unchanged (EIO, device gone); the store adds its own meaning on top.
"""


class StoreError(Exception):
    """Base of every store error."""


class InvalidArgument(StoreError):
    """A request the store refuses as malformed (bad name, size over a limit, bad range)."""


class ObjectNotFound(StoreError):
    def __init__(self, collection, name):
        super().__init__(f"object {name!r} not found in collection {collection!r}")
        self.collection = collection
        self.name = name


class _CollectionError(StoreError):
    what = ""           # the message after the collection's name

    def __init__(self, collection):
        super().__init__(f"collection {collection!r} {self.what}")
        self.collection = collection


class CollectionNotFound(_CollectionError):
    what = "does not exist"


class CollectionExists(_CollectionError):
    what = "already exists"


class CollectionNotEmpty(_CollectionError):
    what = "is not empty; delete its objects first"


class NoSpace(StoreError):
    """The device has too few free blocks for the transaction; nothing was changed."""

    def __init__(self, needed_bytes, free_bytes, device):
        super().__init__(f"no space: the transaction needs {needed_bytes} bytes but {device} "
                         f"has {free_bytes} bytes free")
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


class ChecksumError(StoreError):
    """Stored data does not match its crc32c: bit rot, a torn write or a bug. The bad bytes are
    never returned; the cluster repairs the object from another copy."""

    def __init__(self, collection, name, offset, expected, actual):
        super().__init__(f"checksum mismatch in object {name!r} (collection {collection!r}) at "
                         f"offset {offset}: stored crc32c {expected:#010x}, data has "
                         f"{actual:#010x}")
        self.collection = collection
        self.name = name
        self.offset = offset


class NotAStore(StoreError):
    """The device has no valid cairn superblock (never made by mkfs, or overwritten)."""


class StoreMismatch(StoreError):
    """The metadata directory belongs to a different device (uuid mismatch)."""


class StoreExists(StoreError):
    """mkfs refused: the device already holds a cairn store (use --force to overwrite)."""


class StoreFailed(StoreError):
    """A device flush or metadata commit failed: the store refuses further work until it is
    remounted."""


class StoreClosed(StoreError):
    """The store is closing or closed: open it again to use it."""
