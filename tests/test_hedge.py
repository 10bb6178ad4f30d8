"""The hedging policy (common/hedge.py, pure): the delay follows the reads' latency within its
floor and cap, the budget holds however slow every read is, a primary a hedge beat is steered
around for STEER_S and then asked again, and the counters say what happened by OSD."""

import pytest

from cairn.common import hedge
from cairn.common.hedge import Hedger
from cairn.mon import health

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_delay_follows_the_reads_between_floor_and_cap():
    hedger = Hedger(Clock())
    assert hedger.delay() == hedge.HEDGE_FLOOR_S            # nothing seen yet
    for _ in range(hedge.WINDOW):
        hedger.record(0.004)
    assert hedger.delay() == pytest.approx(hedge.HEDGE_FACTOR * 0.004)
    for _ in range(hedge.WINDOW):
        hedger.record(0.0001)                               # fast reads: the floor holds
    assert hedger.delay() == hedge.HEDGE_FLOOR_S
    for _ in range(hedge.WINDOW):
        hedger.record(5.0)                                  # a slow cluster: the cap holds
    assert hedger.delay() == hedge.HEDGE_CAP_S


def test_the_budget_holds_when_every_read_is_late():
    hedger = Hedger(Clock())
    reads = 10_000
    sent = 0
    for _ in range(reads):
        sent += hedger.may_hedge(3)                         # every read wants a hedge
        hedger.record(1.0)
    assert sent <= hedge.HEDGE_SHARE * reads + hedge.HEDGE_BURST
    assert sent >= hedge.HEDGE_SHARE * reads * 0.9          # and the share is spent
    assert hedger.counts()["sent"] == sent == hedger.counts()["by_osd"]["osd.3"]["sent"]


def test_a_primary_a_hedge_beat_is_steered_around_then_asked_again():
    clock = Clock()
    hedger = Hedger(clock)
    assert not hedger.steering(1)
    assert hedger.evidence_s() >= hedge.STEER_EVIDENCE_S_MIN
    hedger.note_won(1)
    hedger.note_won(2)
    assert not hedger.steering(1)                           # a win alone steers nothing
    hedger.steer(1)                                         # (osd.1 was still due after)
    assert hedger.steering(1) and not hedger.steering(2)
    clock.now += hedge.STEER_S / 4
    assert hedger.steering(1)
    clock.now += hedge.STEER_S
    assert not hedger.steering(1)                           # its next read goes to it
    hedger.note_wasted(2)
    hedger.note_refused(2)
    hedger.note_steered(1)
    counts = hedger.counts()
    assert counts["by_osd"] == {
        "osd.1": {"sent": 0, "won": 1, "wasted": 0, "refused": 0, "steered": 1},
        "osd.2": {"sent": 0, "won": 1, "wasted": 1, "refused": 1, "steered": 0}}
    assert (counts["won"], counts["wasted"], counts["refused"], counts["steered"]) == (2, 1, 1, 1)


def test_a_hedger_made_not_to_steer_never_steers():
    hedger = Hedger(Clock(), steer_s=0.0)
    hedger.steer(1)
    assert not hedger.steering(1) and hedger.steered_first([1, 2]) == []


def test_reads_hedged_names_the_osd_reads_go_around_at_the_rate_set():
    class Map:
        osds = {1: {"location": {"host": "h1"}}, 2: {"location": {"host": "h2"}}}
    assert health.clean_around({"1": 5, "x": 3, "2": -1, "3": 2.5}) == {1: 5}
    assert health.clean_around(["1"]) == {}
    reports = {
        0: [(8.0, {1: 40}), (10.0, {1: 100}), (12.0, {1: 160, 2: 4})],  # 30/s around osd.1
        3: [(10.5, {2: 7}), (12.5, {2: 3})],                # restarted: 3 in 2 s
        4: [(12.0, {1: 10_000})],                           # one report: no rate yet
    }
    rates, before = health.reads_around_rates(reports), health.reads_around_rates(reports, 1)
    assert rates == {1: 30.0, 2: pytest.approx(2.0 + 1.5)} and before == {1: 30.0}
    found = health.reads_hedged_check(Map(), rates, 5.0, [before])
    assert found["severity"] == health.WARN and "osd.1" in found["summary"]
    assert "osd.2" not in found["summary"]
    assert found["detail"] == ["osd.1 (host h1): 30.0 reads/s went around it"]
    # One interval's burst (a second's steering after one stall) names nobody.
    assert health.reads_hedged_check(Map(), rates, 5.0, [before, {1: 2.0}]) is None
    assert health.reads_hedged_check(Map(), rates, 50.0) is None
