"""Deterministic tests of the races CI and the seeded simulation found in the OSD's middle (and
one in the monitor's), each on the shipped code with the moment of the race fixed by hand:

- an erasure-coded member that refuses us as no longer the primary was counted as a missing
  shard (the read answered unavailable, recovery rolled objects back): CI, 2026-11-25;
- a new leader's tick ran the failure detector before its loop had built a fresh one, and
  marked every OSD down: CI, 2026-11-25;
- a primary copied its own missing (old) copy to a member during recovery: tests/test_peering.py
  `test_a_primary_recovers_its_own_missing_copy_before_it_copies_it_to_another_member`;
- a write planned in an earlier interval finished in the next and dropped an object from the
  new missing set (simulation seed 40, 2026-11-27);
- a read admitted in an earlier interval waited for the object's lock into the next one and
  read a copy the new missing set said was behind (simulation seed 72, 2026-11-27);
- an OSD whose map skipped epochs kept an interval that other OSDs' queries had fenced off
  (the simulation, 2026-11-27);
- a rollback needed while the primary caught itself up before activating waited for the
  activation, which waited for it (the simulation, 2026-11-27).
The simulation's fifth find, recovery by log missing an unacknowledged write below the target's
complete_to, is tested with `delta_names` in tests/test_peering.py.
"""

import asyncio
import random

import pytest

from cairn.common import pg as pgs
from cairn.common.clustermap import ClusterMap, Incremental
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.mon import monitor as monitor_module
from cairn.mon.failure import FailureDetector
from cairn.mon.raft import Raft, Restored, Role
from cairn.osd import ecstripe
from cairn.osd.backend_erasure import ErasureBackend
from cairn.osd.pg import PgCore, Refused
from cairn.osd.pgs import Pg
from cairn.osd.port import Port
from tests.helpers import run

pytestmark = pytest.mark.unit


def cluster(osds=4):
    cmap = ClusterMap("races", epoch=1)
    ops = []
    for osd_id in range(osds):
        ops += [{"op": "osd_add", "id": osd_id, "uuid": f"u{osd_id}",
                 "location": {"host": f"h{osd_id}"}},
                {"op": "osd_boot", "id": osd_id, "addr": f"127.0.0.1:{7000 + osd_id}"}]
    ops.append({"op": "pool_create", "name": "ec", "kind": "erasure", "k": 2, "m": 2,
                "pg_num": 1})
    return cmap.apply(Incremental(2, tuple(ops)))


class ScriptedPort(Port):
    """A port whose calls to other OSDs are answered by `answer(osd, header)`; every call is
    recorded."""

    def __init__(self, me, cmap, answer):
        self._me, self._map, self.answer, self.calls = me, cmap, answer, []

    @property
    def me(self):
        return self._me

    @property
    def store(self):
        raise AssertionError("this test's OSD has no store")

    @property
    def map(self):
        return self._map

    async def remote(self, osd_id, header, payload):
        self.calls.append((osd_id, header["op"]))
        return self.answer(osd_id, header)

    def send(self, osd_id, header, payload, timeout_s, crc=None):
        raise AssertionError("no writes here")

    async def monitor(self, request):
        raise AssertionError("no monitors here")

    async def wait_for_epoch(self, epoch, timeout_s):
        raise AssertionError("no maps here")


