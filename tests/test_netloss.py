"""Packet-loss measurement and judgement, pure parts: the probe window's loss and RTT, the
datagram codec against garbage, and the monitors' judgement of pairs and hosts."""

import random

import pytest
from hypothesis import given, strategies as st

from cairn.mon.netloss import clean_report, judge
from cairn.osd import netprobe
from cairn.osd.netprobe import ECHO_TIMEOUT_S, ProbeWindow

pytestmark = pytest.mark.unit


def test_a_window_counts_lost_probes_once_their_echo_time_is_up():
    window = ProbeWindow()
    rng = random.Random(3)
    now, lost = 0.0, 0
    for _ in range(200):                          # 5 a second for 40 s, 10% never echoed
        seq = window.sent(now)
        if rng.random() < 0.1:
            lost += 1
        else:
            window.echoed(seq, now + 0.004)
        now += 0.2
    judged, counted, rtt = window.stats(now, 60.0)
    assert abs(judged - (200 - ECHO_TIMEOUT_S / 0.2)) <= 1 and 0.05 < counted / judged < 0.15
    assert rtt == pytest.approx(4.0, abs=0.01)
    fresh = ProbeWindow()
    fresh.echoed(fresh.sent(0.0), ECHO_TIMEOUT_S + 0.1)      # too late: lost
    fresh.echoed(fresh.sent(0.1), 0.2)
    fresh.echoed(12345, 0.2)                                 # never sent: ignored
    assert fresh.stats(ECHO_TIMEOUT_S + 0.2, 1.0) == (2, 1, 100.0)
    assert window.stats(now + 100, 20.0) == (0, 0, None)      # old probes leave the window


@given(st.binary(max_size=64))
def test_any_datagram_decodes_to_a_probe_or_nothing(data):
    message = netprobe.decode(data)
    assert message is None or netprobe.encode(*message) == data


def test_pairs_and_hosts_are_named():
    host_of = {0: "h1", 1: "h2", 2: "h3", 3: "h4"}

    def report(losses):
        return {osd: {other_host: {"short": [100, lost], "long": [225, lost], "rtt_ms": 0.3}
                      for other_host, lost in losses.get(osd, {}).items()}
                for osd in host_of}
    clean = {osd: {h: 0 for o, h in host_of.items() if o != osd} for osd in host_of}
    pairs, hosts, slow = judge(report(clean), host_of)
    assert (pairs, hosts, slow) == ([], [], [])
    one_pair = {osd: dict(losses) for osd, losses in clean.items()}
    one_pair[0]["h2"] = one_pair[1]["h1"] = 19
    pairs, hosts, _ = judge(report(one_pair), host_of)
    assert [pair.hosts for pair in pairs] == [("h1", "h2")] and hosts == []
    assert pairs[0].loss == pytest.approx(0.19)
    one_host = {osd: dict(losses) for osd, losses in clean.items()}
    for osd in (1, 2, 3):
        one_host[0][host_of[osd]] = one_host[osd]["h1"] = 12
    pairs, hosts, _ = judge(report(one_host), host_of)
    assert pairs == [] and hosts == ["h1"]
    light = {osd: dict(losses) for osd, losses in clean.items()}
    light[2]["h4"] = 3                            # 3 of 450 long-window probes: under 1.5%
    assert judge(report(light), host_of)[0] == []
    light[3]["h3"] = 5                            # 8 of 450: 1.8%
    assert [pair.hosts for pair in judge(report(light), host_of)[0]] == [("h3", "h4")]
    slow_report = report(clean)
    slow_report[0]["h3"]["rtt_ms"] = 900.0
    assert [pair.hosts for pair in judge(slow_report, host_of)[2]] == [("h1", "h3")]


def test_reports_from_the_wire_are_cleaned():
    assert clean_report("x") == {} and clean_report({"h1": {"short": [1, 2]}}) == {}
    assert clean_report({"h1": {"short": [10, 2], "long": [20, 3], "rtt_ms": float("inf")},
                         "h2": {"short": [1, 5], "long": [20, 3]}, 7: {}}) == \
        {"h1": {"short": [10, 2], "long": [20, 3], "rtt_ms": None}}
