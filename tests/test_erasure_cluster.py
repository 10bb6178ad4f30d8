"""Erasure-coded pools end to end on real processes: 4+2 on 3 hosts x 2 OSDs (2 shards per host).

Goals: every object size round-trips (0 and 1 byte, a partial stripe, several stripes, a
striped put_stream), ranges read right, `stat` names the shards present; with one and two OSDs
down every object still reads byte-identical (degraded reads decode), with three down a read
that needs a lost shard fails with DataUnavailable naming the PG and shards (never wrong bytes),
and writes below min_size are refused; after the OSDs return, recovery rebuilds their shards so
that two *other* OSDs can then be lost. Bit rot in one shard and in one replica is read around,
found by a deep scrub with the right OSD and kind, shown as PG_INCONSISTENT, and repaired.
Large reads fetch the data shards from their holders, and fall back through the primary when
the plan is overtaken.
"""

import json
import random
import subprocess
import sys

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from cairn.common.messenger import RequestFailed
from cairn.common.placement import stable_pg
from tests.helpers import connect_as_admin, osd_statuses, run

pytestmark = pytest.mark.cluster

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5", "scrub.interval_s=0")
SIZES = [0, 1, 4096, 1 << 20, (5 << 20) + 1, 333]


def blob(i):
    return random.Random(i).randbytes(SIZES[i % len(SIZES)])


def test_erasure_pool_round_trips_survives_losses_and_rebuilds_shards(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M", config=FAST)
    _, created = cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain",
                               "2", "--pg-num", "8")
    assert created["pool"]["backend"] == "isa_l_rs_cauchy" and created["pool"]["min_size"] == 5

    async def write(pool, first, count):
        for i in range(first, first + count):
            await pool.put(f"o{i}", blob(i))

    async def check_all(pool, count):
        for i in range(count):
            assert await pool.get(f"o{i}") == blob(i), i

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("ec")
            await write(pool, 0, 24)
            await check_all(pool, 24)
            data = blob(4)                                      # 5 MiB + 1: two stripes
            assert await pool.get("o4", (4 << 20) - 10, 30) == data[(4 << 20) - 10:(4 << 20) + 20]
            assert await pool.get("o4", len(data) - 5, 100) == data[-5:]
            big = random.Random(99).randbytes(9 * 1024 * 1024 + 7)
            await pool.put_stream("big", big, stripe_bytes=2 << 20)
            assert await pool.get("big") == big
            info = await pool.stat("o3")
            assert info.size == 1 << 20 and info.shards == (0, 1, 2, 3, 4, 5)
            assert info.shards_needed == 4

            cluster.script("kill", "osd.1")
            cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], 20)
            await check_all(pool, 24)                           # degraded: one shard gone
            await write(pool, 24, 12)                           # 5 of 6 up: min_size 5 holds
            cluster.script("kill", "osd.2")
            cluster.wait_for("osd.2 down", lambda: not cluster.osd(2)["up"], 20)
            await check_all(pool, 36)                           # two shards gone
            with pytest.raises(errors.PoolUnavailable, match="fewer than min_size 5"):
                await pool.put("refused", b"x")
            cluster.script("kill", "osd.3")
            cluster.wait_for("osd.3 down", lambda: not cluster.osd(3)["up"], 20)
            wrong = unavailable = 0
            for i in range(36):
                try:
                    wrong += await pool.get(f"o{i}") != blob(i)
                except errors.DataUnavailable as exc:
                    assert "readable shards" in str(exc) and "4 needed" in str(exc), exc
                    unavailable += 1
            assert wrong == 0 and unavailable > 0, (wrong, unavailable)

            for name in ("osd.1", "osd.2", "osd.3"):
                cluster.script("restart", name)
            cluster.wait_for("recovery ends", cluster.clean, 60)
            await write(pool, 36, 6)
            cluster.script("kill", "osd.0")                     # two others: the rebuilt
            cluster.script("kill", "osd.5")                     # shards must carry the reads
            cluster.wait_for("osd.0 and osd.5 down",
                             lambda: not cluster.osd(0)["up"] and not cluster.osd(5)["up"], 20)
            await check_all(pool, 42)
            assert await pool.get("big") == big
    run(main())
    _, status = cluster.cairn("status")
    assert status["objects"]["degraded"] > 0                    # two down: counted degraded


