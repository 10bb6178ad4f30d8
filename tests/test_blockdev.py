"""Block devices: every twin passes the same contract; io_uring matches the reference byte for
byte on random op sequences; the fault-injecting twin's faults behave as documented."""

import asyncio
import errno
import os
import random

import pytest
from hypothesis import given, settings, strategies as st

from cairn.native import (DeviceGone, DeviceIOError, DirectIONotSupported, FileBlockDevice,
                          MemoryBlockDevice, MisalignedIO, OutOfRange, UringBlockDevice,
                          open_device)
from cairn.native import latency
from cairn.native.errors import (IoUringUnavailable, describe_open_failure,
                                 describe_uring_failure)
from tests.helpers import make_file, run

pytestmark = pytest.mark.unit

BLOCK = 4096


def test_round_trip_flush_discard(open_twin):
    async def body():
        device = await open_twin(16 << 20)
        payload = os.urandom(3 * BLOCK)
        view = device.pool.get(len(payload))
        view[:] = payload
        await device.write(5 * BLOCK, view)
        await device.flush()
        assert bytes(await device.read(5 * BLOCK, 3 * BLOCK)) == payload
        await device.discard(6 * BLOCK, BLOCK)
        got = bytes(await device.read(5 * BLOCK, 3 * BLOCK))
        assert got == payload[:BLOCK] + bytes(BLOCK) + payload[2 * BLOCK:]
        assert device.ops_total["write"] == 1 and device.ops_total["discard"] == 1
        await device.aclose()
        assert device.closed
    run(body())


def test_errors_are_typed_and_name_the_device(open_twin):
    async def body():
        device = await open_twin(1 << 20)
        view = device.pool.get(BLOCK)
        with pytest.raises(MisalignedIO, match=device.path):
            await device.write(100, view)
        with pytest.raises(MisalignedIO):
            await device.read(0, 100)
        with pytest.raises(OutOfRange, match="past the end"):
            await device.write(1 << 20, view)
        with pytest.raises(OutOfRange):
            await device.read((1 << 20) - BLOCK, 2 * BLOCK)
        with pytest.raises(OutOfRange):
            await device.read(-BLOCK, BLOCK)
        await device.aclose()
        with pytest.raises(DeviceGone):
            await device.read(0, BLOCK)
    run(body())


def open_on_file(disk_dir, device_kind, size_bytes=1 << 20):
    """(path, device) of a fresh file opened by the uring or file twin."""
    path = make_file(disk_dir, size_bytes)
    cls = UringBlockDevice if device_kind == "uring" else FileBlockDevice
    return path, cls.open(path)


def test_misaligned_buffer_address_is_refused(disk_dir, device_kind):
    if device_kind == "memory":
        pytest.skip("the in-memory twin has no O_DIRECT address rule to enforce")

    async def body():
        path, device = open_on_file(disk_dir, device_kind)
        unaligned = memoryview(bytearray(2 * BLOCK))[1:BLOCK + 1]
        with pytest.raises(MisalignedIO, match="aligned"):
            await device.write(0, unaligned)
        await device.aclose()
    run(body())


def test_short_read_after_the_file_shrinks(disk_dir, device_kind):
    """The kernel returns fewer bytes than asked (the file shrank under us): a typed error, never
    a buffer half filled with stale bytes."""
    if device_kind == "memory":
        pytest.skip("the in-memory twin cannot shrink under an open device")

    async def body():
        path, device = open_on_file(disk_dir, device_kind)
        os.truncate(path, (1 << 20) - BLOCK)
        with pytest.raises(OutOfRange, match=r"short read \(4096 of 8192"):
            await device.read((1 << 20) - 2 * BLOCK, 2 * BLOCK)
        assert device.ops_total["read"] == 1
        await device.aclose()
    run(body())


