"""The client library and `cairn put/get/...` against a real local cluster (3 hosts x 1 OSD,
replicated size 3, min_size 2)."""

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from cairn.common.placement import stable_pg
from tests.helpers import run

pytestmark = pytest.mark.cluster

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


def test_objects_round_trip_with_stripes_ranges_listing_and_typed_errors(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("data")
            blobs = {f"obj-{i}": os.urandom(i * 1000 + 1) for i in range(40)}
            versions = await asyncio.gather(*(pool.put(n, b) for n, b in blobs.items()))
            assert all(isinstance(v, int) and v > 0 for v in versions)
            for name, blob in blobs.items():
                assert await pool.get(name) == blob
            assert await pool.get("obj-30", 100, 50) == blobs["obj-30"][100:150]
            stat = await pool.stat("obj-7")
            assert stat.size == 7001 and not stat.striped
            await pool.put("obj-7", b"replaced")
            assert await pool.get("obj-7") == b"replaced"
            assert (await pool.stat("obj-7")).version > stat.version

            big = os.urandom(9 * 1024 * 1024 + 123)
            assert await pool.put_stream("big", big, stripe_bytes=1024 * 1024) == len(big)
            assert await pool.get("big") == big
            chunks = [chunk async for chunk in pool.get_stream("big")]
            assert len(chunks) == 10 and b"".join(chunks) == big
            assert await pool.get("big", 1024 * 1024 - 10, 30) == big[1024 * 1024 - 10:
                                                                       1024 * 1024 + 20]
            assert (await pool.stat("big")).size == len(big)
            smaller = os.urandom(100)
            await pool.put_stream("big", smaller, stripe_bytes=1024 * 1024)   # overwrite
            assert await pool.get("big") == smaller

            names, page = [], None
            while True:
                batch, page = await pool.list(page=page, limit=7)
                names += batch
                if page is None:
                    break
            assert sorted(names) == sorted([*blobs, "big"])         # no stripe objects listed
            prefixed, _ = await pool.list(prefix="obj-3")
            assert sorted(prefixed) == sorted(n for n in blobs if n.startswith("obj-3"))

            async def stored(prefix):           # every PG's objects, stripes included
                names = []
                for pg_index in range(client.map.pools[pool.name]["pg_num"]):
                    names += (await pool._list_pg(pg_index, prefix, None, 1000)).header["names"]
                return names
            assert len(await stored("big")) == 2                   # the manifest and its stripe
            await pool.delete("big")
            assert await stored("big") == []                       # its stripes went with it
            await pool.delete("obj-1")
            with pytest.raises(errors.ObjectNotFound):
                await pool.get("obj-1")
            with pytest.raises(errors.ObjectNotFound):
                await pool.get("big")
            with pytest.raises(errors.ObjectNotFound):
                await pool.delete("never-was")
            with pytest.raises(errors.PoolNotFound):
                client.pool("nopool")
            leftovers, _ = await pool.list(limit=1000)
            assert "big" not in leftovers and len(leftovers) == 39
    run(main())

    # The blocking wrapper: the same operations from plain (non-asyncio) code.
    from cairn.client.sync import connect
    with connect(cluster.dir) as blocking:
        pool = blocking.pool("data")
        pool.put("sync-obj", b"from a thread")
        assert pool.get("sync-obj") == b"from a thread"
        assert pool.stat("sync-obj").size == 13
        pool.put_stream("sync-big", os.urandom(3 * 1024 * 1024), stripe_bytes=1024 * 1024)
        assert len(b"".join(pool.get_stream("sync-big"))) == 3 * 1024 * 1024
        pool.delete("sync-obj")
        with pytest.raises(errors.ObjectNotFound):
            pool.get("sync-obj")
        with pytest.raises(errors.PoolNotFound):
            blocking.pool("nopool")
        pool.delete("sync-big")

    # The command line, with a file bigger than one stripe.
    source = os.path.join(cluster.dir, "model.bin")
    with open(source, "wb") as handle:
        handle.write(os.urandom(6 * 1024 * 1024 + 5))
    _, stored = cluster.cairn("put", "data", "model.bin", source)
    assert stored["size"] == 6 * 1024 * 1024 + 5
    target = os.path.join(cluster.dir, "model.back")
    cluster.cairn("get", "data", "model.bin", target)
    assert open(target, "rb").read() == open(source, "rb").read()
    _, info = cluster.cairn("stat", "data", "model.bin")
    assert info["striped"] and info["size"] == stored["size"]
    _, listing = cluster.cairn("ls", "data", "--prefix", "model")
    assert listing["names"] == ["model.bin"]
    cluster.cairn("rm", "data", "model.bin")
    status, reply = cluster.cairn("get", "data", "model.bin", target, check=False)
    assert status == 1 and reply["error"] == "not_found"
    piped = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                            "put", "data", "piped"], input=b"from stdin", capture_output=True,
                           timeout=60)
    assert piped.returncode == 0, piped.stderr
    out = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                          "get", "data", "piped"], capture_output=True, timeout=60)
    assert out.stdout == b"from stdin"
    # "-" names standard input and output too, never a file called "-"
    dashed = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                             "put", "data", "dashed", "-"], input=b"dash in", capture_output=True,
                            timeout=60, cwd=str(tmp_path))
    assert dashed.returncode == 0, dashed.stderr
    out = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                          "get", "data", "dashed", "-"], capture_output=True, timeout=60,
                         cwd=str(tmp_path))
    assert out.stdout == b"dash in" and not os.path.exists(os.path.join(tmp_path, "-"))


def test_writes_below_min_size_are_refused_and_reads_continue(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="256M", config=FAST)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--min-size", "2",
                  "--pg-num", "8")

    async def write_all(pool, value):
        await asyncio.gather(*(pool.put(f"k{i}", value) for i in range(20)))

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("data")
            await write_all(pool, b"one")
            cluster.script("kill", "osd.1")
            cluster.script("kill", "osd.2")
            cluster.wait_for("two OSDs down", lambda: cluster.cairn("status")[1]["osds"]["up"]
                             == 1, 15)
            with pytest.raises(errors.PoolUnavailable, match="min_size"):
                await pool.put("k0", b"two")
            assert [await pool.get(f"k{i}") for i in range(20)] == [b"one"] * 20
            _, status = cluster.cairn("status")
            assert status["health"] == "HEALTH_ERR" and "PG_UNAVAILABLE" in status["checks"]
            cluster.script("restart", "osd.1")
            await write_all(pool, b"three")             # retried until the PGs are active
            cluster.script("restart", "osd.2")
            cluster.wait_for("all active", lambda: cluster.cairn("status")[1]["pg_states"]
                             == {"active": 8}, 20)
            for i in range(20):
                assert await pool.get(f"k{i}") == b"three"
    run(main())
    bench = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                            "--cluster", cluster.dir, "--pool", "data", "--op", "write",
                            "--size", "64K", "--concurrency", "4", "--seconds", "1", "--json"],
                           capture_output=True, text=True, timeout=60)
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout.strip().splitlines()[-1])
    assert result["op"] == "write" and result["ops"] > 0 and result["size_bytes"] == 65536
    assert set(result) >= {"MBps", "iops", "lat_ms_avg", "lat_ms_p99", "lat_ms_max", "seconds"}
    seq = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                          "--cluster", cluster.dir, "--pool", "data", "--op", "seq", "--size",
                          "64K", "--seconds", "1", "--json", "--cleanup"], capture_output=True,
                         text=True, timeout=60)
    assert seq.returncode == 0, seq.stderr
    assert json.loads(seq.stdout.strip().splitlines()[-1])["ops"] > 0

    # A dataloader's set: 60 objects of 1-20 KiB written once each, then random reads of them
    # (each read checks the size its number gives); CPU per 1,000 ops by daemon kind.
    def bench(*args):
        done = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                               "--cluster", cluster.dir, "--pool", "data", "--json", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])
    filled = bench("--op", "write", "--size-dist", "1K-20K", "--objects", "60", "--fill")
    assert filled["ops"] == 60 and 512 <= filled["size_bytes"] <= 20480
    assert set(filled["cpu_s_per_1000_ops"]) == {"client", "osd", "mon"}
    assert filled["cpu_s_per_1000_ops"]["osd"] > 0
    assert filled["lat_ms_p50"] <= filled["lat_ms_p99"] <= filled["lat_ms_p999"]
    rand = bench("--op", "rand", "--seconds", "1", "--concurrency", "4")
    assert rand["ops"] > 0 and rand["size_bytes"] == filled["size_bytes"]
    async def listed():
        async with await Cluster.connect(cluster.dir) as client:
            names, _ = await client.pool("data").list(prefix="bench.")
            return [name for name in names if name != "bench.last"]
    assert len(run(listed())) == 60
    # seq reads each object once and stops (as rados bench seq), long before its time is up.
    seq = bench("--op", "seq", "--seconds", "30", "--cleanup")
    assert seq["ops"] == 60 and seq["seconds"] < 30
    assert run(listed()) == []
    refused = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                              "--cluster", cluster.dir, "--pool", "data", "--op", "rand",
                              "--fill"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--fill writes the --objects N objects" in refused.stderr


