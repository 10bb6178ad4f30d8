"""Omaps on a real cluster: conditional updates, pages, races, bad input, and recovery of tables
(small, and over many pages) onto an OSD that missed updates, including members that are
still behind when an update arrives."""

import asyncio
import json
import os

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from cairn.common import messenger
from cairn.common.placement import stable_pg
from cairn.native import open_device
from cairn.osd.store import Store, Transaction
from tests.helpers import run
from tests.test_faults_recovery import osd_status, recoveries

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


@pytest.mark.cluster
def test_conditional_updates_pages_races_and_bad_input(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="256M", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "ec", "--erasure", "2+1", "--pg-num", "4")

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("meta")
            with pytest.raises(errors.ObjectNotFound):
                await pool.omap_update("dir", {b"a": b"1"})
            first = await pool.omap_update("dir", {b"a": b"1"}, create=True,
                                           absent=[b"a"], if_version=0)
            assert (await pool.stat("dir")).omap
            with pytest.raises(errors.PreconditionFailed):       # exclusive create again
                await pool.omap_update("dir", {b"a": b"2"}, absent=[b"a"])
            with pytest.raises(errors.PreconditionFailed):
                await pool.omap_update("dir", {b"b": b"2"}, present=[b"nope"])
            with pytest.raises(errors.PreconditionFailed):
                await pool.omap_update("dir", {b"a": b"3"}, equals={b"a": b"wrong"})
            with pytest.raises(errors.PreconditionFailed):
                await pool.omap_update("dir", {b"a": b"3"}, if_version=first + 1)
            assert await pool.omap_get("dir", [b"a", b"b"]) == {b"a": b"1"}
            second = await pool.omap_update("dir", {b"a": b"3"}, equals={b"a": b"1"},
                                            if_version=first)
            assert second > first and (await pool.stat("dir")).version == second
            with pytest.raises(errors.PreconditionFailed):          # not empty under b"a"
                await pool.omap_update("dir", {b"x": b"1"}, empty=[b"a"])
            await pool.omap_update("dir", {b"x": b"1"}, empty=[b"b"])
            await pool.omap_update("dir", remove=[b"x"])
            # 3,000 entries in batches, listed in pages of 700, with a prefix.
            entries = {b"e%05d" % i: os.urandom(20) for i in range(3000)}
            items = list(entries.items())
            for start in range(0, 3000, 1000):
                await pool.omap_update("dir", dict(items[start:start + 1000]))
            listed, after = [], None
            while True:
                page, more = await pool.omap_list("dir", after, limit=700)
                listed.extend(page)
                if not more:
                    break
                after = page[-1][0]
            assert listed == [(b"a", b"3")] + sorted(items)
            assert [k async for k, _ in pool.omap_items("dir", prefix=b"e012")] == \
                [b"e012%02d" % i for i in range(100)]
            await pool.omap_update("dir", remove=[b"a", b"e00000"])
            assert await pool.omap_get("dir", [b"a", b"e00000", b"e00001"]) == \
                {b"e00001": entries[b"e00001"]}
            await pool.omap_update("dir", {b"only": b"x"}, clear=True)
            assert await pool.omap_list("dir") == ([(b"only", b"x")], False)
            # A put replaces the object whole (an empty table); a delete drops it.
            await pool.put("dir", b"data")
            assert await pool.omap_list("dir") == ([], False)
            await pool.delete("dir")
            with pytest.raises(errors.ObjectNotFound):
                await pool.omap_list("dir")

            # Twenty clients insert the same key at once: exactly one wins.
            async def insert(i):
                try:
                    await pool.omap_update("race", {b"name": b"%d" % i}, create=True,
                                           absent=[b"name"])
                    return i
                except errors.PreconditionFailed:
                    return None
            winners = [i for i in await asyncio.gather(*(insert(i) for i in range(20)))
                       if i is not None]
            assert len(winners) == 1
            assert await pool.omap_get("race", [b"name"]) == {b"name": b"%d" % winners[0]}

            # Updates to one object sent while one is in flight go together
            # (client/omap_batch.py), and each still meets its own conditions: sixty inserts
            # at once, the last of a key that exists; then a set and a compare-and-swap on
            # the value it sets, at once (kept in order, never in one group).
            await pool.omap_update("group", {b"taken": b"x"}, create=True)
            batcher = client.omap_batcher
            grouped, failed = batcher.updates_grouped, batcher.groups_failed

            async def insert_once(key):
                try:
                    await pool.omap_update("group", {key: b"v"}, absent=[key])
                    return True
                except errors.PreconditionFailed:
                    return False
            keys = [b"k%02d" % i for i in range(60)] + [b"taken"]
            assert await asyncio.gather(*(insert_once(key) for key in keys)) == \
                [True] * 60 + [False]
            assert batcher.updates_grouped > grouped and batcher.groups_failed > failed
            assert dict((await pool.omap_list("group"))[0]) == \
                {b"taken": b"x", **{key: b"v" for key in keys[:60]}}
            for round_ in range(3):
                value = b"%d" % round_
                await asyncio.gather(
                    pool.omap_update("group", {b"order": value}),
                    pool.omap_update("group", {b"order": value + b"!"},
                                     equals={b"order": value}))
                assert await pool.omap_get("group", [b"order"]) == {b"order": value + b"!"}

            # Reads of keys an update in flight does not change are answered beside it, with
            # what they held (the OSD's omap_reads_beside_writes counts them, checked below);
            # a read of a key being changed sees one whole value.
            await pool.omap_update("beside", {b"a": b"0", b"b": b"still"}, create=True)
            replies = await asyncio.gather(
                *(pool.omap_update("beside", {b"a": b"%d" % i}) for i in range(1, 41)),
                *(pool.omap_get("beside", [b"b"]) for _ in range(40)),
                *(pool.omap_get("beside", [b"a"]) for _ in range(10)))
            assert all(reply == {b"b": b"still"} for reply in replies[40:80])
            assert all(0 <= int(reply[b"a"]) <= 40 for reply in replies[80:])

            with pytest.raises(errors.Unsupported):
                await client.pool("ec").omap_update("x", {b"k": b"v"}, create=True)

            # Malformed requests: an error reply each, and the OSD goes on serving.
            cmap = client.map
            meta = cmap.pools["meta"]
            pg = stable_pg("race", meta["pg_num"])
            primary = client._acting("meta", pg).primary
            connection = await client._connection(primary)
            base = {"op": "omap", "pool": meta["id"], "pg": pg, "epoch": cmap.epoch,
                    "name": "race"}
            for bad in ({"set": "nope"}, {"set": [[b"k"]]}, {"set": [["text", b"v"]]},
                        {"set": [[b"", b"v"]]}, {"remove": [1]}, {"if": [["sometimes", b"k"]]},
                        {"if_version": -1}, {"create": "yes"},
                        {"set": [[b"k%d" % i, b"v" * 60_000] for i in range(9)]}):
                with pytest.raises(messenger.RequestFailed) as failure:
                    await connection.request({**base, **bad}, timeout_s=5)
                assert failure.value.code == "invalid", (bad, failure.value)
            for bad in ({"op": "omap_list", "limit": 0}, {"op": "omap_list", "prefix": 5},
                        {"op": "omap_get", "keys": []}, {"op": "omap_get", "keys": ["x"]}):
                with pytest.raises(messenger.RequestFailed) as failure:
                    await connection.request({**base, **bad}, timeout_s=5)
                assert failure.value.code == "invalid", (bad, failure.value)
            assert await pool.omap_get("race", [b"name"]) == {b"name": b"%d" % winners[0]}
            await pool.omap_update("scrubbed", {b"k%d" % i: b"v" for i in range(50)},
                                   create=True)
    run(main())
    beside = sum(status.get("omap_reads_beside_writes", 0)
                 for status in osd_status(cluster).values() if status)
    assert beside > 0

    # A replica whose table differs from the others' (changed under it, with the OSD stopped)
    # is found by a deep scrub and repaired from the copies that agree.
    _, where = cluster.cairn("map", "meta", "scrubbed")
    replica = where["osds"][2]
    entry = next(o for o in cluster.description["osds"] if o["id"] == replica)
    cluster.script("kill", f"osd.{replica}", "--signal", "TERM")

    async def tamper():
        device = open_device(entry["device"])
        store = await Store.open(device, entry["meta"])
        await store.apply(Transaction().omap_update(f"pg.{where['pg_id']}", "scrubbed",
                                                    {b"k3": b"forged"}))
        await store.close()
        await device.aclose()
    run(tamper())
    cluster.script("restart", f"osd.{replica}")
    cluster.wait_for("the cluster clean again", cluster.clean, 60)
    code, report = cluster.cairn("pg", "scrub", "meta", "--deep", check=False)
    assert code == 1 and report["errors"] == [{"pg": where["pg_id"], "object": "scrubbed",
                                               "osd": replica, "shard": None,
                                               "kind": "checksum"}], report
    code, report = cluster.cairn("pg", "scrub", "meta", "--deep", "--repair", check=False)
    assert code == 0 and report["repaired"] == 1, report
    code, report = cluster.cairn("pg", "scrub", "meta", "--deep", check=False)
    assert code == 0 and report["errors"] == [], report


