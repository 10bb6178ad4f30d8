"""The file namespace under real faults: a client SIGKILLed again and again in a loop of creates,
renames (within and across directories), hard links and unlinks, and an OSD SIGKILLed under a
mount during a large sequential write. Afterwards fsck is clean (after repairing what the kills
left: orphans and link counts one too high only), every file closed before a kill reads back
byte-identical under exactly the names it had, and its link count is right."""

import errno
import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cairn.client.fs import Filesystem
from cairn.client.fs_check import check
from cairn.client.sync import connect
from tests.test_faults_mons import leader_of, sigkill
from tests.test_mount import Mounts, cairn

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")

# The client that gets killed: creates files (content derived from their number), renames them
# within and across directories, and appends to a journal what completed (after it returned).
WORKER = textwrap.dedent("""
    import asyncio, os, random, sys
    from cairn.client.cluster import Cluster
    from cairn.client.fs import Filesystem

    def content(number):
        return (b"%d:" % number) * (1 + number % 5000)

    async def main(where, journal_path, start):
        async with await Cluster.connect(where) as cluster:
            fs = await Filesystem.open(cluster, "data", metadata_pool="meta")
            for name in ("a", "b", "c"):
                try:
                    await fs.mkdir_path("/" + name)
                except FileExistsError:
                    pass
            journal = open(journal_path, "a", buffering=1)
            number = start
            rng = random.Random(start)
            while True:
                path = f"/{rng.choice('abc')}/f{number}"
                async with await fs.open_path(path, "xb") as f:
                    await f.write(content(number))
                journal.write(f"closed {number} {path}\\n")
                target = f"/{rng.choice('abc')}/g{number}"
                journal.write(f"renaming {number} {target}\\n")
                await fs.rename_path(path, target)
                journal.write(f"renamed {number} {target}\\n")
                if rng.random() < 0.5:
                    link = f"/{rng.choice('abc')}/h{number}"
                    journal.write(f"linking {number} {link}\\n")
                    ino, _ = await fs.resolve(target)
                    parent, name = await fs._parent_of(link)
                    await fs.link(ino, parent, name)
                    journal.write(f"linked {number} {link}\\n")
                    if rng.random() < 0.5:
                        gone = rng.choice([target, link])
                        journal.write(f"unlinking {number} {gone}\\n")
                        await fs.unlink_path(gone)
                        journal.write(f"unlinked {number} {gone}\\n")
                number += 1

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


def content(number):
    return (b"%d:" % number) * (1 + number % 5000)


def test_a_client_killed_in_creates_renames_and_links_loses_nothing_closed(local_cluster,
                                                                         tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--erasure", "2+1", "--pg-num", "8")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    journal = tmp_path / "journal"
    rng = random.Random(11)
    kills = 0
    for round_number in range(8):
        worker = subprocess.Popen([sys.executable, str(script), cluster.dir, str(journal),
                                   str(round_number * 100_000)], stderr=subprocess.PIPE)
        try:
            time.sleep(rng.uniform(1.5, 3.0))
            assert worker.poll() is None, worker.stderr.read().decode()[-2000:]
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker.stderr.close()
        kills += 1

    # number -> [names it must have, names it may have, a rename (source, target) in flight]
    where = {}
    for line in journal.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue                        # a line cut by the kill
        kind, number, path = parts[0], int(parts[1]), parts[2]
        if kind == "closed":
            where[number] = [{path}, {path}, None]
            continue
        if number not in where:
            continue
        must, may, _ = state = where[number]
        if kind == "renaming":
            state[2] = (next(iter(must)), path)
            state[0], state[1] = set(), may | {path}
        elif kind == "renamed":
            where[number] = [{path}, {path}, None]
        elif kind == "linking":
            may.add(path)
        elif kind == "linked":
            must.add(path)
        elif kind == "unlinking":
            must.discard(path)
        elif kind == "unlinked":
            may.discard(path)
    assert len(where) > 20, f"only {len(where)} files were closed in {kills} runs"
    linked = sum(1 for line in journal.read_text().splitlines() if line.startswith("linked "))
    assert linked > 5, f"only {linked} links were made"

    with connect(cluster.dir) as client:
        fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
        found = {}                          # number -> [paths]

        async def walk():
            for directory in ("a", "b", "c"):
                for name in await fs.listdir("/" + directory):
                    found.setdefault(int(name[1:]), []).append(f"/{directory}/{name}")
        client.call(walk())
        for number, (must, may, renaming) in where.items():
            names = set(found.get(number, []))
            assert must <= names <= may, (number, names, must, may)
            if renaming is not None:                            # never visible twice
                assert len(names & set(renaming)) == 1, (number, names, renaming)
            if not names:
                assert not must, (number, must)

        async def read(path):
            async with await fs.open_path(path, "rb") as f:
                return await f.read()

        def links(path):
            return client.call(fs.stat(path)).nlink
        for number, paths in found.items():
            assert len({client.call(fs.resolve(path))[0] for path in paths}) == 1, paths
            assert links(paths[0]) >= len(paths), paths         # never counted too low
            data = client.call(read(paths[0]))
            if number in where:
                assert data == content(number), paths[0]
        report = client.call(check(fs, repair=True, grace_s=0))
        leftovers = {error["kind"] for error in report.errors}
        assert leftovers <= {"orphan_inode", "orphan_data", "nlink"}, report.errors
        assert report.repaired == len(report.errors)
        again = client.call(check(fs, grace_s=0))
        assert again.clean, again.errors
        for number, paths in found.items():
            assert links(paths[0]) == len(paths), paths
        print(f"{kills} kills, {len(where)} files closed, {len(found)} present; fsck repaired "
              f"{report.repaired} ({sorted(leftovers)})")


def sha256_of(path, opener=open):
    digest = hashlib.sha256()
    with opener(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_an_osd_killed_under_cairn_fsspec_during_a_large_write(local_cluster, tmp_path):
    """fsspec's cairn:// file, as DCP writes it: 4 MiB writes, an OSD SIGKILLed after the
    first 64 MiB, close (durable) still succeeds and a new client reads every byte back."""
    from cairn.client.fsspec_fs import CairnFileSystem
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="2G", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")
    rng = random.Random(3)
    blocks = [rng.randbytes(4 << 20) for _ in range(8)]
    order = [rng.randrange(len(blocks)) for _ in range(128)]            # 512 MiB
    want = hashlib.sha256(b"".join(blocks[index] for index in order)).hexdigest()
    options = dict(cluster=cluster.dir, metadata_pool="meta", skip_instance_cache=True)
    writer = CairnFileSystem(**options)
    try:
        with writer.open("data/ckpt/big.bin", "wb") as out:
            for count, index in enumerate(order):
                out.write(blocks[index])
                if count == 16:
                    cluster.script("kill", "osd.1")              # SIGKILL mid-write
    finally:
        writer.close()
    reader = CairnFileSystem(**options)
    try:
        assert reader.size("data/ckpt/big.bin") == 512 << 20
        assert sha256_of("data/ckpt/big.bin", reader.open) == want
    finally:
        reader.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts need root here (CI runs as root)")
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine")
def test_an_osd_killed_under_a_mount_during_a_large_write(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="2G", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")
    source = tmp_path / "source.bin"
    with open(source, "wb") as handle:
        for _ in range(64):
            handle.write(os.urandom(8 << 20))                     # 512 MiB
    want = hashlib.sha256(source.read_bytes()).hexdigest()
    mounts = Mounts(cluster, tmp_path)
    try:
        m = mounts.mount("m")
        writer = subprocess.Popen(["dd", f"if={source}", f"of={m}/big.bin", "bs=4M",
                                   "conv=fsync", "status=none"], stderr=subprocess.PIPE)
        try:
            time.sleep(1.0)
            cluster.script("kill", "osd.1")                       # SIGKILL mid-write
            assert writer.wait(timeout=240) == 0, writer.stderr.read().decode()
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            writer.stderr.close()
        assert sha256_of(f"{m}/big.bin") == want
        # And from a new mount process (nothing cached), after a clean unmount.
        assert cairn(cluster, "umount", m).returncode == 0
        assert sha256_of(f"{mounts.mount('again')}/big.bin") == want
        cluster.script("restart", "osd.1")
        with connect(cluster.dir) as client:
            fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
            report = client.call(check(fs, grace_s=0))
            assert report.clean and report.bytes == 512 << 20, report
    finally:
        mounts.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts need root here (CI runs as root)")
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine")
def test_a_mount_rides_a_leader_change_and_answers_eio_past_its_deadline(local_cluster,
                                                                         tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST, mons=3)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    mounts = Mounts(cluster, tmp_path)
    stopped = []
    try:
        m = mounts.mount("m", "--op-timeout", "6")
        before = os.urandom(3 << 20)
        with open(f"{m}/before", "wb") as handle:
            handle.write(before)
        leader, _ = leader_of(cluster)
        sigkill(cluster, leader)
        cluster.script("kill", "osd.2")         # a map change only the new leader can make
        after = os.urandom(9 << 20)
        with open(f"{m}/after", "wb") as handle:  # waits for the PGs to peer without osd.2
            handle.write(after)
        assert open(f"{m}/before", "rb").read() == before
        assert open(f"{m}/after", "rb").read() == after
        # Every OSD stopped: an op waits out the mount's deadline, then answers EIO.
        for osd in ("osd.0", "osd.1"):
            cluster.script("kill", osd, "--signal", "STOP")
            stopped.append(osd)
        began = time.monotonic()
        with pytest.raises(OSError) as failure:
            with open(f"{m}/during", "wb") as handle:
                handle.write(b"x")
        waited = time.monotonic() - began
        assert failure.value.errno == errno.EIO, failure.value
        assert 5 <= waited <= 30, waited
        for osd in stopped:
            cluster.script("kill", osd, "--signal", "CONT")
        stopped.clear()
        # Serving again once the OSDs are back in the map (marked down while stopped).
        again_by = time.monotonic() + 60
        while True:
            try:
                assert open(f"{m}/before", "rb").read() == before
                break
            except OSError as exc:
                assert exc.errno == errno.EIO and time.monotonic() < again_by, exc
                time.sleep(1)
        print(f"EIO after {waited:.1f} s with every OSD stopped (deadline 6 s)")
    finally:
        for osd in stopped:
            cluster.script("kill", osd, "--signal", "CONT")
        mounts.stop()