def test_an_ec_member_that_refuses_us_as_primary_means_an_old_map_not_a_lost_shard():
    """Recovery of this primary's own shard asks the other members for theirs; they have a
    newer map and answer wrong_primary. That is `again` (retry on the newer map), never
    `unavailable`, and never a rollback (no pg_versions asked, nothing pushed)."""
    cmap = cluster()
    pool = cmap.pools["ec"]
    version = pgs.make_version(5, 3)
    unit = ecstripe.unit_for(2)

    def answer(osd, header):
        if header["op"] == "pg_read" and header.get("ranges") == []:        # the source's stat
            return {"version": version, "ec": [3 * unit, unit], "shard": osd,
                    "manifest": False}, b""
        raise RequestFailed(Code.WRONG_PRIMARY, f"osd.0 is not the primary of pg "
                            f"{pool['id']}.0 here (osd.{osd}, epoch 6)")
    port = ScriptedPort(0, cmap, answer)
    backend = ErasureBackend(port, None)
    pg = Pg((pool["id"], 0), 0, backend)
    pg.core.new_interval(5, pgs.Acting((0, 1, 2, 3), 0, 4, 3))

    with pytest.raises(RequestFailed) as caught:
        run(backend.recover_object(pg, 1, 0, "obj", 5))
    assert caught.value.code == Code.AGAIN, caught.value
    ops = {op for _, op in port.calls}
    assert "pg_versions" not in ops and "pg_push" not in ops, port.calls


def test_an_ec_rollback_asks_the_recovery_source_out_of_the_acting_set_too():
    """The recovery's source (an authority no longer acting) names version v of an object
    that no acting member holds; only the source has a shard of it and, stashed, the absence
    it replaced. Its answer decides: the object was absent before v, never acknowledged, so
    the rollback deletes it (before, the acting members' empty answers made it `lost` and the
    PG peered again forever: the slow tier's seeds 10321 and 10348, 2026-11-28)."""
    cmap = cluster(osds=5)
    pool = cmap.pools["ec"]
    version = pgs.make_version(5, 3)
    unit = ecstripe.unit_for(2)
    source = 4

    def answer(osd, header):
        if header["op"] == "pg_read" and header.get("ranges") == [] and osd == source:
            return {"version": version, "ec": [3 * unit, unit], "shard": 1,
                    "manifest": False}, b""
        if header["op"] == "pg_versions":
            held = [{"version": version, "shard": 1, "ec": [3 * unit, unit],
                     "manifest": False}, {"absent": True, "replaced_by": version}] \
                if osd == source else []
            return {"held": held, "acked_seen": 0}, b""
        raise RequestFailed(Code.NOT_FOUND, f"osd.{osd}: object 'obj' not found")
    port = ScriptedPort(9, cmap, answer)                 # the primary's calls, all remote
    backend = ErasureBackend(port, None)
    pg = Pg((pool["id"], 0), 9, backend)
    pg.core.new_interval(5, pgs.Acting((0, 1, 2, 3), 0, 4, 3))
    rewrites = []

    async def rewrite(pg, name, payload, delete, manifest):
        rewrites.append((name, payload, delete))
    backend.rewrite = rewrite

    assert run(backend.recover_object(pg, source, 2, "obj", 5)) == "removed"
    assert rewrites == [("obj", None, True)]
    assert (source, "pg_versions") in port.calls, port.calls


