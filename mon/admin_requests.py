"""The monitor's requests from administrators: pools (create, delete, list, quotas, network
allowlists), config, status, health and its history, df, the OSD tree, and adding or removing
a monitor.

Theory of operation: each handler takes (monitor, peer, header) and returns (reply header,
payload), like mon/authority.py's. A change goes through `monitor.propose` (map ops) or
`monitor._replicate` (membership) and is answered once committed; a read answers from the
leader's applied map and views. The monitor forwards a request in LEADER_OPS from a follower
to the leader before a handler sees it; `status` with `local` answers this monitor's own view.
"""

from cairn.common import config, messenger
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.mon import capacity, raft_transport, views
from cairn.mon.raft import ChangeRefused, NotLeader
from cairn.mon.raft_transport import MON_NAME_BYTES_MAX

# `cairn health history` shows this many of the newest events unless asked for more.
HISTORY_SHOWN = 50


async def pool_create(monitor, peer, header):
    op = {key: value for key, value in header.items()
          if key not in ("op", "forwarded", "rid")}
    op["op"] = "pool_create"
    new_map = await monitor.propose([op], why="operator", rid=header.get("rid"))
    return {"epoch": new_map.epoch, "pool": new_map.pools.get(op["name"])}, b""


async def pool_delete(monitor, peer, header):
    new_map = await monitor.propose([{"op": "pool_delete", "name": header.get("name")}],
                                    why="operator", rid=header.get("rid"))
    return {"epoch": new_map.epoch}, b""


async def pool_ls(monitor, peer, header):
    return {"epoch": monitor.map.epoch,
            "pools": [monitor.map.pools[name] for name in sorted(monitor.map.pools)]}, b""


async def config_set(monitor, peer, header):
    new_map = await monitor.propose([{"op": "config_set", "key": header.get("key"),
                                      "value": header.get("value")}], why="operator",
                                    rid=header.get("rid"))
    return {"epoch": new_map.epoch}, b""


async def config_get(monitor, peer, header):
    key = header.get("key")
    if key is None:
        return {"epoch": monitor.map.epoch,
                "config": {name: {"value": config.display(monitor.map.config, name),
                                  "set": name in monitor.map.config,
                                  "help": option.help}
                           for name, option in sorted(config.OPTIONS.items())}}, b""
    try:
        value = config.display(monitor.map.config, key)
    except KeyError as exc:
        raise RequestFailed(Code.NOT_FOUND, exc.args[0]) from None
    return {"epoch": monitor.map.epoch, "key": key, "value": value,
            "set": key in monitor.map.config}, b""


async def df(monitor, peer, header):
    return capacity.df(monitor.map, monitor._capacity, views.pool_totals(monitor),
                       views.ratios(monitor)), b""


async def pool_set_quota(monitor, peer, header):
    op = {"op": "pool_set_quota", "name": header.get("name")}
    for field in ("max_objects", "max_bytes"):
        if field in header:
            op[field] = header[field]
    new_map = await monitor.propose([op], why="operator", rid=header.get("rid"))
    return {"epoch": new_map.epoch, "pool": new_map.pools.get(op["name"])}, b""


async def pool_allow_from(monitor, peer, header):
    op = {"op": "pool_allow_from", "name": header.get("name"),
          "prefix": header.get("prefix", ""), "networks": header.get("networks")}
    new_map = await monitor.propose([op], why="operator", rid=header.get("rid"))
    return {"epoch": new_map.epoch, "pool": new_map.pools.get(op["name"])}, b""


async def pool_fast_read(monitor, peer, header):
    op = {"op": "pool_fast_read", "name": header.get("name"),
          "fast_read": header.get("fast_read")}
    new_map = await monitor.propose([op], why="operator", rid=header.get("rid"))
    return {"epoch": new_map.epoch, "pool": new_map.pools.get(op["name"])}, b""


async def health_op(monitor, peer, header):
    return views.health_report(monitor, views.mons_view(monitor)), b""


async def health_history(monitor, peer, header):
    limit = header.get("limit", HISTORY_SHOWN)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise RequestFailed(Code.INVALID, f"limit must be a positive integer (was {limit!r})")
    await monitor._read_barrier()
    events = monitor.store.events()
    return {"events": events[-limit:], "kept": len(events)}, b""