def _read_tables(cluster, names):
    async def read():
        async with await Cluster.connect(cluster.dir, op_timeout_s=30) as client:
            pool = client.pool("meta")
            return {name: dict([entry async for entry in pool.omap_items(name)])
                    for name in names}
    return run(read())


@pytest.mark.faults
def test_tables_recover_onto_an_osd_that_missed_updates(local_cluster):
    """osd.2 is killed; tables change (one of 20,000 entries, recovered over many pages); it
    returns while recovery crawls at 2 KB/s, and every table changes again while osd.2 is
    still behind on most of them (the primary pushes it the whole object first). Then the
    budget is lifted; once the PGs are clean, osd.2 alone serves every table as the model has
    it."""
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="256M", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    names = [f"dir{i}" for i in range(16)] + ["big"]
    model = {name: {} for name in names}

    async def update(round_name, count):
        async with await Cluster.connect(cluster.dir, op_timeout_s=30) as client:
            pool = client.pool("meta")

            async def one(name):
                entries = {b"%s-%05d" % (round_name, i): os.urandom(16) for i in range(count)}
                batch = list(entries.items())
                for start in range(0, len(batch), 2000):
                    await pool.omap_update(name, dict(batch[start:start + 2000]), create=True)
                if model[name]:
                    gone = sorted(model[name])[0]
                    await pool.omap_update(name, remove=[gone], present=[gone])
                    del model[name][gone]
                model[name].update(entries)
            await asyncio.gather(*(one(name) for name in names))

    async def update_big(round_name, count):
        async with await Cluster.connect(cluster.dir, op_timeout_s=30) as client:
            pool = client.pool("meta")
            entries = {b"%s-%06d" % (round_name, i): os.urandom(24) for i in range(count)}
            batch = list(entries.items())
            for start in range(0, len(batch), 4000):
                await pool.omap_update("big", dict(batch[start:start + 4000]), create=True)
            model["big"].update(entries)

    def states():
        return cluster.cairn("status")[1].get("pg_states", {})

    run(update(b"a", 50))
    cluster.script("kill", "osd.2")                      # SIGKILL
    cluster.wait_for("osd.2 marked down", lambda: cluster.cairn("status")[1]["osds"]["up"] == 2,
                     20)
    run(update(b"b", 50))
    run(update_big(b"b", 20_000))                        # ~800 KB of entries: many pages
    cluster.cairn("config", "set", "recovery.max_bytes_per_s", "2K")
    cluster.script("restart", "osd.2")
    cluster.wait_for("osd.2 up and PGs serving", lambda: cluster.cairn("status")[1]["osds"]
                     ["up"] == 3 and sum(states().values()) == 8 and
                     all(s.startswith("active") for s in states()), 30)
    before = recoveries(cluster)
    pushes_before = sum(reply["recoveries"]["behind_pushes"]
                        for reply in osd_status(cluster).values())
    run(update(b"c", 20))
    run(update_big(b"c", 100))
    pushes = sum(reply["recoveries"]["behind_pushes"]
                 for reply in osd_status(cluster).values()) - pushes_before
    cluster.cairn("config", "set", "recovery.max_bytes_per_s", "0")
    cluster.wait_for("PGs clean", lambda: states() == {"active": 8}, 60)
    after = recoveries(cluster)
    print(f"members behind got {pushes} whole objects before their update; recoveries: "
          f"{before} -> {after}")
    assert pushes > 0, "no update found a member behind: the test did not test that path"
    assert _read_tables(cluster, names) == model
    cluster.script("kill", "osd.0", "--signal", "TERM")
    cluster.script("kill", "osd.1", "--signal", "TERM")
    assert _read_tables(cluster, names) == model         # osd.2 alone
    statuses = osd_status(cluster)
    assert statuses[2] is not None
    print(json.dumps({"tables": len(names), "big_entries": len(model["big"])}))
