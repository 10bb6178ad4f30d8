"""Recovery windows and the token bucket (pure, with a fake clock)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from cairn.common import config, throttle
from cairn.common.throttle import TokenBucket, budget, parse_windows

pytestmark = pytest.mark.unit

MIB = 1024 * 1024


def test_windows_pick_the_budget_by_day_and_time():
    windows = parse_windows(json.dumps([
        {"days": "mon-fri", "start": "09:00", "end": "21:00", "max_bytes_per_s": "50M",
         "max_active": 1},
        {"days": "sat,sun", "start": "22:00", "end": "06:00", "max_bytes_per_s": "1G",
         "max_active": 8}]))
    work = budget(windows, 0, 4, weekday=2, minute=10 * 60)            # Wednesday 10:00
    assert (work.max_bytes_per_s, work.max_active) == (50 * MIB, 1)
    assert budget(windows, 0, 4, 2, 21 * 60).window == "default"       # 21:00 is outside
    assert budget(windows, 0, 4, 4, 8 * 60 + 59).window == "default"   # Friday 08:59
    assert budget(windows, 0, 4, 5, 23 * 60).max_active == 8           # Saturday 23:00
    assert budget(windows, 0, 4, 0, 3 * 60).max_active == 8            # Monday 03:00: Sunday's
    assert budget(windows, 0, 4, 5, 3 * 60).window == "default"        # Saturday 03:00: Friday
    assert budget([], 7, 2, 0, 0) == throttle.Budget(7, 2, "default")


def test_bad_windows_are_refused_with_the_reason():
    cases = [("{}", "JSON list"), ("[1]", "is an object"),
             ('[{"start": "9", "end": "10:00"}]', "HH:MM"),
             ('[{"start": "09:00"}]', "start and end are required"),
             ('[{"days": "someday", "start": "09:00", "end": "10:00"}]', "days 'someday'"),
             ('[{"start": "09:00", "end": "10:00", "max_active": 0}]', "max_active"),
             ('[{"start": "09:00", "end": "10:00", "max_bytes_per_s": "fast"}]', "not a size"),
             ('[{"start": "09:00", "end": "10:00", "speed": 1}]', "unknown field"),
             ("not json", "not JSON")]
    for text, message in cases:
        with pytest.raises(ValueError, match=message):
            parse_windows(text)
        with pytest.raises(ValueError, match="recovery.windows"):
            config.check("recovery.windows", text)


@given(st.integers(1, 200) .map(lambda mb: mb * 1_000_000),
       st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 8 * MIB)), min_size=1, max_size=300))
@settings(max_examples=100, deadline=None, derandomize=True)
def test_bucket_never_lets_more_than_rate_times_time_plus_burst(rate, transfers):
    """Whatever the sizes and gaps, bytes sent by time t never exceed burst + rate * t, and a
    sender that always waits as told achieves the rate (no starvation)."""
    bucket = TokenBucket(rate, 0.0)
    now = 0.0
    sent = 0
    burst = rate * throttle.BURST_S
    for gap, size in transfers:
        now += gap
        wait = bucket.wait_s(size, now)
        now += wait                       # the sender waits, then its bytes go
        sent += size
        assert sent <= burst + rate * now + 1
    # ...and nobody waits longer than the bytes need: total waiting <= sent / rate.
    assert now <= sum(gap for gap, _ in transfers) + sent / rate + 1e-6


def test_bucket_rate_changes_apply_and_zero_means_unlimited():
    bucket = TokenBucket(0, 0.0)
    assert bucket.wait_s(10**12, 0.0) == 0.0
    bucket.set_rate(10 * MIB, 1.0)
    bucket.wait_s(bucket.tokens, 1.0)                 # empty it
    assert bucket.wait_s(10 * MIB, 1.0) == pytest.approx(1.0)
    bucket.set_rate(20 * MIB, 2.0)
    assert bucket.wait_s(10 * MIB, 2.0) == pytest.approx(0.5)


def test_a_cluster_budget_is_split_among_the_osds_recovering_and_the_lower_limit_wins():
    windows = parse_windows(json.dumps([
        {"days": "daily", "start": "09:00", "end": "21:00", "cluster_max_bytes_per_s": "200M",
         "max_bytes_per_s": "50M"}]))
    day = budget(windows, 0, 4, 2, 10 * 60, default_cluster_bytes_per_s=12_000_000)
    night = budget(windows, 0, 4, 2, 23 * 60, default_cluster_bytes_per_s=12_000_000)
    assert (day.cluster_max_bytes_per_s, day.max_bytes_per_s) == (200 * MIB, 50 * MIB)
    assert (night.cluster_max_bytes_per_s, night.max_bytes_per_s) == (12_000_000, 0)
    assert throttle.cluster_share(12_000_000, 3) == 4_000_000
    assert throttle.cluster_share(12_000_000, 0) == 12_000_000       # the asker alone
    assert throttle.cluster_share(0, 3) == 0                         # no cluster-wide limit
    assert throttle.cluster_share(2, 3) == 1                         # never "unlimited"
    assert throttle.effective_rate(0, 4_000_000) == 4_000_000
    assert throttle.effective_rate(3_000_000, 4_000_000) == 3_000_000
    assert throttle.effective_rate(5_000_000, 0) == 5_000_000
    assert throttle.effective_rate(0, 0) == 0
    with pytest.raises(ValueError, match="cluster_max_bytes_per_s"):
        parse_windows('[{"start": "09:00", "end": "10:00", "cluster_max_bytes_per_s": "-1"}]')
    config.check("recovery.cluster_max_bytes_per_s", "200M")
    with pytest.raises(ValueError):
        config.check("recovery.cluster_max_bytes_per_s", "fast")
