"""Recovery under a time-window budget, with real processes.

Method: write while one OSD is down, then bring it back with a window in force that limits
recovery to 2 MiB/s per OSD; sample every OSD's recovery byte counter and check that no span of
5 s carries more than 15% over the limit. Then repeat with the window moved to another weekday
(the default, unlimited, applies) and check that the same recovery runs faster than the limit.
"""

import asyncio
import json
import os
import time

import pytest

from cairn.client.cluster import Cluster
from cairn.common import messenger
from tests.helpers import run

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")
LIMIT = 2 * 1024 * 1024
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def recovery_counters(cluster):
    async def ask():
        counters = {}
        for entry in cluster.description["osds"]:
            try:
                connection = await messenger.connect(entry["addr"], timeout_s=1)
                try:
                    reply = await connection.request({"op": "status"}, timeout_s=2)
                    counters[entry["id"]] = reply.header["recovery_bytes"]
                finally:
                    await connection.close()
            except messenger.MessengerError:
                counters[entry["id"]] = None
        return counters
    return run(ask())


def recoveries(cluster):
    """Recoveries by log and by backfill, summed over the OSDs."""
    async def ask():
        totals = {"log": 0, "backfill": 0}
        for entry in cluster.description["osds"]:
            connection = await messenger.connect(entry["addr"], timeout_s=1)
            try:
                reply = await connection.request({"op": "status"}, timeout_s=2)
            finally:
                await connection.close()
            for kind in totals:
                totals[kind] += reply.header["recoveries"][kind]
        return totals
    return run(ask())


def degrade_and_recover(cluster, tag, mib):
    """Kill osd.2, write `mib` MiB, restart it; [(time, {osd: recovery bytes})] until clean."""
    cluster.script("kill", "osd.2")
    cluster.wait_for("osd.2 down", lambda: not cluster.osd(2)["up"], 10)

    async def write():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("data")
            blob = os.urandom(1024 * 1024)
            await asyncio.gather(*(pool.put(f"{tag}-{i}", blob) for i in range(mib)))
    run(write())
    cluster.script("restart", "osd.2")
    samples = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        samples.append((time.monotonic(), recovery_counters(cluster)))
        if cluster.cairn("status")[1].get("pg_states") == {"active": 8} and len(samples) > 4:
            return samples
        time.sleep(0.25)
    raise AssertionError("recovery did not finish in 120 s")


def rates(samples, osd_id):
    """(the most bytes any 5 s span carried, bytes over the whole run) for one OSD."""
    points = [(when, counters[osd_id]) for when, counters in samples
              if counters.get(osd_id) is not None]
    worst = 0.0
    for i, (start, first) in enumerate(points):
        for end, last in points[i + 1:]:
            if end - start > 5.0:
                break
            worst = max(worst, (last - first) / 5.0)     # bytes in this span, per 5 s
    total = points[-1][1] - points[0][1]
    return worst, total


def test_recovery_obeys_the_window_and_runs_faster_outside_it(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    window = [{"days": "daily", "start": "00:00", "end": "24:00", "max_bytes_per_s": "2M",
               "max_active": 4}]
    cluster.cairn("config", "set", "recovery.windows", json.dumps(window))
    _, status = cluster.cairn("status")
    assert status["recovery"]["max_bytes_per_s"] == LIMIT
    samples = degrade_and_recover(cluster, "in", 24)
    moved = 0
    for osd_id in (0, 1, 2):
        worst, total = rates(samples, osd_id)
        moved += total
        assert worst <= LIMIT * 1.15, f"osd.{osd_id}: {worst / 1e6:.2f} MB/s over 5 s"
    assert moved >= 16 * 1024 * 1024, moved                 # osd.2 got its copies back
    assert recoveries(cluster)["log"] > 0                   # by log: it was down briefly
    slow_s = samples[-1][0] - samples[0][0]
    print(f"in the window: {moved / 1e6:.1f} MB recovered in {slow_s:.1f} s; busiest 5 s per "
          f"OSD: {[round(rates(samples, i)[0] / 1e6, 2) for i in (0, 1, 2)]} MB/s")

    tomorrow = DAYS[(time.localtime().tm_wday + 1) % 7]
    window[0]["days"] = tomorrow
    cluster.cairn("config", "set", "recovery.windows", json.dumps(window))
    _, status = cluster.cairn("status")
    assert status["recovery"]["window"] == "default"
    samples = degrade_and_recover(cluster, "out", 24)
    fast_s = samples[-1][0] - samples[0][0]
    fastest = max(rates(samples, osd_id)[1] for osd_id in (0, 1, 2)) / max(fast_s, 0.1)
    print(f"outside it: recovery took {fast_s:.1f} s, fastest OSD {fastest / 1e6:.2f} MB/s")
    assert fastest > LIMIT, f"outside the window: {fastest / 1e6:.2f} MB/s"
    assert fast_s < slow_s, (fast_s, slow_s)


def test_out_osd_is_backfilled_elsewhere_and_data_flows_back_when_it_returns(local_cluster):
    """osd.0 out: its PGs move to osd.3, which must get full copies (proved by reading every
    object with osd.1 and osd.2 stopped, osd.3 alone holding them). Then osd.0 comes back in
    after more writes: it must get the new versions (proved by reading with osd.3 stopped)."""
    cluster = local_cluster(hosts=4, osds_per_host=1, device_size="256M", config=FAST)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "16")

    seen = {}

    def all_active():
        seen["pg_states"] = cluster.cairn("status")[1].get("pg_states")
        return seen["pg_states"] == {"active": 16}

    async def put_all(value):
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("data")
            await asyncio.gather(*(pool.put(f"k{i}", value + b"%d" % i) for i in range(30)))

    async def read_all():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("data")
            return [await pool.get(f"k{i}") for i in range(30)]

    run(put_all(b"first-"))
    cluster.cairn("osd", "out", "0")
    cluster.wait_for("PGs active after osd.0 out", all_active, 30)
    cluster.script("kill", "osd.1", "--signal", "TERM")
    cluster.script("kill", "osd.2", "--signal", "TERM")
    assert run(read_all()) == [b"first-%d" % i for i in range(30)]     # from osd.3 alone
    cluster.script("restart", "osd.1")
    cluster.script("restart", "osd.2")
    try:
        cluster.wait_for("PGs active again", all_active, 30)
    except AssertionError:
        raise AssertionError(f"PGs not active in 30 s: {seen}") from None
    run(put_all(b"second-"))
    cluster.cairn("osd", "in", "0")
    cluster.wait_for("PGs active after osd.0 in", all_active, 30)
    cluster.script("kill", "osd.3", "--signal", "TERM")       # down but in: PGs degraded

    def serving():
        states = cluster.cairn("status")[1].get("pg_states", {})
        return set(states) <= {"active", "active+degraded"} and sum(states.values()) == 16
    cluster.wait_for("PGs active without osd.3", serving, 30)
    assert run(read_all()) == [b"second-%d" % i for i in range(30)]
