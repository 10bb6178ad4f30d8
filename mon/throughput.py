"""The cluster's throughput over the last hour (pure: the caller gives the clock), for the
console's overview: client bytes in and out and recovery bytes per second, from the counters
each OSD reports in its heartbeats (counts since it started).

Every SAMPLE_S the leader turns the counters' growth since the last sample into rates; an OSD
whose counter went down (it restarted) counts from zero, and one that stopped reporting adds
nothing. HOUR_SAMPLES samples are kept: one hour.
"""

import collections

SAMPLE_S = 10.0
HOUR_SAMPLES = 360
FIELDS = ("client_in", "client_out", "recovery")


class ThroughputHistory:
    def __init__(self):
        self._latest = {}                   # osd id -> {field: count}, as last reported
        self._sampled = {}                  # osd id -> {field: count} at the last sample
        self._sampled_at = None             # monotonic time of the last sample
        self.samples = collections.deque(maxlen=HOUR_SAMPLES)   # {at, field: bytes/s, ...}

    def observe(self, osd_id, counts):
        """An OSD's counters from its heartbeat ({field: bytes since it started}; anything
        not a non-negative int is ignored)."""
        clean = {field: counts[field] for field in FIELDS
                 if type(counts.get(field)) is int and counts[field] >= 0}
        if clean:
            self._latest[osd_id] = clean

    def forget(self, osd_id):
        self._latest.pop(osd_id, None)
        self._sampled.pop(osd_id, None)

    def tick(self, mono_s, wall_s):
        """Take a sample if SAMPLE_S has passed since the last: rates over that span."""
        if self._sampled_at is None:
            self._sampled_at = mono_s
            self._sampled = {osd: dict(counts) for osd, counts in self._latest.items()}
            return
        span = mono_s - self._sampled_at
        if span < SAMPLE_S:
            return
        sample = {"at": round(wall_s, 3)}
        for field in FIELDS:
            grown = 0
            for osd, counts in self._latest.items():
                now, before = counts.get(field), self._sampled.get(osd, {}).get(field, 0)
                if now is not None:
                    grown += now - before if now >= before else now
            sample[field] = round(grown / span)
        self.samples.append(sample)
        self._sampled_at = mono_s
        self._sampled = {osd: dict(counts) for osd, counts in self._latest.items()}