def test_bitrot_is_read_around_found_by_deep_scrub_and_repaired(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "8")
    cluster.cairn("pool", "create", "rep", "--replicated", "3", "--pg-num", "8")
    payload = random.Random(5).randbytes(300_000)

    async def put_all():
        async with await Cluster.connect(cluster.dir) as client:
            for pool in ("ec", "rep"):
                for i in range(6):
                    await client.pool(pool).put(f"obj{i}", payload)
    run(put_all())
    devices = {o["name"]: o["device"] for o in cluster.description["osds"]}
    _, ec_where = cluster.cairn("map", "ec", "obj2")
    _, rep_where = cluster.cairn("map", "rep", "obj2")
    shard_osd = ec_where["osds"][1]                       # a data shard, not the primary's
    replica_osd = rep_where["osds"][2]                    # a replica, not the primary
    for osd, where in ((shard_osd, ec_where), (replica_osd, rep_where)):
        flipped = subprocess.run(
            [sys.executable, "-m", "cairn.osd.cli", "bitrot", "--device", devices[f"osd.{osd}"],
             "--object", "obj2", "--collection", f"pg.{where['pg_id']}", "--offset", "5000",
             "--json"], capture_output=True, text=True, timeout=60)
        assert flipped.returncode == 0, flipped.stderr

    code, report = cluster.cairn("pg", "scrub", "ec", check=False)        # light: no reads
    assert code == 0 and report["errors"] == []
    for pool, osd, shard in (("ec", shard_osd, 1), ("rep", replica_osd, None)):
        code, report = cluster.cairn("pg", "scrub", pool, "--deep", check=False)
        assert code == 1, report
        assert report["errors"] == [{"pg": (ec_where if pool == "ec" else rep_where)["pg_id"],
                                     "object": "obj2", "osd": osd, "shard": shard,
                                     "kind": "checksum"}], report
        assert report["objects"] == 6 and report["pgs"] == 8 and report["repaired"] == 0
    cluster.wait_for("PG_INCONSISTENT shown", lambda: "PG_INCONSISTENT" in cluster.cairn(
        "status")[1]["checks"], 15)

    async def read_back():           # a normal read still returns the right bytes
        async with await Cluster.connect(cluster.dir) as client:
            for pool in ("ec", "rep"):
                assert await client.pool(pool).get("obj2") == payload
    run(read_back())
    for pool in ("ec", "rep"):
        code, report = cluster.cairn("pg", "scrub", pool, "--deep", "--repair", check=False)
        assert code == 0 and report["repaired"] == len(report["errors"]) <= 1, report
        code, report = cluster.cairn("pg", "scrub", pool, "--deep", check=False)
        assert code == 0 and report["errors"] == [], report
    cluster.wait_for("PG_INCONSISTENT cleared", lambda: "PG_INCONSISTENT" not in cluster.cairn(
        "status")[1]["checks"], 15)
    _, listed = cluster.cairn("stat", "ec", "obj2")
    assert listed["shards"] == [0, 1, 2, 3, 4, 5] and listed["shards_needed"] == 4
    assert json.dumps(listed)

    async def forged_shards():
        # A shard message whose payload does not fit its geometry is refused (not stored, the
        # member serves on); the right length, padded or not, passes that check.
        addr = next(o["addr"] for o in cluster.description["osds"] if o["id"] == shard_osd)
        _, where = cluster.cairn("map", "ec", "obj2")
        header = {"op": "rep_put", "pool": int(where["pg_id"].split(".")[0]), "pg": where["pg"],
                  "name": "forged", "version": 1, "epoch": where["epoch"],
                  "from": where["primary"], "shard": where["osds"].index(shard_osd),
                  "ec": [300_000, 1 << 20]}
        connection = await connect_as_admin(addr)
        try:
            for wrong in (b"x" * 1000, bytes(75_000 + 80 + 4096)):
                with pytest.raises(RequestFailed, match=r"shard of an object of 300000 bytes"):
                    await connection.request(header, wrong)
            assert (await connection.request({"op": "status"})).header["id"] == shard_osd
        finally:
            await connection.close()
        async with await Cluster.connect(cluster.dir) as client:
            with pytest.raises(errors.ObjectNotFound):
                await client.pool("ec").get("forged")
    run(forged_shards())


