"""The audit log: who changed what, from where, when, and how it ended (and who was refused).

Events are dicts: {time, entity, addr, op, target, result} (`result` "ok" or an error code such
as "permission_denied"); `target` names the object (POOL/NAME), pool, entity or key acted on.

- Monitors commit their events through Raft (mon/store.py keeps the last AUDIT_KEPT), so every
  monitor holds the same record and a new leader loses none.
- Each OSD appends the events of its data ops to a file beside its store (`AuditFile`): one JSON
  line each, written and fsynced at least every FLUSH_INTERVAL_S (a crash loses at most that
  much), rotated at FILE_BYTES_MAX with one older file kept, so the log is bounded.
- `cairn audit` gathers both: the monitors' and every OSD's (`audit_read`), merged by time.
"""

import json
import os
import time

FLUSH_INTERVAL_S = 1.0
# One encoder for every event: json.dumps with separators builds a new one per call, and an
# OSD appends an event per write.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
FILE_BYTES_MAX = 64 << 20
READ_EVENTS_MAX = 10_000
AUDIT_KEPT = 10_000


def event(entity, addr, op, target, result):
    return {"time": round(time.time(), 3), "entity": entity or "anonymous", "addr": addr,
            "op": op, "target": target, "result": result}


def matches(found, since=None, entity=None):
    return (since is None or found.get("time", 0) >= since) and \
        (entity is None or found.get("entity") == entity)


class AuditFile:
    """An OSD's audit events, appended as JSON lines to `path` (and `path`.1, the older file)."""

    def __init__(self, path, file_bytes_max=FILE_BYTES_MAX):
        self.path = path
        self.file_bytes_max = file_bytes_max
        self._pending = []
        self._flushed_at = time.monotonic()
        self.events_total = 0

    def append(self, found):
        self._pending.append(_ENCODE(found))
        self.events_total += 1
        if time.monotonic() - self._flushed_at >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self):
        """Write what is pending and fsync it (the owner also calls this once a second)."""
        self._flushed_at = time.monotonic()
        if not self._pending:
            return
        data = ("\n".join(self._pending) + "\n").encode()
        self._pending = []
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size >= self.file_bytes_max:
            os.replace(self.path, self.path + ".1")

    def read(self, since=None, entity=None, limit=READ_EVENTS_MAX):
        """The newest `limit` events that match, oldest first (pending ones included)."""
        found = []
        for path in (self.path + ".1", self.path):
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue                # a torn last line after a crash
                if isinstance(record, dict) and matches(record, since, entity):
                    found.append(record)
        found += [record for record in map(json.loads, self._pending)
                  if matches(record, since, entity)]
        return found[-limit:]
