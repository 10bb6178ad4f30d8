"""Proof of crash safety and corruption detection.

Crash property (hypothesis): random batches of concurrent transactions run on the fault-injecting
device, which crashes after a random number of operations, dropping any subset of unflushed writes
and tearing others at 4 KiB. The store is abandoned mid-flight (as a killed process would be), the
device's surviving image remounted, and then:
- every acknowledged transaction is visible with exact bytes;
- every transaction whose outcome is unknown is visible whole or not at all;
- nothing else exists, and fsck --deep is clean.

Corruption: bits flipped in a real device file make reads fail with ChecksumError naming the
object and offset, and `cairn-osd fsck --deep` (a real process) names the object.
"""

import asyncio
import errno
import itertools
import json
import os
import random
import subprocess
import sys
import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cairn.native import DeviceError, DeviceNoSpace, MemoryBlockDevice, UringBlockDevice
from cairn.osd.errors import ChecksumError, StoreError
from cairn.osd.fsck import fsck
from cairn.osd.store import Store, Transaction, mkfs
from tests.helpers import make_file, run

NAMES = [f"n{i}" for i in range(8)]


KEY = "key:"                     # the model's name for an entry of collection c's key table


def random_txn(rng, state, names, writes=True, key_suffix=""):
    """A transaction over `names` (disjoint from others in its batch) and its expected effect:
    {name: bytes or None}, where KEY + name stands for the key table entry `name`. `writes`:
    partial writes among its operations; `key_suffix`: added to the names of its key table
    entries."""
    effect = {}
    txn = Transaction()
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(names)
        current = effect[name] if name in effect else state.get(name)
        choice = rng.random()
        if rng.random() < 0.25:
            # The key table (a PG log's home): set or remove an entry, no object involved.
            key = name + key_suffix
            if rng.random() < 0.3:
                txn.keys_update("c", remove=[key.encode()])
                effect[KEY + key] = None
            else:
                value = rng.randbytes(rng.randint(0, 300))
                txn.keys_update("c", set=[(key.encode(), value)])
                effect[KEY + key] = value
        elif current is not None and choice < 0.2:
            txn.delete("c", name)
            effect[name] = None
        elif current is not None and choice < 0.55 and writes:
            offset = rng.randrange(0, len(current) + 5000)
            chunk = rng.randbytes(rng.randint(1, 9000))
            new = bytearray(current)
            if offset > len(new):
                new.extend(bytes(offset - len(new)))
            new[offset:offset + len(chunk)] = chunk
            txn.write("c", name, offset, chunk)
            effect[name] = bytes(new)
        else:
            data = rng.randbytes(rng.choice([0, 1, 100, 4096, 5000, 13000]))
            txn.put("c", name, data)
            effect[name] = data
    return txn, effect


async def crash_scenario(seed, meta, journal=True, rounds=12, ops_max=150, width=2,
                         latency_s=0.0, overlap=False):
    """One run of the property; returns the store's statistics just before the crash.
    `width`: transactions at once per round, on disjoint names (`overlap`: on names drawn
    for each, so several change one object at once; see overlapping_scenario)."""
    if overlap:
        return await overlapping_scenario(seed, meta, rounds, ops_max, width, latency_s)
    rng = random.Random(seed)
    device = MemoryBlockDevice(8 << 20, rng=random.Random(seed + 1), latency_s=latency_s)
    await mkfs(device, meta, journal=journal)
    store = await Store.open(device, meta)
    await store.create_collection("c")
    device.crash_after_ops = device.issued_ops + rng.randint(1, ops_max)
    acked = {}                       # the model: state after every acknowledged transaction
    unknown = []                     # (effect, before) of transactions with unknown outcome
    for _ in range(rounds):
        if device.crashed:
            break
        names = rng.sample(NAMES, rng.randint(1, 2 * width))
        groups = [names[i::width] for i in range(width)]
        txns = [random_txn(rng, acked, group) for group in groups if group]
        before = dict(acked)
        results = await asyncio.gather(*(store.apply(txn) for txn, _ in txns),
                                       return_exceptions=True)
        for (_, effect), result in zip(txns, results):
            if isinstance(result, BaseException):
                assert isinstance(result, (DeviceError, StoreError)), result
                unknown.append((effect, {name: before.get(name) for name in effect}))
            else:
                apply_effect(acked, effect)
    statistics = store.statistics()

    def check(seen):
        expected = dict(acked)
        for effect, before in unknown:
            after_matches = all(seen.get(name) == value for name, value in effect.items())
            before_matches = all(seen.get(name) == value for name, value in before.items())
            assert after_matches or before_matches, (
                f"seed {seed}: a transaction is half-visible: {sorted(effect)}")
            apply_effect(expected, effect if after_matches else before)
        assert seen == expected, f"seed {seed}: contents differ from the model"
    await crash_and_check(store, device, meta, seed, check)
    return statistics


