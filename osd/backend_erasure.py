"""The erasure-coded PG backend: shard i of each object on the member at acting position i.

Theory of operation: a write encodes the object on the primary (osd/ecstripe.py lays it out in
stripes, native/erasure.py codes them; large objects in a worker thread) and sends every member
its shard in parallel, with the same version, log entry and epoch fencing as replication; it is
acknowledged once every acting member committed. A read takes the byte ranges it needs straight
from the data shards and decodes only when one is missing, stale or damaged, gathering stripes
from any k shards of one version (never mixing versions); a large read can be answered with a
plan the client follows itself (`direct_plan`). Recovery rebuilds a member's shard from k others
of the same version. An overwrite that not enough members took is rolled back to the version
that k members still hold (`_roll_back`). See osd/backend.py for the interface.
"""

import asyncio
import collections
import contextlib
import logging
import struct

from cairn.common import config, pg as pgs
from cairn.common.codes import Code
from cairn.common.hedge import Hedger
from cairn.common.limits import BLOCK_SIZE_BYTES
from cairn.common.messenger import RequestFailed
from cairn.common.server import received_checksums
from cairn.native.bufpool import aligned_copy
from cairn.native.erasure import DEFAULT_BACKEND, BadFragment, Codec, NotEnoughFragments
from cairn.osd import ecstripe
from cairn.osd.backend import (ObjectInfo, PgBackend, ShardUnavailable, clamped, object_attrs,
                               padded, slow_osds)
from cairn.osd.errors import ChecksumError, CollectionNotFound, ObjectNotFound, StoreError
from cairn.osd.pg import rollback_choice
from cairn.osd.store import Transaction

log = logging.getLogger("cairn.osd")

# Objects from this size on are encoded and decoded in a worker thread, so the event loop goes
# on serving meanwhile (an 18+6 encode of 64 MiB takes about 20 ms).
CODEC_THREAD_BYTES_MIN = 8 << 20
# A client read of at least this many bytes of an erasure-coded object gets a plan and fetches
# the data shards' pieces from their holders itself (`ErasureBackend.direct_plan`); smaller
# ones are not worth the second round trip.
DIRECT_READ_BYTES_MIN = 1 << 20


