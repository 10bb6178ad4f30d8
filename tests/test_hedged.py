"""Hedged reads on a real cluster (cluster tier; the throttled-disk tests are in
test_faults_hedged.py): a replica serves a `replica` get at the version its primary names
settled, and refuses one when it is not a member of the object's PG; a healthy cluster under
load sends hedges for at most the budget's share of its reads, and `cairn osd perf` shows the
reads and the hedges the replicas served."""

import asyncio
import subprocess
import sys

import pytest

from cairn.client.cluster import Cluster
from cairn.common import hedge
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.common.placement import stable_pg
from cairn.mon import health
from tests.helpers import run

pytestmark = pytest.mark.cluster


def test_a_replica_serves_settled_versions_and_only_as_a_member(local_cluster):
    cluster = local_cluster(hosts=4)
    cluster.cairn("pool", "create", "r", "--replicated", "2", "--pg-num", "8")

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("r")
            await pool.put("x", b"first")
            await pool.put("x", b"second")
            info = client.map.pools["r"]
            pg = stable_pg("x", info["pg_num"])
            acting = client._acting("r", pg)
            replica = next(osd for osd in acting.members if osd != acting.primary)
            outsider = next(osd for osd in client.map.osds if osd not in acting.members)
            request = {"op": "get", "name": "x", "offset": 0, "pool": info["id"], "pg": pg,
                       "epoch": client.map.epoch, "replica": True}
            reply = await (await client._connection(replica)).request(request)
            assert bytes(reply.payload) == b"second"
            assert reply.header["version"] == (await pool.stat("x")).version
            with pytest.raises(RequestFailed) as refused:
                await (await client._connection(outsider)).request(request)
            assert refused.value.code == Code.STALE, refused.value
            with pytest.raises(RequestFailed) as refused:        # the primary is no replica
                await (await client._connection(acting.primary)).request(request)
            assert refused.value.code == Code.STALE, refused.value
    run(main())


def test_a_healthy_cluster_under_load_stays_within_the_hedge_budget(local_cluster):
    cluster = local_cluster(hosts=3)
    cluster.cairn("pool", "create", "r", "--replicated", "3", "--pg-num", "16")

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("r")
            names = [f"o{index}" for index in range(200)]
            await asyncio.gather(*(pool.put(name, bytes(65536)) for name in names))
            reads = 0
            stop_at = asyncio.get_running_loop().time() + 5.0

            async def reader(offset):
                nonlocal reads
                while asyncio.get_running_loop().time() < stop_at:
                    await pool.get(names[(offset + reads * 7) % len(names)])
                    reads += 1
            await asyncio.gather(*(reader(offset) for offset in range(16)))
            return reads, client.hedger.counts()
    reads, counts = run(main())
    print(f"{reads} reads at 16 in flight, hedges {counts}")
    assert reads > 500
    assert counts["sent"] <= hedge.HEDGE_SHARE * reads + hedge.HEDGE_BURST, (reads, counts)

    # `cairn osd perf` shows the reads on the devices and, once the OSDs' next heartbeats are
    # in, every hedge and steered read a replica served.
    served = counts["won"] + counts["steered"] - counts["refused"]
    seen = {}

    def reported():
        seen["perf"] = cluster.cairn("osd", "perf")[1]
        osds = seen["perf"]["osds"]
        return sum(osd["hedges"].get("served", 0) for osd in osds) >= served and \
            any(osd["device"].get("read", {}).get("ops") for osd in osds)
    cluster.wait_for(f"osd perf with the reads and {served} served hedges", reported, 15)
    perf = seen["perf"]
    assert [osd["id"] for osd in perf["osds"]] == [0, 1, 2]
    for osd in perf["osds"]:
        assert osd["up"] and not osd["slow"] and osd["reads_around_per_s"] >= 0
        assert set(osd["hedges"]) == set(health.HEDGE_FIELDS), osd
    text = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", cluster.dir,
                           "osd", "perf"], capture_output=True, text=True, timeout=60).stdout
    assert text.splitlines()[0].split()[:5] == ["ID", "HOST", "STATUS", "READ", "ms"], text
    assert len(text.splitlines()) == 5 and "3 OSDs" in text.splitlines()[-1], text
