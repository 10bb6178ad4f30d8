"""The OSD's object service: client ops on the primary, replication to the acting set.

A client sends each op to the PG's primary (it computes placement itself). The primary:
1. checks that its map agrees it is the primary (an older map waits briefly for the newer epoch;
   a client with an older map is told `wrong_primary` and retries after refreshing its map);
2. refuses writes when fewer than min_size members are up (`pool_unavailable`);
3. takes the object's lock, so writes to one object are applied in the same order everywhere
   and a read never sees a write that is not yet on every member;
4. assigns the next PG version, writes locally and sends `rep_put`/`rep_delete` to every other
   member in parallel, and acknowledges only when every acting member has committed.

Replicas check the sender is the primary of their map for that PG (waiting for a newer map if
the message's epoch is ahead) and apply the same transaction. Every object carries its PG version
in the `_v` attribute.

Errors go back as codes the client library turns into typed exceptions: not_found, no_space,
pool_unavailable, wrong_primary, again (retry soon), invalid, io_error.
"""

import asyncio
import logging

from cairn.common import messenger
from cairn.common.limits import OBJECT_SIZE_BYTES_MAX
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common import pg as pgs
from cairn.osd.errors import (ChecksumError, CollectionExists, InvalidArgument, NoSpace,
                              ObjectNotFound)
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")

# How long an op waits for this OSD's map to reach the epoch its sender already has.
MAP_CATCH_UP_S_MAX = 3.0
# Deadline for a replica's answer; a replica slower than this fails the op (the client
# retries), and peering takes over if the replica is gone.
REPLICA_TIMEOUT_S = 20.0
LIST_PAGE_DEFAULT = 1000


