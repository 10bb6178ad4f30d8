"""The OSD's placement groups: intervals, PG logs, peering and recovery (the shell around
osd/peering.py).

On every new map the registry recomputes the acting set of every PG of every pool. A PG whose
acting set or primary changed starts a new interval: if this OSD is its primary, a peering task
runs the `Peering` core (query members, pick the authority, recover members by comparing object
versions, record the activation at the monitor) and the PG serves writes only once ACTIVE. A
queried OSD raises the PG's `min_epoch`, refusing replicated writes from older epochs.

Each PG keeps a log: an empty object per write in `pglog.POOL.PG`, named by version, so the
highest version an OSD applied (deletes included) survives restarts. The newest LOG_ENTRIES_KEPT
are kept. An entry written while the OSD was a complete member carries the flag `c`: the OSD
then held every acknowledged write up to that version (its *complete_to*). Entries without it
(a member still being recovered) say only that this one write was applied. Recovery by log
syncs the source's entries after the target's complete_to that the target lacks, so a member
whose backfill was interrupted (many newer entries, a gap below them) is never taken for
complete.

A primary whose authority is another acting member serves at once with a *missing set*: the
objects whose version differs from the authority's. A client read of a missing object recovers
it first (ahead of the throttle); writes and deletes settle it; listings merge it in; the rest
is recovered in the background.

An OSD holding a copy of a PG it is no longer a member of (a *stray*) asks the PG's primary
from time to time; once the PG is clean, recorded as such at the monitor, it deletes the copy.
"""

import asyncio
import collections
import contextlib
import logging
import time

from cairn.common import config, throttle
from cairn.common.codes import Code
from cairn.common.daemon import crash_on_error
from cairn.common.keylocks import KeyLocks
from cairn.common import pg as pgs
from cairn.common.messenger import RequestFailed
from cairn.common.monclient import MonitorsUnavailable
from cairn.osd import peering
from cairn.osd.pg import Phase, PgCore, Role, backfill_names, delta_names, hash_order
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")

# How long a client op waits for its PG to finish peering before answering `again`.
ACTIVE_WAIT_S_MAX = 5.0
# Pause before peering again after a failure (an OSD that did not answer, a refused record).
PEERING_RETRY_S = 1.0
RECOVERY_LIST_PAGE = 1000
# Tries of one member's background recovery before it is left incomplete until the map changes.
RECOVERY_ATTEMPTS_MAX = 5
# How often a stray copy asks its PG's primary whether the PG is clean (then it is deleted).
STRAY_CHECK_S = 5.0
STRAY_DELETE_BATCH = 256
INCONSISTENT_REPORTED_MAX = 64


class Pg:
    """One PG on this OSD: its pure core (`core`, osd/pg.py: every decision and every field
    the decisions read), its pool kind's backend (`backend`: the layout, osd/backend*.py;
    None only for a copy found in the store before the first map names its pool), the PG's
    one table of object locks (by object name: client writes
    and reads, recovery and rollbacks of an object take it), the event client ops wait on
    until the PG is active, the primary's peering task, and the scrub clock. The shell never
    assigns a core field: it tells the core what happened (`core.applied`, ...)."""

    def __init__(self, key, me, backend):
        self.core = PgCore(key, me)
        self.backend = backend                          # its pool kind's (osd/backend*.py)
        self.key = key                                  # (pool id, pg index)
        self.collection = self.core.collection
        self.log_collection = self.core.log_collection
        self.stash_collection = self.core.stash_collection
        self.active = asyncio.Event()
        self.task = None
        self.locks = KeyLocks()
        # name -> (keys it changes, the object's version before it) of the omap update
        # holding that object's lock now: reads of other keys need not wait for it.
        self.omap_writing = {}
        # A PG's first background scrub comes one interval after the OSD saw it.
        self.last_scrub = self.last_deep_scrub = time.monotonic()

    @contextlib.asynccontextmanager
    async def object_lock(self, name, really=True):
        """Hold the object's lock if `really`."""
        if not really:
            yield
            return
        await self.locks.acquire(name)
        try:
            yield
        finally:
            self.locks.release(name)


