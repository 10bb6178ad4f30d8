"""The OSD's placement groups: intervals, PG logs, peering and recovery (the shell around
osd/peering.py).

On every new map the registry recomputes the acting set of every PG of every pool. A PG whose
acting set or primary changed starts a new interval: if this OSD is its primary, a peering task
runs the `Peering` core (query members, pick the authority, recover members by comparing object
versions, record the activation at the monitor) and the PG serves writes only once ACTIVE. A
queried OSD raises the PG's `min_epoch`, refusing replicated writes from older epochs.

Each PG keeps a log: an empty object per write in `pglog.POOL.PG`, named by version, so the
highest version an OSD applied (deletes included) survives restarts. The newest LOG_ENTRIES_KEPT
are kept.
"""

import asyncio
import collections
import logging
import os
import time

from cairn.common import config, throttle
from cairn.common import pg as pgs
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.native.checksum import crc32c
from cairn.common.monclient import MonitorsUnavailable
from cairn.osd import peering
from cairn.osd.errors import CollectionExists, ObjectNotFound
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")

# Log entries kept per PG (Ceph keeps 3000 by default, osd_max_pg_log_entries); trimmed in
# batches so most writes carry no deletes.
LOG_ENTRIES_KEPT = 1024
LOG_TRIM_BATCH = 256
# How long a client op waits for its PG to finish peering before answering `again`.
ACTIVE_WAIT_S_MAX = 5.0
# Pause before peering again after a failure (an OSD that did not answer, a refused record).
PEERING_RETRY_S = 1.0
RECOVERY_LIST_PAGE = 1000
# Tries of one member's background recovery before it is left incomplete until the map changes.
RECOVERY_ATTEMPTS_MAX = 5
# Deadline of one peering or recovery call to another OSD; a member that does not answer in
# time makes peering start again.
PEER_CALL_TIMEOUT_S = 10.0


MARKER_NAME = "~recovered"       # log entries that only record a last_update (pg_mark)
TAIL_NAME = "~tail"              # not an entry: holds the version the log is complete after


def delta_names(source_log, target_log):
    """The object names that recovery by log must sync from source to target, or None when the
    source's log does not cover the target's gap (then: backfill).

    A log is complete after its `tail` (trimmed below it; or, on a member that was itself
    recovered, unknown before its recovery). It covers the target when the target's
    last_update is not older than the source's tail. Names come from the source's entries newer
    than the target's last_update (writes it missed) and from the target's entries after the
    source's tail that the source does not have (writes the target applied that were never
    acknowledged: divergent)."""
    if target_log["last_update"] < source_log["tail"]:
        return None
    source_versions = {version for version, _ in source_log["entries"]}
    names = {name for version, name in source_log["entries"]
             if version > target_log["last_update"]}
    names |= {name for version, name in target_log["entries"]
              if version > source_log["tail"] and version not in source_versions}
    names.discard(MARKER_NAME)
    return sorted(names)


def hash_order(name):
    """The sort key of backfill: the object name's crc32c (as placement hashes it), then the
    name."""
    return crc32c(name.encode()), name


def _crash_on_error(task):
    """A peering task that died of anything but cancellation hit a bug: stop the daemon rather
    than leave the PG stuck in peering with nobody noticing (STYLE.md 2.5)."""
    if task.cancelled() or task.exception() is None:
        return
    log.critical("peering task failed", exc_info=task.exception())
    os._exit(70)


class PgShell:
    """What this OSD knows about one PG."""

    def __init__(self, key):
        self.key = key                                  # (pool id, pg index)
        self.collection = pgs.collection(*key)
        self.log_collection = pgs.log_collection(*key)
        self.interval = None                            # (epoch, Acting)
        self.state = "stray"
        self.min_epoch = 0
        self.active = asyncio.Event()
        self.task = None
        self.log_names = None                           # deque of entry names, oldest first
        self.log_tail = 0                               # the log is complete after this version
        self.last_update = 0
        self.assigned = 0                               # the last version handed out (primary)
        self.recovered_objects = 0