async def crash_and_check(store, device, meta, seed, check):
    """Crash the device under `store`, remount its surviving image, hand `check` what it holds
    ({name: bytes}, KEY + name for key table entries), and require fsck --deep clean."""
    device.crash()
    await store.abandon()
    store = await Store.open(MemoryBlockDevice(image=device.image()), meta)
    try:
        seen = {}
        for name in store.list_objects("c", limit=100)[0]:
            seen[name] = await store.read_bytes("c", name)
        seen.update((KEY + key.decode(), value) for key, value in store.keys_list("c",
                                                                                   limit=100)[0])
        check(seen)
        report = await fsck(store, deep=True)
        assert report.clean, (seed, report.problems)
    finally:
        await store.close()


async def overlapping_scenario(seed, meta, rounds, ops_max, width, latency_s):
    """The property for transactions that change the same objects at once (as a replica's
    writes, pushes and log trims may): the store plans them in the order they start, each on
    the state the ones before it leave (no lock), and commits each object's changes in that
    order. Partial writes are left out (they may plan again after reading, so their order is
    not their start order). After the crash, what the device holds must be the acknowledged
    transactions plus some subset of the unacknowledged ones, each whole, applied in start
    order, on every object and key at once."""
    rng = random.Random(seed)
    device = MemoryBlockDevice(8 << 20, rng=random.Random(seed + 1), latency_s=latency_s)
    await mkfs(device, meta)
    store = await Store.open(device, meta)
    await store.create_collection("c")
    device.crash_after_ops = device.issued_ops + rng.randint(1, ops_max)
    acked = {}
    last_round = []                       # [(effect, acknowledged)] of the crash's round
    for _ in range(rounds):
        if device.crashed:
            break
        state, txns = dict(acked), []
        for index in range(width):
            # Key table entries are not objects: the store keeps no order between two
            # transactions that set one entry (the OSD never does), so each has its own.
            txn, effect = random_txn(rng, state, rng.sample(NAMES[:4], rng.randint(1, 2)),
                                     writes=False, key_suffix=f".{index}")
            txns.append((txn, effect))
            apply_effect(state, effect)
        results = await asyncio.gather(*(store.apply(txn) for txn, _ in txns),
                                       return_exceptions=True)
        last_round = [(effect, not isinstance(result, BaseException))
                      for (_, effect), result in zip(txns, results)]
        for (_, effect), result in zip(txns, results):
            if isinstance(result, BaseException):
                assert isinstance(result, (DeviceError, StoreError)), result
                assert device.crashed, f"seed {seed}: {result!r} without a crash"
        if all(ok for _, ok in last_round):
            for effect, _ in last_round:
                apply_effect(acked, effect)
            last_round = []
    statistics = store.statistics()

    def check(seen):
        unknown = [index for index, (_, ok) in enumerate(last_round) if not ok]
        outcomes = []
        for chosen in itertools.product((False, True), repeat=len(unknown)):
            kept = {index for index, keep in zip(unknown, chosen) if keep}
            model = dict(acked)
            for index, (effect, ok) in enumerate(last_round):
                if ok or index in kept:
                    apply_effect(model, effect)
            outcomes.append(model)
        assert seen in outcomes, (f"seed {seed}: no subset of whole transactions, in start "
                                  f"order, gives {digest(seen)}; expected one of "
                                  f"{[digest(outcome) for outcome in outcomes]}")
    await crash_and_check(store, device, meta, seed, check)
    return statistics


def digest(state):
    """A state, short enough for a failure message: {name: (length, crc32)}."""
    return {name: (len(value), zlib.crc32(value)) for name, value in sorted(state.items())}


