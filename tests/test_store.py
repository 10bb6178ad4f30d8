"""The store engine on every device twin: operations, errors, persistence, group commit,
space accounting and fsck."""

import asyncio
import os

import pytest

from cairn.osd.errors import (ChecksumError, CollectionExists, CollectionNotEmpty,
                              CollectionNotFound, InvalidArgument, NoSpace, ObjectNotFound,
                              StoreExists, NotAStore)
from cairn.native.checksum import block_crcs
from cairn.osd.fsck import fsck
from cairn.osd.store import Store, StoreClosed, Transaction, mkfs
from tests.helpers import StorePort, run

pytestmark = pytest.mark.unit


async def fresh_store(open_twin, tmp_path, size=64 << 20):
    device = await open_twin(size)
    meta = str(tmp_path / "meta")
    await mkfs(device, meta)
    store = await Store.open(device, meta)
    await store.create_collection("c")
    return device, meta, store


async def memory_store(tmp_path, journal=True, **device_options):
    """(device, meta, store) on a fresh fault-injecting in-memory device, collection "c" made."""
    from cairn.native import MemoryBlockDevice
    device = MemoryBlockDevice(8 << 20, **device_options)
    meta = str(tmp_path / "meta")
    await mkfs(device, meta, journal=journal)
    store = await Store.open(device, meta)
    await store.create_collection("c")
    return device, meta, store


async def assert_fsck_clean(store, deep=True):
    report = await fsck(store, deep=deep)
    assert report.clean, report.problems
    return report


