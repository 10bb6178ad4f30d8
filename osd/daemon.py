"""The OSD daemon's life cycle: open the store, register, heartbeat, follow the map, stop cleanly.

    start:  open the device and its store -> listen -> osd_boot to the monitors (they assign an
            id from our uuid, or keep the one we had) -> subscribe to the map
    run:    every osd.heartbeat_interval_s: heartbeat to the monitor (if it says we are down
            while we run, boot again: "wrongly marked down"), ping our peers (osd/heartbeat.py
            chooses them) and report failures the PeerWatch core decides on
    stop:   (SIGTERM) tell the monitor we are going down, then close the store

Object ops (put, get, stat, delete, list and their replication) are served by
`osd/service.py`; the daemon answers `ping` and `status` itself.
"""

import asyncio
import collections
import logging
import time

from cairn.common import audit, auth, config, messenger, metrics, server, sessions, tls, wire
from cairn.common.codes import Code
from cairn.common.limits import READ_CACHE_BYTES_DEFAULT
from cairn.common.pg import pool_by_id
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common.monclient import MonClient, MonitorsUnavailable
from cairn.native import latency, open_device
from cairn.osd import access, metrics as osd_metrics
from cairn.osd.heartbeat import PeerWatch, choose_peers
from cairn.osd.netprobe import NetProber, probe_targets
from cairn.common.daemon import crash_on_error
from cairn.osd.assembly import assemble
from cairn.osd.port import DaemonPort
from cairn.osd.service import OPS
from cairn.osd.store import Store

log = logging.getLogger("cairn.osd")

NS_PER_S = 1_000_000_000
# How long a clean stop waits for the monitor to acknowledge "going down"; after it, we stop
# anyway and the monitor finds out through missed heartbeats.
STOP_NOTICE_S_MAX = 3.0


