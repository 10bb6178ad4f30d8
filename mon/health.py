"""Cluster health from one map epoch (pure): a status and named checks, as `ceph health` gives.

Checks (name: severity):
- NO_OSDS (WARN): no OSD is registered, or none is up.
- OSD_DOWN (WARN): OSDs that are down, by id.
- OSD_OUT (WARN): OSDs that are up but out (someone marked them out by hand).
- PG_DEGRADED (WARN): per pool, PGs with fewer up members than the pool's size.
- PG_UNAVAILABLE (ERR): per pool, PGs with fewer up members than min_size: writes to them are
  refused until members return.
- PG_INCONSISTENT (ERR; from the OSDs' reports, added by the monitor's status): PGs whose scrub
  found errors it did not repair, or whose reads found a damaged copy or shard not yet repaired.
- SLOW_DISK (WARN; from the OSDs' device latency, judged by mon/slowdisk.py): OSDs whose reads
  or writes stay several times slower than their peers'.
- SLOW_OPS (WARN; from the OSDs' heartbeats): OSDs with client ops in progress for longer than
  `osd.op_complaint_s`.
- READS_HEDGED (WARN; from the OSDs' heartbeats): OSDs that reads went around (clients steered
  away from them, erasure-coded primaries decoded around their late shards) at least
  `health.hedged_reads_per_s` times a second over each of the last three heartbeat
  intervals (HEDGED_INTERVALS): slow to answer, before SLOW_DISK can say why.
- NETWORK_PACKET_LOSS, NETWORK_SLOW_PING (WARN; from the OSDs' UDP probes, judged by
  mon/netloss.py): host pairs that lose packets or answer slowly; a host that loses packets to
  every peer is named as the host.
- MON_NO_QUORUM (ERR): the monitor answering knows no leader.
The status is the worst severity present: HEALTH_OK, HEALTH_WARN or HEALTH_ERR.
"""

import dataclasses

OK, WARN, ERR = "HEALTH_OK", "HEALTH_WARN", "HEALTH_ERR"
_RANK = {OK: 0, WARN: 1, ERR: 2}
# Ids named in one message; a cluster of hundreds of down OSDs gets a count, not a wall of ids.
IDS_LISTED_MAX = 16


@dataclasses.dataclass(frozen=True)
class Health:
    status: str
    checks: dict            # name -> message
    severities: dict        # name -> WARN|ERR
    pgs: dict               # pool -> {total, degraded, unavailable}
    details: dict           # name -> [detail line]


def _ids(ids):
    named = ", ".join(f"osd.{i}" for i in ids[:IDS_LISTED_MAX])
    return named + (f" and {len(ids) - IDS_LISTED_MAX} more" if len(ids) > IDS_LISTED_MAX else "")


def inconsistent_message(pg_names):
    named = ", ".join(pg_names[:IDS_LISTED_MAX])
    more = f" and {len(pg_names) - IDS_LISTED_MAX} more" if len(pg_names) > IDS_LISTED_MAX else ""
    return (f"{len(pg_names)} PGs inconsistent: {named}{more} (repair: cairn pg scrub POOL "
            "--deep --repair)")


def check(severity, summary, detail):
    """One check of the `cairn health` JSON (the monitor adds "since")."""
    return {"severity": severity, "summary": summary, "detail": list(detail)}


def worst(severities):
    return max(severities, key=_RANK.get, default=OK)


def _where(cmap, osd_id):
    host = cmap.osds[osd_id].get("location", {}).get("host") if osd_id in cmap.osds else None
    return f"osd.{osd_id}" + (f" (host {host})" if host else "")


