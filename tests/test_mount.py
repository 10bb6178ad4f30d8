"""`cairn mount` through the kernel (real FUSE mounts of a real cluster) and `cairn://` through
fsspec: POSIX behaviour and errno, two mounts, a read-only mount, readdir during creates,
ergonomics (missing / busy mount point, umount after SIGKILL), fsck afterwards."""

import errno
import json
import os
import pickle
import re
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts of another user's files need "
                       "root here (CI runs as root)"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
]

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


def cairn(cluster, *args):
    return subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                           *args], capture_output=True, text=True, timeout=60)


class Mounts:
    """Mounts a test made; each stopped by pid and unmounted, even when the test fails."""

    def __init__(self, cluster, tmp_path):
        self.cluster, self.tmp_path = cluster, tmp_path
        self.pids = {}

    def mount(self, name, *options):
        point = str(self.tmp_path / name)
        os.makedirs(point, exist_ok=True)
        result = cairn(self.cluster, "mount", "data", point, "--metadata-pool", "meta",
                       "--log", str(self.tmp_path / f"{name}.log"), *options)
        assert result.returncode == 0, result.stderr
        self.pids[point] = int(re.search(r"pid (\d+)", result.stdout).group(1))
        assert os.path.ismount(point)
        assert "cairn umount" in result.stdout            # says how to unmount
        return point

    def stop(self):
        for point, pid in self.pids.items():
            subprocess.run(["fusermount3", "-uz", point], capture_output=True)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def mountable_cluster(local_cluster, tmp_path):
    """Mounts of a new 3-OSD cluster with pools `meta` and `data` (replicated 3)."""
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    return Mounts(cluster, tmp_path)


@pytest.fixture
def mounts(local_cluster, tmp_path):
    made = mountable_cluster(local_cluster, tmp_path)
    try:
        yield made
    finally:
        made.stop()


def expect(code, call, *args):
    with pytest.raises(OSError) as failure:
        call(*args)
    assert failure.value.errno == code, (call, args, failure.value)