def test_put_get_ranges_and_overwrites(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        data = os.urandom(3 * 4096 + 100)
        await store.put("c", "obj", data, attrs={"kind": b"test"})
        assert await store.read_bytes("c", "obj") == data
        assert await store.read_bytes("c", "obj", 4000, 200) == data[4000:4200]
        assert await store.read_bytes("c", "obj", len(data) - 5, 100) == data[-5:]
        assert await store.read_bytes("c", "obj", len(data) + 10) == b""
        # Partial overwrites: inside, across a block edge, past the end (gap reads as zeros).
        model = bytearray(data)
        for offset, chunk in ((10, b"a" * 10), (4090, b"b" * 20), (len(data) + 5000, b"c" * 7)):
            await store.write("c", "obj", offset, chunk)
            if offset > len(model):
                model.extend(bytes(offset - len(model)))
            model[offset:offset + len(chunk)] = chunk
            assert await store.read_bytes("c", "obj") == bytes(model)
        stat = store.stat("c", "obj")
        assert stat.size == len(model) and stat.attrs == {"kind": b"test"}
        # Replace whole, then empty.
        await store.put("c", "obj", b"short")
        assert await store.read_bytes("c", "obj") == b"short"
        assert store.stat("c", "obj").attrs == {}
        await store.put("c", "obj", b"")
        assert await store.read_bytes("c", "obj") == b""
        await store.write("c", "new", 3, b"xyz")
        assert await store.read_bytes("c", "new") == b"\0\0\0xyz"
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_versions_attrs_delete_and_errors(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        first = await store.put("c", "a", b"1")
        second = await store.set_attrs("c", "a", {"x": b"1", "y": b"2"})
        assert second > first and store.stat("c", "a").version == second
        await store.set_attrs("c", "a", {"x": None})
        assert store.stat("c", "a").attrs == {"y": b"2"}
        await store.delete("c", "a")
        with pytest.raises(ObjectNotFound):
            await store.read("c", "a")
        with pytest.raises(ObjectNotFound):
            await store.delete("c", "a")
        with pytest.raises(CollectionNotFound):
            await store.put("nope", "a", b"1")
        with pytest.raises(CollectionNotFound):
            store.stat("nope", "a")
        with pytest.raises(CollectionExists):
            await store.create_collection("c")
        with pytest.raises(InvalidArgument):
            await store.put("c", "", b"1")
        with pytest.raises(InvalidArgument):
            await store.put("c", "a", "text, not bytes")
        with pytest.raises(InvalidArgument):
            await store.read("c", "a", -1)
        with pytest.raises(InvalidArgument):
            await store.apply(Transaction())
        await store.close()
        await device.aclose()
    run(body())


def test_transactions_are_atomic(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.put("c", "keep", b"old")
        # The second op fails (no such object), so the first must not happen either.
        txn = Transaction().put("c", "keep", b"new").delete("c", "missing")
        with pytest.raises(ObjectNotFound):
            await store.apply(txn)
        assert await store.read_bytes("c", "keep") == b"old"
        # Several ops on one object in one transaction.
        txn = (Transaction().put("c", "x", b"a" * 5000).write("c", "x", 4094, b"BCD")
               .set_attrs("c", "x", {"k": b"v"}).create_collection("d").put("d", "y", b"y"))
        await store.apply(txn)
        assert await store.read_bytes("c", "x") == b"a" * 4094 + b"BCD" + b"a" * 903
        assert await store.read_bytes("d", "y") == b"y"
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_rename_moves_without_copying_and_replaces_the_target(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.create_collection("stash")
        await store.put("c", "a", b"A" * 9000, attrs={"v": b"1"})
        await store.put("stash", "old", b"replaced" * 100)
        used = store.statfs()
        # The shape of an erasure-coded overwrite: keep the old bytes aside, write the new.
        await store.apply(Transaction().rename("c", "a", "stash", "old").put("c", "a", b"new"))
        assert await store.read_bytes("stash", "old") == b"A" * 9000
        assert store.stat("stash", "old").attrs == {"v": b"1"}
        assert await store.read_bytes("c", "a") == b"new"
        assert store.statfs()["used_bytes"] <= used["used_bytes"] + 4096   # no copy of 9000
        with pytest.raises(ObjectNotFound):
            await store.apply(Transaction().rename("c", "nothing", "stash", "x"))
        await store.apply(Transaction().rename("stash", "old", "c", "a"))      # roll back
        assert await store.read_bytes("c", "a") == b"A" * 9000
        assert store.list_objects("stash") == ([], None)
        await assert_fsck_clean(store)
        await store.close()
        store = await Store.open(device, meta)
        assert await store.read_bytes("c", "a") == b"A" * 9000
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_a_put_padded_to_whole_blocks_is_stored_without_a_copy(open_twin, tmp_path):
    """What an erasure-coded member receives: the shard, then zeros to whole blocks, in an
    aligned buffer. `size` makes it an object of the shard's length written from that very
    buffer (no pool buffer taken for a copy); bad padding is refused."""
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        data = os.urandom(9000)
        buffer = device.pool.get(3 * 4096)
        buffer[:9000] = data
        buffer[9000:] = bytes(len(buffer) - 9000)
        taken = device.pool.statistics()
        taken = taken["allocated_total"] + taken["reused_total"]
        await store.apply(Transaction().put("c", "shard", buffer, size=9000))
        after = device.pool.statistics()
        assert after["allocated_total"] + after["reused_total"] == taken
        assert store.stat("c", "shard").size == 9000
        assert await store.read_bytes("c", "shard") == data
        # The padding was zeros, so a later write past the end leaves a zero gap.
        await store.write("c", "shard", 10000, b"tail")
        assert await store.read_bytes("c", "shard") == data + bytes(1000) + b"tail"
        # An unaligned padded buffer is copied, still as `size` bytes.
        await store.apply(Transaction().put("c", "copied", b"abc" + bytes(100), size=3))
        assert await store.read_bytes("c", "copied") == b"abc"
        with pytest.raises(InvalidArgument, match="not zeros"):
            Transaction().put("c", "x", b"abc\x01", size=3)
        with pytest.raises(InvalidArgument, match="whole 4096-byte blocks"):
            Transaction().put("c", "x", bytes(5000), size=100)
        with pytest.raises(InvalidArgument, match="whole 4096-byte blocks"):
            Transaction().put("c", "x", b"abc", size=4)
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_block_crcs_known_from_receipt_are_used_only_for_the_buffer_written_as_it_is(
        open_twin, tmp_path):
    """A member stores a received buffer with the block crcs its frame check computed (one read
    of the bytes). The store takes them as they are for a buffer it writes uncopied, so wrong
    ones show as a checksum error on read; where it copies, it computes its own."""
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        data = os.urandom(3 * 4096)
        buffer = device.pool.get(len(data))
        buffer[:] = data
        await store.apply(Transaction().put("c", "known", buffer, crcs=block_crcs(data, 4096)))
        assert store._record("c", "known").crcs == block_crcs(data, 4096)
        assert await store.read_bytes("c", "known") == data
        lying = buffer.tobytes()                   # another buffer, the same bytes
        buffer = device.pool.get(len(data))
        buffer[:] = lying
        await store.apply(Transaction().put("c", "lied", buffer, crcs=bytes(12)))
        with pytest.raises(ChecksumError):
            await store.read_bytes("c", "lied")
        # Copied (not aligned) or the wrong count: the store's own crcs.
        # (A bytes object is aligned now and then, by chance: about one run in 256 wrote it
        # uncopied with the lying crcs. One byte past an aligned buffer never is.)
        spare = device.pool.get(len(data) + 4096)
        unaligned = spare[1:1 + len(data)]
        unaligned[:] = b"x" + data[1:]
        await store.apply(Transaction().put("c", "copied", unaligned, crcs=bytes(12)))
        assert await store.read_bytes("c", "copied") == b"x" + data[1:]
        buffer = device.pool.get(len(data))
        buffer[:] = data
        await store.apply(Transaction().put("c", "short", buffer, crcs=bytes(8)))
        assert await store.read_bytes("c", "short") == data
        await store.close()
        await device.aclose()
    run(body())


def test_collections_and_listing(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        names = [f"obj-{i:03d}" for i in range(25)] + ["other"]
        await asyncio.gather(*(store.put("c", name, name.encode()) for name in names))
        listed, marker = [], None
        while True:
            page, marker = store.list_objects("c", prefix="obj-", start_after=marker, limit=7)
            listed += page
            if marker is None:
                break
        assert listed == sorted(names[:25])
        assert store.list_objects("c", prefix="oth")[0] == ["other"]
        await store.create_collection("e")
        assert store.list_collections() == ["c", "e"]
        with pytest.raises(CollectionNotEmpty):
            await store.remove_collection("c")
        await store.remove_collection("e")
        assert store.list_collections() == ["c"]
        with pytest.raises(InvalidArgument):
            store.list_objects("c", limit=0)
        await store.close()
        await device.aclose()
    run(body())


def test_concurrent_transactions_share_commits(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        payloads = {f"o{i}": os.urandom(4096 * (1 + i % 3)) for i in range(64)}
        await asyncio.gather(*(store.put("c", name, data) for name, data in payloads.items()))
        stats = store.statistics()
        assert stats["transactions_total"] == 65            # with the collection's
        assert stats["commits_total"] < stats["transactions_total"]
        for name, data in payloads.items():
            assert await store.read_bytes("c", name) == data
        # Concurrent overwrites of one object serialise; the last writer wins.
        await asyncio.gather(*(store.put("c", "hot", bytes([i]) * 9000) for i in range(10)))
        assert await store.read_bytes("c", "hot") == bytes([9]) * 9000
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_transactions_on_one_object_in_flight_at_once_commit_in_the_order_they_started(
        open_twin, tmp_path):
    """No lock: a transaction plans on the record an earlier one has not committed yet, shares
    its commit group, and commits after it; a partial write of an object whose put is still in
    flight waits for that put's data and keeps its bytes."""
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        free = store.statfs()["free_bytes"]
        commits = store.statistics()["commits_total"]
        txns = [Transaction().put("c", "a", b"1" * 9000),
                Transaction().set_attrs("c", "a", {"k": b"v"}).put("c", "b", b"2" * 5000),
                Transaction().rename("c", "a", "c", "moved"),
                Transaction().omap_update("c", "moved", set=[(b"key", b"value")]),
                Transaction().delete("c", "b"),
                Transaction().put("c", "b", b"3" * 100)]
        await asyncio.gather(*(store.apply(txn) for txn in txns))
        assert store.statistics()["commits_total"] - commits < len(txns)
        assert store.statistics()["built_on_in_flight_total"] >= 4
        assert store.list_objects("c")[0] == ["b", "moved"]
        assert await store.read_bytes("c", "moved") == b"1" * 9000
        assert store.stat("c", "moved").attrs == {"k": b"v"}
        assert store.omap_get("c", "moved", [b"key"]) == {b"key": b"value"}
        assert await store.read_bytes("c", "b") == b"3" * 100
        assert store.usage("c")[:2] == (2, 9100)
        await asyncio.gather(store.put("c", "p", b"a" * 9000),
                             store.write("c", "p", 100, b"B" * 10))
        assert await store.read_bytes("c", "p") == b"a" * 100 + b"B" * 10 + b"a" * 8890
        await asyncio.gather(*(store.delete("c", name) for name in ("b", "moved", "p")))
        assert store.statfs()["free_bytes"] == free
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_a_transaction_built_on_one_that_failed_fails_too(tmp_path):
    """A put whose data write fails takes back its blocks; the transaction planned on its
    record in the meantime fails with it (it cannot commit a record of blocks never written),
    one on another object goes on, and the store stays consistent."""
    from cairn.native import DeviceIOError
    from cairn.osd.errors import StoreError

    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.put("c", "obj", b"o" * 100)
        free = store.statfs()["free_bytes"]
        data_start = store.superblock.data_start_bytes        # the journal lies before it
        device.fail_writes.append((data_start, device.size_bytes - data_start))
        results = await asyncio.gather(
            store.put("c", "obj", b"x" * 9000),
            store.set_attrs("c", "obj", {"k": b"v"}),
            store.apply(Transaction().put("c", "other", b"")), return_exceptions=True)
        device.fail_writes.clear()
        assert isinstance(results[0], DeviceIOError), results
        assert isinstance(results[1], StoreError) and "earlier transaction" in str(results[1])
        assert not isinstance(results[2], BaseException), results
        assert await store.read_bytes("c", "obj") == b"o" * 100
        assert store.stat("c", "obj").attrs == {}
        assert store.statfs()["free_bytes"] == free
        await store.set_attrs("c", "obj", {"k": b"w"})      # the object is writable again
        assert store.stat("c", "obj").attrs == {"k": b"w"}
        await assert_fsck_clean(store)
        await store.close()
    run(body())


def test_a_collection_key_table_takes_no_object_lock_and_goes_with_its_collection(open_twin,
                                                                                    tmp_path):
    """A collection's key table (where a PG's log lives): entries set and removed in
    transactions, with objects atomically; no object is locked, so transactions on the same
    table share commit groups (locked, they would commit one by one); the table counts as no
    object; it survives a remount and goes with its collection."""
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.apply(Transaction().put("c", "obj", b"x").keys_update(
            "c", set=[(b"0001", b"first"), (b"0002", b"second")]))
        assert store.keys_get("c", b"0001") == b"first" and store.keys_get("c", b"none") is None
        assert store.usage("c")[0] == 1 and store.list_objects("c")[0] == ["obj"]
        # Thirty transactions on the table at once commit together, in far fewer groups.
        commits = store.statistics()["commits_total"]
        await asyncio.gather(*(store.apply(Transaction().keys_update(
            "c", set=[(b"1%03d" % i, b"v%d" % i)], remove=[b"0002"])) for i in range(30)))
        assert store.statistics()["commits_total"] - commits < 30
        entries, more = store.keys_list("c", limit=1000)
        assert not more and [key for key, _ in entries] == \
            [b"0001"] + [b"1%03d" % i for i in range(30)]
        page, more = store.keys_list("c", start_after=b"1010", limit=5)
        assert more and [key for key, _ in page] == [b"1%03d" % i for i in range(11, 16)]
        # Atomic with object ops: a transaction that fails leaves the table as it was.
        with pytest.raises(ObjectNotFound):
            await store.apply(Transaction().keys_update("c", set=[(b"9999", b"no")])
                              .delete("c", "never-was"))
        assert store.keys_get("c", b"9999") is None
        with pytest.raises(CollectionNotFound):
            await store.apply(Transaction().keys_update("missing", set=[(b"k", b"v")]))
        with pytest.raises(InvalidArgument):
            Transaction().keys_update("c", set=[(b"", b"v")])
        with pytest.raises(InvalidArgument):
            Transaction().keys_update("c", set=[(b"k", b"v" * (64 * 1024 + 1))])
        await assert_fsck_clean(store)
        await store.close()
        store = await Store.open(device, meta)
        assert store.keys_get("c", b"1029") == b"v29"
        # A collection with entries but no objects is empty: removing it drops its table.
        await store.create_collection("log")
        await store.apply(Transaction().keys_update("log", set=[(b"a", b"1"), (b"b", b"2")]))
        await store.remove_collection("log")
        await store.create_collection("log")
        assert store.keys_list("log")[0] == []
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_fsck_names_key_table_entries_whose_collection_is_gone(tmp_path):
    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.apply(Transaction().keys_update("c", set=[(b"k", b"v")]))
        await store.apply(Transaction().put("c", "o", b"x"))
        store._db.put(b"K" + b"gone\x00" + b"k", b"v")     # what a lost removal would leave
        report = await fsck(store)
        assert not report.clean
        assert report.problems == ["key table of 'gone': 1 entries, and no such collection"]
        await store.close()
    run(body())


def test_remount_keeps_everything(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.put("c", "a", b"alpha" * 1000, attrs={"k": b"v"})
        await store.write("c", "a", 2, b"ZZ")
        used = store.statfs()["used_bytes"]
        await store.close()
        store = await Store.open(device, meta)
        assert (await store.read_bytes("c", "a"))[:7] == b"alZZa" + b"al"
        assert store.stat("c", "a").attrs == {"k": b"v"}
        assert store.statfs()["used_bytes"] == used
        await assert_fsck_clean(store)
        await store.close()
        with pytest.raises(StoreExists):
            await mkfs(device, meta)
        await device.aclose()
    run(body())


def test_unformatted_device_is_refused(open_twin, tmp_path):
    async def body():
        device = await open_twin(4 << 20)
        with pytest.raises(NotAStore, match="mkfs"):
            await Store.open(device, str(tmp_path / "meta"))
        await device.aclose()
    run(body())


def test_full_device_gives_no_space_and_stays_consistent(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path, size=8 << 20)
        free = store.statfs()["free_bytes"]
        await store.put("c", "big", bytes(free - 8192))
        with pytest.raises(NoSpace, match="no space"):
            await store.put("c", "toolarge", bytes(3 * 4096))
        with pytest.raises(NoSpace):
            await store.write("c", "big", 0, b"x" * 20000)      # copy-on-write needs room too
        assert store.statfs()["free_bytes"] == 8192
        await store.put("c", "fits", bytes(8192))
        await store.delete("c", "big")
        await store.put("c", "again", os.urandom(1 << 20))
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_checksum_mismatch_is_detected(tmp_path):
    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.put("c", "victim", os.urandom(3 * 4096))
        record = store._record("c", "victim")
        start = record.extents[0][0]
        device.flip_bit(store.superblock.data_start_bytes + (start + 1) * 4096 + 17, 2)
        with pytest.raises(ChecksumError, match="victim.*offset 4096"):
            await store.read("c", "victim")
        # The undamaged blocks still read.
        assert len(await store.read_bytes("c", "victim", 0, 4096)) == 4096
        report = await fsck(store, deep=True)
        assert not report.clean
        assert any("victim" in problem and "4096" in problem for problem in report.problems)
        await store.close()
    run(body())


def test_device_errors_are_reported_and_leave_the_store_consistent(tmp_path):
    """EIO on a data write fails that transaction only (its blocks go back to the allocator);
    EIO on a read names the device; a failed flush poisons the store until it is remounted, and
    the remounted store holds the acknowledged data, and the put that failed whole or not at
    all."""
    from cairn.native import DeviceIOError
    from cairn.osd.store import StoreFailed

    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.put("c", "kept", b"k" * 5000)
        free_before = store.statfs()["free_bytes"]
        device.fail_writes.append((0, device.size_bytes))
        with pytest.raises(DeviceIOError, match="injected"):
            await store.put("c", "lost", b"x" * 9000)
        device.fail_writes.clear()
        assert store.statfs()["free_bytes"] == free_before
        with pytest.raises(ObjectNotFound):
            store.stat("c", "lost")
        record = store._record("c", "kept")
        device.fail_reads.append((store.superblock.data_start_bytes
                                  + record.extents[0][0] * 4096, 1))
        with pytest.raises(DeviceIOError, match="offset"):
            await store.read("c", "kept")
        device.fail_reads.clear()
        await assert_fsck_clean(store)

        async def failing_flush():
            raise DeviceIOError("memory: flush failed (injected)")
        device.flush = failing_flush
        with pytest.raises(StoreFailed, match="remounted"):
            await store.put("c", "unacked", b"u")
        with pytest.raises(StoreFailed):
            await store.read("c", "kept")
        await store.abandon()
        del device.flush
        store = await Store.open(device, meta)
        assert await store.read_bytes("c", "kept") == b"k" * 5000
        # The failed put's journal record and data reached the device (only the flush
        # failed), so replay may bring it back whole: its outcome was unknown, not refused.
        assert store.list_objects("c")[0] in (["kept"], ["kept", "unacked"])
        if "unacked" in store.list_objects("c")[0]:
            assert await store.read_bytes("c", "unacked") == b"u"
        await assert_fsck_clean(store)
        await store.close()
    run(body())


def test_close_waits_for_transactions_in_flight(open_twin, tmp_path):
    """Transactions still committing when close() is called finish and are durable."""
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        tasks = [asyncio.create_task(store.put("c", f"o{i}", bytes([i]) * 5000))
                 for i in range(20)]
        await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        pending = [asyncio.create_task(store.put("c", "last", b"L" * 100))]
        for _ in range(3):
            await asyncio.sleep(0)
        await store.close()
        await asyncio.gather(*pending)
        with pytest.raises(StoreClosed):
            await store.put("c", "late", b"x")
        with pytest.raises(StoreClosed):
            store.list_objects("c")
        store = await Store.open(device, meta)
        assert await store.read_bytes("c", "last") == b"L" * 100
        assert len(store.list_objects("c")[0]) == 21
        await store.close()
        await device.aclose()
    run(body())


@pytest.mark.parametrize("journal", [False, True], ids=["synced", "journal"])
def test_failed_metadata_write_fails_its_group_and_the_next(tmp_path, journal):
    """A RocksDB write that fails poisons the store: that group's transactions and the group
    flushed behind it (the committer overlaps them) fail with StoreFailed. Without a journal
    the remounted store holds exactly the acknowledged data; with one, the failed group's
    record was durable before RocksDB was written, so replay brings it back whole."""
    from cairn.osd.store import StoreFailed

    class FailingWrites:
        def __init__(self, db):
            self.db = db

        def write(self, batch, options):
            raise RuntimeError("metadata write failed (injected)")

        def __getattr__(self, name):
            return getattr(self.db, name)

    async def body():
        device, meta, store = await memory_store(tmp_path, journal=journal, latency_s=0.002)
        assert (store.statistics()["journal"] is not None) == journal
        await store.put("c", "kept", b"k" * 5000)
        real_db, store._db = store._db, FailingWrites(store._db)
        first = asyncio.create_task(store.put("c", "a", b"a" * 5000))
        await asyncio.sleep(0.001)
        second = asyncio.create_task(store.put("c", "b", b"b" * 5000))
        for task in (first, second):
            with pytest.raises(StoreFailed, match="remounted"):
                await task
        with pytest.raises(StoreFailed):
            await store.put("c", "later", b"l")
        store._db = real_db
        await store.abandon()
        store = await Store.open(device, meta)
        assert store.list_objects("c")[0] == (["a", "kept"] if journal else ["kept"])
        assert await store.read_bytes("c", "kept") == b"k" * 5000
        if journal:
            assert await store.read_bytes("c", "a") == b"a" * 5000
        await assert_fsck_clean(store)
        await store.close()
    run(body())


def test_collections_count_their_objects_and_bytes_through_every_change(open_twin, tmp_path):
    """usage(collection) follows puts, overwrites, extending writes, deletes, renames across
    collections and concurrent transactions, matches a scan of the records, survives a remount,
    and a store whose collection records lack the counts (made earlier) counts them at open."""
    import msgpack

    from cairn.osd import records

    def scanned(store, collection):
        names, _ = store.list_objects(collection, limit=10_000)
        return len(names), sum(store.stat(collection, name).size for name in names)

    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.create_collection("d")
        await store.put("c", "a", b"x" * 5000)
        await store.put("c", "b", b"y" * 10)
        await store.put("c", "a", b"z" * 100)                   # overwrite: smaller
        await store.write("c", "b", 9000, b"w" * 24)            # extend: 9024
        await store.put("c", "gone", b"g" * 4096)
        await store.delete("c", "gone")
        await store.put("d", "t", b"t" * 7)
        await store.apply(Transaction().rename("c", "a", "d", "t"))   # replaces d/t
        await store.apply(Transaction().put("c", "n", b"1").put("c", "n", b"22"))
        await asyncio.gather(*(store.put("d", f"p{i}", b"p" * i) for i in range(20)))
        await store.set_attrs("c", "b", {"k": b"v"})
        for collection in ("c", "d"):
            assert store.usage(collection) == scanned(store, collection), collection
        assert store.usage("c") == (2, 9024 + 2) and store.usage("d") == (21, 100 + 190)
        assert store.usage("none") == (0, 0)
        await store.close()
        store = await Store.open(device, meta)
        assert store.usage("c") == (2, 9026) and store.usage("d") == (21, 290)
        # As a store made before collections kept counts: records without them.
        store._db.put(records.collection_key("d"), msgpack.packb({"created_ns": 1}))
        await store.close()
        store = await Store.open(device, meta)
        assert store.usage("d") == (21, 290)
        for name in [f"p{i}" for i in range(20)] + ["t"]:
            await store.delete("d", name)
        await store.remove_collection("d")
        assert store.usage("d") == (0, 0)
        await store.close()
        await device.aclose()
    run(body())


def test_a_device_out_of_room_gives_a_no_space_reply_and_the_store_goes_on(tmp_path):
    """A file device whose filesystem is full refuses a write with ENOSPC (DeviceNoSpace): the
    OSD's request handler answers `no_space` (the client's NoSpace), not an internal error, the
    transaction changes nothing, and the next write is taken once there is room."""
    from cairn.common.messenger import RequestFailed
    from cairn.native.errors import DeviceNoSpace
    from cairn.osd.service import ObjectService, Op

    async def body():
        device, meta, store = await memory_store(tmp_path)
        full = [True]
        write = device.write

        async def refusing(offset, buffer):
            if full[0]:
                raise DeviceNoSpace(f"{device.path}: write of {len(buffer)} bytes at offset "
                                    f"{offset} failed: no space left on the device (ENOSPC)")
            await write(offset, buffer)
        device.write = refusing
        service = ObjectService(StorePort(7, store), None, None, {}, None)

        async def put(header, payload):
            await store.put("c", header["name"], payload)
            return {"ok": True}, b""
        op = Op("put_for_test", lambda service, header, payload: put(header, payload), True,
                False)
        free_before = store.statfs()["free_bytes"]
        with pytest.raises(RequestFailed) as caught:
            await service._handle(op, {"name": "a"}, b"x" * 9000)
        assert caught.value.code == "no_space"
        assert caught.value.message.startswith("osd.7: memory: write of 12288 bytes")
        assert "no space left on the device" in caught.value.message
        assert store.statfs()["free_bytes"] == free_before
        with pytest.raises(ObjectNotFound):
            await store.read_bytes("c", "a")
        full[0] = False
        assert await service._handle(op, {"name": "a"}, b"y" * 9000) == \
            ({"ok": True}, b"")
        assert await store.read_bytes("c", "a") == b"y" * 9000
        await assert_fsck_clean(store)
        await store.close()
    asyncio.run(body())


def test_a_group_too_big_for_the_journal_is_synced_past_it_and_survives_a_crash(tmp_path):
    """An 8 MiB device has a 256 KiB journal, so one omap update of ~200 KiB is over a quarter
    of it: the group is committed past the journal (a checkpoint, then a synced RocksDB batch),
    and the groups on either side of it still go through the journal; after a simulated crash
    the remount holds all three."""
    from cairn.native import MemoryBlockDevice
    from cairn.osd.store import Transaction

    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.put("c", "before", b"b" * 5000)
        await store.put("c", "table", b"")
        big = {f"k{i:05d}".encode(): bytes([i % 251]) * 2000 for i in range(100)}
        await store.apply(Transaction().omap_update("c", "table", set=big))
        await store.put("c", "after", b"a" * 7000)
        journal = store.statistics()["journal"]
        assert journal["bytes"] == 256 << 10 and journal["past_journal_total"] == 1
        assert journal["used_bytes"] > 0                 # "after" is only in the journal
        await store.abandon()
        store = await Store.open(MemoryBlockDevice(image=device.image()), meta)
        assert store.statistics()["journal"]["replayed_records"] == 1
        assert await store.read_bytes("c", "before") == b"b" * 5000
        assert await store.read_bytes("c", "after") == b"a" * 7000
        assert store.omap_get("c", "table", list(big)) == big
        await assert_fsck_clean(store)
        await store.close()
    run(body())


async def uring_store(disk_dir, tmp_path):
    """(device, store) on a fresh io_uring device file (the one device with `submit_read`,
    which the callback reads a fast get makes need), collection "c" made."""
    from cairn.native import UringBlockDevice
    from tests.helpers import make_file
    device = UringBlockDevice.open(make_file(disk_dir, 64 << 20))
    meta = str(tmp_path / "meta")
    await mkfs(device, meta)
    store = await Store.open(device, meta)
    await store.create_collection("c")
    return device, store


async def fast_read(store, name, offset=0, length=None):
    """A get the way the OSD's fast path reads (begin_read, then finish_read once done):
    (data, crc, whether the read came from the read cache)."""
    pending = store.begin_read("c", name, offset, length)
    assert pending is not None
    await read_done(pending)
    data, crc = store.finish_read(pending, copy_below=64 * 1024)
    return bytes(data), crc, pending.cached is not None


async def read_done(pending):
    """Wait for a PendingRead's device read (through its `then`, as the OSD does)."""
    if not pending.done:
        finished = asyncio.get_running_loop().create_future()
        pending.then = lambda: finished.set_result(None)
        await finished
    assert pending.done


def test_a_small_object_read_again_comes_from_the_read_cache_until_it_changes(disk_dir,
                                                                                tmp_path):
    """Reads fill the cache (writes never do); a cached get reads nothing from the device and
    gives the same bytes and crc; ranges are cut from the cached object; every commit that
    touches the object (put, write, set_attrs, rename, delete) drops it."""
    from cairn.native.checksum import crc32c

    async def body():
        device, store = await uring_store(disk_dir, tmp_path)
        data = os.urandom(5000)
        await store.put("c", "obj", data)
        reads = device.statistics()["ops_total"]["read"]
        assert await fast_read(store, "obj") == (data, crc32c(data), False)
        assert store.statistics()["read_cache"]["objects"] == 1
        assert await fast_read(store, "obj") == (data, crc32c(data), True)
        assert await fast_read(store, "obj", 4000, 600) == (data[4000:4600], None, True)
        assert device.statistics()["ops_total"]["read"] == reads + 1
        assert store.statistics()["read_cache"]["hits_total"] == 2
        for change in (lambda: store.put("c", "obj", b"new bytes"),
                       lambda: store.write("c", "obj", 2, b"W"),
                       lambda: store.set_attrs("c", "obj", {"a": b"1"})):
            await change()
            expected = await store.read_bytes("c", "obj")
            assert await fast_read(store, "obj") == (expected, crc32c(expected), False)
            assert await fast_read(store, "obj") == (expected, crc32c(expected), True)
        await store.apply(Transaction().rename("c", "obj", "c", "moved"))
        assert store.begin_read("c", "obj") is None
        assert (await fast_read(store, "moved"))[2] is False
        await store.delete("c", "moved")
        assert store.begin_read("c", "moved") is None and store.read_cache.bytes == 0
        await store.close()
        device.close()
    run(body())


def test_a_read_that_ends_after_a_commit_never_serves_the_old_bytes_again(disk_dir, tmp_path):
    """A read started before a put and finished after it caches what it read under the old
    version; the next get sees the new record and reads the device."""
    async def body():
        device, store = await uring_store(disk_dir, tmp_path)
        await store.put("c", "obj", b"old" * 100)
        pending = store.begin_read("c", "obj")
        await store.put("c", "obj", b"new" * 100)
        await read_done(pending)
        data, _ = store.finish_read(pending, copy_below=64 * 1024)
        assert bytes(data) == b"old" * 100       # what the read saw when it started
        assert await fast_read(store, "obj") == (b"new" * 100, crc32c(b"new" * 100), False)
        assert (await fast_read(store, "obj"))[2] is True
        await store.close()
        device.close()

    from cairn.native.checksum import crc32c
    run(body())


def test_the_read_cache_keeps_its_bytes_bound_and_only_small_objects(disk_dir, tmp_path):
    async def body():
        device, store = await uring_store(disk_dir, tmp_path)
        store.read_cache.limit_bytes = 3 * 4096
        for index in range(5):
            await store.put("c", f"o{index}", bytes([index]) * 4096)
            await fast_read(store, f"o{index}")
        assert store.read_cache.bytes == 3 * 4096 and len(store.read_cache) == 3
        assert [(await fast_read(store, f"o{i}"))[2] for i in (4, 3, 2)] == [True] * 3
        assert (await fast_read(store, "o0"))[2] is False           # the oldest went first
        await store.put("c", "big", os.urandom(128 * 1024))
        await fast_read(store, "big")
        assert (await fast_read(store, "big"))[2] is False          # over 64 KiB: not kept
        store.read_cache.limit_bytes = 0
        await store.put("c", "o9", b"x" * 10)
        await fast_read(store, "o9")
        assert (await fast_read(store, "o9"))[2] is False           # --read-cache 0
        await store.close()
        device.close()
    run(body())


def test_the_record_cache_is_bounded_in_bytes_and_rereads_within_it_never_miss(disk_dir,
                                                                                tmp_path):
    """The decoded records are kept within `record_cache_limit_bytes`, each costed at
    RECORD_ENTRY_BYTES plus its crcs: objects read back in the order they were written all
    come from the cache while they fit (with a bound in entries, a run longer than the cache
    missed on every read); past the bound the least recently used go first, and a record
    read again from RocksDB is the committed one."""
    from cairn.osd.store import RECORD_ENTRY_BYTES

    async def body():
        device, store = await uring_store(disk_dir, tmp_path)
        small = RECORD_ENTRY_BYTES + 4                      # one block: one crc
        store.record_cache_limit_bytes = 40 * small
        for index in range(30):
            await store.put("c", f"o{index}", bytes([index]) * 4096)
        stats = store.statistics()["record_cache"]
        assert stats["records"] == 30 and stats["bytes"] == 30 * small
        misses = stats["misses_total"]
        for index in range(30):
            assert (await fast_read(store, f"o{index}"))[0] == bytes([index]) * 4096
        assert store.statistics()["record_cache"]["misses_total"] == misses
        await store.put("c", "big", os.urandom(1 << 20))   # 256 blocks: 1 KiB of crcs
        assert store.statistics()["record_cache"]["bytes"] == 30 * small + \
            RECORD_ENTRY_BYTES + 1024
        store.record_cache_limit_bytes = 10 * small
        await store.put("c", "o0", b"again" * 1000)         # o0 is now the most recent
        stats = store.statistics()["record_cache"]
        # o0 (two blocks now), big and the 7 most recent others fit in 10 one-block entries
        assert stats["records"] == 9 and \
            stats["bytes"] == 7 * small + (RECORD_ENTRY_BYTES + 8) + (RECORD_ENTRY_BYTES + 1024)
        assert (await fast_read(store, "o0"))[0] == b"again" * 1000
        assert store.statistics()["record_cache"]["misses_total"] == stats["misses_total"]
        assert (await fast_read(store, "o1"))[0] == bytes([1]) * 4096    # evicted: RocksDB
        assert store.statistics()["record_cache"]["misses_total"] == stats["misses_total"] + 1
        assert store.stat("c", "big").size == 1 << 20
        await store.close()
        device.close()
    run(body())
