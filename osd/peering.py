"""Peering of one placement group on its primary (pure: no I/O, no clock).

Theory of operation. A write is acknowledged only when every member of the PG's acting set has
committed it, and a PG accepts writes only while it is active. Whenever the acting set changes
(a new interval), the new primary must rebuild a state that holds every acknowledged write
before it accepts any new one.

The monitor keeps, per PG, the last *activation record*: (epoch, acting set, complete members).
A complete member holds every acknowledged write: it was recovered from the authority before
the PG went active (or is the authority), and as an acting member it receives every write since.
Members still being recovered are in the acting set but not complete.

1. The primary asks the monitor for the record, then queries its acting set and every up
   complete member of the record for their last_update (the highest PG version they applied,
   deletes included). A queried OSD refuses from then on any replicated write from an older
   epoch, so no write can still be acknowledged by the old set after we looked.
2. If no complete member of the record answers, the PG is INCOMPLETE: it waits for the map to
   change (an OSD returning) rather than go active without the newest data.
3. The authority is the answering complete member with the highest last_update (any answering
   member when there is no record yet: a new PG).
4. If the authority is another acting member, the PG goes active at once: the activation
   record (this epoch, the acting set, complete = the authority) is written at the monitor and
   the primary serves with a *missing set* (the objects whose version differs from the
   authority's, found from the logs or listings): a client op on a missing object recovers that
   object first, and the rest are recovered in the background. If the authority is not acting,
   the primary catches up from it before activation (it must then be complete itself, as the
   authority will receive no more writes). Otherwise (the primary is the authority) it activates
   with complete = the primary.
5. Active, the PG serves reads and writes while the other members are recovered from the
   authority in the background (each object under the primary's object lock, so no client write
   interleaves). Each member that finishes is added to the record's complete set; when all
   have, the PG is clean.

Any step failing (an OSD gone, a newer map) restarts peering at the next interval or retry.

`Peering` is driven by events and answers with effects, which the shell carries out in order:
    start(record)          -> [Query(osd)...] or [Incomplete]
    info(osd, last_update, complete_to) -> [] or [Recover(authority, me)] or [Activate, Recover...]
    recovered(target)      -> [] or [Activate, Recover...] or [Complete]
    activated()            -> state ACTIVE (recoveries continue in the background)
    failed(osd)            -> [Restart] (the shell retries after a delay or a new map)
"""

import dataclasses
import enum


class State(enum.Enum):
    WAITING_RECORD = "waiting_record"   # asking the monitor for the last activation record
    QUERYING = "peering"
    RECOVERING_PRIMARY = "recovering_primary"   # the primary catches up before activation
    ACTIVATING = "activating"
    ACTIVE = "active"                   # serving; members may still be recovering
    INCOMPLETE = "incomplete"
    FAILED = "peering_failed"


@dataclasses.dataclass(frozen=True)
class Record:
    epoch: int
    acting: tuple
    complete: tuple

    @classmethod
    def from_list(cls, raw):
        """A record as the monitor stores it: [epoch, acting] or [epoch, acting, complete]."""
        if raw is None:
            return None
        epoch, acting = raw[0], tuple(raw[1])
        complete = tuple(raw[2]) if len(raw) > 2 else acting
        return cls(epoch, acting, complete)


@dataclasses.dataclass(frozen=True)
class Query:
    osd: int


@dataclasses.dataclass(frozen=True)
class Recover:
    source: int
    target: int


@dataclasses.dataclass(frozen=True)
class Activate:
    epoch: int
    acting: tuple
    complete: tuple
    missing_from: int = None            # the primary serves with a missing set from this OSD


@dataclasses.dataclass(frozen=True)
class Complete:
    """Record that more members are complete (same epoch and acting set)."""
    epoch: int
    acting: tuple
    complete: tuple


@dataclasses.dataclass(frozen=True)
class _Stop:
    reason: str


class Incomplete(_Stop):
    """No complete member of the last record is up: wait for the next map."""


class Restart(_Stop):
    """A member failed or refused: peer again."""