def test_a_new_leaders_tick_waits_until_its_loop_built_a_fresh_failure_detector(tmp_path,
                                                                               monkeypatch):
    """The Raft core turns leader inside tick() or step(); the monitor's loop notices only
    after carrying out that Ready. In between, the tick loop must not run the failure
    detector it kept as a follower (it heard no heartbeats: every OSD would go down); once the
    loop noticed, the fresh detector gives every OSD a full grace."""
    monitor = monitor_module.Monitor(str(tmp_path), "127.0.0.1:0")
    monitor.map = cluster()
    raft = Raft("mon.0", Restored.initial({"mon.0": "a0"}), random.Random(1))
    while raft.role is not Role.LEADER:
        raft.tick()
    monitor.raft = raft
    monitor._applied = raft.commit
    monitor._detector = FailureDetector(0)          # the follower's: heard nothing since 0
    monitor._detector.observe(monitor.map, 0)
    proposed = []

    async def propose(ops, why, rid=None):
        proposed.append((ops, why))

    async def rotate(_monitor):
        pass
    monitor.propose = propose
    monkeypatch.setattr(monitor_module, "TICK_S", 0.001)
    monkeypatch.setattr(monitor_module.authority, "rotate_service_keys", rotate)
    monitor._capacity_judged_at = float("inf")      # no capacity judgement in this test

    async def ticks(count_s):
        task = asyncio.create_task(monitor._tick_loop())
        await asyncio.sleep(count_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert monitor.is_leader and not monitor._leads_noticed()
    run(ticks(0.05))
    assert proposed == []                           # the stale detector never ran
    monitor._leading = raft.term                    # what the Raft loop does when it notices
    monitor._leadership_changed()
    run(ticks(0.05))
    assert proposed == []                           # the fresh detector: a full grace first


def test_a_write_planned_in_an_earlier_interval_changes_nothing_in_the_next():
    pg = PgCore((1, 0), me=0)
    pg.new_interval(5, pgs.Acting((0, 1, 2), 0, 3, 2))
    pg.log_loaded([], None, None)
    pg.activated((0, 1, 2), writable=True, more_to_recover=False)
    old = pg.plan_write(pg.acting, 5, "obj", False, False, existed=True)
    # The replica's reply takes its whole deadline; meanwhile the PG moves on and finds a
    # newer version of the object elsewhere.
    pg.new_interval(7, pgs.Acting((0, 1, 3), 0, 3, 2))
    newer = pgs.make_version(6, 1)
    pg.set_missing(1, newer, {"obj": (newer, 10)}, {"obj": old.version})
    pg.activated((1,), writable=True, more_to_recover=True)
    count = pg.object_count
    pg.write_finished(old, committed_here=True, acknowledged=False)
    assert pg.missing == {"obj": newer} and pg.object_count == count
    current = pg.plan_write(pg.acting, 7, "obj", False, False, existed=True)
    pg.write_finished(current, committed_here=True, acknowledged=True)
    assert pg.missing == {}                         # a write of this interval does replace it


def test_a_delete_retried_after_an_unacknowledged_one_is_carried_out_not_answered_not_found():
    """A delete removed the primary's copy but a replica never answered: the client retries.
    The copy here is gone, yet a member may still hold the object and the next peering may
    bring it back, so the retry is planned as a delete again (its log entry reaches every
    member), not answered `not_found` (the slow tier's seeds 10963 and 10652). Once a delete of
    it was acknowledged, a delete of the absent object is `not_found` as before."""
    pg = PgCore((1, 0), me=0)
    pg.new_interval(5, pgs.Acting((0, 1, 2), 0, 3, 2))
    pg.log_loaded([], None, None)
    pg.activated((0, 1, 2), writable=True, more_to_recover=False)
    first = pg.plan_write(pg.acting, 5, "obj", True, False, existed=True)
    pg.write_finished(first, committed_here=True, acknowledged=False)
    retry = pg.plan_write(pg.acting, 5, "obj", True, False, existed=False)
    assert retry.delete and retry.version > first.version
    pg.write_finished(retry, committed_here=True, acknowledged=True)
    with pytest.raises(Refused) as refused:
        pg.plan_write(pg.acting, 5, "obj", True, False, existed=False)
    assert refused.value.code == Code.NOT_FOUND
    with pytest.raises(Refused) as refused:
        pg.plan_write(pg.acting, 5, "never", True, False, existed=False)
    assert refused.value.code == Code.NOT_FOUND


def test_an_op_admitted_in_an_earlier_interval_is_refused_after_it_waited():
    pg = PgCore((1, 0), me=0)
    pg.new_interval(5, pgs.Acting((0, 1, 2), 0, 3, 2))
    pg.activated((0, 1, 2), writable=True, more_to_recover=False)
    admitted = pg.interval
    pg.check_serving(admitted)                      # nothing moved: it goes on
    pg.new_interval(6, pgs.Acting((0, 1, 3), 0, 3, 2))
    with pytest.raises(Refused) as caught:
        pg.check_serving(admitted)                  # peering again: the old admission is void
    assert caught.value.code == Code.AGAIN
    pg.activated((0, 1), writable=True, more_to_recover=True)
    with pytest.raises(Refused):
        pg.check_serving(admitted)                  # active again, but in another interval
    pg.check_serving(pg.interval)


def held(version, shard, entry=None, ec=(8192, 4096)):
    return {"version": version, "shard": shard, "ec": list(ec), "manifest": False,
            "entry": entry}


def test_the_rollback_choice_restores_waits_or_gives_up_as_the_members_answers_say():
    """osd/pg.py `rollback_choice`, the pure decision behind ErasureBackend._roll_back (k=2,
    four positions): the version being recovered is v5; v3 is the version before it."""
    from cairn.osd.pg import rollback_choice
    v3, v5 = pgs.make_version(3, 1), pgs.make_version(5, 1)

    def answer(*items, acked=0):
        return {"held": list(items), "acked_seen": acked}
    # Two positions silent, one live shard of v5: they may hold the rest.
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, None), (2, None),
                                  (3, answer(held(v3, 3)))], 2)
    assert choice.action == "wait"
    # Everyone answered; v5 reached one member; v3 is whole counting a stash entry: roll back.
    stash = f"{v5:016x}.obj"
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, answer(held(v3, 1, stash))),
                                  (2, answer(held(v3, 2))), (3, answer())], 2)
    assert (choice.action, choice.version) == ("restore", v3)
    assert choice.sources == ((1, 1, stash), (2, 2, None)) and choice.geometry == (8192, 4096)
    # The same, but v5 was acknowledged (a member saw acked_to reach it): lost, not rolled back.
    choice = rollback_choice(v5, [(0, answer(held(v5, 0), acked=v5)),
                                  (1, answer(held(v3, 1, stash))), (2, answer(held(v3, 2))),
                                  (3, answer())], 2)
    assert choice.action == "lost" and "acknowledged" in choice.reason
    # v5 itself was moved into stashes by a later write that never finished: it comes back,
    # acknowledged or not.
    later = f"{pgs.make_version(6, 1):016x}.obj"
    choice = rollback_choice(v5, [(0, answer(held(v5, 0, later), acked=v5)),
                                  (1, answer(held(v5, 1, later))), (2, answer()),
                                  (3, answer())], 2)
    assert (choice.action, choice.version) == ("restore", v5)
    # The object did not exist before v5: delete it.
    absent = {"absent": True, "replaced_by": v5}
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, answer(absent)),
                                  (2, answer(absent)), (3, answer())], 2)
    assert choice.action == "delete"
    # The same with one shard of v3 left on a member that missed the delete before v5 (an
    # acknowledged v3 would be whole): still a delete, the stale shard named (seed 10615).
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, answer(absent)),
                                  (2, answer(held(v3, 2))), (3, answer())], 2)
    assert choice.action == "delete" and f"{v3:x}" in choice.reason
    # The absence is older than v5, behind unacknowledged writes v4 that reached one member
    # each (a client's retries): still a delete. But a whole v3 is restored, absence or not.
    v4 = pgs.make_version(4, 1)
    early_absent = {"absent": True, "replaced_by": v4}
    choice = rollback_choice(v5, [(0, answer(held(v5, 0), early_absent,
                                             held(v4, 0, stash))),
                                  (1, answer()), (2, answer(held(v3, 2))), (3, answer())], 2)
    assert choice.action == "delete"
    choice = rollback_choice(v5, [(0, answer(held(v5, 0), early_absent)),
                                  (1, answer(held(v3, 1))), (2, answer(held(v3, 2))),
                                  (3, answer())], 2)
    assert (choice.action, choice.version) == ("restore", v3)
    # Everyone answered and two live shards of v5 exist, one on an OSD that now holds another
    # position (a read by position missed it): restore v5 from them now, no waiting for good
    # (the slow tier's seed 10533).
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, answer(held(v5, 3))),
                                  (2, answer()), (3, answer())], 2)
    assert (choice.action, choice.version) == ("restore", v5)
    assert choice.sources == ((0, 0, None), (3, 1, None))
    # v3 is whole in the stashes, replaced by write v4 of which nobody holds a shard, and a
    # member then stashed an absence for v5: v4 was a delete. Restoring v3 would bring back a
    # value that delete removed (the slow tier's seed 10879): delete again. Without the
    # absence after it, v4 may be a lost unacknowledged put: v3 is restored.
    by_v4 = f"{v4:016x}.obj"
    deleted = [(0, answer(held(v3, 0, by_v4) | {"replaced_by": v4},
                          {"absent": True, "replaced_by": v5}, held(v5, 0))),
               (1, answer(held(v3, 1, by_v4) | {"replaced_by": v4})), (2, answer()),
               (3, answer())]
    choice = rollback_choice(v5, deleted, 2)
    assert choice.action == "delete" and f"{v4:x}" in choice.reason, choice
    deleted[0] = (0, answer(held(v3, 0, by_v4) | {"replaced_by": v4}, held(v5, 0)))
    choice = rollback_choice(v5, deleted, 2)
    assert (choice.action, choice.version) == ("restore", v3)
    # No absence attested and no older version whole: lost.
    choice = rollback_choice(v5, [(0, answer(held(v5, 0))), (1, answer()),
                                  (2, answer(held(v3, 2))), (3, answer())], 2)
    assert choice.action == "lost"