async def status(monitor, peer, header):
    osds = monitor.map.osds.values()
    mons = views.mons_view(monitor)
    report = views.health_report(monitor, mons)
    judged = {"health": report["status"],
              "checks": {name: c["summary"] for name, c in report["checks"].items()},
              "severities": {name: c["severity"] for name, c in report["checks"].items()},
              "pgs": monitor._health_cache[1].pgs}
    return {"fsid": monitor.map.fsid, "epoch": monitor.map.epoch, **judged, "mons": mons,
            "osds": {"total": len(monitor.map.osds), "up": sum(o["up"] for o in osds),
                     "in": sum(o["in"] for o in osds)},
            "pools": sorted(monitor.map.pools), "pg_states": views.pg_state_totals(monitor),
            "objects": views.object_totals(monitor),
            "recovery": views.recovery_view(monitor),
            "console": monitor.console.url if monitor.console is not None else None}, b""


async def mon_add(monitor, peer, header):
    done = await _membership_done(monitor, header.get("rid"))
    if done is not None:
        return done
    name, addr = header.get("name"), header.get("addr")
    if not isinstance(name, str) or not 0 < len(name) <= MON_NAME_BYTES_MAX:
        raise RequestFailed(Code.INVALID, "mon_add needs the new monitor's name (like mon.3)")
    try:
        messenger.parse_addr(addr)
    except ValueError as exc:
        raise RequestFailed(Code.INVALID, f"mon_add needs the new monitor's address: {exc}") \
            from None
    if name in monitor.raft.members:
        if raft_transport.addr_of(monitor, name) == addr:
            return {"members": sorted(monitor.raft.members), "already": True}, b""
        raise RequestFailed(Code.INVALID, f"{name} is already a monitor, at "
                            f"{raft_transport.addr_of(monitor, name)}")
    return await _change_members(monitor, monitor.raft.members | {name: addr}, header.get("rid"))


async def mon_remove(monitor, peer, header):
    done = await _membership_done(monitor, header.get("rid"))
    if done is not None:
        return done
    name = header.get("name")
    if name not in monitor.raft.members:
        raise RequestFailed(Code.NOT_FOUND, f"no monitor {name!r} (monitors: "
                            f"{', '.join(sorted(monitor.raft.members))})")
    members = dict(monitor.raft.members)
    del members[name]
    return await _change_members(monitor, members, header.get("rid"))


async def _membership_done(monitor, rid):
    """The answer a membership change with request id `rid` got, if it was done (its
    reply lost, the request re-sent); None if not. As for map changes (propose), the
    leader first applies its whole log, so the answer is exact."""
    if rid is None:
        return None
    await monitor._wait_applied(monitor.raft.last_index)
    found = monitor.store.requests.get(rid)
    if found is None:
        return None
    index, outcome = found
    return {"members": outcome["members"], "index": index}, b""


async def _change_members(monitor, members, rid):
    try:
        index = monitor.raft.propose_members(members, context=rid)
    except NotLeader:
        raise RequestFailed(
            Code.NO_QUORUM, f"no quorum: {monitor.name} is no longer the leader; retry") from None
    except ChangeRefused as exc:
        raise RequestFailed(Code.BUSY, str(exc)) from None
    await monitor._committed(index)
    return {"members": sorted(members), "index": index}, b""


async def osd_tree(monitor, peer, header):
    return {"epoch": monitor.map.epoch, "osds": monitor.map.osd_tree()}, b""


async def osd_perf(monitor, peer, header):
    return views.osd_perf(monitor), b""


REQUESTS = {
    "pool_create": pool_create,
    "pool_delete": pool_delete,
    "pool_ls": pool_ls,
    "config_set": config_set,
    "config_get": config_get,
    "df": df,
    "pool_set_quota": pool_set_quota,
    "pool_allow_from": pool_allow_from,
    "pool_fast_read": pool_fast_read,
    "health": health_op,
    "health_history": health_history,
    "status": status,
    "mon_add": mon_add,
    "mon_remove": mon_remove,
    "osd_tree": osd_tree,
    "osd_perf": osd_perf,
}
