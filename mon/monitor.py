"""The monitor daemon's shell: serves the cluster map, turns requests into map changes through
the monitors' Raft log.

Everything that decides lives in pure cores: `Raft` (mon/raft.py) orders the changes among the
monitors, `ClusterMap.apply` validates and applies them, `FailureDetector` decides down and out,
`health.evaluate` judges the map. This shell feeds them requests, messages and time, and carries
out what they return in order:

    leader:   propose(ops): build Incremental(epoch + 1) -> validate -> Raft.propose
    every monitor, each Ready: persist (fsync) -> send Raft messages -> apply committed entries
              (map change -> store -> publish -> push to subscribers; PG activation records)
    leader:   the proposer's wait ends when its entry is applied -> acknowledge

so nothing acknowledged or pushed can be lost while a majority of monitors keeps its disk. Map
proposals are serialised by one lock on the leader: the map has one writer. A leader that stops
(SIGTERM) first hands the leadership to its most up-to-date member (Raft.transfer_leadership).

Where requests are answered:
- Reads of the last map are answered by any monitor from what it has applied, with or without a
  quorum (hello, get_map, subscribe, pool_ls, config_get, osd_tree): clients keep working while
  the monitors elect.
- Everything that changes state or must see the newest state goes to the leader
  (`LEADER_OPS`): a follower forwards it and relays the answer; without a leader for
  `LEADER_WAIT_S` the answer is the error `no_quorum`. `pg_last_active` is a linearizable read
  (Raft read-index): peering must never see a stale activation record.
- `status` is the leader's view (quorum, leader, each monitor's log position); without a leader
  a monitor answers with its own view and the check MON_NO_QUORUM.

Requests (frame header `op`; replies are headers, maps travel as msgpack payloads):
    hello                                 -> fsid, epoch, name
    get_map {have}                        -> epoch, leader, form (current|incrementals|full)
                                             + payload
    subscribe {have}                      -> as get_map; later epochs are pushed (op "map")
    osd_boot {uuid, location, weight, addr, [id]} -> id, epoch
    osd_heartbeat {id}                    -> epoch, up
    osd_failure {reporter, target, failed}
    osd_stop {id}                         -> marks it down (a clean shutdown)
    status [local]                        -> the leader's view (local: this monitor's own)
    health                                -> {status, checks} (the `cairn health` contract)
    health_history {limit}                -> events (newest last), kept: the raises and clears
    df                                    -> raw, osds, pools, ratios (mon/capacity.py)
    pool_set_quota {name, [max_objects], [max_bytes]}
    pool_allow_from {name, [prefix], networks}   ([]: remove the prefix's allowlist)
    pool_fast_read {name, fast_read}      (an erasure pool's reads ask every member)
    osd_tree, pool_ls, osd_perf           -> views for the CLI
    throughput                            -> the last hour's cluster throughput (the console)
    console_login                         -> {url, login_url}: a one-time link to this
                                             monitor's console for the caller (mon/console.py)
    osd_mark {id, state: out|in|down|reweight|weight, [reweight], [weight]}, pool_create {...},
    pool_delete {name},
    config_set {key, value}, config_get {key}
    pg_last_active {pool, pg}             -> record [epoch, acting, complete] or None
    pg_set_active {pool, pg, epoch, acting, complete}  (committed before the reply; peering.py)
    mon_add {name, addr}, mon_remove {name} -> members (one monitor at a time)
    raft {from, addr, fsid} + payload     -> Raft messages between monitors

Any request may carry `rid`, the client's id for it (MonClient sends one): a map change re-sent
with the same rid after its reply was lost (the monitor died, the leader moved) is answered
with its first outcome instead of being done twice (mon/store.py keeps the outcomes in the
replicated state); so is a membership change (the request id travels in its Raft entry).
Adding a monitor that is already a member at the same address answers as if it had just been
added.
"""

import asyncio
import collections
import logging
import random
import time

import msgpack

from cairn.common import audit, config, messenger, server, sessions, tls
from cairn.common.clustermap import Incremental, MapError
from cairn.common.codes import Code
from cairn.common.daemon import crash_on_error
from cairn.common.frame import Frame, Kind
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.mon import (admin_requests, alerts, authority, capacity, console, health,
                       osd_requests, peerguard, raft, raft_transport, slowdisk, views)