def test_large_reads_fetch_data_shards_from_their_holders(local_cluster, tmp_path):
    """A large read of an erasure-coded object gets a plan from the primary and the pieces
    from the data shards' holders (`shard_read`); the bytes are the object's for whole objects,
    ranges across stripes and striped objects; a small read goes through the primary; a plan
    overtaken by a write, a wrong interval or bad ranges are refused, the client falls back and
    still reads the right bytes; caps and a down holder hold."""
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "8")
    reader = str(tmp_path / "reader.keyring")
    cluster.cairn("auth", "add", "client.team", "--caps", "mon=r", "--caps",
                  "osd=r pool=ec prefix=team/", "--keyring-out", reader)
    rng = random.Random(5)
    objects = {"four": rng.randbytes(4 << 20), "team/five": rng.randbytes((5 << 20) + 1),
               "small": rng.randbytes(100_000)}

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("ec")
            for name, data in objects.items():
                await pool.put(name, data)
            streamed = rng.randbytes((9 << 20) + 7)
            await pool.put_stream("streamed", streamed, stripe_bytes=4 << 20)
            before = client.direct_reads_total
            assert await pool.get("four") == objects["four"]
            assert await pool.get("team/five") == objects["team/five"]
            five = objects["team/five"]
            assert await pool.get("team/five", 1000, 4 << 20) == five[1000:1000 + (4 << 20)]
            assert await pool.get("streamed") == streamed           # stripes 4, 4 and 1 MiB
            assert client.direct_reads_total - before == 3 + 3
            assert await pool.get("small") == objects["small"]      # below 1 MiB: via primary
            assert await pool.get("four", 0, 4096) == objects["four"][:4096]
            assert client.direct_reads_total - before == 6 and client.direct_fallbacks_total == 0

            # A write between the plan and the fetch: the members refuse the old version.
            reply = await client._op("ec", "four", {"op": "get", "offset": 0, "direct": True})
            plan = reply.header["direct"]
            assert {extent[1] for extent in plan["extents"]} - {plan["from"]}
            objects["four"] = rng.randbytes(4 << 20)
            await pool.put("four", objects["four"])
            with pytest.raises(RequestFailed) as refused:
                await client._fetch_direct(client.map.pools["ec"], "four", reply, plan)
            assert refused.value.code == "stale" and "not version" in refused.value.message
            assert await pool.get("four") == objects["four"]

            # Straight to a holder: another interval, bad ranges, a shard it does not hold.
            reply = await client._op("ec", "four", {"op": "get", "offset": 0, "direct": True})
            plan = reply.header["direct"]
            shard, osd = next((e[0], e[1]) for e in reply.header["direct"]["extents"]
                              if e[1] != plan["from"])
            pool_id = client.map.pools["ec"]["id"]
            base = {"op": "shard_read", "pool": pool_id, "pg": stable_pg("four", 8),
                    "epoch": client.map.epoch, "name": "four", "shard": shard,
                    "version": reply.header["version"], "interval": plan["interval"],
                    "ranges": [[80, 4096]]}
            connection = await client._connection(osd)
            got = await connection.request(base)
            index = [e[0] for e in plan["extents"]].index(shard)
            assert bytes(got.payload) == objects["four"][index << 20:(index << 20) + 4096]
            for change, code in (({"interval": plan["interval"] - 1}, "stale"),
                                 ({"shard": (shard + 1) % 6}, "stale"),
                                 ({"ranges": [[80, -1]]}, "invalid"),
                                 ({"ranges": []}, "invalid"),
                                 ({"version": "x"}, "invalid")):
                with pytest.raises(RequestFailed) as refused:
                    await connection.request(dict(base, **change))
                assert refused.value.code == code, (change, refused.value)
            served = known_crcs = 0
            for status in (await osd_statuses(cluster)).values():
                served += status["direct_reads"]
                known_crcs += status["store"]["known_crcs_total"]
            assert served >= 6 * 3
            # Members stored every shard of 64 KiB or more with the block crcs of its frame
            # check (5 remote shards of each of six objects: four twice, five, three stripes),
            # and every read above checked them.
            assert known_crcs >= 5 * 6

        async with await Cluster.connect(cluster.dir, name="client.team",
                                         keyring=reader) as team:
            assert await team.pool("ec").get("team/five") == objects["team/five"]
            assert team.direct_reads_total == 1
            connection = await team._connection(osd)
            with pytest.raises(RequestFailed) as refused:
                await connection.request(base)                   # "four" is not under team/
            assert refused.value.code == "permission_denied"

        cluster.script("kill", f"osd.{osd}")
        cluster.wait_for(f"osd.{osd} down", lambda: not cluster.osd(osd)["up"], 20)
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("ec")
            for name, data in objects.items():
                assert await pool.get(name) == data, name
            assert await pool.get("streamed") == streamed

    run(main())
