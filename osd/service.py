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
the message's epoch is ahead) and that the epoch is not older than the PG's `min_epoch` (raised
when a new primary queries it: osd/peering.py), and apply the same transaction. Every write also
adds a PG log entry (osd/pgs.py). Every object carries its PG version in the `_v` attribute.

Peering and recovery use the `pg_*` ops: pg_query (last_update; raises min_epoch), pg_log,
pg_list (object versions), pg_stat (versions of named objects), pg_read, pg_push, pg_remove and
pg_mark (the member was recovered up to a version); pg_info asks a primary whether its PG is
clean (a stray copy is then deleted).

A primary that serves with a missing set (osd/pgs.py) recovers a missing object before a read
or stat of it, answers deletes and listings from the set, and drops an object from it once a
write replaces it.

Omaps (per-object sorted key/value tables, osd/omap.py) are changed by the `omap` op on the
primary: under the object's lock it checks the op's conditions against its copy, then every
member applies the same resolved update with a log entry (`rep_omap`, osd/backend.py); they are
read with `omap_get` and `omap_list` and recovered with the object (pg_read's `omap`, pg_omap
and pg_push_omap for tables over one page).

Errors go back as codes the client library turns into typed exceptions: not_found, no_space
(the store is out of blocks, or a member is flagged full), quota (the pool is at its quota),
pool_unavailable, wrong_primary, again (retry soon), invalid, io_error, precondition (an omap
condition failed), unsupported.
"""

import dataclasses
import functools
import itertools
import logging
import time

from cairn.common import config, messenger, pg as pgs, server
from cairn.common.codes import Code
from cairn.common.limits import OBJECT_SIZE_BYTES_MAX
from cairn.common.messenger import RequestFailed
from cairn.common.metrics import OpLatency
from cairn.native.errors import DeviceError, DeviceNoSpace
from cairn.osd import access, member_ops, omap
from cairn.osd.backend import ZERO_COPY_READ_BYTES_MIN, slow_osds
from cairn.osd.backend_erasure import ErasureBackend
from cairn.osd.backend_replicated import ReplicatedBackend
from cairn.osd.errors import ChecksumError, InvalidArgument, NoSpace, ObjectNotFound, StoreError
from cairn.osd.pg import Refused, merge_missing
from cairn.osd.request import LIST_PAGE_DEFAULT, byte_ranges, object_name

log = logging.getLogger("cairn.osd")

# How long an op waits for this OSD's map to reach the epoch its sender already has.
MAP_CATCH_UP_S_MAX = 3.0
# The code a store or device error is answered with. DeviceNoSpace: the device refused a write
# (a file device whose filesystem is full, a thin volume out of room); the transaction changed
# nothing and the store stays usable.
ERROR_CODES = ((ObjectNotFound, Code.NOT_FOUND), (NoSpace, Code.NO_SPACE),
               (DeviceNoSpace, Code.NO_SPACE), (ChecksumError, Code.IO_ERROR),
               (InvalidArgument, Code.INVALID))


class ObjectService:
    def __init__(self, daemon):
        self.daemon = daemon
        self.connections = messenger.ConnectionPool(      # osd id -> Connection
            authenticate=daemon.tickets.authenticate, tls=daemon.tls_client)
        self.backends = {"replicated": ReplicatedBackend(self),      # by pool kind
                         "erasure": ErasureBackend(self)}
        self.ops_total = 0
        self._started = {}              # client op serial -> monotonic start (SLOW_OPS)
        self._serial = itertools.count()
        self.op_latency = OpLatency()   # client ops, for /metrics
        self.client_bytes_in = 0        # payload bytes of client requests
        self.client_bytes_out = 0       # payload bytes of their replies
        self.direct_reads_total = 0     # shard reads served to clients (`_shard_read`)
        self.fast_ops = {"get": 0, "put": 0, "rep_put": 0}  # answered from callbacks (`fast`)

    @property
    def store(self):
        return self.daemon.store

    @property
    def map(self):
        return self.daemon.monc.map

    @property
    def registry(self):
        return self.daemon.pgs

    def backend(self, pool):
        return self.backends[pool["kind"]]

    # -- dispatch ---------------------------------------------------------------------------------

    def ops_older_than(self, age_s):
        """How many client ops in progress started more than `age_s` ago."""
        oldest = time.monotonic() - age_s
        return sum(1 for started in self._started.values() if started < oldest)

    async def handle(self, header, payload):
        """Answer one op of `OPS` (the daemon checked the name and the peer's access)."""
        op = OPS[header["op"]]
        if not op.read_only:
            server.finish_even_if_lost()
        if not op.client:
            return await self._handle(op, header, payload)
        serial = next(self._serial)
        started_ns = time.monotonic_ns()
        self._started[serial] = started_ns / 1e9
        self.client_bytes_in += len(payload)
        try:
            reply, data = await self._handle(op, header, payload)
            self.client_bytes_out += sum(map(len, data)) if type(data) is tuple else len(data)
            return reply, data
        finally:
            del self._started[serial]
            self.op_latency.record(op.name, time.monotonic_ns() - started_ns)

    async def _handle(self, op, header, payload):
        try:
            return await op.handler(self, header, payload)
        except (ObjectNotFound, NoSpace, DeviceNoSpace, ChecksumError, InvalidArgument,
                Refused) as exc:
            raise self._failure(exc) from None

    def _failure(self, exc):
        """The RequestFailed an op's error is answered with (`ERROR_CODES`; the client library
        turns the code into a typed exception); `exc` itself when it is no such error."""
        epoch = self.map.epoch if self.map is not None else 0
        if isinstance(exc, Refused):
            return RequestFailed(exc.code, f"{exc.message} (osd.{self.daemon.id}, epoch {epoch})")
        for kind, code in ERROR_CODES:
            if isinstance(exc, kind):
                return RequestFailed(code, f"osd.{self.daemon.id}: {exc} (epoch {epoch})")
        return exc

    # -- map checks -------------------------------------------------------------------------------

    async def pg_of(self, header, as_primary=True):
        """(pool dict, PgShell) for the op's PG, after the map checks."""
        if self.map is None:
            raise RequestFailed(Code.AGAIN, f"osd.{self.daemon.id} is starting (no map yet)")
        epoch = header.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise RequestFailed(
                Code.INVALID, f"epoch must be a non-negative integer (was {epoch!r})")
        if epoch > self.map.epoch:
            try:
                await self.daemon.monc.wait_for_epoch(epoch, timeout_s=MAP_CATCH_UP_S_MAX)
            except TimeoutError:
                raise RequestFailed(Code.AGAIN, f"osd.{self.daemon.id} is at epoch "
                                    f"{self.map.epoch}, behind {epoch}; retry") from None
        cmap = self.map
        pool_id, pg_index = header.get("pool"), header.get("pg")
        pool = pgs.pool_by_id(cmap, pool_id) if isinstance(pool_id, int) else None
        if pool is None:
            raise RequestFailed(
                Code.NOT_FOUND, f"no pool with id {pool_id!r} at epoch {cmap.epoch}")
        if not isinstance(pg_index, int) or not 0 <= pg_index < pool["pg_num"]:
            raise RequestFailed(Code.INVALID, f"pg {pg_index!r} is not in pool {pool['name']} "
                                f"({pool['pg_num']} PGs)")
        if pool["kind"] not in self.backends:
            raise RequestFailed(Code.UNSUPPORTED, f"pool {pool['name']} is {pool['kind']}; this "
                                "version serves objects in replicated pools only")
        pg = self.registry.pgs.get((pool_id, pg_index))
        acting = pg.interval[1] if pg is not None and pg.interval else None
        if as_primary and (acting is None or acting.primary != self.daemon.id):
            raise RequestFailed(Code.WRONG_PRIMARY, f"osd.{self.daemon.id} is not the primary of "
                                f"pg {pool_id}.{pg_index:x} at epoch {cmap.epoch} (primary: "
                                f"{acting.primary if acting else 'elsewhere'})")
        return pool, pg

    # -- primary ops --------------------------------------------------------------------------------

    async def _put(self, header, payload):
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        if len(payload) > OBJECT_SIZE_BYTES_MAX:
            raise RequestFailed(Code.INVALID, f"object of {len(payload)} bytes is over the limit "
                                f"({OBJECT_SIZE_BYTES_MAX}); stripe it (put_stream)")
        self._check_room(pool, pg)
        return await self._write(pool, pg, name, payload, delete=False,
                                 manifest=bool(header.get("manifest")))

    def _check_room(self, pool, pg):
        """Refuse a write (never a delete) to a pool at its quota or to a PG with a member
        the map flags full, or while this OSD is past the full ratio itself (before the map
        says so): nothing is written, reads and deletes go on (mon/capacity.py)."""
        if pool.get("quota_full"):
            limits = [f"{pool[field]} {unit}" for field, unit in
                      (("max_objects", "objects"), ("max_bytes", "bytes")) if pool.get(field)]
            raise RequestFailed(Code.QUOTA, f"quota exceeded: pool {pool['name']} is at its quota "
                                f"({' or '.join(limits) or 'reached'}); raise it with 'cairn "
                                f"pool set-quota {pool['name']}' or delete objects")
        members = pg.acting.members if pg.acting is not None else ()
        full = [m for m in members if m is not None and self.map.osds.get(m, {}).get("full")]
        statfs = self.store.statfs()
        ratio = statfs["used_bytes"] / statfs["total_bytes"] if statfs["total_bytes"] else 0.0
        full_ratio = config.value(self.map.config, "osd.full_ratio")
        if ratio >= full_ratio and self.daemon.id not in full:
            full.append(self.daemon.id)
        if full:
            where = f"pg {pg.key[0]}.{pg.key[1]:x} of pool {pool['name']}"
            raise RequestFailed(Code.NO_SPACE, f"no space: {', '.join(f'osd.{m}' for m in full)} "
                                f"of {where} reached the full ratio ({full_ratio:.0%}); writes "
                                "refused, reads and deletes still work (delete data or add "
                                "OSDs)")

    async def _delete(self, header, payload):
        pool, pg = await self.pg_of(header)
        return await self._write(pool, pg, object_name(header), None, delete=True)

    async def _write(self, pool, pg, name, payload, delete, manifest=False):
        acting = pg.check_writable(pool["name"])
        pg = await self.registry.wait_active(pg.key)
        async with pg.object_lock(name):
            plan = await self._write_under_lock(pool, pg, acting, name, payload, delete,
                                                manifest)
            self.ops_total += 1
            return {"version": plan.version, "epoch": plan.epoch}, b""

    async def _write_under_lock(self, pool, pg, acting, name, payload, delete, manifest):
        self.registry.load_log(pg)
        plan = pg.plan_write(acting, self.map.epoch, name, delete, manifest,
                             existed=self.registry.exists(pg, name))
        committed, failure = await self.backend(pool).write(pg, plan, payload)
        pg.write_finished(plan, committed, acknowledged=failure is None)
        if failure is not None:
            # Not acknowledged. Members that did commit keep the new version; the next
            # peering reconciles them (an unacknowledged write may appear whole or not).
            raise failure
        return plan

    async def write_locked(self, pg, name, payload, delete, manifest):
        """A write for the PG itself (a rollback during recovery) by a caller that already
        holds the object's lock; the PG must be active and writable."""
        pool = pgs.pool_by_id(self.map, pg.key[0])
        if not pg.active.is_set():
            raise RequestFailed(Code.AGAIN, f"pg {pg.key[0]}.{pg.key[1]:x} is {pg.state}; a "
                                "rollback waits until it is active")
        try:
            await self._write_under_lock(pool, pg, pg.check_writable(pool["name"]), name,
                                         payload, delete, manifest)
        except Refused as exc:
            raise RequestFailed(exc.code, exc.message) from None

    async def _get(self, header, payload):
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        pg = await self.registry.wait_active(pg.key)
        # Room for the reply first (before any lock): a peer that leaves its replies unread
        # waits here, holding nothing of ours.
        await server.reserve_reply(self.backend(pool).reply_bytes(
            pg, name, header.get("offset", 0), header.get("length")))
        await pg.locks.acquire(name)                     # no read of a write not yet everywhere
        try:
            await self.registry.recover_now(pg, name)
            if not self.store.has_collection(pg.collection):
                raise ObjectNotFound(pg.collection, name)
            backend = self.backend(pool)
            offset, length = header.get("offset", 0), header.get("length")
            direct = None
            if header.get("direct") and isinstance(backend, ErasureBackend):
                direct = await backend.direct_plan(pg, name, offset, length)
            if direct is not None:
                record, plan, data = direct
            else:
                record, data = await backend.read(pg, name, offset, length)
        finally:
            pg.locks.release(name)
        reply = {"size": record.size, "version": pgs.version_of(record.attrs),
                 "manifest": pgs.MANIFEST_ATTR in record.attrs}
        if direct is not None:
            reply["direct"] = plan
        return reply, data

    # -- ops answered without a task -------------------------------------------------------------

    def fast(self, connection, received):
        """server.serve's `fast`: a get (`fast_get`), a put (`fast_put`) or a replica's
        write (`fast_rep_put`) taken to be answered from callbacks, when nothing about it
        needs waiting."""
        op = received.header.get("op")
        if op == "get":
            return self.fast_get(connection, received)
        if op == "rep_put":
            return self.fast_rep_put(connection, received)
        if op == "put":
            return self.fast_put(connection, received)
        return False

    def _fast_pg(self, connection, header, as_primary):
        """(map, PgShell) of a request a fast path may take: this OSD's map is at least the
        sender's epoch, the peer may send it (access.check), the pool is replicated and the
        PG is known here (and, `as_primary`, active with this OSD its primary); else None.
        Raises RequestFailed when the peer may not send it (the caller then declines the
        request, and the usual path answers the refusal)."""
        cmap = self.map
        epoch = header.get("epoch", 0)
        if cmap is None or type(epoch) is not int or epoch > cmap.epoch:
            return None
        access.check(connection.peer, cmap, header)
        pool, pg_index = pgs.pool_by_id(cmap, header.get("pool")), header.get("pg")
        if pool is None or pool["kind"] != "replicated" or type(pg_index) is not int:
            return None
        pg = self.registry.pgs.get((pool["id"], pg_index))
        if pg is None or as_primary and (not pg.interval or
                                         pg.interval[1].primary != self.daemon.id or
                                         not pg.active.is_set()):
            return None
        return cmap, pool, pg

    def fast_put(self, connection, received):
        """Take a client's put to a replicated PG when `_put` would not wait before its write
        (the checks of `_pg_of`, `_check_room` and `check_writable` pass, the PG is active here
        as primary with its log loaded and its collections made, the object's lock is free):
        the write starts here (the local transaction's task, the replica writes) and is
        answered from their callbacks (`_fast_written`). Anything else goes the usual way;
        from the write's start on, its outcome is the answer."""
        header, payload = received.header, received.payload
        try:
            found = self._fast_pg(connection, header, as_primary=True)
            if found is None:
                return False
            cmap, pool, pg = found
            name = header.get("name")
            if pg.log_names is None or type(name) is not str or not name or \
                    len(payload) > OBJECT_SIZE_BYTES_MAX or \
                    not self.store.has_collection(pg.collection) or \
                    not self.store.has_collection(pg.log_collection):
                return False
            if pg.locks.held(name):
                return False
            self._check_room(pool, pg)
            acting = pg.check_writable(pool["name"])
        except (RequestFailed, Refused):
            return False                # refused: `_put` makes the same checks and answers
        manifest = bool(header.get("manifest"))
        pg.locks.take(name)
        serial = next(self._serial)
        started_ns = time.monotonic_ns()
        self._started[serial] = started_ns / 1e9
        self.client_bytes_in += len(payload)
        finish = functools.partial(self._fast_written, connection, received, pg, name, serial,
                                   started_ns)
        try:
            plan = pg.plan_write(acting, cmap.epoch, name, False, manifest,
                                 existed=self.registry.exists(pg, name))
        except Exception as exc:
            finish(None, False, exc)
            return True
        backend = self.backends["replicated"]
        complete = plan.target(self.daemon.id).complete
        try:
            local = self.store.start_apply(
                backend.transaction(pg, name, payload, plan.version, False, manifest, complete,
                                    received.block_crcs),
                then=lambda: pg.applied(plan.version, complete))
        except Exception as exc:
            finish(plan, False, exc)
            return True
        remote = backend.start_replicas(pg, plan, payload, received.payload_crc)
        backend.when_written(local, remote, functools.partial(finish, plan))
        return True

    def _fast_written(self, connection, received, pg, name, serial, started_ns, plan, committed,
                      failure):
        """A fast put's write is done everywhere (or failed to start: `plan` None when no
        version was given): what `_write` and the daemon's handler do after it."""
        try:
            if plan is not None:
                pg.write_finished(plan, committed, acknowledged=failure is None)
        except Exception as exc:
            failure = exc
        finally:
            pg.locks.release(name)
            del self._started[serial]
        if failure is None:
            self.ops_total += 1
            self.fast_ops["put"] += 1
            self.daemon.audit_op(connection.peer, received.header, "ok")
            connection.answer_fast(received, {"version": plan.version, "epoch": plan.epoch},
                                   b"", 0)
        else:
            failure = self._failure(failure)
            if isinstance(failure, RequestFailed):
                self.daemon.audit_op(connection.peer, received.header, failure.code)
            connection.fail_fast(received, failure)
        self.op_latency.record("put", time.monotonic_ns() - started_ns)

    def fast_rep_put(self, connection, received):
        """Take a replica write of a replicated PG when `_rep_put` would not wait before its
        store transaction (the map current, the sender this PG's primary here, the PG's
        collections made): the transaction's own task (Store.start_apply: it runs to its end)
        answers from its done callback. Anything else goes the usual way, which says what was
        wrong; from the transaction's start on, its outcome is the answer."""
        header = received.header
        try:
            found = self._fast_pg(connection, header, as_primary=False)
            if found is None:
                return False
            _, _, pg = found
            name, version = header.get("name"), header.get("version")
            if type(name) is not str or not name or type(version) is not int or version <= 0 \
                    or not self.store.has_collection(pg.collection) or \
                    not self.store.has_collection(pg.log_collection):
                return False
            pg.check_from_primary(header.get("from"), header.get("epoch", 0))
        except (RequestFailed, Refused):
            return False                # refused: `_rep_put` makes the same checks and answers
        complete = bool(header.get("complete"))
        try:
            txn = self.backends["replicated"].transaction(
                pg, name, received.payload, version, False, bool(header.get("manifest")),
                complete, received.block_crcs)
            task = self.store.start_apply(txn, then=lambda: pg.applied(version, complete))
        except Exception as exc:
            connection.fail_fast(received, self._failure(exc))
            return True
        task.add_done_callback(lambda done: self._fast_applied(connection, received, done))
        return True

    def _fast_applied(self, connection, received, task):
        if task.cancelled():
            connection.fail_fast(received, RequestFailed(
                Code.AGAIN, f"osd.{self.daemon.id} is stopping; retry"))
            return
        exc = task.exception()
        if exc is not None:
            connection.fail_fast(received, self._failure(exc))
            return
        self.fast_ops["rep_put"] += 1
        connection.answer_fast(received, {}, b"", 0)


    def fast_get(self, connection, received):
        """Take a `get` of a replicated object when nothing about it needs waiting (the map is
        current, the PG active here as primary, the object's lock free, nothing to recover,
        room for the reply, this disk not flagged slow, the object in one piece), start its
        device read and answer from the read's callback (or at once, from the read cache): no
        task, no coroutine and no future per get. Anything else, and any error, goes the usual
        way (`_get`), which also says what was wrong. The same checks as `_get`, in the same
        order of effect: a fast get and a usual one cannot tell apart."""
        header = received.header
        try:
            if header.get("direct"):
                return False
            found = self._fast_pg(connection, header, as_primary=True)
            if found is None or self.daemon.id in slow_osds(found[0]):
                return False
            pg = found[2]
            name, offset, length = header.get("name"), header.get("offset", 0), \
                header.get("length")
            if type(name) is not str or not name or name in pg.missing or \
                    type(offset) is not int or (length is not None and type(length) is not int) \
                    or pg.locks.held(name):
                return False
            pending = self.store.begin_read(pg.collection, name, offset, length)
            if pending is None:
                return False
        except (RequestFailed, StoreError, DeviceError):
            return False                # refused or failed: `_get` reads again and answers
        reserved = pending.length
        if not connection.reserve_now(reserved):
            self.store.abandon_read(pending)
            return False
        pg.locks.take(name)
        serial = next(self._serial)
        started_ns = time.monotonic_ns()
        self._started[serial] = started_ns / 1e9
        if pending.done:                # from the read cache: answered now
            self._fast_got(connection, received, pending, pg, reserved, serial, started_ns)
        else:
            pending.then = lambda: self._fast_got(connection, received, pending, pg, reserved,
                                                  serial, started_ns)
        return True

    def _fast_got(self, connection, received, pending, pg, reserved, serial, started_ns):
        pg.locks.release(pending.name)
        del self._started[serial]
        try:
            data, data_crc = self.store.finish_read(pending, copy_below=ZERO_COPY_READ_BYTES_MIN)
        except (StoreError, DeviceError):
            connection.fall_back(received, reserved)      # read around a damaged copy, errors
            return
        record = pending.record
        self.fast_ops["get"] += 1
        self.client_bytes_out += len(data)
        connection.answer_fast(received, {"size": record.size,
                                          "version": pgs.version_of(record.attrs),
                                          "manifest": pgs.MANIFEST_ATTR in record.attrs},
                               data, reserved, data_crc)
        self.op_latency.record("get", time.monotonic_ns() - started_ns)

    async def _shard_read(self, header, payload):
        """A client's read of byte `ranges` of this member's shard of an object, at the
        `version` and PG `interval` its primary gave it in a direct read plan (`_get` with
        `direct`). Refused as `stale` when this member's shard is not that version or the PG
        has moved to another interval: the client then reads through the primary."""
        pool, pg = await self.pg_of(header, as_primary=False)
        name = object_name(header)
        ranges = byte_ranges(header, required=True)
        shard, version = header.get("shard"), header.get("version")
        if type(shard) is not int or type(version) is not int:
            raise RequestFailed(Code.INVALID, "a shard read names the shard and version (integers)")
        backend = self.backend(pool)
        where = f"pg {pg.key[0]}.{pg.key[1]:x}" if pg is not None else "that pg"
        if not isinstance(backend, ErasureBackend) or pg is None or pg.interval is None or \
                pg.interval[0] != header.get("interval") or \
                backend.position(pg, self.daemon.id) != shard:
            raise RequestFailed(Code.STALE, f"osd.{self.daemon.id} does not serve shard {shard!r} "
                                f"of {where} in interval {header.get('interval')!r}; read "
                                "through the primary")
        await server.reserve_reply(sum(length for _, length in ranges))
        record, data = await backend.read_local(pg, name, [tuple(r) for r in ranges])
        found = (pgs.version_of(record.attrs), pgs.shard_of(record.attrs))
        if found != (version, shard):
            raise RequestFailed(Code.STALE, f"osd.{self.daemon.id} holds version {found[0]} of "
                                f"shard {found[1]} of {name!r}, not version {version} of shard "
                                f"{shard}; read through the primary")
        self.direct_reads_total += 1
        return {"version": version}, data

    async def _stat(self, header, payload):
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        pg = await self.registry.wait_active(pg.key)
        if name in pg.missing:
            async with pg.object_lock(name):
                await self.registry.recover_now(pg, name)
        if not self.store.has_collection(pg.collection):
            raise ObjectNotFound(pg.collection, name)
        record, extra = await self.backend(pool).stat(pg, name)
        return {"size": record.size, "version": pgs.version_of(record.attrs),
                "mtime_ns": record.mtime_ns, "manifest": pgs.MANIFEST_ATTR in record.attrs,
                "omap": getattr(record, "omap", False), **extra}, b""

    async def _list(self, header, payload):
        pool, pg = await self.pg_of(header)
        pg = await self.registry.wait_active(pg.key)
        prefix, start_after = header.get("prefix", ""), header.get("start_after")
        limit = header.get("limit", LIST_PAGE_DEFAULT)
        names, following = [], None
        if self.store.has_collection(pg.collection):
            names, following = self.store.list_objects(pg.collection, prefix, start_after, limit)
        if pg.missing:
            names, following = merge_missing(names, following, pg.missing, prefix, start_after,
                                             limit)
        return {"names": names, "next": following}, b""

    # -- omaps ------------------------------------------------------------------------------------

    async def _omap(self, header, payload):
        """Change an object's omap if its conditions hold (osd/omap.py), on every member;
        `create`: make the object (empty) if it is absent."""
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        request = omap.parse_update(header)
        if request.update.sets:
            self._check_room(pool, pg)
        acting = pg.check_writable(pool["name"])
        pg = await self.registry.wait_active(pg.key)
        await pg.locks.acquire(name)
        try:
            await self.registry.recover_now(pg, name)
            record = self.registry.local_record(pg, name)
            prior = pgs.version_of(record.attrs) if record is not None else 0
            if record is None and not request.create:
                raise ObjectNotFound(pg.collection, name)
            current, used = {}, []
            if record is not None and request.keys_checked:
                current = self.store.omap_get(pg.collection, name, request.keys_checked)
            if record is not None:
                used = [prefix for prefix in request.prefixes_checked
                        if self.store.omap_list(pg.collection, name, prefix=prefix, limit=1)[0]]
            omap.check_conditions(request, name, prior, current, used)
            self.registry.load_log(pg)
            plan = pg.plan_write(acting, self.map.epoch, name, False, False,
                                 existed=record is not None)
            committed, failure = await self.backend(pool).write_omap(pg, plan, prior,
                                                                     request.update)
            pg.write_finished(plan, committed, acknowledged=failure is None)
            if failure is not None:
                raise failure
            self.ops_total += 1
            return {"version": plan.version, "epoch": plan.epoch}, b""
        finally:
            pg.locks.release(name)

    async def _omap_read(self, header, read):
        """`read(pg, name)` under the object's lock, once the primary's copy is current."""
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        pg = await self.registry.wait_active(pg.key)
        async with pg.object_lock(name):
            await self.registry.recover_now(pg, name)
            if not self.store.has_collection(pg.collection):
                raise ObjectNotFound(pg.collection, name)
            version = pgs.version_of(self.store.stat(pg.collection, name).attrs)
            return {"version": version, **read(pg, name)}, b""

    async def _omap_get(self, header, payload):
        keys = omap.parse_keys(header)
        return await self._omap_read(header, lambda pg, name: {"values": [
            found.get(key) for found in [self.store.omap_get(pg.collection, name, keys)]
            for key in keys]})

    async def _omap_list(self, header, payload):
        start_after, prefix, limit = omap.parse_listing(header)

        def page(pg, name):
            entries, more = self.store.omap_list(pg.collection, name, start_after, prefix, limit,
                                                 max_bytes=omap.LIST_REPLY_BYTES)
            return {"entries": [list(pair) for pair in entries], "more": more}
        return await self._omap_read(header, page)

    async def close(self):
        await self.connections.close()


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    handler: object         # async (service, header, payload) -> (reply header, payload)
    client: bool            # a client's op: counted, timed (SLOW_OPS, /metrics)
    read_only: bool         # changes nothing: a lost connection cancels it; any other op runs
                            # to its end (server.finish_even_if_lost), so the store and the
                            # PG's record of it stay in step


def _ops(*rows):
    return {name: Op(name, handler, client, read_only)
            for name, handler, client, read_only in rows}


# Every op an OSD serves, by name: client ops first, then the member ops (osd/member_ops.py).
OPS = _ops(
    ("put", ObjectService._put, True, False),
    ("get", ObjectService._get, True, True),
    ("stat", ObjectService._stat, True, True),
    ("delete", ObjectService._delete, True, False),
    ("list", ObjectService._list, True, True),
    ("omap", ObjectService._omap, True, False),
    ("omap_get", ObjectService._omap_get, True, True),
    ("omap_list", ObjectService._omap_list, True, True),
    ("shard_read", ObjectService._shard_read, True, True),
    ("rep_put", member_ops.rep_put, False, False),
    ("rep_delete", member_ops.rep_delete, False, False),
    ("rep_omap", member_ops.rep_omap, False, False),
    ("pg_query", member_ops.pg_query, False, True),
    ("pg_list", member_ops.pg_list, False, True),
    ("pg_log", member_ops.pg_log, False, True),
    ("pg_stat", member_ops.pg_stat, False, True),
    ("pg_read", member_ops.pg_read, False, True),
    ("pg_push", member_ops.pg_push, False, False),
    ("pg_omap", member_ops.pg_omap, False, False),
    ("pg_push_omap", member_ops.pg_push_omap, False, False),
    ("pg_remove", member_ops.pg_remove, False, False),
    ("pg_mark", member_ops.pg_mark, False, False),
    ("pg_info", member_ops.pg_info, False, True),
    ("pg_scrub", member_ops.pg_scrub, False, False),
    ("pg_scrub_local", member_ops.pg_scrub_local, False, False),
    ("pg_versions", member_ops.pg_versions, False, True),
)
