"""Erasure coding under real faults (real processes, SIGKILL).

- 18+6 with 3 shards per host on 8 hosts x 3 OSDs: two whole hosts are killed while a writer
  stores a mix of objects; every acknowledged object reads back byte-identical with the hosts
  down and after they return and recovery ends; with a seventh OSD down, reads of PGs short of 18
  shards fail with DataUnavailable and no read returns wrong bytes; writes are refused below
  min_size.
- 4+2 (3 hosts x 2): an OSD killed while another is being recovered; a primary killed in the
  middle of writes (the client retries: each object is the old or the new value, never a mix).
"""

import asyncio
import random
import time

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from tests.helpers import run

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5", "scrub.interval_s=0")
SIZES = [0, 1, 4096, 1 << 20, (5 << 20) + 1]


def blob(i):
    return random.Random(i).randbytes(SIZES[i % len(SIZES)])


def host_of(cluster):
    return {o["id"]: o["host"] for o in cluster.cairn("osd", "tree")[1]["osds"]}


def test_18_plus_6_survives_two_hosts_killed_mid_stream(local_cluster):
    cluster = local_cluster(hosts=8, osds_per_host=3, device_size="256M", config=FAST)
    cluster.cairn("pool", "create", "ec", "--erasure", "18+6", "--osds-per-domain", "3",
                  "--pg-num", "16")
    hosts = host_of(cluster)
    doomed = sorted(set(hosts.values()))[:2]
    acked = {}
    stream = random.Random(64).randbytes(64 << 20)

    async def writer(pool, start, stop_at):
        i = start
        while time.monotonic() < stop_at:
            try:
                await pool.put(f"o{i}", blob(i))
                acked[i] = True
            except (errors.Timeout, errors.PoolUnavailable):
                await asyncio.sleep(0.2)
            i += 1

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("ec")
            await pool.put_stream("stream", stream)
            stop_at = time.monotonic() + 12
            writers = [asyncio.create_task(writer(pool, k * 100_000, stop_at)) for k in range(3)]
            await asyncio.sleep(4)
            for osd, host in hosts.items():               # two whole hosts, mid-stream
                if host in doomed:
                    await asyncio.to_thread(cluster.script, "kill", f"osd.{osd}")
            await asyncio.gather(*writers)
            assert len(acked) >= 30, len(acked)
            await asyncio.to_thread(cluster.wait_for, "six OSDs down", lambda: cluster.cairn(
                "status")[1]["osds"]["up"] == 18, 30)
            for i in acked:                                 # 18 of 24 shards: all readable
                assert await pool.get(f"o{i}") == blob(i), i
            assert await pool.get("stream") == stream
            with pytest.raises(errors.PoolUnavailable):    # 18 up < min_size 19
                await pool.put("refused", b"x")

            survivors = [osd for osd, host in hosts.items() if host not in doomed]
            await asyncio.to_thread(cluster.script, "kill", f"osd.{survivors[0]}")
            await asyncio.to_thread(cluster.wait_for, "a seventh OSD down", lambda: cluster.cairn(
                "status")[1]["osds"]["up"] == 17, 30)
            wrong = unavailable = 0
            for i in list(acked)[:60]:
                try:
                    wrong += await pool.get(f"o{i}") != blob(i)
                except errors.DataUnavailable:
                    unavailable += 1
            assert wrong == 0, wrong
            assert unavailable > 0                          # some read needed a lost shard

            for osd, host in hosts.items():
                if host in doomed or osd == survivors[0]:
                    await asyncio.to_thread(cluster.script, "restart", f"osd.{osd}")
            await asyncio.to_thread(cluster.wait_for, "recovery ends", cluster.clean,
                                    120)
            for i in acked:
                assert await pool.get(f"o{i}") == blob(i), i
            assert await pool.get("stream") == stream
    run(main())


