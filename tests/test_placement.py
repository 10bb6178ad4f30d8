"""Placement: straw2 over the failure-domain tree, rules, reweight/out, and the properties the rest
of cairn relies on (DESIGN.md, "Placement"); golden vectors catch any change of results."""

import collections
import json
import os

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from cairn.common import placement
from cairn.common.placement import PlacementError, PlacementMap

pytestmark = pytest.mark.unit

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "placement.json")


def cluster(host_weights, racks=2, size=3, pg_num=4096, mode="firstn", domain="host",
            extra_pools=()):
    """A map: root > racks > hosts > OSDs; `host_weights` lists each host's OSD weights."""
    buckets = [{"name": "default", "type": "root",
                "children": [f"rack{r}" for r in range(racks)]}]
    for r in range(racks):
        buckets.append({"name": f"rack{r}", "type": "rack",
                        "children": [f"h{h}" for h in range(len(host_weights)) if h % racks == r]})
    osds, next_id = [], 0
    for h, weights in enumerate(host_weights):
        children = []
        for weight in weights:
            osds.append({"id": next_id, "weight": weight})
            children.append(f"osd.{next_id}")
            next_id += 1
        buckets.append({"name": f"h{h}", "type": "host", "children": children})
    return {"types": ["osd", "host", "rack", "root"], "buckets": buckets, "osds": osds,
            "rules": [{"name": "r", "mode": mode,
                       "steps": [{"take": "default"}, {"chooseleaf": 0, "type": domain}]},
                      {"name": "ec", "mode": "indep",
                       "steps": [{"take": "default"}, {"choose": 4, "type": "host"},
                                 {"choose": 2, "type": "osd"}]}],
            "pools": [{"name": "p", "id": 1, "size": size, "pg_num": pg_num, "rule": "r"},
                      *extra_pools]}


def host_of(data):
    return {int(child[4:]): bucket["name"] for bucket in data["buckets"]
            if bucket["type"] == "host" for child in bucket["children"]}


def counts(results):
    return collections.Counter(osd for members in results for osd in members
                               if osd is not None)


# -- arithmetic -------------------------------------------------------------------------------------

def test_log2_table_is_exact_where_log2_is_an_integer_and_monotonic():
    table = placement._LOG2
    for power in range(17):
        assert table[1 << power] == power << placement.LOG_FRACTION_BITS
    assert all(table[u] < table[u + 1] for u in range(1, 65536))
    # log2(3) = 1.5849625007...; 24 fraction bits, truncated.
    assert abs(table[3] / (1 << 24) - 1.5849625007) < 1e-6


def test_draws_favour_weight_and_never_pick_weight_zero():
    import numpy as np
    ids = np.arange(3, dtype=np.int64)
    weights = np.array([0x10000, 0x30000, 0], dtype=np.int64)
    wins = collections.Counter()
    for x in range(4000):
        wins[int(np.argmax(placement.draws(x, ids, weights, 7)))] += 1
    assert wins[2] == 0
    assert 2.6 < wins[1] / wins[0] < 3.4          # 3:1 by weight


# -- golden vectors -----------------------------------------------------------------------------------

def golden_map():
    data = cluster([[1.0, 1.0, 2.0]] * 4 + [[0.5, 1.5]] * 4, racks=4,
                   extra_pools=[{"name": "e", "id": 2, "size": 8, "pg_num": 64, "rule": "ec"}])
    data["osds"][3]["reweight"] = 0.5
    data["osds"][7]["in"] = False
    return PlacementMap.from_dict(data)


def compute_golden():
    pmap = golden_map()
    return {"p": pmap.map_pool("p", range(32)), "e": pmap.map_pool("e", range(32)),
            "objects": {name: pmap.map_object("p", name)[0]
                        for name in ("a", "checkpoint/step-1000/shard-00017", "日本")},
            "hash3": [int(v) for v in placement.hash3(1, [0, 1, 2], 3)]}


def test_golden_vectors_are_unchanged():
    """Any change of placement results moves data in every deployed cluster: it must be
    deliberate. To regenerate after such a change: `python -m tests.test_placement`."""
    with open(GOLDEN) as handle:
        expected = json.load(handle)
    assert compute_golden() == expected


# -- properties ---------------------------------------------------------------------------------------

host_layouts = st.lists(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1, max_size=3),
                        min_size=3, max_size=7)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=host_layouts, size=st.integers(1, 3), mode=st.sampled_from(["firstn", "indep"]),
       outs=st.lists(st.integers(0, 20), max_size=2))
