"""The OSD's scrubber: runs scrubs of the PGs it is primary of (osd/scrub.py says what a scrub
checks), on request (`pg_scrub`, from `cairn pg scrub`) and in the background: damage that a
client read found is repaired within seconds, and light and deep scrubs start when the intervals
in the cluster config (scrub.interval_s, scrub.deep_interval_s) have passed, one PG at a time,
inside the recovery budget in force (a slot, and the bytes read paid to the token bucket).
"""

import asyncio
import logging
import time

from cairn.common import config, pg as pgs
from cairn.common.messenger import RequestFailed
from cairn.native.erasure import BadFragment, NotEnoughFragments
from cairn.osd import ecstripe, scrub
from cairn.osd.backend import ShardUnavailable
from cairn.osd.pg import Role

log = logging.getLogger("cairn.osd")

# Objects one pg_scrub_local page covers (a deep page reads them all: 256 objects of 4 MiB is a
# 1 GiB read, a few seconds, within the 10 s peer call deadline on these disks).
SCRUB_PAGE = 64
# How often the background scrubber looks for work.
SCRUB_TICK_S = 2.0


def pg_name(pg):
    return f"{pg.key[0]}.{pg.key[1]:x}"


class Scrubber:
    def __init__(self, port, registry, backends):
        self.port = port
        self.registry = registry
        self.backends = backends
        self.scrubs_total = 0
        self.repairs_total = 0

    def _pool(self, pg):
        return pgs.pool_by_id(self.port.map, pg.key[0])

    # -- one PG -------------------------------------------------------------------------------

    async def scrub_pg(self, pg, deep, repair, names=None):
        """Scrub one PG this OSD is the active primary of; a report dict (osd/scrub.py).
        `names`: only these objects (a repair of read damage)."""
        report = {"pgs": 0, "objects": 0, "bytes": 0, "errors": [], "repaired": 0,
                  "skipped": []}
        if pg.core.role is not Role.PRIMARY or not pg.active.is_set():
            report["skipped"].append({"pg": pg_name(pg),
                                      "reason": f"not active here ({pg.core.state})"})
            return report
        if not pg.core.clean:
            report["skipped"].append({"pg": pg_name(pg), "reason": f"{pg.core.state}: recovery "
                                      "first, scrub after"})
            return report
        epoch, acting = pg.core.interval
        erasure = self._pool(pg)["kind"] == "erasure"
        me = self.port.me
        members = acting.up_members
        scans = await asyncio.gather(*(self._scan(pg, osd, epoch, deep, names)
                                       for osd in members))
        views = dict(zip(members, scans))
        errors = scrub.compare(acting.members, me, views, erasure)
        report["pgs"] = 1
        report["objects"] = len(views[me])
        report["bytes"] = sum(entry.size for view in views.values() for entry in view.values())
        if deep and erasure:
            errors += await self._check_parity(pg, views, errors)
        repaired = 0
        if repair:
            for error in errors:
                if await self._repair(pg, error, views, erasure, epoch):
                    repaired += 1
        unrepaired = len(errors) - repaired
        pg.core.scrubbed(names, unrepaired)
        if names is None:
            pg.last_scrub = time.monotonic()
            if deep:
                pg.last_deep_scrub = pg.last_scrub
        report["errors"] = [error.to_dict(pg_name(pg)) for error in errors]
        report["repaired"] = repaired
        self.scrubs_total += 1
        self.repairs_total += repaired
        if errors:
            log.warning("pg %s %sscrub: %d errors (%s), %d repaired", pg_name(pg),
                        "deep " if deep else "", len(errors),
                        ", ".join(f"{e.kind} {e.object!r} on osd.{e.osd}" for e in errors[:8]),
                        repaired)
        return report

    async def _scan(self, pg, osd, epoch, deep, names):
        """{name: scrub.Entry} of one member's copy of the PG, page by page."""
        view, start_after = {}, None
        while True:
            header, _ = await self.port.call(osd, self.port.header(
                pg, "pg_scrub_local", epoch, deep=deep, start_after=start_after,
                limit=SCRUB_PAGE, names=names))
            for name, version, shard, size, crc, damaged in header["entries"]:
                view[name] = scrub.Entry(version, shard, size, crc, damaged)
            start_after = header["next"]
            if start_after is None:
                return view

    async def _check_parity(self, pg, views, errors):
        """Parity errors: objects whose every shard is present and sound, yet whose parity
        differs from a fresh encoding of the data shards."""
        backend = pg.backend
        codec = backend.codec(pg)
        members = pg.core.acting.members
        if any(osd is None for osd in members):
            return []
        suspect = {error.object for error in errors}
        found = []
        for name, entry in sorted(views[self.port.me].items()):
            if name in suspect:
                continue
            record = self.port.store.stat(pg.collection, name)
            size, unit = pgs.ec_geometry(record.attrs)
            if size == 0:
                continue
            layout = backend.layout(codec, size, unit)
            try:
                shards = await asyncio.gather(*(backend._fetch(pg, osd, index, name,
                                                               entry.version, None)
                                                for index, osd in enumerate(members)))
            except ShardUnavailable as exc:
                log.info("pg %s: parity check of %r skipped: %s", pg_name(pg), name, exc)
                continue
            try:
                bad = ecstripe.parity_mismatches(codec, layout, shards)
            except (BadFragment, NotEnoughFragments) as exc:
                log.warning("pg %s: parity check of %r failed: %s", pg_name(pg), name, exc)
                bad = list(range(layout.k, layout.k + layout.m))
            found += [scrub.Error(name, members[index], index, "parity") for index in bad]
        return found

    async def _repair(self, pg, error, views, erasure, epoch):
        """Mend one error from good copies; True when done."""
        # A shard is rebuilt from k others (the bad one excluded); a replica is copied from a
        # good one.
        source = self.port.me if erasure else self._good_replica(pg, error, views)
        if source is None:
            log.warning("pg %s: no good copy of %r to repair osd.%d from", pg_name(pg),
                        error.object, error.osd)
            return False
        try:
            await self.registry.sync_object(pg, source, error.osd, error.object, epoch,
                                            locked=True, throttled=False)
        except RequestFailed as exc:
            log.warning("pg %s: repair of %r on osd.%d failed: %s", pg_name(pg), error.object,
                        error.osd, exc)
            return False
        log.info("pg %s: repaired %s %r on osd.%d from %s", pg_name(pg), error.kind,
                 error.object, error.osd, f"osd.{source}" if not erasure else "the other shards")
        return True

    def _good_replica(self, pg, error, views):
        """A member whose copy of the object has the reference version, is not damaged and
        agrees with the most common crc32c; None if there is none."""
        reference = views[self.port.me].get(error.object)
        if reference is None:
            return self.port.me           # the object is gone: remove the stray copy
        entries = {osd: view[error.object] for osd, view in views.items()
                   if error.object in view and osd != error.osd}
        crcs = [e.crc for e in entries.values() if e.crc is not None and not e.damaged]
        majority = max(set(crcs), key=crcs.count) if crcs else None
        for osd, entry in sorted(entries.items(), key=lambda item: item[0] != self.port.me):
            if entry.version == reference.version and not entry.damaged and \
                    (majority is None or entry.crc in (None, majority)):
                return osd
        return None

    # -- in the background ------------------------------------------------------------------

    async def run_forever(self):
        # Runs until the daemon stops: one pass every SCRUB_TICK_S.
        while True:
            await asyncio.sleep(SCRUB_TICK_S)
            await self.run_once()

    async def run_once(self):
        """One pass: repair read damage, then start due scrubs (one PG at a time)."""
        cmap = self.port.map
        if cmap is None:
            return
        interval_s = config.value(cmap.config, "scrub.interval_s")
        deep_interval_s = config.value(cmap.config, "scrub.deep_interval_s")
        now = time.monotonic()
        for pg in list(self.registry.pgs.values()):
            if pg.core.role is not Role.PRIMARY or not pg.active.is_set() or not pg.core.clean:
                continue
            try:
                if pg.core.damaged:
                    await self.scrub_pg(pg, deep=True, repair=True, names=sorted(pg.core.damaged))
                    continue
                deep = deep_interval_s > 0 and now - pg.last_deep_scrub >= deep_interval_s
                light = interval_s > 0 and now - pg.last_scrub >= interval_s
                if deep or light:
                    await self._scrub_in_budget(pg, deep)
            except RequestFailed as exc:
                log.info("pg %s: background scrub put off: %s", pg_name(pg), exc)

    async def _scrub_in_budget(self, pg, deep):
        throttle = self.registry.throttle
        await throttle.slot()
        try:
            report = await self.scrub_pg(pg, deep, repair=False)
            await throttle.take(report["bytes"])       # the next PG waits for the budget
        finally:
            await throttle.release()
