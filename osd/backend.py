"""PG backends: how a PG's objects are laid out over its acting members.

The object service (osd/service.py) and peering and recovery (osd/pgs.py) do everything that
does not depend on the layout: map checks, object locks, the PG core's decisions (osd/pg.py:
versions, the log, missing sets). What does depend on it goes through a `PgBackend`, chosen by
the pool's kind:

    write(pg, plan, payload)
        apply one client write (an osd/pg.py WritePlan: version, targets) on every acting
        member (called on the primary, under the object's lock); returns (this OSD committed,
        the first failure or None)
    apply_message(pg, header, payload, delete)
        this member's part of a write (rep_put / rep_delete), with its log entry
    read(pg, name, offset, length) -> (ObjectInfo, data)
        a client read on the primary, under the object's lock
    stat(pg, name) -> (ObjectInfo, extra reply fields)
    recover_object(pg, source, target, name, epoch, pay) -> "copied" | "removed"
        make one object on `target` what it is on `source` (recovery and backfill; the caller
        holds the object lock); `pay(bytes)`, when given, waits for the recovery budget
    write_omap(pg, plan, prior, update)
        apply one omap update (replicated pools only: `OmapChange` below)

The replicated backend keeps a whole copy on every member. The erasure-coded backend keeps one
shard per member: shard i on the member at acting position i (indep placement: a member that is
down leaves a hole, nothing shifts). Its write encodes on the primary and sends each member its
shard; its read takes data straight from the data shards and decodes only when one of them is
missing, stale or damaged; its recovery rebuilds the target's shard from k others of the same
version (osd/ecstripe.py has the layout, native/erasure.py the codec).
"""

import abc
import asyncio
import collections
import dataclasses
import logging
import struct

from cairn.common import config, pg as pgs
from cairn.common.codes import Code
from cairn.common.limits import BLOCK_SIZE_BYTES, OMAP_UPDATE_BYTES_MAX
from cairn.common.messenger import (ConnectionClosed, RequestFailed, RequestTimeout,
                                    received_checksums)
from cairn.native.bufpool import aligned_copy
from cairn.native.erasure import DEFAULT_BACKEND, BadFragment, Codec, NotEnoughFragments
from cairn.osd import ecstripe
from cairn.osd.errors import ChecksumError, ObjectNotFound, StoreError
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")