from cairn.mon.failure import FailureDetector
from cairn.mon.throughput import ThroughputHistory
from cairn.mon.raft import NotLeader, Raft, RaftConfig, RaftError, Role
from cairn.mon.store import MonStore

log = logging.getLogger("cairn.mon")

# How often the failure detector runs. A tenth of the smallest grace keeps detection within 5%.
TICK_S = 0.1
# One Raft tick. With 15 ticks to an election (1.5-3 s randomised) a dead leader is replaced
# within about 3 s, the bound being 5 s for a map change; heartbeats go every tick.
# etcd defaults to 100 ms heartbeats and 1 s elections; ours is longer because these machines
# are shared and a Python daemon can stall for a few hundred ms under load.
RAFT_TICK_S = 0.1
# How often the leader looks for health changes to record and push to the webhooks.
ALERT_INTERVAL_S = 1.0
# A new leader's heartbeat-fed checks (SLOW_DISK, SLOW_OPS, NETWORK_*) need the OSDs' reports
# (every 2 s) over the slow-disk detector's sustain time (6 s) before they mean anything.
LEADER_SETTLE_S = 12.0
# How often the leader brings the full, quota and slow flags in line with the OSDs' reports.
CAPACITY_INTERVAL_S = 1.0
RAFT_CONFIG = RaftConfig(election_ticks=15, heartbeat_ticks=1)
# A request waits this long for a leader before the answer is no_quorum: one election.
LEADER_WAIT_S = 4.0
# A proposal not committed within this is answered no_quorum (it may still commit later).
COMMIT_TIMEOUT_S = 5.0
# A forwarded request includes the leader's commit wait.
FORWARD_TIMEOUT_S = COMMIT_TIMEOUT_S + 3.0
# A stopping leader waits this long for the member it hands over to to take the leadership.
HAND_OVER_WAIT_S = 1.0
RAFT_CONNECT_TIMEOUT_S = 1.0
# Snapshot the state machine every this many applied entries and keep as many entries before
# it, so a monitor a little behind catches up from the log (etcd: 10,000 and 5,000; our entries
# are map changes, a few per minute in a steady cluster).
COMPACT_EVERY_ENTRIES = 512
ENTRIES_KEPT = 512
# A member heard from within this counts as in the quorum in status.
PEER_SEEN_S = 3.0
RID_BYTES_MAX = 64
assert FORWARD_TIMEOUT_S > COMMIT_TIMEOUT_S

LEADER_OPS = {"osd_boot", "osd_heartbeat", "osd_failure", "osd_stop", "osd_mark", "pool_create",
              "pool_delete", "config_set", "pg_last_active", "pg_set_active", "mon_add",
              "mon_remove", "peer_invalid_report", "status", "health", "health_history", "df",
              "pool_set_quota", "pool_allow_from", "pool_fast_read", "auth_change",
              "osd_perf", "throughput"}


def no_quorum(message):
    return RequestFailed(Code.NO_QUORUM, f"no quorum: {message}")


