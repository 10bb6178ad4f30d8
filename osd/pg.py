"""One placement group as one OSD sees it: its state and every decision about it (pure: no I/O).

Theory of operation. A PG lives through *intervals*: spans of map epochs with one acting set.
On every map the OSD hands each PG its acting set (`new_interval` when it changed); the PG is
then this OSD's to lead (PRIMARY: it peers, assigns versions and serves clients), to follow
(REPLICA: it applies what its primary sends), or a STRAY copy kept until the PG is clean
elsewhere. The core decides, the shell (osd/pgs.py for peering and recovery, osd/service.py and
osd/backend.py for ops) carries out: it reads and writes the store, talks to other OSDs and the
monitors, holds object locks and timers, and feeds the answers back.

What the core owns, and the rules it keeps:
- **Versions.** The primary gives each write the next PG version: (epoch << 32) | sequence,
  above anything this OSD applied or handed out (`plan_write`). A later primary's versions
  are greater than an earlier one's because every change of primary is a new epoch.
- **Fencing.** A member refuses a replicated op from an OSD that is not the PG's primary in its
  map, or from an epoch older than `min_epoch`, which a new primary's query raised
  (`check_from_primary`, `query`): once a new primary looked, the old one can no longer get a
  write acknowledged. The check runs before any await in the shell, so no op slips between.
- **The log window.** Every write leaves a log entry: an entry of the key table of the PG's log
  collection `pglog.POOL.PG` (osd/records.py), keyed by version, its value the entry's fields
  (`log_entry_value`). Stores written before key tables hold entries as empty objects of that
  collection; those are read and trimmed as they are (`log_legacy`). The newest
  LOG_ENTRIES_KEPT are kept, trimmed in batches; the tail (an object of that collection) says
  below which versions the log is no longer complete. An entry written as a *complete* member
  carries a flag: the OSD then held every acknowledged write up to it (`complete_to`). A
  member recovered up to a version is *marked*: tail and complete_to move to it. `last_update`
  (the highest version applied, deletes included) moves only when a transaction committed
  (`applied`, `marked`), never when it is planned.
- **Missing set.** A primary behind another acting member (the authority) serves at once with
  the set of objects whose version here differs from the authority's: a client op on one of
  them recovers it first; a write replaces it; listings and existence follow the set.
- **Recovery planning.** From the PG logs when the source's log covers the target's gap
  (`delta_names`), otherwise by comparing listings in hash order (`backfill_names`).
- **What the monitors see.** The state string and the object counts for `cairn status`.

Both pool kinds use this core; what differs (whole copies or shards) lives in osd/backend.py.
Peering's own decisions (authority, activation, who is complete) are the `Peering` core in
osd/peering.py, which the shell runs per interval.
"""

import bisect
import collections
import dataclasses
import enum

import msgpack

from cairn.common import pg as pgs
from cairn.common.codes import Code
from cairn.native.checksum import crc32c

# Log entries kept per PG (Ceph keeps 3000 by default, osd_max_pg_log_entries); trimmed in
# batches so most writes carry no deletes.
LOG_ENTRIES_KEPT = 1024
LOG_TRIM_BATCH = 256
COMPLETE_ATTR = "c"              # on a log entry: every acknowledged write up to it is here
# On an erasure-coded member's log entry (and the tail): the primary's acked_to that came with
# the write, so a member that restarts still knows which versions were acknowledged.
ACKED_ATTR = "a"
# Stash entries one write may delete (a member that missed acked_to for long catches up in
# steps, as log trims do).
STASH_TRIM_BATCH = 64
TAIL_NAME = "~tail"              # not an entry: holds the version the log is complete after


# One packer for every entry (packb makes one per call); see records._PACK.
_PACK = msgpack.Packer(use_bin_type=True).pack


def log_entry_value(attrs):
    """A log entry's fields ({name: bytes}) as its key table value."""
    return _PACK(attrs)


def log_entry_attrs(value):
    """The fields of a log entry's key table value."""
    return msgpack.unpackb(value, raw=False)


