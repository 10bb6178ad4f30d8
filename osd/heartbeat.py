"""Peer heartbeats between OSDs: whom to ping, and when to report a peer failed (pure).

Each OSD pings a few up peers on other hosts every `osd.heartbeat_interval_s`. Peers are chosen
by ring distance in id order (the next ids after ours, wrapping), so every OSD is watched by
about as many peers as it watches, and the choice is the same on every OSD for the same map.
Peers on our own host come last: a whole-host failure must be seen from outside it.

`PeerWatch` turns ping outcomes into reports for the monitor:
- a refused connection is reported at once (the process is gone: Ceph's
  osd_fast_fail_on_connection_refused);
- a peer silent for longer than the grace is reported once;
- a reported peer that answers again is reported alive, which withdraws the report.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Report:
    target: int
    failed: bool
    reason: str


def choose_peers(cmap, osd_id, count):
    """Up to `count` up OSD ids to ping: other hosts first, by ring distance from `osd_id`."""
    me = cmap.osds.get(osd_id)
    host = me["location"].get("host") if me else None
    ring = sorted(i for i, osd in cmap.osds.items() if osd["up"] and i != osd_id)
    ring = [i for i in ring if i > osd_id] + [i for i in ring if i < osd_id]
    elsewhere = [i for i in ring if cmap.osds[i]["location"].get("host") != host]
    same_host = [i for i in ring if cmap.osds[i]["location"].get("host") == host]
    return (elsewhere + same_host)[:count]


class PeerWatch:
    def __init__(self):
        self.last_ok_ns = {}            # peer -> when it last answered (or was first watched)
        self.reported = set()           # peers we reported failed and have not withdrawn

    @property
    def peers(self):
        return sorted(self.last_ok_ns)

    def set_peers(self, peers, now_ns):
        for peer in list(self.last_ok_ns):
            if peer not in peers:
                del self.last_ok_ns[peer]
                self.reported.discard(peer)
        for peer in peers:
            self.last_ok_ns.setdefault(peer, now_ns)

    def answered(self, peer, now_ns):
        if peer not in self.last_ok_ns:
            return None
        self.last_ok_ns[peer] = now_ns
        if peer in self.reported:
            self.reported.discard(peer)
            return Report(peer, False, "answers pings again")
        return None

    def refused(self, peer, reason):
        if peer not in self.last_ok_ns or peer in self.reported:
            return None
        self.reported.add(peer)
        return Report(peer, True, reason)

    def tick(self, now_ns, grace_ns):
        reports = []
        for peer, last_ok_ns in sorted(self.last_ok_ns.items()):
            if peer not in self.reported and now_ns - last_ok_ns > grace_ns:
                self.reported.add(peer)
                reports.append(Report(peer, True, f"no ping reply for "
                                                  f"{(now_ns - last_ok_ns) / 1e9:.1f} s"))
        return reports