class OsdDaemon:
    def __init__(self, device_path, mon_addrs, bind_addr, location, *, meta_dir=None,
                 weight=1.0, osd_id=None, metrics_port=None, secret=None, tls_dir=None,
                 read_cache_bytes=READ_CACHE_BYTES_DEFAULT):
        self.device_path = device_path
        self.read_cache_bytes = read_cache_bytes
        self.meta_dir = meta_dir
        self.bind_addr = bind_addr
        self.location = dict(location)
        self.weight = weight
        self.id = osd_id
        self.addr = None
        # With a key (osd.N's, from its keyring) the OSD authenticates to the monitors, holds
        # the service keys that open clients' tickets, and shows tickets to its peers.
        # With --tls DIR it serves TLS and speaks it to monitors and peers (common/tls.py).
        self.tls_server, self.tls_client = tls.daemon_contexts(tls_dir)
        self.monc = MonClient(mon_addrs, name="osd", authenticate=None if secret is None else
                              sessions.monitor_handshake(f"osd.{osd_id}", secret),
                              tls=self.tls_client)
        self.tickets = sessions.Tickets(self.monc.ticket)
        self.service_keys = {}              # generation -> secret (common/auth.py tickets)
        self.authenticating = secret is not None
        self.device = None
        self.store = None
        self._server = None
        self._tasks = []
        self._watch = PeerWatch()
        self._peer_connections = messenger.ConnectionPool(   # peer id -> Connection
            authenticate=self.tickets.authenticate, tls=self.tls_client)
        self._stopping = False
        self.audit = None                   # common/audit.AuditFile, once the store is open
        self.boots_total = 0
        # Who holds whom (docs/DESIGN.md): the port is the only way out; the PG code below it
        # never reaches this daemon.
        self.port = DaemonPort(self)
        parts = assemble(self.port, self.audit_op)
        self.backends, self.pgs, self.service = parts.backends, parts.registry, parts.service
        self.scrubber = parts.scrubber
        self.prober = None                  # UDP loss probes, once the OSD has its id
        self.metrics_port = metrics_port
        self.metrics_url = None
        self._metrics = None                # the aiohttp runner serving /metrics

    @property
    def name(self):
        return f"osd.{self.id}" if self.id is not None else "osd.?"

    async def start(self):
        self.device = open_device(self.device_path, pool=wire.receive_pool())
        self.store = await Store.open(self.device, self.meta_dir)
        self.store.read_cache.limit_bytes = self.read_cache_bytes
        self._device_reported = self.device.latency_snapshot()    # heartbeats report deltas
        self.audit = audit.AuditFile(f"{self.store.meta_dir}.audit.log")
        self.pgs.load_local()
        if self.authenticating:
            await self._fetch_service_keys()
        self._server = await server.serve(
            self.bind_addr, self.handle, tls=self.tls_server, fast=self.service.fast,
            guard=sessions.TicketGuard(lambda: self.service_keys, self.authenticating))
        host, port = self._server.sockets[0].getsockname()[:2]
        self.addr = f"{host}:{port}"
        await self._boot()
        self.prober = NetProber(self.id)
        await self.prober.start(host, port)
        if self.metrics_port is not None:
            self._metrics, self.metrics_url = await metrics.serve(
                host, self.metrics_port, lambda: osd_metrics.collect(self))
        self.monc.on_map(self._on_map)
        await self.monc.subscribe()
        self._on_map(self.monc.map)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._mon_heartbeat_loop()),
                       loop.create_task(self._peer_ping_loop()),
                       loop.create_task(self.pgs.tidy_strays_forever()),
                       loop.create_task(self.prober.run_forever()),
                       loop.create_task(self.scrubber.run_forever()),
                       loop.create_task(self._audit_flush_loop()),
                       loop.create_task(self._service_keys_loop())]
        for task in self._tasks[-4:]:
            task.add_done_callback(crash_on_error)
        log.info("%s up at %s: device %s (uuid %s), location %s, epoch %d", self.name,
                 self.addr, self.device_path, self.store.superblock.uuid, self.location,
                 self.monc.map.epoch)

    def audit_op(self, peer, header, result):
        """Record a client write op (or a refusal) in the audit log."""
        pool = pool_by_id(self.monc.map, header.get("pool")) if self.monc.map else None
        target = f"{pool['name'] if pool else header.get('pool')}/{header.get('name', '')}"
        self.audit.append(audit.event(peer.entity if peer else None, peer.addr if peer else None,
                                      header.get("op"), target, result))

    async def _audit_flush_loop(self):
        while True:
            await asyncio.sleep(audit.FLUSH_INTERVAL_S)
            self.audit.flush()

    async def _fetch_service_keys(self):
        reply, connection = await self.monc.request_with_session({"op": "auth_service_keys"})
        keys = {}
        for generation, wrapped, nonce in reply.header.get("keys", []):
            keys[generation] = sessions.unwrap_reply(connection, {"key": wrapped,
                                                                  "nonce": nonce})
        if keys:
            self.service_keys = keys

    async def _service_keys_loop(self):
        # Runs until the OSD stops: new service keys reach us well before tickets use them.
        while self.authenticating:
            await asyncio.sleep(auth.SERVICE_KEYS_REFRESH_S)
            try:
                await self._fetch_service_keys()
            except (MonitorsUnavailable, RequestFailed) as exc:
                log.warning("%s: service keys not refreshed: %s", self.name, exc)

    async def _boot(self):
        header = {"op": "osd_boot", "uuid": self.store.superblock.uuid,
                  "location": self.location, "weight": self.weight, "addr": self.addr}
        if self.id is not None:
            header["id"] = self.id
        reply = await self.monc.request(header)
        self.id = reply.header["id"]
        self.boots_total += 1
        return reply.header["epoch"]

    async def stop(self):
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pgs.stop()
        if self.id is not None and self.monc.map is not None:
            try:
                async with asyncio.timeout(STOP_NOTICE_S_MAX):
                    await self.monc.request({"op": "osd_stop", "id": self.id})
                log.info("%s: the monitor marked us down", self.name)
            except (TimeoutError, MonitorsUnavailable, RequestFailed) as exc:
                log.warning("%s: could not tell the monitor we stop (%s)", self.name, exc)
        if self.audit is not None:
            self.audit.flush()
        await self._peer_connections.close()
        if self.prober is not None:
            self.prober.close()
        if self._metrics is not None:
            await self._metrics.cleanup()
        await self.port.close()
        await self.monc.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.store is not None:
            await self.store.close()
        if self.device is not None:
            await self.device.aclose()

    # -- requests from peers and clients ---------------------------------------------------------

    async def handle(self, peer, received):
        op = received.header.get("op")
        if type(op) is not str:
            raise RequestFailed(Code.INVALID, f"a request names its op (a string), not {op!r}")
        if op not in OPS:
            access.check(peer, self.monc.map, received.header)   # OSDs and admins only
        if op == "ping":
            return {"id": self.id, "epoch": self.monc.map.epoch if self.monc.map else 0}, b""
        if op == "status":
            store = self.store.statistics()
            return {"id": self.id, "addr": self.addr, "uuid": self.store.superblock.uuid,
                    "epoch": self.monc.map.epoch, "peers": self._watch.peers,
                    "recovery_bytes": self.pgs.recovery_bytes_total,
                    "recoveries": {"log": self.pgs.delta_recoveries_total,
                                   "backfill": self.pgs.backfills_total,
                                   "on_demand": self.pgs.on_demand_total,
                                   "behind_pushes": self.service.backends[
                                       "replicated"].behind_pushes_total},
                    "pgs_held": self.pgs.copies_held(),
                    "pg_states": self.pgs.states(),
                    "objects": self.pgs.object_counts(),
                    "inconsistent": self.pgs.inconsistent(),
                    "scrubs": self.scrubber.scrubs_total,
                    "degraded_reads": self.service.backends["erasure"].degraded_reads_total,
                    "avoided_reads": sum(backend.avoided_reads_total
                                         for backend in self.service.backends.values()),
                    "damaged_shards": self.service.backends["erasure"].damaged_shards_total,
                    "direct_reads": self.service.direct_reads_total,
                    "fast_ops": self.service.fast_ops,
                    "omap_reads_beside_writes": self.service.omap_reads_beside_writes,
                    "direct_plans": self.service.backends["erasure"].direct_plans_total,
                    "hedges": self._hedge_counts(),
                    "repairs": self.scrubber.repairs_total,
                    "store": store,
                    # the device's pool is the receive pool (start): the same figures
                    "receive_buffers": store["device"]["buffers"],
                    "reported": sorted(self._watch.reported)}, b""
        if op in OPS:
            audited = op in access.WRITE_OPS
            try:
                listing = access.check(peer, self.monc.map, received.header)
                header, payload = await self.service.handle(received.header, received.payload)
            except RequestFailed as exc:
                if audited or exc.code == Code.PERMISSION_DENIED:
                    self.audit_op(peer, received.header, exc.code)
                raise
            if audited:
                self.audit_op(peer, received.header, "ok")
            if listing is not None and op == "list":
                header = {**header, "names": access.visible(header["names"], listing)}
            return header, payload
        if op == "audit_read":
            since, entity = received.header.get("since"), received.header.get("entity")
            return {"events": self.audit.read(
                since if isinstance(since, (int, float)) else None,
                entity if isinstance(entity, str) else None)}, b""
        raise RequestFailed(Code.UNKNOWN_OP, f"an OSD does not serve {op!r}")

    # -- the map ----------------------------------------------------------------------------------

    def _on_map(self, cmap):
        if self.id is None or cmap is None:
            return
        self.pgs.on_map(cmap)
        if self.prober is not None:
            self.prober.set_targets(probe_targets(cmap, self.id))
        count = config.value(cmap.config, "osd.heartbeat_peers")
        peers = choose_peers(cmap, self.id, count)
        self._watch.set_peers(peers, time.monotonic_ns())

    def _capacity(self):
        """[total, used] bytes of the data area (for OSD_NEARFULL/OSD_FULL and `cairn df`)."""
        statfs = self.store.statfs()
        return [statfs["total_bytes"], statfs["used_bytes"]]

    def _hedge_counts(self):
        """Hedged reads (common/hedge.py) this OSD took part in: as a replica serving clients'
        hedged reads, as a primary confirming them (reads sent around it), and as an
        erasure-coded primary reading around late shards (by the member it read around)."""
        erasure = self.service.backends["erasure"]
        return {"replica_reads_served": self.service.hedge_reads_served,
                "replica_reads_cancelled": self.service.hedge_reads_cancelled,
                "reads_hedged_around": self.service.reads_hedged_around,
                "reads_hedged_won": self.service.reads_hedged_won,
                "reads_steered_around": self.service.reads_steered_around,
                "fast_reads": erasure.fast_reads_total,
                "shards": erasure.hedger.counts()}

    def _hedge_totals(self):
        """The heartbeat's `hedges` (mon/health.py HEDGE_FIELDS): `_hedge_counts` flat."""
        counts = self._hedge_counts()
        return {"served": counts["replica_reads_served"],
                "cancelled": counts["replica_reads_cancelled"],
                "hedged_around": counts["reads_hedged_around"],
                "hedged_won": counts["reads_hedged_won"],
                "steered_around": counts["reads_steered_around"],
                "fast_reads": counts["fast_reads"],
                **{f"shard_{what}": counts["shards"][what]
                   for what in ("sent", "won", "wasted", "steered")}}

    def _reads_around(self):
        """{osd id (str): reads sent around it since this OSD started}, for READS_HEDGED:
        clients' reads steered around this OSD (it confirmed them as their primary) and this
        OSD's erasure-coded reads that decoded around a member's late shard or steered
        around it."""
        around = collections.Counter()
        around[str(self.id)] += self.service.reads_steered_around
        for osd, counts in self.service.backends["erasure"].hedger.by_osd.items():
            around[str(osd)] += counts["won"] + counts["steered"]
        return {osd: count for osd, count in around.items() if count}

    def _interval_s(self):
        return config.value(self.monc.map.config, "osd.heartbeat_interval_s")

    async def _mon_heartbeat_loop(self):
        # Runs until stop().
        while True:
            await asyncio.sleep(self._interval_s())
            try:
                device = self.device.latency_snapshot()
                summary = latency.summarise(self._device_reported, device)
                self._device_reported = device
                complaint_s = config.value(self.monc.map.config, "osd.op_complaint_s")
                reply = await self.monc.request({"op": "osd_heartbeat", "id": self.id,
                                                 "device": summary,
                                                 "device_path": self.device_path,
                                                 "net": self.prober.report(),
                                                 "slow_ops": self.service.ops_older_than(
                                                     complaint_s),
                                                 "reads_around": self._reads_around(),
                                                 "hedges": self._hedge_totals(),
                                                 "pg_states": self.pgs.states(),
                                                 "objects": self.pgs.object_counts(),
                                                 "inconsistent": self.pgs.inconsistent(),
                                                 "recovery_bytes": self.pgs.recovery_bytes_total,
                                                 "recovering": self.pgs.throttle.recovering(),
                                                 "throughput": {
                                                     "client_in": self.service.client_bytes_in,
                                                     "client_out":
                                                         self.service.client_bytes_out,
                                                     "recovery":
                                                         self.pgs.recovery_bytes_total},
                                                 "capacity": self._capacity(),
                                                 "pools": self.pgs.pool_usage()},
                                                timeout_s=self._interval_s() * 2)
            except (MonitorsUnavailable, RequestFailed) as exc:
                log.warning("%s: heartbeat to the monitor failed: %s", self.name, exc)
                continue
            recovering = reply.header.get("recovering_osds")
            self.pgs.throttle.note_recovering(
                recovering if type(recovering) is int else 0,
                reply.header.get("recovering_counted") is True)
            if not reply.header.get("up") and not self._stopping:
                log.warning("%s: the map says we are down but we are running; booting again",
                            self.name)
                try:
                    await self._boot()
                except (MonitorsUnavailable, RequestFailed) as exc:
                    log.warning("%s: boot failed: %s", self.name, exc)

    async def _peer_ping_loop(self):
        # Runs until stop().
        while True:
            interval_s = self._interval_s()
            await asyncio.sleep(interval_s)
            peers = self._watch.peers
            for gone in [p for p in self._peer_connections.keys() if p not in peers]:
                await self._peer_connections.discard(gone)
            outcomes = await asyncio.gather(*(self._ping(peer, interval_s) for peer in peers))
            now_ns = time.monotonic_ns()
            reports = []
            for peer, (ok, refused_reason) in zip(peers, outcomes):
                if ok:
                    reports.append(self._watch.answered(peer, now_ns))
                elif refused_reason is not None:
                    reports.append(self._watch.refused(peer, refused_reason))
            grace_ns = int(config.value(self.monc.map.config, "mon.osd_grace_s") * NS_PER_S)
            reports.extend(self._watch.tick(now_ns, grace_ns))
            for report in filter(None, reports):
                await self._send_report(report)

    async def _ping(self, peer, timeout_s):
        """(answered, refused reason or None) for one ping of `peer`."""
        osd = self.monc.map.osds.get(peer)
        if osd is None or not osd["addr"]:
            return False, None
        try:
            connection = await self._peer_connections.get(peer, osd["addr"])
            await connection.request({"op": "ping", "from": self.id}, timeout_s=timeout_s)
            return True, None
        except ConnectionClosed as exc:
            refused = "refused" in str(exc).lower() or "reset" in str(exc).lower()
            return False, (str(exc) if refused else None)
        except (RequestTimeout, RequestFailed):
            return False, None

    async def _send_report(self, report):
        log.info("%s: reporting osd.%d %s (%s)", self.name, report.target,
                 "failed" if report.failed else "alive", report.reason)
        try:
            await self.monc.request({"op": "osd_failure", "reporter": self.id,
                                     "target": report.target, "failed": report.failed,
                                     "reason": report.reason})
        except (MonitorsUnavailable, RequestFailed) as exc:
            log.warning("%s: failure report not delivered: %s", self.name, exc)
