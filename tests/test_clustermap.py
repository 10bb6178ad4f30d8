"""The cluster map core: incrementals build epochs, bad operations are refused whole, the placement
tree and rules derive from OSD locations and pool definitions."""

import json

import pytest

from cairn.common.clustermap import ClusterMap, Incremental, MapError

pytestmark = pytest.mark.unit


def step(cmap, *ops):
    return cmap.apply(Incremental(epoch=cmap.epoch + 1, ops=tuple(ops)))


def booted(hosts=8, per_host=3, racks=4):
    cmap = ClusterMap(fsid="f-1")
    ops = []
    for h in range(hosts):
        for i in range(per_host):
            osd_id = h * per_host + i
            ops.append({"op": "osd_add", "id": osd_id, "uuid": f"u-{osd_id}",
                        "location": {"host": f"h{h}", "rack": f"r{h % racks}"}, "weight": 1.0})
    cmap = step(cmap, *ops)
    return step(cmap, *({"op": "osd_boot", "id": osd_id, "addr": f"127.0.0.{osd_id + 1}:6800"}
                        for osd_id in range(hosts * per_host)))


def test_epochs_advance_one_incremental_at_a_time():
    cmap = booted()
    assert cmap.epoch == 2
    with pytest.raises(MapError, match="does not follow epoch 2"):
        cmap.apply(Incremental(epoch=4, ops=()))
    assert all(osd["up"] and osd["in"] for osd in cmap.osds.values())
    assert cmap.osd_tree()[4] == {"id": 4, "host": "h1", "rack": "r1", "weight": 1.0,
                                  "reweight": 1.0, "up": True, "in": True, "full": False,
                                  "slow": False}


def test_pools_get_rules_from_their_kind_and_place_across_failure_domains():
    cmap = step(booted(), {"op": "pool_create", "name": "rbd", "kind": "replicated", "size": 3,
                           "pg_num": 128, "failure_domain": "host"},
                {"op": "pool_create", "name": "ckpt", "kind": "erasure", "k": 18, "m": 6,
                 "pg_num": 64, "failure_domain": "host", "osds_per_domain": 3},
                {"op": "pool_create", "name": "wide", "kind": "replicated", "size": 4,
                 "pg_num": 64, "failure_domain": "rack"})
    placement = cmap.placement()
    host = {osd_id: osd["location"]["host"] for osd_id, osd in cmap.osds.items()}
    rack = {osd_id: osd["location"]["rack"] for osd_id, osd in cmap.osds.items()}
    for members in placement.map_pool("rbd"):
        assert len({host[m] for m in members}) == 3
    for members in placement.map_pool("ckpt"):
        assert len(members) == 24 and sorted(members) == list(range(24))
        assert max(list(host[m] for m in members).count(h) for h in set(host.values())) == 3
    for members in placement.map_pool("wide"):
        assert len({rack[m] for m in members}) == 4
    assert cmap.pools["rbd"]["min_size"] == 2 and cmap.pools["ckpt"]["min_size"] == 19
    assert [cmap.pools[name]["id"] for name in ("rbd", "ckpt", "wide")] == [1, 2, 3]


def test_bad_operations_are_refused_whole():
    cmap = booted(hosts=2, per_host=2, racks=1)
    cases = [
        ({"op": "pool_create", "name": "p", "kind": "replicated", "size": 3, "pg_num": 64},
         "needs 3 host failure domains"),
        ({"op": "pool_create", "name": "p", "kind": "erasure", "k": 2, "m": 1, "pg_num": 64,
          "osds_per_domain": 3}, "would lose data"),
        ({"op": "pool_create", "name": "p", "kind": "replicated", "size": 2, "pg_num": 100},
         "power of two"),
        ({"op": "pool_create", "name": "p", "kind": "mirrored", "size": 2, "pg_num": 64},
         "replicated or erasure"),
        ({"op": "pool_create", "name": "p", "kind": "replicated", "size": 2, "pg_num": 64,
          "failure_domain": "galaxy"}, "failure domain"),
        ({"op": "osd_out", "id": 99}, "osd.99 does not exist"),
        ({"op": "osd_add", "id": 0, "uuid": "other", "location": {"host": "h0"}},
         "another uuid"),
        ({"op": "osd_add", "id": 9, "uuid": "u-0", "location": {"host": "h0"}},
         "already osd.0"),
        ({"op": "osd_add", "id": 9, "uuid": "u-9", "location": {"host": "r0"}},
         "already a rack"),
        ({"op": "osd_add", "id": 9, "uuid": "u-9", "location": {"host": "h0", "rack": "r7"}},
         "is under"),
        ({"op": "osd_add", "id": 9, "uuid": "u-9", "location": {"shelf": "s1"}},
         "location type"),
        ({"op": "osd_boot", "id": 0, "addr": "nowhere"}, "host:port"),
        ({"op": "osd_reweight", "id": 0, "reweight": 2}, "within 0.0..1.0"),
        ({"op": "config_set", "key": "", "value": "x"}, "key must be"),
        ({"op": "config_set", "key": "mon.osd_grace", "value": "5"}, "did you mean mon.osd_grace_s"),
        ({"op": "config_set", "key": "mon.osd_grace_s", "value": "soon"}, "must be a number"),
        ({"op": "config_set", "key": "mon.osd_grace_s", "value": "0.5"}, "within 1.0..3600.0"),
        ({"op": "config_set", "key": "osd.heartbeat_peers", "value": None}, "is not set"),
        ({"op": "frobnicate"}, "unknown operation"),
        ("not a dict", "dict with 'op'"),
    ]
    for bad, message in cases:
        good = {"op": "config_set", "key": "mon.osd_grace_s", "value": "5"}
        with pytest.raises(MapError, match=message):
            step(cmap, good, bad)
    assert cmap.epoch == 2 and cmap.config == {} and not cmap.pools


