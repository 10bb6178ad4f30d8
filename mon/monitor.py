"""The monitor daemon's shell: serves the cluster map, turns requests into map changes.

Everything that decides lives in pure cores: `ClusterMap.apply` validates and applies changes,
`FailureDetector` decides down and out, `health.evaluate` judges the map. This shell feeds them
requests and time, and carries out what they return in order:

    propose(ops): build Incremental(epoch + 1) -> apply (refused whole on MapError)
                  -> MonStore.append (fsync) -> publish the new map -> push it to subscribers
                  -> acknowledge

so nothing acknowledged or pushed can be lost by a crash, and a refused change leaves no trace.
Proposals are serialised by one lock: the map has one writer.

Requests (frame header `op`; replies are headers, maps travel as msgpack payloads):
    hello                                 -> fsid, epoch, name
    get_map {have}                        -> epoch, form (current|incrementals|full) + payload
    subscribe {have}                      -> as get_map; later epochs are pushed (op "map")
    osd_boot {uuid, location, weight, addr, [id]} -> id, epoch
    osd_heartbeat {id}                    -> epoch, up
    osd_failure {reporter, target, failed}
    osd_stop {id}                         -> marks it down (a clean shutdown)
    status, osd_tree, pool_ls             -> views for the CLI
    osd_mark {id, state: out|in|down}, pool_create {...}, pool_delete {name},
    config_set {key, value}, config_get {key}
    pg_last_active {pool, pg}             -> record [epoch, acting, complete] or None
    pg_set_active {pool, pg, epoch, acting, complete}  (durable before the reply; peering.py)
"""

import asyncio
import collections
import logging
import time

import msgpack

from cairn.common import config, throttle
from cairn.common import messenger
from cairn.common.clustermap import Incremental, MapError
from cairn.common.messenger import RequestFailed
from cairn.mon import health
from cairn.mon.failure import FailureDetector
from cairn.mon.store import MonStore

OBJECT_COUNTS = ("total", "degraded", "misplaced")

log = logging.getLogger("cairn.mon")

# How often the failure detector runs. A tenth of the smallest grace keeps detection within 5%.
TICK_S = 0.1
# Subscribers pushed at once; a cluster of many clients gets its maps on request.
SUBSCRIBERS_MAX = 4096
OSD_ID_MAX = 1 << 20