class Refused(Exception):
    """An op the PG refuses, with the code the client library turns into a typed error
    (pool_unavailable, wrong_primary, stale, again, not_found)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


class Phase(enum.Enum):
    """Where a PG stands on this OSD; `PgCore.state` adds the flags (readonly, degraded)."""
    STRAY = "stray"                     # not a member of the acting set
    REPLICA = "replica"                 # a member, not the primary
    PEERING = "peering"                 # primary: querying members, choosing the authority
    RECOVERING = "recovering"           # primary: catching itself up before it activates
    ACTIVATING = "activating"           # primary: finding its missing set, recording
    ACTIVE = "active"                   # primary: serving
    ACTIVE_RECOVERING = "active+recovering"     # serving while members recover
    INCOMPLETE = "incomplete"           # no complete member is up: waits for the next map


class Role(enum.Enum):
    PRIMARY = "primary"
    REPLICA = "replica"
    STRAY = "stray"


@dataclasses.dataclass(frozen=True)
class WriteTarget:
    osd: int
    position: int               # the member's place in the acting set (its shard, for EC)
    complete: bool              # its log entry carries the complete flag


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """One client write, as the primary decided it: the version, and every member to apply it
    (this OSD included) in acting order."""
    name: str
    version: int
    epoch: int
    delete: bool
    manifest: bool
    existed: bool
    targets: tuple              # WriteTarget, one per acting member up

    def target(self, osd_id):
        return next(t for t in self.targets if t.osd == osd_id)


def delta_names(source_log, target_log):
    """The object names that recovery by log must sync from source to target, or None when the
    source's log does not cover the target's gap (then: backfill).

    A log is complete after its `tail` (trimmed below it; or, on a member that was itself
    recovered, unknown before its recovery). The target holds every acknowledged write up to
    its `complete_to`, and after it exactly the writes its entries list. The source's log
    covers the target when the target's complete_to is not older than the source's tail.

    The names are the two logs' difference, whatever the versions: entries of the source the
    target lacks (writes it missed; above its own tail, below which it was reconciled) and
    entries of the target the source lacks (writes never acknowledged, or ones the source
    trimmed: syncing those again costs a copy). An unacknowledged write can be missing from a
    member *below* its complete_to: the member missed it (a lost reply) and went on taking the
    interval's later writes, flagged complete; comparing only after complete_to left such an
    object different on two members after recovery (the seeded simulation, seed 3, 2026-11-27).
    """
    if target_log["complete_to"] < source_log["tail"]:
        return None
    source_versions = {version for version, _ in source_log["entries"]}
    target_versions = {version for version, _ in target_log["entries"]}
    names = {name for version, name in source_log["entries"]
             if version > target_log["tail"] and version not in target_versions}
    names |= {name for version, name in target_log["entries"] if version not in source_versions}
    return sorted(names)


@dataclasses.dataclass(frozen=True)
class Rollback:
    """What recovery does with an erasure-coded object whose version has fewer than k shards
    readable (`rollback_choice`)."""
    action: str                 # "wait", "restore", "delete" or "lost"
    version: int = 0            # restore: the version whose shards are read
    sources: tuple = ()         # restore: k of (shard index, osd, stash entry or None)
    geometry: tuple = None      # restore: (size, unit)
    manifest: bool = False
    reason: str = ""


def rollback_choice(version, answers, k):
    """The rollback decision for version `version` of an erasure-coded object that has fewer
    than k shards readable now, from each acting position's `pg_versions` answer and the
    recovery source's (`answers`: [(osd, answer)], the answer None where the position is
    empty or did not answer; else {"held": [...], "acked_seen": v}, osd/member_ops.py).

    - restore `version` itself when k shards of it exist, live or in the members' stashes (a
      later write that never finished moved them there: what was acknowledged comes back),
      wherever they are: a live shard may sit on an OSD that now holds another position, or
      on the recovery's source, out of the acting set (a read by position misses those; the
      slow tier's seed 10533 waited for good on such a pair, 2026-11-28);
    - wait: members that did not answer may hold enough live shards of `version`;
    - lost: `version` was acknowledged (a member saw acked_to reach it) and cannot be rebuilt;
    - restore the newest older version with k shards (live or stashed): `version` was a write
      that reached too few members before its primary died, never acknowledged; unless that
      version was deleted before `version`: a member stashed it as replaced by a write r of
      which no member holds a shard, and some member then stashed an absence (a write after
      r found nothing): r was a delete, and the object is deleted again (restoring the version
      before it read back a value an acknowledged delete had removed: the slow tier's seed
      10879, 2026-11-28);
    - delete: no older version is whole and a member stashed an absence (it had no shard
      before some write): within the pool's tolerance an acknowledged older version would be
      whole, live or stashed, so the object's last acknowledged state was absent (never
      written, or deleted); shards of older versions fewer than k are left-overs of a member
      that missed a delete, and unacknowledged writes after it (the seeded simulation's seed
      10615 left a PG degraded for good on one such shard, behind four retried writes that
      each reached one member);
    - lost otherwise.
    Pure: the caller (ErasureBackend._roll_back) asks, fetches and writes."""
    shards = collections.defaultdict(dict)      # version -> shard index -> (osd, stash entry)
    live = {}                                   # shard index -> osd, of `version` itself
    replaced = collections.defaultdict(set)     # version -> the writes its stashed shards name
    held_versions, absences = set(), []         # versions with any shard; absences' writes
    geometry, acked_seen, unknown = {}, 0, 0
    for osd, answer in answers:
        if answer is None:
            unknown += 1
            continue
        acked_seen = max(acked_seen, answer.get("acked_seen", 0))
        for held in answer["held"]:
            if held.get("absent"):
                absences.append(held["replaced_by"])
                continue
            held_versions.add(held["version"])
            if "replaced_by" in held:
                replaced[held["version"]].add(held["replaced_by"])
            if held["version"] > version:
                continue
            shards[held["version"]].setdefault(held["shard"], (osd, held.get("entry")))
            geometry[held["version"]] = (tuple(held["ec"]), held["manifest"])
            if held["version"] == version and held.get("entry") is None:
                live[held["shard"]] = osd

    def restore(chosen):
        sources = tuple((index, osd, entry)
                        for index, (osd, entry) in sorted(shards[chosen].items())[:k])
        (size, unit), manifest = geometry[chosen]
        return Rollback("restore", chosen, sources, (size, unit), manifest)
    if len(shards.get(version, ())) >= k:
        return restore(version)
    if len(live) + unknown >= k:
        return Rollback("wait", reason=f"{unknown} members did not answer; they may hold the "
                        "missing shards")
    if acked_seen >= version:
        return Rollback("lost", reason=f"version {version:x} was acknowledged and has "
                        f"{len(shards.get(version, ()))} shards left, {k} needed")
    older = {v: held for v, held in shards.items() if v < version}
    whole = sorted((v for v, held in older.items() if len(held) >= k), reverse=True)
    if whole:
        deletes = sorted(r for r in replaced[whole[0]]
                         if whole[0] < r < version and r not in held_versions)
        if deletes and any(later > deletes[0] for later in absences):
            return Rollback("delete", reason=f"version {whole[0]:x} was deleted by write "
                            f"{deletes[0]:x} before {version:x}")
        return restore(whole[0])
    if absences:
        return Rollback("delete", reason="absent before it" + (
            "; ignored stale shards of " + ", ".join(f"{v:x}" for v in sorted(older))
            if older else ""))
    return Rollback("lost", reason=f"no version up to {version:x} has {k} shards left")


def hash_order(name):
    """The sort key of backfill: the object name's crc32c (as placement hashes it), then the
    name."""
    return crc32c(name.encode()), name


def backfill_names(wanted, have):
    """The names a backfill syncs, in hash order: what the source has at another version than
    the target ({name: version} each), and what the target has that the source has not."""
    behind = [name for name, version in wanted.items() if have.get(name) != version]
    extra = list(have.keys() - wanted.keys())
    return sorted(behind + extra, key=hash_order)


def merge_missing(names, following, missing, prefix, start_after, limit):
    """A listing page of this OSD's copy corrected by a missing set (name -> the authority's
    version, None: absent there): what the authority has is listed, what it has not is not.
    `following` is None when the local listing reached its end; otherwise names after it
    belong to the next page."""
    gone = {name for name, version in missing.items() if version is None}
    extra = {name for name, version in missing.items()
             if version is not None and name.startswith(prefix)
             and (start_after is None or name > start_after)
             and (following is None or name <= following)}
    merged = sorted((set(names) | extra) - gone)
    if len(merged) > limit:
        return merged[:limit], merged[limit - 1]
    return merged, following


class PgCore:
    """What this OSD knows about one PG, and the decisions that change it."""

    # The log window; the simulation shrinks it to a few entries so trims happen.
    log_entries_kept = LOG_ENTRIES_KEPT
    log_trim_batch = LOG_TRIM_BATCH

    def __init__(self, key, me):
        self.key = key                                  # (pool id, pg index)
        self.me = me
        self.collection = pgs.collection(*key)
        self.log_collection = pgs.log_collection(*key)
        self.stash_collection = pgs.stash_collection(*key)
        self.interval = None                            # (epoch, Acting)
        self.phase = Phase.STRAY
        self.readonly = False                           # active below min_size: no writes
        self.degraded = False                           # active, a member's recovery gave up
        self.min_epoch = 0
        self.log_names = None                           # deque of entry names, oldest first
        self.log_legacy = set()                         # entries held as objects (older stores)
        self.log_tail = 0                               # the log is complete after this version
        self.last_update = 0
        self.complete_to = 0                            # every acknowledged write to here is here
        self.assigned = 0                               # the last version handed out (primary)
        self.recovered_objects = 0
        # As primary, for this interval:
        self.complete_members = frozenset()             # their writes carry the complete flag
        self.missing = {}                               # name -> authority's version (None: gone)
        self.missing_from = None                        # the authority the missing set is from
        self.missing_mark = 0                           # its last_update when the set was made
        self.missing_sizes = {}                         # name -> bytes (the budget's estimate)
        self.remaining = {}                             # member -> objects still to sync
        self.object_count = 0
        self.damaged = set()                            # names with a shard or copy that failed
                                                        # its checksum: to repair
        # Settling writes (erasure-coded pools keep what a write replaced until it is settled):
        self.unsettled = {}                             # primary: version -> name, not yet acked
        self.settled = False                            # primary: clean once in this interval
        self.stash_names = None                         # member: sorted stash entry names
        self.acked_seen = 0                             # member: highest acked_to it was sent
        self.scrub_errors = 0                           # errors the last scrub left unrepaired
        self.clean = False                              # every member complete, and recorded
        self.serving = False                            # active: client ops are served
        # As a stray:
        self.stray_objects = None
        self.removing = False                           # a stray copy being deleted

    @property
    def acting(self):
        return self.interval[1] if self.interval else None

    @property
    def state(self):
        """The PG's state as `cairn status` shows it ("active", "active+readonly",
        "active+degraded", "peering", ...): the phase with its flags."""
        if self.phase is Phase.ACTIVE:
            if self.readonly:
                return "active+readonly"
            return "active+degraded" if self.degraded else "active"
        return self.phase.value

    @property
    def role(self):
        acting = self.acting
        if acting is not None and acting.primary == self.me:
            return Role.PRIMARY
        if acting is not None and self.me in acting.members:
            return Role.REPLICA
        return Role.STRAY

    # -- intervals and peering's outcomes ------------------------------------------------------------

    def new_interval(self, epoch, acting):
        """The acting set changed at `epoch` (or may have, unseen: a map that skipped epochs):
        forget the last interval's serving state.
        Returns this OSD's role in the new one (PRIMARY: the shell starts peering)."""
        assert self.interval is None or self.interval[1].members != acting.members or \
            epoch > self.interval[0]
        self.interval = (epoch, acting)
        self.serving = False
        self.complete_members = frozenset()
        self.missing, self.missing_from, self.remaining = {}, None, {}
        self.clean = False
        self.unsettled, self.settled = {}, False
        self.readonly = self.degraded = False
        role = self.role
        self.phase = {Role.PRIMARY: Phase.PEERING, Role.REPLICA: Phase.REPLICA,
                      Role.STRAY: Phase.STRAY}[role]
        return role

    def peering_moved(self, phase):
        """The primary's peering reached `phase` (PEERING again, RECOVERING, ACTIVATING,
        INCOMPLETE) or its background recovery started (ACTIVE_RECOVERING)."""
        assert phase in (Phase.PEERING, Phase.RECOVERING, Phase.ACTIVATING, Phase.INCOMPLETE,
                         Phase.ACTIVE_RECOVERING), phase
        self.phase = phase

    def activated(self, complete, writable, more_to_recover):
        """Peering activated the PG: it serves from now on; `complete` members' writes carry
        the complete flag."""
        assert self.role is Role.PRIMARY
        self.complete_members = frozenset(complete)
        self.phase, self.readonly, self.degraded = Phase.ACTIVE, not writable, False
        self.clean = writable and not more_to_recover
        self.settled = self.settled or self.clean
        self.serving = True

    def member_recovered(self, complete):
        """A member finished its background recovery; `complete`: who is complete now."""
        self.complete_members = frozenset(complete)

    def recovery_finished(self, clean, writable, all_recorded):
        """Every background recovery of the interval ended (each succeeded or gave up)."""
        self.phase, self.readonly, self.degraded = Phase.ACTIVE, not writable, not clean
        self.clean = writable and clean and all_recorded
        self.settled = self.settled or self.clean

    # -- client writes on the primary ---------------------------------------------------------------

    def check_serving(self, interval):
        """Refuse (`again`) an op admitted while the PG served `interval` that waited (for an
        object's lock, a recovery) while the PG moved on: the missing set it was admitted
        under is gone, so this copy may be behind (a read once answered `not_found` for an
        acknowledged object this way: the seeded simulation, seed 72, 2026-11-27)."""
        if self.interval is not interval or not self.serving:
            raise Refused(Code.AGAIN, f"pg {self.key[0]}.{self.key[1]:x} changed its acting "
                          "set during the op; retry")

    def check_writable(self, pool_name):
        acting = self.acting
        if not acting.writable:
            raise Refused(Code.POOL_UNAVAILABLE, f"pg {self.key[0]}.{self.key[1]:x} of pool "
                          f"{pool_name} has {len(acting.up_members)} members up, fewer than "
                          f"min_size {acting.min_size}: writes refused")
        return acting

    def plan_write(self, acting_seen, epoch, name, delete, manifest, existed, recovery=False):
        """The version and targets of one write (the caller holds the object's lock).
        `acting_seen`: the acting set the op was admitted under; `existed`: whether the PG
        holds the object now (see `exists`). `recovery`: a rollback's rewrite, which recovery
        also makes while the primary catches itself up before activating (RECOVERING): an
        object that needs one must not hold the activation back forever; its delete may find
        the object absent here."""
        if self.acting is not acting_seen or not (
                self.serving or recovery and self.phase is Phase.RECOVERING):
            raise Refused(Code.AGAIN, "the acting set changed; retry")
        if delete and not existed and not recovery and name not in self.unsettled.values():
            # A rollback's delete may find nothing here: its log entry is what it writes,
            # superseding a version only another OSD's log named. So may a delete retried
            # after one that removed the object here but was not acknowledged everywhere:
            # answering `not_found` from this copy would tell the client the object is gone
            # while a member still holds it and the next peering may bring it back (the slow
            # tier's seeds 10963 and 10652, 2026-11-28); it is carried out again instead.
            raise Refused(Code.NOT_FOUND, f"object {name!r} not found")
        version = max(pgs.make_version(epoch, 1), self.last_update + 1, self.assigned + 1)
        self.assigned = version
        self.unsettled[version] = name
        targets = tuple(WriteTarget(osd, position, osd in self.complete_members)
                        for position, osd in enumerate(acting_seen.members) if osd is not None)
        return WritePlan(name, version, epoch, delete, manifest, existed, targets)

    def write_finished(self, plan, committed_here, acknowledged):
        """The write's members answered; `committed_here`: this OSD's copy committed;
        `acknowledged`: every member did (the client is told it succeeded).

        A write planned in an earlier interval changes nothing here: a replica's reply may
        take its whole deadline (20 s), and meanwhile a new interval can have found a newer
        version elsewhere and put the object in its missing set; dropping it from there would
        serve the old copy as current and call the PG clean (the seeded simulation found this,
        seed 40, 2026-11-27)."""
        if self.interval is None or plan.epoch < self.interval[0]:
            return
        if committed_here:
            self.missing.pop(plan.name, None)           # our copy is the newest now
            self.object_count += (not plan.delete) - plan.existed
        if acknowledged:
            # This write and every earlier unacknowledged one of the same object are settled:
            # the object is whole at this version on every member.
            for version in [v for v, name in self.unsettled.items()
                            if name == plan.name and v <= plan.version]:
                del self.unsettled[version]

    def acked_to(self):
        """Every write up to this version is acknowledged, or was settled by the recovery
        that made the PG clean: members may forget what those writes replaced. None until the
        PG has been clean in this interval (before that, recovery may still need it)."""
        if not self.settled:
            return None
        if self.unsettled:
            return min(self.unsettled) - 1
        return max(self.assigned, self.last_update)

    # -- the rollback stash (members of erasure-coded PGs) --------------------------------------

    def stash_loaded(self, names, acked_seen):
        """The stash entries and the highest acked_to on the log's entries, as the store
        holds them (the tail's is read with the log)."""
        if self.stash_names is None:
            self.stash_names = sorted(names)
            self.acked_seen = max(self.acked_seen, acked_seen)

    def stash_ops(self, txn, version, name, present, acked_to):
        """Keep what write `version` replaces: this member's shard of `name` (renamed into the
        stash, no copy) or a marker that it had none; and forget the entries of writes up to
        `acked_to`. Names are taken from the list now, so two writes never trim one entry."""
        assert self.stash_names is not None
        entry = pgs.stash_entry_name(version, name)
        if present:
            txn.rename(self.collection, name, self.stash_collection, entry)
        else:
            txn.put(self.stash_collection, entry, b"", attrs={pgs.ABSENT_ATTR: b"1"})
        if acked_to is not None:
            self.acked_seen = max(self.acked_seen, acked_to)
            cut = 0
            while cut < min(len(self.stash_names), STASH_TRIM_BATCH) and \
                    pgs.parse_stash_entry(self.stash_names[cut])[0] <= acked_to:
                cut += 1
            for old in self.stash_names[:cut]:
                txn.delete(self.stash_collection, old)
            del self.stash_names[:cut]
        return entry

    def stashed(self, entry):
        """The transaction of stash_ops committed."""
        bisect.insort(self.stash_names, entry)

    def stash_of(self, name):
        """This member's stash entries of `name`, oldest first."""
        return [entry for entry in (self.stash_names or ())
                if pgs.parse_stash_entry(entry)[1] == name]

    # -- replicated ops on members ----------------------------------------------------------------

    def check_from_primary(self, sender, epoch):
        """Refuse an op from a member that is not this PG's primary here, or from an epoch
        older than the last peering's."""
        if self.removing:
            raise Refused(Code.AGAIN, f"osd.{self.me} is deleting its stray copy of pg "
                          f"{self.key[0]}.{self.key[1]:x}; retry")
        acting = self.acting
        if acting is None or acting.primary != sender:
            raise Refused(Code.WRONG_PRIMARY, f"osd.{sender} is not the primary of pg "
                          f"{self.key[0]}.{self.key[1]:x} here")
        if epoch < self.min_epoch:
            raise Refused(Code.STALE, f"epoch {epoch} is older than this PG's peering (epoch "
                          f"{self.min_epoch})")

    def query(self, epoch):
        """A new primary asks for last_update: from now on refuse its predecessors' writes.
        The log must be loaded."""
        assert self.log_names is not None
        self.min_epoch = max(self.min_epoch, epoch)
        return self.last_update

    # -- the log window -----------------------------------------------------------------------------

    def log_loaded(self, names, tail_attrs, newest_complete, legacy=()):
        """The log as the store holds it: entry names oldest first (without the tail object),
        the tail object's attributes (None: none), the newest entry that carries the complete
        flag (None: none), and those of the names held as objects (`log_legacy`)."""
        if self.log_names is not None:
            return
        self.log_legacy = set(legacy)
        if tail_attrs is not None:
            self.log_tail = int(tail_attrs.get("t", b"0").decode(), 16)
            self.complete_to = max(self.complete_to, int(tail_attrs.get("c", b"0").decode(), 16))
            self.acked_seen = max(self.acked_seen,
                                  int(tail_attrs.get(ACKED_ATTR, b"0").decode(), 16))
        if newest_complete is not None:
            self.complete_to = max(self.complete_to, int(newest_complete, 16))
        self.log_names = collections.deque(names)
        self.last_update = max(self.last_update, self.log_tail,
                               int(names[-1], 16) if names else 0)

    def log_ops(self, txn, version, name, delete, complete, acked_to=None):
        """Add this write's log entry (and a trim when due) to `txn`; `complete`: this OSD is
        a complete member, so it holds every acknowledged write up to `version`; `acked_to`:
        the primary's, sent with an erasure-coded write (kept with the entry). Only committed
        entries are trimmed (`applied()` records them), so a trim never deletes an entry whose
        own transaction is still in flight."""
        assert self.log_names is not None
        entry = pgs.log_entry_name(version)
        attrs = {"n": name.encode(), "o": b"d" if delete else b"p"}
        if complete:
            attrs[COMPLETE_ATTR] = b"1"
        if acked_to:
            attrs[ACKED_ATTR] = f"{acked_to:x}".encode()
            self.acked_seen = max(self.acked_seen, acked_to)
        removes = ()
        batch = self.log_trim_batch
        if len(self.log_names) > self.log_entries_kept + batch:
            oldest = sorted(set(self.log_names) - {entry})     # never this write's own entry
            removes = []
            for old in oldest[:batch]:
                if old in self.log_legacy:
                    self.log_legacy.discard(old)
                    txn.delete(self.log_collection, old)
                else:
                    removes.append(old.encode())
            self.log_names = collections.deque(oldest[batch:])
            self.log_tail = max(self.log_tail, int(oldest[batch - 1], 16))
            self._tail_ops(txn, self.log_tail, self.complete_to)
        txn.keys_update(self.log_collection, set=[(entry.encode(), log_entry_value(attrs))],
                        remove=removes)

    def _tail_ops(self, txn, tail, complete_to):
        attrs = {"t": f"{tail:x}".encode(), "c": f"{complete_to:x}".encode()}
        if self.acked_seen:             # trimmed entries may have carried the highest acked_to
            attrs[ACKED_ATTR] = f"{self.acked_seen:x}".encode()
        txn.put(self.log_collection, TAIL_NAME, b"", attrs=attrs)

    def applied(self, version, complete):
        """The transaction carrying log entry `version` committed."""
        self.last_update = max(self.last_update, version)
        if complete:
            self.complete_to = max(self.complete_to, version)
        self.log_names.append(pgs.log_entry_name(version))

    def mark_ops(self, txn, version):
        """This member was recovered up to `version`: it holds every acknowledged write up to
        it, and its log (what it applied before) is no history to recover others by."""
        assert self.log_names is not None
        self._tail_ops(txn, max(self.log_tail, version), max(self.complete_to, version))

    def marked(self, version):
        """The transaction of mark_ops(version) committed."""
        self.log_tail = max(self.log_tail, version)
        self.complete_to = max(self.complete_to, version)
        self.last_update = max(self.last_update, version)

    def log_forgotten(self):
        """The log collection was deleted (a stray copy going away; its stash goes next)."""
        self.log_names, self.log_tail, self.last_update, self.complete_to = None, 0, 0, 0
        self.log_legacy = set()
        self.stash_names = None

    # -- a stray copy -------------------------------------------------------------------------------

    def stray_counted(self, objects):
        """The stray copy holds `objects` objects (counted once, then kept by stray_removed)."""
        if self.stray_objects is None:
            self.stray_objects = objects

    def stray_removed(self, objects):
        self.stray_objects = max(0, (self.stray_objects or 0) - objects)

    def removal_started(self):
        """The stray copy is being deleted: peering and replication ops answer `again`."""
        self.removing = True

    def removal_ended(self):
        self.removing = False

    def log_summary(self, entries):
        """The log as peering exchanges it, from [(version, name)] oldest first."""
        return {"entries": entries, "last_update": self.last_update, "tail": self.log_tail,
                "complete_to": self.complete_to}

    # -- the missing set ----------------------------------------------------------------------------

    def set_missing(self, authority, mark, candidates, local_versions):
        """Serve with a missing set from `authority`: `candidates` {name: (its version, size)}
        for the names its plan gave; `local_versions` {name: version here or None}."""
        self.missing = {name: version for name, (version, _) in candidates.items()
                        if local_versions.get(name) != version}
        self.missing_sizes = {name: candidates[name][1] for name in self.missing}
        self.missing_from, self.missing_mark = authority, mark
        return len(self.missing)

    def exists(self, name, present):
        """Whether the PG holds `name`, as this primary serves it: the missing set first, then
        `present()` (whether the copy here has it; asked only when needed, it reads the store)."""
        if name in self.missing:
            return self.missing[name] is not None
        return present()

    def object_recovered(self, name):
        """A missing object was recovered here (on demand or in the background)."""
        self.missing.pop(name, None)
        self.recovered_objects += 1

    def member_recovery_started(self, member, objects):
        """A background recovery of `member` will sync `objects` objects."""
        self.remaining[member] = objects

    def member_object_synced(self, member):
        """One of them was synced. A progress count only: a new interval resets the counts,
        and another recovery to this member may have ended meanwhile (a KeyError here once
        stopped an OSD in CI)."""
        if member in self.remaining:
            self.remaining[member] -= 1

    def member_recovery_ended(self, member, recovered):
        """That recovery ended (done or failed) after copying or removing `recovered`."""
        self.remaining.pop(member, None)
        self.recovered_objects += recovered

    # -- damage and scrubs --------------------------------------------------------------------------

    def found_damaged(self, name):
        """A read found a copy or shard of `name` failing its checksum: to repair."""
        self.damaged.add(name)

    def scrubbed(self, names, unrepaired):
        """A scrub of `names` (None: the whole PG) ended with `unrepaired` errors left."""
        if names is None:
            self.scrub_errors = unrepaired
        if not unrepaired:
            if names is None:
                self.damaged.clear()
            else:
                self.damaged.difference_update(names)

    def inconsistent(self):
        """This primary's last scrub left errors, or reads found damage not yet repaired."""
        return self.role is Role.PRIMARY and bool(self.scrub_errors or self.damaged)

    def count_objects(self, stored, present):
        """The PG's objects as this primary serves it: `stored` objects in its copy, corrected
        by the missing set (`present(name)`: whether the copy here has it)."""
        count = stored
        for name, version in self.missing.items():
            count += (version is not None) - present(name)
        self.object_count = count
        return count

    # -- what the monitors see ----------------------------------------------------------------------

    def reported_state(self):
        """The state string, for PGs this OSD is primary of (None otherwise)."""
        if self.role is not Role.PRIMARY:
            return None
        acting = self.acting
        degraded = len(acting.up_members) < acting.size
        state = self.state
        return state + ("+degraded" if degraded and state == "active" else "")

    def object_counts(self):
        """(total, degraded, misplaced) object copies this OSD accounts for: see
        PgRegistry.object_counts."""
        acting = self.acting
        if acting is None:
            return 0, 0, 0
        if acting.primary == self.me and self.serving:
            degraded = sum(self.remaining.values()) + len(self.missing)
            degraded += self.object_count * (acting.size - len(acting.up_members))
            return self.object_count * acting.size, degraded, 0
        if self.phase is Phase.STRAY and self.stray_objects:
            return 0, 0, self.stray_objects
        return 0, 0, 0