def test_random_io_through_the_kernel_matches_a_bytearray(mounts):
    """fsx's idea through the mount: in-order runs of large writes (the kernel's 1 MiB
    requests, kept as they came), writes anywhere, reads, truncates and fsyncs on one file
    against a bytearray; then the file as a second mount sees it."""
    import random
    rng = random.Random(17)
    m = mounts.mount("m")
    path = f"{m}/fsx.bin"
    model = bytearray()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        cursor = 0
        for step in range(300):
            roll = rng.random()
            if roll < 0.35:
                data = rng.randbytes(rng.choice([4 << 20, 1 << 20, 3 << 20, 5000]))
                offset = cursor
            elif roll < 0.55:
                data = rng.randbytes(rng.choice([1, 777, 70_000, 1 << 20]))
                offset = rng.randrange(0, len(model) + (2 << 20))
            elif roll < 0.8:
                offset = rng.randrange(0, len(model) + 10)
                length = rng.choice([1, 4096, 1 << 20, 9 << 20])
                assert os.pread(fd, length, offset) == model[offset:offset + length], step
                continue
            elif roll < 0.87:
                size = rng.randrange(0, len(model) + (1 << 20))
                os.ftruncate(fd, size)
                del model[size:]
                model.extend(bytes(size - len(model)))
                continue
            elif roll < 0.93:
                os.fsync(fd)
                continue
            else:
                cursor = rng.randrange(0, len(model) // (4 << 20) + 2) * (4 << 20)
                continue
            assert os.pwrite(fd, data, offset) == len(data)
            model.extend(bytes(max(0, offset - len(model))))
            model[offset:offset + len(data)] = data
            cursor = offset + len(data)
            assert os.fstat(fd).st_size == len(model), step
    finally:
        os.close(fd)
    other = mounts.mount("other")
    with open(f"{other}/fsx.bin", "rb") as handle:
        assert handle.read() == model


def test_posix_through_the_mount_two_mounts_read_only_and_fsspec(mounts):
    m = mounts.mount("m1")
    other = mounts.mount("m2")
    # Files: write, read, stat, overwrite at an offset, append, truncate.
    os.makedirs(f"{m}/ckpt/step-1")
    blob = os.urandom(9 * 1024 * 1024 + 77)
    with open(f"{m}/ckpt/step-1/model.pt", "wb") as f:
        f.write(blob)
    assert os.stat(f"{m}/ckpt/step-1/model.pt").st_size == len(blob)
    with open(f"{other}/ckpt/step-1/model.pt", "rb") as f:          # the other mount
        assert f.read() == blob
    with open(f"{m}/ckpt/step-1/model.pt", "r+b") as f:
        f.seek(4 * 1024 * 1024 - 3)
        f.write(b"OVERWRITE")
    with open(f"{m}/ckpt/step-1/model.pt", "ab") as f:
        f.write(b"appended")
    model = bytearray(blob)
    model[4 * 1024 * 1024 - 3:4 * 1024 * 1024 + 6] = b"OVERWRITE"
    model += b"appended"
    with open(f"{other}/ckpt/step-1/model.pt", "rb") as f:
        assert f.read() == bytes(model)
    os.truncate(f"{m}/ckpt/step-1/model.pt", 1000)
    with open(f"{m}/ckpt/step-1/model.pt", "rb") as f:
        assert f.read() == bytes(model[:1000])

    # errno of each error case.
    expect(errno.ENOENT, os.stat, f"{m}/nope")
    expect(errno.ENOTEMPTY, os.rmdir, f"{m}/ckpt")
    expect(errno.EEXIST, os.mkdir, f"{m}/ckpt")
    expect(errno.ENOTDIR, os.listdir, f"{m}/ckpt/step-1/model.pt")
    expect(errno.EISDIR, os.unlink, f"{m}/ckpt")
    expect(errno.EEXIST, os.open, f"{m}/ckpt/step-1/model.pt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    expect(errno.EINVAL, os.rename, f"{m}/ckpt", f"{m}/ckpt/step-1/inside")
    expect(errno.EPERM, os.link, f"{m}/ckpt", f"{m}/hard")            # a directory
    expect(errno.ENOENT, open, f"{m}/nope/x", "wb")

    # Hard links, special files, atime apart from mtime, through the kernel.
    with open(f"{m}/linked", "wb") as f:
        f.write(b"linked")
    os.link(f"{m}/linked", f"{m}/ckpt/hard")
    assert os.stat(f"{other}/linked").st_nlink == 2
    assert os.stat(f"{m}/linked").st_ino == os.stat(f"{m}/ckpt/hard").st_ino
    os.unlink(f"{m}/linked")
    assert open(f"{other}/ckpt/hard", "rb").read() == b"linked"
    assert os.stat(f"{m}/ckpt/hard").st_nlink == 1
    os.mkfifo(f"{m}/fifo")
    assert stat.S_ISFIFO(os.lstat(f"{other}/fifo").st_mode)
    os.mknod(f"{m}/sock", stat.S_IFSOCK | 0o600)
    assert stat.S_ISSOCK(os.lstat(f"{m}/sock").st_mode)
    os.utime(f"{m}/ckpt/hard", (1_900_000_000, 1_950_000_000))
    open(f"{m}/ckpt/hard", "rb").read()
    attrs = os.stat(f"{other}/ckpt/hard")
    assert (int(attrs.st_atime), int(attrs.st_mtime)) == (1_900_000_000, 1_950_000_000)
    os.unlink(f"{m}/fifo")
    os.unlink(f"{m}/sock")
    os.unlink(f"{m}/ckpt/hard")

    # Renames: over a file (atomic replace), a non-empty directory, across directories.
    with open(f"{m}/ckpt/a", "w") as f:
        f.write("a")
    with open(f"{m}/ckpt/b", "w") as f:
        f.write("bb")
    os.rename(f"{m}/ckpt/a", f"{m}/ckpt/b")
    assert open(f"{other}/ckpt/b").read() == "a" and not os.path.exists(f"{other}/ckpt/a")
    os.rename(f"{m}/ckpt/step-1", f"{m}/ckpt/step-2")
    assert os.listdir(f"{other}/ckpt/step-2") == ["model.pt"]
    os.makedirs(f"{m}/elsewhere")
    os.rename(f"{m}/ckpt/step-2", f"{m}/elsewhere/step-2")
    assert sorted(os.listdir(f"{other}/ckpt")) == ["b"]
    os.symlink("elsewhere/step-2", f"{m}/latest")
    assert os.readlink(f"{other}/latest") == "elsewhere/step-2"
    assert os.listdir(f"{other}/latest") == ["model.pt"]

    # readdir while another mount adds entries: no name twice, every old name there.
    os.makedirs(f"{m}/busy")
    for i in range(200):
        open(f"{m}/busy/old-{i:04d}", "wb").close()
    stop = threading.Event()

    def add():
        i = 0
        while not stop.is_set() and i < 300:
            open(f"{other}/busy/new-{i:04d}", "wb").close()
            i += 1
    adder = threading.Thread(target=add)
    adder.start()
    try:
        for _ in range(5):
            names = os.listdir(f"{m}/busy")
            assert len(names) == len(set(names))
            assert {f"old-{i:04d}" for i in range(200)} <= set(names)
    finally:
        stop.set()
        adder.join()

    # Read-only mount: reads work, every write is EROFS.
    ro = mounts.mount("ro", "--read-only")
    assert open(f"{ro}/ckpt/b").read() == "a"
    expect(errno.EROFS, open, f"{ro}/ckpt/new", "wb")
    expect(errno.EROFS, os.mkdir, f"{ro}/d")
    expect(errno.EROFS, os.unlink, f"{ro}/ckpt/b")

    # fsspec: the same files; mv is the namespace's rename; the filesystem pickles.
    import fsspec
    fs = fsspec.filesystem("cairn", cluster=mounts.cluster.dir, metadata_pool="meta")
    with fs.open("cairn://data/ckpt/from-fsspec.bin", "wb") as f:
        f.write(b"x" * 5_000_000)
    assert os.stat(f"{m}/ckpt/from-fsspec.bin").st_size == 5_000_000
    fs.mv("cairn://data/ckpt/from-fsspec.bin", "cairn://data/elsewhere/moved.bin")
    assert os.path.exists(f"{m}/elsewhere/moved.bin")
    # The mount's kernel keeps entries it looked up for ATTR_TIMEOUT_S (1 s): another
    # client's rename shows within that.
    gone_by = time.monotonic() + 3
    while os.path.exists(f"{m}/ckpt/from-fsspec.bin") and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not os.path.exists(f"{m}/ckpt/from-fsspec.bin")
    again = pickle.loads(pickle.dumps(fs))
    assert sorted(again.ls("data/elsewhere", detail=False)) == ["data/elsewhere/moved.bin",
                                                                "data/elsewhere/step-2"]
    assert again.info("data/elsewhere/moved.bin")["size"] == 5_000_000
    with fsspec.open("cairn://data/elsewhere/step-2/model.pt", "rb",
                     cluster=mounts.cluster.dir, metadata_pool="meta") as f:
        assert f.read() == bytes(model[:1000])

    result = cairn(mounts.cluster, "fsck", "data", "--metadata-pool", "meta", "--grace", "0",
                   "--json")
    assert result.returncode == 0, result.stdout + result.stderr


def test_bench_files_through_the_mount_and_through_the_library(mounts):
    m = mounts.mount("m")
    for where in (["--mountpoint", m], ["--pool", "data", "--metadata-pool", "meta"]):
        result = cairn(mounts.cluster, "bench", "files", *where, "--files", "120", "--size",
                       "5000", "--threads", "8", "--dirs", "3", "--fsync", "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["via"] == ("mount" if where[0] == "--mountpoint" else "library")
        for phase in ("create", "stat", "read", "ls", "unlink"):
            figures = report["phases"][phase]
            assert figures["ops"] == (3 if phase == "ls" else 120), (phase, figures)
            assert figures["ops_per_s"] > 0 and figures["p99_ms"] >= figures["p50_ms"] > 0
            assert figures["wrong"] == figures["errors"] == 0, (phase, figures)
        assert "create" in result.stdout and "bench files:" in result.stderr   # progress
    assert os.listdir(m) == []                          # everything it made is gone
    result = cairn(mounts.cluster, "bench", "files", "--mountpoint", "/nonexistent-mount")
    assert result.returncode == 2 and "not a mount point" in result.stderr


def test_bench_mount_puts_the_streams_beside_bench_cluster_in_one_run(mounts):
    """`cairn bench mount`: the large file through the commands, the library, the mount and
    fsspec, with `bench cluster --op write/seq` of the same run as the denominator (issue 42's
    targets), small files and nothing left behind."""
    m = mounts.mount("m")
    result = subprocess.run(
        [sys.executable, "-m", "cairn.client.cli", "--cluster", mounts.cluster.dir, "bench",
         "mount", "--pool", "data", "--metadata-pool", "meta", "--mountpoint", m, "--size",
         "24M", "--files", "30", "--file-size", "8K", "--writers", "3", "--entries", "0",
         "--bench-seconds", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("put", "get", "mount_write", "mount_read", "fsspec_write", "fsspec_read",
                "bench_write", "bench_seq"):
        assert report[f"{key}_MBps"] > 0, key
    for path, bench in (("mount_write", "bench_write"), ("mount_read", "bench_seq"),
                        ("fsspec_write", "bench_write"), ("fsspec_read", "bench_seq")):
        ratio = report[f"{path}_vs_{bench}"]
        assert abs(ratio - report[f"{path}_MBps"] / report[f"{bench}_MBps"]) < 0.01, path
    assert report["small_write_files_per_s"] > 0 and report["small_read_files_per_s"] > 0
    assert "against bench cluster" in result.stderr and "fsspec: write" in result.stderr
    assert os.listdir(m) == []                          # everything it made is gone
    assert cairn(mounts.cluster, "ls", "data").stdout.count("cairn-bench-mount") == 0
    result = cairn(mounts.cluster, "bench", "mount", "--pool", "data", "--mountpoint",
                   "/nonexistent-mount")
    assert result.returncode == 2 and "is not mounted" in result.stderr


def test_bench_dataloader_reads_through_the_mount_cairn_and_local_disk(mounts, tmp_path):
    """A real torch DataLoader with worker processes over files written through the mount:
    every sample read through the mount, through cairn:// and from local disk, checked."""
    pytest.importorskip("torch", reason="PyTorch is not installed (cluster-scripts/setup.sh "
                                        "installs its CPU build)")
    m = mounts.mount("m")
    local = tmp_path / "local"
    local.mkdir()
    result = cairn(mounts.cluster, "bench", "dataloader", "--mountpoint", m, "--pool", "data",
                   "--metadata-pool", "meta", "--local", str(local), "--files", "150",
                   "--size", "6000", "--workers", "2", "--batch", "16", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["sources"]) == {"local", "mount", "cairn"}
    for source, figures in report["sources"].items():
        assert figures["samples"] == 150 and figures["wrong"] == 0, (source, figures)
        assert figures["samples_per_s"] > 0 and figures["mb_per_s"] > 0
    assert report["mount_vs_local"] > 0 and report["cairn_vs_local"] > 0
    assert "bench dataloader:" in result.stderr                         # progress
    assert os.listdir(m) == [] and os.listdir(local) == []              # it cleans up
    result = cairn(mounts.cluster, "bench", "dataloader", "--mountpoint", "/nonexistent")
    assert result.returncode == 2 and "not a mount point" in result.stderr


def test_unlinks_return_before_they_land_and_a_killed_mount_leaves_whole_files(mounts,
                                                                                tmp_path):
    """Through the kernel: `rm` of a file is answered before its update lands (the mount's
    log counts them at its stop), yet the name is gone at once for this mount, can be made
    again at once, a listing and the directory's fsync wait for the updates, and another mount
    then sees exactly what is left. A mount SIGKILLed right after a run of unlinks leaves
    each file whole or gone; fsck is clean after repairing removed files' stripes."""
    m, other = mounts.mount("m"), mounts.mount("other")
    os.makedirs(f"{m}/u")
    payloads = {f"f{i:03d}": os.urandom(100 if i % 2 else 65536) for i in range(120)}
    for name, payload in payloads.items():
        with open(f"{m}/u/{name}", "wb") as f:
            f.write(payload)
    for i, name in enumerate(payloads):
        os.unlink(f"{m}/u/{name}")
        assert not os.path.exists(f"{m}/u/{name}")
        if i % 10 == 0:
            with open(f"{m}/u/{name}", "wb") as f:
                f.write(b"again")
            assert open(f"{m}/u/{name}", "rb").read() == b"again"
    again = sorted(name for i, name in enumerate(payloads) if i % 10 == 0)
    assert sorted(os.listdir(f"{m}/u")) == again
    fd = os.open(f"{m}/u", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert sorted(os.listdir(f"{other}/u")) == again
    assert open(f"{other}/u/{again[-1]}", "rb").read() == b"again"

    # A kill right after a run of unlinks: no file half there.
    os.makedirs(f"{m}/k")
    for name, payload in payloads.items():
        with open(f"{m}/k/{name}", "wb") as f:
            f.write(payload)
    for name in payloads:
        os.unlink(f"{m}/k/{name}")
    os.kill(mounts.pids[m], signal.SIGKILL)
    for name in os.listdir(f"{other}/k"):
        assert open(f"{other}/k/{name}", "rb").read() == payloads[name], name
    repaired = cairn(mounts.cluster, "fsck", "data", "--metadata-pool", "meta", "--grace", "0",
                     "--repair", "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert {error["kind"] for error in json.loads(repaired.stdout)["errors"]} <= \
        {"orphan_data"}, repaired.stdout
    result = cairn(mounts.cluster, "fsck", "data", "--metadata-pool", "meta", "--grace", "0",
                   "--json")
    assert result.returncode == 0, result.stdout + result.stderr

    # The other mount's stop says how many of its unlinks were answered early.
    for name in again:
        os.unlink(f"{other}/u/{name}")
    assert cairn(mounts.cluster, "umount", other).returncode == 0
    pid = mounts.pids.pop(other)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    log = open(tmp_path / "other.log").read()
    early = re.search(r"stopped: (\d+) unlinks answered before they landed, (\d+) of them "
                      r"failed, (\d+) not landed", log)
    assert early and int(early.group(1)) >= len(again) - 1 and early.group(2) == "0" and \
        early.group(3) == "0", log[-2000:]


def test_mount_ergonomics_and_cleanup_after_sigkill(mounts, tmp_path):
    missing = cairn(mounts.cluster, "mount", "data", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    m = mounts.mount("m")
    busy = cairn(mounts.cluster, "mount", "data", m, "--metadata-pool", "meta")
    assert busy.returncode == 2 and "already a mount point" in busy.stderr
    with open(f"{m}/kept", "wb") as f:
        f.write(b"closed before the kill")
    os.kill(mounts.pids[m], signal.SIGKILL)
    time.sleep(0.5)
    expect(errno.ENOTCONN, os.stat, f"{m}/kept")
    result = cairn(mounts.cluster, "umount", m)
    assert result.returncode == 0, result.stderr
    assert not os.path.ismount(m)
    m = mounts.mount("m")
    assert open(f"{m}/kept", "rb").read() == b"closed before the kill"
    result = cairn(mounts.cluster, "umount", m)
    assert result.returncode == 0 and not os.path.ismount(m)
    not_mounted = cairn(mounts.cluster, "umount", m)
    assert not_mounted.returncode == 2 and "not mounted" in not_mounted.stderr


def test_sparse_files_through_the_kernel_and_a_stop_that_never_waits_on_the_cluster(mounts):
    """`truncate -s 1P f && rm f` returns within a second; a write past the largest file is
    EFBIG; a mount whose cluster stopped answering mid-request still stops on SIGTERM within
    a few seconds (the request in flight is cancelled)."""
    m = mounts.mount("m")
    began = time.monotonic()
    subprocess.run(["truncate", "-s", "1P", f"{m}/sparse"], check=True, timeout=30)
    assert os.stat(f"{m}/sparse").st_size == 1 << 50
    subprocess.run(["rm", f"{m}/sparse"], check=True, timeout=30)
    assert time.monotonic() - began < 2.0
    with open(f"{m}/far", "wb") as f:
        f.write(b"head")
        f.seek((1 << 50) - 1)
        f.write(b"x")
    began = time.monotonic()
    os.unlink(f"{m}/far")
    assert time.monotonic() - began < 1.0
    fd = os.open(f"{m}/big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as failure:
            os.pwrite(fd, b"y", 1 << 52)
        assert failure.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    with open(f"{m}/kept", "wb") as f:
        f.write(b"k")
    for osd in range(3):
        mounts.cluster.script("kill", f"osd.{osd}")
    # A lookup of a name never seen: the kernel has nothing cached, so it asks the mount,
    # which asks the (dead) metadata pool.
    reader = subprocess.Popen(["stat", f"{m}/never-seen"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)                     # the lookup is in flight, waiting on dead OSDs
        os.kill(mounts.pids[m], signal.SIGTERM)
        began = time.monotonic()
        while time.monotonic() - began < 15:
            try:
                os.kill(mounts.pids[m], 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        stopped_after = time.monotonic() - began
        assert stopped_after < 8.0, stopped_after
    finally:
        reader.kill()
        try:
            reader.wait(timeout=5)
        except subprocess.TimeoutExpired:       # waiting in the kernel on the mount: end it
            mounts.stop()
            reader.wait(timeout=10)


def test_mounts_honour_caps_and_a_prefix_namespace_fences_a_team(mounts, tmp_path):
    cluster = mounts.cluster
    keys = {}
    for name, caps in (("client.ro", ["mon=r", "osd=r pool=data", "osd=r pool=meta"]),
                       ("client.teama", ["mon=r", "osd=rw pool=data prefix=team-a/",
                                         "osd=rw pool=meta prefix=team-a/"])):
        keys[name] = str(tmp_path / f"{name}.keyring")
        cluster.cairn("auth", "add", name, *[arg for cap in caps for arg in ("--caps", cap)],
                      "--keyring-out", keys[name])

    def as_user(name):
        return ("--name", name, "--keyring", keys[name])

    admin = mounts.mount("admin")
    with open(f"{admin}/kept", "wb") as f:
        f.write(b"the admin's")
    os.mkdir(f"{admin}/dir")

    # A read-only key (no --read-only flag): reads work, every change is EACCES and changes
    # nothing.
    ro = mounts.mount("ro", *as_user("client.ro"))
    assert open(f"{ro}/kept", "rb").read() == b"the admin's"
    assert sorted(os.listdir(ro)) == ["dir", "kept"]
    expect(errno.EACCES, open, f"{ro}/new", "wb")
    expect(errno.EACCES, os.mkdir, f"{ro}/dir2")
    expect(errno.EACCES, os.unlink, f"{ro}/kept")
    expect(errno.EACCES, os.rename, f"{ro}/kept", f"{ro}/dir/kept")
    with pytest.raises(OSError) as failure:
        with open(f"{ro}/kept", "r+b") as f:
            f.write(b"THE")
    assert failure.value.errno == errno.EACCES, failure.value
    assert sorted(os.listdir(admin)) == ["dir", "kept"]
    assert open(f"{admin}/kept", "rb").read() == b"the admin's"

    # A key for team-a/ cannot mount the pool's main namespace, only its own prefix's.
    os.makedirs(tmp_path / "nope", exist_ok=True)
    refused = cairn(cluster, "mount", "data", str(tmp_path / "nope"), "--metadata-pool", "meta",
                    *as_user("client.teama"))
    assert refused.returncode != 0 and "permission denied" in refused.stderr, refused.stderr
    assert not os.path.ismount(tmp_path / "nope")
    team = mounts.mount("team", "--prefix", "team-a", *as_user("client.teama"))
    assert os.listdir(team) == []                       # a tree of its own
    os.makedirs(f"{team}/ckpt/step-1")
    with open(f"{team}/ckpt/step-1/model.pt", "wb") as f:
        f.write(b"team a's weights" * 400)          # past INLINE_BYTES_MAX: a stripe
    os.rename(f"{team}/ckpt/step-1", f"{team}/ckpt/step-2")
    assert sorted(os.listdir(admin)) == ["dir", "kept"]  # not in the main namespace
    seen = mounts.mount("admin-team", "--prefix", "team-a/")
    assert open(f"{seen}/ckpt/step-2/model.pt", "rb").read() == b"team a's weights" * 400
    # Every object the team's mount made is named under its prefix.
    for pool, kind in (("data", "f."), ("meta", "i.")):
        _, listing = cluster.cairn("ls", pool)
        assert any(n.startswith(f"team-a/{kind}") for n in listing["names"]), listing
    # fsspec with the team's key and prefix: the same files; without the prefix, refused.
    import fsspec
    team_fs = fsspec.filesystem("cairn", cluster=cluster.dir, metadata_pool="meta",
                                prefix="team-a/", name="client.teama",
                                keyring=keys["client.teama"], skip_instance_cache=True)
    main_fs = fsspec.filesystem("cairn", cluster=cluster.dir, metadata_pool="meta",
                                name="client.teama", keyring=keys["client.teama"],
                                skip_instance_cache=True)
    try:
        assert team_fs.cat("cairn://data/ckpt/step-2/model.pt") == b"team a's weights" * 400
        team_fs.pipe("cairn://data/ckpt/notes.txt", b"from fsspec")
        assert open(f"{team}/ckpt/notes.txt", "rb").read() == b"from fsspec"
        expect(errno.EACCES, main_fs.ls, "cairn://data/")
    finally:
        team_fs.close()             # their client threads, stopped before the cluster goes
        main_fs.close()

    # fsck of the team's namespace, with the team's key: its tree only, clean.
    result = cairn(cluster, "fsck", "data", "--metadata-pool", "meta", "--prefix", "team-a/",
                   "--grace", "0", "--json", *as_user("client.teama"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["files"] == 2 and report["directories"] == 3, report

    _, audit = cluster.cairn("audit", "--entity", "client.ro")
    assert any(e["result"] == "permission_denied" for e in audit["events"]), audit