class RecoveryThrottle:
    """Recovery traffic within the budget in force (common/throttle.py): bytes per second
    through a token bucket, and at most max_active PGs recovering at once. Both follow the
    cluster config and the local time at every call, so a change applies within seconds.

    A cluster-wide budget is split among the OSDs recovering now: each heartbeat says whether
    this OSD recovers (`recovering`) and the leader answers how many do (`note_recovering`).
    Until an answer counted this OSD among them (it has just started, or the monitors are
    silent), its share is the cluster's budget over every up OSD: a cluster whose OSDs all
    start recovering at once never overshoots while the answers come in."""

    def __init__(self, port):
        self.port = port
        self.bucket = throttle.TokenBucket(0, time.monotonic())
        self.active = 0
        self._changed = asyncio.Condition()
        self._parsed = (None, None)                     # (epoch, windows)
        self._recovering = None                 # (OSDs recovering, when told), counting us
        self._took_at = None                    # monotonic time of the last `take`

    def budget(self):
        cmap = self.port.map
        if self._parsed[0] != cmap.epoch:
            self._parsed = (cmap.epoch, config.value(cmap.config, "recovery.windows"))
        now = time.localtime()
        return throttle.budget(self._parsed[1],
                               config.value(cmap.config, "recovery.max_bytes_per_s"),
                               config.value(cmap.config, "recovery.max_active"),
                               now.tm_wday, now.tm_hour * 60 + now.tm_min,
                               config.value(cmap.config, "recovery.cluster_max_bytes_per_s"))

    def recovering(self):
        """Whether this OSD recovers now (for its heartbeat): it holds a recovery slot, or
        sent recovery bytes within two heartbeat intervals (between two PGs it holds none,
        and a heartbeat then must not hand its share to the others)."""
        if self.active > 0:
            return True
        interval_s = config.value(self.port.map.config, "osd.heartbeat_interval_s")
        return self._took_at is not None and time.monotonic() - self._took_at < 2 * interval_s

    def note_recovering(self, count, counted):
        """The leader's answer to a heartbeat: `count` OSDs recover now, this one among them
        if `counted`."""
        self._recovering = (count, time.monotonic()) if counted and count > 0 else None

    def rate(self):
        """Bytes per second this OSD may recover now (0: unlimited)."""
        in_force = self.budget()
        cluster = in_force.cluster_max_bytes_per_s
        if cluster <= 0:
            return in_force.max_bytes_per_s
        cmap = self.port.map
        fresh_s = 3 * config.value(cmap.config, "osd.heartbeat_interval_s")
        if self._recovering is not None and time.monotonic() - self._recovering[1] <= fresh_s:
            sharing = self._recovering[0]
        else:
            sharing = sum(1 for osd in cmap.osds.values() if osd["up"] and osd["in"])
        return throttle.effective_rate(in_force.max_bytes_per_s,
                                       throttle.cluster_share(cluster, sharing))

    async def take(self, size_bytes):
        """Wait until `size_bytes` of recovery traffic fit the budget."""
        now = self._took_at = time.monotonic()
        rate = self.rate()
        self.bucket.set_rate(rate, now)
        delay = self.bucket.wait_s(size_bytes, now)
        while delay > 0:
            # In steps: when the budget moves (a window ends, the config changes), the rest of
            # this wait follows the new rate instead of the one it started under.
            step = min(delay, 1.0)
            await asyncio.sleep(step)
            delay -= step
            new_rate = self.rate()
            if new_rate != rate:
                self.bucket.set_rate(new_rate, time.monotonic())
                delay = delay * rate / new_rate if new_rate > 0 else 0.0
                rate = new_rate

    async def slot(self):
        """Wait for one of the budget's max_active recovery slots."""
        async with self._changed:
            while self.active >= self.budget().max_active:
                try:
                    await asyncio.wait_for(self._changed.wait(), 1.0)    # the budget may move
                except TimeoutError:
                    pass
            self.active += 1

    async def release(self):
        async with self._changed:
            self.active -= 1
            self._changed.notify_all()


