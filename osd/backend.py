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

The replicated backend (osd/backend_replicated.py) keeps a whole copy on every member. The
erasure-coded backend (osd/backend_erasure.py) keeps one shard per member: shard i on the
member at acting position i (indep placement: a member that is down leaves a hole, nothing
shifts). Its write encodes on the primary and sends each member its shard; its read takes data straight from the data shards and decodes only when one of them is
missing, stale or damaged; its recovery rebuilds the target's shard from k others of the same
version (osd/ecstripe.py has the layout, native/erasure.py the codec).
"""

import abc
import asyncio
import dataclasses
import logging

from cairn.common import config, pg as pgs
from cairn.common.codes import Code
from cairn.common.limits import BLOCK_SIZE_BYTES, OMAP_UPDATE_BYTES_MAX
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common.server import received_checksums
from cairn.osd.pg import Refused

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

    @property
    def keys_changed(self):
        return frozenset(key for key, _ in self.sets) | frozenset(self.removes)


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
    """One pool kind's layout (see the module's docstring): what it needs from outside comes
    through `port` (osd/port.py) and `local` (osd/pglocal.py), never from the service."""

    def __init__(self, port, local):
        self.port = port
        self.local = local
        self.avoided_reads_total = 0        # reads served elsewhere: this OSD or a shard slow
        self.recovery_bytes_total = 0       # bytes recovery moved through this backend

    # -- client writes on the primary (both kinds; the caller holds the object's lock) -----

    def start_write_as_primary(self, pg, acting, name, payload, delete, manifest, done,
                               crcs=None, crc=None, recovery=False):
        """One client write, started now: the core plans it (version, targets; `acting`: the
        acting set the op was admitted under), this backend starts it on every member
        (`start_write`), the core hears the outcome, then `done(plan, the first failure or
        None)` is called (plan None when the core refused it; the failure is that refusal).
        Members that did commit an unacknowledged write keep it; the next peering reconciles
        them (it may appear whole or not). The PG's collections must exist
        (`prepare_write`). `crcs` / `crc`: the payload's, when its frame check gave them. A
        fast put calls this from the messenger's callback; `write_as_primary` awaits it."""
        self.local.load_log(pg)
        try:
            plan = pg.core.plan_write(acting, self.port.map.epoch, name, delete, manifest,
                                      existed=self.local.exists(pg, name), recovery=recovery)
        except Refused as exc:
            done(None, exc)
            return

        def finished(committed, failure):
            try:
                pg.core.write_finished(plan, committed, acknowledged=failure is None)
            finally:            # the caller releases the object's lock and answers in `done`
                done(plan, failure)
        self.start_write(pg, plan, payload, crcs, crc, finished)

    async def write_as_primary(self, pg, acting, name, payload, delete, manifest,
                               recovery=False):
        """`start_write_as_primary`, awaited: returns the plan, raises the first failure when
        the write was not acknowledged everywhere."""
        await self.prepare_write(pg)
        crcs, crc = received_checksums(payload)
        plan, failure = await self._until_written(lambda done: self.start_write_as_primary(
            pg, acting, name, payload, delete, manifest, done, crcs, crc, recovery))
        if failure is not None:
            raise failure
        return plan

    async def prepare_write(self, pg):
        """Make what `start_write` needs before a write can start (the PG's collections)."""
        await self.local.ensure_collections(pg)

    async def rewrite(self, pg, name, payload, delete, manifest):
        """A write for the PG itself (a rollback during recovery) by a caller that already
        holds the object's lock; the PG must be writable, and active or catching its primary
        up before it activates (`PgCore.plan_write`'s `recovery`)."""
        pool = pgs.pool_by_id(self.port.map, pg.key[0])
        try:
            await self.write_as_primary(pg, pg.core.check_writable(pool["name"]), name, payload,
                                        delete, manifest, recovery=True)
        except Refused as exc:
            raise RequestFailed(exc.code, exc.message) from None

    @abc.abstractmethod
    def start_write(self, pg, plan, payload, crcs, crc, done):
        """Start `plan` on every member now; `done(this OSD committed, the first failure or
        None)` is called once every member answered."""

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
        (server.reserve_reply)."""

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
        range, go out as the store's own buffer (no copy; the buffer returns to its pool when
        the transport has sent it and drops it); small ones are copied so their buffer is
        reused at once."""
        collection = pg.collection
        if stash_entry is not None:
            collection, name = pg.stash_collection, stash_entry
        record = self.port.store.stat(collection, name)
        if ranges is None:
            if record.size >= ZERO_COPY_READ_BYTES_MIN:
                return record, await self.port.store.read(collection, name)
            return record, await self.port.store.read_bytes(collection, name)
        if len(ranges) == 1 and ranges[0][1] >= ZERO_COPY_READ_BYTES_MIN:
            offset, length = ranges[0]          # a shard's span: sent from the store's buffer
            return record, await self.port.store.read(collection, name, offset, length)
        parts = [await self.port.store.read_bytes(collection, name, offset, length)
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
        return self.port.send(osd_id, header, payload, REPLICA_TIMEOUT_S, payload_crc)

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
                "epoch": plan.epoch, "from": self.port.me, "manifest": plan.manifest, **fields}

    @staticmethod
    async def _until_written(start):
        """Await a write started from callbacks: `start(done)` starts it and calls
        `done(committed here, the first failure or None)` at its end (`when_written`). A
        waiter cancelled meanwhile (a new interval) leaves the write to run to its end."""
        finished = asyncio.get_running_loop().create_future()

        def done(committed, failure):
            if not finished.done():
                finished.set_result((committed, failure))
        start(done)
        return await finished

    def when_written(self, local, remote, done):
        """Join a write's parts: call `done(committed here, the first failure or
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


def clamped(size, offset, length):
    """Bytes of a read at `offset` of `length` (None: to the end) of a `size`-byte object."""
    offset = offset if isinstance(offset, int) and offset >= 0 else 0
    left = max(0, size - offset)
    return left if not isinstance(length, int) or length < 0 else min(left, length)
