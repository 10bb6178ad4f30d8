"""The object store's committer: commit groups, the journal, replay, and publishing.

Theory of operation (osd/store.py has the whole picture): one task takes every transaction
whose data writes completed, builds one metadata batch for the group (records, deletions,
allocator segments, collection usage, the sequence), and makes it durable: with a journal
(format 2, osd/journal.py) as one record in the ring on the device plus one device flush, then
into RocksDB without its WAL; without one (format 1) a device flush, then a synchronous RocksDB
batch in a thread, overlapped with the next group's flush. Only then is the group published
(the caches updated, the collections changed) and acknowledged. Blocks a commit freed go back
to the allocator once every read pinned before it has finished. A failed flush or metadata
write poisons the store: every group after it is refused with StoreFailed until a remount.
At open, `_replay` applies the journal's records RocksDB's durable state lacks.
"""

import asyncio
import logging
import struct
import time

import msgpack
from rocksdict import WriteBatch

from cairn.common.limits import COMMIT_GROUP_TRANSACTIONS_MAX, DEVICE_IO_BYTES_MAX
from cairn.osd import journal, records
from cairn.osd.errors import ChecksumError, StoreFailed
from cairn.osd.records import ObjectRecord

log = logging.getLogger("cairn.osd")


# A store with a journal makes RocksDB durable (a checkpoint) when the ring is half used, and
# after this long without a commit, so replay after a crash stays short and read-only readers
# of the metadata (cairn-osd bitrot) see recent objects.
JOURNAL_IDLE_CHECKPOINT_S = 5.0


def _batch(ops, journal_at=None):
    """A RocksDB write batch of journal ops (osd/journal.py); `journal_at`: the ring position
    replay starts from once this batch is durable (records.KEY_JOURNAL)."""
    batch = WriteBatch(raw_mode=True)
    if journal_at is not None:
        batch.put(records.KEY_JOURNAL, struct.pack(">Q", journal_at))
    for op in ops:
        if op[0] == journal.PUT:
            batch.put(op[1], op[2])
        elif op[0] == journal.DELETE:
            batch.delete(op[1])
        else:
            batch.delete_range(op[1], op[2])
    return batch


