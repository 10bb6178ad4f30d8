"""The monitor's requests from OSDs and clients that follow the map: hello, get_map, subscribe;
an OSD's boot, heartbeat (its reports: PG states, capacity, disk latency, network probes),
failure reports, stop and marks; a PG primary's last-active interval.

Theory of operation: each handler takes (monitor, peer, header) and returns (reply header,
payload), like mon/authority.py's. A handler that changes the map proposes its ops through
`monitor.propose` (one writer, Raft-replicated, mon/monitor.py); a report only updates the
leader's in-memory views, which the health checks and `cairn status` read. The monitor
forwards a request in LEADER_OPS from a follower to the leader before a handler sees it.
"""

import collections
import logging
import time

import msgpack

from cairn.common import config
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.mon import capacity, health, netloss, slowdisk

log = logging.getLogger("cairn.mon")

OBJECT_COUNTS = ("total", "degraded", "misplaced")
# Subscribers pushed at once; a cluster of many clients gets its maps on request.
SUBSCRIBERS_MAX = 4096
OSD_ID_MAX = 1 << 20


def _map_reply(monitor, have):
    # `leader`: None when this monitor knows no leader (cut off from the majority, or an
    # election under way), so its map may be behind; MonClient then asks another.
    if not isinstance(have, int) or isinstance(have, bool) or have < 0:
        have = 0
    epoch = monitor.map.epoch
    reply = {"epoch": epoch, "leader": monitor.raft.leader}
    if have == epoch:
        return {**reply, "form": "current"}, b""
    if 0 < have < epoch:
        found = monitor.store.incrementals(have, epoch)
        if found is not None:
            return {**reply, "form": "incrementals"}, msgpack.packb(found)
    return {**reply, "form": "full"}, msgpack.packb(monitor.map.to_dict())


async def hello(monitor, peer, header):
    return {"fsid": monitor.map.fsid, "epoch": monitor.map.epoch, "name": monitor.name}, b""


async def get_map(monitor, peer, header):
    return _map_reply(monitor, header.get("have", 0))


async def subscribe(monitor, peer, header):
    if peer not in monitor._subscribers and len(monitor._subscribers) >= SUBSCRIBERS_MAX:
        raise RequestFailed(Code.BUSY, f"{monitor.name} has {SUBSCRIBERS_MAX} subscribers; "
                            "fetch maps with get_map instead")
    # Synchronous: no epoch can slip between the reply and the pushes.
    monitor._subscribers.add(peer)
    return _map_reply(monitor, header.get("have", 0))


async def osd_boot(monitor, peer, header):
    uuid = header.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise RequestFailed(Code.INVALID, "osd_boot needs the OSD's uuid")
    known = next((osd["id"] for osd in monitor.map.osds.values() if osd["uuid"] == uuid), None)
    osd_id = header.get("id", known)
    if osd_id is None:
        osd_id = next(i for i in range(OSD_ID_MAX) if i not in monitor.map.osds)
    if known is not None and known != osd_id:
        raise RequestFailed(Code.INVALID, f"uuid {uuid} is osd.{known}, not osd.{osd_id}")
    ops = []
    if known is None:
        ops.append({"op": "osd_add", "id": osd_id, "uuid": uuid,
                    "location": header.get("location"), "weight": header.get("weight", 1.0)})
    elif header.get("location") not in (None, monitor.map.osds[osd_id]["location"]):
        log.warning("osd.%s boots with location %s but is registered at %s; keeping the "
                    "registered one", osd_id, header.get("location"),
                    monitor.map.osds[osd_id]["location"])
    ops.append({"op": "osd_boot", "id": osd_id, "addr": header.get("addr")})
    new_map = await monitor.propose(ops, why=f"osd.{osd_id} boot", rid=header.get("rid"))
    monitor._detector.heartbeat(osd_id, time.monotonic_ns())
    return {"id": osd_id, "epoch": new_map.epoch}, b""