def test_many_in_flight(open_twin):
    """More operations than the queue depth at once: all complete, in any order, correctly."""
    async def body():
        device = await open_twin(16 << 20)
        count = 300                      # more than the default depth of 128
        views = []
        for index in range(count):
            view = device.pool.get(BLOCK)
            view[:] = index.to_bytes(4, "little") * (BLOCK // 4)
            views.append(view)
        await asyncio.gather(*(device.write(index * BLOCK, view)
                               for index, view in enumerate(views)))
        reads = await asyncio.gather(*(device.read(index * BLOCK, BLOCK)
                                       for index in range(count)))
        for index, view in enumerate(reads):
            assert bytes(view[:4]) == index.to_bytes(4, "little")
        await device.aclose()
    run(body())


def test_uring_read_with_a_callback_reports_each_read_once_and_survives_a_bad_callback(
        disk_dir):
    """`submit_read(offset, buffer, then)` (the ring's `read_then`, what the OSD's fast gets
    use): more reads than the queue depth, each callback called once from the completion
    handling (never before `submit_read` returns), with None or the typed error a future
    would carry (a short read here); a callback that raises goes to the loop's exception
    handler and the other reads still finish."""
    async def body():
        path = make_file(disk_dir, 4 << 20)
        device = UringBlockDevice.open(path, queue_depth=8)
        for index in range(40):
            view = device.pool.get(BLOCK)
            view[:] = index.to_bytes(4, "little") * (BLOCK // 4)
            await device.write(index * BLOCK, view)
        loop = asyncio.get_running_loop()
        handled = []
        loop.set_exception_handler(lambda _, context: handled.append(context["exception"]))
        outcomes, views, finished = {}, {}, loop.create_future()

        def then(index, error):
            assert index not in outcomes
            outcomes[index] = error
            if index == 7:
                raise RuntimeError("a callback's own bug")
            if len(outcomes) == 41 and not finished.done():
                finished.set_result(None)

        for index in range(40):
            views[index] = device.pool.get(BLOCK)
            device.submit_read(index * BLOCK, views[index],
                               lambda error, index=index: then(index, error))
        os.truncate(path, (4 << 20) - BLOCK)       # the last block: a short read
        views[40] = device.pool.get(2 * BLOCK)
        device.submit_read((4 << 20) - 2 * BLOCK, views[40],
                           lambda error: then(40, error))
        assert outcomes == {}                      # nothing is called before it completes
        await asyncio.wait_for(finished, 10)
        assert [outcomes[index] for index in range(40)] == [None] * 40
        for index in range(40):
            assert bytes(views[index][:4]) == index.to_bytes(4, "little")
        assert isinstance(outcomes[40], OutOfRange) and "short read" in str(outcomes[40])
        assert len(handled) == 1 and "own bug" in str(handled[0])
        with pytest.raises(MisalignedIO):          # a bad request raises at once, no callback
            device.submit_read(1, device.pool.get(BLOCK), lambda error: then(99, error))
        assert 99 not in outcomes
        await device.aclose()
    run(body())


def test_uring_registers_the_pools_slabs_and_uses_them_as_fixed_buffers(disk_dir):
    """The pool's slabs (buffers from 64 KiB up) are registered with the ring, before and after
    the device opens, and I/O on them goes through READ_FIXED / WRITE_FIXED with the same
    bytes; small buffers and memory outside the pool take the plain path."""
    import mmap

    async def body():
        from cairn.native.bufpool import BufferPool
        pool = BufferPool()
        early = pool.get(64 * 1024)                     # a slab made before the device
        device = UringBlockDevice.open(make_file(disk_dir, 8 << 20), pool=pool)
        stats = device.statistics()
        if stats["fixed_buffers"] == 0:
            pytest.skip("this kernel or memlock limit takes no registered buffers")
        late = pool.get(1 << 20)                        # a slab made after it
        assert device.statistics()["fixed_buffers"] == 2
        early[:] = os.urandom(len(early))
        late[:] = os.urandom(len(late))
        await device.write(0, early)
        await device.write(1 << 20, late)
        assert device.statistics()["fixed_buffer_ops_total"] == 2
        assert bytes(await device.read(0, len(early))) == bytes(early)
        assert bytes(await device.read(1 << 20, len(late))) == bytes(late)
        assert device.statistics()["fixed_buffer_ops_total"] == 4  # the reads' slab buffers
        small = pool.get(4096)
        small[:] = b"s" * 4096
        outside = memoryview(mmap.mmap(-1, 64 * 1024))
        outside[:] = b"o" * len(outside)
        await device.write(2 << 20, small)
        await device.write(3 << 20, outside)
        assert device.statistics()["fixed_buffer_ops_total"] == 4
        assert bytes(await device.read(2 << 20, 4096)) == b"s" * 4096
        assert bytes(await device.read(3 << 20, len(outside))) == bytes(outside)
        await device.aclose()
        pool.get(4 << 20)                               # a closed device registers nothing
    run(body())


def test_refused_direct_io_names_the_fix():
    error = describe_open_failure("/dev/shm/x.img", OSError(errno.EINVAL, "Invalid argument"))
    assert isinstance(error, DirectIONotSupported)
    assert "tmpfs" in str(error) and "/dev/shm/x.img" in str(error)


def test_tmpfs_direct_io_either_works_or_is_refused_clearly():
    """Linux 6.6 and newer accept O_DIRECT on tmpfs; older kernels refuse it with EINVAL."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm (tmpfs) on this machine to try")
    path = "/dev/shm/cairn-odirect-test.img"
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)
    try:
        try:
            device = FileBlockDevice.open(path)
        except DirectIONotSupported as exc:
            assert "tmpfs" in str(exc)
        else:
            assert device.size_bytes == 1 << 20
            device.close()
    finally:
        os.unlink(path)


def test_missing_device():
    with pytest.raises(DeviceGone, match="no such"):
        FileBlockDevice.open("/nonexistent/cairn.img")


def test_uring_setup_failure_names_the_fix():
    error = describe_uring_failure(-1)            # EPERM
    assert isinstance(error, IoUringUnavailable)
    assert "io_uring_disabled" in str(error)


def test_open_device_respects_no_extensions(disk_dir, monkeypatch):
    async def body():
        path = make_file(disk_dir, 1 << 20)
        monkeypatch.setenv("CAIRN_NO_EXTENSIONS", "1")
        device = open_device(path)
        assert isinstance(device, FileBlockDevice)
        device.close()
        monkeypatch.delenv("CAIRN_NO_EXTENSIONS")
        device = open_device(path)
        assert isinstance(device, UringBlockDevice)
        await device.aclose()
    run(body())


ops_strategy = st.lists(
    st.tuples(st.sampled_from(["write", "discard", "flush"]), st.integers(0, 63),
              st.integers(1, 8), st.integers(0, 255)),
    min_size=1, max_size=40)


@given(ops=ops_strategy)
@settings(max_examples=25, deadline=None)
def test_uring_matches_reference(tmp_path_factory, ops):
    """Differential: the same random ops on the io_uring device and on the pread/pwrite
    reference leave byte-identical devices, and every read agrees."""
    directory = tmp_path_factory.mktemp("diff")

    async def body():
        size = 64 * BLOCK
        devices = [UringBlockDevice.open(make_file(directory, size, "a.img")),
                   FileBlockDevice.open(make_file(directory, size, "b.img"))]
        for op, block, count, fill in ops:
            count = min(count, 64 - block)
            for device in devices:
                if op == "write":
                    view = device.pool.get(count * BLOCK)
                    view[:] = bytes([fill]) * (count * BLOCK)
                    await device.write(block * BLOCK, view)
                elif op == "discard":
                    await device.discard(block * BLOCK, count * BLOCK)
                else:
                    await device.flush()
            reads = [bytes(await device.read(block * BLOCK, count * BLOCK))
                     for device in devices]
            assert reads[0] == reads[1]
        images = [bytes(await device.read(0, size)) for device in devices]
        assert images[0] == images[1]
        for device in devices:
            await device.aclose()
    run(body())


# -- the fault-injecting twin ---------------------------------------------------------------

def test_memory_injected_eio():
    async def body():
        device = MemoryBlockDevice(1 << 20)
        device.fail_reads.append((8 * BLOCK, BLOCK))
        device.fail_writes.append((2 * BLOCK, 1))
        view = device.pool.get(BLOCK)
        with pytest.raises(DeviceIOError, match="injected"):
            await device.write(2 * BLOCK, view)
        await device.write(3 * BLOCK, view)
        with pytest.raises(DeviceIOError):
            await device.read(7 * BLOCK, 2 * BLOCK)
        await device.read(9 * BLOCK, BLOCK)
    run(body())


def test_memory_crash_keeps_flushed_and_decides_unflushed():
    async def body():
        device = MemoryBlockDevice(64 * BLOCK, rng=random.Random(7))
        view = device.pool.get(4 * BLOCK)
        view[:] = b"\x11" * (4 * BLOCK)
        await device.write(0, view)
        await device.flush()
        view[:] = b"\x22" * (4 * BLOCK)
        await device.write(0, view)            # unflushed: lost, kept or torn per block
        await device.write(8 * BLOCK, view)
        device.crash()
        with pytest.raises(DeviceGone):
            await device.read(0, BLOCK)
        image = device.image()
        for block in range(4):
            assert image[block * BLOCK:(block + 1) * BLOCK] in (b"\x11" * BLOCK,
                                                                b"\x22" * BLOCK)
            # Torn at 4 KiB granularity: a block is never half old, half new.
        reopened = MemoryBlockDevice(image=image)
        assert bytes(await reopened.read(0, BLOCK))[:1] in (b"\x11", b"\x22")
    run(body())


def test_memory_crash_tears_some_writes():
    """Over many seeds, unflushed writes are sometimes lost, sometimes kept, sometimes torn."""
    async def one(seed):
        device = MemoryBlockDevice(16 * BLOCK, rng=random.Random(seed))
        view = device.pool.get(8 * BLOCK)
        view[:] = b"\xff" * (8 * BLOCK)
        await device.write(0, view)
        device.crash()
        kept = [device.image()[i * BLOCK] == 0xff for i in range(8)]
        return "lost" if not any(kept) else "kept" if all(kept) else "torn"

    fates = {run(one(seed)) for seed in range(40)}
    assert fates == {"lost", "kept", "torn"}


def test_memory_crash_after_ops():
    async def body():
        device = MemoryBlockDevice(16 * BLOCK, crash_after_ops=3, rng=random.Random(1))
        view = device.pool.get(BLOCK)
        await device.write(0, view)
        await device.flush()
        with pytest.raises(DeviceGone, match="crashed"):
            await device.write(BLOCK, view)
        assert device.crashed
    run(body())


def test_memory_bit_flip():
    async def body():
        device = MemoryBlockDevice(16 * BLOCK)
        device.flip_bit(BLOCK + 5, 3)
        data = bytes(await device.read(BLOCK, BLOCK))
        assert data[5] == 8 and data.count(0) == BLOCK - 1
    run(body())


def test_every_twin_records_latency_by_kind_and_size_class(open_twin):
    """Each completed op lands in its (kind, size class) cell once, with its bytes, and the
    summed latency agrees with the buckets it was counted in (the ring buckets in C, the twins
    in native/latency.py: the same layout either way)."""
    async def body():
        device = await open_twin(16 << 20)
        before = device.latency_snapshot()
        small, large = device.pool.get(BLOCK), device.pool.get(2 << 20)
        for index in range(5):
            await device.write(index * BLOCK, small)
        await device.write(4 << 20, large)
        await device.flush()
        await device.read_into(0, small)
        after = device.latency_snapshot()
        counts = (after.counts - before.counts).sum(axis=2)
        kinds = latency.KINDS
        assert counts[kinds.index("write"), 0] == 5 and counts[kinds.index("write"), 3] == 1
        assert counts[kinds.index("flush"), 0] == 1 and counts[kinds.index("read"), 0] == 1
        assert counts.sum() == 8
        moved = after.bytes - before.bytes
        assert moved[kinds.index("write"), 0] == 5 * BLOCK
        assert moved[kinds.index("write"), 3] == 2 << 20
        for k, c in zip(*counts.nonzero()):
            cells = (after.counts - before.counts)[k, c]
            buckets = cells.nonzero()[0]
            low = latency.bucket_bounds_s(buckets.min())[0]
            high = latency.bucket_bounds_s(buckets.max())[1]
            mean_s = int(after.sum_ns[k, c] - before.sum_ns[k, c]) / int(counts[k, c]) / 1e9
            assert low <= mean_s <= high, (kinds[k], c, low, mean_s, high)
        summary = latency.summarise(before, after)
        assert summary["write"]["4K"]["count"] == 5 and summary["write"]["big"]["bytes"] == 2 << 20
        assert set(summary) == {"write", "flush", "read"}
        await device.aclose()
    run(body())


def test_latency_buckets_and_quantiles():
    assert [latency.bucket(ns) for ns in (0, 999, 1000, 1999, 2000, 10 ** 6, 10 ** 12)] == \
        [0, 0, 1, 1, 2, 10, latency.BUCKETS - 1]
    assert [latency.size_class(n) for n in (0, 4096, 4097, 65536, 1 << 20, (1 << 20) + 1)] == \
        [0, 0, 1, 1, 2, 3]
    recorder = latency.LatencyRecorder()
    before = recorder.snapshot()
    for _ in range(98):
        recorder.record("write", 4096, 1_000_000)           # 1 ms: bucket [0.512, 1.024) ms
    for _ in range(2):
        recorder.record("write", 4096, 500_000_000)         # 500 ms
    summary = latency.summarise(before, recorder.snapshot())["write"]["4K"]
    assert summary["count"] == 100 and 0.5 <= summary["p50_ms"] <= 1.03
    assert 262 <= summary["p99_ms"] <= 525 and summary["mean_ms"] == 10.98
