"""Capacity and pool quotas (pure): what the OSDs report, the map flags that make them refuse
writes, the health checks, and `cairn df`.

Every heartbeat carries the OSD's data area (`capacity`: [total, used] bytes) and, for the PGs
it is primary of, each pool's objects and stored bytes (`pools`: {pool id: [objects, bytes]};
osd/pgs.py `pool_usage`). The leader keeps the last report of each OSD and:
- flags an OSD `full` in the map once its used fraction reaches `osd.full_ratio` (0.95), and
  clears the flag when it drops below; the primary of a PG with a full member refuses writes
  with `no_space` (reads and deletes go on, so space can be freed);
- flags a pool `quota_full` once its objects or bytes reach its quota (`cairn pool set-quota`),
  and clears it when they drop below or the quota is raised; its primaries then refuse writes
  with `quota`.
Like Ceph's, enforcement follows the reports: a write can get through in the second or two
between reaching a limit and the map saying so. The store's own `no space` stays the last guard.

Checks: OSD_FULL (ERR), OSD_NEARFULL (`osd.nearfull_ratio`, 0.85), POOL_FULL (at its quota,
writes refused), POOL_NEAR_QUOTA (`pool.near_quota_ratio`, 0.8 of either quota).
"""

import dataclasses

from cairn.common.units import format_size


@dataclasses.dataclass(frozen=True)
class Ratios:
    nearfull: float = 0.85
    full: float = 0.95
    near_quota: float = 0.8


def clean_capacity(value):
    """(total, used) bytes from a heartbeat's `capacity`, or None if malformed."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and \
            all(type(v) is int and v >= 0 for v in value) and value[1] <= value[0]:
        return value[0], value[1]
    return None


def clean_pools(value):
    """{pool id: (objects, bytes)} from a heartbeat's `pools` (malformed entries dropped)."""
    found = {}
    if not isinstance(value, dict):
        return found
    for key, entry in list(value.items())[:4096]:
        try:
            pool_id = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and \
                all(type(v) is int and v >= 0 for v in entry):
            found[pool_id] = (entry[0], entry[1])
    return found


def pool_totals(reports):
    """{pool id: (objects, bytes)} summed over {osd: clean_pools(...)} (each PG is counted by
    its primary only)."""
    totals = {}
    for pools in reports.values():
        for pool_id, (objects, stored) in pools.items():
            before = totals.get(pool_id, (0, 0))
            totals[pool_id] = (before[0] + objects, before[1] + stored)
    return totals


def used_ratio(capacity):
    total, used = capacity
    return used / total if total else 0.0


def quota_use(pool, objects, stored):
    """The larger of objects/max_objects and bytes/max_bytes (None: no quota set)."""
    uses = []
    if pool.get("max_objects"):
        uses.append(objects / pool["max_objects"])
    if pool.get("max_bytes"):
        uses.append(stored / pool["max_bytes"])
    return max(uses) if uses else None


def flag_ops(cmap, capacity, totals, ratios, pools_known=True):
    """The map operations that bring the `full` and `quota_full` flags in line with the
    reports: `capacity` {osd: (total, used)}, `totals` from pool_totals. `pools_known`: every
    up OSD has reported lately (else pool flags are left alone: a partial sum would clear a
    quota that is still reached)."""
    ops = []
    for osd_id in sorted(capacity):
        osd = cmap.osds.get(osd_id)
        if osd is None:
            continue
        full = used_ratio(capacity[osd_id]) >= ratios.full
        if full != bool(osd.get("full")):
            ops.append({"op": "osd_full", "id": osd_id, "full": full})
    if pools_known:
        for name in sorted(cmap.pools):
            pool = cmap.pools[name]
            use = quota_use(pool, *totals.get(pool["id"], (0, 0)))
            reached = use is not None and use >= 1.0
            if reached != bool(pool.get("quota_full")):
                ops.append({"op": "pool_quota_full", "name": name, "full": reached})
    return ops


def _where(cmap, osd_id):
    host = cmap.osds[osd_id].get("location", {}).get("host") if osd_id in cmap.osds else None
    return f"osd.{osd_id}" + (f" (host {host})" if host else "")


def _quota_text(pool, objects, stored):
    parts = []
    if pool.get("max_objects"):
        parts.append(f"{objects} of {pool['max_objects']} objects")
    if pool.get("max_bytes"):
        parts.append(f"{format_size(stored)} of {format_size(pool['max_bytes'])}")
    return ", ".join(parts)