class RecoveryThrottle:
    """Recovery traffic within the budget in force (common/throttle.py): bytes per second
    through a token bucket, and at most max_active PGs recovering at once. Both follow the
    cluster config and the local time at every call, so a change applies within seconds."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.bucket = throttle.TokenBucket(0, time.monotonic())
        self.active = 0
        self._changed = asyncio.Condition()
        self._parsed = (None, None)                     # (epoch, windows)

    def budget(self):
        cmap = self.daemon.monc.map
        if self._parsed[0] != cmap.epoch:
            self._parsed = (cmap.epoch, config.value(cmap.config, "recovery.windows"))
        now = time.localtime()
        return throttle.budget(self._parsed[1],
                               config.value(cmap.config, "recovery.max_bytes_per_s"),
                               config.value(cmap.config, "recovery.max_active"),
                               now.tm_wday, now.tm_hour * 60 + now.tm_min)

    async def take(self, size_bytes):
        """Wait until `size_bytes` of recovery traffic fit the budget."""
        now = time.monotonic()
        self.bucket.set_rate(self.budget().max_bytes_per_s, now)
        delay = self.bucket.wait_s(size_bytes, now)
        if delay > 0:
            await asyncio.sleep(delay)

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
    def __init__(self, daemon):
        self.daemon = daemon
        self.pgs = {}                                   # key -> PgShell
        self.recovery_bytes_total = 0
        self.delta_recoveries_total = 0
        self.backfills_total = 0
        self.throttle = RecoveryThrottle(daemon)

    @property
    def me(self):
        return self.daemon.id

    @property
    def store(self):
        return self.daemon.store

    def load_local(self):
        """Know every PG that has a copy in the local store, so a stray copy can answer
        peering queries after a restart."""
        for name in self.store.list_collections():
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "pg":
                try:
                    self.shell((int(parts[1]), int(parts[2], 16)))
                except ValueError:
                    continue

    def shell(self, key):
        found = self.pgs.get(key)
        if found is None:
            found = self.pgs[key] = PgShell(key)
        return found

    # -- map changes ------------------------------------------------------------------------------

    def on_map(self, cmap):
        """Recompute intervals; start peering where this OSD became (or stays) a new
        interval's primary."""
        live = set()
        for pool in cmap.pools.values():
            if pool["kind"] != "replicated":
                continue                    # erasure-coded pools are served by a later issue
            for pg_index, acting in enumerate(pgs.acting_sets(cmap, pool["name"])):
                key = (pool["id"], pg_index)
                live.add(key)
                if self.me not in acting.members and key not in self.pgs:
                    continue
                pg = self.shell(key)
                previous = pg.interval[1] if pg.interval else None
                if previous is not None and previous.members == acting.members:
                    continue
                self._new_interval(pg, cmap.epoch, acting, cmap)
        for key in [k for k in self.pgs if k not in live]:        # pool deleted
            self._stop_task(self.pgs.pop(key))

    def _new_interval(self, pg, epoch, acting, cmap):
        pg.interval = (epoch, acting)
        pg.active.clear()
        self._stop_task(pg)
        if acting.primary != self.me:
            pg.state = "replica" if self.me in acting.members else "stray"
            return
        up = {osd_id for osd_id, osd in cmap.osds.items() if osd["up"]}
        pg.state = "peering"
        pg.task = asyncio.get_running_loop().create_task(
            self._peer(pg, epoch, tuple(acting.up_members), up, acting.writable))
        pg.task.add_done_callback(_crash_on_error)

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
            raise RequestFailed("again", f"pg {key[0]}.{key[1]:x} is not known here yet")
        if pg.active.is_set():
            return pg
        try:
            await asyncio.wait_for(pg.active.wait(), ACTIVE_WAIT_S_MAX)
        except TimeoutError:
            raise RequestFailed("again", f"pg {key[0]}.{key[1]:x} is {pg.state}, not active; "
                                "retry") from None
        return pg

    def states(self):
        """{state: count} of the PGs this OSD is primary of (reported to the monitor)."""
        counts = collections.Counter()
        for pg in self.pgs.values():
            if pg.interval and pg.interval[1].primary == self.me:
                degraded = len(pg.interval[1].up_members) < pg.interval[1].size
                state = pg.state + ("+degraded" if degraded and pg.state == "active" else "")
                counts[state] += 1
        return dict(counts)

    # -- peering ----------------------------------------------------------------------------------

    async def _peer(self, pg, epoch, acting, up, writable):
        # Runs until the PG is active and clean, incomplete, or a new interval cancels it;
        # retries after failures.
        while True:
            core = peering.Peering(epoch, acting, up, self.me)
            try:
                reply = await self.daemon.monc.request({"op": "pg_last_active", "pool": pg.key[0],
                                                        "pg": pg.key[1]})
                effects = core.start(peering.Record.from_list(reply.header["record"]))
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
                        queue += core.info(query.osd, result)
            elif isinstance(effect, peering.Recover) and core.state is peering.State.ACTIVE:
                background = [effect] + [e for e in queue if isinstance(e, peering.Recover)]
                queue = [e for e in queue if not isinstance(e, peering.Recover)]
                pg.state = "active+recovering"
                await asyncio.gather(*(self._recover_in_background(pg, core, r, epoch, writable)
                                       for r in background))
                pg.state = "active" if core.clean else "active+degraded"
                if not writable:
                    pg.state = "active+readonly"
                return True
            elif isinstance(effect, peering.Recover):
                pg.state = "recovering"             # the primary catches up first
                try:
                    await self._recover(pg, effect.source, effect.target, epoch)
                except RequestFailed as exc:
                    queue += core.failed(effect.source, str(exc))
                else:
                    queue += core.recovered(effect.target)
            elif isinstance(effect, peering.Activate):
                log.debug("pg %d.%x epoch %d: infos %s authority osd.%s", *pg.key, epoch,
                          core.infos, core.authority)
                pg.state = "activating"
                if writable:
                    await self._record(pg, effect)
                core.activated()
                pg.state = "active" if writable else "active+readonly"
                pg.active.set()
                if not queue:
                    return True
            elif isinstance(effect, peering.Incomplete):
                pg.state = "incomplete"
                log.warning("pg %d.%x incomplete: %s", *pg.key, effect.reason)
                return True                 # wait for the next map, not a retry loop
            elif isinstance(effect, peering.Restart):
                pg.state = "peering"
                log.info("pg %d.%x peering again: %s", *pg.key, effect.reason)
                return False
        return False

    async def _record(self, pg, effect):
        """Write the activation record (or its growing complete set) at the monitor."""
        await self.daemon.monc.request({"op": "pg_set_active", "pool": pg.key[0],
                                        "pg": pg.key[1], "epoch": effect.epoch,
                                        "acting": list(effect.acting),
                                        "complete": list(effect.complete)})

    async def _recover_in_background(self, pg, core, recover, epoch, writable):
        for attempt in range(RECOVERY_ATTEMPTS_MAX):
            try:
                await self._recover(pg, recover.source, recover.target, epoch, locked=True)
                break
            except RequestFailed as exc:
                log.info("pg %d.%x: recovery of osd.%d failed (attempt %d): %s", *pg.key,
                         recover.target, attempt + 1, exc)
                if attempt + 1 == RECOVERY_ATTEMPTS_MAX:
                    core.failed(recover.target, str(exc))   # it stays incomplete
                    return
                await asyncio.sleep(PEERING_RETRY_S * 2 ** attempt)
        for effect in core.recovered(recover.target):
            if isinstance(effect, peering.Complete) and writable:
                try:
                    await self._record(pg, effect)
                except (MonitorsUnavailable, RequestFailed) as exc:
                    log.warning("pg %d.%x: could not record osd.%d complete: %s", *pg.key,
                                recover.target, exc)

    # -- talking to members -------------------------------------------------------------------------

    async def call(self, osd_id, header, payload=b""):
        """Send an op to `osd_id` (handled locally when it is us); the reply (header, payload)."""
        if osd_id == self.me:
            return await self.daemon.service.handle(dict(header), payload)
        osd = self.daemon.monc.map.osds.get(osd_id)
        if osd is None or not osd["addr"]:
            raise RequestFailed("again", f"osd.{osd_id} has no address")
        try:
            connection = await self.daemon.service.connections.get(osd_id, osd["addr"])
            reply = await connection.request(header, payload, timeout_s=PEER_CALL_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as exc:
            raise RequestFailed("again", f"osd.{osd_id}: {exc}") from None
        return reply.header, reply.payload

    def _header(self, pg, op, epoch, **fields):
        return {"op": op, "pool": pg.key[0], "pg": pg.key[1], "epoch": epoch, "from": self.me,
                **fields}

    async def _query(self, pg, osd_id, epoch):
        header, _ = await self.call(osd_id, self._header(pg, "pg_query", epoch))
        return header["last_update"]

    async def _listing(self, pg, osd_id, epoch):
        versions, start_after = {}, None
        while True:
            header, _ = await self.call(osd_id, self._header(pg, "pg_list", epoch,
                                                             start_after=start_after,
                                                             limit=RECOVERY_LIST_PAGE))
            versions.update((name, version) for name, version in header["entries"])
            start_after = header["next"]
            if start_after is None:
                return versions, header["last_update"]

    async def _recover(self, pg, source, target, epoch, locked=False):
        """Make `target`'s copy of the PG equal to `source`'s (backfill by object versions),
        within the recovery budget. `locked`: the PG is serving and `source` is this primary;
        each object is copied or removed under the primary's object lock, so no client write
        interleaves, and objects written after the listing are left alone."""
        await self.throttle.slot()
        try:
            await self._backfill(pg, source, target, epoch, locked)
        finally:
            await self.throttle.release()

    async def _backfill(self, pg, source, target, epoch, locked):
        """Delta recovery from the PG logs when the source's log reaches back to the target's
        last_update; otherwise a backfill by comparing whole listings."""
        source_log = await self._log(pg, source, epoch)
        target_log = await self._log(pg, target, epoch)
        names = delta_names(source_log, target_log)
        if names is not None:
            for name in names:
                await self._sync_object(pg, source, target, name, epoch, locked)
            await self.call(target, self._header(pg, "pg_mark", epoch,
                                                 version=source_log["last_update"]))
            self.delta_recoveries_total += 1
            if names:
                log.info("pg %d.%x: recovered osd.%d from osd.%d by log: %d objects", *pg.key,
                         target, source, len(names))
            pg.recovered_objects += len(names)
            return
        self.backfills_total += 1
        wanted, source_last_update = await self._listing(pg, source, epoch)
        have, _ = await self._listing(pg, target, epoch)
        # In hash order, as Ceph backfills: objects are spread evenly over the run whatever
        # their names, so an interrupted backfill has covered a fair sample of the PG.
        behind = [name for name, version in wanted.items() if have.get(name) != version]
        extra = list(have.keys() - wanted.keys())
        outcomes = collections.Counter()
        for name in sorted(behind + extra, key=hash_order):
            outcomes[await self._sync_object(pg, source, target, name, epoch, locked)] += 1
        copied, removed = outcomes["copied"], outcomes["removed"]
        await self.call(target, self._header(pg, "pg_mark", epoch, version=source_last_update))
        if copied or removed:
            log.info("pg %d.%x: recovered osd.%d from osd.%d: %d objects copied, %d removed",
                     *pg.key, target, source, copied, removed)
        pg.recovered_objects += copied + removed

    async def _log(self, pg, osd_id, epoch):
        header, _ = await self.call(osd_id, self._header(pg, "pg_log", epoch))
        return {"entries": [(version, name) for version, name in header["entries"]],
                "last_update": header["last_update"], "tail": header["tail"]}

    async def _sync_object(self, pg, source, target, name, epoch, locked):
        """Make one object on `target` what it is on `source` now: 'copied' or 'removed'.
        `locked`: under the primary's object lock, so a client write to it cannot interleave
        (a write since the listing is simply copied as it now is)."""
        service = self.daemon.service
        async with service.object_lock(pg.collection, name, locked):
            try:
                header, payload = await self.call(source, self._header(pg, "pg_read", epoch,
                                                                       name=name))
            except RequestFailed as exc:
                if exc.code != "not_found":
                    raise
                await self.call(target, self._header(pg, "pg_remove", epoch, name=name))
                return "removed"
            await self.throttle.take(len(payload))
            await self.call(target, self._header(pg, "pg_push", epoch, name=name,
                                                 version=header["version"],
                                                 manifest=header.get("manifest", False)),
                            payload)
            self.recovery_bytes_total += len(payload)
        return "copied"

    # -- the log ----------------------------------------------------------------------------------

    async def ensure_collections(self, pg):
        """Create the PG's object and log collections on first use."""
        if self.store.has_collection(pg.collection):
            return
        async with self.daemon.service.collection_lock:
            if self.store.has_collection(pg.collection):
                return
            try:
                await self.store.apply(Transaction().create_collection(pg.collection)
                                       .create_collection(pg.log_collection))
            except CollectionExists:
                pass

    def load_log(self, pg):
        if pg.log_names is not None:
            return
        names, start_after = [], None
        if self.store.has_collection(pg.log_collection):
            while True:
                batch, start_after = self.store.list_objects(pg.log_collection,
                                                             start_after=start_after,
                                                             limit=RECOVERY_LIST_PAGE)
                names.extend(batch)
                if start_after is None:
                    break
        if TAIL_NAME in names:
            names.remove(TAIL_NAME)
            raw = self.store.stat(pg.log_collection, TAIL_NAME).attrs.get("t")
            pg.log_tail = int(raw.decode(), 16) if raw else 0
        pg.log_names = collections.deque(names)
        pg.last_update = max(pg.last_update, int(names[-1], 16) if names else 0)

    def log_ops(self, pg, txn, version, name, delete):
        """Add this write's log entry (and a trim when due) to `txn`. Only committed entries
        are trimmed (`applied()` records them), so a trim never deletes an entry whose own
        transaction is still in flight."""
        self.load_log(pg)
        entry = pgs.log_entry_name(version)
        txn.put(pg.log_collection, entry, b"", attrs={"n": name.encode(),
                                                       "o": b"d" if delete else b"p"})
        if len(pg.log_names) > LOG_ENTRIES_KEPT + LOG_TRIM_BATCH:
            # A set: a marker can repeat a version; never this write's own entry.
            oldest = sorted(set(pg.log_names) - {entry})
            for old in oldest[:LOG_TRIM_BATCH]:
                txn.delete(pg.log_collection, old)
            pg.log_names = collections.deque(oldest[LOG_TRIM_BATCH:])
            self.set_tail(pg, txn, int(oldest[LOG_TRIM_BATCH - 1], 16))

    def set_tail(self, pg, txn, version):
        """The log is complete only after `version` (trimmed, or this member was recovered)."""
        pg.log_tail = max(pg.log_tail, version)
        txn.put(pg.log_collection, TAIL_NAME, b"", attrs={"t": f"{pg.log_tail:x}".encode()})

    def log_entries(self, pg):
        """[(version, object name)] of the PG's log here, oldest first."""
        self.load_log(pg)
        entries = []
        for entry in sorted(pg.log_names):
            try:
                attrs = self.store.stat(pg.log_collection, entry).attrs
            except ObjectNotFound:
                continue
            entries.append((int(entry, 16), attrs.get("n", b"").decode()))
        return entries

    def applied(self, pg, version):
        """The transaction carrying log entry `version` committed."""
        pg.last_update = max(pg.last_update, version)
        pg.log_names.append(pgs.log_entry_name(version))

    def listing(self, pg, start_after, limit):
        """([(name, version)], next start_after) of the PG's objects here."""
        if not self.store.has_collection(pg.collection):
            return [], None
        names, following = self.store.list_objects(pg.collection, start_after=start_after,
                                                    limit=limit)
        entries = []
        for name in names:
            try:
                entries.append((name, pgs.version_of(self.store.stat(pg.collection, name).attrs)))
            except ObjectNotFound:
                continue
        return entries, following