def test_4_plus_2_osd_killed_while_another_recovers(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M",
                            config=FAST + ("recovery.max_bytes_per_s=20M",))
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "8")

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=20) as client:
            pool = client.pool("ec")
            cluster.script("kill", "osd.1")
            cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], 20)
            for i in range(60):                           # written while osd.1 is away
                await pool.put(f"o{i}", blob(i))
            cluster.script("restart", "osd.1")            # its recovery is throttled to
            await asyncio.sleep(1.5)                      # 20 MB/s: kill another meanwhile
            cluster.script("kill", "osd.4")
            cluster.wait_for("osd.4 down", lambda: not cluster.osd(4)["up"], 20)
            for i in range(60):
                assert await pool.get(f"o{i}") == blob(i), i
            cluster.script("restart", "osd.4")
            cluster.wait_for("recovery ends", cluster.clean, 120)
            cluster.script("kill", "osd.0")              # the recovered shards carry reads
            cluster.script("kill", "osd.5")
            cluster.wait_for("two down", lambda: not cluster.osd(0)["up"]
                             and not cluster.osd(5)["up"], 20)
            for i in range(60):
                assert await pool.get(f"o{i}") == blob(i), i
    run(main())


def test_4_plus_2_primary_killed_mid_write_leaves_old_or_new(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "4", "--min-size", "4")
    old = {i: random.Random(i).randbytes(3 << 20) for i in range(16)}
    new = {i: random.Random(1000 + i).randbytes(3 << 20) for i in range(16)}

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=30) as client:
            pool = client.pool("ec")
            for i, value in old.items():
                await pool.put(f"o{i}", value)
            _, where = cluster.cairn("map", "ec", "o0")
            victim = where["primary"]
            writes = [asyncio.create_task(pool.put(f"o{i}", value)) for i, value in new.items()]
            await asyncio.sleep(0.05)                      # writes in flight
            cluster.script("kill", f"osd.{victim}")
            results = await asyncio.gather(*writes, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, failures                 # the client retried every one
            for i in old:
                got = await pool.get(f"o{i}")
                assert got == new[i], (i, "old" if got == old[i] else "a mix")
            cluster.script("restart", f"osd.{victim}")
            cluster.wait_for("recovery ends", cluster.clean, 60)
            for i in old:
                assert await pool.get(f"o{i}") == new[i], i
    run(main())


def test_4_plus_2_interrupted_overwrite_on_too_few_shards_rolls_back(local_cluster):
    """The erasure-coding write hole. An overwrite reaches only 3 of 6 members (three are
    frozen, then killed), so neither the new version (3 shards) nor the old one (3 shards left
    where nobody overwrote them) has the 4 a decode needs. Members keep the shard an overwrite
    replaces until the write is settled, so recovery can roll the object back to the old value:
    after the members return, the object reads as the old value (the new one was never
    acknowledged) and the PG ends clean. A new object written the same way is removed: there
    was nothing before it."""
    cluster = local_cluster(hosts=3, osds_per_host=2, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "ec", "--erasure", "4+2", "--osds-per-domain", "2",
                  "--pg-num", "1")
    old, new = random.Random(1).randbytes(1 << 20), random.Random(2).randbytes(1 << 20)

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=30) as client:
            pool = client.pool("ec")
            await pool.put("x", old)
            await pool.put("untouched", b"still here")
            members = cluster.cairn("map", "ec", "x")[1]["osds"]
            frozen = members[3:]
            for osd in frozen:
                cluster.script("kill", f"osd.{osd}", "--signal", "STOP")
            with pytest.raises(asyncio.TimeoutError):               # each reaches 3 members
                await asyncio.wait_for(asyncio.gather(pool.put("x", new),
                                                      pool.put("fresh", new)), 2.0)
            for osd in frozen:
                cluster.script("kill", f"osd.{osd}")
            cluster.wait_for("the frozen OSDs down", lambda: sum(
                cluster.osd(osd)["up"] for osd in frozen) == 0, 30)
            for osd in frozen:
                cluster.script("restart", f"osd.{osd}")
            cluster.wait_for("recovery ends", cluster.clean, 60)
            assert await pool.get("x") == old
            with pytest.raises(errors.ObjectNotFound):               # it never existed before
                await pool.get("fresh")
            assert await pool.get("untouched") == b"still here"
            await pool.put("x", new)                                 # and it takes new writes
            assert await pool.get("x") == new
    run(main())
