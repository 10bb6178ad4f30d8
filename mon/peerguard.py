"""Raft messages refused from a peer, and the MON_PEER_INVALID health check they raise.

Theory of operation:
- The Raft core (mon/raft.py) refuses a message that no correct member could have sent (two
  leaders in one term, an append that contradicts committed entries, a vote from a non-member,
  ...) by raising `raft.PeerInvalid` before it changes anything. The monitor keeps serving; it
  hands the refusal to `Findings.record` here.
- A finding is keyed by (the monitor that refused, the sender) and keeps the newest reason and a
  count. A follower's findings travel to the leader (`pending()` / `merge()`, the
  `peer_invalid_report` request), since `cairn health` is answered by the leader.
- The check stays raised until `SHOWN_S` after the last refused message, so a single forged frame
  is still visible to an operator who looks a few minutes later.
- Pure: time arrives as `now` (monotonic seconds); no I/O.
"""

from cairn.mon import health

# How long a finding keeps MON_PEER_INVALID raised after the last refused message.
SHOWN_S = 600.0
# Findings kept; beyond, the oldest goes (a flood of forged names costs bounded memory).
FINDINGS_MAX = 64
# Bytes of a sender's name or a reason kept (both come from the remote side).
TEXT_BYTES_MAX = 200


def _clip(text):
    text = str(text)
    return text if len(text) <= TEXT_BYTES_MAX else text[:TEXT_BYTES_MAX] + "..."


class Findings:
    def __init__(self):
        self._found = {}            # (reporter, sender) -> {"reason", "kind", "count", "at"}
        self._unsent = set()        # keys recorded here and not yet reported to the leader

    def record(self, reporter, sender, kind, reason, now, count=None):
        """One refused message (`kind` a string, `reason` in words); with `count`, a reporter's
        own tally of them (a follower's report), which replaces ours."""
        key = (_clip(reporter), _clip(sender))
        found = self._found.pop(key, None) or {"count": 0}
        found.update(reason=_clip(reason), kind=_clip(kind), at=now)
        found["count"] = count if count is not None else found["count"] + 1
        self._found[key] = found                        # newest last
        if count is None:
            self._unsent.add(key)                       # ours: the leader should hear of it
        while len(self._found) > FINDINGS_MAX:
            oldest = next(iter(self._found))
            del self._found[oldest]
            self._unsent.discard(oldest)

    def pending(self):
        """Findings not yet reported to the leader, as wire dicts; marks them sent."""
        out = [{"reporter": reporter, "sender": sender, "reason": found["reason"],
                "kind": found["kind"], "count": found["count"]}
               for (reporter, sender), found in self._found.items()
               if (reporter, sender) in self._unsent]
        self._unsent.clear()
        return out

    def unsend(self, reports):
        """Reports `pending` gave that did not reach the leader: send them next time."""
        self._unsent.update((report["reporter"], report["sender"]) for report in reports
                            if (report["reporter"], report["sender"]) in self._found)

    def merge(self, reports, now):
        """A follower's reports (wire dicts); ValueError names a malformed one."""
        if not isinstance(reports, list) or len(reports) > FINDINGS_MAX:
            raise ValueError(f"reports must be a list of at most {FINDINGS_MAX}")
        for report in reports:
            if not isinstance(report, dict) or not all(
                    isinstance(report.get(field), str)
                    for field in ("reporter", "sender", "reason", "kind")):
                raise ValueError("a report needs reporter, sender, reason and kind (strings)")
        for report in reports:
            count = report.get("count")
            self.record(report["reporter"], report["sender"], report["kind"],
                        report["reason"], now,
                        count=count if type(count) is int and count > 0 else 1)

    def check(self, now):
        """The MON_PEER_INVALID check (a `health.check` dict), or None."""
        shown = [(key, found) for key, found in self._found.items()
                 if now - found["at"] <= SHOWN_S]
        if not shown:
            return None
        senders = sorted({sender for (_, sender), _ in shown})
        detail = [f"{reporter} refused {found['count']} raft message(s) from {sender}, the "
                  f"last {now - found['at']:.0f} s ago ({found['kind']}): {found['reason']}"
                  for (reporter, sender), found in shown]
        return health.check(
            health.WARN, f"monitors refused raft messages that break Raft's rules from "
            f"{', '.join(senders)} (a forged or broken peer; the monitors keep serving)", detail)
