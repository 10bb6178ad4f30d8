"""The replicated PG backend: a whole copy of each object on every acting member.

Theory of operation: a write (on the primary, under the object's lock) makes the local store
transaction (the data, its version attribute, the PG log entry) and sends the same write as
`rep_put` / `rep_delete` to every other member in parallel; it is acknowledged once every
member committed (`when_written` joins the local commit and the replies in callbacks, so a fast
put needs no task). A replica's part is `apply_message`. Reads and stats are the primary's own
copy. Recovery copies an object from the member that has the authoritative version, pushing
omaps over one page in further requests. See osd/backend.py for the interface.
"""

import asyncio
import logging

from cairn.common import pg as pgs
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.common.server import received_checksums
from cairn.osd.backend import (REPLICA_ERRORS_PASSED, ZERO_COPY_READ_BYTES_MIN, PgBackend,
                               clamped, object_attrs, omap_bytes, slow_osds)
from cairn.native.errors import DeviceError
from cairn.osd.errors import ChecksumError, StoreError
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")


class ReplicatedBackend(PgBackend):
    """A whole copy of every object on every acting member (primary-copy replication)."""

    def __init__(self, port, local):
        super().__init__(port, local)
        self.behind_pushes_total = 0        # omap updates that pushed a member the whole object

    def start_write(self, pg, plan, payload, crcs, crc, done):
        """Start one write everywhere now: this OSD's transaction (its own task, which runs to
        its end) and rep_put/rep_delete to every other member in parallel; `done(this OSD
        committed, the first failure or None)` is called once all are done. The PG's
        collections must exist and its log be loaded. `crcs` / `crc`: the payload's block
        crcs and crc32c, when its frame check gave them."""
        try:
            local = self.start_apply(pg, plan.name, payload, plan.version, plan.delete,
                                     plan.manifest, plan.target(self.port.me).complete, crcs)
        except (StoreError, DeviceError) as exc:
            done(False, exc)
            return
        self.when_written(local, self.start_replicas(pg, plan, payload, crc), done)

    def start_replicas(self, pg, plan, payload, crc):
        """Send the write to every other member now: [(osd id, reply awaitable)]. `crc`: the
        payload's crc32c if known (the client's, for the same bytes)."""
        header = self._write_header(pg, plan)
        return [(target.osd, self._start_replica(
                    target.osd, {**header, "complete": target.complete}, payload or b"", crc))
                for target in plan.targets if target.osd != self.port.me]

    async def apply(self, pg, name, payload, version, delete, manifest=False, complete=False):
        """Apply one replicated write here with its log entry; `complete`: this OSD is a
        complete member (osd/pg.py)."""
        await self.local.ensure_collections(pg)
        await self.port.store.apply(*self._applied(pg, name, payload, version, delete, manifest,
                                                   complete, received_checksums(payload)[0]))

    def start_apply(self, pg, name, payload, version, delete, manifest, complete, crcs):
        """`apply` started now, for a caller told of its end by a done callback (a replica's
        fast write): the transaction's task, which runs to its end whoever waits. The PG's
        collections must exist."""
        return self.port.store.start_apply(*self._applied(pg, name, payload, version, delete,
                                                          manifest, complete, crcs))

    def _applied(self, pg, name, payload, version, delete, manifest, complete, crcs):
        """(transaction, what records it once committed) of one replicated write here."""
        return (self.transaction(pg, name, payload, version, delete, manifest, complete, crcs),
                lambda: pg.core.applied(version, complete))

    def transaction(self, pg, name, payload, version, delete, manifest, complete, crcs=None):
        """The store transaction of one replicated write here, with its log entry (which
        `pg.core.applied(version, complete)` records once it commits). The PG's collections must
        exist. `crcs`: the payload's block crcs, if its frame check gave them."""
        txn = Transaction()
        # A member that missed the object still logs the delete: its log must count every op
        # it was sent.
        if not delete:
            txn.put(pg.collection, name, payload, attrs=object_attrs(version, manifest),
                    crcs=crcs)
        elif self.local.present(pg, name):
            txn.delete(pg.collection, name)
        self.local.log_ops(pg, txn, version, name, delete, complete)
        return txn

    async def apply_message(self, pg, header, payload, delete):
        await self.apply(pg, header["name"], None if delete else payload, header["version"],
                         delete, bool(header.get("manifest")), bool(header.get("complete")))

    def reply_bytes(self, pg, name, offset=0, length=None):
        size = self.port.store.size_of(pg.collection, name)
        return 0 if size is None else clamped(size, offset, length)

    async def read(self, pg, name, offset=0, length=None):
        """(stat, bytes to send) of the local copy, zero-copy when large (see read_local). A
        local copy that fails its checksum is read from another member instead and queued for
        repair. While the map flags this OSD slow (SLOW_DISK), a complete member that is not
        slow serves the read instead, when there is one."""
        if self.port.me in slow_osds(self.port.map):
            record, wanted, ranges = self._wanted(pg, name, offset, length)
            for osd in self.stand_ins(pg):
                data = await self._remote_copy(pg, osd, name, wanted, ranges)
                if data is not None:
                    self.avoided_reads_total += 1
                    return record, data
        try:
            return await self.port.store.read_with_stat(pg.collection, name, offset, length,
                                                        copy_below=ZERO_COPY_READ_BYTES_MIN)
        except ChecksumError as exc:
            record, wanted, ranges = self._wanted(pg, name, offset, length)
            pg.core.found_damaged(name)
            log.warning("pg %d.%x: osd.%d's copy of %r is damaged (%s); reading another "
                        "replica, queued for repair", *pg.key, self.port.me, name, exc)
            damage = exc
        for osd in pg.core.acting.up_members:
            if osd == self.port.me:
                continue
            data = await self._remote_copy(pg, osd, name, wanted, ranges)
            if data is not None:
                return record, data
        raise damage

    def _wanted(self, pg, name, offset, length):
        """(stat, version, ranges) of a read another member serves: the local copy's stat,
        the version that member's copy must be, the byte range to ask it for."""
        record = self.port.store.stat(pg.collection, name)
        return (record, pgs.version_of(record.attrs),
                [[offset, record.size if length is None else length]])

    def stand_ins(self, pg):
        """Members that may serve a read for this (slow) primary: up, complete (they hold
        every acknowledged write), not flagged slow themselves."""
        slow = slow_osds(self.port.map)
        return [osd for osd in pg.core.acting.up_members
                if osd != self.port.me and osd in pg.core.complete_members and osd not in slow]

    async def _remote_copy(self, pg, osd, name, wanted, ranges):
        """The `ranges` of `osd`'s copy of `name` if it is version `wanted`, else None."""
        try:
            header, data = await self.port.call(osd, self.port.header(
                pg, "pg_read", pg.core.interval[0], name=name, ranges=ranges))
        except RequestFailed:
            return None
        return data if header.get("version") == wanted else None

    async def stat(self, pg, name):
        return self.port.store.stat(pg.collection, name), {}

    # -- omaps --------------------------------------------------------------------------------

    async def write_omap(self, pg, plan, prior, update):
        """Apply the update here and on every other up member in parallel. A member whose
        copy is not at `prior` (it is being recovered and has not reached this object) answers
        `behind`: it then gets this OSD's whole object once the update committed here, and
        the write's log entry alone."""
        header = self._write_header(pg, plan, op="rep_omap", prior=prior, **update.fields())
        local = asyncio.ensure_future(self.apply_omap(
            pg, plan.name, plan.version, prior, update, plan.target(self.port.me).complete))
        remote = [self._omap_to(pg, plan, target, header, local)
                  for target in plan.targets if target.osd != self.port.me]
        return self._outcome(await asyncio.gather(local, *remote, return_exceptions=True))

    async def _omap_to(self, pg, plan, target, header, local):
        header = {**header, "complete": target.complete}
        try:
            await self._replicate(target.osd, header, b"",
                                  passed=REPLICA_ERRORS_PASSED + (Code.BEHIND,))
            return
        except RequestFailed as exc:
            if exc.code != Code.BEHIND:
                raise
        await asyncio.shield(local)                 # the copy to push must be the new one
        await self.recover_object(pg, self.port.me, target.osd, plan.name, plan.epoch)
        self.behind_pushes_total += 1
        await self._replicate(target.osd, {**header, "log_only": True}, b"")

    async def apply_omap(self, pg, name, version, prior, update, complete, log_only=False):
        """This member's part of an omap update, with its log entry: the object must be at
        version `prior` here (0: absent; it is then created empty)."""
        await self.local.ensure_collections(pg)
        txn = Transaction()
        if not log_only:
            record = self.local.local_record(pg, name)
            have = pgs.version_of(record.attrs) if record is not None else 0
            if have != prior:
                raise RequestFailed(Code.BEHIND, f"osd.{self.port.me} holds {name!r} at version "
                                    f"{have:x}, not {prior:x}: it needs the whole object")
            version_attr = {pgs.VERSION_ATTR: pgs.version_bytes(version)}
            if record is None:
                txn.put(pg.collection, name, b"", attrs=version_attr)
            else:
                txn.set_attrs(pg.collection, name, version_attr)
            txn.omap_update(pg.collection, name, update.sets, update.removes, update.clear)
        self.local.log_ops(pg, txn, version, name, False, complete)
        await self.port.store.apply(txn, then=lambda: pg.core.applied(version, complete))

    # -- recovery -----------------------------------------------------------------------------

    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        """Copy the whole object from `source` to `target` (pg_read, pg_push), or remove it
        from `target` when `source` has none. An omap comes along: with the data when it
        fits one page, else page by page into a temporary object on the target that the last
        page renames into place (a target never holds the new version half copied)."""
        call, header_of = self.port.call, self.port.header
        try:
            header, payload = await call(source, header_of(pg, "pg_read", epoch, name=name,
                                                           omap=True))
        except RequestFailed as exc:
            if exc.code != Code.NOT_FOUND:
                raise
            await call(target, header_of(pg, "pg_remove", epoch, name=name))
            return "removed"
        entries, more = header.get("omap") or [], bool(header.get("omap_more"))
        moved = len(payload) + omap_bytes(entries)
        if pay is not None:
            await pay(moved)
        version = header["version"]
        await call(target, header_of(pg, "pg_push", epoch, name=name, version=version,
                                     manifest=header.get("manifest", False), omap=entries,
                                     partial=more), payload)
        while more:
            reply, _ = await call(source, header_of(pg, "pg_omap", epoch, name=name,
                                                    start_after=entries[-1][0],
                                                    version=version))
            entries, more = reply["entries"], reply["more"]
            if pay is not None:
                await pay(omap_bytes(entries))
            moved += omap_bytes(entries)
            await call(target, header_of(pg, "pg_push_omap", epoch, name=name, version=version,
                                         omap=entries, final=not more))
        self.recovery_bytes_total += moved
        return "copied"