def slow_disk_check(cmap, findings, device_paths):
    """SLOW_DISK from {osd: mon.slowdisk.Finding}."""
    lines = []
    for osd_id in sorted(findings):
        found = findings[osd_id]
        device = device_paths.get(osd_id)
        lines.append(f"{_where(cmap, osd_id)}{f' device {device}' if device else ''}: "
                     f"{found.kind}s of {found.size_class} average {found.mean_ms:g} ms (p99 "
                     f"{found.p99_ms:g} ms, {found.count} ops in the window), "
                     f"{found.ratio:.1f}x the median of its peers ({found.median_ms:g} ms)")
    return check(WARN, f"{len(findings)} OSDs have slow disks: {_ids(sorted(findings))} (check "
                 "the device's health and the host's I/O load)", lines)


def slow_flag_ops(cmap, findings):
    """Map operations that flag `slow` exactly the up OSDs SLOW_DISK names ({osd: Finding}),
    so reads avoid them until the check clears."""
    ops = []
    for osd_id in sorted(cmap.osds):
        slow = osd_id in findings and cmap.osds[osd_id]["up"]
        if slow != bool(cmap.osds[osd_id].get("slow")):
            ops.append({"op": "osd_slow", "id": osd_id, "slow": slow})
    return ops


def slow_ops_check(cmap, counts, complaint_s):
    """SLOW_OPS from {osd: client ops older than the complaint time}."""
    lines = [f"{_where(cmap, osd_id)}: {counts[osd_id]} client ops in progress for more than "
             f"{complaint_s:g} s" for osd_id in sorted(counts)]
    return check(WARN, f"{sum(counts.values())} client ops older than {complaint_s:g} s on "
                 f"{_ids(sorted(counts))}", lines)


def clean_around(report):
    """{osd id: reads sent around it} from an OSD's heartbeat (`reads_around`: {"ID": count});
    anything malformed is dropped."""
    if not isinstance(report, dict):
        return {}
    return {int(key): value for key, value in list(report.items())[:4096]
            if isinstance(key, str) and key.isdigit() and type(value) is int and value >= 0}


# READS_HEDGED holds for this many heartbeat intervals in a row before it names an OSD: a
# client steers around an OSD for 1 s after one stall, which can touch two intervals of 2 s.
HEDGED_INTERVALS = 3

HEDGE_FIELDS = ("served", "cancelled", "hedged_around", "hedged_won", "steered_around",
                "fast_reads", "shard_sent", "shard_won", "shard_wasted", "shard_steered")


def clean_hedges(report):
    """An OSD's hedge counters from its heartbeat (`hedges`, HEDGE_FIELDS: counts since it
    started); anything malformed is dropped."""
    if not isinstance(report, dict):
        return {}
    return {field: report[field] for field in HEDGE_FIELDS
            if type(report.get(field)) is int and report[field] >= 0}


def reads_around_rates(reports, back=0):
    """{osd id: reads per second sent around it} over each reporter's last heartbeat interval
    (`back` 1: the interval before that), from {reporter: [(when, {osd id: count since the
    reporter started}), ... oldest first]}. A count that went down (the reporter restarted)
    counts from zero."""
    rates = {}
    for samples in reports.values():
        if len(samples) < back + 2:
            continue
        (start, before_counts), (end, counts) = samples[-2 - back], samples[-1 - back]
        if end - start < 0.5:
            continue
        for osd_id, count in counts.items():
            before = before_counts.get(osd_id, 0)
            moved = count - before if count >= before else count
            if moved:
                rates[osd_id] = rates.get(osd_id, 0.0) + moved / (end - start)
    return rates


def reads_hedged_check(cmap, rates, per_s, earlier=()):
    """READS_HEDGED from {osd id: reads per second sent around it}: those at `per_s` or more,
    and at that rate in each of the `earlier` intervals' rates too (one burst, such as a
    second's steering after one stall, names nobody)."""
    named = sorted(osd_id for osd_id, rate in rates.items() if rate >= per_s and
                   all(before.get(osd_id, 0.0) >= per_s for before in earlier))
    if not named:
        return None
    return check(WARN, f"reads go around {_ids(named)} (slow to answer: hedged or steered "
                 "away by clients and erasure-coded primaries; SLOW_DISK may follow)",
                 [f"{_where(cmap, osd_id)}: {rates[osd_id]:.1f} reads/s went around it"
                  for osd_id in named])


