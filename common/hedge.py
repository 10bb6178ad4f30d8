"""Hedged reads (pure): when a read stops waiting on one OSD and asks another. Used by a
client reading a replicated object (client/hedged_reads.py: the read goes to
another member; the replica's side is osd/hedged.py) and by an erasure-coded PG's primary
reading shards (osd/backend_erasure.py: it decodes from other members' shards instead).

- **Hedge**: a read that has waited `delay()` at the primary is sent to another member too;
  the first answer wins (a replica's losing read is stopped, a primary's runs on and its
  reply is dropped: client/hedged_reads.py). The
  delay is HEDGE_FACTOR times the 90th percentile of this client's recent reads (all OSDs:
  a slow OSD's own latency would raise its own threshold), at least HEDGE_FLOOR_S.
- **Budget**: hedges are paid from a token bucket that every read fills by HEDGE_SHARE, so a
  cluster that is slow everywhere is never sent more than that share of extra reads
  (HEDGE_BURST tokens at most, for the first reads of a fresh client).
- **Steering**: an OSD whose read a hedge beat, and that still had not answered
  `evidence_s()` later, is avoided for STEER_S: reads that would wait on it go around it first
  (no duplicate, so no budget), and it gets reads again after that. A disk that went slow
  costs a client one late read per STEER_S, not one in every few.

Counters (`counts()`), in all and by the OSD a read was hedged or steered around: hedges sent,
won (the other answered first), wasted (the OSD did), refused (the other would not serve it:
not settled, not a member, ...), and reads steered around it.
"""

import collections

HEDGE_FACTOR = 3.0
HEDGE_FLOOR_S = 0.002
HEDGE_CAP_S = 0.1
HEDGE_SHARE = 0.05
HEDGE_BURST = 20.0
STEER_S = 1.0
# An OSD a hedge beat is steered around if its own answer is still due this long after
# (`evidence_s`: STEER_EVIDENCE_FACTOR hedge delays, at least STEER_EVIDENCE_S_MIN).
STEER_EVIDENCE_FACTOR = 2.0
STEER_EVIDENCE_S_MIN = 0.01
# Read latencies kept, and how often the delay is recomputed from them.
WINDOW = 512
RECOMPUTE_EVERY = 128
OUTCOMES = ("sent", "won", "wasted", "refused", "steered")


class Hedger:
    def __init__(self, clock, *, factor=HEDGE_FACTOR, floor_s=HEDGE_FLOOR_S, share=HEDGE_SHARE,
                 steer_s=STEER_S):
        self._clock = clock                 # e.g. time.monotonic
        self._factor, self._floor_s, self._share = factor, floor_s, share
        self._steer_s = steer_s             # 0: never steer (every late read is hedged)
        self._latencies = [0.0] * WINDOW
        self._filled = 0
        self._next = 0
        self._delay = floor_s
        self._tokens = HEDGE_BURST
        self._steer_until = {}              # osd id -> clock time
        self.totals = collections.Counter()         # outcome (OUTCOMES) -> count
        self.by_osd = collections.defaultdict(collections.Counter)  # osd id -> the same

    def delay(self):
        """How long a read waits at its primary before it is hedged."""
        return self._delay

    def count_read(self):
        """A read done that gives no latency sample (it was hedged or steered): it adds to
        the budget like any other."""
        self._tokens = min(HEDGE_BURST, self._tokens + self._share)

    def record(self, seconds):
        """A read answered in `seconds` (by whoever answered first)."""
        self._latencies[self._next] = seconds
        self._next += 1
        if self._next == WINDOW:
            self._next = 0
        if self._tokens < HEDGE_BURST:
            self._tokens += self._share
        self._filled += 1
        if not self._filled % RECOMPUTE_EVERY:
            recent = sorted(self._latencies[:min(self._filled, WINDOW)])
            p90 = recent[int(len(recent) * 0.9)]
            self._delay = min(HEDGE_CAP_S, max(self._floor_s, self._factor * p90))

    def may_hedge(self, osd):
        """Take a token for one hedge around `osd`, if the budget has one."""
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self._count(osd, "sent")
        return True

    def steering(self, osd):
        """Whether reads that would wait on `osd` go around it first now."""
        until = self._steer_until.get(osd)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._steer_until[osd]          # its next read goes to it (and may be hedged)
        return False

    def steered_first(self, osds):
        """Those of `osds` that reads go around now, the one steered around most recently
        first (the freshest evidence of a slow disk)."""
        steered = [osd for osd in osds if self.steering(osd)]
        return sorted(steered, key=lambda osd: -self._steer_until[osd])

    def note_won(self, osd):
        """A hedge answered before `osd` did. The caller steers around `osd` (`steer`) if
        osd's own answer is still due `evidence_s()` later."""
        self._count(osd, "won")

    def evidence_s(self):
        """How long after a hedge won the beaten OSD's answer must still be due for the OSD
        to be steered around: a healthy OSD on a busy host loses a race now and then by a
        fraction of a millisecond, a slow disk by hundreds."""
        return max(STEER_EVIDENCE_S_MIN, STEER_EVIDENCE_FACTOR * self._delay)

    def steer(self, osd):
        """Send reads around `osd` for STEER_S (the hedger's `steer_s`)."""
        if self._steer_s > 0:
            self._steer_until[osd] = self._clock() + self._steer_s

    def note_wasted(self, osd):
        """`osd` answered before its hedge did."""
        self._count(osd, "wasted")

    def note_refused(self, osd):
        """The hedge around `osd` was refused or failed; the read waits for `osd`."""
        self._count(osd, "refused")

    def note_steered(self, osd):
        """A read went around `osd` without asking it (it is being steered around)."""
        self._count(osd, "steered")

    def _count(self, osd, what):
        self.totals[what] += 1
        self.by_osd[osd][what] += 1

    def counts(self):
        """{sent, won, wasted, refused, steered, delay_ms, by_osd: {"osd.N": {...}}}."""
        return {**{what: self.totals[what] for what in OUTCOMES},
                "delay_ms": round(self._delay * 1000, 3),
                "by_osd": {f"osd.{osd}": {what: counts[what] for what in OUTCOMES}
                           for osd, counts in sorted(self.by_osd.items())}}
