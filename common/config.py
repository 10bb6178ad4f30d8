"""Cluster configuration options: names, types, bounds, defaults (pure).

The cluster config travels inside the cluster map as strings (`cairn config set KEY VALUE`), so
every daemon sees the same values at the same epoch. Each option is declared here once; a value
is checked when it is set (a typo or an out-of-range value is refused with the reason, never
stored), and daemons read typed values with `value(config, name)`.
"""

import dataclasses
import difflib
import json

from cairn.common import throttle
from cairn.common.units import parse_size


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    kind: type                  # float, int, or str (with convert)
    default: object
    low: object
    high: object
    help: str
    convert: object = None      # for kind str: text -> value, ValueError when invalid

    def parse(self, text):
        if self.convert is not None:
            try:
                return self.convert(text)
            except ValueError as exc:
                raise ValueError(f"{self.name}: {exc}") from None
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise ValueError(f"{self.name} must be {'an integer' if self.kind is int else 'a number'}"
                             f" (was {text!r})") from None
        if not self.low <= value <= self.high:
            raise ValueError(f"{self.name} must be within {self.low}..{self.high} (was {value})")
        return value


# Defaults follow Ceph where the meaning is the same (osd_heartbeat_grace 20 s,
# mon_osd_down_out_interval 600 s, mon_osd_min_down_reporters 2); the heartbeat interval is
# shorter than Ceph's 6 s because our heartbeats are one small frame each.
OPTIONS = {option.name: option for option in [
    Option("mon.osd_grace_s", float, 20.0, 1.0, 3600.0,
           "an OSD not heard from (by the monitor, or by enough peers) for this long is down"),
    Option("mon.osd_down_out_interval_s", float, 600.0, 0.0, 30 * 86400.0,
           "a down OSD is marked out after this long (0: never automatically)"),
    Option("mon.osd_min_down_reporters", int, 2, 1, 100,
           "peers on distinct hosts that must report an OSD before it is marked down early"),
    Option("osd.heartbeat_interval_s", float, 2.0, 0.1, 60.0,
           "how often an OSD heartbeats to the monitor and pings its peers"),
    Option("osd.heartbeat_peers", int, 6, 1, 64,
           "how many peer OSDs (on other hosts) each OSD pings"),
    # Ceph: osd_op_complaint_time 30 s.
    Option("osd.op_complaint_s", float, 30.0, 0.1, 3600.0,
           "a client op in progress for longer than this is slow (SLOW_OPS)"),
    Option("health.slow_disk_factor", float, 3.0, 1.5, 1000.0,
           "SLOW_DISK: an OSD whose read or write latency (same op size class) stays this many "
           "times its peers' median"),
    Option("health.slow_disk_floor_ms", float, 5.0, 0.0, 60000.0,
           "SLOW_DISK: ... and is at least this high"),
    Option("osd.avoid_slow_reads", int, 1, 0, 1,
           "1: reads avoid an OSD that SLOW_DISK names (another copy, or the other shards, "
           "serve them) until the check clears; 0: reads go where they always do"),
    Option("osd.hedge_shard_reads", int, 1, 0, 1,
           "1: an erasure-coded read whose shard is late past the hedge delay decodes from "
           "the other members' shards instead, and steers around that member for a while "
           "(common/hedge.py); 0: it waits for the shard"),
    # Ceph: mon_osd_nearfull_ratio 0.85, mon_osd_full_ratio 0.95.
    Option("osd.nearfull_ratio", float, 0.85, 0.1, 1.0,
           "OSD_NEARFULL: an OSD's data area is at least this fraction used"),
    Option("osd.full_ratio", float, 0.95, 0.1, 1.0,
           "OSD_FULL: at this fraction used, writes to the PGs of that OSD are refused (reads "
           "and deletes go on)"),
    Option("pool.near_quota_ratio", float, 0.8, 0.1, 1.0,
           "POOL_NEAR_QUOTA: a pool's objects or bytes reach this fraction of its quota"),
    Option("auth.ticket_ttl_s", float, 600.0, 2.0, 3600.0,
           "how long a ticket (and a monitor session) lasts: a removed or changed key is "
           "refused within this"),
    Option("alert.webhooks", str, [], None, None,
           "URLs (comma-separated) that every raise, change and clear of a health check is "
           "POSTed to as JSON; empty: none", convert=lambda text: _webhooks(text)),
    Option("health.packet_loss_min", float, 0.015, 0.001, 1.0,
           "NETWORK_PACKET_LOSS: the fraction of UDP probes lost between two hosts over 45 s "
           "that names the pair (5% over 20 s always does)"),
    Option("health.slow_ping_ms", float, 500.0, 1.0, 60000.0,
           "NETWORK_SLOW_PING: a mean probe round trip between two hosts at least this long"),
    Option("health.slow_disk_sustain_s", float, 6.0, 0.0, 3600.0,
           "SLOW_DISK: ... for this long is named; it clears after as long again plus 9 s "
           "without evidence"),
    Option("health.hedged_reads_per_s", float, 5.0, 0.1, 1e9,
           "READS_HEDGED: an OSD that reads went around (steered away from it, or decoded "
           "around its late shard) at least this often per second over each of the last three "
           "heartbeat intervals is named"),
    Option("recovery.windows", str, [], None, None,
           "recovery budgets by time of day: a JSON list of {days, start, end, "
           "max_bytes_per_s, cluster_max_bytes_per_s, max_active}; the first matching window "
           "wins",
           convert=throttle.parse_windows),
    Option("recovery.max_bytes_per_s", str, 0, None, None,
           "recovery and backfill bytes per second per OSD outside every window (0: unlimited)",
           convert=lambda text: _non_negative_size(text)),
    Option("recovery.cluster_max_bytes_per_s", str, 0, None, None,
           "recovery and backfill bytes per second for the whole cluster outside every window, "
           "split evenly among the OSDs recovering now (0: no cluster-wide limit); each OSD "
           "also keeps to recovery.max_bytes_per_s",
           convert=lambda text: _non_negative_size(text)),
    Option("recovery.max_active", int, 4, 1, 64,
           "PGs one OSD recovers at once outside every window"),
    # Ceph scrubs daily and deep-scrubs weekly (osd_scrub_min_interval, osd_deep_scrub_interval).
    Option("scrub.interval_s", float, 86400.0, 0.0, 365 * 86400.0,
           "each PG is scrubbed (versions compared) this often (0: never in the background)"),
    Option("scrub.deep_interval_s", float, 7 * 86400.0, 0.0, 365 * 86400.0,
           "each PG is deep-scrubbed (every byte read and checked) this often (0: never)"),
]}