class Monitor:

    def __init__(self, directory, bind_addr, name="mon.0", tls_dir=None):
        self.directory = directory
        # With --tls DIR it serves TLS and speaks it to the other monitors (common/tls.py).
        self.tls_server, tls_client = tls.daemon_contexts(tls_dir)
        self.bind_addr = bind_addr
        self.name = name
        self.addr = None
        self.store = None
        self.map = None
        self.raft = None
        self.removed = asyncio.Event()      # set once a committed change removed this monitor
        self._applied = 0
        self._detector = None
        self._server = None
        self._lock = asyncio.Lock()
        self._subscribers = set()
        self._health_cache = (None, None)
        self._pg_states = {}                # osd id -> {state: PGs it is primary of}
        self._objects = {}                  # osd id -> {total, degraded, misplaced} copies
        self._inconsistent = {}             # osd id -> PGs ("POOL.PG") it found damaged
        self._recovery = {}                 # osd id -> deque of (when, recovery bytes total)
        self._recovering = {}               # osd id -> when it last said it recovers
        self._throughput = ThroughputHistory()  # the last hour, for the console
        self.console = None                 # mon/console.py, when it serves one
        self._slow = slowdisk.SlowDiskDetector()
        self._slow_found = {}               # osd id -> slowdisk.Finding, judged once a second
        self._slow_judged_at = 0.0
        self._slow_ops = {}                 # osd id -> client ops older than the complaint time
        self._around = {}                   # osd id -> its last (when, {osd id: reads sent
        #                                     around that OSD}) reports (READS_HEDGED)
        self._hedges = {}                   # osd id -> its hedge counters (`cairn osd perf`)
        self._device_paths = {}             # osd id -> its device, as it reports it
        self._net = {}                      # osd id -> its probe report (mon/netloss.py)
        self._capacity = {}                 # osd id -> (total, used) bytes (mon/capacity.py)
        self._pool_use = {}                 # osd id -> {pool id: (objects, bytes)} it serves
        self._reported_at = {}              # osd id -> monotonic time of its last heartbeat
        self._capacity_judged_at = 0.0
        self._check_since = {}              # health check -> wall time this leader first saw it
        self._alerter = alerts.Alerter()
        self._alerted = None                # the checks the alert loop last saw (leader only)
        self._leading_since = None          # monotonic time this leadership began
        self._tasks = []
        self._wake = asyncio.Event()
        self._waiting = {}                  # log index -> (term, future): proposals
        self._reads = {}                    # read context -> future: read-index rounds
        self._read_contexts = 0
        self._applied_changed = asyncio.Condition()
        self._persisting = None             # the Raft write in flight (an executor future)
        self._leader_changed = asyncio.Condition()
        self._last_leader = None
        self._leading = None                # the term this monitor led in, as the loop last saw
        self._outbox = {}                   # monitor name -> deque of Raft messages
        self._outbox_ready = {}             # monitor name -> Event
        self._learned_addrs = {}            # monitor name -> address it sent from
        self._seen = {}                     # monitor name -> monotonic time last heard
        self._peers = messenger.ConnectionPool(connect_timeout_s=RAFT_CONNECT_TIMEOUT_S,
                                               tls=tls_client)
        self._was_member = False
        self._audit_queue = collections.deque()     # audit events not yet committed
        self._peer_findings = peerguard.Findings()  # raft messages refused (MON_PEER_INVALID)
        self.audit_dropped_total = 0

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self):
        self.store = MonStore.open(self.directory)
        self.map = self.store.load()
        restored = self.store.restored()
        self._applied = restored.applied
        self.raft = Raft(self.name, restored, random.Random(), RAFT_CONFIG)
        self._was_member = self.name in self.raft.members
        self._detector = FailureDetector(time.monotonic_ns())
        self._detector.observe(self.map, time.monotonic_ns())
        authenticating = self.store.auth_mode != "none"
        if authenticating:
            self._peers.authenticate = sessions.monitor_handshake(
                "mon.", self.store.auth["mon."][0])
        guard = sessions.MonGuard(self._auth_lookup, authenticating,
                                  lambda: authority.ticket_ttl_s(self.map))
        self._server = await server.serve(self.bind_addr, self.handle,
                                             on_close=self._subscribers.discard, guard=guard,
                                             tls=self.tls_server)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.addr = f"{host}:{port}"
        if set(self.raft.members) == {self.name}:
            self.raft.campaign()                    # alone: no one to wait for
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._raft_loop(), name="raft loop"),
                       loop.create_task(self._tick_loop(), name="failure detector"),
                       loop.create_task(self._alert_loop(), name="alerts"),
                       loop.create_task(self._audit_loop(), name="audit"),
                       loop.create_task(raft_transport.peer_report_loop(self), name="peer reports")]
        for task in self._tasks:
            task.add_done_callback(crash_on_error)
        log.info("%s serving %s: fsid %s, epoch %d, %d OSDs, %d pools; raft term %d, log %d, "
                 "applied %d, members %s", self.name, self.addr, self.map.fsid, self.map.epoch,
                 len(self.map.osds), len(self.map.pools), self.raft.term, self.raft.last_index,
                 self._applied, ", ".join(sorted(self.raft.members)) or "none yet (joining)")

    async def stop(self):
        if self._tasks:
            await self._hand_over()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._persisting is not None:
            await asyncio.gather(self._persisting, return_exceptions=True)
        await self._alerter.close()
        await self._peers.close()
        if self._server is not None:
            self._server.close()
            for peer in list(self._subscribers):
                peer.close()
            await self._server.wait_closed()
        async with self._lock:                    # no store write in flight
            if self.store is not None:
                self.store.close()
                self.store = None

    async def _hand_over(self):
        """A leader that stops hands the leadership to the most up-to-date member it heard
        lately, so the others need not wait out an election timeout (1.5-3 s)."""
        heard = [name for name in self._heard() if name in self.raft.progress]
        if not self.is_leader or not heard:
            return
        target = max(heard, key=lambda name: (self.raft.progress[name].match, name))
        try:
            self.raft.transfer_leadership(target)
        except RaftError as exc:
            log.info("%s stops without handing over: %s", self.name, exc)
            return
        self._wake.set()
        try:
            async with asyncio.timeout(HAND_OVER_WAIT_S):
                async with self._leader_changed:
                    await self._leader_changed.wait_for(lambda: not self.is_leader)
            log.info("%s handed the leadership to %s before stopping", self.name, target)
        except TimeoutError:
            log.info("%s stops while still leading: %s did not take over within %g s",
                     self.name, target, HAND_OVER_WAIT_S)

    async def _tick_loop(self):
        # Runs until the monitor stops. Only the leader detects failures: it alone proposes.
        while True:
            await asyncio.sleep(TICK_S)
            if not self._leads_noticed() or self._applied < self.raft.commit:
                continue
            try:
                await authority.rotate_service_keys(self)
            except RequestFailed as exc:
                log.error("service key rotation failed: %s", exc)
            if not self._leads_noticed():
                continue
            ops = self._detector.tick(self.map, time.monotonic_ns())
            if ops:
                try:
                    await self.propose(ops, why="failure detector")
                except RequestFailed as exc:
                    log.error("failure detector's change %s refused: %s", ops, exc)
            if time.monotonic() - self._capacity_judged_at >= CAPACITY_INTERVAL_S:
                self._capacity_judged_at = time.monotonic()
                ops = capacity.flag_ops(self.map, self._capacity, views.pool_totals(self),
                                        views.ratios(self), views.pools_known(self))
                if self._settled():
                    ops += health.slow_flag_ops(self.map, self._slow_found)
                if ops:
                    try:
                        await self.propose(ops, why="capacity")
                    except RequestFailed as exc:
                        log.error("capacity change %s refused: %s", ops, exc)

    def _auth_lookup(self, entity):
        return self.store.auth.get(entity)

    async def _alert_loop(self):
        # Runs until the monitor stops: the leader records health changes in the history and
        # pushes them to the webhooks.
        while True:
            await asyncio.sleep(ALERT_INTERVAL_S)
            if not self.is_leader:
                self._alerted = None
                self._alerter.set_urls([])
                continue
            if self._applied < self.raft.commit:
                continue                    # not caught up yet: judge from the applied map
            if self._alerted is None:
                if not self._settled():
                    continue
                self._alerted = alerts.in_force(self.store.events())
                for name, check in self._alerted.items():
                    self._check_since[name] = check["since"]
            urls = config.value(self.map.config, "alert.webhooks")
            self._alerter.set_urls(urls)
            checks = views.health_report(self, views.mons_view(self))["checks"]
            events = alerts.changes(self._alerted, checks, self.map.fsid, alerts.now_s())
            self._alerted = checks
            if not events:
                continue
            for event in events:
                log.info("health: %s %s: %s", event["check"], event["state"], event["summary"])
            self._alerter.push(events)
            try:
                await self._replicate({"t": "hist", "events": events})
            except RequestFailed as exc:
                log.warning("health history: %d events not recorded: %s", len(events), exc)

    def _settled(self):
        """This monitor has led for LEADER_SETTLE_S: the OSDs' reports have reached it, so
        what it judges from them (SLOW_DISK, ...) is not just missing data."""
        return self._leading_since is not None and \
            time.monotonic() - self._leading_since >= LEADER_SETTLE_S

    @property
    def is_leader(self):
        return self.raft is not None and self.raft.role is Role.LEADER

    def _leads_noticed(self):
        """Leader, and the Raft loop has carried out the change (`_leadership_changed`): the
        core turns leader inside tick() or step(), but the loop notices only after carrying out
        that Ready (a disk write), and until then the failure detector is the one from before,
        which heard no heartbeats and would mark every OSD down."""
        return self.is_leader and self._leading == self.raft.term

    # -- Raft: the loop that carries out Readies ---------------------------------------------------

    async def _raft_loop(self):
        # Runs until the monitor stops: ticks the core, and carries out each Ready in order.
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + RAFT_TICK_S
        while True:
            try:
                async with asyncio.timeout(max(0.0, next_tick - loop.time())):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if loop.time() >= next_tick:
                self.raft.tick()
                # A stalled loop skips ticks rather than firing a burst of them.
                next_tick = max(next_tick + RAFT_TICK_S, loop.time())
            await self._carry_out(self.raft.ready())
            # Roles change in tick() and in step() (a Raft message): compare with what this
            # loop saw last, the term included (a monitor may lose and regain it in between).
            leading = self.raft.term if self.is_leader else None
            if leading != self._leading:
                self._leading = leading
                self._leadership_changed()
            if self.raft.leader != self._last_leader:
                self._last_leader = self.raft.leader
                async with self._leader_changed:
                    self._leader_changed.notify_all()

    async def _carry_out(self, ready):
        if not ready:
            return
        if ready.hard_state or ready.entries_from is not None or ready.snapshot or \
                ready.compacted_to:
            # Shielded: a stop cancels this loop, never a write half-way; stop() waits for it.
            self._persisting = asyncio.get_running_loop().run_in_executor(
                None, self.store.persist, ready)
            new_map = await asyncio.shield(self._persisting)
            if ready.install:
                self._installed(ready.snapshot, new_map)
        for m in ready.messages:
            raft_transport.send(self, m)
        for entry in ready.committed:
            self._apply(entry)
        for context, index in ready.read_states:
            future = self._reads.pop(context, None)
            if future is not None and not future.done():
                future.set_result(index)
        if ready.committed or ready.install:
            async with self._applied_changed:
                self._applied_changed.notify_all()
        if self._applied - self.raft.snapshot.index >= COMPACT_EVERY_ENTRIES:
            self.raft.compact(self._applied, self.store.state(self.map), ENTRIES_KEPT)
            self._wake.set()

    def _leadership_changed(self):
        if self.is_leader:
            log.info("%s leads (term %d, members %s%s)", self.name, self.raft.term,
                     ", ".join(sorted(self.raft.members)),
                     f"; handed over by {self.raft.handed_over_by}"
                     if self.raft.handed_over_by else "")
            # Heartbeats went to the old leader: every up OSD gets a fresh grace from now.
            self._leading_since = time.monotonic()
            self._detector = FailureDetector(time.monotonic_ns())
            self._detector.observe(self.map, time.monotonic_ns())
        else:
            self._leading_since = None
            log.info("%s no longer leads (term %d, leader %s)", self.name, self.raft.term,
                     self.raft.leader)
            for future in self._reads.values():
                if not future.done():
                    future.set_exception(no_quorum(f"{self.name} lost the leadership"))
            self._reads.clear()

    def _apply(self, entry):
        assert entry.index == self._applied + 1, (entry.index, self._applied)
        result = None
        if entry.kind == raft.DATA:
            command = msgpack.unpackb(entry.data, strict_map_key=False)
            kind = command.get("t")
            if kind == "map":
                result = self._apply_map(entry.index, command)
            elif kind == "pgact":
                result = self._apply_pg_active(entry.index, command)
            elif kind == "hist":
                self.store.apply_history(entry.index, command["events"])
            elif kind == "audit":
                self.store.apply_audit(entry.index, command["events"])
            elif kind == "auth":
                rid = command.get("rid")
                if rid is not None and rid in self.store.requests:
                    self.store.apply_nothing(entry.index)
                else:
                    self.store.apply_auth(entry.index, command, rid)
            else:
                log.error("entry %d: unknown command %r; skipped", entry.index, kind)
                self.store.apply_nothing(entry.index)
        elif entry.kind == raft.CONF:
            rid = entry.context
            self.store.apply_nothing(entry.index, None if rid is None or
                                     rid in self.store.requests else
                                     (rid, {"members": sorted(entry.data)}))
            self._apply_members(entry)
        else:
            self.store.apply_nothing(entry.index)
        self._applied = entry.index
        waiter = self._waiting.pop(entry.index, None)
        if waiter is not None:
            term, future = waiter
            if future.done():
                pass
            elif entry.term != term:
                future.set_exception(no_quorum("the leader changed before the change was "
                                               "committed; it was not applied"))
            else:
                future.set_result(result)

    def _apply_map(self, index, command):
        rid = command.get("rid")
        if rid is not None and rid in self.store.requests:
            # The same request committed twice (re-sent after the leader moved): once counts.
            log.info("entry %d: request %s was done by entry %d; not applied again", index, rid,
                     self.store.requests[rid][0])
            self.store.apply_nothing(index)
            return self._outcome(rid)
        incremental = Incremental.from_dict(command["inc"])
        refused = None
        if incremental.epoch != self.map.epoch + 1:
            log.error("entry %d: epoch %d does not follow %d; skipped", index, incremental.epoch,
                      self.map.epoch)
            refused = RequestFailed(Code.STALE, f"epoch {incremental.epoch} does not follow "
                                    f"{self.map.epoch}")
        else:
            try:
                new_map = self.map.apply(incremental)
            except MapError as exc:
                refused = RequestFailed(Code.INVALID, str(exc))
        if refused is not None:
            self.store.apply_nothing(index, None if rid is None else
                                     (rid, {"error": refused.code, "message": refused.message}))
            return refused
        self.store.apply_map(index, incremental, new_map, rid)
        self._publish(new_map, "incrementals", msgpack.packb([incremental.to_dict()]))
        log.info("epoch %d (%s): %s", new_map.epoch, command.get("why", "?"),
                 _describe(incremental.ops))
        return new_map

    def _outcome(self, rid):
        """What a request done before answers again: the map now (at or after the epoch its
        change made), or its refusal."""
        _, outcome = self.store.requests[rid]
        if "error" in outcome:
            return RequestFailed(outcome["error"], outcome["message"])
        return self.map

    def _apply_pg_active(self, index, command):
        pool_id, pg_index, epoch = command["pool"], command["pg"], command["epoch"]
        current = self.store.pg_active(pool_id, pg_index)
        if current is not None and current[0] > epoch:
            self.store.apply_nothing(index)
            return RequestFailed(Code.STALE, f"pg {pool_id}.{pg_index:x} went active at epoch "
                                 f"{current[0]}, after {epoch}")
        self.store.apply_pg_active(index, pool_id, pg_index,
                                   [epoch, command["acting"], command["complete"]])
        return None

    def _apply_members(self, entry):
        members = entry.data
        log.info("monitors now %s (log index %d)", ", ".join(sorted(members)), entry.index)
        if self.name in members:
            self._was_member = True
        elif self._was_member and not self.removed.is_set():
            log.warning("%s was removed from the monitors", self.name)
            self.removed.set()

    def _installed(self, snapshot, new_map):
        log.info("installed a snapshot from %s: log index %d, epoch %d", self.raft.leader,
                 snapshot.index, new_map.epoch)
        self._applied = snapshot.index
        self._publish(new_map, "full", msgpack.packb(new_map.to_dict()))

    def _publish(self, new_map, form, payload):
        self.map = new_map
        if self.is_leader:
            self._detector.observe(new_map, time.monotonic_ns())
        for peer in list(self._subscribers):
            peer.push({"op": "map", "epoch": new_map.epoch, "form": form}, payload)

    # -- Raft: messages between monitors ------------------------------------------------------------

    # -- Raft: proposals and reads ------------------------------------------------------------------

    async def _wait_applied(self, index):
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                async with self._applied_changed:
                    await self._applied_changed.wait_for(lambda: self._applied >= index)
        except TimeoutError:
            raise no_quorum(f"{self.name} has not applied log index {index} within "
                            f"{COMMIT_TIMEOUT_S:g} s") from None

    async def _replicate(self, command):
        """Commit `command` through Raft; its result once applied here (the leader)."""
        try:
            index = self.raft.propose(msgpack.packb(command))
        except NotLeader:
            raise no_quorum(f"{self.name} is no longer the leader; retry") from None
        return await self._committed(index)

    async def _committed(self, index):
        future = asyncio.get_running_loop().create_future()
        self._waiting[index] = (self.raft.term, future)
        self._wake.set()
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                result = await future
        except TimeoutError:
            raise no_quorum(f"the change (log index {index}) was not committed within "
                            f"{COMMIT_TIMEOUT_S:g} s and may or may not take effect; monitors "
                            f"heard from: {', '.join(self._heard()) or 'none'}") from None
        finally:
            self._waiting.pop(index, None)
        if isinstance(result, RequestFailed):
            raise result
        return result

    async def _read_barrier(self):
        """Wait until this leader has applied everything committed before now (read-index)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMIT_TIMEOUT_S
        self._read_contexts += 1
        context = self._read_contexts
        while True:
            try:
                self.raft.read_index(context)
                break
            except NotLeader:
                raise no_quorum(f"{self.name} is no longer the leader; retry") from None
            except RaftError:                  # the leader's first entry is not committed yet
                if loop.time() >= deadline:
                    raise no_quorum("the new leader could not commit its first entry") from None
                await asyncio.sleep(0.02)
        future = loop.create_future()
        self._reads[context] = future
        self._wake.set()
        try:
            async with asyncio.timeout(max(0.1, deadline - loop.time())):
                index = await future
        except TimeoutError:
            raise no_quorum("the leader could not confirm its leadership with a majority") \
                from None
        finally:
            self._reads.pop(context, None)
        await self._wait_applied(index)

    def _heard(self):
        now = time.monotonic()
        return sorted(name for name in self.raft.members
                      if name == self.name or now - self._seen.get(name, -1e9) <= PEER_SEEN_S)

    # -- the one writer ---------------------------------------------------------------------------

    async def propose(self, ops, why, rid=None):
        """Commit `ops` as the next epoch through Raft; the new map. RequestFailed if refused
        or without a quorum. Only on the leader.

        `rid` is the client's request id: a request already done (its reply lost, then
        re-sent, perhaps to another monitor) is answered with its first outcome, not applied
        again. Waiting until everything in this leader's log is applied first makes that
        exact: an entry of an earlier term is either applied by then, or gone for good."""
        async with self._lock:
            if not self.is_leader:
                raise no_quorum(f"{self.name} is not the leader; retry")
            await self._wait_applied(self.raft.last_index)     # the map is the newest
            if rid is not None and rid in self.store.requests:
                result = self._outcome(rid)
                if isinstance(result, RequestFailed):
                    raise result
                return result
            incremental = Incremental(self.map.epoch + 1, tuple(ops))
            try:
                self.map.apply(incremental)
            except MapError as exc:
                raise RequestFailed(Code.INVALID, str(exc)) from None
            command = {"t": "map", "inc": incremental.to_dict(), "why": why}
            if rid is not None:
                command["rid"] = rid
            return await self._replicate(command)

    # -- requests ---------------------------------------------------------------------------------

    async def handle(self, peer, received):
        op = received.header.get("op")
        if op == "raft":
            authority.check(peer, op, received.header)
            return raft_transport.on_raft(self, received)
        handler = _REQUESTS.get(op)
        if handler is None:
            raise RequestFailed(Code.UNKNOWN_OP, f"unknown request {op!r} (known: "
                                f"{', '.join(sorted(_REQUESTS))})")
        audited = op in authority.AUDITED_OPS and peer is not None and peer.entity != "mon."
        try:
            authority.check(peer, op, received.header)
            result = await self._handle(peer, received, op, handler)
        except RequestFailed as exc:
            if audited or exc.code == Code.PERMISSION_DENIED:
                self._audit(peer, op, received.header, exc.code)
            raise
        if audited:
            self._audit(peer, op, received.header, "ok")
        return result

    def _audit(self, peer, op, header, result):
        """Queue an audit event for Raft (mon/authority.py); the audit loop commits it."""
        self.queue_audit(audit.event(peer.entity if peer else None, peer.addr if peer else None,
                                     op, authority.target_of(header), result))

    def queue_audit(self, found):
        if len(self._audit_queue) >= authority.AUDIT_QUEUED_MAX:
            self._audit_queue.popleft()
            self.audit_dropped_total += 1
        self._audit_queue.append(found)

    async def _audit_loop(self):
        # Runs until the monitor stops: queued audit events go into the replicated log.
        while True:
            await asyncio.sleep(audit.FLUSH_INTERVAL_S)
            if not self._audit_queue:
                continue
            events = list(self._audit_queue)
            header = {"op": "audit_append", "events": events}
            try:
                if self.is_leader:
                    await self._replicate({"t": "audit", "events": events})
                else:
                    await self._forward(Frame(Kind.REQUEST, 0, header, b""))
            except (RequestFailed, ConnectionClosed, RequestTimeout) as exc:
                log.warning("audit: %d events not committed yet: %s", len(events), exc)
                continue
            for _ in events:
                self._audit_queue.popleft()

    async def _handle(self, peer, received, op, handler):
        rid = received.header.get("rid")
        if rid is not None and not (isinstance(rid, str) and 0 < len(rid) <= RID_BYTES_MAX):
            raise RequestFailed(Code.INVALID, f"rid (request id) must be a string of 1 to "
                                f"{RID_BYTES_MAX} characters")
        local = op == "status" and received.header.get("local") is True     # its own view
        if op in LEADER_OPS and not self.is_leader and not local:
            try:
                return await self._forward(received)
            except RequestFailed as exc:
                if op != "status" or exc.code != Code.NO_QUORUM:
                    raise
                return await admin_requests.status(self, peer, received.header)  # its own view
        return await handler(self, peer, received.header)

    async def _forward(self, received):
        """Relay a request to the leader; its answer."""
        header = received.header
        if header.get("forwarded"):
            raise no_quorum(f"{header['forwarded']} forwarded to {self.name}, which does not "
                            f"lead; retry")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEADER_WAIT_S
        while True:
            if self.is_leader:
                return await _REQUESTS[header["op"]](self, None, header)
            leader = self.raft.leader
            addr = raft_transport.addr_of(self, leader) if leader is not None else None
            if addr is not None:
                reply = await self._forward_to(leader, addr, received)
                if reply is not None:
                    return reply
            if loop.time() >= deadline:
                raise no_quorum(f"{self.name} knows no leader (members "
                                f"{', '.join(sorted(self.raft.members)) or 'unknown'}; heard "
                                f"from {', '.join(self._heard()) or 'none'}); map changes wait "
                                f"for a majority of monitors")
            await asyncio.sleep(0.05)

    async def _forward_to(self, leader, addr, received):
        """The leader's answer, or None when it could not be had: the connection failed, or
        another monitor became leader meanwhile (a leader cut off from us cannot commit, so
        asking the new one is safe; a change the old one did commit is refused as a
        duplicate or repeated harmlessly)."""
        header = {**received.header, "forwarded": self.name}
        key = ("forward", leader)
        try:
            connection = await self._peers.get(key, addr)
        except ConnectionClosed as exc:
            log.info("forwarding %s to %s: %s", header.get("op"), leader, exc)
            return None
        request = asyncio.ensure_future(connection.request(
            header, bytes(received.payload), timeout_s=FORWARD_TIMEOUT_S))

        async def leader_moves():
            async with self._leader_changed:
                await self._leader_changed.wait_for(lambda: self.raft.leader != leader)

        moved = asyncio.ensure_future(leader_moves())
        try:
            await asyncio.wait([request, moved], return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
        if not request.done():
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            log.info("forwarding %s: the leader moved from %s to %s", header.get("op"),
                     leader, self.raft.leader)
            return None
        try:
            reply = request.result()
        except (ConnectionClosed, RequestTimeout) as exc:
            log.info("forwarding %s to %s: %s", header.get("op"), leader, exc)
            await self._peers.discard(key)
            return None
        return dict(reply.header), bytes(reply.payload)


# Every request a monitor answers, by op: handler(monitor, peer, header) -> (reply, payload).
_REQUESTS = {
    **osd_requests.REQUESTS,
    **admin_requests.REQUESTS,
    **authority.REQUESTS,
    **console.REQUESTS,
    "peer_invalid_report": raft_transport.peer_invalid_report,
}
assert LEADER_OPS <= set(_REQUESTS)


def _describe(ops):
    parts = []
    for op in ops:
        fields = " ".join(f"{k}={v}" for k, v in op.items() if k != "op")
        parts.append(f"{op['op']} {fields}".strip())
    return "; ".join(parts)