def test_out_and_in_and_boot():
    cmap = booted(hosts=4, per_host=1, racks=1)
    cmap = step(cmap, {"op": "pool_create", "name": "p", "kind": "replicated", "size": 3,
                       "pg_num": 32})
    cmap = step(cmap, {"op": "osd_down", "id": 1}, {"op": "osd_out", "id": 1})
    assert not cmap.osds[1]["up"] and not cmap.osds[1]["in"]
    assert all(1 not in members for members in cmap.placement().map_pool("p"))
    cmap = step(cmap, {"op": "osd_boot", "id": 1, "addr": "127.0.0.2:6800"})
    assert cmap.osds[1]["up"] and cmap.osds[1]["in"]          # automatic out: back in on boot
    cmap = step(cmap, {"op": "osd_out", "id": 2, "manual": True}, {"op": "osd_down", "id": 2})
    cmap = step(cmap, {"op": "osd_boot", "id": 2, "addr": "127.0.0.3:6800"})
    assert cmap.osds[2]["up"] and not cmap.osds[2]["in"]      # manual out: stays out
    cmap = step(cmap, {"op": "osd_in", "id": 2})
    assert cmap.osds[2]["in"]
    # re-registering the same OSD (same uuid) is harmless
    again = step(cmap, {"op": "osd_add", "id": 2, "uuid": "u-2", "location": {"host": "h2"}})
    assert again.osds[2] == cmap.osds[2]


def test_map_and_incrementals_round_trip_through_json():
    cmap = step(booted(hosts=3, per_host=2, racks=1),
                {"op": "pool_create", "name": "p", "kind": "replicated", "size": 3,
                 "pg_num": 16}, {"op": "config_set", "key": "osd.heartbeat_peers", "value": "3"})
    again = ClusterMap.from_dict(json.loads(json.dumps(cmap.to_dict())))
    assert again.to_dict() == cmap.to_dict()
    assert again.placement().map_pool("p") == cmap.placement().map_pool("p")
    inc = Incremental(epoch=4, ops=({"op": "config_set", "key": "osd.heartbeat_peers",
                                     "value": None},))
    assert Incremental.from_dict(json.loads(json.dumps(inc.to_dict()))) == inc
    assert again.apply(inc).config == {}
    with pytest.raises(MapError):
        Incremental.from_dict({"epoch": "x"})
    with pytest.raises(MapError, match="not a cluster map"):
        ClusterMap.from_dict({"fsid": "x"})


def test_an_osd_weight_moves_data_only_to_that_osd_and_add_host_plans_bounded_steps():
    """osd_weight (cairn osd weight; add-host's steps): a bad weight is refused; a new OSD at
    weight 0 holds nothing; raising it moves PG members only onto it (straw2); and add-host's
    planner raises it in steps that each move at most the share asked for."""
    from cairn.cluster import fleet
    from cairn.common import pg as pgs
    cmap = booted(hosts=5, per_host=1, racks=5)
    cmap = step(cmap, {"op": "pool_create", "name": "data", "kind": "replicated", "size": 3,
                       "min_size": 2, "pg_num": 64})
    with pytest.raises(MapError, match="weight must be a number"):
        step(cmap, {"op": "osd_weight", "id": 4, "weight": -1})
    cmap = step(cmap, {"op": "osd_weight", "id": 4, "weight": 0.0})
    before = pgs.acting_sets(cmap, "data")
    assert not any(4 in acting.members for acting in before)
    half = step(cmap, {"op": "osd_weight", "id": 4, "weight": 0.5})
    after = pgs.acting_sets(half, "data")
    changed = [(b.members, a.members) for b, a in zip(before, after) if b.members != a.members]
    assert changed and all(4 in a and len(set(b) - set(a)) == 1 for b, a in changed)
    assert fleet.moved_fraction(cmap, {4: 0.5}) == pytest.approx(
        sum(len(set(b) - set(a)) for b, a in changed) / (64 * 3))
    weights, steps = cmap, 0
    while (plan := fleet.next_weights(weights, [4], 1.0, 0.25, 0.05)) is not None:
        assert fleet.moved_fraction(weights, plan) <= 0.05
        weights = step(weights, *({"op": "osd_weight", "id": i, "weight": w}
                                  for i, w in plan.items()))
        steps += 1
    assert weights.osds[4]["weight"] == 1.0 and steps >= 4
    # A small cluster where one PG copy is more than the share asked for (8 PGs of size 2: one
    # copy is 6.25%): each step moves one copy's worth at most, and none is a step that moves
    # nothing, but the last (to reach the weight exactly).
    small = booted(hosts=3, per_host=1, racks=3)
    small = step(small, {"op": "pool_create", "name": "data", "kind": "replicated", "size": 2,
                         "min_size": 1, "pg_num": 8},
                 {"op": "osd_weight", "id": 2, "weight": 0.0})
    moves = []
    while (plan := fleet.next_weights(small, [2], 1.0, 0.5, 0.05)) is not None:
        moves.append(fleet.moved_fraction(small, plan))
        small = step(small, *({"op": "osd_weight", "id": i, "weight": w}
                              for i, w in plan.items()))
    assert small.osds[2]["weight"] == 1.0 and len(moves) <= 8, moves
    assert all(0 < moved <= 2 / 16 for moved in moves[:-1]), moves
