"""Recovery budgets by time window, and the token bucket that enforces them (pure: no clock).

Operators give recovery a list of windows in the cluster config, e.g. full speed at night and a
trickle during the working day:

    cairn config set recovery.windows '[{"days": "mon-fri", "start": "09:00", "end": "21:00",
                                         "max_bytes_per_s": "50M", "max_active": 1}]'

Outside every window the defaults apply (`recovery.max_bytes_per_s`, 0 meaning unlimited, and
`recovery.max_active`). A budget may also bound the whole cluster (`cluster_max_bytes_per_s` in a
window, `recovery.cluster_max_bytes_per_s` outside): the leader monitor splits it evenly among
the OSDs recovering now (`cluster_share`) and tells each in its heartbeat's answer; an OSD
recovers at the lower of its own limit and its share. A window whose end is before its start runs over midnight (22:00-06:00);
`days` is `daily`, a day (`sat`), a range (`mon-fri`, wrapping: `fri-mon`) or a list
(`sat,sun`). The first window that matches wins. Times are the OSD's local time.

The bucket lets a transfer through at once when tokens remain and otherwise says how long to
wait; a transfer larger than the bucket goes into debt, so the long-run rate is exact and any
span of T seconds carries at most rate x T + burst bytes.
"""

import dataclasses
import json

from cairn.common.units import parse_size

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
WINDOWS_MAX = 32
# Burst: a quarter second of the rate. A transfer larger than that goes into debt (it waits for
# its own bytes), so no object is ever too big for the bucket and any span of 5 s carries at most
# 5.25 s worth of the rate.
BURST_S = 0.25


@dataclasses.dataclass(frozen=True)
class Window:
    days: frozenset           # weekday indexes, Monday = 0
    start_min: int            # minutes after midnight
    end_min: int
    max_bytes_per_s: int      # 0: unlimited
    max_active: int
    text: str                 # as given, for status
    cluster_max_bytes_per_s: int = 0    # the whole cluster's; 0: no cluster-wide limit

    def covers(self, weekday, minute):
        if self.start_min <= self.end_min:
            return weekday in self.days and self.start_min <= minute < self.end_min
        # Over midnight: the part after midnight belongs to the previous day's window.
        if minute >= self.start_min:
            return weekday in self.days
        return minute < self.end_min and (weekday - 1) % 7 in self.days


@dataclasses.dataclass(frozen=True)
class Budget:
    max_bytes_per_s: int      # 0: unlimited
    max_active: int
    window: str               # the window in force, or "default"
    cluster_max_bytes_per_s: int = 0    # the whole cluster's; 0: no cluster-wide limit


def _days(text):
    text = text.strip().lower()
    if text in ("daily", "all", "*"):
        return frozenset(range(7))
    days = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if first not in DAYS or (dash and last not in DAYS):
            raise ValueError(f"days {text!r}: use daily, a day (mon), a range (mon-fri) or a "
                             f"list (sat,sun) of {', '.join(DAYS)}")
        start, end = DAYS.index(first), DAYS.index(last if dash else first)
        index = start
        while True:
            days.add(index)
            if index == end:
                break
            index = (index + 1) % 7
    return frozenset(days)


def _minutes(text, what):
    hours, colon, minutes = str(text).partition(":")
    if not colon or not hours.isdigit() or not minutes.isdigit() or int(hours) > 24 or \
            int(minutes) > 59 or (int(hours) == 24 and int(minutes)):
        raise ValueError(f"{what} {text!r} must be HH:MM (00:00-24:00)")
    return int(hours) * 60 + int(minutes)


def _rate(value, field="max_bytes_per_s"):
    try:
        rate = parse_size(str(value)) if not isinstance(value, int) else value
    except ValueError as exc:
        raise ValueError(f"{field} {value!r}: {exc}") from None
    if rate < 0:
        raise ValueError(f"{field} must not be negative (was {value!r})")
    return rate


def parse_windows(text):
    """The windows in a `recovery.windows` value; ValueError says what is wrong and where."""
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"recovery.windows is not JSON: {exc}") from None
    if not isinstance(entries, list) or len(entries) > WINDOWS_MAX:
        raise ValueError(f"recovery.windows is a JSON list of at most {WINDOWS_MAX} windows")
    windows = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"window {index}: a window is an object with days, start, end, "
                             "max_bytes_per_s, cluster_max_bytes_per_s and max_active")
        unknown = set(entry) - {"days", "start", "end", "max_bytes_per_s", "max_active",
                                "cluster_max_bytes_per_s"}
        if unknown:
            raise ValueError(f"window {index}: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            max_active = entry.get("max_active", 1)
            if not isinstance(max_active, int) or not 1 <= max_active <= 64:
                raise ValueError(f"max_active must be an integer within 1..64 (was "
                                 f"{max_active!r})")
            if "start" not in entry or "end" not in entry:
                raise ValueError("start and end are required (HH:MM)")
            windows.append(Window(_days(str(entry.get("days", "daily"))),
                                  _minutes(entry["start"], "start"), _minutes(entry["end"], "end"),
                                  _rate(entry.get("max_bytes_per_s", 0)), max_active,
                                  json.dumps(entry, sort_keys=True),
                                  _rate(entry.get("cluster_max_bytes_per_s", 0),
                                        "cluster_max_bytes_per_s")))
        except ValueError as exc:
            raise ValueError(f"window {index}: {exc}") from None
    return windows


def budget(windows, default_bytes_per_s, default_active, weekday, minute,
           default_cluster_bytes_per_s=0):
    """The Budget in force at local (weekday, minute after midnight)."""
    for window in windows:
        if window.covers(weekday, minute):
            return Budget(window.max_bytes_per_s, window.max_active, window.text,
                          window.cluster_max_bytes_per_s)
    return Budget(default_bytes_per_s, default_active, "default", default_cluster_bytes_per_s)


def cluster_share(cluster_bytes_per_s, recovering):
    """Each recovering OSD's share of a cluster-wide rate (0: no cluster-wide limit) when
    `recovering` OSDs recover at once (the one asking counted). At least 1 byte/s: a share
    never reads as "unlimited"."""
    if cluster_bytes_per_s <= 0:
        return 0
    return max(1, cluster_bytes_per_s // max(1, recovering))


def effective_rate(own_bytes_per_s, share_bytes_per_s):
    """An OSD's recovery rate: the lower of its own limit and its cluster share, where
    either is 0 (unlimited)."""
    limits = [rate for rate in (own_bytes_per_s, share_bytes_per_s) if rate > 0]
    return min(limits) if limits else 0


class TokenBucket:
    """`wait_s(n, now_s)`: seconds to wait before sending n bytes (0: go now). Call again
    with the same n after waiting is not needed: the debt is already taken."""

    def __init__(self, rate_bytes_per_s, now_s):
        self.rate = rate_bytes_per_s
        self.tokens = self._burst()
        self.updated_s = now_s

    def _burst(self):
        return max(1, int(self.rate * BURST_S))

    def set_rate(self, rate_bytes_per_s, now_s):
        if rate_bytes_per_s != self.rate:
            self._refill(now_s)
            self.rate = rate_bytes_per_s
            self.tokens = min(self.tokens, self._burst())

    def _refill(self, now_s):
        if self.rate > 0:
            self.tokens = min(self._burst(), self.tokens + (now_s - self.updated_s) * self.rate)
        self.updated_s = now_s

    def wait_s(self, size_bytes, now_s):
        if self.rate <= 0:
            return 0.0
        self._refill(now_s)
        self.tokens -= size_bytes
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate
