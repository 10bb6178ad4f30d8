"""Real clusters from `cairn-cluster up`: status, OSD tree, pools on the right failure domains,
object maps, config, and clear errors for bad requests (monitor and OSDs are real processes on
127.0.0.N, devices are files)."""

import asyncio
import collections
import json
import os
import subprocess
import sys

import pytest

from cairn.common import frame, messenger, sessions
from cairn.common.frame import Kind
from tests.helpers import connect_as_admin, osd_statuses, run

pytestmark = pytest.mark.cluster


def test_small_cluster_status_tree_pools_map_config(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=2)
    _, status = cluster.cairn("status")
    assert status["health"] == "HEALTH_OK", status["checks"]
    assert status["osds"] == {"total": 6, "up": 6, "in": 6}
    assert status["pools"] == [] and status["checks"] == {}
    assert status["mons"]["leader"] == "mon.0"
    _, tree = cluster.cairn("osd", "tree")
    assert [(o["id"], o["host"], o["up"], o["in"]) for o in tree["osds"]] == \
        [(i, f"h{i // 2 + 1}", True, True) for i in range(6)]
    assert all(o["weight"] == 1.0 and o["rack"] is None for o in tree["osds"])

    cluster.cairn("pool", "create", "rbd", "--replicated", "3", "--pg-num", "64")
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "32")
    _, pools = cluster.cairn("pool", "ls")
    assert [(p["name"], p["kind"], p["size"], p["min_size"]) for p in pools["pools"]] == \
        [("ec", "erasure", 6, 5), ("rbd", "replicated", 3, 2)]
    host_of = {o["id"]: o["host"] for o in tree["osds"]}
    for index in range(6):
        _, where = cluster.cairn("map", "rbd", f"object-{index}")
        assert len({host_of[i] for i in where["osds"]}) == 3          # one copy per host
        assert where["primary"] == where["osds"][0] and 0 <= where["pg"] < 64
    _, where = cluster.cairn("map", "ec", "checkpoint-0")
    per_host = collections.Counter(host_of[i] for i in where["osds"])
    assert len(where["osds"]) == 6 and set(per_host.values()) == {2}

    cluster.cairn("config", "set", "osd.heartbeat_peers", "4")
    _, value = cluster.cairn("config", "get", "osd.heartbeat_peers")
    assert value["value"] == 4 and value["set"]
    _, status = cluster.cairn("status")
    assert status["pools"] == ["ec", "rbd"] and status["health"] == "HEALTH_OK"


def test_bad_requests_get_clear_errors_and_the_monitor_lives_on(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1)
    cases = [
        (["map", "nopool", "x"], "no pool named 'nopool'"),
        (["pool", "rm", "nopool"], "no pool named 'nopool'"),
        (["pool", "create", "p", "--replicated", "3", "--failure-domain", "planet"],
         "failure domain 'planet' is not one of"),
        (["pool", "create", "p", "--erasure", "18+6"], "needs 24 host failure domains"),
        (["pool", "create", "p", "--replicated", "2", "--failure-domain", "rack"],
         "no OSD has a rack in its location"),
        (["pool", "create", "p", "--erasure", "4+2", "--osds-per-domain", "3"],
         "would lose data when one host fails"),
        (["pool", "create", "p", "--replicated", "3", "--pg-num", "96"], "power of two"),
        (["osd", "out", "42"], "osd 42 does not exist"),
        (["config", "set", "mon.osd_grace_s", "-1"], "within 1.0..3600.0"),
        (["config", "get", "no.such"], "unknown config option"),
    ]
    for args, message in cases:
        status, reply = cluster.cairn(*args, check=False)
        assert status == 1, (args, reply)
        assert message in reply["message"], (args, reply)
    # Garbage on the monitor's port: one ERROR frame, then the connection is dropped.
    mon_addr = cluster.description["mons"][0]["addr"]

    async def send_garbage():
        host, port = messenger.parse_addr(mon_addr)
        for garbage in (b"\x16\x03\x01\x02\x00" + bytes(200),          # a TLS hello
                        frame.encode_bytes(Kind.REQUEST, 1, {"op": "status"})[:40] + bytes(8),
                        frame.encode_bytes(Kind.REQUEST, 1, {"op": "status"}, b"p")[:-1] + b"q"):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(garbage)
            await writer.drain()
            writer.write_eof()
            answer = await asyncio.wait_for(messenger.read_frame(reader), 5)
            assert answer.kind == Kind.ERROR and answer.header["error"] == "protocol", answer
            writer.close()
        connection = await messenger.connect(mon_addr)
        with pytest.raises(messenger.RequestFailed, match="requires authentication"):
            await connection.request({"op": "status"})
        entity, secret = sessions.find_credentials(cluster.dir)
        connection = await messenger.connect(
            mon_addr, authenticate=sessions.monitor_handshake(entity, secret))
        with pytest.raises(messenger.RequestFailed, match="unknown request"):
            await connection.request({"op": "drop_all_tables"})
        await connection.close()
    run(send_garbage())
    _, status = cluster.cairn("status")
    assert status["health"] == "HEALTH_OK" and status["pools"] == []