def apply_effect(state, effect):
    for name, value in effect.items():
        if value is None:
            state.pop(name, None)
        else:
            state[name] = value


def crash_property(examples):
    """Run a test over `examples` random seeds (hypothesis shrinks a failing one)."""
    def decorate(test):
        return given(seed=st.integers(0, 2**31))(settings(
            max_examples=examples, deadline=None, suppress_health_check=[
                HealthCheck.too_slow, HealthCheck.function_scoped_fixture])(test))
    return decorate


@pytest.mark.faults
@crash_property(60)
def test_crash_at_random_points(tmp_path_factory, seed):
    meta = str(tmp_path_factory.mktemp("crash") / "meta")
    run(crash_scenario(seed, meta))


@pytest.mark.faults
@crash_property(40)
def test_crash_with_four_transactions_at_once(tmp_path_factory, seed):
    """Four transactions at once on a device with latency: groups form while the one before
    is being flushed, and objects are rewritten round after round (a commit frees the blocks
    of the version before, which later puts reuse)."""
    meta = str(tmp_path_factory.mktemp("crash") / "meta")
    run(crash_scenario(seed, meta, rounds=30, ops_max=600, width=4, latency_s=0.0005))


@pytest.mark.faults
@crash_property(40)
def test_crash_with_transactions_on_the_same_objects_at_once(tmp_path_factory, seed):
    """Four transactions at once on four names (puts, deletes, key table entries): most rounds
    have two or more changing one object before the first commits."""
    meta = str(tmp_path_factory.mktemp("crash") / "meta")
    run(crash_scenario(seed, meta, rounds=30, ops_max=600, width=4, latency_s=0.0005,
                       overlap=True))


@pytest.mark.faults
def test_the_same_objects_property_plans_on_records_in_flight(tmp_path):
    """Guard against a vacuous property: its runs plan transactions on records that another
    transaction has not committed yet."""
    built = [run(crash_scenario(seed, str(tmp_path / f"meta{seed}"), rounds=30, ops_max=600,
                                width=4, latency_s=0.0005, overlap=True))
             ["built_on_in_flight_total"] for seed in range(4)]
    assert sum(built) > 0, built


@pytest.mark.faults
@crash_property(20)
def test_crash_at_random_points_without_a_journal(tmp_path_factory, seed):
    """The same property for a store that syncs RocksDB per commit group (format 1)."""
    meta = str(tmp_path_factory.mktemp("crash") / "meta")
    run(crash_scenario(seed, meta, journal=False))


@pytest.mark.faults
@crash_property(12)
def test_crash_after_the_journal_wrapped_and_checkpointed(tmp_path_factory, seed):
    """Long runs on the 256 KiB journal of an 8 MiB device: the ring wraps several times and
    checkpoints move its tail before the crash, so replay starts mid-ring, after a wrap."""
    meta = str(tmp_path_factory.mktemp("crash") / "meta")
    statistics = run(crash_scenario(seed, meta, rounds=160, ops_max=2000))
    assert statistics["journal"]["bytes"] == 256 << 10


@pytest.mark.faults
def test_crash_scenarios_do_crash_mid_transaction(tmp_path):
    """Guard against a vacuous property: over a few seeds, some transactions must end with an
    unknown outcome and some must be acknowledged."""
    outcomes = set()

    async def probe(seed):
        rng = random.Random(seed)
        device = MemoryBlockDevice(8 << 20, rng=random.Random(seed))
        meta = str(tmp_path / f"meta{seed}")
        await mkfs(device, meta)
        store = await Store.open(device, meta)
        await store.create_collection("c")
        device.crash_after_ops = device.issued_ops + rng.randint(1, 150)
        for _ in range(12):
            txn, _ = random_txn(rng, {}, NAMES[:2])
            try:
                await store.apply(txn)
                outcomes.add("acked")
            except (DeviceError, StoreError):
                outcomes.add("unknown")
                break
        await store.abandon()

    for seed in range(10):
        run(probe(seed))
    assert outcomes == {"acked", "unknown"}


