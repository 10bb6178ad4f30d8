"""The slow-disk detector on synthetic heartbeat histories: it names the one slow OSD after the
sustain time and not before, clears with hysteresis, and stays quiet on a busy healthy cluster,
with too few samples or peers, and under the absolute floor."""

import random

import pytest

from cairn.mon.slowdisk import Settings, SlowDiskDetector

pytestmark = pytest.mark.unit

S = Settings(factor=3.0, floor_ms=5.0, window_s=10.0, sustain_s=6.0, clear_s=15.0,
             min_samples=10, min_peers=2)


def summary(mean_ms, count=20, size_class="64K", kind="write"):
    return {kind: {size_class: {"count": count, "mean_ms": mean_ms, "p50_ms": mean_ms,
                                "p99_ms": mean_ms * 2, "bytes": count * 65536}}}


def run(detector, seconds, latency_of, start=0.0, step=1.0, up=(0, 1, 2, 3)):
    """Feed one heartbeat per OSD per step; [(time, {osd: Finding})]."""
    seen = []
    now = start
    while now < start + seconds:
        for osd in up:
            detector.observe(osd, now, latency_of(osd, now))
        seen.append((now, detector.evaluate(now, set(up))))
        now += step
    return seen


def test_one_slow_osd_is_named_after_the_sustain_time_and_clears_with_hysteresis():
    detector = SlowDiskDetector(S)
    healthy = lambda osd, now: summary(8.0 + osd)                           # noqa: E731
    assert all(not slow for _, slow in run(detector, 30, healthy))
    faulty = lambda osd, now: summary(200.0 if osd == 2 else 8.0 + osd)   # noqa: E731
    seen = run(detector, 20, faulty, start=30)
    first = next(now for now, slow in seen if slow)
    assert 30 + S.sustain_s - 1 <= first <= 30 + S.sustain_s + 1
    for now, slow in seen:
        assert set(slow) <= {2}
    finding = seen[-1][1][2]
    assert finding.kind == "write" and finding.size_class == "64K"
    assert finding.mean_ms == 200.0 and finding.median_ms == 9.0 and finding.ratio > 20
    assert finding.since == first
    # 2.5x its peers: under the raising factor, over the clearing one: still slow.
    lingering = lambda osd, now: summary(22.5 if osd == 2 else 9.0)       # noqa: E731
    seen = run(detector, 40, lingering, start=50)
    assert all(2 in slow for _, slow in seen)
    seen = run(detector, 40, healthy, start=90)
    cleared = next(now for now, slow in seen if not slow)
    assert cleared <= 90 + S.window_s + S.clear_s + 1
    assert all(not slow for now, slow in seen if now >= cleared)


def test_a_busy_healthy_cluster_raises_nothing():
    rng = random.Random(7)
    detector = SlowDiskDetector(S)

    def noisy(osd, now):
        load = 1 + 2 * (int(now) // 20 % 2)                 # the whole cluster busier at times
        return {"write": {"64K": {"count": rng.randint(5, 60), "mean_ms": load * rng.uniform(2, 6),
                                  "p99_ms": 40.0}},
                "read": {"4K": {"count": rng.randint(0, 30), "mean_ms": load * rng.uniform(0.2, 2),
                                "p99_ms": 10.0}}}
    assert all(not slow for _, slow in run(detector, 300, noisy, step=0.5))


def test_few_samples_few_peers_or_under_the_floor_raise_nothing():
    for settings, latency_of, up in (
            (Settings(min_samples=50), lambda osd, now: summary(500.0 if osd == 0 else 5.0,
                                                                count=3), (0, 1, 2, 3)),
            (S, lambda osd, now: summary(500.0 if osd == 0 else 5.0), (0, 1)),
            (S, lambda osd, now: summary(4.0 if osd == 0 else 0.1), (0, 1, 2, 3))):
        detector = SlowDiskDetector(settings)
        assert all(not slow for _, slow in run(detector, 30, latency_of, up=up))


def test_sizes_are_compared_within_their_class_and_gone_osds_are_forgotten():
    detector = SlowDiskDetector(S)

    def mixed(osd, now):           # osd 0 writes only 1 MiB ops, slower per op but not slow
        if osd == 0:
            return summary(40.0, size_class="1M")
        return {**summary(4.0), "write": {"64K": summary(4.0)["write"]["64K"],
                                          "1M": summary(35.0)["write"]["64K"]}}
    assert all(not slow for _, slow in run(detector, 30, mixed))
    faulty = lambda osd, now: summary(300.0 if osd == 3 else 6.0)         # noqa: E731
    seen = run(detector, 20, faulty, start=30)
    assert 3 in seen[-1][1]
    assert detector.evaluate(51.0, {0, 1, 2}) == {}


def test_summaries_from_the_wire_are_cleaned():
    from cairn.mon.slowdisk import clean_summary
    assert clean_summary(None) == {} and clean_summary({"write": 3}) == {}
    good = {"count": 4, "mean_ms": 1.5, "p99_ms": 3, "bytes": 9}
    assert clean_summary({"write": {"4K": good, "x": {"count": "4", "mean_ms": 1},
                                    "y": {"count": 1, "mean_ms": float("nan")},
                                    "z": {"count": -1, "mean_ms": 1.0}},
                          "flush": {"4K": good}}) == \
        {"write": {"4K": {"count": 4, "mean_ms": 1.5, "p99_ms": 3.0}}}
