"""Store transactions: operations applied atomically by `Store.apply()` (pure: no I/O).

They live apart from the store so that pure cores (osd/pg.py builds a write's object and log
operations) can make them without importing the engine.
"""

import typing

from cairn.common.limits import BLOCK_SIZE_BYTES, OBJECT_SIZE_BYTES_MAX, OMAP_UPDATE_BYTES_MAX
from cairn.osd import records
from cairn.osd.errors import InvalidArgument

# Operations are named tuples: a transaction of 4 KiB puts spends more time building them than
# writing the bytes, and a tuple is the cheapest immutable record Python has.


class CreateCollection(typing.NamedTuple):
    collection: str


class RemoveCollection(typing.NamedTuple):
    collection: str


class Put(typing.NamedTuple):
    collection: str
    name: str
    data: object            # any buffer
    attrs: dict
    size: int | None = None     # the object's length when `data` carries zero padding after it
    crcs: bytes | None = None   # the block crcs of `data` where the caller has them (see put)


class Write(typing.NamedTuple):
    collection: str
    name: str
    offset: int
    data: object


class Delete(typing.NamedTuple):
    collection: str
    name: str


class Rename(typing.NamedTuple):
    collection: str
    name: str
    target_collection: str
    target_name: str


class SetAttrs(typing.NamedTuple):
    collection: str
    name: str
    attrs: dict             # a value of None removes that attribute


class OmapUpdate(typing.NamedTuple):
    collection: str
    name: str
    sets: tuple             # ((key, value), ...): bytes
    removes: tuple          # (key, ...): absent keys are fine
    clear: bool             # drop every entry first


class KeysUpdate(typing.NamedTuple):
    collection: str
    sets: tuple             # ((key, value), ...): bytes
    removes: tuple          # (key, ...): absent keys are fine


class Transaction:
    """Operations applied atomically by `Store.apply()`, in order.

    >>> txn = Transaction().put("pg.1", "a", b"hello").set_attrs("pg.1", "a", {"k": b"v"})
    >>> await store.apply(txn)
    """

    def __init__(self):
        self.ops = []

    def create_collection(self, collection):
        records.check_collection_name(collection)
        self.ops.append(CreateCollection(collection))
        return self

    def remove_collection(self, collection):
        records.check_collection_name(collection)
        self.ops.append(RemoveCollection(collection))
        return self

    def put(self, collection, name, data, attrs=None, size=None, crcs=None):
        """Create or replace a whole object. `size`: the object is the first `size` bytes of
        `data`, the rest (less than one block) zeros: a sender pads what it sends to whole
        blocks so that the buffer it lands in goes to the device as it is, uncopied. `crcs`:
        the crc32c of each whole block of `data` as `checksum.block_crcs` gives them, known from
        receiving it (frame.Frame.block_crcs); the store uses them instead of reading `data`
        again when it writes `data` as it is."""
        self._check_object(collection, name)
        _check_data(data)
        if size is not None:
            _check_padding(data, size)
        attrs = dict(attrs or {})
        records.check_attrs(attrs)
        self.ops.append(Put(collection, name, data, attrs, size, crcs))
        return self

    def write(self, collection, name, offset, data):
        """Write `data` at `offset`, creating the object if needed and growing it past its end
        (a gap reads as zeros)."""
        self._check_object(collection, name)
        _check_data(data)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"write offset must be a non-negative integer (was {offset!r})")
        if offset + len(data) > OBJECT_SIZE_BYTES_MAX:
            raise InvalidArgument(f"write would grow {name!r} to {offset + len(data)} bytes; the "
                                  f"limit is {OBJECT_SIZE_BYTES_MAX}")
        self.ops.append(Write(collection, name, offset, data))
        return self

    def delete(self, collection, name):
        self._check_object(collection, name)
        self.ops.append(Delete(collection, name))
        return self

    def rename(self, collection, name, target_collection, target_name):
        """Move an object (data, attributes) to another name or collection without copying
        its bytes; an object already at the target is replaced."""
        self._check_object(collection, name)
        self._check_object(target_collection, target_name)
        self.ops.append(Rename(collection, name, target_collection, target_name))
        return self

    def set_attrs(self, collection, name, attrs):
        self._check_object(collection, name)
        records.check_attrs(attrs)
        self.ops.append(SetAttrs(collection, name, dict(attrs)))
        return self

    def omap_update(self, collection, name, set=(), remove=(), clear=False):
        """Change an existing object's omap: drop every entry if `clear`, then remove the keys
        in `remove` and set the (key, value) pairs in `set` (a dict or pairs). A `put` of the
        object replaces its omap with an empty one; a rename carries it along."""
        self._check_object(collection, name)
        sets, removes = _checked_entries(set, remove, "an omap")
        self.ops.append(OmapUpdate(collection, name, sets, removes, bool(clear)))
        return self

    def keys_update(self, collection, set=(), remove=()):
        """Change `collection`'s key table (entries that belong to no object: records.py):
        remove the keys in `remove`, then set the (key, value) pairs in `set`. Keys and values
        follow the omap limits. No object is locked or looked up: two transactions that set
        the same key leave the one that commits last."""
        records.check_collection_name(collection)
        self.ops.append(KeysUpdate(collection, *_checked_entries(set, remove, "a key table")))
        return self

    @staticmethod
    def _check_object(collection, name):
        records.check_collection_name(collection)
        records.check_object_name(name)


def _checked_entries(sets, removes, what):
    """((key, value) pairs to set, keys to remove) of an omap or key table update, as bytes,
    checked against the omap limits (`what` names the table in errors)."""
    sets = tuple(sets.items() if isinstance(sets, dict) else sets)
    removes = tuple(removes)
    total = 0
    for pair in sets:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise InvalidArgument(f"entries to set in {what} are (key, value) pairs")
        records.check_omap_key(pair[0])
        records.check_omap_value(pair[1])
        total += len(pair[0]) + len(pair[1])
    for key in removes:
        records.check_omap_key(key)
        total += len(key)
    if total > OMAP_UPDATE_BYTES_MAX:
        raise InvalidArgument(f"{what} update of {total} bytes is over the limit "
                              f"({OMAP_UPDATE_BYTES_MAX}); split it")
    return tuple((bytes(k), bytes(v)) for k, v in sets), tuple(bytes(k) for k in removes)


def _check_padding(data, size):
    view = memoryview(data).cast("B")
    if not isinstance(size, int) or not 0 <= size <= view.nbytes < size + BLOCK_SIZE_BYTES:
        raise InvalidArgument(f"object size {size!r} does not fit {view.nbytes} bytes of data "
                              f"padded to whole {BLOCK_SIZE_BYTES}-byte blocks")
    if bytes(view[size:]).count(0) != view.nbytes - size:
        raise InvalidArgument(f"the {view.nbytes - size} bytes of padding after an object of "
                              f"{size} bytes are not zeros")


def _check_data(data):
    try:
        length = memoryview(data).nbytes
    except TypeError:
        raise InvalidArgument(f"object data must be a bytes-like buffer (was "
                              f"{type(data).__name__})") from None
    if length > OBJECT_SIZE_BYTES_MAX:
        raise InvalidArgument(f"object data is {length} bytes; the limit is "
                              f"{OBJECT_SIZE_BYTES_MAX} (clients stripe larger data)")


