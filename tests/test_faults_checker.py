"""A model-based checker (like Ceph's ceph_test_rados) under OSD SIGKILLs.

Method: random puts, overwrites, deletes and reads go through the client library against an
in-memory model of what each object must hold, while the test SIGKILLs and restarts random OSDs:
one down at a time for the first part of the run, then two at a time. Two shapes: replicated
size 3 min_size 2 on 3 OSDs (two down: the PGs drop below min_size, writes are refused, reads
go on), and erasure-coded 4+2 min_size 4 on 3 hosts x 2 OSDs (two down: writes go on with
exactly k shards, and a read may find too few shards of an object whose other shards are on
the OSDs just killed: DataUnavailable, counted, never wrong bytes). An op that fails (timeout, refused) leaves its object
*uncertain*: either the old or the new value may be there, as for any unacknowledged write. Every
read must return the model's value (or one of the candidates while uncertain): never wrong bytes.
At the end every OSD is up, every PG active, and every object reads back as the model says.
A third shape hedges every replicated read at once (osd/hedged.py): a replica answers whenever
it is faster, so a replica that missed a write would be caught serving it.
"""

import asyncio
import hashlib
import os
import random
import time

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from cairn.common.hedge import Hedger
from tests.helpers import run

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")
RUN_S = 36.0
OBJECTS = 40


class Model:
    def __init__(self):
        self.values = {}            # name -> bytes or None (deleted / never written)
        self.candidates = {}        # name -> set of values possible after failed ops

    history = None

    def note(self, name, event):
        if self.history is None:
            self.history = {}
        now = time.time()        # wall clock, to match the daemons' logs
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f"{now % 1:.2f}"[1:]
        self.history.setdefault(name, []).append((stamp, event))

    def possible(self, name):
        return {self.values.get(name)} | self.candidates.get(name, set())

    def acknowledged(self, name, value):
        self.note(name, ("ack", tag(value)))
        self.values[name] = value
        self.candidates.pop(name, None)

    def failed(self, name, value):
        self.note(name, ("failed", tag(value)))
        self.candidates.setdefault(name, set()).add(value)


WORKERS = 6


def tag(value):
    """A value as the history shows it: its length and the start of its hash."""
    return None if value is None else f"{len(value)}:{hashlib.sha1(value).hexdigest()[:8]}"


async def worker(index, pool, model, rng, stop_at, stats):
    # Each worker owns its own objects, so the model's order of ops per object is the real one.
    mine = [f"obj-{i}" for i in range(index, OBJECTS, WORKERS)]
    while time.monotonic() < stop_at:
        name = rng.choice(mine)
        action = rng.random()
        try:
            if action < 0.45:
                value = os.urandom(rng.choice([1, 100, 5000, 70000]))
                try:
                    await pool.put(name, value)
                    model.acknowledged(name, value)
                    stats["puts"] += 1
                except (errors.Timeout, errors.PoolUnavailable):
                    model.failed(name, value)
                    stats["failed"] += 1
            elif action < 0.55:
                try:
                    await pool.delete(name)
                    model.acknowledged(name, None)
                    stats["deletes"] += 1
                except errors.ObjectNotFound as exc:
                    model.note(name, str(exc))
                    assert None in model.possible(name), \
                        f"{name} missing but acknowledged: {model.history.get(name)[-4:]} kills {model.history.get('kills')}"
                    model.acknowledged(name, None)
                except (errors.Timeout, errors.PoolUnavailable, errors.DataUnavailable):
                    # (a delete first reads the object, to find a striped one's stripes)
                    model.failed(name, None)
                    stats["failed"] += 1
            else:
                try:
                    got = await pool.get(name)
                except errors.ObjectNotFound:
                    got = None
                except (errors.Timeout, errors.DataUnavailable):
                    stats["failed"] += 1
                    continue
                assert got in model.possible(name), (
                    f"read of {name} returned {tag(got)} nobody wrote; history "
                    f"{(model.history or {}).get(name, [])[-8:]}; "
                    f"kills {(model.history or {}).get('kills', [])[-6:]}")
                model.note(name, ("read", tag(got)))
                if len(model.possible(name)) > 1:
                    model.acknowledged(name, got)    # a read settles what is there
                stats["reads"] += 1
        except errors.ProtocolError as exc:
            raise AssertionError(f"{name}: {exc}") from None


SHAPES = {
    "replicated": dict(osds_per_host=1, pool=("--replicated", "3", "--min-size", "2")),
    # Every read hedged at once (common/hedge.py with no delay and a budget of one hedge a
    # read): each read races a replica (osd/hedged.py) against its primary while OSDs die.
    "replicated-hedged": dict(osds_per_host=1, pool=("--replicated", "3", "--min-size", "2"),
                              hedge_all=True),
    "erasure-4+2": dict(osds_per_host=2, pool=("--erasure", "4+2", "--osds-per-domain", "2",
                                               "--min-size", "4")),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_checker_survives_osd_kills(local_cluster, shape):
    osds_per_host = SHAPES[shape]["osds_per_host"]
    osd_count = 3 * osds_per_host
    cluster = local_cluster(hosts=3, osds_per_host=osds_per_host, device_size="512M",
                            config=FAST)
    cluster.cairn("pool", "create", "data", *SHAPES[shape]["pool"], "--pg-num", "16")
    rng = random.Random(20261122)
    model = Model()
    stats = {"puts": 0, "deletes": 0, "reads": 0, "failed": 0, "kills": 0}
    hedges = {}

    async def faults(stop_at):
        two_from = stop_at - RUN_S / 3
        while time.monotonic() < stop_at - 6:
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            victims = [f"osd.{i}" for i in rng.sample(range(osd_count),
                                                       2 if time.monotonic() > two_from else 1)]
            for victim in victims:
                await asyncio.to_thread(cluster.script, "kill", victim)
                model.note("kills", victim)
                stats["kills"] += 1
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            for victim in victims:
                await asyncio.to_thread(cluster.script, "restart", victim)
            model.note("kills", "restarted")

    async def main():
        async with await Cluster.connect(cluster.dir, op_timeout_s=15) as client:
            if SHAPES[shape].get("hedge_all"):
                client.hedger = Hedger(time.monotonic, factor=0.0, floor_s=0.0, share=1.0)
            pool = client.pool("data")
            stop_at = time.monotonic() + RUN_S
            await asyncio.gather(faults(stop_at),
                                 *(worker(index, pool, model, random.Random(rng.random()),
                                          stop_at, stats) for index in range(WORKERS)))
            await asyncio.to_thread(cluster.wait_for, "every PG active", lambda: cluster.cairn(
                "status")[1].get("pg_states") == {"active": 16}, 30)
            for index in range(OBJECTS):
                name = f"obj-{index}"
                try:
                    got = await pool.get(name)
                except errors.ObjectNotFound:
                    got = None
                assert got in model.possible(name), f"{name}: final read is wrong"
            hedges.update(client.hedger.counts())
    run(main())
    print(stats)
    assert stats["kills"] >= 3 and stats["puts"] > 50 and stats["reads"] > 50, stats
    if SHAPES[shape].get("hedge_all"):
        print(hedges)
        assert hedges["sent"] > 20 and hedges["won"] + hedges["steered"] > 10, hedges