def _known_osd(monitor, header, field="id"):
    osd_id = header.get(field)
    if not isinstance(osd_id, int) or osd_id not in monitor.map.osds:
        raise RequestFailed(Code.NOT_FOUND, f"osd {osd_id!r} does not exist")
    return osd_id


async def osd_heartbeat(monitor, peer, header):
    osd_id = _known_osd(monitor, header)
    monitor._detector.heartbeat(osd_id, time.monotonic_ns())
    recovered = header.get("recovery_bytes")
    if isinstance(recovered, int):
        monitor._recovery.setdefault(osd_id, collections.deque(maxlen=64)).append(
            (time.monotonic(), recovered))
    states = header.get("pg_states")
    if isinstance(states, dict):
        monitor._pg_states[osd_id] = {str(k): int(v) for k, v in states.items()
                                      if isinstance(v, int)}
    inconsistent = header.get("inconsistent")
    if isinstance(inconsistent, list):
        monitor._inconsistent[osd_id] = [str(name) for name in inconsistent[:64]]
    objects = header.get("objects")
    if isinstance(objects, dict):
        monitor._objects[osd_id] = {key: objects[key] for key in OBJECT_COUNTS
                                    if isinstance(objects.get(key), int)}
    monitor._net[osd_id] = netloss.clean_report(header.get("net"))
    found = capacity.clean_capacity(header.get("capacity"))
    if found is not None:
        monitor._capacity[osd_id] = found
    monitor._pool_use[osd_id] = capacity.clean_pools(header.get("pools"))
    monitor._reported_at[osd_id] = time.monotonic()
    slow_ops = header.get("slow_ops")
    monitor._slow_ops[osd_id] = slow_ops if type(slow_ops) is int and slow_ops > 0 else 0
    monitor._hedges[osd_id] = health.clean_hedges(header.get("hedges"))
    around = health.clean_around(header.get("reads_around"))
    monitor._around.setdefault(osd_id, collections.deque(
        maxlen=health.HEDGED_INTERVALS + 1)).append(
        (time.monotonic(), around))
    if isinstance(header.get("device_path"), str):
        monitor._device_paths[osd_id] = header["device_path"][:256]
    now = time.monotonic()
    monitor._slow.observe(osd_id, now, slowdisk.clean_summary(header.get("device")))
    if now - monitor._slow_judged_at >= 1.0:
        _judge_disks(monitor, now)
    if isinstance(header.get("throughput"), dict):
        monitor._throughput.observe(osd_id, header["throughput"])
    monitor._throughput.tick(now, time.time())
    if header.get("recovering") is True:
        monitor._recovering[osd_id] = now
    else:
        monitor._recovering.pop(osd_id, None)
    return {"epoch": monitor.map.epoch, "up": monitor.map.osds[osd_id]["up"],
            "recovering_osds": recovering_count(monitor, now),
            "recovering_counted": osd_id in monitor._recovering}, b""


def recovering_count(monitor, now):
    """How many up OSDs said in a recent heartbeat (within 3 intervals) that they recover:
    the cluster-wide recovery budget is split among them (common/throttle.py)."""
    fresh_s = 3 * config.value(monitor.map.config, "osd.heartbeat_interval_s")
    osds = monitor.map.osds
    return sum(1 for osd_id, when in monitor._recovering.items()
               if now - when <= fresh_s and osd_id in osds and osds[osd_id]["up"])


def _judge_disks(monitor, now):
    conf = monitor.map.config
    sustain_s = config.value(conf, "health.slow_disk_sustain_s")
    monitor._slow.settings = slowdisk.Settings(
        factor=config.value(conf, "health.slow_disk_factor"),
        floor_ms=config.value(conf, "health.slow_disk_floor_ms"),
        sustain_s=sustain_s, clear_s=sustain_s + 9.0)
    up = {osd_id for osd_id, osd in monitor.map.osds.items() if osd["up"]}
    monitor._slow_found = monitor._slow.evaluate(now, up)
    monitor._slow_judged_at = now