def test_eight_hosts_by_three_hold_18_plus_6_and_rack_replicas(local_cluster):
    """The issue's shape: 8 hosts x 3 OSDs in 2 racks; 18+6 with 3 shards per host survives a
    host loss (3 <= m), and a replicated pool keeps its copies in different racks."""
    cluster = local_cluster(hosts=8, osds_per_host=3, racks=2, device_size="128M")
    _, status = cluster.cairn("status")
    assert status["osds"] == {"total": 24, "up": 24, "in": 24}
    _, tree = cluster.cairn("osd", "tree")
    host_of = {o["id"]: o["host"] for o in tree["osds"]}
    rack_of = {o["id"]: o["rack"] for o in tree["osds"]}
    assert set(rack_of.values()) == {"r1", "r2"}
    cluster.cairn("pool", "create", "ckpt", "--erasure", "18+6", "--osds-per-domain", "3",
                  "--pg-num", "256")
    cluster.cairn("pool", "create", "meta", "--replicated", "2", "--failure-domain", "rack")
    for index in range(4):
        _, where = cluster.cairn("map", "ckpt", f"shard-{index}")
        assert len(set(where["osds"])) == 24
        assert max(collections.Counter(host_of[i] for i in where["osds"]).values()) == 3
        _, where = cluster.cairn("map", "meta", f"obj-{index}")
        assert len({rack_of[i] for i in where["osds"]}) == 2
    _, status = cluster.cairn("status")
    assert status["health"] == "HEALTH_OK", status["checks"]


def test_cluster_script_refuses_what_it_cannot_do(tmp_path, local_cluster):
    cluster = local_cluster(hosts=1, osds_per_host=1)
    again = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "up", "--dir",
                            cluster.dir], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "already running" in again.stderr
    result = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "kill", "--dir",
                             cluster.dir, "osd.7"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no daemon 'osd.7'" in result.stderr
    listing = json.loads(cluster.script("status", "--json").stdout)
    assert [(d["name"], d["running"]) for d in listing["daemons"]] == \
        [("mon.0", True), ("osd.0", True)]
    result = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "status", "--dir",
                             str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no cluster in" in result.stderr


