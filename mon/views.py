"""The leader's views for health and status, computed from the applied map and the OSDs'
reports: the `cairn health` checks (the map's own, PG_INCONSISTENT, MON_NO_QUORUM, SLOW_DISK,
SLOW_OPS, network, capacity, MON_PEER_INVALID), the capacity ratios and pool totals, and the
monitors' view (members, quorum, leader, log positions).

Theory of operation: functions of the monitor's state that change nothing but the "since" time
each check was first seen and the cached judgement of the map (one per epoch); the judging
itself is in pure cores (mon/health.py, mon/capacity.py, mon/netloss.py, mon/peerguard.py).
"""

import time

from cairn.common import config, throttle
from cairn.mon import capacity, health, netloss, raft_transport
from cairn.mon.osd_requests import OBJECT_COUNTS, recovering_count


def health_report(monitor, mons):
    """{"status", "checks": {name: {severity, summary, detail, since}}}: the map's checks
    and those from the OSDs' reports (the `cairn health` contract)."""
    epoch, judged = monitor._health_cache
    if epoch != monitor.map.epoch:
        judged = health.evaluate(monitor.map)
        monitor._health_cache = (monitor.map.epoch, judged)
    checks = {name: health.check(judged.severities[name], message, judged.details[name])
              for name, message in judged.checks.items()}
    up = {osd_id for osd_id, osd in monitor.map.osds.items() if osd["up"]}
    inconsistent = sorted({name for osd_id, names in monitor._inconsistent.items()
                           if osd_id in up for name in names})
    if inconsistent:
        checks["PG_INCONSISTENT"] = health.check(
            health.ERR, health.inconsistent_message(inconsistent),
            [f"pg {name} inconsistent" for name in inconsistent])
    if mons["leader"] is None:
        checks["MON_NO_QUORUM"] = health.check(
            health.ERR, f"{monitor.name} knows no leader; map changes wait for a majority of "
            f"{len(mons['members'])} monitors (this is {monitor.name}'s view)", [])
    slow = {osd_id: found for osd_id, found in monitor._slow_found.items() if osd_id in up}
    if slow:
        checks["SLOW_DISK"] = health.slow_disk_check(monitor.map, slow, monitor._device_paths)
    slow_ops = {osd_id: count for osd_id, count in monitor._slow_ops.items()
                if count and osd_id in up}
    if slow_ops:
        checks["SLOW_OPS"] = health.slow_ops_check(
            monitor.map, slow_ops, config.value(monitor.map.config, "osd.op_complaint_s"))
    hedged = health.reads_hedged_check(
        monitor.map, reads_around(monitor),
        config.value(monitor.map.config, "health.hedged_reads_per_s"),
        [reads_around(monitor, back) for back in range(1, health.HEDGED_INTERVALS)])
    if hedged is not None:
        checks["READS_HEDGED"] = hedged
    checks.update(network_checks(monitor, up))
    peer_invalid = monitor._peer_findings.check(time.monotonic())
    if peer_invalid is not None:
        checks["MON_PEER_INVALID"] = peer_invalid
    for name, (severity, summary, lines) in capacity.checks(
            monitor.map, monitor._capacity, pool_totals(monitor, ), ratios(monitor, )).items():
        checks[name] = health.check(severity, summary, lines)
    now = time.time()
    monitor._check_since = {name: monitor._check_since.get(name, now) for name in checks}
    for name, entry in checks.items():
        entry["since"] = round(monitor._check_since[name], 3)
    return {"status": health.worst(entry["severity"] for entry in checks.values()),
            "checks": checks}


def reads_around(monitor, back=0):
    """{up osd id: reads per second sent around it} over the OSDs' last heartbeat interval
    (`back` 1: the one before, ...), from the up OSDs' reports (READS_HEDGED's figures)."""
    up = {osd_id for osd_id, osd in monitor.map.osds.items() if osd["up"]}
    return {osd_id: rate for osd_id, rate in health.reads_around_rates(
        {osd_id: list(reports) for osd_id, reports in monitor._around.items()
         if osd_id in up}, back).items() if osd_id in up}


def osd_perf(monitor):
    """`cairn osd perf`: per OSD, its device's latency over the slow-disk window, the reads
    sent around it lately, and its hedge counters, from the OSDs' heartbeats."""
    latency = monitor._slow.latency(time.monotonic())
    around = reads_around(monitor)
    rows = []
    for osd_id in sorted(monitor.map.osds):
        osd = monitor.map.osds[osd_id]
        rows.append({"id": osd_id, "host": osd.get("location", {}).get("host"),
                     "up": osd["up"], "slow": bool(osd.get("slow")),
                     "device": latency.get(osd_id, {}),
                     "reads_around_per_s": round(around.get(osd_id, 0.0), 2),
                     "hedges": _with_wasted(monitor._hedges.get(osd_id, {}))})
    return {"epoch": monitor.map.epoch, "osds": rows}