def test_a_map_that_skips_epochs_starts_a_new_interval_even_with_the_same_members():
    """An OSD that sees epoch 2 and then epoch 4 cannot know whether another OSD led its PGs at
    epoch 3; if one did, its queries raised the members' min_epoch to 3 and they refuse every
    op of an interval that began at 2, for good. So a gap starts a new interval of every PG
    here (the seeded simulation found a PG left unavailable this way); consecutive maps with
    the same members do not."""
    from cairn.osd.pgs import PgRegistry
    cmap = cluster()
    acting = pgs.acting_set(cmap, "ec", 0)
    me = next(osd for osd in acting.members if osd != acting.primary)   # a member: no peering
    registry = PgRegistry(ScriptedPort(me, cmap, None), None, {})
    step = lambda m: m.apply(Incremental(m.epoch + 1, ({"op": "config_set",
                                                       "key": "scrub.interval_s",
                                                       "value": str(m.epoch)},)))
    registry.on_map(cmap)
    key = (cmap.pools["ec"]["id"], 0)
    assert registry.pgs[key].core.interval[0] == cmap.epoch
    following = step(cmap)
    registry.on_map(following)                      # the next epoch, same members: no change
    assert registry.pgs[key].core.interval[0] == cmap.epoch
    skipped = step(step(following))
    registry.on_map(skipped)                        # two epochs at once: a new interval
    assert registry.pgs[key].core.interval[0] == skipped.epoch
    assert registry.pgs[key].core.interval[1].members == acting.members


def test_a_rollback_may_rewrite_while_the_primary_catches_up_before_activating():
    """An erasure-coded object that needs a rollback while the primary recovers itself from a
    non-acting authority (RECOVERING) must be rewritable then: the activation waits for that
    recovery, so a rewrite that waited for the activation restarted peering forever (the
    seeded simulation, 2026-11-27). Client writes still wait for the activation."""
    from cairn.osd.pg import Phase
    pg = PgCore((1, 0), me=0)
    pg.new_interval(5, pgs.Acting((0, 1, 2), 0, 3, 2))
    pg.log_loaded([], None, None)
    pg.peering_moved(Phase.RECOVERING)
    with pytest.raises(Refused):
        pg.plan_write(pg.acting, 5, "obj", False, False, existed=True)
    plan = pg.plan_write(pg.acting, 5, "obj", False, False, existed=True, recovery=True)
    assert plan.version == pgs.make_version(5, 1)
    assert all(not target.complete for target in plan.targets)   # nobody complete yet
    pg.peering_moved(Phase.PEERING)
    with pytest.raises(Refused):                                   # only while RECOVERING
        pg.plan_write(pg.acting, 5, "obj", False, False, existed=True, recovery=True)