class Monitor:
    def __init__(self, directory, bind_addr, name="mon.0"):
        self.directory = directory
        self.bind_addr = bind_addr
        self.name = name
        self.addr = None
        self.store = None
        self.map = None
        self._detector = None
        self._server = None
        self._lock = asyncio.Lock()
        self._subscribers = set()
        self._health_cache = (None, None)
        self._pg_states = {}                # osd id -> {state: PGs it is primary of}
        self._objects = {}                  # osd id -> {total, degraded, misplaced} copies
        self._recovery = {}                 # osd id -> deque of (when, recovery bytes total)
        self._tick_task = None
        self.proposals_total = 0

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self):
        self.store = MonStore.open(self.directory)
        self.map = self.store.load()
        self._detector = FailureDetector(time.monotonic_ns())
        self._detector.observe(self.map, time.monotonic_ns())
        self._server = await messenger.serve(self.bind_addr, self.handle,
                                             on_close=self._subscribers.discard)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.addr = f"{host}:{port}"
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        log.info("%s serving %s: fsid %s, epoch %d, %d OSDs, %d pools", self.name, self.addr,
                 self.map.fsid, self.map.epoch, len(self.map.osds), len(self.map.pools))

    async def stop(self):
        if self._tick_task is not None:
            self._tick_task.cancel()
            await asyncio.gather(self._tick_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            for peer in list(self._subscribers):
                peer.close()
            await self._server.wait_closed()
        async with self._lock:                    # no store write in flight
            if self.store is not None:
                self.store.close()
                self.store = None

    async def _tick_loop(self):
        # Runs until the monitor stops.
        while True:
            await asyncio.sleep(TICK_S)
            ops = self._detector.tick(self.map, time.monotonic_ns())
            if ops:
                try:
                    await self.propose(ops, why="failure detector")
                except RequestFailed as exc:
                    log.error("failure detector's change %s refused: %s", ops, exc)

    # -- the one writer ---------------------------------------------------------------------------

    async def propose(self, ops, why):
        """Apply `ops` as the next epoch, durably; the new map. RequestFailed if refused."""
        async with self._lock:
            incremental = Incremental(self.map.epoch + 1, tuple(ops))
            try:
                new_map = self.map.apply(incremental)
            except MapError as exc:
                raise RequestFailed("invalid", str(exc)) from None
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.append, incremental, new_map)
            self.map = new_map
            self.proposals_total += 1
            self._detector.observe(new_map, time.monotonic_ns())
            log.info("epoch %d (%s): %s", new_map.epoch, why, _describe(ops))
            payload = msgpack.packb([incremental.to_dict()])
            for peer in list(self._subscribers):
                peer.push({"op": "map", "epoch": new_map.epoch, "form": "incrementals"}, payload)
            return new_map

    # -- requests ---------------------------------------------------------------------------------

    async def handle(self, peer, received):
        op = received.header.get("op")
        handler = _REQUESTS.get(op)
        if handler is None:
            raise RequestFailed("unknown_op", f"unknown request {op!r} (known: "
                                f"{', '.join(sorted(_REQUESTS))})")
        return await handler(self, peer, received.header)

    def _map_reply(self, have):
        if not isinstance(have, int) or isinstance(have, bool) or have < 0:
            have = 0
        epoch = self.map.epoch
        if have == epoch:
            return {"epoch": epoch, "form": "current"}, b""
        if 0 < have < epoch:
            found = self.store.incrementals(have, epoch)
            if found is not None:
                return {"epoch": epoch, "form": "incrementals"}, msgpack.packb(found)
        return {"epoch": epoch, "form": "full"}, msgpack.packb(self.map.to_dict())

    async def _hello(self, peer, header):
        return {"fsid": self.map.fsid, "epoch": self.map.epoch, "name": self.name}, b""

    async def _get_map(self, peer, header):
        return self._map_reply(header.get("have", 0))

    async def _subscribe(self, peer, header):
        if peer not in self._subscribers and len(self._subscribers) >= SUBSCRIBERS_MAX:
            raise RequestFailed("busy", f"{self.name} has {SUBSCRIBERS_MAX} subscribers; "
                                "fetch maps with get_map instead")
        async with self._lock:               # no epoch can slip between the reply and pushes
            self._subscribers.add(peer)
            return self._map_reply(header.get("have", 0))

    async def _osd_boot(self, peer, header):
        uuid = header.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            raise RequestFailed("invalid", "osd_boot needs the OSD's uuid")
        known = next((osd["id"] for osd in self.map.osds.values() if osd["uuid"] == uuid), None)
        osd_id = header.get("id", known)
        if osd_id is None:
            osd_id = next(i for i in range(OSD_ID_MAX) if i not in self.map.osds)
        if known is not None and known != osd_id:
            raise RequestFailed("invalid", f"uuid {uuid} is osd.{known}, not osd.{osd_id}")
        ops = []
        if known is None:
            ops.append({"op": "osd_add", "id": osd_id, "uuid": uuid,
                        "location": header.get("location"), "weight": header.get("weight", 1.0)})
        elif header.get("location") not in (None, self.map.osds[osd_id]["location"]):
            log.warning("osd.%s boots with location %s but is registered at %s; keeping the "
                        "registered one", osd_id, header.get("location"),
                        self.map.osds[osd_id]["location"])
        ops.append({"op": "osd_boot", "id": osd_id, "addr": header.get("addr")})
        new_map = await self.propose(ops, why=f"osd.{osd_id} boot")
        self._detector.heartbeat(osd_id, time.monotonic_ns())
        return {"id": osd_id, "epoch": new_map.epoch}, b""

    def _known_osd(self, header, field="id"):
        osd_id = header.get(field)
        if not isinstance(osd_id, int) or osd_id not in self.map.osds:
            raise RequestFailed("not_found", f"osd {osd_id!r} does not exist")
        return osd_id

    async def _osd_heartbeat(self, peer, header):
        osd_id = self._known_osd(header)
        self._detector.heartbeat(osd_id, time.monotonic_ns())
        recovered = header.get("recovery_bytes")
        if isinstance(recovered, int):
            self._recovery.setdefault(osd_id, collections.deque(maxlen=64)).append(
                (time.monotonic(), recovered))
        states = header.get("pg_states")
        if isinstance(states, dict):
            self._pg_states[osd_id] = {str(k): int(v) for k, v in states.items()
                                       if isinstance(v, int)}
        objects = header.get("objects")
        if isinstance(objects, dict):
            self._objects[osd_id] = {key: objects[key] for key in OBJECT_COUNTS
                                     if isinstance(objects.get(key), int)}
        return {"epoch": self.map.epoch, "up": self.map.osds[osd_id]["up"]}, b""

    async def _osd_failure(self, peer, header):
        reporter = self._known_osd(header, "reporter")
        target = self._known_osd(header, "target")
        failed = bool(header.get("failed", True))
        now_ns = time.monotonic_ns()
        self._detector.report(reporter, target, failed, now_ns)
        if failed:
            log.info("osd.%d reports osd.%d failed: %s", reporter, target,
                     header.get("reason", "no reason given"))
            ops = [op for op in self._detector.tick(self.map, now_ns) if op["id"] == target]
            if ops:
                await self.propose(ops, why=f"failure reports against osd.{target}")
        return {"epoch": self.map.epoch}, b""

    async def _osd_stop(self, peer, header):
        osd_id = self._known_osd(header)
        if self.map.osds[osd_id]["up"]:
            await self.propose([{"op": "osd_down", "id": osd_id}], why=f"osd.{osd_id} stopping")
        return {"epoch": self.map.epoch}, b""

    async def _osd_mark(self, peer, header):
        osd_id = self._known_osd(header)
        state = header.get("state")
        ops = {"out": [{"op": "osd_out", "id": osd_id, "manual": True}],
               "in": [{"op": "osd_in", "id": osd_id}],
               "down": [{"op": "osd_down", "id": osd_id}]}.get(state)
        if ops is None:
            raise RequestFailed("invalid", f"state must be out, in or down (was {state!r})")
        new_map = await self.propose(ops, why=f"operator marks osd.{osd_id} {state}")
        return {"epoch": new_map.epoch}, b""

    async def _pool_create(self, peer, header):
        op = {key: value for key, value in header.items() if key != "op"}
        op["op"] = "pool_create"
        new_map = await self.propose([op], why="operator")
        return {"epoch": new_map.epoch, "pool": new_map.pools[op["name"]]}, b""

    async def _pool_delete(self, peer, header):
        new_map = await self.propose([{"op": "pool_delete", "name": header.get("name")}],
                                     why="operator")
        return {"epoch": new_map.epoch}, b""

    async def _pool_ls(self, peer, header):
        return {"epoch": self.map.epoch,
                "pools": [self.map.pools[name] for name in sorted(self.map.pools)]}, b""

    async def _config_set(self, peer, header):
        new_map = await self.propose([{"op": "config_set", "key": header.get("key"),
                                       "value": header.get("value")}], why="operator")
        return {"epoch": new_map.epoch}, b""

    async def _config_get(self, peer, header):
        key = header.get("key")
        if key is None:
            return {"epoch": self.map.epoch,
                    "config": {name: {"value": config.display(self.map.config, name),
                                      "set": name in self.map.config,
                                      "help": option.help}
                               for name, option in sorted(config.OPTIONS.items())}}, b""
        try:
            value = config.display(self.map.config, key)
        except KeyError as exc:
            raise RequestFailed("not_found", exc.args[0]) from None
        return {"epoch": self.map.epoch, "key": key, "value": value,
                "set": key in self.map.config}, b""

    async def _status(self, peer, header):
        epoch, judged = self._health_cache
        if epoch != self.map.epoch:
            judged = health.evaluate(self.map)
            self._health_cache = (self.map.epoch, judged)
        osds = self.map.osds.values()
        return {"fsid": self.map.fsid, "epoch": self.map.epoch, **judged.to_dict(),
                "mons": {"members": [self.name], "quorum": [self.name], "leader": self.name,
                         "addrs": {self.name: self.addr}},
                "osds": {"total": len(self.map.osds), "up": sum(o["up"] for o in osds),
                         "in": sum(o["in"] for o in osds)},
                "pools": sorted(self.map.pools), "pg_states": self._pg_state_totals(),
                "objects": self._object_totals(),
                "recovery": self._recovery_view()}, b""

    def _recovery_view(self):
        """Cluster recovery rate over the last ~10 s of heartbeats, and the budget in force
        (by this monitor's clock)."""
        now = time.monotonic()
        rate = 0.0
        for osd_id, samples in self._recovery.items():
            recent = [(when, total) for when, total in samples if now - when <= 10.0]
            if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
                rate += (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
        local = time.localtime()
        in_force = throttle.budget(config.value(self.map.config, "recovery.windows"),
                                   config.value(self.map.config, "recovery.max_bytes_per_s"),
                                   config.value(self.map.config, "recovery.max_active"),
                                   local.tm_wday, local.tm_hour * 60 + local.tm_min)
        return {"bytes_per_s": round(rate), "window": in_force.window,
                "max_bytes_per_s": in_force.max_bytes_per_s, "max_active": in_force.max_active}

    def _object_totals(self):
        """Object copies over the up OSDs' last reports: wanted (total), still to recover
        (degraded) and held by OSDs no longer members of their PG (misplaced)."""
        totals = dict.fromkeys(OBJECT_COUNTS, 0)
        for osd_id, counts in self._objects.items():
            if osd_id in self.map.osds and self.map.osds[osd_id]["up"]:
                for key, count in counts.items():
                    totals[key] += count
        return totals

    def _pg_state_totals(self):
        totals = {}
        for osd_id, states in self._pg_states.items():
            if osd_id in self.map.osds and self.map.osds[osd_id]["up"]:
                for state, count in states.items():
                    totals[state] = totals.get(state, 0) + count
        return dict(sorted(totals.items()))

    async def _pg_last_active(self, peer, header):
        pool_id, pg_index = self._pg_key(header)
        return {"record": self.store.pg_active(pool_id, pg_index)}, b""

    async def _pg_set_active(self, peer, header):
        pool_id, pg_index = self._pg_key(header)
        epoch, acting = header.get("epoch"), header.get("acting")
        complete = header.get("complete", acting)
        if not isinstance(epoch, int) or not isinstance(acting, list) or \
                not isinstance(complete, list) or \
                not all(isinstance(m, int) for m in acting + complete) or \
                not set(complete) <= set(acting):
            raise RequestFailed("invalid", "pg_set_active needs epoch, acting (OSD ids) and "
                                "complete (a subset of acting)")
        async with self._lock:
            current = self.store.pg_active(pool_id, pg_index)
            if current is not None and current[0] > epoch:
                raise RequestFailed("stale", f"pg {pool_id}.{pg_index:x} went active at epoch "
                                    f"{current[0]}, after {epoch}")
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.set_pg_active, pool_id, pg_index, epoch, acting, complete)
        return {}, b""

    def _pg_key(self, header):
        pool_id, pg_index = header.get("pool"), header.get("pg")
        if not isinstance(pool_id, int) or not isinstance(pg_index, int) or pg_index < 0:
            raise RequestFailed("invalid", "a PG is named by pool (id) and pg (index)")
        return pool_id, pg_index

    async def _osd_tree(self, peer, header):
        return {"epoch": self.map.epoch, "osds": self.map.osd_tree()}, b""


_REQUESTS = {
    "hello": Monitor._hello, "get_map": Monitor._get_map, "subscribe": Monitor._subscribe,
    "osd_boot": Monitor._osd_boot, "osd_heartbeat": Monitor._osd_heartbeat,
    "osd_failure": Monitor._osd_failure, "osd_stop": Monitor._osd_stop,
    "osd_mark": Monitor._osd_mark, "pool_create": Monitor._pool_create,
    "pool_delete": Monitor._pool_delete, "pool_ls": Monitor._pool_ls,
    "config_set": Monitor._config_set, "config_get": Monitor._config_get,
    "status": Monitor._status, "osd_tree": Monitor._osd_tree,
    "pg_last_active": Monitor._pg_last_active, "pg_set_active": Monitor._pg_set_active,
}


def _describe(ops):
    parts = []
    for op in ops:
        fields = " ".join(f"{k}={v}" for k, v in op.items() if k != "op")
        parts.append(f"{op['op']} {fields}".strip())
    return "; ".join(parts)
