"""PG backends: how a PG's objects are laid out over its acting members.

The object service (osd/service.py) and peering and recovery (osd/pgs.py) do everything that
does not depend on the layout: map checks, object locks, PG versions, the PG log, missing sets,
activation records, the recovery budget. What does depend on it goes through a `PgBackend`,
chosen by the pool's kind:

    write(pg, plan, payload)
        apply one client write (an osd/pg.py WritePlan: version, targets) on every acting
        member (called on the primary, under the object's lock); returns (this OSD committed,
        the first failure or None)
    apply(pg, name, payload, version, delete, manifest, complete)
        this member's part of a write, with its log entry
    read(pg, name, offset, length) -> (stat, data)
        a client read on the primary, under the object's lock
    recover_object(pg, source, target, name, epoch, pay) -> "copied" | "removed"
        make one object on `target` what it is on `source` (recovery and backfill; the caller
        holds the object lock); `pay(bytes)`, when given, waits for the recovery budget

The replicated backend keeps a whole copy on every member. An erasure-coded backend keeps one
shard per member: its write encodes and sends each member its shard, its read gathers k shards,
and its recovery rebuilds the target's shard from k others.
"""

import abc
import asyncio

from cairn.common import pg as pgs
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.osd.store import Transaction

# Deadline for a replica's answer; a replica slower than this fails the op (the client
# retries), and peering takes over if the replica is gone.
REPLICA_TIMEOUT_S = 20.0
# From this size on a read is sent from the store's buffer as it is (common/wire.py's receive
# side uses the same bound).
ZERO_COPY_READ_BYTES_MIN = 64 * 1024


class PgBackend(abc.ABC):
    @abc.abstractmethod
    async def write(self, pg, plan, payload):
        ...

    @abc.abstractmethod
    async def apply(self, pg, name, payload, version, delete, manifest, complete):
        ...

    @abc.abstractmethod
    async def read(self, pg, name, offset=0, length=None):
        ...

    @abc.abstractmethod
    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        ...


class ReplicatedBackend(PgBackend):
    """A whole copy of every object on every acting member (primary-copy replication)."""

    def __init__(self, service):
        self.service = service

    @property
    def store(self):
        return self.service.store

    @property
    def registry(self):
        return self.service.registry

    @property
    def me(self):
        return self.service.daemon.id

    async def write(self, pg, plan, payload):
        """Write locally and send rep_put/rep_delete to every other up member in parallel."""
        header = {"op": "rep_delete" if plan.delete else "rep_put", "pool": pg.key[0],
                  "pg": pg.key[1], "name": plan.name, "version": plan.version,
                  "epoch": plan.epoch, "from": self.me, "manifest": plan.manifest}
        local = self.apply(pg, plan.name, payload, plan.version, plan.delete, plan.manifest,
                           plan.target(self.me).complete)
        remote = [self._replicate(target.osd, {**header, "complete": target.complete},
                                  payload or b"")
                  for target in plan.targets if target.osd != self.me]
        results = await asyncio.gather(local, *remote, return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        return not isinstance(results[0], BaseException), (failures[0] if failures else None)

    async def apply(self, pg, name, payload, version, delete, manifest=False, complete=False):
        """Apply one replicated write here with its log entry; `complete`: this OSD is a
        complete member (osd/pgs.py)."""
        await self.registry.ensure_collections(pg)
        txn = Transaction()
        if delete:
            # A member that missed the object still logs the delete: its log must count every
            # op it was sent.
            if self.registry.present(pg, name):
                txn.delete(pg.collection, name)
        else:
            attrs = {pgs.VERSION_ATTR: pgs.version_bytes(version)}
            if manifest:
                attrs[pgs.MANIFEST_ATTR] = b"1"
            txn.put(pg.collection, name, payload, attrs=attrs)
        self.registry.log_ops(pg, txn, version, name, delete, complete)
        await self.store.apply(txn)
        pg.applied(version, complete)

    async def _replicate(self, osd_id, header, payload):
        osd = self.service.map.osds.get(osd_id)
        if osd is None or not osd["addr"]:
            raise RequestFailed("again", f"replica osd.{osd_id} has no address; retry")
        try:
            connection = await self.service.connections.get(osd_id, osd["addr"])
            await connection.request(header, payload, timeout_s=REPLICA_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as exc:
            raise RequestFailed("again", f"replica osd.{osd_id} did not commit ({exc}); "
                                "retry after the map changes") from None
        except RequestFailed as exc:
            if exc.code == "no_space":
                raise
            raise RequestFailed("again", f"replica osd.{osd_id}: {exc.message}") from None

    async def read(self, pg, name, offset=0, length=None):
        """(stat, bytes to send) of the local copy. Large reads go out as the store's own
        buffer (no copy; the buffer returns to its pool when the transport has sent it and
        drops it); small ones are copied so their buffer is reused at once."""
        record = self.store.stat(pg.collection, name)
        if record.size >= ZERO_COPY_READ_BYTES_MIN:
            return record, await self.store.read(pg.collection, name, offset, length)
        return record, await self.store.read_bytes(pg.collection, name, offset, length)

    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        """Copy the whole object from `source` to `target` (pg_read, pg_push), or remove it
        from `target` when `source` has none."""
        call, header_of = self.registry.call, self.registry.header
        try:
            header, payload = await call(source, header_of(pg, "pg_read", epoch, name=name))
        except RequestFailed as exc:
            if exc.code != "not_found":
                raise
            await call(target, header_of(pg, "pg_remove", epoch, name=name))
            return "removed"
        if pay is not None:
            await pay(len(payload))
        await call(target, header_of(pg, "pg_push", epoch, name=name, version=header["version"],
                                     manifest=header.get("manifest", False)), payload)
        self.registry.recovery_bytes_total += len(payload)
        return "copied"