def test_benches_run_at_once_on_one_pool_keep_to_their_own_runs(local_cluster):
    """Several clients benching one pool at once (as a many-client load test does): each
    `--run-name` records its run apart, reads back its own objects and cleans up only them;
    a run without one whose shared record another run already removed still ends cleanly."""
    cluster = local_cluster(hosts=3, osds_per_host=1)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")

    def start(*args):
        return subprocess.Popen([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                                 "--cluster", cluster.dir, "--pool", "data", "--json", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(process):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])
    writers = [start("--op", "write", "--size", "4K", "--objects", str(count), "--fill",
                     "--run-name", name) for name, count in (("a", 30), ("b", 40))]
    assert [finish(process)["ops"] for process in writers] == [30, 40]

    async def listed():
        async with await Cluster.connect(cluster.dir) as client:
            names, _ = await client.pool("data").list(prefix="bench.")
            return names
    names = run(listed())
    assert {"bench.last.a", "bench.last.b"} <= set(names) and len(names) == 72
    read_a = finish(start("--op", "seq", "--seconds", "0.5", "--run-name", "a", "--cleanup"))
    assert read_a["ops"] > 0
    assert len(run(listed())) == 41 and "bench.last.b" in run(listed())
    missing = start("--op", "seq", "--seconds", "0.5", "--run-name", "a")
    missing.communicate(timeout=60)
    assert missing.returncode != 0
    both = [start("--op", "write", "--size", "4K", "--seconds", "1", "--cleanup")
            for _ in range(2)]
    assert all(finish(process)["ops"] > 0 for process in both)
    finish(start("--op", "seq", "--seconds", "0.5", "--run-name", "b", "--cleanup"))
    assert run(listed()) == []
    bad = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                          "--cluster", cluster.dir, "--pool", "data", "--run-name", "a/b"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--run-name" in bad.stderr


def test_a_timed_bench_write_never_fills_the_cluster(local_cluster):
    """Without --objects, `cairn bench cluster --op write` takes new names only up to half the
    pool's room below the nearfull ratio, then overwrites them in turn: 1 MiB writes for 4 s
    would fill 64 MiB devices several times over, and the run ends with every OSD below
    nearfull and the objects it says it left."""
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="64M")
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    cluster.wait_for("capacity reported", lambda: all(
        osd["total_bytes"] for osd in cluster.cairn("df")[1]["osds"]), 20)
    done = subprocess.run([sys.executable, "-m", "cairn.client.cli", "bench", "cluster",
                           "--cluster", cluster.dir, "--pool", "data", "--op", "write", "--size",
                           "1M", "--concurrency", "4", "--seconds", "4", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cap = int(re.search(r"at most (\d+) objects", done.stderr).group(1))
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert 4 <= cap <= 31 and result["ops"] > cap, (cap, result["ops"])

    async def listed():
        async with await Cluster.connect(cluster.dir) as client:
            names, _ = await client.pool("data").list(prefix="bench.")
            return [name for name in names if name != "bench.last"]
    assert len(run(listed())) == cap
    df = cluster.cairn("df")[1]
    assert all(osd["state"] == "ok" for osd in df["osds"]), df["osds"]


def test_put_many_and_get_many_group_by_primary_with_bounded_depth(local_cluster):
    """A dataloader's batch: `from cairn.client import connect` (the name one guesses first),
    many small objects stored and read back grouped by primary OSD, never more than `depth`
    in flight to one primary, typed errors raised or returned per object."""
    from cairn.client import connect
    cluster = local_cluster(hosts=3, osds_per_host=1)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")
    objects = {f"sample-{index:04d}": os.urandom(index % 7 * 1000 + 1) for index in range(200)}

    async def main():
        async with await connect(cluster.dir) as client:
            pool = client.pool("data")
            in_flight, most = {}, {}
            put = pool.put

            async def counted(name, data):
                primary = client._acting("data", stable_pg(name, 16)).primary
                in_flight[primary] = in_flight.get(primary, 0) + 1
                most[primary] = max(most.get(primary, 0), in_flight[primary])
                try:
                    return await put(name, data)
                finally:
                    in_flight[primary] -= 1
            pool.put = counted
            versions = await pool.put_many(objects, depth=3)
            assert list(versions) == list(objects) and all(v > 0 for v in versions.values())
            assert len(most) == 3 and max(most.values()) == 3        # every primary, depth 3
            assert await pool.get_many(list(objects)) == objects
            with pytest.raises(errors.ObjectNotFound):
                await pool.get_many(["sample-0001", "missing"])
            got = await pool.get_many(["sample-0002", "missing"], return_exceptions=True)
            assert got["sample-0002"] == objects["sample-0002"]
            assert isinstance(got["missing"], errors.ObjectNotFound)
            with pytest.raises(ValueError, match="depth"):
                await pool.put_many({"x": b"1"}, depth=0)
            assert await pool.put_many({}) == {}
    run(main())
