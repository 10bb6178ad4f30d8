"""Peering of one placement group on its primary (pure: no I/O, no clock).

Theory of operation. A write is acknowledged only when every member of the PG's acting set has
committed it, and a PG accepts writes only while it is ACTIVE. Whenever the acting set changes
(a new interval), the new primary must rebuild a state that holds every acknowledged write
before it accepts any new one:

1. It asks the monitor for the PG's last *activation record*: the acting set that last went
   active. Only members of that set can hold every acknowledged write, because writes happen only
   while that set is active and each one is on all of them.
2. It queries its own acting set and every up member of the last active set for their PG info
   (last_update: the highest PG version they applied, deletes included). A queried OSD refuses
   from then on any replicated write from an older epoch, so no write can still be
   acknowledged by the old set after we looked.
3. If no member of the last active set answers, the PG is INCOMPLETE: it waits for the map to
   change (an OSD returning) rather than go active without the newest data.
4. The authority is the answering member of the last active set with the highest last_update
   (any answering member when there is no record yet: a new PG).
5. Every acting member whose state differs from the authority's is recovered from it (objects
   copied by version, extras deleted). Then the activation record for this epoch and acting set
   is written at the monitor (durably), and only then does the PG become ACTIVE.

Any step failing (an OSD gone, a newer map) restarts peering at the next interval or retry.

`Peering` is driven by events and answers with effects, which the shell carries out in order:
    start(record)          -> [Query(osd)...] or [Incomplete]
    info(osd, last_update) -> [] or [Recover(source, target)..., or Activate]
    recovered(target)      -> [] or [Activate]
    activated()            -> state ACTIVE
    failed(osd)            -> [Restart] (the shell retries after a delay or a new map)
"""

import dataclasses
import enum


class State(enum.Enum):
    WAITING_RECORD = "peering"          # asking the monitor for the last activation record
    QUERYING = "peering"
    RECOVERING = "recovering"
    ACTIVATING = "activating"
    ACTIVE = "active"
    INCOMPLETE = "incomplete"
    FAILED = "peering_failed"


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


@dataclasses.dataclass(frozen=True)
class Incomplete:
    reason: str


@dataclasses.dataclass(frozen=True)
class Restart:
    reason: str


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
        self.pending_queries = set()
        self.pending_recoveries = set()
        self.authority = None

    def start(self, record):
        """`record`: the last activation record (epoch, acting tuple) or None for a new PG."""
        assert self.state is State.WAITING_RECORD
        self.record = record
        probe = set(self.acting)
        if record is not None:
            probe |= {osd for osd in record[1] if osd in self.up_osds}
            if not probe & set(record[1]):
                self.state = State.INCOMPLETE
                return [Incomplete(f"none of the last active set {list(record[1])} (epoch "
                                   f"{record[0]}) is up")]
        self.state = State.QUERYING
        self.pending_queries = set(probe)
        return [Query(osd) for osd in sorted(probe)]

    def info(self, osd, last_update):
        if self.state is not State.QUERYING or osd not in self.pending_queries:
            return []                   # late: peering already failed or moved on
        self.pending_queries.discard(osd)
        self.infos[osd] = last_update
        if self.pending_queries:
            return []
        return self._choose()

    def failed(self, osd, reason):
        """A query or recovery involving `osd` failed."""
        if self.state in (State.ACTIVE, State.INCOMPLETE):
            return []
        if self.state is State.QUERYING and osd not in self.acting and osd in self.pending_queries:
            # A past member that does not answer is not needed if another past member does.
            self.pending_queries.discard(osd)
            return [] if self.pending_queries else self._choose()
        self.state = State.FAILED
        return [Restart(f"osd.{osd}: {reason}")]

    def _choose(self):
        candidates = self.infos
        if self.record is not None:
            candidates = {osd: lu for osd, lu in self.infos.items() if osd in self.record[1]}
            if not candidates:
                self.state = State.INCOMPLETE
                return [Incomplete(f"no member of the last active set {list(self.record[1])} "
                                   f"answered")]
        # Highest last_update wins; ties go to the primary (no copy needed), then lowest id.
        self.authority = max(candidates, key=lambda osd: (candidates[osd], osd == self.me,
                                                          -osd))
        behind = [osd for osd in self.acting if osd != self.authority]
        self.pending_recoveries = set(behind)
        if not behind:
            return self._activate()
        self.state = State.RECOVERING
        return [Recover(self.authority, osd) for osd in behind]

    def recovered(self, target):
        if self.state is not State.RECOVERING:
            return []                   # late: a recovery beside it failed
        self.pending_recoveries.discard(target)
        if self.pending_recoveries:
            return []
        return self._activate()

    def _activate(self):
        self.state = State.ACTIVATING
        return [Activate(self.epoch, self.acting)]

    def activated(self):
        assert self.state is State.ACTIVATING, self.state
        self.state = State.ACTIVE
        return []