class Peering:
    """The primary's peering of one PG for one interval (epoch, acting set)."""

    def __init__(self, epoch, acting, up_osds, me):
        assert me in acting, (me, acting)
        self.epoch = epoch
        self.acting = tuple(acting)
        self.up_osds = frozenset(up_osds)
        self.me = me
        self.state = State.WAITING_RECORD
        self.record = None
        self.infos = {}
        self.complete_tos = {}
        self.pending_queries = set()
        self.authority = None
        self.complete = set()
        self.pending_recoveries = set()

    @property
    def clean(self):
        """Active with every acting member complete."""
        return self.state is State.ACTIVE and self.complete == set(self.acting)

    def start(self, record):
        """`record`: the last activation Record, or None for a new PG."""
        assert self.state is State.WAITING_RECORD, self.state
        self.record = record
        probe = set(self.acting)
        if record is not None:
            up_complete = {osd for osd in record.complete if osd in self.up_osds}
            if not up_complete:
                self.state = State.INCOMPLETE
                return [Incomplete(f"no complete member of the last active set "
                                   f"{list(record.complete)} (epoch {record.epoch}) is up")]
            probe |= up_complete
        self.state = State.QUERYING
        self.pending_queries = set(probe)
        return [Query(osd) for osd in sorted(probe)]

    def info(self, osd, last_update, complete_to=0):
        """`osd` answered: the highest version it applied, and the version up to which it
        holds every acknowledged write (its complete_to)."""
        if self.state is not State.QUERYING or osd not in self.pending_queries:
            return []                   # late: peering already failed or moved on
        self.pending_queries.discard(osd)
        self.infos[osd] = last_update
        self.complete_tos[osd] = complete_to
        if self.pending_queries:
            return []
        return self._choose()

    def failed(self, osd, reason):
        """A query or recovery involving `osd` failed."""
        if self.state in (State.INCOMPLETE, State.FAILED):
            return []
        if self.state is State.QUERYING and osd not in self.acting and osd in self.pending_queries:
            # A past member that does not answer is not needed if another one does.
            self.pending_queries.discard(osd)
            return [] if self.pending_queries else self._choose()
        if self.state is State.ACTIVE and osd in self.pending_recoveries:
            # A member being recovered failed: it stays incomplete; the PG goes on serving
            # and the map change that follows (it went down) peers again.
            self.pending_recoveries.discard(osd)
            return []
        self.state = State.FAILED
        return [Restart(f"osd.{osd}: {reason}")]

    def _choose(self):
        candidates = self.infos
        if self.record is not None:
            candidates = {osd: lu for osd, lu in self.infos.items()
                          if osd in self.record.complete}
            if not candidates:
                self.state = State.INCOMPLETE
                return [Incomplete(f"no complete member of the last active set "
                                   f"{list(self.record.complete)} answered")]
        # Highest last_update wins; ties go to the primary (no copy needed), then lowest id.
        self.authority = max(candidates, key=lambda osd: (candidates[osd], osd == self.me,
                                                          -osd))
        if self.authority != self.me and self.authority not in self.acting:
            self.state = State.RECOVERING_PRIMARY
            return [Recover(self.authority, self.me)]
        return self._activate()

    def recovered(self, target):
        if self.state is State.RECOVERING_PRIMARY and target == self.me:
            return self._activate()
        if self.state is State.ACTIVE and target in self.pending_recoveries:
            self.pending_recoveries.discard(target)
            self.complete.add(target)
            return [Complete(self.epoch, self.acting, tuple(sorted(self.complete)))]
        return []                       # late: a recovery beside it failed

    def _activate(self):
        """The primary is complete (it is the authority or caught up), or the authority is an
        acting member: members are recovered from the authority (or the primary when the
        authority is not acting), the primary included."""
        self.state = State.ACTIVATING
        if self.authority in self.acting:
            source = self.authority
        else:
            source = self.me
        # Members that already hold every acknowledged write up to the authority's newest and
        # nothing past it need no recovery: they are complete from the start. Without this, a
        # PG whose members are all in step would name only the authority complete, and lose
        # the authority before the others are recorded: incomplete, though nothing is missing.
        head = self.infos[self.authority]
        self.complete = {source} | {osd for osd in self.acting
                                    if self.infos.get(osd) == head
                                    and self.complete_tos.get(osd, 0) >= head}
        self.pending_recoveries = set(self.acting) - self.complete
        missing_from = source if self.me in self.pending_recoveries else None
        effects = [Activate(self.epoch, self.acting, tuple(sorted(self.complete)), missing_from)]
        return effects + [Recover(source, osd) for osd in sorted(self.pending_recoveries)]

    def activated(self):
        assert self.state is State.ACTIVATING, self.state
        self.state = State.ACTIVE
        return []
