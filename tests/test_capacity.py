"""Capacity and quotas: the pure core (mon/capacity.py) and the map operations behind it."""

import pytest

from cairn.common.clustermap import ClusterMap, Incremental, MapError
from cairn.mon import capacity
from cairn.mon.capacity import Ratios

pytestmark = pytest.mark.unit

MIB = 1 << 20


def cluster():
    cmap = ClusterMap("fsid", epoch=1)
    ops = []
    for osd_id in range(3):
        ops += [{"op": "osd_add", "id": osd_id, "uuid": f"u{osd_id}",
                 "location": {"host": f"h{osd_id + 1}"}},
                {"op": "osd_boot", "id": osd_id, "addr": f"127.0.0.1:{7000 + osd_id}"}]
    ops += [{"op": "pool_create", "name": "rep", "kind": "replicated", "size": 3, "pg_num": 8},
            {"op": "pool_create", "name": "ec", "kind": "erasure", "k": 2, "m": 1,
             "pg_num": 8}]
    return cmap.apply(Incremental(2, tuple(ops)))


def step(cmap, *ops):
    return cmap.apply(Incremental(cmap.epoch + 1, ops))


def test_heartbeat_reports_are_cleaned_and_pool_totals_add_up():
    assert capacity.clean_capacity([100, 40]) == (100, 40)
    for bad in (None, [1], [10, 20], [-1, 0], ["1", 0], [True, 0], {"a": 1}):
        assert capacity.clean_capacity(bad) is None, bad
    assert capacity.clean_pools({"1": [3, 300], "x": [1, 1], "2": [1, -1], "3": "no"}) == \
        {1: (3, 300)}
    assert capacity.clean_pools(None) == {}
    totals = capacity.pool_totals({0: {1: (3, 300)}, 1: {1: (2, 200), 2: (1, 5)}})
    assert totals == {1: (5, 500), 2: (1, 5)}


def test_full_and_quota_flags_follow_the_reports_and_clear():
    cmap = cluster()
    ratios = Ratios()
    usage = {0: (100 * MIB, 50 * MIB), 1: (100 * MIB, 95 * MIB), 2: (100 * MIB, 10 * MIB)}
    ops = capacity.flag_ops(cmap, usage, {}, ratios)
    assert ops == [{"op": "osd_full", "id": 1, "full": True}]
    cmap = step(cmap, *ops)
    assert cmap.osds[1]["full"] and capacity.flag_ops(cmap, usage, {}, ratios) == []
    usage[1] = (100 * MIB, 94 * MIB)                         # deletes freed space
    assert capacity.flag_ops(cmap, usage, {}, ratios) == [{"op": "osd_full", "id": 1,
                                                            "full": False}]
    # Quotas: reached by objects or by bytes; not judged while reports are incomplete.
    cmap = step(cmap, {"op": "pool_set_quota", "name": "rep", "max_objects": 10},
                {"op": "pool_set_quota", "name": "ec", "max_bytes": 1000})
    rep, ec = cmap.pools["rep"]["id"], cmap.pools["ec"]["id"]
    totals = {rep: (10, 5), ec: (1, 999)}
    usage[1] = (100 * MIB, 94 * MIB)
    cmap = step(cmap, {"op": "osd_full", "id": 1, "full": False})
    ops = capacity.flag_ops(cmap, usage, totals, ratios)
    assert ops == [{"op": "pool_quota_full", "name": "rep", "full": True}]
    assert capacity.flag_ops(cmap, usage, totals, ratios, pools_known=False) == []
    cmap = step(cmap, *ops)
    cmap = step(cmap, {"op": "pool_set_quota", "name": "rep", "max_objects": 20})
    assert cmap.pools["rep"]["max_objects"] == 20
    assert capacity.flag_ops(cmap, usage, totals, ratios) == [
        {"op": "pool_quota_full", "name": "rep", "full": False}]
    cmap = step(cmap, {"op": "pool_set_quota", "name": "rep", "max_objects": 0})
    assert capacity.quota_use(cmap.pools["rep"], 10**9, 10**9) is None    # 0: no limit