def test_replicas_are_stored_with_the_checksums_their_frames_were_checked_with(local_cluster):
    """One read of each payload on every OSD: the primary stores the client's buffer with the
    block crcs of its frame check and forwards it with the frame's crc; the replicas store it
    with theirs. Reads and a deep scrub then find every checksum right."""
    from cairn.client.cluster import Cluster
    cluster = local_cluster(hosts=3, osds_per_host=1)
    cluster.cairn("pool", "create", "rbd", "--replicated", "3", "--pg-num", "8")
    objects = {f"obj-{size}": (bytes(range(251)) * (size // 251 + 1))[:size]
               for size in (1 << 20, 4 << 20, 300_000)}

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("rbd")
            for name, data in objects.items():
                await pool.put(name, data)
            # Again, into PGs whose collections now exist everywhere: every put and every
            # replica's write is answered from callbacks (no task of its own), still with the
            # block crcs of its frame check.
            puts, rep_puts = await fast_ops(cluster, "put"), await fast_ops(cluster, "rep_put")
            for name, data in objects.items():
                await pool.put(name, data)
            assert await fast_ops(cluster, "put") == puts + len(objects)
            assert await fast_ops(cluster, "rep_put") == rep_puts + 2 * len(objects)
            for name, data in objects.items():
                assert await pool.get(name) == data
        known = sum(status["store"]["known_crcs_total"]
                    for status in (await osd_statuses(cluster)).values())
        # The two objects of whole blocks, on all three OSDs, twice (the third one is copied
        # into whole blocks by the store, which computes its own).
        assert known == 2 * 3 * 2
        # A replica's write its store refuses is answered with the store's error, on the fast
        # path as on the usual one, and the OSD serves on.
        _, where = cluster.cairn("map", "rbd", "obj-300000")
        replica = next(o for o in cluster.description["osds"]
                       if o["id"] in where["osds"] and o["id"] != where["primary"])
        admin = await connect_as_admin(replica["addr"])
        try:
            status = (await admin.request({"op": "status"})).header
            with pytest.raises(messenger.RequestFailed) as refused:
                await admin.request({"op": "rep_put", "pool": int(where["pg_id"].split(".")[0]),
                                     "pg": where["pg"], "name": "n" * 5000, "version": 1 << 40,
                                     "epoch": status["epoch"], "from": where["primary"]},
                                    b"x" * 4096)
            assert refused.value.code == "invalid", refused.value
            assert (await admin.request({"op": "ping"})).header["id"] == replica["id"]
        finally:
            await admin.close()
        # A get whose range is not two non-negative integers is refused as invalid by the
        # primary, whether the fast path or the usual one would have taken it.
        primary = next(o for o in cluster.description["osds"] if o["id"] == where["primary"])
        admin = await connect_as_admin(primary["addr"])
        try:
            epoch = (await admin.request({"op": "status"})).header["epoch"]
            for offset, length in (("0", None), (-1, None), (0, -5), (0, 1.5), (None, 10)):
                header = {"op": "get", "pool": int(where["pg_id"].split(".")[0]),
                          "pg": where["pg"], "name": "obj-300000", "epoch": epoch,
                          "offset": offset}
                if length is not None:
                    header["length"] = length
                with pytest.raises(messenger.RequestFailed) as refused:
                    await admin.request(header)
                assert refused.value.code == "invalid", (offset, length, refused.value)
            reply = await admin.request({**header, "offset": 7, "length": 5})
            assert bytes(reply.payload) == objects["obj-300000"][7:12]
            # A put sent under a map older than the PG's interval (a request stuck in the
            # network while its client moved on) is refused as stale, and changes nothing.
            with pytest.raises(messenger.RequestFailed) as refused:
                await admin.request({"op": "put", "pool": header["pool"], "pg": where["pg"],
                                     "name": "obj-300000", "epoch": 1}, b"old" * 1000)
            assert refused.value.code == "stale", refused.value
            reply = await admin.request({**header, "offset": 0, "length": 12})
            assert bytes(reply.payload) == objects["obj-300000"][:12]
        finally:
            await admin.close()
    run(main())
    _, scrub = cluster.cairn("pg", "scrub", "rbd", "--deep")
    assert scrub["objects"] == 3 and scrub["errors"] == []


def test_a_damaged_copy_on_the_primary_is_read_around_and_repaired(local_cluster):
    """Bits flipped in the primary's own copy: a get still returns the right bytes (the
    primary's read fails its crc32c and reads another replica instead), for an object sent
    as a copy and one sent zero-copy from the store's buffer; a deep scrub names the damage
    and its repair leaves every copy right."""
    import random

    from cairn.client.cluster import Cluster
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="256M")
    cluster.cairn("pool", "create", "rep", "--replicated", "3", "--pg-num", "8")
    objects = {"small": random.Random(1).randbytes(5000),
               "large": random.Random(2).randbytes(300_000)}

    async def put_all():
        async with await Cluster.connect(cluster.dir) as client:
            for name, data in objects.items():
                await client.pool("rep").put(name, data)
    run(put_all())
    devices = {o["name"]: o["device"] for o in cluster.description["osds"]}
    for name in objects:
        _, where = cluster.cairn("map", "rep", name)
        flipped = subprocess.run(
            [sys.executable, "-m", "cairn.osd.cli", "bitrot", "--device",
             devices[f"osd.{where['primary']}"], "--object", name, "--collection",
             f"pg.{where['pg_id']}", "--offset", "100", "--json"],
            capture_output=True, text=True, timeout=60)
        assert flipped.returncode == 0, flipped.stderr
    code, report = cluster.cairn("pg", "scrub", "rep", "--deep", check=False)
    assert code == 1 and sorted((e["object"], e["osd"], e["kind"]) for e in report["errors"]) \
        == sorted((name, cluster.cairn("map", "rep", name)[1]["primary"], "checksum")
                  for name in objects), report

    async def read_back():
        async with await Cluster.connect(cluster.dir) as client:
            for name, data in objects.items():
                assert await client.pool("rep").get(name) == data, name
                for offset, length in ((100, 4096), (4000, 1000), (4096, 10)):
                    assert await client.pool("rep").get(name, offset, length) == \
                        data[offset:offset + length], (name, offset, length)
    fast_before = run(fast_ops(cluster))
    run(read_back())
    # The gets that cover block 0 went the usual way: the fast path (answered from the device
    # read's callback) saw its crc mismatch and handed each over. The ranges in block 1 alone
    # (undamaged) were answered fast.
    assert run(fast_ops(cluster)) == fast_before + 2
    # The reads queued the damaged copies for repair; a deep scrub's repair finishes the rest.
    code, report = cluster.cairn("pg", "scrub", "rep", "--deep", "--repair", check=False)
    assert code == 0 and report["repaired"] == len(report["errors"]) <= 2, report
    code, report = cluster.cairn("pg", "scrub", "rep", "--deep", check=False)
    assert code == 0 and report["errors"] == [], report
    run(read_back())
    # With the copies whole, all eight gets (whole and ranges, copied and zero-copy) were fast.
    assert run(fast_ops(cluster)) == fast_before + 2 + 8


async def fast_ops(cluster, op="get"):
    """Ops of one kind the cluster's OSDs answered on their fast path so far."""
    return sum(status["fast_ops"][op] for status in (await osd_statuses(cluster)).values())


def test_a_small_object_read_again_is_answered_from_its_primary_read_cache(local_cluster):
    """Gets fill the primary's read cache (puts never do); a second get of a small object is
    answered from it, a large one is read again; an overwrite is seen at once; an OSD started
    with --read-cache 0 (cairn-cluster up --read-cache 0) keeps nothing."""
    from cairn.client.cluster import Cluster

    async def read_cache(cluster):
        totals = collections.Counter()
        for status in (await osd_statuses(cluster)).values():
            totals.update(status["store"]["read_cache"])
        return totals

    async def main(cluster, cached):
        objects = {"small": b"s" * 4096, "odd": b"o" * 60_000, "large": b"L" * 200_000}
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("rbd")
            for name, data in objects.items():
                await pool.put(name, data)
            assert (await read_cache(cluster))["objects"] == 0
            for _ in range(2):
                for name, data in objects.items():
                    assert await pool.get(name) == data
                    assert await pool.get(name, 100, 50) == data[100:150]
            after = await read_cache(cluster)
            assert after["objects"] == (2 if cached else 0)
            assert after["bytes"] == (4096 + 60_000 if cached else 0)
            # Whole gets and ranges of the two small objects, after their first whole get.
            assert after["hits_total"] == (2 * 2 + 1 * 2 if cached else 0), after
            await pool.put("small", b"new")
            assert await pool.get("small") == b"new"
            assert await pool.get("small") == b"new"

    for cached, extra in ((True, ()), (False, ("--read-cache", "0"))):
        cluster = local_cluster(hosts=3, osds_per_host=1, extra=extra)
        cluster.cairn("pool", "create", "rbd", "--replicated", "3", "--pg-num", "8")
        run(main(cluster, cached))


def test_an_osd_receives_writes_and_reads_its_device_into_one_set_of_buffers(local_cluster):
    """A large payload is received into a slab buffer and written from it as it is; the OSD's
    device reads take their buffers from that same pool, so reading the objects back makes no
    slab of its own (two pools each kept the slabs of their own busiest moment: 176 MiB of
    slabs per OSD after the acceptance's 4 MiB runs)."""
    from cairn.client.cluster import Cluster

    async def slab_bytes(cluster):
        return {osd: status["store"]["device"]["buffers"]["slab_bytes_total"]
                for osd, status in (await osd_statuses(cluster)).items()}

    async def main(cluster):
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("one")
            before = await slab_bytes(cluster)
            data = {f"big{i}": os.urandom(4 << 20) for i in range(4)}
            for name, payload in data.items():          # one at a time: one buffer in use
                await pool.put(name, payload)
            written = await slab_bytes(cluster)
            assert sum(written.values()) > sum(before.values())     # received into slabs
            for name, payload in data.items():
                assert await pool.get(name) == payload
            assert await slab_bytes(cluster) == written             # read into the same ones

    cluster = local_cluster(hosts=1, osds_per_host=2)
    cluster.cairn("pool", "create", "one", "--replicated", "1", "--pg-num", "4")
    run(main(cluster))
