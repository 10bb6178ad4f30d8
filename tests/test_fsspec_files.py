"""A `cairn://` file object (client/fsspec_fs.py CairnFile) on a real cluster: small writes
gathered and small reads answered from a window around them, against a bytearray through
random writes, reads, seeks and truncates; `flush()` hands bytes to the file without making
them durable, `fsync()` and `close()` make them durable (another client sees them); and DCP's
save, which calls flush() after every item, makes one durable flush per file it writes."""

import io
import random

import pytest

from tests.helpers import close_fsspec_filesystems

fsspec = pytest.importorskip("fsspec")

pytestmark = pytest.mark.cluster

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")
MiB = 1 << 20


@pytest.fixture
def cairn_fs(local_cluster, monkeypatch):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="1G", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    monkeypatch.setenv("CAIRN_CLUSTER", cluster.dir)
    from cairn.client.fsspec_fs import CairnFileSystem
    made = []

    def make():
        made.append(CairnFileSystem(metadata_pool="meta", skip_instance_cache=True))
        return made[-1]
    try:
        yield make
    finally:
        for fs in made:             # each one's client thread, stopped before the cluster goes
            fs.close()
        close_fsspec_filesystems()


def other_client_reads(make_fs, path):
    """The file's bytes as a second client (its own connections and caches) sees them."""
    other = make_fs()
    try:
        with other.open(path, "rb") as handle:
            return handle.read()
    finally:
        other.close()


def test_a_file_object_matches_a_bytearray_through_random_writes_reads_and_seeks(cairn_fs):
    fs = cairn_fs()
    rng = random.Random(2026_11_28)
    path = "data/model/random.bin"
    model = bytearray()
    position = 0
    small_writes = large_writes = small_reads = 0
    with fs.open(path, "w+b") as handle:
        for step in range(400):
            action = rng.random()
            if action < 0.35:                                   # small write (gathered)
                data = rng.randbytes(rng.randint(1, 5000))
                small_writes += 1
            elif action < 0.45:                                 # large write (goes at once)
                data = rng.randbytes(rng.randint(64 * 1024, 5 * MiB))
                large_writes += 1
            else:
                data = None
            if data is not None:
                assert handle.write(data) == len(data)
                end = position + len(data)
                if len(model) < position:
                    model.extend(bytes(position - len(model)))
                model[position:end] = data
                position = end
            elif action < 0.65:                                 # seek anywhere, even past the end
                position = rng.randint(0, len(model) + 10_000)
                assert handle.seek(position) == position
            elif action < 0.8:                                  # small read (from the window)
                size = rng.randint(1, 3000)
                got = handle.read(size)
                assert got == bytes(model[position:position + size]), f"step {step}"
                position += len(got)
                small_reads += 1
            elif action < 0.9:                                  # readinto, often large
                buffer = bytearray(rng.choice([100, 60_000, 3 * MiB]))
                count = handle.readinto(buffer)
                want = model[position:position + len(buffer)]
                assert count == len(want) and buffer[:count] == want, f"step {step}"
                position += count
            elif action < 0.95:
                size = rng.randint(0, len(model) + MiB)
                handle.truncate(size)
                model = model[:size] + bytearray(max(0, size - len(model)))
            else:
                handle.flush()
            assert handle.tell() == position, f"step {step}"
        handle.seek(0)
        assert handle.read() == bytes(model)
    assert small_writes > 50 and large_writes > 10 and small_reads > 20
    assert fs.info(path)["size"] == len(model)
    assert other_client_reads(cairn_fs, path) == bytes(model)


def test_flush_hands_bytes_over_and_fsync_makes_them_durable(cairn_fs):
    fs = cairn_fs()
    path = "data/model/flushed.bin"
    with fs.open(path, "wb") as writer:
        writer.seek(100)
        assert writer.size == 0                 # a seek past the end is no write
        writer.seek(0)
        writer.write(b"header")                 # small: gathered in the file object
        assert writer.tell() == 6 and writer.size == 6
        writer.flush()
        with fs.open(path, "rb") as reader:     # same process: the same open file
            assert reader.read() == b"header"
        # Not durable yet: the size is recorded by fsync or close, not by flush.
        assert other_client_reads(cairn_fs, path) == b""
        writer.write(b"x" * (3 * MiB))
        writer.fsync()
        assert other_client_reads(cairn_fs, path) == b"header" + b"x" * (3 * MiB)
        writer.write(b"tail")
    assert other_client_reads(cairn_fs, path) == b"header" + b"x" * (3 * MiB) + b"tail"


def test_dcp_save_makes_one_durable_flush_per_file_not_per_item(cairn_fs, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed (cluster-scripts/"
                                "setup.sh installs the CPU build where it can)")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from cairn.client import fs_file

    durable = []
    flush = fs_file.OpenInode.flush

    async def counted(self):
        durable.append(self.ino)
        return await flush(self)
    monkeypatch.setattr(fs_file.OpenInode, "flush", counted)
    generator = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.randn(64 * 1024, generator=generator) for i in range(40)}
    url = "cairn://data/dcp-flushes"
    dcp.save(state, storage_writer=FsspecWriter(url, metadata_pool="meta"))
    files = len(cairn_fs().ls("data/dcp-flushes"))
    assert 2 <= files <= 3                      # one data file per rank, and .metadata
    # Each file's close flushes once; before, every one of the 40 items flushed its file.
    assert len(durable) <= files + 1, len(durable)
    loaded = {key: torch.empty_like(tensor) for key, tensor in state.items()}
    dcp.load(loaded, storage_reader=FsspecReader(url, metadata_pool="meta"))
    assert all(torch.equal(loaded[key], state[key]) for key in state)


def test_a_small_read_window_never_serves_bytes_written_after_it(cairn_fs):
    fs = cairn_fs()
    path = "data/model/window.bin"
    with fs.open(path, "wb") as handle:
        handle.write(bytes(range(256)) * 1024)
    with fs.open(path, "r+b") as handle:
        handle.seek(1000)
        assert handle.read(10) == bytes((1000 + i) % 256 for i in range(10))   # window read
        handle.seek(2000)
        handle.write(b"\xff" * 10)              # inside the window: small, gathered
        handle.seek(2000)
        assert handle.read(10) == b"\xff" * 10
        handle.seek(5000)
        handle.write(io.BytesIO(b"\xee" * 100_000).getbuffer())     # large, at once
        handle.seek(4990)
        assert handle.read(20) == bytes((4990 + i) % 256 for i in range(10)) + b"\xee" * 10


def test_a_client_left_open_is_closed_at_exit_with_its_thread(cairn_fs):
    """A script that never closes its `cairn://` filesystem: at exit its client is closed and
    its loop thread stopped before the interpreter tears down (client/sync.py), so nothing
    runs on beside the teardown."""
    import subprocess
    import sys
    script = (
        "import atexit, threading\n"
        "atexit.register(lambda: print('left:', sum(t.name == 'cairn-client' and t.is_alive()"
        " for t in threading.enumerate())))\n"       # registered first: runs last
        "from cairn.client.fsspec_fs import CairnFileSystem\n"
        "fs = CairnFileSystem(metadata_pool='meta', skip_instance_cache=True)\n"
        "fs.pipe('data/left-open.txt', b'x')\n"
        "print('running:', sum(t.name == 'cairn-client' for t in threading.enumerate()))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "running: 1" in result.stdout and "left: 0" in result.stdout, result.stdout
