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
import enum
import functools
import itertools
import logging
import time

from cairn.common import config, pg as pgs, server
from cairn.common.codes import Code
from cairn.common.limits import OBJECT_SIZE_BYTES_MAX
from cairn.common.messenger import RequestFailed
from cairn.common.metrics import OpLatency
from cairn.native.errors import DeviceError, DeviceNoSpace
from cairn.osd import access, hedged, member_ops, omap
from cairn.osd.backend import ZERO_COPY_READ_BYTES_MIN, slow_osds
from cairn.osd.backend_erasure import ErasureBackend
from cairn.osd.errors import (ChecksumError, CollectionNotFound, InvalidArgument, NoSpace,
                              ObjectNotFound, StoreError)
from cairn.osd.pg import Refused, merge_missing
from cairn.osd.request import LIST_PAGE_DEFAULT, byte_ranges, object_name, op_version

log = logging.getLogger("cairn.osd")

# How long an op waits for this OSD's map to reach the epoch its sender already has.
MAP_CATCH_UP_S_MAX = 3.0
# Waits one put may go through before it is answered `again` (each wait makes progress: a map,
# an active PG, its collections, the object's lock; more means the PG keeps moving under it).
ADMIT_WAITS_MAX = 8
# The code a store or device error is answered with. DeviceNoSpace: the device refused a write
# (a file device whose filesystem is full, a thin volume out of room); the transaction changed
# nothing and the store stays usable.
# CollectionNotFound: this OSD holds no copy of the PG (a member that never got a write of it);
# to a reader, the object is not here.
ERROR_CODES = ((ObjectNotFound, Code.NOT_FOUND), (CollectionNotFound, Code.NOT_FOUND),
               (NoSpace, Code.NO_SPACE),
               (DeviceNoSpace, Code.NO_SPACE), (ChecksumError, Code.IO_ERROR),
               (InvalidArgument, Code.INVALID))
_ANSWERED = tuple(kind for kind, _ in ERROR_CODES) + (Refused,)


class Wait(enum.Enum):
    """Why an admitted op cannot start yet (`Admission.wait`): what its usual path awaits
    before asking again; the fast path declines the op instead."""
    MAP = "map"                     # the sender's epoch is ahead of this OSD's map
    ACTIVE = "active"               # the PG is not active here yet
    COLLECTIONS = "collections"     # the PG's collections are not made here yet
    LOCK = "lock"                   # another op holds the object's lock


@dataclasses.dataclass(slots=True)
class Admission:
    """A put or delete admitted on the primary (`ObjectService._admit_put`): `wait` None when
    it can start now under the acting set `acting`."""
    wait: Wait = None
    pool: dict = None
    pg: object = None
    name: str = None
    acting: object = None
    manifest: bool = False