class PgRegistry:
    def __init__(self, port, local, backends):
        self.port = port
        self.local = local                              # osd/pglocal.py: the copies here
        self.backends = backends                        # by pool kind (osd/backend.py)
        self.pgs = {}                                   # key -> Pg
        self.epoch_seen = None                          # the last map's epoch (on_map)
        self.delta_recoveries_total = 0
        self.backfills_total = 0
        self.on_demand_total = 0                        # objects recovered for a waiting client
        self.throttle = RecoveryThrottle(port)

    @property
    def recovery_bytes_total(self):
        """Bytes recovery moved, over both backends."""
        return sum(backend.recovery_bytes_total for backend in self.backends.values())

    def load_local(self):
        """Know every PG that has a copy in the local store, so a stray copy can answer
        peering queries after a restart."""
        for name in self.port.store.list_collections():
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "pg":
                try:
                    self.shell((int(parts[1]), int(parts[2], 16)))
                except ValueError:
                    continue

    def shell(self, key):
        """The PG `key` (made on first use), with its pool kind's backend once the map has
        its pool."""
        found = self.pgs.get(key)
        if found is None:
            found = self.pgs[key] = Pg(key, self.port.me, None)
        if found.backend is None and self.port.map is not None:
            pool = pgs.pool_by_id(self.port.map, key[0])
            if pool is not None:
                found.backend = self.backends.get(pool["kind"])
        return found

    # -- map changes ------------------------------------------------------------------------------

    def on_map(self, cmap):
        """Recompute intervals; start peering where this OSD became (or stays) a new
        interval's primary.

        A map that skips epochs (this OSD was cut off from the monitors, or a push was
        missed) may hide intervals: another OSD may have led a PG in between, and its queries
        raised the members' min_epoch past our interval's start, so they would refuse us as
        stale for good. Every PG then starts a new interval here, its members unchanged or not
        (the seeded simulation found a PG that stayed unavailable this way). An incomplete PG
        peers again on every map: the complete member it waits for may come back without its
        acting set changing (found the same way: a PG incomplete for good after every OSD was
        back)."""
        gap = self.epoch_seen is not None and cmap.epoch > self.epoch_seen + 1
        self.epoch_seen = cmap.epoch
        live = set()
        for pool in cmap.pools.values():
            for pg_index, acting in enumerate(pgs.acting_sets(cmap, pool["name"])):
                key = (pool["id"], pg_index)
                live.add(key)
                if self.port.me not in acting.members and key not in self.pgs:
                    continue
                pg = self.shell(key)
                previous = pg.core.interval[1] if pg.core.interval else None
                if previous is not None and previous.members == acting.members and not gap \
                        and pg.core.phase is not Phase.INCOMPLETE:
                    continue
                self._new_interval(pg, cmap.epoch, acting, cmap)
        for key in [k for k in self.pgs if k not in live]:        # pool deleted
            self._stop_task(self.pgs.pop(key))

    def _new_interval(self, pg, epoch, acting, cmap):
        pg.active.clear()
        self._stop_task(pg)
        if pg.core.new_interval(epoch, acting) is not Role.PRIMARY:
            return
        up = {osd_id for osd_id, osd in cmap.osds.items() if osd["up"]}
        pg.task = asyncio.get_running_loop().create_task(
            self._peer(pg, epoch, tuple(acting.up_members), up, acting.writable))
        pg.task.add_done_callback(crash_on_error)

    @staticmethod
    def _stop_task(pg):
        if pg.task is not None and not pg.task.done():
            pg.task.cancel()
        pg.task = None

    async def stop(self):
        tasks = [pg.task for pg in self.pgs.values() if pg.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_active(self, key):
        pg = self.pgs.get(key)
        if pg is None:
            raise RequestFailed(Code.AGAIN, f"pg {key[0]}.{key[1]:x} is not known here yet")
        if pg.active.is_set():
            return pg
        try:
            await asyncio.wait_for(pg.active.wait(), ACTIVE_WAIT_S_MAX)
        except TimeoutError:
            raise RequestFailed(Code.AGAIN, f"pg {key[0]}.{key[1]:x} is {pg.core.state}, not "
                                "active; retry") from None
        return pg

    def states(self):
        """{state: count} of the PGs this OSD is primary of (reported to the monitor)."""
        counts = collections.Counter(pg.core.reported_state() for pg in self.pgs.values())
        counts.pop(None, None)
        return dict(counts)

    def inconsistent(self):
        """Names ("POOL.PG") of the PGs this OSD is primary of whose last scrub left errors
        unrepaired or whose reads found damage not yet repaired (at most 64: a health check
        names them, a count does for more)."""
        names = sorted(f"{pg.key[0]}.{pg.key[1]:x}" for pg in self.pgs.values()
                       if pg.core.inconsistent())
        return names[:INCONSISTENT_REPORTED_MAX]

    def copies_held(self):
        """How many PGs this OSD holds a copy of (members and strays)."""
        return sum(1 for name in self.port.store.list_collections() if name.startswith("pg."))

    def pool_usage(self):
        """{pool id (as text): [objects, bytes stored]} over the PGs this OSD is primary of and serves
        (for `cairn df` and pool quotas): the PG's object count, and the sizes of the objects
        in its copy here; an erasure-coded PG's copy is one shard of each object, so k times
        its bytes (padding included)."""
        usage = {}
        cmap = self.port.map
        for pg in self.pgs.values():
            if pg.core.role is not Role.PRIMARY or not pg.core.serving:
                continue
            pool = pgs.pool_by_id(cmap, pg.key[0])
            if pool is None:
                continue
            stored = self.port.store.usage(pg.collection)[1] * pool.get("k", 1)
            entry = usage.setdefault(str(pg.key[0]), [0, 0])
            entry[0] += pg.core.object_count
            entry[1] += stored
        return usage

    def object_counts(self):
        """Object copies, for `cairn status`: `total` (the copies the PGs this OSD is primary of
        should have), `degraded` (copies acting members still lack: being recovered, or a
        member short of the pool's size) and `misplaced` (copies held here by PGs this OSD is
        no longer a member of, until they are deleted)."""
        totals = [0, 0, 0]
        for pg in self.pgs.values():
            for index, count in enumerate(pg.core.object_counts()):
                totals[index] += count
        return dict(zip(("total", "degraded", "misplaced"), totals))

    # -- peering ----------------------------------------------------------------------------------

    async def _peer(self, pg, epoch, acting, up, writable):
        # Runs until the PG is active and clean, incomplete, or a new interval cancels it;
        # retries after failures.
        while True:
            core = peering.Peering(epoch, acting, up, self.port.me)
            try:
                reply = await self.port.monitor({"op": "pg_last_active", "pool": pg.key[0],
                                                 "pg": pg.key[1]})
                effects = core.start(peering.Record.from_list(reply["record"]))
                done = await self._run(pg, core, effects, epoch, writable)
            except (MonitorsUnavailable, RequestFailed) as exc:
                done = False
                log.warning("pg %d.%x peering: %s", *pg.key, exc)
            if done:
                return
            if pg.active.is_set():
                return                  # serving; a failed background recovery waits for the map
            await asyncio.sleep(PEERING_RETRY_S)

    async def _run(self, pg, core, effects, epoch, writable):
        """Carry out effects until the PG is active and every member recovered (True), or
        peering must restart (False).

        Below min_size the PG still peers, so reads go on, but it records no activation:
        it will accept no write, so the last record stays the one that names who holds them."""
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            log.debug("pg %d.%x epoch %d: %s", *pg.key, epoch, effect)
            if isinstance(effect, peering.Query):
                queries = [effect] + [e for e in queue if isinstance(e, peering.Query)]
                queue = [e for e in queue if not isinstance(e, peering.Query)]
                results = await asyncio.gather(*(self._query(pg, q.osd, epoch) for q in queries),
                                               return_exceptions=True)
                for query, result in zip(queries, results):
                    if isinstance(result, Exception):
                        log.info("pg %d.%x epoch %d: query of osd.%d failed: %r", *pg.key, epoch,
                                 query.osd, result)
                        queue += core.failed(query.osd, str(result))
                    else:
                        queue += core.info(query.osd, *result)
            elif isinstance(effect, peering.Recover) and core.state is peering.State.ACTIVE:
                background = [effect] + [e for e in queue if isinstance(e, peering.Recover)]
                queue = [e for e in queue if not isinstance(e, peering.Recover)]
                pg.core.peering_moved(Phase.ACTIVE_RECOVERING)
                recorded = await asyncio.gather(*(self._recover_in_background(pg, core, r, epoch,
                                                                              writable)
                                                  for r in background))
                pg.core.recovery_finished(core.clean, writable, all(recorded))
                return True
            elif isinstance(effect, peering.Recover):
                pg.core.peering_moved(Phase.RECOVERING)  # the primary catches up first
                try:
                    await self._recover(pg, effect.source, effect.target, epoch)
                except RequestFailed as exc:
                    queue += core.failed(effect.source, str(exc))
                else:
                    queue += core.recovered(effect.target)
            elif isinstance(effect, peering.Activate):
                log.debug("pg %d.%x epoch %d: infos %s authority osd.%s", *pg.key, epoch,
                          core.infos, core.authority)
                pg.core.peering_moved(Phase.ACTIVATING)
                if effect.missing_from is not None:
                    try:
                        await self._find_missing(pg, effect.missing_from, epoch)
                    except RequestFailed as exc:
                        queue += core.failed(effect.missing_from, str(exc))
                        continue
                self._count_objects(pg)
                if writable:
                    await self._record(pg, effect)
                core.activated()
                pg.core.activated(effect.complete, writable, more_to_recover=bool(queue))
                pg.active.set()
                if not queue:
                    return True
            elif isinstance(effect, peering.Incomplete):
                pg.core.peering_moved(Phase.INCOMPLETE)
                log.warning("pg %d.%x incomplete: %s", *pg.key, effect.reason)
                return True                 # wait for the next map, not a retry loop
            elif isinstance(effect, peering.Restart):
                pg.core.peering_moved(Phase.PEERING)
                log.info("pg %d.%x peering again: %s", *pg.key, effect.reason)
                return False
        return False

    async def _record(self, pg, effect):
        """Write the activation record (or its growing complete set) at the monitor."""
        await self.port.monitor({"op": "pg_set_active", "pool": pg.key[0],
                                 "pg": pg.key[1], "epoch": effect.epoch,
                                 "acting": list(effect.acting),
                                 "complete": list(effect.complete)})

    async def _recover_in_background(self, pg, core, recover, epoch, writable):
        """Recover one member while the PG serves; True once it is recorded complete."""
        for attempt in range(RECOVERY_ATTEMPTS_MAX):
            try:
                if recover.target == self.port.me:
                    await self._recover_missing(pg, epoch)
                else:
                    await self._recover(pg, recover.source, recover.target, epoch, locked=True)
                break
            except RequestFailed as exc:
                log.info("pg %d.%x: recovery of osd.%d failed (attempt %d): %s", *pg.key,
                         recover.target, attempt + 1, exc)
                if attempt + 1 == RECOVERY_ATTEMPTS_MAX:
                    core.failed(recover.target, str(exc))   # it stays incomplete
                    return False
                await asyncio.sleep(PEERING_RETRY_S * 2 ** attempt)
        effects = core.recovered(recover.target)
        pg.core.member_recovered(core.complete)                  # its next writes carry the flag
        for effect in effects:
            if isinstance(effect, peering.Complete) and writable:
                try:
                    await self._record(pg, effect)
                except (MonitorsUnavailable, RequestFailed) as exc:
                    log.warning("pg %d.%x: could not record osd.%d complete: %s", *pg.key,
                                recover.target, exc)
                    return False
        return True

    # -- stray copies -------------------------------------------------------------------------------

    async def tidy_strays_forever(self):
        # Runs until the daemon stops.
        while True:
            await asyncio.sleep(STRAY_CHECK_S)
            for pg in list(self.pgs.values()):
                if self.pgs.get(pg.key) is pg and pg.core.phase is Phase.STRAY:
                    try:
                        await self._tidy_stray(pg)
                    except RequestFailed as exc:
                        log.info("pg %d.%x: stray copy kept for now: %s", *pg.key, exc)

    async def _tidy_stray(self, pg):
        """Delete this OSD's copy of a PG it is no longer a member of, once the PG's primary
        says the PG is clean (every member complete, recorded at the monitor)."""
        if not (self.port.store.has_collection(pg.collection)
                or self.port.store.has_collection(pg.log_collection)):
            del self.pgs[pg.key]
            return
        if pg.core.stray_objects is None:
            pg.core.stray_counted(self.port.store.count_objects(pg.collection)
                                  if self.port.store.has_collection(pg.collection) else 0)
        interval = pg.core.interval
        if interval is None or interval[1].primary is None:
            return
        header, _ = await self.port.call(interval[1].primary,
                                         {"op": "pg_info", "pool": pg.key[0], "pg": pg.key[1],
                                          "epoch": interval[0]})
        if not header.get("clean") or pg.core.interval is not interval \
                or pg.core.phase is not Phase.STRAY \
                or tuple(header.get("acting", ())) != tuple(interval[1].members):
            return
        log.info("pg %d.%x is clean on %s: deleting the stray copy here (%d objects)", *pg.key,
                 interval[1].members, pg.core.stray_objects)
        pg.core.removal_started()
        try:
            await self._remove_copy(pg)
        finally:
            pg.core.removal_ended()
        if pg.core.interval is interval and pg.core.phase is Phase.STRAY:
            del self.pgs[pg.key]

    async def _remove_copy(self, pg):
        # The log goes first, in one transaction: a copy half deleted never looks complete.
        if self.port.store.has_collection(pg.log_collection):
            txn = Transaction()
            for name in self.local.all_names(pg.log_collection):
                txn.delete(pg.log_collection, name)
            await self.port.store.apply(txn.remove_collection(pg.log_collection),
                                        then=pg.core.log_forgotten)
        else:
            pg.core.log_forgotten()
        for collection in (pg.stash_collection, pg.collection):
            while self.port.store.has_collection(collection) and pg.core.phase is Phase.STRAY:
                names, _ = self.port.store.list_objects(collection, limit=STRAY_DELETE_BATCH)
                txn = Transaction()
                for name in names:
                    txn.delete(collection, name)
                if not names:
                    txn.remove_collection(collection)
                await self.port.store.apply(txn)
                if collection == pg.collection:
                    pg.core.stray_removed(len(names))

    # -- talking to members -------------------------------------------------------------------------

    async def _query(self, pg, osd_id, epoch):
        header, _ = await self.port.call(osd_id, self.port.header(pg, "pg_query", epoch))
        return header["last_update"], header.get("complete_to", 0)

    async def _listing(self, pg, osd_id, epoch, as_target=False):
        versions, start_after = {}, None
        while True:
            header, _ = await self.port.call(osd_id, self.port.header(
                pg, "pg_list", epoch, start_after=start_after, limit=RECOVERY_LIST_PAGE,
                as_target=as_target))
            versions.update((name, version) for name, version in header["entries"])
            start_after = header["next"]
            if start_after is None:
                return versions, header["last_update"]

    async def _plan(self, pg, source, target, epoch):
        """(names to sync in order, the version to mark the target with when done, how): from
        the PG logs when the source's log covers the target's gap ("log"), otherwise by
        comparing whole listings ("backfill", in hash order as Ceph backfills: objects are
        spread evenly over the run whatever their names). A backfill that was interrupted
        resumes in effect: what it already copied has the source's version and is skipped."""
        source_log = await self._log(pg, source, epoch)
        target_log = await self._log(pg, target, epoch)
        names = delta_names(source_log, target_log)
        if names is not None:
            return names, source_log["last_update"], "log"
        wanted, source_last_update = await self._listing(pg, source, epoch)
        have, _ = await self._listing(pg, target, epoch, as_target=True)
        return backfill_names(wanted, have), source_last_update, "backfill"

    async def _recover(self, pg, source, target, epoch, locked=False):
        """Make `target`'s copy of the PG equal to `source`'s, within the recovery budget.
        `locked`: the PG is serving; each object is copied or removed under the primary's
        object lock, so no client write interleaves (a write since the plan is simply copied as
        it now is, and the target received it anyway as a member)."""
        names, mark, how = await self._plan(pg, source, target, epoch)
        pg.core.member_recovery_started(target, len(names))
        outcomes = collections.Counter()
        await self.throttle.slot()
        try:
            for name in names:
                outcomes[await self.sync_object(pg, source, target, name, epoch, locked)] += 1
                pg.core.member_object_synced(target)
            await self.port.call(target, self.port.header(pg, "pg_mark", epoch, version=mark))
        finally:
            pg.core.member_recovery_ended(target, outcomes["copied"] + outcomes["removed"])
            await self.throttle.release()
        if how == "log":
            self.delta_recoveries_total += 1
        else:
            self.backfills_total += 1
        copied, removed = outcomes["copied"], outcomes["removed"]
        if copied or removed:
            log.info("pg %d.%x: recovered osd.%d from osd.%d by %s: %d objects copied, "
                     "%d removed", *pg.key, target, source, how, copied, removed)

    # -- the primary's own missing objects ----------------------------------------------------------

    async def _find_missing(self, pg, authority, epoch):
        """Before a primary that is behind serves: the objects whose version here differs from
        the authority's, with the authority's version (None where it has no such object)."""
        names, mark, _ = await self._plan(pg, authority, self.port.me, epoch)
        candidates = {}
        for first in range(0, len(names), RECOVERY_LIST_PAGE):
            batch = names[first:first + RECOVERY_LIST_PAGE]
            header, _ = await self.port.call(authority, self.port.header(pg, "pg_stat", epoch,
                                                                         names=batch))
            candidates.update(zip(batch, zip(header["versions"], header["sizes"])))
        here = {name: self.local.local_version(pg, name) for name in candidates}
        missing = pg.core.set_missing(authority, mark, candidates, here)
        if missing:
            log.info("pg %d.%x: serving with %d objects missing here (recovered from osd.%d "
                     "first when a client asks for them)", *pg.key, missing, authority)

    async def _recover_missing(self, pg, epoch):
        """Recover this primary's missing objects in the background (within the budget), then
        mark it complete up to the authority's last_update of the plan."""
        await self.throttle.slot()
        try:
            for name in sorted(pg.core.missing, key=hash_order):
                if name not in pg.core.missing:
                    continue                        # a client got there first
                # The budget is paid before the object lock is taken, so a client waiting on
                # this object never waits for the budget.
                await self.throttle.take(pg.core.missing_sizes.get(name, 0))
                async with pg.object_lock(name):
                    await self.recover_now(pg, name, background=True)
            await self.port.call(self.port.me, self.port.header(pg, "pg_mark", epoch,
                                                                version=pg.core.missing_mark))
        finally:
            await self.throttle.release()

    async def make_current(self, pg, name, interval):
        """Before a client op admitted in `interval` reads `name` (holding its lock): recover
        the object first if this primary serves it through its missing set, and refuse
        (`again`) if the PG left that interval meanwhile (PgCore.check_serving)."""
        pg.core.check_serving(interval)
        await self.recover_now(pg, name)
        pg.core.check_serving(interval)

    async def recover_now(self, pg, name, background=False):
        """Recover one missing object from the authority; the caller holds its object lock.
        A client waiting on it calls this: that object goes first, outside the budget."""
        if name not in pg.core.missing:
            return
        outcome = await self.sync_object(pg, pg.core.missing_from, self.port.me, name,
                                         pg.core.interval[0], locked=False, throttled=False)
        pg.core.object_recovered(name)
        if not background:
            self.on_demand_total += 1
            log.debug("pg %d.%x: %s %r on demand", *pg.key, outcome, name)

    def _count_objects(self, pg):
        """The PG's objects as this primary serves them (its copy, corrected by the missing
        set); kept up to date by writes."""
        stored = (self.port.store.count_objects(pg.collection)
                  if self.port.store.has_collection(pg.collection) else 0)
        return pg.core.count_objects(stored, lambda name: self.local.present(pg, name))

    async def _log(self, pg, osd_id, epoch):
        header, _ = await self.port.call(osd_id, self.port.header(pg, "pg_log", epoch))
        return {"entries": [(version, name) for version, name in header["entries"]],
                "last_update": header["last_update"], "tail": header["tail"],
                "complete_to": header["complete_to"]}

    async def sync_object(self, pg, source, target, name, epoch, locked, throttled=True):
        """Make one object on `target` what it is on `source` now: 'copied' or 'removed'.
        `locked`: take the primary's object lock, so a client write to it cannot interleave
        (a write since the plan is simply copied as it now is)."""
        async with pg.object_lock(name, locked):
            if source == self.port.me and target != self.port.me and name in pg.core.missing:
                # Our own copy is not the PG's yet (we serve it through the missing set):
                # fetch it from the authority first, or the target would get our old version
                # and be marked complete with it.
                await self.recover_now(pg, name, background=True)
            return await pg.backend.recover_object(pg, source, target, name, epoch,
                                                   self.throttle.take if throttled else None)

    # -- the log ----------------------------------------------------------------------------------

