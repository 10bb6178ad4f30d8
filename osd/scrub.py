"""Scrub: compare what the members of a PG hold, find damage, and repair it.

A scrub runs on the PG's primary, one PG at a time, while the PG is active and clean. Every
acting member lists its copy or shard of each object (`pg_scrub_local`, in pages): version,
shard index, size, and with `deep` it also reads every byte, so the store checks every 4 KiB
against its crc32c, and gives a crc32c of the whole copy. The primary compares (`compare`, pure):

- missing: a member lacks an object the primary holds (or, erasure-coded, holds a shard for
  another position);
- stale: a member holds another version than the primary, or an object the primary has not;
- checksum: (deep) a member's bytes fail their stored crc32c, or (replicated) a copy's crc32c
  (of its bytes, then its omap's entries) differs from the one most members agree on;
- parity: (deep, erasure-coded) the parity shards differ from a fresh encoding of the data
  shards.

With `repair`, each error is mended from good copies: a replica is copied again from a member
whose copy is right; a shard is rebuilt from k good shards (the bad one is never used: its read
fails its checksum, or it is the one being rebuilt). Damage found by client reads (a shard or
copy that failed its checksum) is queued on the PG and repaired the same way by the background
scrubber, which also starts light and deep scrubs on the intervals the cluster config sets,
within the recovery budget in force.
"""

import collections
import dataclasses

KINDS = ("checksum", "missing", "stale", "parity")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One member's copy or shard of one object, as it listed it."""
    version: int
    shard: object           # shard index (erasure-coded) or None
    size: int
    crc: object             # crc32c of the bytes (deep) or None
    damaged: bool           # (deep) the bytes failed their stored crc32c


@dataclasses.dataclass(frozen=True)
class Error:
    object: str
    osd: int
    shard: object
    kind: str

    def __post_init__(self):
        assert self.kind in KINDS, self.kind

    def to_dict(self, pg_name):
        return {"pg": pg_name, "object": self.object, "osd": self.osd, "shard": self.shard,
                "kind": self.kind}


def compare(members, primary, views, erasure):
    """The errors among `views` ({osd: {name: Entry}}) of the acting `members` (positions
    kept, None for holes); the primary's view is the reference for versions."""
    reference = views[primary]
    errors = []
    names = sorted(set().union(*(view.keys() for view in views.values())))
    for name in names:
        wanted = reference.get(name)
        crcs = collections.Counter(view[name].crc for view in views.values()
                                   if name in view and view[name].crc is not None
                                   and not view[name].damaged)
        majority = crcs.most_common(1)[0][0] if crcs and not erasure else None
        for position, osd in enumerate(members):
            if osd is None or osd not in views:
                continue
            shard = position if erasure else None
            entry = views[osd].get(name)
            if wanted is None:
                if entry is not None:
                    errors.append(Error(name, osd, shard, "stale"))     # the primary has none
            elif entry is None or (erasure and entry.shard != position):
                errors.append(Error(name, osd, shard, "missing"))
            elif entry.version != wanted.version:
                errors.append(Error(name, osd, shard, "stale"))
            elif entry.damaged or (majority is not None and entry.crc is not None
                                   and entry.crc != majority):
                errors.append(Error(name, osd, shard, "checksum"))
    return errors


@dataclasses.dataclass
class Report:
    """What one scrub found and did, added up over PGs (the JSON of `cairn pg scrub`)."""
    pool: str
    pgs: int = 0
    objects: int = 0
    bytes: int = 0
    errors: list = dataclasses.field(default_factory=list)
    repaired: int = 0
    skipped: list = dataclasses.field(default_factory=list)     # PGs not scrubbed, and why

    def add(self, other):
        self.pgs += other["pgs"]
        self.objects += other["objects"]
        self.bytes += other["bytes"]
        self.errors += other["errors"]
        self.repaired += other["repaired"]
        self.skipped += other.get("skipped", [])

    def to_dict(self):
        return {"pool": self.pool, "pgs": self.pgs, "objects": self.objects,
                "bytes": self.bytes, "errors": self.errors, "repaired": self.repaired,
                "skipped": self.skipped}