def test_checks_name_each_osd_and_pool_with_figures():
    cmap = step(cluster(), {"op": "pool_set_quota", "name": "rep", "max_objects": 10,
                            "max_bytes": 100 * MIB})
    rep = cmap.pools["rep"]["id"]
    usage = {0: (100 * MIB, 86 * MIB), 1: (100 * MIB, 96 * MIB), 2: (100 * MIB, 1 * MIB)}
    found = capacity.checks(cmap, usage, {rep: (8, 10 * MIB)}, Ratios())
    assert set(found) == {"OSD_FULL", "OSD_NEARFULL", "POOL_NEAR_QUOTA"}
    severity, summary, detail = found["OSD_FULL"]
    assert severity == "HEALTH_ERR" and "osd.1" in summary and "osd.0" not in summary
    assert detail == ["osd.1 (host h2) is 96.0% full (96M of 100M)"], detail
    assert found["OSD_NEARFULL"][0] == "HEALTH_WARN" and "osd.0" in found["OSD_NEARFULL"][1]
    assert found["POOL_NEAR_QUOTA"][2][0].startswith("pool rep: 8 of 10 objects")
    found = capacity.checks(cmap, {}, {rep: (10, 10 * MIB)}, Ratios())
    assert set(found) == {"POOL_FULL"} and "rep" in found["POOL_FULL"][1]
    custom = capacity.checks(cmap, usage, {}, Ratios(nearfull=0.5, full=0.99))
    assert set(custom) == {"OSD_NEARFULL"} and "osd.1" in custom["OSD_NEARFULL"][1]


def test_df_shows_raw_osds_and_pools():
    cmap = step(cluster(), {"op": "pool_set_quota", "name": "ec", "max_bytes": 4 * MIB})
    rep, ec = cmap.pools["rep"]["id"], cmap.pools["ec"]["id"]
    usage = {0: (100 * MIB, 30 * MIB), 1: (100 * MIB, 20 * MIB)}
    report = capacity.df(cmap, usage, {rep: (4, 2 * MIB), ec: (2, 2 * MIB)}, Ratios())
    assert report["raw"] == {"total_bytes": 200 * MIB, "used_bytes": 50 * MIB,
                             "avail_bytes": 150 * MIB, "used_ratio": 0.25}
    assert [o["state"] for o in report["osds"]] == ["ok", "ok", "unknown"]
    pools = {p["name"]: p for p in report["pools"]}
    assert pools["rep"]["raw_bytes"] == 6 * MIB and pools["rep"]["quota_ratio"] is None
    assert pools["ec"]["raw_bytes"] == 3 * MIB and pools["ec"]["quota_ratio"] == 0.5


def test_map_operations_are_validated():
    cmap = cluster()
    for bad in ({"op": "pool_set_quota", "name": "nope", "max_objects": 1},
                {"op": "pool_set_quota", "name": "rep"},
                {"op": "pool_set_quota", "name": "rep", "max_bytes": -1},
                {"op": "pool_set_quota", "name": "rep", "max_objects": "5"},
                {"op": "pool_quota_full", "name": "rep", "full": 1},
                {"op": "osd_full", "id": 9, "full": True},
                {"op": "osd_full", "id": 0}):
        with pytest.raises(MapError):
            step(cmap, bad)
    kept = step(cmap, {"op": "pool_set_quota", "name": "rep", "max_objects": 5},
                {"op": "pool_set_quota", "name": "rep", "max_bytes": 7})
    assert (kept.pools["rep"]["max_objects"], kept.pools["rep"]["max_bytes"]) == (5, 7)
    assert ClusterMap.from_dict(kept.to_dict()).pools["rep"]["max_bytes"] == 7


def test_slow_flags_follow_slow_disk_and_reads_avoid_flagged_osds():
    """The leader flags `slow` exactly the up OSDs SLOW_DISK names; a slow primary's reads go to
    a complete member that is not slow; an erasure read skips slow shards while k others are
    up; osd.avoid_slow_reads 0 turns it off."""
    import types

    from cairn.mon.health import slow_flag_ops
    from cairn.osd.backend import slow_osds
    from cairn.osd.backend_erasure import ErasureBackend
    from cairn.osd.backend_replicated import ReplicatedBackend
    cmap = cluster()
    assert slow_flag_ops(cmap, {1: "finding"}) == [{"op": "osd_slow", "id": 1, "slow": True}]
    cmap = step(cmap, {"op": "osd_slow", "id": 1, "slow": True})
    assert slow_flag_ops(cmap, {1: "finding"}) == [] and slow_osds(cmap) == {1}
    assert cmap.osd_tree()[1]["slow"] is True
    down = step(cmap, {"op": "osd_down", "id": 1})
    assert slow_flag_ops(down, {1: "finding"}) == [{"op": "osd_slow", "id": 1, "slow": False}]
    assert slow_flag_ops(cmap, {}) == [{"op": "osd_slow", "id": 1, "slow": False}]

    port = types.SimpleNamespace(map=cmap, me=1)
    replicated = ReplicatedBackend(port, None)
    acting = types.SimpleNamespace(members=(1, 0, 2), up_members=(1, 0, 2))
    pg = types.SimpleNamespace(core=types.SimpleNamespace(acting=acting,
                                                          complete_members=frozenset({1, 2})))
    assert replicated.stand_ins(pg) == [2]                   # osd.0 is not complete
    erasure = ErasureBackend(port, None)
    assert erasure.avoided_shards(pg, codec_k=2) == {0}
    assert erasure.avoided_shards(pg, codec_k=3) == set()
    port.map = step(cmap, {"op": "config_set", "key": "osd.avoid_slow_reads", "value": "0"})
    assert slow_osds(port.map) == frozenset()
    assert erasure.avoided_shards(pg, codec_k=2) == set()
    with pytest.raises(MapError):
        step(cmap, {"op": "osd_slow", "id": 1, "slow": "yes"})