def checks(cmap, capacity, totals, ratios):
    """{name: (severity, summary, detail lines)} of OSD_FULL, OSD_NEARFULL, POOL_FULL and
    POOL_NEAR_QUOTA."""
    found = {}
    full, near = [], []
    for osd_id in sorted(capacity):
        if osd_id not in cmap.osds:
            continue
        ratio = used_ratio(capacity[osd_id])
        total, used = capacity[osd_id]
        line = (f"{_where(cmap, osd_id)} is {ratio:.1%} full ({format_size(used)} of "
                f"{format_size(total)})")
        if ratio >= ratios.full:
            full.append((osd_id, line))
        elif ratio >= ratios.nearfull:
            near.append((osd_id, line))
    if full:
        found["OSD_FULL"] = ("HEALTH_ERR", f"{len(full)} OSDs full (≥ {ratios.full:.0%}): "
                             f"{', '.join(f'osd.{i}' for i, _ in full)}; writes to their PGs "
                             "refused (delete data or add OSDs)", [line for _, line in full])
    if near:
        found["OSD_NEARFULL"] = ("HEALTH_WARN", f"{len(near)} OSDs nearly full (≥ "
                                 f"{ratios.nearfull:.0%}): "
                                 f"{', '.join(f'osd.{i}' for i, _ in near)}",
                                 [line for _, line in near])
    at_quota, near_quota = [], []
    for name in sorted(cmap.pools):
        pool = cmap.pools[name]
        objects, stored = totals.get(pool["id"], (0, 0))
        use = quota_use(pool, objects, stored)
        if use is None:
            continue
        line = f"pool {name}: {_quota_text(pool, objects, stored)}"
        if use >= 1.0 or pool.get("quota_full"):
            at_quota.append((name, line))
        elif use >= ratios.near_quota:
            near_quota.append((name, line))
    if at_quota:
        found["POOL_FULL"] = ("HEALTH_WARN", f"{len(at_quota)} pools at their quota: "
                              f"{', '.join(n for n, _ in at_quota)}; writes refused (raise it "
                              "with 'cairn pool set-quota' or delete objects)",
                              [line for _, line in at_quota])
    if near_quota:
        found["POOL_NEAR_QUOTA"] = ("HEALTH_WARN", f"{len(near_quota)} pools near their quota "
                                    f"(≥ {ratios.near_quota:.0%}): "
                                    f"{', '.join(n for n, _ in near_quota)}",
                                    [line for _, line in near_quota])
    return found


def df(cmap, capacity, totals, ratios):
    """`cairn df --json`: raw capacity over the OSDs that reported, each OSD, each pool."""
    osds, raw_total, raw_used = [], 0, 0
    for osd_id in sorted(cmap.osds):
        osd = cmap.osds[osd_id]
        entry = {"id": osd_id, "host": osd["location"].get("host"), "up": osd["up"],
                 "in": osd["in"], "total_bytes": None, "used_bytes": None, "used_ratio": None,
                 "state": "unknown"}
        if osd_id in capacity:
            total, used = capacity[osd_id]
            ratio = used_ratio(capacity[osd_id])
            entry.update(total_bytes=total, used_bytes=used, used_ratio=round(ratio, 4),
                         state="full" if ratio >= ratios.full else
                         "nearfull" if ratio >= ratios.nearfull else "ok")
            raw_total += total
            raw_used += used
        osds.append(entry)
    pools = []
    for name in sorted(cmap.pools):
        pool = cmap.pools[name]
        objects, stored = totals.get(pool["id"], (0, 0))
        copies = pool["size"] / pool["k"] if pool["kind"] == "erasure" else pool["size"]
        use = quota_use(pool, objects, stored)
        pools.append({"name": name, "id": pool["id"], "kind": pool["kind"], "objects": objects,
                      "stored_bytes": stored, "raw_bytes": int(stored * copies),
                      "max_objects": pool.get("max_objects", 0),
                      "max_bytes": pool.get("max_bytes", 0),
                      "quota_ratio": None if use is None else round(use, 4),
                      "quota_full": bool(pool.get("quota_full"))})
    return {"raw": {"total_bytes": raw_total, "used_bytes": raw_used,
                    "avail_bytes": raw_total - raw_used,
                    "used_ratio": round(raw_used / raw_total, 4) if raw_total else 0.0},
            "osds": osds, "pools": pools,
            "ratios": {"nearfull": ratios.nearfull, "full": ratios.full,
                       "near_quota": ratios.near_quota}}