async def osd_failure(monitor, peer, header):
    reporter = _known_osd(monitor, header, "reporter")
    target = _known_osd(monitor, header, "target")
    failed = bool(header.get("failed", True))
    now_ns = time.monotonic_ns()
    monitor._detector.report(reporter, target, failed, now_ns)
    if failed and monitor._leads_noticed():
        log.info("osd.%d reports osd.%d failed: %s", reporter, target,
                 header.get("reason", "no reason given"))
        ops = [op for op in monitor._detector.tick(monitor.map, now_ns) if op["id"] == target]
        if ops:
            await monitor.propose(ops, why=f"failure reports against osd.{target}",
                                  rid=header.get("rid"))
    return {"epoch": monitor.map.epoch}, b""


async def osd_stop(monitor, peer, header):
    osd_id = _known_osd(monitor, header)
    if monitor.map.osds[osd_id]["up"]:
        await monitor.propose([{"op": "osd_down", "id": osd_id}], why=f"osd.{osd_id} stopping",
                              rid=header.get("rid"))
    return {"epoch": monitor.map.epoch}, b""


async def osd_mark(monitor, peer, header):
    osd_id = _known_osd(monitor, header)
    state = header.get("state")
    ops = {"out": [{"op": "osd_out", "id": osd_id, "manual": True}],
           "in": [{"op": "osd_in", "id": osd_id}],
           "down": [{"op": "osd_down", "id": osd_id}],
           "reweight": [{"op": "osd_reweight", "id": osd_id,
                         "reweight": header.get("reweight")}],
           "weight": [{"op": "osd_weight", "id": osd_id,
                       "weight": header.get("weight")}]}.get(state)
    if ops is None:
        raise RequestFailed(Code.INVALID, f"state must be out, in, down, reweight or weight "
                            f"(was {state!r})")
    what = f"sets osd.{osd_id}'s {state} to {header.get(state)}" \
        if state in ("reweight", "weight") else f"marks osd.{osd_id} {state}"
    new_map = await monitor.propose(ops, why=f"operator {what}", rid=header.get("rid"))
    return {"epoch": new_map.epoch}, b""


async def pg_last_active(monitor, peer, header):
    pool_id, pg_index = _pg_key(monitor, header)
    await monitor._read_barrier()
    return {"record": monitor.store.pg_active(pool_id, pg_index)}, b""


async def pg_set_active(monitor, peer, header):
    pool_id, pg_index = _pg_key(monitor, header)
    epoch, acting = header.get("epoch"), header.get("acting")
    complete = header.get("complete", acting)
    if not isinstance(epoch, int) or not isinstance(acting, list) or \
            not isinstance(complete, list) or \
            not all(isinstance(m, int) for m in acting + complete) or \
            not set(complete) <= set(acting):
        raise RequestFailed(Code.INVALID, "pg_set_active needs epoch, acting (OSD ids) and "
                            "complete (a subset of acting)")
    await monitor._replicate({"t": "pgact", "pool": pool_id, "pg": pg_index, "epoch": epoch,
                              "acting": acting, "complete": complete})
    return {}, b""


def _pg_key(monitor, header):
    pool_id, pg_index = header.get("pool"), header.get("pg")
    if not isinstance(pool_id, int) or not isinstance(pg_index, int) or pg_index < 0:
        raise RequestFailed(Code.INVALID, "a PG is named by pool (id) and pg (index)")
    return pool_id, pg_index


REQUESTS = {
    "hello": hello,
    "get_map": get_map,
    "subscribe": subscribe,
    "osd_boot": osd_boot,
    "osd_heartbeat": osd_heartbeat,
    "osd_failure": osd_failure,
    "osd_stop": osd_stop,
    "osd_mark": osd_mark,
    "pg_last_active": pg_last_active,
    "pg_set_active": pg_set_active,
}