def test_an_erasure_read_goes_around_the_disk_slow_now_when_the_map_flags_another():
    """Measured (2026-12-01): SLOW_DISK's flag lagged on osd.2, healthy again, while osd.3 was
    slow; a read's PG holding both then avoided neither (two to avoid, one to spare), and
    2+1 reads fell to 0.13-0.26x the healthy IOPS. The primary's own steering is the fresher
    evidence: it goes around the member it steers around, and of two steered, the newer."""
    import types

    from cairn.common import hedge
    from cairn.osd.backend_erasure import ErasureBackend
    cmap = step(cluster(), {"op": "osd_slow", "id": 2, "slow": True})
    erasure = ErasureBackend(types.SimpleNamespace(map=cmap, me=0), None)
    clock = [100.0]
    erasure.hedger = hedge.Hedger(lambda: clock[0])
    acting = types.SimpleNamespace(members=(0, 2, 1))
    pg = types.SimpleNamespace(core=types.SimpleNamespace(acting=acting))
    assert erasure.avoided_shards(pg, codec_k=2) == {1}         # the map's flag alone
    erasure.hedger.steer(1)                                     # osd.1 is slow now
    assert erasure.avoided_shards(pg, codec_k=2) == {2}
    clock[0] += 0.1
    erasure.hedger.steer(0)
    assert erasure.avoided_shards(pg, codec_k=2) == {0}         # the newer evidence
    assert erasure.avoided_shards(pg, codec_k=1) == {0, 2}      # two to spare: both steered
    assert erasure.avoided_shards(pg, codec_k=3) == set()       # nothing to spare
    clock[0] += hedge.STEER_S + 0.2                             # the steering is over
    assert erasure.avoided_shards(pg, codec_k=2) == {1}


def test_an_erasure_read_asks_a_late_shard_again_when_a_stand_in_fails():
    """A data shard late past the hedge delay is read around, not written off: when the
    member standing in for it fails (it is still being recovered: not found), the read asks
    the late member again and decodes. Before, the late shard was excluded from the degraded
    read, which then had too few shards (CI, 2026-12-02: a 4+2 read during recovery found 3
    of 4, the late member never asked again)."""
    import asyncio
    import random
    import types

    from cairn.native.erasure import DEFAULT_BACKEND, Codec
    from cairn.osd import ecstripe
    from cairn.osd.backend import ShardUnavailable
    from cairn.osd.backend_erasure import ErasureBackend
    cmap = cluster()
    erasure = ErasureBackend(types.SimpleNamespace(map=cmap, me=0), None)
    codec = Codec(2, 1, DEFAULT_BACKEND)
    data = random.Random(7).randbytes(10_000)
    layout = erasure.layout(codec, len(data))
    shards = ecstripe.encode_shards(codec, layout, data)
    erasure.codec = lambda pg: codec
    erasure._local_info = lambda pg, name: (types.SimpleNamespace(attrs={}, mtime_ns=0), 5,
                                            layout)
    asked = []

    async def fetch(pg, osd, index, name, version, ranges, stash_entry=None):
        asked.append(osd)
        if osd == 2:                                    # recovering: has no copy yet
            raise ShardUnavailable(index, f"osd.{osd}: not found")
        if osd == 1:                                    # slow, but it answers
            await asyncio.sleep(0.05)
        return b"".join(bytes(shards[index][start:start + size]) for start, size in ranges)
    erasure._fetch = fetch
    pg = types.SimpleNamespace(key=(cmap.pools["ec"]["id"], 0), core=types.SimpleNamespace(
        acting=types.SimpleNamespace(members=(0, 1, 2))))

    async def main():
        info, got = await erasure.read(pg, "o")
        return info, bytes(got) if not isinstance(got, tuple) else b"".join(got)
    info, got = asyncio.run(main())
    assert got == data and info.size == len(data)
    assert asked.count(1) == 2 and 2 in asked, asked    # osd.1 late, then asked again
