"""Failure detection: which OSDs to mark down, and which to mark out (pure: no I/O, no clock).

Inputs, each with the caller's `now_ns`:
- `heartbeat(osd_id)`: the OSD itself said it is alive (every `osd.heartbeat_interval_s`).
- `report(reporter, target, failed)`: a peer could not reach `target` (failed=True: it stopped
  answering pings, or refused the connection) or can reach it again (failed=False).
- `observe(cmap)`: a new map epoch; OSDs that went down start their down-out clock, OSDs that
  came up start a fresh grace period and lose old reports against them.
- `tick(cmap)`: returns the map operations the monitor should propose now.

Rules (the same as Ceph's, in a small form):
1. An up OSD is marked down when the monitor has not heard its heartbeat for `mon.osd_grace_s`,
   or earlier when peers on at least `mon.osd_min_down_reporters` distinct hosts other than its
   own report it failed within the grace period. With fewer other hosts than that, every other
   host must report it: a two-host cluster still detects a dead host through its peer.
2. A down OSD that is still in is marked out after `mon.osd_down_out_interval_s` (0: never).
   Manual outs are the operator's and are never undone here; boot brings automatic outs back in.
3. A monitor that starts (or restarts) knows nothing of the past: it gives every up OSD a full
   grace period and every down OSD a full down-out interval from its start, which can only delay
   a mark, never make a wrong one.
"""

from cairn.common import config

NS_PER_S = 1_000_000_000


class FailureDetector:
    def __init__(self, now_ns):
        self.started_ns = now_ns
        self.last_heard_ns = {}         # osd id -> when its last heartbeat arrived
        self.down_since_ns = {}         # osd id -> when we first saw it down
        self.reports = {}               # target id -> {reporter id: when reported}
        self._up = set()

    def heartbeat(self, osd_id, now_ns):
        self.last_heard_ns[osd_id] = now_ns

    def report(self, reporter, target, failed, now_ns):
        if failed:
            self.reports.setdefault(target, {})[reporter] = now_ns
        else:
            self.reports.get(target, {}).pop(reporter, None)

    def observe(self, cmap, now_ns):
        up = {osd_id for osd_id, osd in cmap.osds.items() if osd["up"]}
        for osd_id in up - self._up:
            self.last_heard_ns[osd_id] = now_ns
            self.reports.pop(osd_id, None)
            self.down_since_ns.pop(osd_id, None)
        for osd_id in cmap.osds.keys() - up:
            self.down_since_ns.setdefault(osd_id, now_ns)
            self.reports.pop(osd_id, None)
        for reports in self.reports.values():         # a down reporter's word lapses
            for reporter in [r for r in reports if r not in up]:
                del reports[reporter]
        self._up = up

    def tick(self, cmap, now_ns):
        """Map operations to propose now: a list of op dicts (possibly empty)."""
        grace_ns = int(config.value(cmap.config, "mon.osd_grace_s") * NS_PER_S)
        out_ns = int(config.value(cmap.config, "mon.osd_down_out_interval_s") * NS_PER_S)
        reporters_min = config.value(cmap.config, "mon.osd_min_down_reporters")
        ops = []
        for osd_id in sorted(cmap.osds):
            osd = cmap.osds[osd_id]
            if osd["up"]:
                if self._should_mark_down(cmap, osd, now_ns, grace_ns, reporters_min):
                    ops.append({"op": "osd_down", "id": osd_id})
            elif osd["in"] and out_ns > 0:
                since = self.down_since_ns.get(osd_id, self.started_ns)
                if now_ns - since >= out_ns:
                    ops.append({"op": "osd_out", "id": osd_id})
        return ops

    def _should_mark_down(self, cmap, osd, now_ns, grace_ns, reporters_min):
        heard = self.last_heard_ns.get(osd["id"], self.started_ns)
        if now_ns - heard > grace_ns:
            return True
        host = osd["location"].get("host")
        fresh = [reporter for reporter, when in self.reports.get(osd["id"], {}).items()
                 if now_ns - when <= grace_ns and reporter in cmap.osds
                 and cmap.osds[reporter]["up"]]
        hosts = {cmap.osds[reporter]["location"].get("host") for reporter in fresh} - {host}
        if not hosts:
            return False
        other_up_hosts = {other["location"].get("host") for other in cmap.osds.values()
                          if other["up"]} - {host}
        return len(hosts) >= min(reporters_min, len(other_up_hosts))

    def statistics(self):
        return {"reports_pending": sum(len(r) for r in self.reports.values())}
