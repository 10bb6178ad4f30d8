"""`cairn bench checkpoint` on a real cluster with CPU tensors (the GPU run is the same code with
--device cuda; its figures are in docs/perf/checkpoint.md), and its restore check on a pool
that lies."""

import asyncio
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (cluster-scripts/setup.sh "
                            "installs the CPU build where it can)")

from cairn.client import bench_checkpoint  # noqa: E402  (after the skip above)


def bench(cluster, *args, timeout=120):
    result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                             "bench", "checkpoint", "--json", *args],
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.cluster
def test_checkpoint_bench_stages_writes_restores_equal_and_leaves_nothing(local_cluster,
                                                                          tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="1G")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    code, result, stderr = bench(cluster, "--pool", "data", "--device", "cpu", "--size", "48M",
                                 "--tensor-size", "16M", "--chunk", "4M")
    assert code == 0, stderr
    assert result["device"] == "cpu" and result["tensors"] == 3
    assert result["size_bytes"] == 48 << 20
    assert result["restore_equal"] is True and result["restore_unequal"] == []
    for phase in ("pageable", "pinned", "write", "restore", "bounded"):
        assert result[f"{phase}_GBps"] > 0, phase
    assert "every tensor equal" in stderr
    # Everything it wrote (3 tensors, 12 bounded chunks, their stripes) is gone again.
    assert cluster.cairn("ls", "data")[1]["names"] == []

    # The DCP phase: the same tensors through torch.distributed.checkpoint to cairn:// and to
    # a local directory, beside bench cluster's write rate, in one run.
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    local = tmp_path / "local"
    local.mkdir()
    code, result, stderr = bench(cluster, "--pool", "data", "--metadata-pool", "meta",
                                 "--local-dir", str(local), "--bench-seconds", "2",
                                 "--device", "cpu", "--size", "48M", "--tensor-size", "16M",
                                 "--chunk", "4M", timeout=300)
    assert code == 0, stderr
    assert result["dcp_equal"] is True and result["dcp_unequal"] == []
    for field in ("bench_write_MBps", "local_torch_save_s", "local_dcp_save_s", "dcp_save_s",
                  "dcp_async_stall_s", "dcp_async_total_s", "local_dcp_load_s", "dcp_load_s",
                  "dcp_save_vs_local_torch_save", "dcp_load_vs_local_load", "dcp_async_vs_save",
                  "dcp_save_vs_bench_write"):
        assert result[field] > 0, field
    assert "UserWarning" not in stderr
    assert list(local.iterdir()) == []                  # its local copies removed
    from cairn.client.fsspec_fs import CairnFileSystem
    fs = CairnFileSystem(cluster=cluster.dir, metadata_pool="meta", skip_instance_cache=True)
    try:
        assert fs.ls("data", detail=False) == []        # and its cairn:// directory
    finally:
        fs.close()

    code, result, _ = bench(cluster, "--pool", "missing", "--device", "cpu", "--size", "4M")
    assert code == 2 and result["error"] == "client_error" and "missing" in result["message"]
    code, result, _ = bench(cluster, "--pool", "data", "--size", "0")
    assert code == 2 and result["error"] == "invalid"
    code, result, _ = bench(cluster, "--pool", "data", "--metadata-pool", "meta",
                            "--local-dir", str(tmp_path / "absent"))
    assert code == 2 and result["error"] == "invalid" and "--local-dir" in result["message"]
    if not torch.cuda.is_available():
        code, result, _ = bench(cluster, "--pool", "data", "--device", "cuda")
        assert code == 2 and result["error"] == "no_device"


class LyingPool:
    """Serves what was put, except that one object comes back with one byte changed."""

    def __init__(self, flip):
        self.objects = {}
        self.flip = flip

    async def put_stream(self, name, source):
        self.objects[name] = bytes(source)

    async def get_stream(self, name):
        data = bytearray(self.objects[name])
        if name == self.flip:
            data[len(data) // 2] ^= 1
        for start in range(0, len(data), 1000):
            yield bytes(data[start:start + 1000])


@pytest.mark.unit
def test_restore_reports_a_tensor_that_came_back_different():
    staging = bench_checkpoint.Staging(torch, "cpu", 3 * 4096, 4096)
    host = staging.host_buffer(staging.size)
    bench_checkpoint.pinned_stall(staging, host)
    pool = LyingPool(flip=f"{bench_checkpoint.PREFIX}-1")

    async def go():
        _, names = await bench_checkpoint.write(pool, staging, host, streams=2)
        return await bench_checkpoint.restore(pool, staging, host, names, streams=2)
    _, unequal = asyncio.run(go())
    assert unequal == [f"{bench_checkpoint.PREFIX}-1"]
    pool.flip = None

    async def again():
        return await bench_checkpoint.restore(pool, staging, host, list(pool.objects), 2)
    assert asyncio.run(again())[1] == []


@pytest.mark.unit
def test_a_failed_put_stops_the_other_streams():
    """The first failed put is raised and the puts still running are stopped (the bench then
    deletes what it wrote, with nothing still writing)."""
    staging = bench_checkpoint.Staging(torch, "cpu", 4 * 4096, 4096)
    host = staging.host_buffer(staging.size)
    started, finished = [], []

    class FailingPool:
        async def put_stream(self, name, source):
            started.append(name)
            if name.endswith("-0"):
                await asyncio.sleep(0.01)
                raise RuntimeError("injected")
            await asyncio.sleep(5)
            finished.append(name)

    with pytest.raises(RuntimeError, match="injected"):
        asyncio.run(bench_checkpoint.write(FailingPool(), staging, host, streams=2))
    assert started == [f"{bench_checkpoint.PREFIX}-0", f"{bench_checkpoint.PREFIX}-1"]
    assert finished == []