# Deadline for a replica's answer; a replica slower than this fails the op (the client
# retries), and peering takes over if the replica is gone.
REPLICA_TIMEOUT_S = 20.0
# From this size on a read is sent from the store's buffer as it is (common/wire.py's receive
# side uses the same bound).
ZERO_COPY_READ_BYTES_MIN = 64 * 1024
# A replica's refusal that reaches the client as it is (any other failure of a replica write
# becomes `again`: retry after the map changes).
REPLICA_ERRORS_PASSED = (Code.NO_SPACE,)
# Objects from this size on are encoded and decoded in a worker thread, so the event loop goes
# on serving meanwhile (an 18+6 encode of 64 MiB takes about 20 ms).
CODEC_THREAD_BYTES_MIN = 8 << 20
# A client read of at least this many bytes of an erasure-coded object gets a plan and fetches
# the data shards' pieces from their holders itself (`ErasureBackend.direct_plan`); smaller
# ones are not worth the second round trip.
DIRECT_READ_BYTES_MIN = 1 << 20
# Zeros that pad a shard sent to a member to whole blocks (see ErasureBackend.shard_bytes).
_PADDING = bytes(BLOCK_SIZE_BYTES)


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a client read or stat answers about an object: its size (the object's, not a
    shard's), attributes and modification time."""
    size: int
    attrs: dict
    mtime_ns: int


@dataclasses.dataclass(frozen=True)
class OmapChange:
    """An omap update as the primary resolved it (its conditions held): what every member
    applies to its copy at version `prior` to make version `plan.version`."""
    sets: tuple = ()            # ((key, value), ...)
    removes: tuple = ()
    clear: bool = False

    def fields(self):
        return {"set": [list(pair) for pair in self.sets], "remove": list(self.removes),
                "clear": self.clear}


# Bytes of omap entries one recovery message carries (pg_read's first page, pg_omap's pages):
# under the update bound, so a page is also one store update on the target.
OMAP_PAGE_BYTES = OMAP_UPDATE_BYTES_MAX // 2
# Where a member keeps an object whose omap arrives over several recovery pages, until the
# last page renames it into place (replicated PGs leave their stash collection unused).
PUSH_PREFIX = "push."


class ShardUnavailable(Exception):
    """One shard could not be read for this read (member down, refused, stale or damaged)."""

    def __init__(self, shard_index, reason):
        super().__init__(f"shard {shard_index}: {reason}")
        self.shard_index, self.reason = shard_index, reason


class PgBackend(abc.ABC):
    def __init__(self, service):
        self.service = service
        self.avoided_reads_total = 0        # reads served elsewhere: this OSD or a shard slow

    @property
    def store(self):
        return self.service.store

    @property
    def registry(self):
        return self.service.registry

    @property
    def me(self):
        return self.service.daemon.id

    @abc.abstractmethod
    async def write(self, pg, plan, payload):
        ...

    @abc.abstractmethod
    async def apply_message(self, pg, header, payload, delete):
        ...

    @abc.abstractmethod
    async def read(self, pg, name, offset=0, length=None):
        """(info, data): data is bytes-like, or a tuple of bytes-like pieces that a reply sends
        one after another (common/frame.py)."""

    @abc.abstractmethod
    async def stat(self, pg, name):
        ...

    @abc.abstractmethod
    def reply_bytes(self, pg, name, offset=0, length=None):
        """About how many bytes a read of `name` will send (0 when unknown here): what the
        request reserves of the connection's reply budget before it reads
        (messenger.reserve_reply)."""

    @abc.abstractmethod
    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        ...

    async def write_omap(self, pg, plan, prior, update):
        raise RequestFailed(Code.UNSUPPORTED, f"pg {pg.key[0]}.{pg.key[1]:x} is erasure-coded; "
                            "omaps live in replicated pools (keep directories and other "
                            "tables in one: 'cairn mount DATA --metadata-pool META')")

    async def read_local(self, pg, name, ranges=None, stash_entry=None):
        """(stat, bytes) of this OSD's copy or shard (or of a rollback stash entry): whole,
        or the byte `ranges` [(offset, length)] one after another. Large reads, whole or of one
        range, go out as the store's own buffer (no copy; the buffer returns to its pool when the transport has
        sent it and drops it); small ones are copied so their buffer is reused at once."""
        collection = pg.collection
        if stash_entry is not None:
            collection, name = pg.stash_collection, stash_entry
        record = self.store.stat(collection, name)
        if ranges is None:
            if record.size >= ZERO_COPY_READ_BYTES_MIN:
                return record, await self.store.read(collection, name)
            return record, await self.store.read_bytes(collection, name)
        if len(ranges) == 1 and ranges[0][1] >= ZERO_COPY_READ_BYTES_MIN:
            offset, length = ranges[0]          # a shard's span: sent from the store's buffer
            return record, await self.store.read(collection, name, offset, length)
        parts = [await self.store.read_bytes(collection, name, offset, length)
                 for offset, length in ranges]
        return record, parts[0] if len(parts) == 1 else b"".join(parts)

    async def _replicate(self, osd_id, header, payload, passed=REPLICA_ERRORS_PASSED,
                         payload_crc=None):
        await self._replica_outcome(osd_id, self._start_replica(osd_id, header, payload,
                                                                payload_crc), passed)

    def _start_replica(self, osd_id, header, payload, payload_crc=None):
        """Send one replica write now: an awaitable of its reply. Over an open connection it
        is the connection's reply future (no task: a primary's writes made three tasks each
        with gather); else a task that connects first. Errors surface when it is awaited
        (`_replica_outcome`)."""
        osd = self.service.map.osds.get(osd_id)
        addr = osd["addr"] if osd is not None else None
        connection = self.service.connections.ready(osd_id, addr) if addr else None
        if connection is not None:
            try:
                return connection.start_request(header, payload, REPLICA_TIMEOUT_S,
                                                payload_crc)
            except ConnectionClosed:
                pass                        # reopened below

        async def connect_and_send():
            if not addr:
                raise ConnectionClosed(f"the map gives osd.{osd_id} no address")
            connection = await self.service.connections.get(osd_id, addr)
            return await connection.request(header, payload, timeout_s=REPLICA_TIMEOUT_S,
                                            payload_crc=payload_crc)
        return asyncio.ensure_future(connect_and_send())

    @staticmethod
    async def _replica_outcome(osd_id, reply, passed=REPLICA_ERRORS_PASSED):
        """Await a replica write's reply; RequestFailed `again` for any failure but those
        `passed` through as they are."""
        try:
            await reply
        except (ConnectionClosed, RequestTimeout, RequestFailed) as exc:
            failure = PgBackend._replica_failure(osd_id, exc, passed)
            if failure is exc:
                raise
            raise failure from None

    @staticmethod
    def _replica_failure(osd_id, exc, passed=REPLICA_ERRORS_PASSED):
        """What a replica write's failure `exc` is answered with (see `_replica_outcome`)."""
        if isinstance(exc, (ConnectionClosed, RequestTimeout)):
            return RequestFailed(Code.AGAIN, f"replica osd.{osd_id} did not commit ({exc}); "
                                 "retry after the map changes")
        if isinstance(exc, RequestFailed) and exc.code not in passed:
            return RequestFailed(Code.AGAIN, f"replica osd.{osd_id}: {exc.message}")
        return exc

    def _write_header(self, pg, plan, **fields):
        """The rep_put / rep_delete header of a write plan (each target adds its own fields)."""
        return {"op": "rep_delete" if plan.delete else "rep_put", "pool": pg.key[0],
                "pg": pg.key[1], "name": plan.name, "version": plan.version,
                "epoch": plan.epoch, "from": self.me, "manifest": plan.manifest, **fields}

    async def _write_everywhere(self, local, remote):
        """(this OSD committed, the first failure or None) of a write: `local` (the
        coroutine applying it here) runs in this task while the replica writes `remote`
        ([(osd id, reply awaitable)], `_start_replica`) are in flight; then their replies are
        collected. As gather(return_exceptions=True) did, without a task per part."""
        results = []
        try:
            try:
                results.append(await local)
            except Exception as exc:
                results.append(exc)
            for osd_id, reply in remote:
                try:
                    results.append(await self._replica_outcome(osd_id, reply))
                except Exception as exc:
                    results.append(exc)
        except BaseException:
            for _, reply in remote:
                reply.cancel()              # cancelled ourselves: no one awaits these now
            raise
        return self._outcome(results)

    def when_written(self, local, remote, done):
        """`_write_everywhere` from callbacks: call `done(committed here, the first failure or
        None)` once `local` (the transaction's task, Store.start_apply) and every replica
        write in `remote` (`_start_replica`) are done."""
        left = [1 + len(remote)]

        def one_done(_):
            left[0] -= 1
            if left[0]:
                return
            results = [_failure_of(local)]
            for osd_id, reply in remote:
                failure = _failure_of(reply)
                results.append(failure if failure is None else
                               self._replica_failure(osd_id, failure))
            done(*self._outcome(results))
        local.add_done_callback(one_done)
        for _, reply in remote:
            reply.add_done_callback(one_done)

    @staticmethod
    def _outcome(results):
        """(the first job committed, the first failure or None) of gathered write jobs."""
        failures = [result for result in results if isinstance(result, BaseException)]
        return not isinstance(results[0], BaseException), (failures[0] if failures else None)


def slow_osds(cmap):
    """The OSDs reads avoid: those the map flags slow (SLOW_DISK), unless
    osd.avoid_slow_reads is 0 (worked out once per map epoch)."""
    global _slow_cache
    key = (cmap.fsid, cmap.epoch)
    if _slow_cache[0] != key:
        slow = frozenset()
        if config.value(cmap.config, "osd.avoid_slow_reads"):
            slow = frozenset(osd_id for osd_id, osd in cmap.osds.items() if osd.get("slow"))
        _slow_cache = (key, slow)
    return _slow_cache[1]


_slow_cache = (None, frozenset())


def padded(pieces):
    """A shard to send to a member, given as a tuple of pieces: the pieces, then zeros up to
    whole blocks, as one payload (no copy here; the receiver stores its receive buffer as it
    is)."""
    padding = -sum(memoryview(piece).nbytes for piece in pieces) % BLOCK_SIZE_BYTES
    return pieces + (_PADDING[:padding],) if padding else pieces


def omap_bytes(entries):
    return sum(len(key) + len(value) for key, value in entries)


def _failure_of(future):
    """A done future's exception (CancelledError if it was cancelled), or None."""
    return asyncio.CancelledError() if future.cancelled() else future.exception()


def object_attrs(version, manifest, extra=None):
    attrs = {pgs.VERSION_ATTR: pgs.version_bytes(version)}
    if manifest:
        attrs[pgs.MANIFEST_ATTR] = b"1"
    attrs.update(extra or {})
    return attrs


class ReplicatedBackend(PgBackend):
    """A whole copy of every object on every acting member (primary-copy replication)."""

    def __init__(self, service):
        super().__init__(service)
        self.behind_pushes_total = 0        # omap updates that pushed a member the whole object

    async def write(self, pg, plan, payload):
        """Write locally and send rep_put/rep_delete to every other up member in parallel."""
        local = self.apply(pg, plan.name, payload, plan.version, plan.delete, plan.manifest,
                           plan.target(self.me).complete)
        remote = self.start_replicas(pg, plan, payload, received_checksums(payload)[1])
        return await self._write_everywhere(local, remote)

    def start_replicas(self, pg, plan, payload, crc):
        """Send the write to every other member now: [(osd id, reply awaitable)]. `crc`: the
        payload's crc32c if known (the client's, for the same bytes)."""
        header = self._write_header(pg, plan)
        return [(target.osd, self._start_replica(
                    target.osd, {**header, "complete": target.complete}, payload or b"", crc))
                for target in plan.targets if target.osd != self.me]

    async def apply(self, pg, name, payload, version, delete, manifest=False, complete=False):
        """Apply one replicated write here with its log entry; `complete`: this OSD is a
        complete member (osd/pg.py)."""
        await self.registry.ensure_collections(pg)
        await self.store.apply(self.transaction(pg, name, payload, version, delete, manifest,
                                                complete, received_checksums(payload)[0]),
                               then=lambda: pg.applied(version, complete))

    def transaction(self, pg, name, payload, version, delete, manifest, complete, crcs=None):
        """The store transaction of one replicated write here, with its log entry (which
        `pg.applied(version, complete)` records once it commits). The PG's collections must
        exist. `crcs`: the payload's block crcs, if its frame check gave them."""
        txn = Transaction()
        # A member that missed the object still logs the delete: its log must count every op
        # it was sent.
        if not delete:
            txn.put(pg.collection, name, payload, attrs=object_attrs(version, manifest),
                    crcs=crcs)
        elif self.registry.present(pg, name):
            txn.delete(pg.collection, name)
        self.registry.log_ops(pg, txn, version, name, delete, complete)
        return txn

    async def apply_message(self, pg, header, payload, delete):
        await self.apply(pg, header["name"], None if delete else payload, header["version"],
                         delete, bool(header.get("manifest")), bool(header.get("complete")))

    def reply_bytes(self, pg, name, offset=0, length=None):
        size = self.store.size_of(pg.collection, name)
        return 0 if size is None else _clamped(size, offset, length)

    async def read(self, pg, name, offset=0, length=None):
        """(stat, bytes to send) of the local copy, zero-copy when large (see read_local). A
        local copy that fails its checksum is read from another member instead and queued for
        repair. While the map flags this OSD slow (SLOW_DISK), a complete member that is not
        slow serves the read instead, when there is one."""
        if self.me in slow_osds(self.service.map):
            record, wanted, ranges = self._wanted(pg, name, offset, length)
            for osd in self.stand_ins(pg):
                data = await self._remote_copy(pg, osd, name, wanted, ranges)
                if data is not None:
                    self.avoided_reads_total += 1
                    return record, data
        try:
            return await self.store.read_with_stat(pg.collection, name, offset, length,
                                                   copy_below=ZERO_COPY_READ_BYTES_MIN)
        except ChecksumError as exc:
            record, wanted, ranges = self._wanted(pg, name, offset, length)
            pg.damaged.add(name)
            log.warning("pg %d.%x: osd.%d's copy of %r is damaged (%s); reading another "
                        "replica, queued for repair", *pg.key, self.me, name, exc)
            damage = exc
        for osd in pg.acting.up_members:
            if osd == self.me:
                continue
            data = await self._remote_copy(pg, osd, name, wanted, ranges)
            if data is not None:
                return record, data
        raise damage

    def _wanted(self, pg, name, offset, length):
        """(stat, version, ranges) of a read another member serves: the local copy's stat,
        the version that member's copy must be, the byte range to ask it for."""
        record = self.store.stat(pg.collection, name)
        return (record, pgs.version_of(record.attrs),
                [[offset, record.size if length is None else length]])

    def stand_ins(self, pg):
        """Members that may serve a read for this (slow) primary: up, complete (they hold
        every acknowledged write), not flagged slow themselves."""
        slow = slow_osds(self.service.map)
        return [osd for osd in pg.acting.up_members
                if osd != self.me and osd in pg.complete_members and osd not in slow]

    async def _remote_copy(self, pg, osd, name, wanted, ranges):
        """The `ranges` of `osd`'s copy of `name` if it is version `wanted`, else None."""
        try:
            header, data = await self.registry.call(osd, self.registry.header(
                pg, "pg_read", pg.interval[0], name=name, ranges=ranges))
        except RequestFailed:
            return None
        return data if header.get("version") == wanted else None

    async def stat(self, pg, name):
        return self.store.stat(pg.collection, name), {}

    # -- omaps --------------------------------------------------------------------------------

    async def write_omap(self, pg, plan, prior, update):
        """Apply the update here and on every other up member in parallel. A member whose
        copy is not at `prior` (it is being recovered and has not reached this object) answers
        `behind`: it then gets this OSD's whole object once the update committed here, and
        the write's log entry alone."""
        header = self._write_header(pg, plan, op="rep_omap", prior=prior, **update.fields())
        local = asyncio.ensure_future(self.apply_omap(
            pg, plan.name, plan.version, prior, update, plan.target(self.me).complete))
        remote = [self._omap_to(pg, plan, target, header, local)
                  for target in plan.targets if target.osd != self.me]
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
        await self.recover_object(pg, self.me, target.osd, plan.name, plan.epoch)
        self.behind_pushes_total += 1
        await self._replicate(target.osd, {**header, "log_only": True}, b"")

    async def apply_omap(self, pg, name, version, prior, update, complete, log_only=False):
        """This member's part of an omap update, with its log entry: the object must be at
        version `prior` here (0: absent; it is then created empty)."""
        await self.registry.ensure_collections(pg)
        txn = Transaction()
        if not log_only:
            record = self.registry.local_record(pg, name)
            have = pgs.version_of(record.attrs) if record is not None else 0
            if have != prior:
                raise RequestFailed(Code.BEHIND, f"osd.{self.me} holds {name!r} at version "
                                    f"{have:x}, not {prior:x}: it needs the whole object")
            version_attr = {pgs.VERSION_ATTR: pgs.version_bytes(version)}
            if record is None:
                txn.put(pg.collection, name, b"", attrs=version_attr)
            else:
                txn.set_attrs(pg.collection, name, version_attr)
            txn.omap_update(pg.collection, name, update.sets, update.removes, update.clear)
        self.registry.log_ops(pg, txn, version, name, False, complete)
        await self.store.apply(txn, then=lambda: pg.applied(version, complete))

    # -- recovery -----------------------------------------------------------------------------

    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        """Copy the whole object from `source` to `target` (pg_read, pg_push), or remove it
        from `target` when `source` has none. An omap comes along: with the data when it
        fits one page, else page by page into a temporary object on the target that the last
        page renames into place (a target never holds the new version half copied)."""
        call, header_of = self.registry.call, self.registry.header
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
        self.registry.recovery_bytes_total += moved
        return "copied"


class ErasureBackend(PgBackend):
    """Shard i of every object on the acting member at position i."""

    def __init__(self, service):
        super().__init__(service)
        self._codecs = {}                   # (k, m, backend) -> Codec, shared by the pool's PGs
        self.degraded_reads_total = 0
        self.damaged_shards_total = 0
        self.direct_plans_total = 0

    def codec(self, pg):
        pool = pgs.pool_by_id(self.service.map, pg.key[0])
        key = (pool["k"], pool["m"], pool.get("backend", DEFAULT_BACKEND))
        codec = self._codecs.get(key)
        if codec is None:
            codec = self._codecs[key] = Codec(*key)
            log.info("erasure code %d+%d %s: parity %s", *key, "by ISA-L in place"
                     if codec.native else f"through pyeclib ({codec.native_refused})")
        return codec

    @staticmethod
    def position(pg, osd_id):
        """The acting position (shard index) of `osd_id` in this PG, or None."""
        members = pg.acting.members if pg.acting else ()
        return members.index(osd_id) if osd_id in members else None

    def layout(self, codec, size, unit=None):
        return ecstripe.Layout(codec.k, codec.m, unit or ecstripe.unit_for(codec.k),
                               codec.header_bytes, size)

    async def _in_thread_if_large(self, size, function, *args):
        if size < CODEC_THREAD_BYTES_MIN:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    # -- writes -------------------------------------------------------------------------------

    async def write(self, pg, plan, payload):
        """Encode on the primary; every member (this one too) stores its own shard, all in
        parallel; the log entry is the same everywhere."""
        geometry, shards = None, None
        if not plan.delete:
            codec = self.codec(pg)
            layout = self.layout(codec, len(payload))
            pool = self.store.device.pool       # the loop's (not thread-safe): taken here
            if codec.native and layout.shard_bytes:
                # Data shards are views of the payload as received, sent as they are; parity
                # goes into whole-block pool buffers, to the device and the network uncopied.
                parity = [pool.get(layout.shard_bytes) for _ in range(codec.m)]
                shards = await self._in_thread_if_large(
                    layout.size, ecstripe.encode_pieces, codec, layout, payload, parity)
            else:
                buffers = [pool.get(layout.shard_bytes) for _ in range(codec.k + codec.m)] \
                    if layout.shard_bytes else None
                shards = [(shard,) for shard in await self._in_thread_if_large(
                    layout.size, ecstripe.encode_shards, codec, layout, payload, buffers)]
            geometry = [layout.size, layout.unit]
        acked_to = pg.acked_to()
        header = self._write_header(pg, plan, ec=geometry, acked_to=acked_to)
        local, remote = None, []
        for target in plan.targets:
            pieces = shards[target.position] if shards is not None else (b"",)
            if target.osd == self.me:
                local = self.apply(pg, plan.name, None if plan.delete else
                                   self._joined(pieces), plan.version,
                                   plan.delete, plan.manifest, target.complete,
                                   target.position, geometry, acked_to,
                                   None if plan.delete else layout.shard_bytes)
            else:
                remote.append((target.osd, self._start_replica(
                    target.osd, {**header, "complete": target.complete,
                                 "shard": target.position}, padded(pieces))))
        assert local is not None, "the primary is always a target of its writes"
        return await self._write_everywhere(local, remote)

    def _joined(self, pieces):
        """A shard given as pieces, as one whole-block buffer the store can write as it is
        (the primary's own data shard: a copy of 1/k of the object)."""
        return pieces[0] if len(pieces) == 1 else aligned_copy(self.store.device.pool, pieces)

    async def apply(self, pg, name, payload, version, delete, manifest, complete, shard_index,
                    geometry, acked_to=None, shard_bytes=None):
        """This member's shard of one write. What it replaces (the shard it had, or a marker
        that it had none) moves into the PG's rollback stash, without a copy: if the write
        reaches fewer than k members and its primary dies, neither the new version nor the old
        one may have k shards left where nobody overwrote them, and recovery rolls the object
        back from the stash (`_roll_back`). Entries go once the primary says their writes are
        settled (`acked_to`). `shard_bytes`: the shard's length when `payload` was received
        padded (`shard_bytes`)."""
        await self.registry.ensure_collections(pg, stash=True)
        self.registry.load_stash(pg)
        txn = Transaction()
        entry = pg.stash_ops(txn, version, name, self.registry.present(pg, name), acked_to)
        if not delete:
            txn.put(pg.collection, name, payload, size=shard_bytes, attrs=object_attrs(
                version, manifest, pgs.ec_attrs(shard_index, *geometry)),
                crcs=received_checksums(payload)[0])
        self.registry.log_ops(pg, txn, version, name, delete, complete, acked_to)

        def applied():
            pg.stashed(entry)
            pg.applied(version, complete)
        await self.store.apply(txn, then=applied)

    async def apply_message(self, pg, header, payload, delete):
        shard_index, geometry = header.get("shard"), header.get("ec")
        here = self.position(pg, self.me)
        if shard_index != here:
            raise RequestFailed(Code.AGAIN, f"osd.{self.me} holds shard {here} of pg "
                                f"{pg.key[0]}.{pg.key[1]:x} here, not {shard_index!r}; retry")
        if not delete and not pgs.valid_geometry(geometry):
            raise RequestFailed(Code.INVALID, "an erasure-coded shard needs ec: [size, unit]")
        acked_to = header.get("acked_to")
        if acked_to is not None and not isinstance(acked_to, int):
            raise RequestFailed(Code.INVALID, "acked_to must be a PG version")
        await self.apply(pg, header["name"], None if delete else payload, header["version"],
                         delete, bool(header.get("manifest")), bool(header.get("complete")),
                         shard_index, geometry, acked_to,
                         None if delete else self.shard_bytes(pg, geometry, payload))

    def shard_bytes(self, pg, geometry, payload):
        """The length of the shard that `geometry` ([size, unit]) gives; a received shard must
        be exactly that long, or that padded with zeros to whole blocks (`padded`), so that
        the buffer it was received into goes to the device without a copy."""
        expected = self.layout(self.codec(pg), *geometry).shard_bytes
        received = memoryview(payload).nbytes
        if received not in (expected, expected + -expected % BLOCK_SIZE_BYTES):
            raise RequestFailed(Code.INVALID, f"a shard of an object of {geometry[0]} bytes "
                                f"(unit {geometry[1]}) is {expected} bytes, not {received}")
        return expected

    # -- reads --------------------------------------------------------------------------------

    def _local_info(self, pg, name):
        """(record, version, layout) of this primary's own shard of `name` (current: a missing
        object was recovered before the read)."""
        record = self.store.stat(pg.collection, name)
        if pgs.shard_of(record.attrs) != self.position(pg, self.me):
            raise RequestFailed(Code.AGAIN, f"osd.{self.me}'s shard of {name!r} is for another "
                                "position; retry once it is recovered")
        size, unit = pgs.ec_geometry(record.attrs)
        return record, pgs.version_of(record.attrs), self.layout(self.codec(pg), size, unit)

    def reply_bytes(self, pg, name, offset=0, length=None):
        try:
            size = pgs.ec_geometry(self.store.stat(pg.collection, name).attrs)[0]
        except (StoreError, KeyError, struct.error):
            return 0
        return _clamped(size, offset, length)

    async def read(self, pg, name, offset=0, length=None):
        record, version, layout = self._local_info(pg, name)
        info = ObjectInfo(layout.size, record.attrs, record.mtime_ns)
        offset, length = layout.clamp(offset, length)
        if length == 0:
            return info, b""
        avoided = self.avoided_shards(pg, codec_k=layout.k)
        if avoided and avoided & {index for index, _, _ in layout.data_extents(offset, length)}:
            self.avoided_reads_total += 1
            data, failed = None, avoided
        else:
            data, failed = await self._read_healthy(pg, name, version, layout, offset, length)
        if data is None:
            self.degraded_reads_total += 1
            data = await self._read_degraded(pg, name, version, layout, offset, length, failed)
        return info, data

    async def stat(self, pg, name):
        """The object's info, and which shards of its version the acting members hold."""
        record, version, layout = self._local_info(pg, name)
        members = [(index, osd) for index, osd in enumerate(pg.acting.members)
                   if osd is not None]
        probes = await asyncio.gather(*(self._fetch(pg, osd, index, name, version, [])
                                        for index, osd in members), return_exceptions=True)
        present = [index for (index, _), probe in zip(members, probes)
                   if not isinstance(probe, BaseException)]
        for probe in probes:
            if isinstance(probe, BaseException) and not isinstance(probe, ShardUnavailable):
                raise probe
        return ObjectInfo(layout.size, record.attrs, record.mtime_ns), {
            "shards": present, "shards_needed": layout.k, "shard_count": layout.k + layout.m}

    async def _roll_back(self, pg, name, version, epoch, unavailable):
        """Version `version` of `name` has fewer than k shards readable now. Only when every
        acting position answered and the shards of `version` still fall short of k was it a
        write that reached too few members before its primary died (a member that is down or
        silent may hold one: then wait, `unavailable` is raised). If no member has seen it
        acknowledged, restore the newest older version that has k shards among the members'
        current shards and stashes (or delete the object if it did not exist before), as a new
        write under the object lock the caller holds. Otherwise the object is lost beyond what
        the code can rebuild: `unavailable` is raised."""
        call, header_of = self.registry.call, self.registry.header
        positions = [(index, osd) for index, osd in enumerate(pg.acting.members)
                     if osd is not None]
        answers = await asyncio.gather(*(call(osd, header_of(pg, "pg_versions", epoch,
                                                             name=name))
                                         for _, osd in positions), return_exceptions=True)
        shards = collections.defaultdict(dict)   # version -> shard index -> (osd, stash entry)
        geometry, absent, acked_seen = {}, 0, 0
        unknown = len(pg.acting.members) - len(positions)
        for (index, osd), answer in zip(positions, answers):
            if isinstance(answer, BaseException):
                unknown += 1
                continue
            header = answer[0]
            acked_seen = max(acked_seen, header.get("acked_seen", 0))
            for held in header["held"]:
                if held.get("absent"):
                    absent += held["replaced_by"] >= version
                    continue
                if held["version"] <= version:
                    shards[held["version"]].setdefault(held["shard"], (osd, held.get("entry")))
                    geometry[held["version"]] = (held["ec"], held["manifest"])
        codec = self.codec(pg)
        if len(shards.pop(version, {})) + unknown >= codec.k:
            raise unavailable               # members that are away may hold the rest
        if acked_seen >= version:
            log.error("pg %d.%x: %r version %x was acknowledged but only %s; not rolling back",
                      *pg.key, name, version, unavailable.message)
            raise unavailable
        whole = sorted((v for v, held in shards.items() if len(held) >= codec.k), reverse=True)
        write = self.service.write_locked
        if whole:
            chosen = whole[0]
            (size, unit), manifest = geometry[chosen]
            layout = self.layout(codec, size, unit)
            sources = sorted(shards[chosen].items())[:codec.k]
            fetched = await asyncio.gather(*(self._fetch(pg, osd, index, name, chosen, None,
                                                         stash_entry=entry)
                                             for index, (osd, entry) in sources))
            data = b""
            if size:
                data = await self._in_thread_if_large(
                    size, ecstripe.decode_span, codec, layout, 0, layout.stripe_count - 1,
                    dict(zip([index for index, _ in sources], fetched)))
            await write(pg, name, data, delete=False, manifest=manifest)
            log.warning("pg %d.%x: rolled %r back from unacknowledged version %x (too few "
                        "shards) to version %x", *pg.key, name, version, chosen)
            return "copied"
        if absent and not shards:
            await write(pg, name, None, delete=True, manifest=False)
            log.warning("pg %d.%x: removed %r: its only version %x was never acknowledged and "
                        "has too few shards", *pg.key, name, version)
            return "removed"
        raise unavailable

    async def _fetch(self, pg, osd, shard_index, name, version, ranges, stash_entry=None):
        """Bytes `ranges` of shard `shard_index` of `name` at `version` from `osd`; raises
        ShardUnavailable when the member cannot give exactly that, RequestFailed(Code.AGAIN) when
        it refuses us as no longer this PG's primary."""
        if osd == self.me:
            try:
                record, data = await self.read_local(pg, name, ranges, stash_entry)
            except ObjectNotFound:
                raise ShardUnavailable(shard_index, "absent here") from None
            except ChecksumError as exc:
                self._damaged(pg, name, osd, shard_index, str(exc))
                raise ShardUnavailable(shard_index, str(exc)) from None
            found = (pgs.version_of(record.attrs), pgs.shard_of(record.attrs))
        else:
            try:
                header, data = await self.registry.call(osd, self.registry.header(
                    pg, "pg_read", pg.interval[0], name=name, ranges=ranges, stash=stash_entry))
            except RequestFailed as exc:
                if exc.code in (Code.WRONG_PRIMARY, Code.STALE):
                    # The member has moved past this interval: our map is old, not the shard
                    # gone. The client retries on the newer map (and recovery never rolls an
                    # object back over shards it merely could not ask for).
                    raise RequestFailed(Code.AGAIN, f"pg {pg.key[0]}.{pg.key[1]:x} moved on: "
                                        f"osd.{osd}: {exc.message}") from None
                if exc.code == Code.IO_ERROR and "checksum" in exc.message:
                    self._damaged(pg, name, osd, shard_index, exc.message)
                raise ShardUnavailable(shard_index, f"osd.{osd}: {exc.message}") from None
            found = (header.get("version"), header.get("shard"))
        if found != (version, shard_index):
            raise ShardUnavailable(shard_index, f"osd.{osd} holds version {found[0]} of shard "
                                   f"{found[1]}, not version {version} of shard {shard_index}")
        return data

    async def direct_plan(self, pg, name, offset=0, length=None):
        """A client's direct read (its `get` asked for one): (record, plan, this OSD's own
        pieces) when the range is large and every data shard under it is on a member that is
        up and not flagged slow, else None (the primary reads as usual). The client fetches
        the other pieces from their holders itself (`shard_read`), so the bytes cross the
        network once, not twice through this primary. Called under the object's lock after
        on-demand recovery, like `read`: `version` is current everywhere."""
        record, version, layout = self._local_info(pg, name)
        offset, length = layout.clamp(offset, length)
        if length < DIRECT_READ_BYTES_MIN:
            return None
        members = pg.acting.members
        extents = layout.data_extents(offset, length)
        holders = {index: members[index] for index, _, _ in extents}
        if None in holders.values() or set(holders.values()) == {self.me} or \
                self.avoided_shards(pg, codec_k=layout.k) & set(holders):
            return None
        own = [(start, size) for index, start, size in extents if holders[index] == self.me]
        data = b""
        if own:
            try:
                data = await self._fetch(pg, self.me, self.position(pg, self.me), name, version,
                                         own)
            except ShardUnavailable:
                return None                 # the usual read decodes around it
        self.direct_plans_total += 1
        info = ObjectInfo(layout.size, record.attrs, record.mtime_ns)
        return info, {"interval": pg.interval[0], "from": self.me, "offset": offset,
                      "length": length,
                      "extents": [[index, holders[index], start, size]
                                  for index, start, size in extents]}, data

    def _damaged(self, pg, name, osd, shard_index, reason):
        self.damaged_shards_total += 1
        pg.damaged.add(name)
        log.warning("pg %d.%x: shard %d of %r on osd.%d is damaged (%s); read from the other "
                    "shards, queued for repair", *pg.key, shard_index, name, osd, reason)

    async def _read_healthy(self, pg, name, version, layout, offset, length):
        """(the range from the data shards alone, None) or (None, the shard indices that
        failed) if one of them did."""
        extents = layout.data_extents(offset, length)
        ranges = collections.defaultdict(list)
        for shard_index, start, size in extents:
            ranges[shard_index].append((start, size))
        members = pg.acting.members
        holes = {index for index in ranges if members[index] is None}
        if holes:
            return None, holes
        shards = list(ranges)
        results = await asyncio.gather(*(self._fetch(pg, members[index], index, name, version,
                                                     ranges[index]) for index in shards),
                                       return_exceptions=True)
        pieces, failed = {}, set()
        for index, result in zip(shards, results):
            if isinstance(result, ShardUnavailable):
                failed.add(index)
            elif isinstance(result, BaseException):
                raise result
            else:
                pieces[index] = memoryview(result)
        if failed:
            return None, failed
        if len(extents) == 1:
            return pieces[extents[0][0]], None
        # The pieces go out one after another as they are (frame.encode takes a tuple): no
        # join, which cost a memset and a copy of every byte of a multi-shard read.
        out, cursors = [], collections.Counter()
        for index, _, size in extents:
            out.append(pieces[index][cursors[index]:cursors[index] + size])
            cursors[index] += size
        return tuple(out), None

    def avoided_shards(self, pg, codec_k):
        """Shard indices on members the map flags slow, when the others that are up still
        number k (a read then decodes from them rather than wait on a slow disk); else none."""
        slow = slow_osds(self.service.map)
        if not slow:
            return set()
        members = pg.acting.members
        avoided = {index for index, osd in enumerate(members) if osd in slow}
        usable = sum(1 for osd in members if osd is not None and osd not in slow)
        return avoided if avoided and usable >= codec_k else set()

    def _preference(self, pg):
        """Shard indices to read a degraded range from: this OSD's own, then data shards, then
        parity (decoding from data shards is cheapest), members that are up only."""
        members = pg.acting.members
        up = [index for index, osd in enumerate(members) if osd is not None]
        return sorted(up, key=lambda index: (members[index] != self.me, index))

    async def _gather(self, pg, name, version, layout, ranges, exclude=(), extra=()):
        """{shard index: bytes} of `ranges` from k shards of `version` (never mixing versions),
        asking k members at a time and more when some fail. `extra`: (osd, shard index) of
        holders outside the acting set (a past authority). Raises RequestFailed(Code.UNAVAILABLE)
        naming the shards found when fewer than k can be read."""
        members = pg.acting.members
        candidates = [(members[index], index) for index in self._preference(pg)
                      if index not in exclude]
        candidates += [(osd, index) for osd, index in extra
                       if index not in exclude and (osd, index) not in candidates]
        got, failures = {}, []
        while len(got) < layout.k and candidates:
            wanted = layout.k - len(got)
            batch = [c for c in candidates if c[1] not in got][:wanted]
            candidates = [c for c in candidates if c not in batch]
            if not batch:
                break
            results = await asyncio.gather(*(self._fetch(pg, osd, index, name, version, ranges)
                                              for osd, index in batch),
                                           return_exceptions=True)
            for (osd, index), result in zip(batch, results):
                if isinstance(result, ShardUnavailable):
                    failures.append(result.reason)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    got[index] = result
        if len(got) < layout.k:
            raise RequestFailed(Code.UNAVAILABLE, f"pg {pg.key[0]}.{pg.key[1]:x}: object {name!r} "
                                f"(version {version:x}) has {len(got)} readable shards "
                                f"{sorted(got)}, {layout.k} needed ({'; '.join(failures)})")
        return got

    async def _read_degraded(self, pg, name, version, layout, offset, length, failed):
        first, last, start, span = layout.stripe_span(offset, length)
        spans = await self._gather(pg, name, version, layout, [(start, span)], exclude=failed)
        codec = self.codec(pg)
        try:
            data = await self._in_thread_if_large(span * layout.k, ecstripe.decode_span, codec,
                                                  layout, first, last, spans)
        except (NotEnoughFragments, BadFragment) as exc:
            raise RequestFailed(Code.IO_ERROR, f"pg {pg.key[0]}.{pg.key[1]:x}: object {name!r}: "
                                f"decoding failed: {exc}") from None
        skip = offset - first * layout.stripe_bytes
        return memoryview(data)[skip:skip + length]

    # -- recovery -----------------------------------------------------------------------------

    async def recover_object(self, pg, source, target, name, epoch, pay=None):
        """Rebuild `target`'s shard of the object as `source` (the authority) has it: read k
        shards of that version, decode, encode the target's shard, push it. Removed from
        `target` when `source` has no such object."""
        call, header_of = self.registry.call, self.registry.header
        try:
            header, _ = await call(source, header_of(pg, "pg_read", epoch, name=name, ranges=[]))
        except RequestFailed as exc:
            if exc.code != Code.NOT_FOUND:
                raise
            await call(target, header_of(pg, "pg_remove", epoch, name=name))
            return "removed"
        version, (size, unit) = header["version"], header["ec"]
        position = self.position(pg, target)
        if position is None:
            raise RequestFailed(Code.AGAIN, f"osd.{target} is not acting in pg "
                                f"{pg.key[0]}.{pg.key[1]:x}")
        codec = self.codec(pg)
        layout = self.layout(codec, size, unit)
        shard = b""
        if size:
            try:
                shards = await self._gather(pg, name, version, layout, None,
                                            exclude={position}, extra=[(source, header["shard"])])
            except RequestFailed as exc:
                if exc.code != Code.UNAVAILABLE:
                    raise
                return await self._roll_back(pg, name, version, epoch, exc)
            moved = sum(len(data) for index, data in shards.items()
                        if pg.acting.members[index] != self.me)
            if pay is not None:
                await pay(moved + layout.shard_bytes)
            rebuilt = await self._in_thread_if_large(size, ecstripe.rebuild_shards, codec,
                                                     layout, shards, [position])
            shard = rebuilt[position]
            self.registry.recovery_bytes_total += moved + len(shard)
        await call(target, header_of(pg, "pg_push", epoch, name=name, version=version,
                                     manifest=header.get("manifest", False), shard=position,
                                     ec=[size, unit]),
                   shard if target == self.me else padded((shard,)))  # a local call: no wire
        return "copied"


def _clamped(size, offset, length):
    """Bytes of a read at `offset` of `length` (None: to the end) of a `size`-byte object."""
    offset = offset if isinstance(offset, int) and offset >= 0 else 0
    left = max(0, size - offset)
    return left if not isinstance(length, int) or length < 0 else min(left, length)