@pytest.mark.faults
def test_bit_flips_on_a_real_device_are_caught(disk_dir):
    """Flip bits in a real device file under a closed store: reads fail with ChecksumError naming
    object and offset, and `cairn-osd fsck --deep` (a real process) names the object."""
    path = make_file(disk_dir, 64 << 20)

    async def write_objects():
        device = UringBlockDevice.open(path)
        await mkfs(device)
        store = await Store.open(device)
        await store.create_collection("pg.1")
        await store.put("pg.1", "good", os.urandom(20000))
        await store.put("pg.1", "rotten", os.urandom(20000))
        record = store._record("pg.1", "rotten")
        data_start = store.superblock.data_start_bytes
        await store.close()
        await device.aclose()
        return data_start + (record.extents[0][0] + 2) * 4096 + 99   # inside block 2

    flip_at = run(write_objects())
    with open(path, "r+b") as handle:
        handle.seek(flip_at)
        byte = handle.read(1)
        handle.seek(flip_at)
        handle.write(bytes([byte[0] ^ 0x10]))

    async def read_back():
        device = UringBlockDevice.open(path)
        store = await Store.open(device)
        try:
            assert len(await store.read_bytes("pg.1", "good")) == 20000
            with pytest.raises(ChecksumError, match="'rotten'.*offset 8192"):
                await store.read("pg.1", "rotten")
            assert len(await store.read_bytes("pg.1", "rotten", 0, 8192)) == 8192
        finally:
            await store.close()
            await device.aclose()

    run(read_back())
    done = subprocess.run([sys.executable, "-m", "cairn.osd.cli", "fsck", "--device", path,
                           "--deep", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["clean"]
    assert any("rotten" in problem and "8192" in problem for problem in report["problems"])
    assert not any("good" in problem for problem in report["problems"])
    shallow = subprocess.run([sys.executable, "-m", "cairn.osd.cli", "fsck", "--device", path],
                             capture_output=True, text=True, timeout=120)
    assert shallow.returncode == 0, shallow.stdout + shallow.stderr


@pytest.mark.faults
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem to fill needs root "
                                              "(CI runs as root)")
def test_a_full_filesystem_under_a_device_file_never_fails_a_commit(disk_dir):
    """A device that is a sparse file on a filesystem that fills up: writes of new data are
    refused with DeviceNoSpace (the OSD's `no_space`) and the store goes on. Commits that write
    nothing but their journal record (zero-length puts, deletes) still go through, because mkfs
    made the filesystem hold the ring. Before it did, the first such commit at a ring position
    never written failed with ENOSPC, and the store with it (seen on a 64 GiB disk under six
    12 GiB device files)."""
    image, mountpoint = os.path.join(disk_dir, "fs.img"), os.path.join(disk_dir, "mnt")
    make_file(disk_dir, 48 << 20, "fs.img")
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
    os.makedirs(mountpoint)
    subprocess.run(["mount", "-o", "loop", image, mountpoint], check=True, capture_output=True)
    try:
        path = make_file(mountpoint, 256 << 20)     # far bigger than its filesystem
        meta = os.path.join(disk_dir, "meta")       # RocksDB on a filesystem with room

        async def body():
            device = UringBlockDevice.open(path)
            try:
                superblock = await mkfs(device, meta)
                assert os.stat(path).st_blocks * 512 >= superblock.data_start_bytes
                store = await Store.open(device, meta)
                await store.create_collection("c")
                await store.put("c", "before", b"b" * 50_000)
                with open(os.path.join(mountpoint, "filler"), "wb") as filler:
                    chunk = bytes(1 << 20)
                    try:
                        while True:
                            filler.write(chunk)
                            filler.flush()
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC
                with pytest.raises(DeviceNoSpace, match="no space left on the device"):
                    await store.put("c", "big", os.urandom(4 << 20))
                # 1,500 records of at least 4 KiB each: most of the 8 MiB ring, past positions
                # no commit had written before.
                for i in range(1500):
                    await store.put("c", f"empty{i}", b"")
                    if i % 3 == 2:
                        await store.delete("c", f"empty{i - 1}")
                assert store.statistics()["journal"]["checkpoints_total"] >= 1
                assert await store.read_bytes("c", "before") == b"b" * 50_000
                await store.close()
                store = await Store.open(device, meta)
                assert await store.read_bytes("c", "empty1499") == b""
                assert store.usage("c") == (1 + 1000, 50_000)
                await store.close()
            finally:
                await device.aclose()

        run(body())
    finally:
        subprocess.run(["umount", mountpoint], check=False, capture_output=True)
