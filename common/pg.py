"""Placement groups: acting sets, versions, store names (pure: no I/O; clients and OSDs).

- A PG is (pool id, PG index). Its objects live in the store collection `pg.POOL.INDEX` (index in
  hex), so a PG's objects can be listed, moved and removed together.
- The acting set of a PG at an epoch is its placement (common/placement.py) with the OSDs that
  are down removed; the primary is the first member left. Positions are kept for indep rules
  (erasure coding), with None where a member is missing.
- A PG version orders writes: (map epoch << 32) | sequence. The primary assigns it; the epoch
  part makes versions from a later primary (every change of primary is a new epoch) compare
  greater than anything an earlier one wrote.
- Every object in a PG carries its version in the attribute `_v` (8 bytes, big-endian), so
  replicas can be compared object by object; a stripe manifest (client/striping.py) also carries
  `_m`.
"""

import dataclasses
import struct

VERSION_ATTR = "_v"
MANIFEST_ATTR = "_m"
# On an erasure-coded shard: its shard index (decimal), and the object's size and stripe unit
# (EC_ATTR: 12 bytes, big-endian u64 size and u32 unit).
SHARD_ATTR = "_s"
EC_ATTR = "_e"
SEQUENCE_BITS = 32


@dataclasses.dataclass(frozen=True)
class Acting:
    members: tuple          # OSD ids in placement order, None where no OSD is up
    primary: object         # the first member up, or None
    size: int               # the pool's size
    min_size: int

    @property
    def up_members(self):
        return [member for member in self.members if member is not None]

    @property
    def writable(self):
        """Enough members up to accept writes (DESIGN.md: never fewer than min_size)."""
        return self.primary is not None and len(self.up_members) >= self.min_size


def collection(pool_id, pg_index):
    return f"pg.{pool_id}.{pg_index:x}"


def make_version(epoch, sequence):
    assert 0 < sequence < 1 << SEQUENCE_BITS, sequence
    assert epoch >= 0, epoch
    return (epoch << SEQUENCE_BITS) | sequence


def version_bytes(version):
    return struct.pack(">Q", version)


def version_of(attrs):
    raw = attrs.get(VERSION_ATTR)
    return struct.unpack(">Q", raw)[0] if raw is not None else 0


def shard_of(attrs):
    """The shard index an erasure-coded shard holds, or None (a whole replicated copy)."""
    raw = attrs.get(SHARD_ATTR)
    return int(raw) if raw is not None else None


def ec_attrs(shard_index, size, unit):
    return {SHARD_ATTR: str(shard_index).encode(), EC_ATTR: struct.pack(">QI", size, unit)}


def valid_geometry(value):
    """Whether `value` (from a message) is an erasure-coded object's [size, stripe unit]."""
    return isinstance(value, list) and len(value) == 2 and \
        all(type(v) is int and v >= 0 for v in value) and value[1] > 0


def ec_geometry(attrs):
    """(object size, stripe unit) of an erasure-coded shard."""
    return struct.unpack(">QI", attrs[EC_ATTR])


def acting_set(cmap, pool_name, pg_index):
    """The Acting set of one PG in this map (ValueError-free: the pool must exist)."""
    return _acting(cmap, cmap.pools[pool_name], cmap.placement().map_pg(pool_name, pg_index))


def _acting(cmap, pool, placed):
    members = tuple(m if m is not None and cmap.osds[m]["up"] else None for m in placed)
    if pool["kind"] == "replicated":
        members = tuple(m for m in members if m is not None)
    primary = next((m for m in members if m is not None), None)
    return Acting(members, primary, pool["size"], pool["min_size"])


def pool_by_id(cmap, pool_id):
    """The pool dict with this id, or None."""
    for pool in cmap.pools.values():
        if pool["id"] == pool_id:
            return pool
    return None


def acting_sets(cmap, pool_name):
    """The Acting set of every PG of a pool in this map, computed together (list by index)."""
    pool = cmap.pools[pool_name]
    return [_acting(cmap, pool, placed) for placed in cmap.placement().map_pool(pool_name)]


def log_collection(pool_id, pg_index):
    """The PG log: one empty object per write, named by its version (16 hex digits)."""
    return f"pglog.{pool_id}.{pg_index:x}"


def log_entry_name(version):
    return f"{version:016x}"


# The rollback stash of an erasure-coded PG: the shard each write replaced (or a marker that there
# was none), named by the replacing write's version, kept until that write is settled
# (osd/backend.py, ErasureBackend).
ABSENT_ATTR = "_a"


def stash_collection(pool_id, pg_index):
    return f"pgstash.{pool_id}.{pg_index:x}"


def stash_entry_name(version, name):
    return f"{version:016x}.{name}"


def parse_stash_entry(entry):
    """(replacing version, object name) of a stash entry's name."""
    return int(entry[:16], 16), entry[17:]