def network_checks(pairs, hosts, slow):
    """NETWORK_PACKET_LOSS and NETWORK_SLOW_PING from mon/netloss.py's judgement."""
    checks = {}
    if pairs or hosts:
        lines = [f"host {host} loses packets to every peer host" for host in hosts]
        lines += [f"hosts {a} and {b}: {pair.loss:.1%} of {pair.probes} probes lost"
                  + (f", round trip {pair.rtt_ms:g} ms" if pair.rtt_ms is not None else "")
                  for pair in pairs for a, b in [pair.hosts]]
        named = [f"host {host}" for host in hosts] + [f"{a}-{b}" for pair in pairs
                                                      for a, b in [pair.hosts]]
        checks["NETWORK_PACKET_LOSS"] = check(
            WARN, f"packet loss: {', '.join(named)} (check cables, NICs and switch ports)",
            lines)
    if slow:
        checks["NETWORK_SLOW_PING"] = check(
            WARN, f"slow round trips between {len(slow)} host pairs",
            [f"hosts {a} and {b}: mean round trip {pair.rtt_ms:g} ms" for pair in slow
             for a, b in [pair.hosts]])
    return checks


def evaluate(cmap):
    checks, severities, details = {}, {}, {}

    def raise_check(name, severity, message, detail=None):
        checks[name] = message
        severities[name] = severity
        details[name] = list(detail) if detail is not None else [message]

    osds = [cmap.osds[i] for i in sorted(cmap.osds)]
    up = [osd["id"] for osd in osds if osd["up"]]
    down = [osd["id"] for osd in osds if not osd["up"]]
    if not osds:
        raise_check("NO_OSDS", WARN, "no OSDs are registered")
    elif not up:
        raise_check("NO_OSDS", WARN, f"none of the {len(osds)} OSDs is up")
    if down and up:
        raise_check("OSD_DOWN", WARN, f"{len(down)} of {len(osds)} OSDs down: {_ids(down)}",
                    [f"{_where(cmap, i)} is down" for i in down])
    out_but_up = [osd["id"] for osd in osds if osd["up"] and not osd["in"]]
    if out_but_up:
        raise_check("OSD_OUT", WARN, f"{len(out_but_up)} OSDs up but out: {_ids(out_but_up)}",
                    [f"{_where(cmap, i)} is up but out" for i in out_but_up])

    pgs = {}
    degraded_msgs, unavailable_msgs = [], []
    if cmap.pools and osds:
        placement = cmap.placement()
        up_set = set(up)
        for name in sorted(cmap.pools):
            pool = cmap.pools[name]
            members = placement.map_pool(name)
            counts = [sum(1 for m in pg if m is not None and m in up_set) for pg in members]
            degraded = sum(1 for n in counts if n < pool["size"])
            unavailable = sum(1 for n in counts if n < pool["min_size"])
            pgs[name] = {"total": len(members), "degraded": degraded, "unavailable": unavailable}
            if unavailable:
                unavailable_msgs.append(f"pool {name}: {unavailable} of {len(members)} PGs "
                                        f"below min_size {pool['min_size']}")
            elif degraded:
                degraded_msgs.append(f"pool {name}: {degraded} of {len(members)} PGs have fewer "
                                     f"than {pool['size']} members up")
    if unavailable_msgs:
        raise_check("PG_UNAVAILABLE", ERR, "; ".join(unavailable_msgs) + " (writes refused)",
                    unavailable_msgs)
    if degraded_msgs:
        raise_check("PG_DEGRADED", WARN, "; ".join(degraded_msgs), degraded_msgs)
    return Health(worst(severities.values()), checks, severities, pgs, details)