def _non_negative_size(text):
    value = parse_size(text)
    if value < 0:
        raise ValueError(f"must not be negative (was {text!r})")
    return value


def option(name):
    """The Option called `name`; KeyError with close matches otherwise."""
    found = OPTIONS.get(name)
    if found is None:
        close = difflib.get_close_matches(name, OPTIONS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else \
            f"; known: {', '.join(sorted(OPTIONS))}"
        raise KeyError(f"unknown config option {name!r}{hint}")
    return found


def check(name, text):
    """The parsed value of `text` for option `name`; KeyError/ValueError say what is wrong."""
    return option(name).parse(text)


def value(config, name):
    """The typed value of `name` in a map's config dict (the default when unset)."""
    found = option(name)
    text = config.get(name)
    return found.default if text is None else found.parse(text)


def display(config, name):
    """The value of `name` as a person or a JSON reader wants it: the text that was set for
    options given as text (windows, sizes), the typed value otherwise."""
    found = option(name)
    text = config.get(name)
    if found.kind is str:
        return text if text is not None else json.dumps(found.default)
    return value(config, name)


def _webhooks(text):
    """alert.webhooks: a list of http(s) URLs from 'URL[,URL...]' ('' for none)."""
    urls = [url.strip() for url in str(text).split(",") if url.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a webhook is an http:// or https:// URL (was {url!r})")
    return urls