class ErasureBackend(PgBackend):
    """Shard i of every object on the acting member at position i."""

    def __init__(self, port, local):
        super().__init__(port, local)
        self._codecs = {}                   # (k, m, backend) -> Codec, shared by the pool's PGs
        self._writing = set()               # start_write's tasks (the loop keeps weak refs)
        self.degraded_reads_total = 0
        self.damaged_shards_total = 0
        self.direct_plans_total = 0
        # Shards late past the hedge delay are read around (decoded from other members'), and
        # their members steered around for a while (common/hedge.py, `_read_healthy`).
        self.hedger = Hedger(_loop_time)
        self.fast_reads_total = 0

    def codec(self, pg):
        pool = pgs.pool_by_id(self.port.map, pg.key[0])
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
        members = pg.core.acting.members if pg.core.acting else ()
        return members.index(osd_id) if osd_id in members else None

    def layout(self, codec, size, unit=None):
        return ecstripe.Layout(codec.k, codec.m, unit or ecstripe.unit_for(codec.k),
                               codec.header_bytes, size)

    async def _in_thread_if_large(self, size, function, *args):
        if size < CODEC_THREAD_BYTES_MIN:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    # -- writes -------------------------------------------------------------------------------

    def start_write(self, pg, plan, payload, crcs, crc, done):
        """`write` in a task of its own, which runs to its end; `done` is called from its end
        (encoding a large object runs in a thread, so this write cannot start everything from
        the caller's callback as a replicated one does)."""
        def ended(task):
            if task.cancelled():
                done(False, RequestFailed(Code.AGAIN, f"osd.{self.port.me} is stopping; retry"))
            elif task.exception() is not None:
                done(False, task.exception())
            else:
                done(*task.result())
        task = asyncio.ensure_future(self.write(pg, plan, payload))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
        task.add_done_callback(ended)

    async def write(self, pg, plan, payload):
        """Encode on the primary; every member (this one too) stores its own shard, all in
        parallel; the log entry is the same everywhere."""
        geometry, shards = None, None
        if not plan.delete:
            codec = self.codec(pg)
            layout = self.layout(codec, len(payload))
            pool = self.port.store.device.pool       # the loop's (not thread-safe): taken here
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
        acked_to = pg.core.acked_to()
        header = self._write_header(pg, plan, ec=geometry, acked_to=acked_to)
        local, remote = None, []
        for target in plan.targets:
            pieces = shards[target.position] if shards is not None else (b"",)
            if target.osd == self.port.me:
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
        local = asyncio.ensure_future(local)        # runs to its end, like a replica's write
        return await self._until_written(lambda done: self.when_written(local, remote, done))

    def _joined(self, pieces):
        """A shard given as pieces, as one whole-block buffer the store can write as it is
        (the primary's own data shard: a copy of 1/k of the object)."""
        return pieces[0] if len(pieces) == 1 else aligned_copy(self.port.store.device.pool, pieces)

    async def apply(self, pg, name, payload, version, delete, manifest, complete, shard_index,
                    geometry, acked_to=None, shard_bytes=None):
        """This member's shard of one write. What it replaces (the shard it had, or a marker
        that it had none) moves into the PG's rollback stash, without a copy: if the write
        reaches fewer than k members and its primary dies, neither the new version nor the old
        one may have k shards left where nobody overwrote them, and recovery rolls the object
        back from the stash (`_roll_back`). Entries go once the primary says their writes are
        settled (`acked_to`). `shard_bytes`: the shard's length when `payload` was received
        padded (`shard_bytes`)."""
        await self.local.ensure_collections(pg, stash=True)
        self.local.load_stash(pg)
        txn = Transaction()
        entry = pg.core.stash_ops(txn, version, name, self.local.present(pg, name), acked_to)
        if not delete:
            txn.put(pg.collection, name, payload, size=shard_bytes, attrs=object_attrs(
                version, manifest, pgs.ec_attrs(shard_index, *geometry)),
                crcs=received_checksums(payload)[0])
        self.local.log_ops(pg, txn, version, name, delete, complete, acked_to)

        def applied():
            pg.core.stashed(entry)
            pg.core.applied(version, complete)
        await self.port.store.apply(txn, then=applied)

    async def apply_message(self, pg, header, payload, delete):
        shard_index, geometry = header.get("shard"), header.get("ec")
        here = self.position(pg, self.port.me)
        if shard_index != here:
            raise RequestFailed(Code.AGAIN, f"osd.{self.port.me} holds shard {here} of pg "
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
        record = self.port.store.stat(pg.collection, name)
        if pgs.shard_of(record.attrs) != self.position(pg, self.port.me):
            raise RequestFailed(Code.AGAIN, f"osd.{self.port.me}'s shard of {name!r} is for another "
                                "position; retry once it is recovered")
        size, unit = pgs.ec_geometry(record.attrs)
        return record, pgs.version_of(record.attrs), self.layout(self.codec(pg), size, unit)

    def reply_bytes(self, pg, name, offset=0, length=None):
        try:
            size = pgs.ec_geometry(self.port.store.stat(pg.collection, name).attrs)[0]
        except (StoreError, KeyError, struct.error):
            return 0
        return clamped(size, offset, length)

    async def read(self, pg, name, offset=0, length=None):
        record, version, layout = self._local_info(pg, name)
        info = ObjectInfo(layout.size, record.attrs, record.mtime_ns)
        offset, length = layout.clamp(offset, length)
        if length == 0:
            return info, b""
        avoided = self.avoided_shards(pg, codec_k=layout.k)
        late, reserve = {}, ()
        around = avoided & {index for index, _, _ in layout.data_extents(offset, length)}
        if around:
            self.avoided_reads_total += 1
            for index in around:
                self.hedger.note_steered(pg.core.acting.members[index])
            # The members avoided are asked only if one of the others is late too, or fails.
            data, failed, reserve = None, (), avoided
        elif pgs.pool_by_id(self.port.map, pg.key[0]).get("fast_read"):
            self.fast_reads_total += 1
            return info, await self._read_degraded(pg, name, version, layout, offset, length,
                                                   (), fast=True)
        else:
            data, failed, late = await self._read_healthy(pg, name, version, layout, offset,
                                                          length)
            if late:        # late is not lost: asked again if the others cannot make k
                failed, reserve = (), failed
        if data is None:
            self.degraded_reads_total += 1
            data = await self._read_degraded(pg, name, version, layout, offset, length, failed,
                                             reserve=reserve)
        if late or around:
            self.hedger.count_read()
        self._settle_hedges(late)
        return info, data

    def _settle_hedges(self, late):
        """Hedged ({osd: its late fetch}): did the decode beat each late shard? One still due
        a while later has its member steered around (`_judge`)."""
        for osd, fetch in late.items():
            if fetch.done():
                self.hedger.note_wasted(osd)
            else:
                self.hedger.note_won(osd)
                asyncio.get_running_loop().call_later(self.hedger.evidence_s(), _judge,
                                                      self.hedger, osd, fetch)

    async def stat(self, pg, name):
        """The object's info, and which shards of its version the acting members hold."""
        record, version, layout = self._local_info(pg, name)
        members = [(index, osd) for index, osd in enumerate(pg.core.acting.members)
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

    async def _roll_back(self, pg, name, version, epoch, unavailable, source=None):
        """Version `version` of `name` has fewer than k shards readable now: ask every acting
        member, and the recovery's `source` when it is not one (an authority whose log named
        the version, left out of the acting set: the seeded simulation's seed 10321 held a PG
        peering for good when only it knew the write), what it holds of the object (its shard
        and its rollback stash, `pg_versions`),
        let `rollback_choice` (osd/pg.py, pure) decide, and carry it out as a new write under
        the object lock the caller holds: restore a version from k of its shards (live or
        stashed), or delete the object. `unavailable` is raised when the choice is to wait
        for members that did not answer, or when the object is lost beyond what the code can
        rebuild."""

        async def holdings(osd):
            """What `osd` holds of the object; None for an empty position or no answer."""
            if osd is None:
                return None
            try:
                header, _ = await self.port.call(osd, self.port.header(pg, "pg_versions", epoch,
                                                                       name=name))
            except RequestFailed:
                return None
            return header

        asked = list(pg.core.acting.members)
        if source is not None and source not in asked:
            asked.append(source)
        views = list(zip(asked, await asyncio.gather(*map(holdings, asked))))
        codec = self.codec(pg)
        choice = rollback_choice(version, views, codec.k)
        log.info("pg %d.%x: %r version %x has too few shards: %s", *pg.key, name, version,
                 choice)
        if choice.action in ("wait", "lost"):
            if choice.action == "lost":
                log.error("pg %d.%x: %r version %x cannot be rebuilt nor rolled back: %s (%s)",
                          *pg.key, name, version, choice.reason, unavailable.message)
            raise unavailable
        if choice.action == "delete":
            await self.rewrite(pg, name, None, delete=True, manifest=False)
            log.warning("pg %d.%x: removed %r: version %x was never acknowledged, has too few "
                        "shards, and the object was absent before it (%s)", *pg.key, name,
                        version, choice.reason)
            return "removed"
        size, unit = choice.geometry
        layout = self.layout(codec, size, unit)
        fetched = await asyncio.gather(*(self._fetch(pg, osd, index, name, choice.version, None,
                                                     stash_entry=entry)
                                         for index, osd, entry in choice.sources),
                                       return_exceptions=True)
        for failure in fetched:
            if isinstance(failure, ShardUnavailable):
                # A source that answered what it holds did not give it now (it went down):
                # the object stays unavailable until the next try.
                log.info("pg %d.%x: restoring %r version %x: %s", *pg.key, name,
                         choice.version, failure)
                raise unavailable
            if isinstance(failure, BaseException):
                raise failure
        data = b""
        if size:
            data = await self._in_thread_if_large(
                size, ecstripe.decode_span, codec, layout, 0, layout.stripe_count - 1,
                dict(zip([index for index, _, _ in choice.sources], fetched)))
        await self.rewrite(pg, name, data, delete=False, manifest=choice.manifest)
        if choice.version == version:
            log.warning("pg %d.%x: restored %r version %x from the shards its members had "
                        "stashed", *pg.key, name, version)
        else:
            log.warning("pg %d.%x: rolled %r back from unacknowledged version %x (too few "
                        "shards) to version %x", *pg.key, name, version, choice.version)
        return "copied"

    async def _fetch(self, pg, osd, shard_index, name, version, ranges, stash_entry=None):
        """Bytes `ranges` of shard `shard_index` of `name` at `version` from `osd`; raises
        ShardUnavailable when the member cannot give exactly that, RequestFailed(Code.AGAIN) when
        it refuses us as no longer this PG's primary."""
        if osd == self.port.me:
            try:
                record, data = await self.read_local(pg, name, ranges, stash_entry)
            except (ObjectNotFound, CollectionNotFound):
                raise ShardUnavailable(shard_index, "absent here") from None
            except ChecksumError as exc:
                self._damaged(pg, name, osd, shard_index, str(exc))
                raise ShardUnavailable(shard_index, str(exc)) from None
            found = (pgs.version_of(record.attrs), pgs.shard_of(record.attrs))
        else:
            try:
                header, data = await self.port.call(osd, self.port.header(
                    pg, "pg_read", pg.core.interval[0], name=name, ranges=ranges,
                    stash=stash_entry))
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
        members = pg.core.acting.members
        extents = layout.data_extents(offset, length)
        holders = {index: members[index] for index, _, _ in extents}
        if None in holders.values() or set(holders.values()) == {self.port.me} or \
                self.avoided_shards(pg, codec_k=layout.k) & set(holders):
            return None
        own = [(start, size) for index, start, size in extents if holders[index] == self.port.me]
        data = b""
        if own:
            try:
                me = self.port.me
                data = await self._fetch(pg, me, self.position(pg, me), name, version, own)
            except ShardUnavailable:
                return None                 # the usual read decodes around it
        self.direct_plans_total += 1
        info = ObjectInfo(layout.size, record.attrs, record.mtime_ns)
        return info, {"interval": pg.core.interval[0], "from": self.port.me, "offset": offset,
                      "length": length,
                      "extents": [[index, holders[index], start, size]
                                  for index, start, size in extents]}, data

    def _damaged(self, pg, name, osd, shard_index, reason):
        self.damaged_shards_total += 1
        pg.core.found_damaged(name)
        log.warning("pg %d.%x: shard %d of %r on osd.%d is damaged (%s); read from the other "
                    "shards, queued for repair", *pg.key, shard_index, name, osd, reason)

    async def _read_healthy(self, pg, name, version, layout, offset, length):
        """(the range from the data shards alone, None, {}) or (None, the shard indices that
        failed, {}) if one of them did, or (None, the late shard indices, {osd: its fetch})
        when shards were still due after the hedge delay and the other members can stand in
        for them (common/hedge.py): the caller decodes around them."""
        extents = layout.data_extents(offset, length)
        ranges = collections.defaultdict(list)
        for shard_index, start, size in extents:
            ranges[shard_index].append((start, size))
        members = pg.core.acting.members
        holes = {index for index in ranges if members[index] is None}
        if holes:
            return None, holes, {}
        shards = list(ranges)
        started = _loop_time()
        fetches = _start(self._fetch(pg, members[index], index, name, version, ranges[index])
                         for index in shards)
        hedging = config.value(self.port.map.config, "osd.hedge_shard_reads")
        with _cancelled_unless_done(fetches):
            done, due = await asyncio.wait(fetches,
                                           timeout=self.hedger.delay() if hedging else None)
            if due:
                late = {members[index]: fetch for index, fetch in zip(shards, fetches)
                        if fetch in due}
                others = sum(1 for osd in members if osd is not None and osd not in late)
                if others >= layout.k and all(self.hedger.may_hedge(osd) for osd in late):
                    return None, {index for index in shards if members[index] in late}, late
                await asyncio.wait(due)
        self.hedger.record(_loop_time() - started)
        results = [fetch.exception() or fetch.result() for fetch in fetches]
        pieces, failed = {}, set()
        for index, result in zip(shards, results):
            if isinstance(result, ShardUnavailable):
                failed.add(index)
            elif isinstance(result, BaseException):
                raise result
            else:
                pieces[index] = memoryview(result)
        if failed:
            return None, failed, {}
        if len(extents) == 1:
            return pieces[extents[0][0]], None, {}
        # The pieces go out one after another as they are (frame.encode takes a tuple): no
        # join, which cost a memset and a copy of every byte of a multi-shard read.
        out, cursors = [], collections.Counter()
        for index, _, size in extents:
            out.append(pieces[index][cursors[index]:cursors[index] + size])
            cursors[index] += size
        return tuple(out), None, {}

    def avoided_shards(self, pg, codec_k):
        """Shard indices on members that reads are steered around (a late shard was read
        around lately: common/hedge.py) or that the map flags slow, as many as the read can do
        without (the members up beyond k): a read then decodes from the others rather than
        wait on a slow disk. When there are more such members than that, the ones steered
        around most recently go first, then those flagged slow: this primary's own evidence is
        seconds fresher than SLOW_DISK's, whose flag can still name a disk that was slow a
        while ago (avoiding none of them would make every read wait on the one slow now)."""
        members = pg.core.acting.members
        up = [(index, osd) for index, osd in enumerate(members) if osd is not None]
        spare = len(up) - codec_k
        if spare <= 0:
            return set()
        steered = []
        if config.value(self.port.map.config, "osd.hedge_shard_reads"):
            steered = self.hedger.steered_first([osd for _, osd in up])
        slow = slow_osds(self.port.map)
        if not (steered or slow):
            return set()
        rank = {osd: place for place, osd in enumerate(steered)}
        worst = sorted((index for index, osd in up if osd in rank or osd in slow),
                       key=lambda index: rank.get(members[index], len(rank)))
        return set(worst[:spare])

    def _preference(self, pg):
        """Shard indices to read a degraded range from: this OSD's own, then data shards, then
        parity (decoding from data shards is cheapest), members that are up only."""
        members = pg.core.acting.members
        up = [index for index, osd in enumerate(members) if osd is not None]
        return sorted(up, key=lambda index: (members[index] != self.port.me, index))

    async def _gather(self, pg, name, version, layout, ranges, exclude=(), extra=(),
                      fast=False, reserve=()):
        """{shard index: bytes} of `ranges` from k shards of `version` (never mixing versions),
        asking k members at a time and more when some fail; `fast` (the pool's fast_read):
        asking every member at once and taking the first k to answer. `extra`: (osd, shard
        index) of holders outside the acting set (a past authority). `reserve`: shard indices
        of members being avoided (`avoided_shards`), asked only when one of the others fails
        or is still due after the hedge delay (then its member may be steered around:
        `_settle_hedges`). Raises RequestFailed(Code.UNAVAILABLE) naming the shards found
        when fewer than k can be read."""
        members = pg.core.acting.members
        order = [index for index in self._preference(pg) if index not in exclude]
        candidates = [(members[index], index) for index in order if index not in reserve]
        reserve = [(members[index], index) for index in order if index in reserve]
        candidates += [(osd, index) for osd, index in extra
                       if index not in exclude and (osd, index) not in candidates]
        hedging = bool(reserve) and not fast and \
            config.value(self.port.map.config, "osd.hedge_shard_reads")
        got, failures, late = {}, [], {}
        while len(got) < layout.k and (candidates or reserve):
            if not candidates:              # rather the members avoided than too few shards
                candidates, reserve = reserve, []
            wanted = len(candidates) if fast else layout.k - len(got)
            batch = [c for c in candidates if c[1] not in got][:wanted]
            candidates = [c for c in candidates if c not in batch]
            if not batch:
                break
            started = _start(self._fetch(pg, osd, index, name, version, ranges)
                             for osd, index in batch)
            fetches = dict(zip(started, batch))
            due = set(fetches)
            with _cancelled_unless_done(started):
                while due and len(got) < layout.k:
                    wait_s = self.hedger.delay() if hedging and reserve else None
                    done, due = await asyncio.wait(due, timeout=wait_s,
                                                   return_when=asyncio.FIRST_COMPLETED)
                    if not done:            # late: ask members avoided, as a hedge
                        for fetch in list(due):
                            osd = fetches[fetch][0]
                            if not reserve or not self.hedger.may_hedge(osd):
                                break
                            late[osd] = fetch
                            stand_in = reserve.pop(0)
                            extra_fetch, = _start([self._fetch(pg, *stand_in, name, version,
                                                               ranges)])
                            started.append(extra_fetch)
                            fetches[extra_fetch] = stand_in
                            due.add(extra_fetch)
                        hedging = False     # once per gather (or the budget is dry: wait)
                        continue
                    for fetch in done:
                        error = fetch.exception()
                        if isinstance(error, ShardUnavailable):
                            failures.append(error.reason)
                        elif error is not None:
                            raise error
                        elif len(got) < layout.k:
                            got[fetches[fetch][1]] = fetch.result()
        self._settle_hedges(late)
        if len(got) < layout.k:
            raise RequestFailed(Code.UNAVAILABLE, f"pg {pg.key[0]}.{pg.key[1]:x}: object {name!r} "
                                f"(version {version:x}) has {len(got)} readable shards "
                                f"{sorted(got)}, {layout.k} needed ({'; '.join(failures)})")
        return got

    async def _read_degraded(self, pg, name, version, layout, offset, length, failed,
                             fast=False, reserve=()):
        first, last, start, span = layout.stripe_span(offset, length)
        spans = await self._gather(pg, name, version, layout, [(start, span)], exclude=failed,
                                   fast=fast, reserve=reserve)
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
        call, header_of = self.port.call, self.port.header
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
                return await self._roll_back(pg, name, version, epoch, exc, source)
            moved = sum(len(data) for index, data in shards.items()
                        if pg.core.acting.members[index] != self.port.me)
            if pay is not None:
                await pay(moved + layout.shard_bytes)
            rebuilt = await self._in_thread_if_large(size, ecstripe.rebuild_shards, codec,
                                                     layout, shards, [position])
            shard = rebuilt[position]
            self.recovery_bytes_total += moved + len(shard)
        await call(target, header_of(pg, "pg_push", epoch, name=name, version=version,
                                     manifest=header.get("manifest", False), shard=position,
                                     ec=[size, unit]),
                   shard if target == self.port.me else padded((shard,)))  # a local call: no wire
        return "copied"


def _judge(hedger, osd, fetch):
    """Steer around a member whose late shard (`fetch`) is still due a while after the read
    decoded around it (common/hedge.py)."""
    if not fetch.done():
        hedger.steer(osd)


def _loop_time():
    """The running loop's clock (the simulation's is virtual: tests/simnet.py)."""
    return asyncio.get_running_loop().time()


def _start(coroutines):
    """Tasks of shard fetches, each one's failure marked seen (`_retrieved`) whoever waits for
    it or not."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    for task in tasks:
        task.add_done_callback(_retrieved)
    return tasks


@contextlib.contextmanager
def _cancelled_unless_done(tasks):
    """Cancel those of `tasks` still running if the block is left by an exception (the
    read's own cancellation or failure), as asyncio.gather would; fetches the block chose
    not to wait for (a hedge decoded around them) run on."""
    try:
        yield
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _retrieved(fetch):
    """A shard fetch nobody waits for any more: its failure is seen (asyncio logs one that
    nobody retrieved), its bytes dropped."""
    if not fetch.cancelled():
        fetch.exception()
