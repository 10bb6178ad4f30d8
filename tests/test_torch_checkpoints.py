"""PyTorch checkpoints through a cairn mount and through cairn:// (fsspec), on a real cluster:
torch.save/torch.load, and torch.distributed.checkpoint's save/load with FileSystemWriter on
the mount and FsspecWriter on a cairn:// URL, for a state dict of a few hundred MB, equal on
load."""

import os
import time

import pytest

from tests.helpers import close_fsspec_filesystems
from tests.test_mount import Mounts

torch = pytest.importorskip("torch", reason="torch is not installed (cluster-scripts/setup.sh "
                            "installs the CPU build where it can)")

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts need root here (CI runs as root)"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
]

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


def state_dict():
    generator = torch.Generator().manual_seed(7)
    return {f"layer{i}.weight": torch.randn(1024, 12 * 1024, generator=generator)
            for i in range(5)} | {"step": torch.tensor(1000)}         # ~250 MB of float32


def assert_equal(loaded, wanted):
    assert loaded.keys() == wanted.keys()
    for key, tensor in wanted.items():
        assert torch.equal(loaded[key], tensor), key


def test_torch_save_and_distributed_checkpoints_through_mount_and_fsspec(local_cluster,
                                                                         tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="2G", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--erasure", "2+1", "--pg-num", "8")
    mounts = Mounts(cluster, tmp_path)
    wanted = state_dict()
    size_mb = sum(t.numel() * t.element_size() for t in wanted.values()) / 1e6
    try:
        m = mounts.mount("m")
        began = time.monotonic()
        torch.save(wanted, f"{m}/model.pt")
        saved_s = time.monotonic() - began
        assert_equal(torch.load(f"{m}/model.pt"), wanted)

        began = time.monotonic()
        dcp.save(wanted, storage_writer=dcp.FileSystemWriter(f"{m}/dcp-mount"))
        dcp_s = time.monotonic() - began
        loaded = {key: torch.empty_like(tensor) for key, tensor in wanted.items()}
        dcp.load(loaded, storage_reader=dcp.FileSystemReader(f"{m}/dcp-mount"))
        assert_equal(loaded, wanted)

        monkeypatch.setenv("CAIRN_CLUSTER", cluster.dir)
        url = "cairn://data/dcp-fsspec"
        began = time.monotonic()
        dcp.save(wanted, storage_writer=FsspecWriter(url, metadata_pool="meta"))
        fsspec_s = time.monotonic() - began
        loaded = {key: torch.empty_like(tensor) for key, tensor in wanted.items()}
        dcp.load(loaded, storage_reader=FsspecReader(url, metadata_pool="meta"))
        assert_equal(loaded, wanted)
        # What fsspec wrote is in the mount too.
        assert ".metadata" in os.listdir(f"{m}/dcp-fsspec")
        print(f"{size_mb:.0f} MB state dict: torch.save to the mount {saved_s:.1f} s, DCP "
              f"FileSystemWriter {dcp_s:.1f} s, DCP FsspecWriter {fsspec_s:.1f} s")
    finally:
        close_fsspec_filesystems()          # the one DCP made through fsspec
        mounts.stop()