class ObjectService:
    def __init__(self, port, local, registry, backends, audit_op):
        self.port = port                # osd/port.py: the store, the map, the other OSDs
        self.local = local              # osd/pglocal.py: this OSD's copies of its PGs
        self.registry = registry        # osd/pgs.py: the PGs, their peering and recovery
        self.backends = backends        # by pool kind (osd/backend.py)
        self.audit_op = audit_op        # (peer, header, result): a client write's audit line
        self.scrubber = None            # osd/scrubber.py, for pg_scrub (set by the daemon)
        self.ops_total = 0
        self._started = {}              # client op serial -> monotonic start (SLOW_OPS)
        self._serial = itertools.count()
        self.op_latency = OpLatency()   # client ops, for /metrics
        self.client_bytes_in = 0        # payload bytes of client requests
        self.client_bytes_out = 0       # payload bytes of their replies
        self.direct_reads_total = 0     # shard reads served to clients (`_shard_read`)
        self.fast_ops = {"get": 0, "put": 0, "rep_put": 0}  # answered from callbacks (`fast`)
        self.omap_reads_beside_writes = 0   # omap_gets answered beside an update in flight
        self.hedge_reads_served = 0     # clients' hedged reads served as a replica (osd/hedged.py)
        self.reads_hedged_around = 0    # ... confirmed as their primary: hedges of reads here,
        self.reads_steered_around = 0   # and reads sent around us (a client found us slow);
        self.reads_hedged_won = 0       # of the hedges, those whose replica answered first
        self.hedge_reads_cancelled = 0  # hedged reads we stopped as the replica: the primary won

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
        except _ANSWERED as exc:
            raise self._failure(exc) from None

    def _failure(self, exc):
        """The RequestFailed an op's error is answered with (`ERROR_CODES`; the client library
        turns the code into a typed exception); `exc` itself when it is no such error."""
        epoch = self.port.map.epoch if self.port.map is not None else 0
        if isinstance(exc, Refused):
            return RequestFailed(exc.code, f"{exc.message} (osd.{self.port.me}, epoch {epoch})")
        for kind, code in ERROR_CODES:
            if isinstance(exc, kind):
                return RequestFailed(code, f"osd.{self.port.me}: {exc} (epoch {epoch})")
        return exc

    # -- map checks -------------------------------------------------------------------------------

    def _locate(self, header, as_primary=True):
        """(pool dict, Pg or None) for the op's PG after the map checks, or None while
        this OSD's map is older than the sender's epoch (`pg_of` waits for it). Raises the
        refusals. Both the usual paths and the fast ones (`_fast_pg`) locate an op here."""
        cmap = self.port.map
        if cmap is None:
            raise RequestFailed(Code.AGAIN, f"osd.{self.port.me} is starting (no map yet)")
        epoch = header.get("epoch", 0)
        if type(epoch) is not int or epoch < 0:
            raise RequestFailed(
                Code.INVALID, f"epoch must be a non-negative integer (was {epoch!r})")
        if epoch > cmap.epoch:
            return None
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
        acting = pg.core.interval[1] if pg is not None and pg.core.interval else None
        if as_primary and (acting is None or acting.primary != self.port.me):
            raise RequestFailed(Code.WRONG_PRIMARY, f"osd.{self.port.me} is not the primary of "
                                f"pg {pool_id}.{pg_index:x} at epoch {cmap.epoch} (primary: "
                                f"{acting.primary if acting else 'elsewhere'})")
        return pool, pg

    async def pg_of(self, header, as_primary=True):
        """(pool dict, Pg) for the op's PG, after the map checks (`_locate`), waiting
        up to MAP_CATCH_UP_S_MAX for this OSD's map to reach the sender's epoch."""
        found = self._locate(header, as_primary)
        if found is None:
            await self._catch_up(header["epoch"])
            found = self._locate(header, as_primary)
        return found

    async def _catch_up(self, epoch):
        """Wait up to MAP_CATCH_UP_S_MAX for this OSD's map to reach `epoch`."""
        try:
            await self.port.wait_for_epoch(epoch, MAP_CATCH_UP_S_MAX)
        except TimeoutError:
            raise RequestFailed(Code.AGAIN, f"osd.{self.port.me} is at epoch "
                                f"{self.port.map.epoch}, behind {epoch}; retry") from None

    # -- primary ops --------------------------------------------------------------------------------

    async def _put(self, header, payload):
        return await self._write(header, payload, delete=False)

    def _admit_put(self, header, payload, delete, holding=False):
        """The one admission of a put or delete on the primary, for the fast path (which
        takes the op only when it can start at once) and the usual one (which waits as told
        and asks again): an `Admission`, its `wait` saying what to wait for, if anything.
        Raises the refusals (`_locate`'s; `_admit_write`'s: invalid, quota, no_space,
        pool_unavailable). `holding`: the caller holds the object's lock already."""
        found = self._locate(header)
        if found is None:
            return Admission(Wait.MAP)
        pool, pg = found
        name, acting, manifest = self._admit_write(pool, pg, header, payload, delete)
        if not pg.active.is_set():
            wait = Wait.ACTIVE
        elif not self.local.has_collections(pg):
            wait = Wait.COLLECTIONS
        elif not holding and pg.locks.held(name):
            wait = Wait.LOCK
        else:
            wait = None
        return Admission(wait, pool, pg, name, acting, manifest)

    def _admit_write(self, pool, pg, header, payload, delete):
        """The checks of a write that need no waiting (part of `_admit_put`; the omap op's
        too): (object name, the acting set it is admitted under, manifest). Raises the
        refusals (invalid, quota, no_space, pool_unavailable, stale).

        A write sent under a map older than the PG's current interval is refused as `stale`
        (the client refreshes its map and sends it again): it may be a request that was stuck
        in the network while its client gave up, retried and went on to newer writes, and
        carrying it out now would bring an old value back or delete a newer one."""
        interval = pg.core.interval
        if interval is not None and header.get("epoch", 0) < interval[0]:
            raise RequestFailed(Code.STALE, f"the write was sent at epoch {header.get('epoch', 0)}"
                                f", before pg {pg.key[0]}.{pg.key[1]:x}'s acting set changed "
                                f"at epoch {interval[0]}; retry with a newer map")
        name = object_name(header)
        if not delete:
            if len(payload) > OBJECT_SIZE_BYTES_MAX:
                raise RequestFailed(Code.INVALID, f"object of {len(payload)} bytes is over the "
                                    f"limit ({OBJECT_SIZE_BYTES_MAX}); stripe it (put_stream)")
            self._check_room(pool, pg)
        return name, pg.core.check_writable(pool["name"]), bool(header.get("manifest"))

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
        members = pg.core.acting.members if pg.core.acting is not None else ()
        full = [m for m in members if m is not None and self.port.map.osds.get(m, {}).get("full")]
        statfs = self.port.store.statfs()
        ratio = statfs["used_bytes"] / statfs["total_bytes"] if statfs["total_bytes"] else 0.0
        full_ratio = config.value(self.port.map.config, "osd.full_ratio")
        if ratio >= full_ratio and self.port.me not in full:
            full.append(self.port.me)
        if full:
            where = f"pg {pg.key[0]}.{pg.key[1]:x} of pool {pool['name']}"
            raise RequestFailed(Code.NO_SPACE, f"no space: {', '.join(f'osd.{m}' for m in full)} "
                                f"of {where} reached the full ratio ({full_ratio:.0%}); writes "
                                "refused, reads and deletes still work (delete data or add "
                                "OSDs)")

    async def _delete(self, header, payload):
        return await self._write(header, None, delete=True)

    async def _write(self, header, payload, delete):
        """A put or delete the fast path did not take: admitted by `_admit_put` as the fast
        one is, waiting as it says, then asked again (the quota, room and min_size may have
        changed meanwhile). An op that waited across a change of the PG's acting set is
        refused on asking again, by `_admit_write`'s epoch check: the new interval began at
        an epoch newer than the map the op was sent under (a put that waited 20 s behind a
        stuck write, long after its client had given up and written a newer value elsewhere,
        once overwrote that value: the slow tier's seed 10990, 2026-11-28)."""
        held = None                                     # (pg, name) whose lock this op holds
        try:
            for _ in range(ADMIT_WAITS_MAX):
                admitted = self._admit_put(header, payload, delete, holding=held is not None)
                if admitted.wait is None:
                    break
                if held is not None:
                    held[0].locks.release(held[1])
                    held = None
                held = await self._wait(admitted, header)
            else:
                raise RequestFailed(Code.AGAIN, "the PG kept changing while the write waited; "
                                    "retry")
            pg, name = admitted.pg, admitted.name
            if held is None:
                pg.locks.take(name)
                held = (pg, name)
            plan = await pg.backend.write_as_primary(pg, admitted.acting, name, payload, delete,
                                                     admitted.manifest)
        finally:
            if held is not None:
                held[0].locks.release(held[1])
        self.ops_total += 1
        return {"version": plan.version, "epoch": plan.epoch}, b""

    async def _wait(self, admitted, header):
        """Wait for what `admitted.wait` names; returns (pg, name) when that was the object's
        lock (the caller holds it now), else None."""
        wait, pg = admitted.wait, admitted.pg
        if wait is Wait.MAP:
            await self._catch_up(header["epoch"])
        elif wait is Wait.ACTIVE:
            await self.registry.wait_active(pg.key)
        elif wait is Wait.COLLECTIONS:
            await pg.backend.prepare_write(pg)
        else:
            await pg.locks.acquire(admitted.name)
            return pg, admitted.name
        return None

    def _admit_read(self, header):
        """The checks of a get that need no waiting, for the usual path and the fast one
        alike: (object name, offset, length). Raises the refusal (invalid)."""
        name = object_name(header)
        offset, length = header.get("offset", 0), header.get("length")
        if type(offset) is not int or offset < 0 or \
                length is not None and (type(length) is not int or length < 0):
            raise RequestFailed(Code.INVALID, f"offset and length must be non-negative integers "
                                f"(were {offset!r}, {length!r})")
        return name, offset, length

    async def _get(self, header, payload):
        if header.get("replica"):
            return await hedged.replica_get(self, header)
        pool, pg = await self.pg_of(header)
        name, offset, length = self._admit_read(header)
        pg = await self.registry.wait_active(pg.key)
        interval = pg.core.interval
        backend = pg.backend
        # Room for the reply first (before any lock): a peer that leaves its replies unread
        # waits here, holding nothing of ours.
        await server.reserve_reply(backend.reply_bytes(pg, name, offset, length))
        await pg.locks.acquire(name)                     # no read of a write not yet everywhere
        try:
            await self.registry.make_current(pg, name, interval)
            if not self.port.store.has_collection(pg.collection):
                raise ObjectNotFound(pg.collection, name)
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
        """(pool, Pg) of a request a fast path may take: the peer may send it
        (access.check), `_locate` finds its PG without waiting for a map, the pool is
        replicated and the PG known here (and, `as_primary`, active with this OSD its
        primary); else None. Raises the refusals (the caller then declines the request, and the
        usual path, which runs the same checks, answers them)."""
        access.check(connection.peer, self.port.map, header)
        found = self._locate(header, as_primary)
        if found is None:
            return None
        pool, pg = found
        if pool["kind"] != "replicated" or pg is None or as_primary and not pg.active.is_set():
            return None
        return pool, pg

    def fast_put(self, connection, received):
        """Take a client's put to a replicated PG when `_admit_put` (the usual path's
        admission too) lets it start at once, and start it here
        (`PgBackend.start_write_as_primary`, the usual path's body too), answered from its
        callback (`_fast_written`). Anything else, refusals included, goes the usual way
        (`_write`), which waits or answers them; from the write's start on, its outcome is
        the answer."""
        header, payload = received.header, received.payload
        try:
            access.check(connection.peer, self.port.map, header)
            admitted = self._admit_put(header, payload, delete=False)
        except (RequestFailed, Refused):
            return False
        if admitted.wait is not None or admitted.pool["kind"] != "replicated":
            return False
        pg, name = admitted.pg, admitted.name
        pg.locks.take(name)
        serial = next(self._serial)
        started_ns = time.monotonic_ns()
        self._started[serial] = started_ns / 1e9
        self.client_bytes_in += len(payload)
        pg.backend.start_write_as_primary(
            pg, admitted.acting, name, payload, False, admitted.manifest,
            functools.partial(self._fast_written, connection, received, pg, name, serial,
                              started_ns),
            received.block_crcs, received.payload_crc)
        return True

    def _fast_written(self, connection, received, pg, name, serial, started_ns, plan, failure):
        """A fast put's write is done everywhere (or was refused before it started: `plan`
        None): what `_write` and the daemon's handler do after it."""
        pg.locks.release(name)
        del self._started[serial]
        if failure is None:
            self.ops_total += 1
            self.fast_ops["put"] += 1
            self.audit_op(connection.peer, received.header, "ok")
            connection.answer_fast(received, {"version": plan.version, "epoch": plan.epoch},
                                   b"", 0)
        else:
            failure = self._failure(failure)
            if isinstance(failure, RequestFailed):
                self.audit_op(connection.peer, received.header, failure.code)
            connection.fail_fast(received, failure)
        self.op_latency.record("put", time.monotonic_ns() - started_ns)

    def fast_rep_put(self, connection, received):
        """Take a replica write of a replicated PG when the usual path (`member_ops.rep_put`)
        would not wait before its store transaction: `_fast_pg` and
        `member_ops.admit_from_primary` (the usual path's own checks) pass and the PG's
        collections are made. The transaction's own task (`ReplicatedBackend.start_apply`,
        the usual path's body too) answers from its done callback. Anything else, refusals
        included, goes the usual way, which answers them; from the transaction's start on, its
        outcome is the answer."""
        header = received.header
        try:
            found = self._fast_pg(connection, header, as_primary=False)
            if found is None:
                return False
            pg = member_ops.admit_from_primary(self, found[1], header)
            name, version = object_name(header), op_version(header)
        except (RequestFailed, Refused):
            return False
        if not self.local.has_collections(pg):
            return False                # the usual path makes them
        try:
            task = pg.backend.start_apply(
                pg, name, received.payload, version, False, bool(header.get("manifest")),
                bool(header.get("complete")), received.block_crcs)
        except (StoreError, DeviceError) as exc:
            connection.fail_fast(received, self._failure(exc))
            return True
        task.add_done_callback(lambda done: self._fast_applied(connection, received, done))
        return True

    def _fast_applied(self, connection, received, task):
        if task.cancelled():
            connection.fail_fast(received, RequestFailed(
                Code.AGAIN, f"osd.{self.port.me} is stopping; retry"))
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
        way (`_get`), which also says what was wrong. The checks are `_get`'s own (`_fast_pg`,
        `_admit_read`): a fast get and a usual one cannot tell apart."""
        header = received.header
        try:
            if header.get("direct") or header.get("replica"):
                return False
            found = self._fast_pg(connection, header, as_primary=True)
            if found is None or self.port.me in slow_osds(self.port.map):
                return False
            pg = found[1]
            name, offset, length = self._admit_read(header)
            if name in pg.core.missing or pg.locks.held(name):
                return False
            pending = self.port.store.begin_read(pg.collection, name, offset, length)
            if pending is None:
                return False
        except (RequestFailed, StoreError, DeviceError):
            return False                # refused or failed: `_get` reads again and answers
        reserved = pending.length
        if not connection.reserve_now(reserved):
            self.port.store.abandon_read(pending)
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
            data, data_crc = self.port.store.finish_read(pending,
                                                         copy_below=ZERO_COPY_READ_BYTES_MIN)
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
        backend = pg.backend if pg is not None else None
        where = f"pg {pg.key[0]}.{pg.key[1]:x}" if pg is not None else "that pg"
        if not isinstance(backend, ErasureBackend) or pg is None or pg.core.interval is None or \
                pg.core.interval[0] != header.get("interval") or \
                backend.position(pg, self.port.me) != shard:
            raise RequestFailed(Code.STALE, f"osd.{self.port.me} does not serve shard {shard!r} "
                                f"of {where} in interval {header.get('interval')!r}; read "
                                "through the primary")
        await server.reserve_reply(sum(length for _, length in ranges))
        record, data = await backend.read_local(pg, name, [tuple(r) for r in ranges])
        found = (pgs.version_of(record.attrs), pgs.shard_of(record.attrs))
        if found != (version, shard):
            raise RequestFailed(Code.STALE, f"osd.{self.port.me} holds version {found[0]} of "
                                f"shard {found[1]} of {name!r}, not version {version} of shard "
                                f"{shard}; read through the primary")
        self.direct_reads_total += 1
        return {"version": version}, data

    async def _stat(self, header, payload):
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        pg = await self.registry.wait_active(pg.key)
        interval = pg.core.interval
        if name in pg.core.missing:
            async with pg.object_lock(name):
                await self.registry.make_current(pg, name, interval)
        if not self.port.store.has_collection(pg.collection):
            raise ObjectNotFound(pg.collection, name)
        record, extra = await pg.backend.stat(pg, name)
        return {"size": record.size, "version": pgs.version_of(record.attrs),
                "mtime_ns": record.mtime_ns, "manifest": pgs.MANIFEST_ATTR in record.attrs,
                "omap": getattr(record, "omap", False), **extra}, b""

    async def _list(self, header, payload):
        pool, pg = await self.pg_of(header)
        pg = await self.registry.wait_active(pg.key)
        prefix, start_after = header.get("prefix", ""), header.get("start_after")
        limit = header.get("limit", LIST_PAGE_DEFAULT)
        names, following = [], None
        if self.port.store.has_collection(pg.collection):
            names, following = self.port.store.list_objects(pg.collection, prefix, start_after,
                                                            limit)
        if pg.core.missing:
            names, following = merge_missing(names, following, pg.core.missing, prefix, start_after,
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
        acting = pg.core.check_writable(pool["name"])
        pg = await self.registry.wait_active(pg.key)
        interval = pg.core.interval
        await pg.locks.acquire(name)
        try:
            await self.registry.make_current(pg, name, interval)
            record = self.local.local_record(pg, name)
            prior = pgs.version_of(record.attrs) if record is not None else 0
            if record is None and not request.create:
                raise ObjectNotFound(pg.collection, name)
            current, used = {}, []
            if record is not None and request.keys_checked:
                current = self.port.store.omap_get(pg.collection, name, request.keys_checked)
            if record is not None:
                used = [prefix for prefix in request.prefixes_checked
                        if self.port.store.omap_list(pg.collection, name, prefix=prefix, limit=1)[0]]
            omap.check_conditions(request, name, prior, current, used)
            if not request.update.clear:
                pg.omap_writing[name] = (request.update.keys_changed, prior)
            self.local.load_log(pg)
            plan = pg.core.plan_write(acting, self.port.map.epoch, name, False, False,
                                      existed=record is not None)
            committed, failure = await pg.backend.write_omap(pg, plan, prior, request.update)
            pg.core.write_finished(plan, committed, acknowledged=failure is None)
            if failure is not None:
                raise failure
            self.ops_total += 1
            return {"version": plan.version, "epoch": plan.epoch}, b""
        finally:
            pg.omap_writing.pop(name, None)
            pg.locks.release(name)

    async def _omap_read(self, header, read, located=None):
        """`read(pg, name)` under the object's lock, once the primary's copy is current."""
        pool, pg = located or await self.pg_of(header)
        name = object_name(header)
        pg = await self.registry.wait_active(pg.key)
        interval = pg.core.interval
        async with pg.object_lock(name):
            await self.registry.make_current(pg, name, interval)
            if not self.port.store.has_collection(pg.collection):
                raise ObjectNotFound(pg.collection, name)
            version = pgs.version_of(self.port.store.stat(pg.collection, name).attrs)
            return {"version": version, **read(pg, name)}, b""

    async def _omap_get(self, header, payload):
        keys = omap.parse_keys(header)

        def values(pg, name):
            found = self.port.store.omap_get(pg.collection, name, keys)
            return {"values": [found.get(key) for key in keys]}
        # An omap update of this object in flight that changes none of these keys: they hold
        # the values they had before it, at the version before it, whether or not this copy
        # has applied it yet; answer now instead of after its replication (a lookup in a
        # directory whose files are being closed does not wait for their size records).
        pool, pg = await self.pg_of(header)
        name = object_name(header)
        writing = pg.omap_writing.get(name)
        if writing is not None and writing[0].isdisjoint(keys) and pg.active.is_set() and \
                name not in pg.core.missing:
            pg.core.check_serving(pg.core.interval)
            self.omap_reads_beside_writes += 1
            return {"version": writing[1], **values(pg, name)}, b""
        return await self._omap_read(header, values, (pool, pg))

    async def _omap_list(self, header, payload):
        start_after, prefix, limit = omap.parse_listing(header)

        def page(pg, name):
            entries, more = self.port.store.omap_list(pg.collection, name, start_after, prefix,
                                                      limit, max_bytes=omap.LIST_REPLY_BYTES)
            return {"entries": [list(pair) for pair in entries], "more": more}
        return await self._omap_read(header, page)


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
    ("pg_settled", hedged.pg_settled, False, True),
    ("hedge_won", hedged.hedge_won, False, True),
)
