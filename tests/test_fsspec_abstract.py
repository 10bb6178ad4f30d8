"""fsspec's own abstract test classes (fsspec.tests.abstract: copy, get, put, open, pipe) run
against `cairn://` on one real cluster (3 hosts x 1 OSD) shared by this module."""

import subprocess
import sys
import tempfile
import uuid

import pytest

fsspec = pytest.importorskip("fsspec")
import fsspec.tests.abstract as abstract  # noqa: E402

from tests.helpers import LocalCluster, close_fsspec_filesystems, kill_leftovers  # noqa: E402

pytestmark = pytest.mark.cluster

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


@pytest.fixture(scope="module")
def cairn_cluster():
    directory = tempfile.mkdtemp(prefix="cairn-fsspec-", dir="/var/tmp")
    argv = [sys.executable, "-m", "cairn.cluster.cli", "up", "--dir", f"{directory}/c",
            "--hosts", "3", "--osds-per-host", "1", "--device-size", "256M"]
    for pair in FAST:
        argv += ["--config", pair]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        cluster = LocalCluster(f"{directory}/c")
        cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
        yield cluster
    finally:
        close_fsspec_filesystems()
        subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "down", "--dir",
                        f"{directory}/c", "--purge"], capture_output=True, timeout=120)
        kill_leftovers(f"{directory}/c")
        subprocess.run(["rm", "-rf", directory])


class CairnFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, cairn_cluster):
        from cairn.client.fsspec_fs import CairnFileSystem
        return CairnFileSystem(cluster=cairn_cluster.dir)     # one cached instance: one client

    @pytest.fixture
    def fs_path(self):
        return f"data/abstract-{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def supports_empty_directories(self):
        return True


class TestCairnCopy(abstract.AbstractCopyTests, CairnFixtures):
    pass


class TestCairnGet(abstract.AbstractGetTests, CairnFixtures):
    pass


class TestCairnPut(abstract.AbstractPutTests, CairnFixtures):
    pass


class TestCairnOpen(abstract.AbstractOpenTests, CairnFixtures):
    pass


class TestCairnPipe(abstract.AbstractPipeTests, CairnFixtures):
    pass


def test_a_closed_filesystem_stops_its_client_and_connects_again_when_used(cairn_cluster):
    from cairn.client.fsspec_fs import CairnFileSystem
    fs = CairnFileSystem(cluster=cairn_cluster.dir)
    fs.pipe_file("data/closing/a", b"kept")
    client = fs._client
    fs.close()
    assert fs._client is None and not client._thread.is_alive()
    fs.close()                                              # twice: nothing to do
    assert fs.cat_file("data/closing/a") == b"kept"         # a new client
    assert fs._client is not None and fs._client is not client