def test_no_two_members_share_a_failure_domain(layout, size, mode, outs):
    data = cluster(layout, size=size, pg_num=64, mode=mode)
    for osd_id in outs:
        if osd_id < len(data["osds"]):
            data["osds"][osd_id]["in"] = False
    pmap = PlacementMap.from_dict(data)
    hosts = host_of(data)
    usable_hosts = {hosts[o["id"]] for o in data["osds"] if o.get("in", True)}
    for members in pmap.map_pool("p"):
        present = [m for m in members if m is not None]
        assert len({hosts[m] for m in present}) == len(present)
        assert all(data["osds"][m].get("in", True) for m in present)
        assert len(present) == min(size, len(usable_hosts))
        if mode == "indep":
            assert len(members) == size


# Placement is deterministic, so statistical properties run on a fixed set of examples
# (derandomize): a run can neither pass nor fail by luck.
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(per_host=st.lists(st.sampled_from([[1.0, 1.0], [2.0], [0.5, 1.5], [1.0, 0.5, 0.5]]),
                         min_size=4, max_size=6))
def test_each_osd_gets_its_weight_share_within_ten_percent(per_host):
    """4096 PGs, size 3, hosts of equal total weight whose OSDs weigh differently. Checked for
    every OSD expected to hold at least 1,000 PG copies: below that, 10% is under 3.2 standard
    deviations of the count, and chance alone exceeds it.

    Hosts of unequal weight are a known limit: choosing 3 distinct hosts one after another
    favours light hosts (Ceph has the same bias); see docs/REFERENCE.md, "Placement"."""
    data = cluster(per_host, size=3, pg_num=4096)
    placed = counts(PlacementMap.from_dict(data).map_pool("p"))
    total_weight = sum(o["weight"] for o in data["osds"])
    checked = 0
    for osd in data["osds"]:
        expected = 4096 * 3 * osd["weight"] / total_weight
        if expected >= 1000:
            assert abs(placed[osd["id"]] - expected) <= 0.10 * expected, (osd, placed, expected)
            checked += 1
    assert checked


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(layout=host_layouts, target=st.integers(0, 20),
       factor=st.sampled_from([0.0, 0.5, 1.5, 3.0]), mode=st.sampled_from(["firstn", "indep"]))
def test_changing_one_weight_moves_data_only_to_or_from_that_osd(layout, target, factor, mode):
    data = cluster(layout, size=2, pg_num=1024, mode=mode)
    target %= len(data["osds"])
    before = PlacementMap.from_dict(data).map_pool("p")
    old_weight = data["osds"][target]["weight"]
    data["osds"][target]["weight"] = old_weight * factor
    after = PlacementMap.from_dict(data).map_pool("p")
    moved = 0
    for old, new in zip(before, after):
        gone, came = set(old) - set(new), set(new) - set(old)
        if gone or came:
            assert target in gone | came, (old, new)
            assert len(gone) == len(came) == 1, (old, new)
        moved += len(came)
    count_before = counts(before)[target]
    count_after = counts(after)[target]
    assert moved == abs(count_after - count_before)      # every move is that OSD's
    # Against the ideal: the change of its weight share, over all PG slots.
    total_before = sum(o["weight"] for o in data["osds"]) - data["osds"][target]["weight"] \
        + old_weight
    total_after = sum(o["weight"] for o in data["osds"])
    ideal = 1024 * 2 * abs(data["osds"][target]["weight"] / total_after
                           - old_weight / total_before)
    if ideal >= 40:                 # below that, sampling noise dominates the ratio
        assert moved <= 1.3 * ideal, (moved, ideal)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.lists(st.lists(st.just(1.0), min_size=1, max_size=3), min_size=4, max_size=7),
       target=st.integers(0, 20))
def test_marking_an_osd_out_changes_only_the_positions_it_held_under_indep(layout, target):
    data = cluster(layout, size=3, pg_num=256, mode="indep")
    target %= len(data["osds"])
    before = PlacementMap.from_dict(data).map_pool("p")
    data["osds"][target]["in"] = False
    after = PlacementMap.from_dict(data).map_pool("p")
    changed = 0
    for old, new in zip(before, after):
        for position, (a, b) in enumerate(zip(old, new)):
            if a != b:
                assert a == target, (old, new)
                changed += 1
        assert target not in new
    assert changed == counts(before)[target]


def test_multi_step_rule_takes_hosts_then_osds_in_each():
    data = cluster([[1.0, 1.0, 1.0]] * 6, size=3, pg_num=64,
                   extra_pools=[{"name": "e", "id": 2, "size": 8, "pg_num": 256,
                                 "rule": "ec"}])
    pmap = PlacementMap.from_dict(data)
    hosts = host_of(data)
    for members in pmap.map_pool("e"):
        assert len(members) == 8 and len(set(members)) == 8
        per_host = collections.Counter(hosts[m] for m in members)
        assert sorted(per_host.values()) == [2, 2, 2, 2]
        # positions 0-1 share a host, 2-3 another, ...
        assert all(hosts[members[i]] == hosts[members[i + 1]] for i in range(0, 8, 2))


