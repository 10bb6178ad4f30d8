"""The seeded simulation of the shipped OSD code (tests/simnet.py): six OSDs, a replicated and an
erasure-coded pool, clients, crashes that tear unflushed writes, OSDs marked out and in, lost
and late messages, late maps, in virtual time. Each seed checks that no acknowledged write is
lost and that no read returns an older value than one acknowledged before it began.

A failing seed replays exactly: `.venv/bin/python -m tests.simnet SEED` (SIM_HISTORY=N shows the
last N events). CI runs SEEDS_IN_CI seeds of 30 virtual seconds each, on every core; the slow
tier runs as many more of 60 s as CAIRN_SIM_SEEDS says (thousands: `CAIRN_SIM_SEEDS=3000
.venv/bin/python -m pytest tests/test_simulation.py -k many`).
"""

import os
import re

import pytest

from tests.simnet import run_seeds, simulate

pytestmark = pytest.mark.unit

SEEDS_IN_CI = 240

# Seeds that fail when a fix of a bug the simulation found is undone (checked 2026-11-27 and,
# for the 60 s ones, 2026-11-28 by reverting each fix; the deterministic tests of each bug are
# in tests/test_osd_races.py). The simulation found each first on a seed of an earlier version
# of itself, whose runs differ: any change can move a run off its path (seeds 10321 and 10348,
# which found the rollback's missing question to the recovery source, no longer reach it).
FIX_CHECKS = {
    36: "a write planned in an earlier interval finishes in the next and drops an object from "
        "the new interval's missing set (PgCore.write_finished)",
    57: "a read admitted in one interval waits for the object's lock into the next and reads "
        "a copy the new missing set says is behind (PgCore.check_serving)",
    125: "an OSD whose map skipped epochs keeps an interval that another OSD's queries fenced "
         "off: the PG stays unavailable (PgRegistry.on_map)",
}
# The same, for seeds of the slow tier's length (60 s).
FIX_CHECKS_60 = {
    10533: "two live shards of the version being recovered, one on an OSD that now holds "
           "another position: the rollback waited for members that had all answered, and the "
           "PG peered for good (rollback_choice restores before it waits)",
    10615: "an object deleted, then written again by retries that each reached one member, "
           "with one stale shard of a version before the delete on a member that missed it: "
           "called lost, the PG degraded for good (rollback_choice: an absence counts when no "
           "older version is whole)",
    10963: "a delete retried after one that removed the primary's copy but was not "
           "acknowledged was answered not_found; the member that missed it brought the object "
           "back at the next peering (PgCore.plan_write carries the retry out again)",
    10990: "a put that waited 20 s for its object's lock behind a stuck write was carried out "
           "in a later interval, after its client had written a newer value elsewhere: the "
           "old value came back (ObjectService._admit_write refuses a write sent under a map "
           "older than the PG's interval; found 2026-11-28 in this session's own admission "
           "change)",
    11155: "an incomplete PG waits for a map that changes its acting set, and the complete "
           "member it waits for comes back without one: incomplete for good (PgRegistry.on_map)",
}


def test_a_seeded_cluster_never_loses_an_acknowledged_write_nor_reads_it_stale():
    """SEEDS_IN_CI seeds of 30 virtual seconds, on every core (each seed in a worker process;
    a failure names its seed and what it found, replay it with `python -m tests.simnet
    SEED`)."""
    found = run_seeds(range(SEEDS_IN_CI), 30.0, workers=os.cpu_count() or 1)
    assert not found, "\n\n".join(f"seed {seed}: {text}" for seed, text in found)


@pytest.mark.parametrize("seed, seconds", [(seed, 30.0) for seed in sorted(FIX_CHECKS)] +
                         [(seed, 60.0) for seed in sorted(FIX_CHECKS_60)])
def test_the_seeds_that_fail_without_a_fix_pass(seed, seconds):
    simulate(seed, duration_s=seconds)


@pytest.mark.skipif(not os.environ.get("CAIRN_SIM_SEEDS"),
                    reason="the slow tier: set CAIRN_SIM_SEEDS=N to run N seeds beyond CI's "
                           "(3000 take about 40 minutes on 2 cores)")
def test_many_more_seeds():
    count = int(os.environ["CAIRN_SIM_SEEDS"])
    found = run_seeds(range(10_000, 10_000 + count), 60.0, workers=os.cpu_count() or 1)
    assert not found, "\n\n".join(f"seed {seed}: {text}" for seed, text in found)


def test_the_simulation_exercises_what_it_claims_to():
    """Not vacuous: over a few seeds, OSDs crash and are marked out, writes end unknown,
    members are recovered both by log and by backfill, primaries serve with missing sets,
    erasure-coded objects with too few shards reach the rollback decision, ops from an old
    primary are refused, and reads check values. (Rollbacks themselves and incomplete PGs are
    rare here: none in these seeds on 2026-11-27.)"""
    seen = {"crashes": 0, "outs": 0, "unknown": 0, "reads": 0}
    events = {"by log": 0, "by backfill": 0, "serving with": 0, "too few shards": 0,
              "not the primary": 0}
    for seed in range(12):
        sim = simulate(seed, duration_s=60.0)
        for key in seen:
            seen[key] += sim.counts[key]
        for line in sim.history:
            for pattern in events:
                events[pattern] += bool(re.search(pattern, line))
    assert seen["crashes"] >= 20 and seen["outs"] >= 5, seen
    assert seen["unknown"] >= 1 and seen["reads"] >= 1000, seen
    assert all(count >= 1 for count in events.values()), events
