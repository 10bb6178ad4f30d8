"""One 4 GiB file through cairn:// (fsspec) and through `cairn mount`, on a real cluster: every
byte read back equal through the other path, and the memory of the writer bounded while it
writes (client/fs_file.py holds at most DIRTY_STRIPES_MAX dirty stripes and WRITE_BEHIND
being written per open file: 96 MiB at 4 MiB stripes). The memory is the process's peak
resident set, measured by the kernel (ru_maxrss of the fsspec writer, a child process; the
mount daemon's VmHWM)."""

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest

from cairn.client.fs_format import DIRTY_STRIPES_MAX, STRIPE_BYTES, WRITE_BEHIND
from tests.helpers import close_fsspec_filesystems
from tests.test_mount import Mounts

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts need root here (CI runs as root)"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
]

MiB = 1 << 20
SIZE = 4 << 30
BLOCK = 4 * MiB
# What a file being written may hold, and room for the messenger's buffers and the allocator.
HELD_BYTES = (DIRTY_STRIPES_MAX + WRITE_BEHIND) * STRIPE_BYTES
GROWTH_ALLOWED = HELD_BYTES + 64 * MiB

# The file's content: four random 4 MiB blocks in a seeded order, so a stripe written to the
# wrong place shows (the same blocks are not at the same offsets twice in a row).
WRITER = textwrap.dedent("""
    import hashlib, random, resource, sys
    def blocks(seed):
        rng = random.Random(seed)
        pool = [rng.randbytes(%(block)d) for _ in range(4)]
        for _ in range(%(count)d):
            yield pool[rng.randrange(4)]
    def write(out, seed):
        digest = hashlib.sha256()
        for block in blocks(seed):
            out.write(block)
            digest.update(block)
        return digest.hexdigest()
""") % {"block": BLOCK, "count": SIZE // BLOCK}


def sha256_of(handle):
    digest = hashlib.sha256()
    buffer = bytearray(BLOCK)
    while count := handle.readinto(buffer):
        digest.update(memoryview(buffer)[:count])
    return digest.hexdigest()


def vm_hwm(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_4_gib_file_through_fsspec_and_the_mount_equal_with_bounded_memory(local_cluster,
                                                                               tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="10G")
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")
    mounts = Mounts(cluster, tmp_path)
    from cairn.client.fsspec_fs import CairnFileSystem
    fs = CairnFileSystem(cluster=cluster.dir, metadata_pool="meta", skip_instance_cache=True)
    try:
        m = mounts.mount("m")
        # 1. Written through cairn:// by a child process; its peak RSS before and after.
        script = WRITER + textwrap.dedent(f"""
            from cairn.client.fsspec_fs import CairnFileSystem
            fs = CairnFileSystem(cluster={cluster.dir!r}, metadata_pool="meta")
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            with fs.open("data/big/fsspec.bin", "wb") as out:
                digest = write(out, 1)
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(digest, before * 1024, after * 1024)
            fs.close()
        """)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr
        want, before, after = result.stdout.split()
        growth = int(after) - int(before)
        print(f"fsspec writer: peak RSS {int(after) / MiB:.0f} MiB, "
              f"{growth / MiB:.0f} MiB over its start")
        assert growth <= GROWTH_ALLOWED, growth
        # Read back through the mount (another process, another client).
        with open(f"{m}/big/fsspec.bin", "rb", buffering=0) as handle:
            assert sha256_of(handle) == want
        fs.rm("data/big/fsspec.bin")

        # 2. Written through the mount; the mount daemon's peak RSS.
        pid = mounts.pids[m]
        start = vm_hwm(pid)
        script = WRITER + textwrap.dedent(f"""
            import os
            with open({m + "/big/mount.bin"!r}, "wb", buffering=0) as out:
                digest = write(out, 2)
                os.fsync(out.fileno())
            print(digest)
        """)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr
        want = result.stdout.strip()
        peak = vm_hwm(pid)
        print(f"mount daemon: peak RSS {peak / MiB:.0f} MiB, {(peak - start) / MiB:.0f} MiB "
              "over its state before the write")
        assert peak - start <= GROWTH_ALLOWED, (start, peak)
        # Read back through cairn:// (this process, a client that never saw it).
        assert fs.size("data/big/mount.bin") == SIZE
        with fs.open("data/big/mount.bin", "rb") as handle:
            assert sha256_of(handle) == want
    finally:
        fs.close()
        close_fsspec_filesystems()
        mounts.stop()