class StoreCommitter:
    """The committer of `Store` (osd/store.py): the only code that changes the committed state
    (sequence, collections, usage, the allocator's commits and frees) and acknowledges
    transactions; it runs as one task for the store's lifetime (`_commit_loop`)."""

    async def _commit_loop(self):
        """Runs for the store's lifetime, until cancelled by close() or abandon()."""
        if self._journal is None:
            await self._commit_loop_synced()
        else:
            await self._commit_loop_journaled()

    async def _commit_loop_journaled(self):
        """One group at a time: the group's journal record is written (its data already is),
        one device flush makes both durable, RocksDB takes the batch without its WAL, and the
        group is acknowledged. The next group's record is written only after that flush
        completed, which replay relies on (osd/journal.py). A checkpoint starts when the ring is
        half used, and after JOURNAL_IDLE_CHECKPOINT_S without commits."""
        while True:
            if not self._commit_queue:
                try:
                    async with asyncio.timeout(JOURNAL_IDLE_CHECKPOINT_S if self._journal.used
                                               else None):
                        await self._commit_wanted.wait()
                except TimeoutError:
                    self._start_checkpoint()
                    continue
                self._commit_wanted.clear()
                continue
            # One loop turn first: transactions that the same burst of messages started join
            # this group instead of the next (measured in a 3-OSD cluster at 16 4 KiB writes in
            # flight: 3.9 to 4.5 transactions per group).
            await asyncio.sleep(0)
            group = self._commit_queue[:COMMIT_GROUP_TRANSACTIONS_MAX]
            del self._commit_queue[:len(group)]
            self._committing = True
            try:
                await self._commit_journaled(group)
            finally:
                self._committing = False

    async def _commit_journaled(self, group):
        if self._refused_after_failure(group):
            return
        began_ns = time.perf_counter_ns()
        try:
            ops, sequence = self._group_ops(group)
            payload = journal.encode_payload(ops)
            if journal.padded_length(len(payload)) > self._record_bytes_max:
                # Too big for the ring (a group of large omap pages): made durable the way a
                # store without a journal does, after a checkpoint of everything before it.
                await self.device.flush()
                flushed_ns = time.perf_counter_ns()
                await asyncio.get_running_loop().run_in_executor(
                    self._db_thread, self._write_past_journal, _batch(ops, self._journal.head))
                self._journal.tail = self._journal.head
                self.records_past_journal_total += 1
            else:
                head = await self._write_record(sequence - len(group) + 1, sequence, payload)
                await self.device.flush()
                flushed_ns = time.perf_counter_ns()
                self._db.write(_batch(ops, head), self._unsynced)
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.flush_ns_total += flushed_ns - began_ns
        self.meta_commit_ns_total += time.perf_counter_ns() - flushed_ns
        self._publish(group, sequence)
        if 2 * self._journal.used >= self._journal.ring_bytes:
            self._start_checkpoint()

    def _write_past_journal(self, batch):
        self._db.flush()
        self._db.write(batch, self._sync)

    async def _write_record(self, first, last, payload):
        """Write one group's record at the ring's head (after a wrap marker when it does not
        fit before the ring's end), waiting for a checkpoint when the ring is full; returns
        the new head."""
        length = journal.padded_length(len(payload))
        while (placed := self._journal.place(length)) is None:
            await asyncio.shield(self._start_checkpoint())
            if self._failure is not None:
                raise self._failed_earlier()
        position, skip = placed
        if skip:
            await self._write_journal_bytes(self._journal.head, journal.encode(
                journal.KIND_WRAP, self._uuid_bytes, self._journal.head, first, first))
        await self._write_journal_bytes(position, journal.encode(
            journal.KIND_GROUP, self._uuid_bytes, position, first, last, payload))
        self._journal.head = position + length
        return self._journal.head

    async def _write_journal_bytes(self, position, data):
        """Write `data` (whole blocks) at ring `position`, from the store's own journal buffer
        when it fits (one aligned buffer kept for the store's life), else from a pool one."""
        own = len(data) <= len(self._journal_buffer)
        view = self._journal_buffer[:len(data)] if own else self.device.pool.get(len(data))
        try:
            view[:] = data
            await self.device.write(self.superblock.journal_start_bytes +
                                    position % self._journal.ring_bytes, view)
        finally:
            if not own:
                self.device.pool.put(view)

    def _start_checkpoint(self):
        """Make RocksDB's state durable (a memtable flush in the metadata thread), after which
        the ring up to today's head is free; returns the task doing it (one at a time)."""
        if self._checkpoint is None or self._checkpoint.done():
            self._checkpoint = asyncio.get_running_loop().create_task(
                self._run_checkpoint(self._journal.head))
        return self._checkpoint

    async def _run_checkpoint(self, head):
        try:
            await asyncio.get_running_loop().run_in_executor(self._db_thread, self._db.flush)
        except Exception as exc:
            log.error("store checkpoint (RocksDB flush) failed: %s", exc)
            self._failure = self._failure or exc
            return
        self._journal.tail = max(self._journal.tail, head)
        self.checkpoints_total += 1

    async def _replay(self):
        """Apply the journal's records that RocksDB's durable state does not hold yet (see
        osd/journal.py), then make them durable in RocksDB."""
        sequence, start = records.durable_point(self._db)
        ring_bytes = self._journal.ring_bytes
        first = await self.device.read(self.superblock.journal_start_bytes +
                                       start % ring_bytes, self.block_size)
        try:
            anything = journal.starts(first, start, sequence + 1, self._uuid_bytes)
        finally:
            self.device.pool.put(first)
        if not anything:        # a clean close, or a checkpoint after the last commit
            self._journal.head = self._journal.tail = start
            return
        region = bytearray(ring_bytes)
        for offset in range(0, ring_bytes, DEVICE_IO_BYTES_MAX):
            length = min(DEVICE_IO_BYTES_MAX, ring_bytes - offset)
            view = await self.device.read(self.superblock.journal_start_bytes + offset, length)
            region[offset:offset + length] = view
            self.device.pool.put(view)
        found = journal.scan(region, ring_bytes, start, sequence + 1, self._uuid_bytes)
        if found and not await self._data_durable(found[-1]):
            dropped = found.pop()
            log.warning("store: the last journal record (sequences %d-%d) references data "
                        "that did not reach the device; it was never acknowledged and is "
                        "dropped", dropped.first, dropped.last)
        for record in found:
            self._db.write(_batch(record.ops, record.end), self._unsynced)
        if found:
            self._db.flush()
            log.info("store: replayed %d journal records (sequences %d-%d)", len(found),
                     found[0].first, found[-1].last)
        self._journal.head = self._journal.tail = found[-1].end if found else start
        self.replayed_records = len(found)

    async def _data_durable(self, record):
        """Whether every object the journal record writes has its blocks on the device."""
        for op in record.ops:
            if op[0] != journal.PUT or not op[1].startswith(records.PREFIX_OBJECT):
                continue
            object_record = ObjectRecord.decode(op[2])
            if not object_record.block_count:
                continue
            collection, _, name = op[1][len(records.PREFIX_OBJECT):].partition(b"\x00")
            try:
                view = await self._read_blocks(collection.decode(), name.decode(),
                                               object_record, 0, object_record.block_count)
            except ChecksumError:
                return False
            self.device.pool.put(view)
        return True

    async def _commit_loop_synced(self):
        """The commit loop of a store without a journal (format 1, or a tiny device).

        Two groups overlap: while group N's metadata write runs in the metadata thread, group
        N+1's device flush runs in the kernel. Everything else stays in order: N is acknowledged
        before N+1's metadata batch is even built, so sequences, the allocator and RocksDB see
        groups one at a time, and the metadata thread never holds two writes."""
        writing = None          # (group, sequence, write future, flush timings) of group N
        try:
            while True:
                if not self._commit_queue:
                    if writing is not None:
                        group_n, writing = writing, None
                        await self._finish_group(*group_n)
                        self._committing = False
                        continue
                    await self._commit_wanted.wait()
                    self._commit_wanted.clear()
                    continue
                group = self._commit_queue[:COMMIT_GROUP_TRANSACTIONS_MAX]
                del self._commit_queue[:len(group)]
                self._committing = True
                timings = await self._flush_group(group)
                if writing is not None:
                    group_n, writing = writing, None
                    await self._finish_group(*group_n)
                if timings is not None and self._failure is not None:
                    self._fail_group(group, self._failed_earlier())
                elif timings is not None:
                    try:
                        writing = self._start_group_write(group, timings)
                    except Exception as exc:
                        self._poison(group, exc)    # every later group is refused with it
                self._committing = writing is not None
        except BaseException:
            if writing is not None:
                self._fail_group(writing[0], StoreFailed(
                    "the store stopped before this commit was confirmed"))
            raise

    def _refused_after_failure(self, group):
        """After the store failed, a group is refused whole (its reservations returned)."""
        if self._failure is None:
            return False
        for plan in group:
            self.allocator.unreserve(plan.allocated)
        self._fail_group(group, self._failed_earlier())
        return True

    def _fail_group(self, group, error):
        for plan in group:
            self._plan_ended(plan, error)
            if not plan.future.done():
                plan.future.set_exception(error)

    def _poison(self, group, exc):
        # The device or RocksDB failed mid-commit: what is durable is unknown, and the in-memory
        # allocator may be ahead of it. Poison the store (STYLE.md 2.5).
        self._failure = self._failure or exc
        self._fail_group(group, StoreFailed(f"commit failed, the store must be remounted: {exc}"))

    async def _flush_group(self, group):
        """Make the group's data durable; returns (start, end) in perf_counter ns, or None if
        the group failed (its futures then hold the error)."""
        if self._refused_after_failure(group):
            return None
        began_ns = time.perf_counter_ns()
        try:
            await self.device.flush()
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return None
        return began_ns, time.perf_counter_ns()

    def _start_group_write(self, group, timings):
        """Build the group's metadata batch and hand it to the metadata thread (a store without
        a journal); returns what `_finish_group` needs. Raises what building the batch or
        handing it over raised (the caller poisons the store with it)."""
        ops, sequence = self._group_ops(group)
        write = asyncio.get_running_loop().run_in_executor(
            self._db_thread, self._db.write, _batch(ops), self._sync)
        return group, sequence, write, timings

    def _group_ops(self, group):
        """The group's metadata changes as journal ops (osd/journal.py), and its last sequence.
        Numbers the group's transactions and commits their blocks in the allocator."""
        ops = []
        dirty = set()
        sequence = self.sequence
        now_ns = time.time_ns()
        changed = set()
        for plan in group:
            sequence += 1
            plan.sequence = sequence
            for key, created in plan.collections.items():
                name = key[len(records.PREFIX_COLLECTION):].decode()
                if created:
                    self._usage[name] = [0, 0, now_ns]
                    changed.add(name)
                else:
                    self._usage.pop(name, None)
                    changed.discard(name)
                    ops.append((journal.DELETE, key))
            for key, (collection, old) in plan.before.items():
                new = plan.records.get(key, old)    # a rename onto itself changes nothing
                usage = self._usage.get(collection)
                if usage is not None and new is not old:
                    usage[0] += (new is not None) - (old is not None)
                    usage[1] += (new.size if new is not None else 0) - \
                        (old.size if old is not None else 0)
                    changed.add(collection)
            for change in plan.omap:
                if change[0] == "put":
                    ops.append((journal.PUT, change[1], change[2]))
                elif change[0] == "delete":
                    ops.append((journal.DELETE, change[1]))
                else:
                    ops.append((journal.DELETE_RANGE, change[1], change[2]))
            for key, record in plan.records.items():
                if record is None:
                    ops.append((journal.DELETE, key))
                else:
                    record.version = sequence       # a fresh record of this plan
                    ops.append((journal.PUT, key, record.encode()))
            dirty |= self.allocator.commit(plan.allocated, plan.freed)
        for name in changed:
            objects, size, created_ns = self._usage[name]
            ops.append((journal.PUT, records.collection_key(name), msgpack.packb(
                {"created_ns": created_ns, "objects": objects, "bytes": size})))
        for index in sorted(dirty):
            ops.append((journal.PUT, records.bitmap_key(index),
                        self.allocator.segment_bytes(index)))
        ops.append((journal.PUT, records.KEY_SEQUENCE, struct.pack(">Q", sequence)))
        if self._omap_next != self._omap_persisted:
            # Ids handed out by transactions not yet committed are covered too: an id is
            # never reused, whatever happens to the transaction that took it.
            self._omap_persisted = self._omap_next
            ops.append((journal.PUT, records.KEY_OMAP_NEXT, struct.pack(">Q", self._omap_next)))
        return ops, sequence

    async def _finish_group(self, group, sequence, write, timings):
        """Wait for the group's metadata write, then publish it and acknowledge its
        transactions."""
        try:
            await write
        except BaseException as exc:
            self._poison(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        began_ns, flushed_ns = timings
        self.flush_ns_total += flushed_ns - began_ns
        self.meta_commit_ns_total += time.perf_counter_ns() - flushed_ns
        self._publish(group, sequence)

    def _publish(self, group, sequence):
        """The group is durable: make it the committed state and acknowledge it."""
        self.sequence = sequence
        for plan in group:
            for key, record in plan.records.items():
                self._cache_put(key, record)      # None: known absent
                self.read_cache.drop(key)
            self._plan_ended(plan)
            for key, created in plan.collections.items():
                name = key[len(records.PREFIX_COLLECTION):].decode()
                if created:
                    self._collections.add(name)
                else:
                    self._collections.discard(name)
        self.commits_total += 1
        self.transactions_total += len(group)
        for plan in group:
            if plan.freed:
                self._deferred_frees.append((plan.sequence, plan.freed))
        self._release_frees()
        for plan in group:
            if not plan.future.done():
                plan.future.set_result(plan.sequence)

    def _pin(self):
        self._read_pins[self.sequence] += 1
        return self.sequence

    def _unpin(self, pin):
        self._read_pins[pin] -= 1
        if self._read_pins[pin] == 0:
            del self._read_pins[pin]
        self._release_frees()

    def _release_frees(self):
        if not self._deferred_frees:
            return
        oldest = min(self._read_pins) if self._read_pins else None
        while self._deferred_frees:
            sequence, extents = self._deferred_frees[0]
            if oldest is not None and oldest < sequence:
                break
            self._deferred_frees.popleft()
            self.allocator.release(extents)