def test_reweight_scales_the_share():
    data = cluster([[1.0, 1.0]] * 6, size=2, pg_num=4096)
    data["osds"][0]["reweight"] = 0.5
    placed = counts(PlacementMap.from_dict(data).map_pool("p"))
    normal = sum(placed[o] for o in range(2, 12)) / 10
    assert 0.42 < placed[0] / normal < 0.58


def test_objects_map_to_pgs_by_crc32c():
    pmap = golden_map()
    pg_index, members = pmap.map_object("p", "a")
    assert pg_index == placement.crc32c(b"a") % 4096
    assert members == pmap.map_pg("p", pg_index)


# -- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["buckets"].append(dict(d["buckets"][1])), "appears twice"),
    (lambda d: d["buckets"][-1]["children"].append("osd.0"), "in two buckets"),
    (lambda d: d["buckets"][-1]["children"].append("nowhere"), "not a bucket"),
    (lambda d: d["buckets"][-1].update(type="galaxy"), "bucket types are"),
    (lambda d: d["buckets"][0]["children"].append("osd.99"), "not in the OSD list"),
    (lambda d: d["osds"][0].update(weight=-1), "weight of osd.0"),
    (lambda d: d["osds"][0].update(reweight=1.5), "reweight of osd.0"),
    (lambda d: d["rules"][0]["steps"].pop(0), "must follow take"),
    (lambda d: d["rules"][0]["steps"][1].update(type="planet"), "is not one of"),
    (lambda d: d["rules"][0].update(mode="sideways"), "firstn or indep"),
    (lambda d: d["rules"][0]["steps"].append({"take": "default"}), "must end with"),
    (lambda d: d["pools"][0].update(pg_num=1000), "power of two"),
    (lambda d: d["pools"][0].update(rule="missing"), "does not exist"),
    (lambda d: d["rules"][0]["steps"][0].update(take="h0x"), "not a bucket"),
])
def test_malformed_maps_are_refused_with_a_clear_error(mutate, message):
    data = cluster([[1.0], [1.0], [1.0]])
    mutate(data)
    with pytest.raises(PlacementError, match=message):
        PlacementMap.from_dict(data)


def test_a_pool_that_cannot_be_placed_is_refused():
    data = cluster([[1.0, 1.0], [1.0, 1.0]], size=3)
    pmap = PlacementMap.from_dict(data)
    with pytest.raises(PlacementError, match="needs 3 host failure domains"):
        pmap.check_pool("p")
    data = cluster([[1.0, 1.0]] * 5, extra_pools=[{"name": "e", "id": 2, "size": 8,
                                                   "pg_num": 64, "rule": "ec"}])
    data["osds"][0]["in"] = False                   # h0 can no longer hold 2 OSDs
    data["osds"][2]["in"] = False
    with pytest.raises(PlacementError, match="needs 4 host"):
        PlacementMap.from_dict(data).check_pool("e")
    assert PlacementMap.from_dict(cluster([[1.0]] * 3)).check_pool("p")
    with pytest.raises(PlacementError, match="no pool named 'nope'"):
        pmap.map_pg("nope", 0)


def test_map_round_trips_through_its_dict():
    pmap = golden_map()
    again = PlacementMap.from_dict(json.loads(json.dumps(pmap.to_dict())))
    assert again.map_pool("p", range(64)) == pmap.map_pool("p", range(64))


if __name__ == "__main__":
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    golden = compute_golden()
    with open(GOLDEN, "w") as handle:                # one PG per line: diffs stay readable
        handle.write("{\n")
        for key in ("p", "e"):
            rows = ",\n  ".join(json.dumps(row) for row in golden[key])
            handle.write(f' "{key}": [\n  {rows}],\n')
        handle.write(f' "objects": {json.dumps(golden["objects"], ensure_ascii=False)},\n')
        handle.write(f' "hash3": {json.dumps(golden["hash3"])}\n}}\n')
    print(f"wrote {GOLDEN}")


def test_placement_test_tool_reports_shares_and_moves(tmp_path):
    import subprocess
    import sys
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    data = cluster([[1.0, 1.0]] * 4, pg_num=256)
    first.write_text(json.dumps(data))
    data["osds"][5]["weight"] = 3.0
    second.write_text(json.dumps(data))
    command = [sys.executable, "-m", "cairn.client.cli", "placement", "test", "--map",
               str(first), "--pool", "p"]
    done = subprocess.run(command + ["--compare", str(second), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(row["pgs"] for row in report["osds"]) == 256 * 3
    assert [row["id"] for row in report["osds"]] == list(range(8))
    assert report["short_pgs"] == 0 and 0 < report["max_deviation"] < 0.5
    moved = report["moved"]
    assert moved["copies_moved"] > 0 and all(5 in example["to"]
                                              for example in moved["examples"])
    text = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "largest deviation" in text.stdout
    bad = subprocess.run(command[:-1] + ["nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no pool named 'nope'" in bad.stderr
    first.write_text("{not json")
    broken = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 2 and "is not JSON" in broken.stderr
