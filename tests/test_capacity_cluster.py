"""Capacity and quotas on a real cluster: a pool at its quota refuses the next write with the
quota error and takes it again once the quota is raised; OSDs filled to the full ratio refuse
writes cleanly, lose nothing, go on serving reads and deletes, and take writes again once space
is freed; `cairn df` and the health checks show it all."""

import hashlib
import os
import subprocess
import sys
import time

import pytest

from cairn.client import errors
from cairn.client.sync import SyncCluster

pytestmark = pytest.mark.cluster

FAST = ("osd.heartbeat_interval_s=0.5",)


def checks(cluster):
    return cluster.cairn("health", "detail")[1]["checks"]


def cli_put(cluster, pool, name, path):
    """`cairn put` as a person runs it: (exit status, stderr)."""
    result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                             "put", pool, name, path], capture_output=True, text=True, timeout=60)
    return result.returncode, result.stderr


def test_a_pool_at_its_quota_refuses_writes_until_the_quota_is_raised(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3, config=FAST)
    cluster.cairn("pool", "create", "q", "--replicated", "3", "--pg-num", "8")
    _, reply = cluster.cairn("pool", "set-quota", "q", "--max-objects", "10")
    assert reply["pool"]["max_objects"] == 10
    code, _ = cluster.cairn("pool", "set-quota", "q", check=False)
    assert code != 0                                     # nothing to set: refused
    client = SyncCluster(cluster.dir)
    try:
        pool = client.pool("q")
        for index in range(8):
            pool.put(f"o{index}", b"x" * 1000)
        cluster.wait_for("POOL_NEAR_QUOTA", lambda: "POOL_NEAR_QUOTA" in checks(cluster), 15)
        for index in range(8, 10):
            pool.put(f"o{index}", b"x" * 1000)
        cluster.wait_for("POOL_FULL", lambda: "POOL_FULL" in checks(cluster), 15)
        cluster.wait_for("the pool flagged at its quota", lambda: any(
            p.get("quota_full") for p in cluster.cairn("pool", "ls")[1]["pools"]), 15)
        time.sleep(0.5)                                  # the map reaches the OSDs
        check = checks(cluster)["POOL_FULL"]
        assert check["detail"] == ["pool q: 10 of 10 objects"], check
        with pytest.raises(errors.QuotaExceeded, match="pool q is at its quota"):
            pool.put("o10", b"x")
        path = tmp_path / "one"
        path.write_bytes(b"y" * 10)
        code, stderr = cli_put(cluster, "q", "o10", str(path))
        assert code == 1 and "error: quota exceeded: pool q is at its quota" in stderr, stderr
        assert pool.get("o9") == b"x" * 1000             # reads go on
        _, df = cluster.cairn("df")
        (row,) = [p for p in df["pools"] if p["name"] == "q"]
        assert (row["objects"], row["stored_bytes"], row["raw_bytes"]) == (10, 10_000, 30_000)
        assert row["quota_ratio"] == 1.0 and row["quota_full"] is True
        cluster.cairn("pool", "set-quota", "q", "--max-objects", "20")
        cluster.wait_for("the quota flag cleared", lambda: not any(
            p.get("quota_full") for p in cluster.cairn("pool", "ls")[1]["pools"]), 15)
        pool.put("o10", b"x")
        assert pool.get("o10") == b"x"
        cluster.wait_for("POOL_FULL cleared", lambda: "POOL_FULL" not in checks(cluster), 15)
    finally:
        client.close()


def test_osds_filled_to_the_full_ratio_refuse_writes_and_lose_nothing(local_cluster):
    cluster = local_cluster(hosts=3, device_size="128M", config=FAST)
    cluster.cairn("pool", "create", "f", "--replicated", "3", "--pg-num", "8")
    client = SyncCluster(cluster.dir)
    stored = {}
    try:
        pool = client.pool("f")
        refusal = None
        for index in range(200):
            data = os.urandom(2 << 20)
            try:
                pool.put(f"obj{index}", data)
            except errors.NoSpace as exc:
                refusal = str(exc)
                break
            stored[f"obj{index}"] = hashlib.sha256(data).hexdigest()
        assert refusal is not None, "128M devices took 400 MiB per OSD"
        assert refusal.startswith("no space: ") and "full ratio" in refusal, refusal
        cluster.wait_for("OSD_FULL", lambda: "OSD_FULL" in checks(cluster), 15)
        report = cluster.cairn("health", "detail")[1]
        assert report["status"] == "HEALTH_ERR"
        assert all(line.startswith("osd.") for line in report["checks"]["OSD_FULL"]["detail"])
        with pytest.raises(errors.NoSpace):                 # and it stays refused
            pool.put("one-more", b"z" * 4096)
        for name, digest in stored.items():                 # nothing acknowledged is lost
            assert hashlib.sha256(pool.get(name)).hexdigest() == digest, name
        _, df = cluster.cairn("df")
        assert all(osd["state"] == "full" for osd in df["osds"]), df["osds"]
        assert df["raw"]["used_ratio"] >= 0.95
        names = sorted(stored)
        for name in names[:len(names) // 3]:                # deletes work while full
            pool.delete(name)
            del stored[name]
        cluster.wait_for("OSD_FULL cleared", lambda: "OSD_FULL" not in checks(cluster), 15)
        cluster.wait_for("no OSD flagged full", lambda: not any(
            o["full"] for o in cluster.cairn("osd", "tree")[1]["osds"]), 15)
        time.sleep(0.5)                                     # the map reaches the OSDs
        pool.put("after", b"a" * 4096)
        assert pool.get("after") == b"a" * 4096
        for name, digest in stored.items():
            assert hashlib.sha256(pool.get(name)).hexdigest() == digest, name
        print(f"{len(stored) + len(names) // 3} objects of 2 MiB until refused: {refusal}")
    finally:
        client.close()
