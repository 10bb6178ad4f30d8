"""Packet loss and slow round trips between hosts, from the OSDs' UDP probe reports (pure).

Every OSD reports, per peer host, the probes judged and lost over a short and a long window
(osd/netprobe.py) and the mean RTT. Reports about one pair of hosts, from either side and from
every OSD on it, are added up. A pair is lossy when the short window lost at least
`SHORT_LOSS_MIN` of at least `SHORT_PROBES_MIN` probes (a heavy loss, named within seconds), or
the long window at least `loss_min` of at least `LONG_PROBES_MIN` (a light one). A host lossy to
every peer (two or more) is named as the host, not as each of its pairs. A pair whose RTT is over
`slow_ping_ms` is slow. Nothing is kept: a pair clears as soon as its windows hold no such loss.
"""

import dataclasses
import math

SHORT_PROBES_MIN = 40
SHORT_LOSS_MIN = 0.05
LONG_PROBES_MIN = 150


@dataclasses.dataclass(frozen=True)
class PairLoss:
    hosts: tuple            # (host, host), sorted
    loss: float             # the worse window's lost fraction
    probes: int
    rtt_ms: float | None


def _counts(value):
    if isinstance(value, list) and len(value) == 2 and all(
            type(v) is int and v >= 0 for v in value) and value[1] <= value[0]:
        return value
    return None


def clean_report(value):
    """{peer host: {"short": [judged, lost], "long": [...], "rtt_ms": x|None}} from a heartbeat
    (remote input): well-formed entries only."""
    clean = {}
    if not isinstance(value, dict):
        return clean
    for host, entry in list(value.items())[:256]:
        if not isinstance(host, str) or not isinstance(entry, dict):
            continue
        short, long_, rtt = _counts(entry.get("short")), _counts(entry.get("long")), \
            entry.get("rtt_ms")
        if short is None or long_ is None:
            continue
        if rtt is not None and not (type(rtt) in (int, float) and math.isfinite(rtt) and rtt >= 0):
            rtt = None
        clean[host[:64]] = {"short": short, "long": long_, "rtt_ms": rtt}
    return clean


def pair_figures(reports, host_of):
    """{(host, host): [short judged, short lost, long judged, long lost, worst RTT ms or None]}:
    both sides' reports about each pair of hosts added up."""
    pairs = {}
    for osd, report in reports.items():
        here = host_of.get(osd)
        if here is None:
            continue
        for there, entry in report.items():
            if there == here:
                continue
            cell = pairs.setdefault(tuple(sorted((here, there))), [0, 0, 0, 0, None])
            cell[0] += entry["short"][0]
            cell[1] += entry["short"][1]
            cell[2] += entry["long"][0]
            cell[3] += entry["long"][1]
            if entry["rtt_ms"] is not None:
                cell[4] = max(cell[4] or 0.0, entry["rtt_ms"])
    return pairs


def judge(reports, host_of, loss_min=0.015, slow_ping_ms=500.0):
    """(lossy pairs, lossy hosts, slow pairs) from {osd: clean report}; `host_of` maps OSD ids
    to host names. Lossy hosts' pairs are not in the lossy pairs."""
    pairs = pair_figures(reports, host_of)
    lossy, slow = {}, []
    for hosts, (short_n, short_lost, long_n, long_lost, rtt) in sorted(pairs.items()):
        short = short_lost / short_n if short_n >= SHORT_PROBES_MIN else 0.0
        long_ = long_lost / long_n if long_n >= LONG_PROBES_MIN else 0.0
        if short >= SHORT_LOSS_MIN or long_ >= loss_min:
            worse, probes = (short, short_n) if short >= long_ else (long_, long_n)
            lossy[hosts] = PairLoss(hosts, worse, probes, rtt)
        if rtt is not None and rtt >= slow_ping_ms:
            slow.append(PairLoss(hosts, 0.0, long_n, rtt))
    peers = {}
    for hosts in pairs:
        for host in hosts:
            peers.setdefault(host, set()).update(h for h in hosts if h != host)
    lossy_hosts = sorted(host for host, others in peers.items() if len(others) >= 2 and all(
        tuple(sorted((host, other))) in lossy for other in others))
    # A host lossy to every peer explains its pairs; two such hosts share one pair.
    left = [pair for hosts, pair in lossy.items() if not set(hosts) & set(lossy_hosts)]
    return left, lossy_hosts, slow
