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

    def to_dict(self):
        return {"health": self.status, "checks": dict(self.checks),
                "severities": dict(self.severities), "pgs": dict(self.pgs)}


def _ids(ids):
    named = ", ".join(f"osd.{i}" for i in ids[:IDS_LISTED_MAX])
    return named + (f" and {len(ids) - IDS_LISTED_MAX} more" if len(ids) > IDS_LISTED_MAX else "")


def inconsistent_message(pg_names):
    named = ", ".join(pg_names[:IDS_LISTED_MAX])
    more = f" and {len(pg_names) - IDS_LISTED_MAX} more" if len(pg_names) > IDS_LISTED_MAX else ""
    return (f"{len(pg_names)} PGs inconsistent: {named}{more} (repair: cairn pg scrub POOL "
            "--deep --repair)")


def evaluate(cmap):
    checks, severities = {}, {}

    def raise_check(name, severity, message):
        checks[name] = message
        severities[name] = severity

    osds = [cmap.osds[i] for i in sorted(cmap.osds)]
    up = [osd["id"] for osd in osds if osd["up"]]
    down = [osd["id"] for osd in osds if not osd["up"]]
    if not osds:
        raise_check("NO_OSDS", WARN, "no OSDs are registered")
    elif not up:
        raise_check("NO_OSDS", WARN, f"none of the {len(osds)} OSDs is up")
    if down and up:
        raise_check("OSD_DOWN", WARN, f"{len(down)} of {len(osds)} OSDs down: {_ids(down)}")
    out_but_up = [osd["id"] for osd in osds if osd["up"] and not osd["in"]]
    if out_but_up:
        raise_check("OSD_OUT", WARN, f"{len(out_but_up)} OSDs up but out: {_ids(out_but_up)}")

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
        raise_check("PG_UNAVAILABLE", ERR, "; ".join(unavailable_msgs) + " (writes refused)")
    if degraded_msgs:
        raise_check("PG_DEGRADED", WARN, "; ".join(degraded_msgs))
    status = max((severities[name] for name in severities), key=_RANK.get, default=OK)
    return Health(status, checks, severities, pgs)