class ObjectService:
    def __init__(self, daemon):
        self.daemon = daemon
        self._acting_cache = {}             # (epoch, pool id, pg) -> Acting
        self._object_locks = {}             # (collection, name) -> [lock, users]
        self._collection_lock = asyncio.Lock()
        self._sequence = {}                 # collection -> last sequence used
        self._replica_connections = messenger.ConnectionPool()
        self.ops_total = 0

    @property
    def store(self):
        return self.daemon.store

    @property
    def map(self):
        return self.daemon.monc.map

    # -- dispatch ---------------------------------------------------------------------------------

    OPS = ("put", "get", "stat", "delete", "list", "rep_put", "rep_delete")

    async def handle(self, header, payload):
        op = header["op"]
        try:
            return await getattr(self, f"_{op}")(header, payload)
        except ObjectNotFound as exc:
            raise RequestFailed("not_found", f"object {exc.name!r} not found") from None
        except NoSpace as exc:
            raise RequestFailed("no_space", str(exc)) from None
        except ChecksumError as exc:
            raise RequestFailed("io_error", f"osd.{self.daemon.id}: {exc}") from None
        except InvalidArgument as exc:
            raise RequestFailed("invalid", str(exc)) from None

    # -- map checks -------------------------------------------------------------------------------

    async def _pg_of(self, header, as_primary=True):
        """(pool dict, pg index, Acting) for the op's PG, after the map checks."""
        epoch = header.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise RequestFailed("invalid", f"epoch must be a non-negative integer (was {epoch!r})")
        if epoch > self.map.epoch:
            try:
                await self.daemon.monc.wait_for_epoch(epoch, timeout_s=MAP_CATCH_UP_S_MAX)
            except TimeoutError:
                raise RequestFailed("again", f"osd.{self.daemon.id} is at epoch "
                                    f"{self.map.epoch}, behind {epoch}; retry") from None
        cmap = self.map
        pool_id, pg_index = header.get("pool"), header.get("pg")
        pool = pgs.pool_by_id(cmap, pool_id) if isinstance(pool_id, int) else None
        if pool is None:
            raise RequestFailed("not_found", f"no pool with id {pool_id!r} at epoch {cmap.epoch}")
        if not isinstance(pg_index, int) or not 0 <= pg_index < pool["pg_num"]:
            raise RequestFailed("invalid", f"pg {pg_index!r} is not in pool {pool['name']} "
                                f"({pool['pg_num']} PGs)")
        key = (cmap.epoch, pool_id, pg_index)
        acting = self._acting_cache.get(key)
        if acting is None:
            if len(self._acting_cache) > 100_000:
                self._acting_cache.clear()
            acting = self._acting_cache[key] = pgs.acting_set(cmap, pool["name"], pg_index)
        if as_primary and acting.primary != self.daemon.id:
            raise RequestFailed("wrong_primary", f"osd.{self.daemon.id} is not the primary of "
                                f"pg {pool_id}.{pg_index:x} at epoch {cmap.epoch} (primary: "
                                f"{acting.primary})")
        return pool, pg_index, acting

    def _name(self, header):
        name = header.get("name")
        if not isinstance(name, str) or not name:
            raise RequestFailed("invalid", "an object name is a non-empty string")
        return name

    # -- object locks -------------------------------------------------------------------------------

    async def _locked(self, key):
        entry = self._object_locks.get(key)
        if entry is None:
            entry = self._object_locks[key] = [asyncio.Lock(), 0]
        entry[1] += 1
        await entry[0].acquire()
        return entry

    def _unlock(self, key, entry):
        entry[0].release()
        entry[1] -= 1
        if entry[1] == 0:
            del self._object_locks[key]

    async def _ensure_collection(self, collection):
        if self.store.has_collection(collection):
            return
        async with self._collection_lock:
            if not self.store.has_collection(collection):
                try:
                    await self.store.apply(Transaction().create_collection(collection))
                except CollectionExists:
                    pass

    # -- primary ops --------------------------------------------------------------------------------

    async def _put(self, header, payload):
        pool, pg_index, acting = await self._pg_of(header)
        name = self._name(header)
        if len(payload) > OBJECT_SIZE_BYTES_MAX:
            raise RequestFailed("invalid", f"object of {len(payload)} bytes is over the limit "
                                f"({OBJECT_SIZE_BYTES_MAX}); stripe it (put_stream)")
        manifest = bool(header.get("manifest"))
        return await self._replicated_write(pool, pg_index, acting, name, payload, delete=False,
                                            manifest=manifest)

    async def _delete(self, header, payload):
        pool, pg_index, acting = await self._pg_of(header)
        name = self._name(header)
        return await self._replicated_write(pool, pg_index, acting, name, None, delete=True)

    async def _replicated_write(self, pool, pg_index, acting, name, payload, delete,
                                manifest=False):
        if not acting.writable:
            raise RequestFailed("pool_unavailable", f"pg {pool['id']}.{pg_index:x} of pool "
                                f"{pool['name']} has {len(acting.up_members)} members up, "
                                f"fewer than min_size {pool['min_size']}: writes refused")
        collection = pgs.collection(pool["id"], pg_index)
        await self._ensure_collection(collection)
        key = (collection, name)
        entry = await self._locked(key)
        try:
            epoch = self.map.epoch
            sequence = self._sequence.get(collection, 0) + 1
            self._sequence[collection] = sequence
            version = pgs.make_version(epoch, sequence)
            if delete:
                self.store.stat(collection, name)          # ObjectNotFound before any change
            header = {"op": "rep_delete" if delete else "rep_put", "pool": pool["id"],
                      "pg": pg_index, "name": name, "version": version, "epoch": epoch,
                      "from": self.daemon.id, "manifest": manifest}
            replicas = [m for m in acting.up_members if m != self.daemon.id]
            local = self._apply_local(collection, name, payload, version, delete, manifest)
            remote = [self._replicate(osd_id, header, payload or b"") for osd_id in replicas]
            results = await asyncio.gather(local, *remote, return_exceptions=True)
            failures = [result for result in results if isinstance(result, BaseException)]
            if failures:
                # Not acknowledged. Members that did commit keep the new version; peering
                # reconciles them (an unacknowledged write may appear whole or not at all).
                raise failures[0]
            self.ops_total += 1
            return {"version": version, "epoch": epoch}, b""
        finally:
            self._unlock(key, entry)

    async def _apply_local(self, collection, name, payload, version, delete, manifest=False):
        txn = Transaction()
        if delete:
            txn.delete(collection, name)
        else:
            attrs = {pgs.VERSION_ATTR: pgs.version_bytes(version)}
            if manifest:
                attrs[pgs.MANIFEST_ATTR] = b"1"
            txn.put(collection, name, payload, attrs=attrs)
        await self.store.apply(txn)

    async def _replicate(self, osd_id, header, payload):
        osd = self.map.osds.get(osd_id)
        if osd is None or not osd["addr"]:
            raise RequestFailed("again", f"replica osd.{osd_id} has no address; retry")
        try:
            connection = await self._replica_connections.get(osd_id, osd["addr"])
            await connection.request(header, payload, timeout_s=REPLICA_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as exc:
            raise RequestFailed("again", f"replica osd.{osd_id} did not commit ({exc}); "
                                "retry after the map changes") from None
        except RequestFailed as exc:
            if exc.code in ("no_space", "not_found"):
                raise
            raise RequestFailed("again", f"replica osd.{osd_id}: {exc.message}") from None

    async def _get(self, header, payload):
        pool, pg_index, acting = await self._pg_of(header)
        name = self._name(header)
        collection = pgs.collection(pool["id"], pg_index)
        if not self.store.has_collection(collection):
            raise RequestFailed("not_found", f"object {name!r} not found")
        offset = header.get("offset", 0)
        length = header.get("length")
        key = (collection, name)
        entry = await self._locked(key)            # no read of a write not yet everywhere
        try:
            record = self.store.stat(collection, name)
            data = await self.store.read_bytes(collection, name, offset, length)
        finally:
            self._unlock(key, entry)
        return {"size": record.size, "version": pgs.version_of(record.attrs),
                "manifest": pgs.MANIFEST_ATTR in record.attrs}, data

    async def _stat(self, header, payload):
        pool, pg_index, acting = await self._pg_of(header)
        name = self._name(header)
        collection = pgs.collection(pool["id"], pg_index)
        if not self.store.has_collection(collection):
            raise RequestFailed("not_found", f"object {name!r} not found")
        record = self.store.stat(collection, name)
        return {"size": record.size, "version": pgs.version_of(record.attrs),
                "mtime_ns": record.mtime_ns, "manifest": pgs.MANIFEST_ATTR in record.attrs}, b""

    async def _list(self, header, payload):
        pool, pg_index, acting = await self._pg_of(header)
        collection = pgs.collection(pool["id"], pg_index)
        if not self.store.has_collection(collection):
            return {"names": [], "next": None}, b""
        limit = header.get("limit", LIST_PAGE_DEFAULT)
        names, following = self.store.list_objects(collection, header.get("prefix", ""),
                                                   header.get("start_after"), limit)
        return {"names": names, "next": following}, b""

    # -- replica ops ------------------------------------------------------------------------------

    async def _check_from_primary(self, header):
        pool, pg_index, acting = await self._pg_of(header, as_primary=False)
        if acting.primary != header.get("from"):
            raise RequestFailed("wrong_primary", f"osd.{header.get('from')} is not the primary "
                                f"of pg {pool['id']}.{pg_index:x} at epoch {self.map.epoch}")
        if self.daemon.id not in acting.up_members:
            raise RequestFailed("wrong_primary", f"osd.{self.daemon.id} is not in the acting "
                                f"set of pg {pool['id']}.{pg_index:x} at epoch {self.map.epoch}")
        version = header.get("version")
        if not isinstance(version, int) or version <= 0:
            raise RequestFailed("invalid", "a replicated op carries its PG version")
        return pool, pg_index, version

    async def _rep_put(self, header, payload):
        pool, pg_index, version = await self._check_from_primary(header)
        collection = pgs.collection(pool["id"], pg_index)
        await self._ensure_collection(collection)
        await self._apply_local(collection, self._name(header), payload, version, delete=False,
                                manifest=bool(header.get("manifest")))
        return {}, b""

    async def _rep_delete(self, header, payload):
        pool, pg_index, version = await self._check_from_primary(header)
        collection = pgs.collection(pool["id"], pg_index)
        name = self._name(header)
        if self.store.has_collection(collection):
            try:
                await self._apply_local(collection, name, None, version, delete=True)
            except ObjectNotFound:
                pass                    # already gone here: the delete's effect holds
        return {}, b""

    async def close(self):
        await self._replica_connections.close()