def _with_wasted(hedges):
    """An OSD's hedge counters with `hedged_wasted`: clients' hedges around it that did not
    answer the read (sent less won)."""
    if "hedged_around" not in hedges:
        return hedges
    return {**hedges, "hedged_wasted": max(0, hedges["hedged_around"] -
                                          hedges.get("hedged_won", 0))}


def ratios(monitor):
    conf = monitor.map.config
    return capacity.Ratios(nearfull=config.value(conf, "osd.nearfull_ratio"),
                           full=config.value(conf, "osd.full_ratio"),
                           near_quota=config.value(conf, "pool.near_quota_ratio"))


def pool_totals(monitor):
    """{pool id: (objects, bytes)} over the up OSDs' last reports."""
    return capacity.pool_totals({osd_id: pools for osd_id, pools in monitor._pool_use.items()
                                 if osd_id in monitor.map.osds and monitor.map.osds[osd_id]["up"]})


def pools_known(monitor):
    """Every up OSD has reported within three heartbeat intervals (and for longer than
    that since this monitor started): pool totals are complete."""
    horizon = 3 * config.value(monitor.map.config, "osd.heartbeat_interval_s")
    now = time.monotonic()
    return all(now - monitor._reported_at.get(osd_id, -1e9) <= horizon
               for osd_id, osd in monitor.map.osds.items() if osd["up"])


def network_checks(monitor, up):
    host_of = {osd_id: monitor.map.osds[osd_id]["location"].get("host") for osd_id in up}
    pairs, hosts, slow = netloss.judge(
        {osd_id: report for osd_id, report in monitor._net.items() if osd_id in up}, host_of,
        loss_min=config.value(monitor.map.config, "health.packet_loss_min"),
        slow_ping_ms=config.value(monitor.map.config, "health.slow_ping_ms"))
    return health.network_checks(pairs, hosts, slow)


def mons_view(monitor):
    """Members, quorum (the leader and the members it heard from lately), leader, and each
    monitor's log position as the leader sees it (its match index)."""
    view = monitor.raft.status()
    leader = monitor.raft.leader if monitor.raft.leader in monitor.raft.members else None
    positions = {monitor.name: {"role": view["role"], "log_index": view["last_index"],
                                "commit": view["commit"], "applied": monitor._applied}}
    for name, follower in view.get("progress", {}).items():
        positions[name] = {"role": "follower", "log_index": follower["match"]}
    quorum = monitor._heard() if monitor.is_leader else []
    return {"members": view["members"], "quorum": quorum, "leader": leader,
            "term": view["term"],
            "addrs": {name: raft_transport.addr_of(monitor, name) for name in view["members"]},
            "positions": positions}


def recovery_view(monitor):
    """Cluster recovery rate over the last ~10 s of heartbeats, and the budget in force
    (by this monitor's clock)."""
    now = time.monotonic()
    rate = 0.0
    for osd_id, samples in monitor._recovery.items():
        recent = [(when, total) for when, total in samples if now - when <= 10.0]
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            rate += (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
    local = time.localtime()
    conf = monitor.map.config
    in_force = throttle.budget(config.value(conf, "recovery.windows"),
                               config.value(conf, "recovery.max_bytes_per_s"),
                               config.value(conf, "recovery.max_active"),
                               local.tm_wday, local.tm_hour * 60 + local.tm_min,
                               config.value(conf, "recovery.cluster_max_bytes_per_s"))
    return {"bytes_per_s": round(rate), "window": in_force.window,
            "max_bytes_per_s": in_force.max_bytes_per_s, "max_active": in_force.max_active,
            "cluster_max_bytes_per_s": in_force.cluster_max_bytes_per_s,
            "recovering_osds": recovering_count(monitor, now)}


def object_totals(monitor):
    """Object copies over the up OSDs' last reports: wanted (total), still to recover
    (degraded) and held by OSDs no longer members of their PG (misplaced)."""
    totals = dict.fromkeys(OBJECT_COUNTS, 0)
    for osd_id, counts in monitor._objects.items():
        if osd_id in monitor.map.osds and monitor.map.osds[osd_id]["up"]:
            for key, count in counts.items():
                totals[key] += count
    return totals


def pg_state_totals(monitor):
    totals = {}
    for osd_id, states in monitor._pg_states.items():
        if osd_id in monitor.map.osds and monitor.map.osds[osd_id]["up"]:
            for state, count in states.items():
                totals[state] = totals.get(state, 0) + count
    return dict(sorted(totals.items()))
