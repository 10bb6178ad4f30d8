"""Slow-disk detection from the OSDs' device latency summaries (pure: the caller passes time).

Each OSD heartbeat carries what its device completed since the last one, per op kind and size
class (native/latency.py `summarise`). The detector keeps a sliding window of them per OSD and
judges, for reads and writes of each size class separately (so a 1 MiB write is never compared
with a 4 KiB one):

- an OSD has *evidence* of slowness in a (kind, class) when, over the window, it completed at
  least `min_samples` ops there, their mean latency is at least `factor` times the median of the
  other OSDs' means (each with `min_samples` of its own; at least `min_peers` of them), and above
  the absolute `floor_ms` (a 0.3 ms disk beside 0.1 ms ones is not a problem worth a page);
- it is *slow* once it has had evidence continuously for `sustain_s`;
- it stops being slow once it has had none (judged with a factor of `factor * CLEAR_FRACTION`,
  hysteresis) continuously for `clear_s`, or when it leaves the cluster's up set.

Comparing each OSD with its peers over the same window normalises for load: a cluster that is
busy everywhere raises nothing; comparing within a size class normalises for op size. Flushes are
left out: their latency depends on how much each OSD had written, not on its disk alone.
"""

import collections
import dataclasses
import math
import statistics

JUDGED_KINDS = ("read", "write")
# An OSD stops being slow when it stays under this fraction of the raising factor.
CLEAR_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class Settings:
    factor: float = 3.0
    floor_ms: float = 5.0
    window_s: float = 10.0
    sustain_s: float = 6.0
    clear_s: float = 15.0
    min_samples: int = 10
    min_peers: int = 2


@dataclasses.dataclass(frozen=True)
class Finding:
    """Why an OSD is slow: its worst (kind, class) against the median of its peers."""
    osd: int
    kind: str
    size_class: str
    mean_ms: float
    p99_ms: float
    median_ms: float
    count: int
    since: float

    @property
    def ratio(self):
        return self.mean_ms / self.median_ms if self.median_ms else float("inf")


def clean_summary(value):
    """The judged part of a device summary from a heartbeat (remote input): kinds, classes and
    figures of the right types only; anything else is left out."""
    clean = {}
    if not isinstance(value, dict):
        return clean
    for kind in JUDGED_KINDS:
        classes = value.get(kind)
        if not isinstance(classes, dict):
            continue
        for size_class, figures in list(classes.items())[:8]:
            if not (isinstance(size_class, str) and isinstance(figures, dict)):
                continue
            count, mean, p99 = figures.get("count"), figures.get("mean_ms"), \
                figures.get("p99_ms", 0.0)
            if type(count) is not int or count < 0 or not all(
                    type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in (mean, p99)):
                continue
            clean.setdefault(kind, {})[size_class[:16]] = {
                "count": count, "mean_ms": float(mean), "p99_ms": float(p99)}
    return clean


class _State:
    __slots__ = ("samples", "evidence_since", "quiet_since", "finding")

    def __init__(self):
        self.samples = collections.deque()       # (time, summary)
        self.evidence_since = None
        self.quiet_since = None
        self.finding = None                      # a Finding while the OSD is slow


class SlowDiskDetector:
    def __init__(self, settings=Settings()):
        self.settings = settings
        self._osds = {}

    def observe(self, osd, now, summary):
        """One heartbeat's device summary ({kind: {class: {count, mean_ms, p99_ms, ...}}})."""
        state = self._osds.setdefault(osd, _State())
        state.samples.append((now, summary))
        while state.samples and state.samples[0][0] < now - self.settings.window_s:
            state.samples.popleft()

    def forget(self, osd):
        self._osds.pop(osd, None)

    def _window(self, state, now):
        """{(kind, class): [count, summed ms, worst p99]} over the window."""
        totals = {}
        for when, summary in state.samples:
            if when < now - self.settings.window_s:
                continue
            for kind in JUDGED_KINDS:
                for size_class, figures in (summary.get(kind) or {}).items():
                    cell = totals.setdefault((kind, size_class), [0, 0.0, 0.0])
                    cell[0] += figures["count"]
                    cell[1] += figures["count"] * figures["mean_ms"]
                    cell[2] = max(cell[2], figures.get("p99_ms", 0.0))
        return totals

    def latency(self, now):
        """{osd: {kind: {"ops", "mean_ms", "p99_ms"}}} over the window, all size classes
        together (`cairn osd perf`; the judging keeps them apart)."""
        found = {}
        for osd, state in self._osds.items():
            for (kind, _), (count, summed, p99) in self._window(state, now).items():
                cell = found.setdefault(osd, {}).setdefault(kind, [0, 0.0, 0.0])
                cell[0] += count
                cell[1] += summed
                cell[2] = max(cell[2], p99)
        return {osd: {kind: {"ops": count, "mean_ms": round(summed / count, 3) if count else 0.0,
                             "p99_ms": round(p99, 3)}
                      for kind, (count, summed, p99) in kinds.items()}
                for osd, kinds in found.items()}

    def evaluate(self, now, up):
        """{osd: Finding} of the OSDs slow now, among `up` (others are forgotten)."""
        for osd in [osd for osd in self._osds if osd not in up]:
            del self._osds[osd]
        s = self.settings
        windows = {osd: self._window(state, now) for osd, state in self._osds.items()}
        means = collections.defaultdict(dict)          # key -> {osd: mean ms}
        for osd, totals in windows.items():
            for key, (count, summed, _) in totals.items():
                if count >= s.min_samples:
                    means[key][osd] = summed / count
        slow = {}
        for osd, state in self._osds.items():
            worst = strongest = None
            for key, (count, summed, p99) in windows[osd].items():
                if count < s.min_samples:
                    continue
                peers = [mean for other, mean in means[key].items() if other != osd]
                if len(peers) < s.min_peers:
                    continue
                mean, median = summed / count, statistics.median(peers)
                ratio = mean / median if median > 0 else float("inf")
                if mean >= s.floor_ms and (strongest is None or ratio > strongest):
                    strongest = ratio
                    worst = (key, mean, p99, median, count)
            threshold = s.factor * (CLEAR_FRACTION if state.finding else 1.0)
            if worst is not None and strongest >= threshold:
                state.quiet_since = None
                if state.evidence_since is None:
                    state.evidence_since = now
                if state.finding is not None or now - state.evidence_since >= s.sustain_s:
                    (kind, size_class), mean, p99, median, count = worst
                    since = state.finding.since if state.finding else now
                    state.finding = Finding(osd, kind, size_class, round(mean, 2),
                                            round(p99, 2), round(median, 2), count, since)
            else:
                state.evidence_since = None
                if state.finding is not None:
                    if state.quiet_since is None:
                        state.quiet_since = now
                    if now - state.quiet_since >= s.clear_s:
                        state.finding = state.quiet_since = None
            if state.finding is not None:
                slow[osd] = state.finding
        return slow
