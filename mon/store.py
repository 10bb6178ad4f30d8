"""The monitor's durable state: the Raft log and the state machine it drives, in RocksDB.

Two parts share one RocksDB, so a batch can change both at once:
- **The Raft log** (mon/raft.py): hard state, entries, the latest snapshot and the compaction
  point. `persist(ready)` writes a Ready's part in one synchronous batch (fsync) before the
  monitor sends anything; nothing a monitor voted for or acknowledged can be lost by a crash.
- **The state machine**: the cluster map's change log and the PG activation records. Every map
  change is an incremental under `log/<epoch>`; every `FULL_MAP_EVERY_EPOCHS` epochs the whole
  map is written too (`full/<epoch>`), so a restart replays at most that many incrementals; log
  entries older than `LOG_EPOCHS_KEPT` behind the head are trimmed, and subscribers further
  behind get the full map instead. Applying a committed entry writes its effect and
  `raft/applied` in one batch without fsync: the entry is already durable in the Raft log (and
  on a majority), and RocksDB's write-ahead log is ordered, so the next synchronous write
  carries these along; a restart replays whatever was lost.
- **Health history**: the raises and clears of health checks the leader saw (`cairn health
  history`), committed through Raft like everything else, so a new leader knows what was in
  force and every monitor answers alike.
- **Requests done**: the outcome of the last `REQUESTS_KEPT` map and membership changes that
  carried a request id (`rid`), so a request retried after a lost reply (a monitor died, the leader moved) is
  answered with its first outcome instead of being applied twice. It is part of the state
  machine (applied, snapshotted and installed with it), so every monitor decides alike.

Keys (epochs and indexes as 8-byte big-endian, so key order is numeric order):
    meta/fsid            the cluster's fsid (utf-8)
    full/<epoch>         msgpack of ClusterMap.to_dict()
    log/<epoch>          msgpack of Incremental.to_dict()
    pgact/<pool><pg>     msgpack [epoch, acting, complete]: the PG's last activation
                         (osd/peering.py)
    hist/<index><n>      msgpack of health event n of entry <index> (mon/alerts.py): the
                         last HISTORY_KEPT raises and clears, oldest trimmed first
    req/<index>          msgpack [rid, outcome]: a request done by the entry at that index;
                         outcome {"epoch": e}, {"error": code, "message": text} (map
                         changes) or {"members": [names]} (membership changes)
    raft/hard            msgpack [term, vote, commit]
    raft/log/<index>     msgpack [term, kind, data] or [term, kind, data, context]
    raft/offset          msgpack [index, term]: the entry before the first one kept
    raft/snap            msgpack [index, term, members]; raft/snapdata: its state (bytes)
    raft/applied         msgpack index: the state machine includes entries up to here
    audit/<index><n>     msgpack of audit event n of entry <index> (common/audit.py): the last
                         AUDIT_KEPT mutations and refusals the monitors saw
    meta/authmode        b"hmac" (entities must authenticate) or b"none" (benchmarks only)
    auth/<entity>        msgpack [secret, [caps]]: an entity's key and caps (common/auth.py)
    svc/<generation>     msgpack [secret, created]: a service key tickets are sealed with
    s3key/<access key>   msgpack [secret, entity]: an S3 access key of a cairn entity (s3/)

Secrets travel between monitors (Raft entries, snapshots) sealed under a key derived from the
`mon.` secret, which every monitor holds from its bootstrap keyring; on disk they are plain,
as in a keyring file beside the store.
"""

import collections
import os
import struct
import uuid as uuid_module

import msgpack
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from cairn.common import audit, auth
from cairn.common.clustermap import ClusterMap, Incremental
from cairn.mon.raft import Entry, HardState, Restored, Snapshot

# A restart replays at most this many incrementals (each a few hundred bytes, microseconds).
FULL_MAP_EVERY_EPOCHS = 64
# Subscribers this many epochs behind can still catch up incrementally; Ceph keeps 500
# (mon_min_osdmap_epochs).
LOG_EPOCHS_KEPT = 500
assert FULL_MAP_EVERY_EPOCHS < LOG_EPOCHS_KEPT
# Request outcomes remembered for retries. A client retries for at most its deadline (15 s);
# this many map changes take minutes even in a storm of failures.
REQUESTS_KEPT = 4096
# Health events kept for `cairn health history` (each a few hundred bytes).
HISTORY_KEPT = 1000

KEY_FSID = b"meta/fsid"
PREFIX_PG_ACTIVE = b"pgact/"
PREFIX_FULL = b"full/"
PREFIX_LOG = b"log/"
PREFIX_REQUEST = b"req/"
PREFIX_HISTORY = b"hist/"
PREFIX_RAFT_LOG = b"raft/log/"
KEY_HARD = b"raft/hard"
KEY_OFFSET = b"raft/offset"
KEY_SNAPSHOT = b"raft/snap"
KEY_SNAPSHOT_DATA = b"raft/snapdata"
KEY_APPLIED = b"raft/applied"
KEY_AUTH_MODE = b"meta/authmode"
PREFIX_AUDIT = b"audit/"
PREFIX_AUTH = b"auth/"
PREFIX_SERVICE = b"svc/"
PREFIX_S3KEY = b"s3key/"


class MonStoreError(Exception):
    """The monitor's store is missing, belongs elsewhere, or cannot be opened."""


def _key(prefix, epoch):
    return prefix + struct.pack(">Q", epoch)


def _epoch_of(key, prefix):
    return struct.unpack(">Q", key[len(prefix):])[0]


def _sync():
    options = WriteOptions()
    options.sync = True
    return options


def _open(path, create):
    options = Options(raw_mode=True)
    options.create_if_missing(create)
    try:
        return Rdict(path, options=options)
    except Exception as exc:               # rocksdict raises plain Exception with RocksDB's text
        text = str(exc)
        if "lock" in text.lower():
            raise MonStoreError(f"monitor store {path} is in use by another process ({text})") \
                from None
        raise MonStoreError(f"cannot open monitor store {path}: {text}") from None


def mkfs(directory, fsid=None, members=None, entities=None):
    """Make a new monitor store in `directory` holding epoch 1 (an empty map); the fsid.

    `members` ({name: address}) are the monitors the Raft log starts with (default: mon.0
    alone, its address learned when it runs); every founding monitor is made with the same
    fsid and members. A monitor that joins later is made with the cluster's fsid and no members
    ({}): it learns them from the leader.

    `entities` ({entity: (secret, [caps])}, holding `mon.`: the bootstrap keyring, the same
    for every founding monitor) turns authentication on; without them the cluster runs with
    `auth none`. A joining monitor is made with the same bootstrap keyring: replaying the
    leader's log from the start applies every later change to it (a snapshot replaces it)."""
    path = os.path.join(directory, "store.db")
    if os.path.exists(path):
        raise MonStoreError(f"{path} exists; a monitor store is already there")
    os.makedirs(directory, exist_ok=True)
    fsid = fsid or str(uuid_module.uuid4())
    first = ClusterMap(fsid, epoch=1)
    db = _open(path, create=True)
    try:
        batch = WriteBatch(raw_mode=True)
        batch.put(KEY_FSID, fsid.encode())
        batch.put(_key(PREFIX_FULL, 1), msgpack.packb(first.to_dict()))
        batch.put(KEY_HARD, msgpack.packb([0, None, 0]))
        batch.put(KEY_OFFSET, msgpack.packb([0, 0]))
        members = {"mon.0": None} if members is None else dict(members)
        batch.put(KEY_SNAPSHOT, msgpack.packb([0, 0, members]))
        batch.put(KEY_APPLIED, msgpack.packb(0))
        if entities is not None:
            if "mon." not in entities:
                raise MonStoreError("the bootstrap keyring must hold the mon. key")
            batch.put(KEY_AUTH_MODE, b"hmac")
            for entity, (secret, caps) in entities.items():
                batch.put(PREFIX_AUTH + entity.encode(), msgpack.packb([secret, list(caps)]))
        else:
            batch.put(KEY_AUTH_MODE, b"none")
        db.write(batch, _sync())
    finally:
        db.close()
    return fsid


def _entry(key, value):
    term, kind, data, *context = msgpack.unpackb(value, strict_map_key=False)
    return Entry(term, _epoch_of(key, PREFIX_RAFT_LOG), kind, data, *context)


class MonStore:
    """An open monitor store. `MonStore.open(dir)`; `load()`; `append()`; `close()`."""

    def __init__(self, path, db):
        self.path = path
        self._db = db
        self._sync = _sync()
        self.fsid = db.get(KEY_FSID).decode()
        self.first_log_epoch = None     # the oldest incremental kept (None: none yet)
        self.requests = {}              # rid -> (index, outcome), oldest first
        self._load_requests()
        self.history = collections.deque()  # (key, event) of health events, oldest first
        self._load_history()
        self.audit = collections.deque(
            (key, msgpack.unpackb(value)) for key, value in self._items(PREFIX_AUDIT))
        self.auth = {}                      # entity -> (secret, [caps])
        self.service = {}                   # generation -> (secret, created wall time)
        self.s3keys = {}                    # S3 access key -> (secret, entity)
        self._load_auth()

    @classmethod
    def open(cls, directory):
        path = os.path.join(directory, "store.db")
        if not os.path.isdir(path):
            raise MonStoreError(f"no monitor store in {directory}; make one with "
                                f"'cairn-mon mkfs --dir {directory}'")
        db = _open(path, create=False)
        if db.get(KEY_FSID) is None:
            db.close()
            raise MonStoreError(f"{path} is not a monitor store (no fsid)")
        if db.get(KEY_HARD) is None:
            db.close()
            raise MonStoreError(f"{path} was made before monitors kept a Raft log; make a new "
                                f"cluster")
        return cls(path, db)

    def _items(self, prefix, start=None, backwards=False):
        iterator = self._db.iter()
        if backwards:
            iterator.seek_for_prev(prefix + b"\xff" * 8)
        else:
            iterator.seek(start if start is not None else prefix)
        while iterator.valid():
            key = iterator.key()
            if not key.startswith(prefix):
                break
            yield key, iterator.value()
            if backwards:
                iterator.prev()
            else:
                iterator.next()

    def _load_requests(self):
        self.requests = {}
        for key, value in self._items(PREFIX_REQUEST):
            rid, outcome = msgpack.unpackb(value)
            self.requests[rid] = (_epoch_of(key, PREFIX_REQUEST), outcome)

    def _load_history(self):
        self.history = collections.deque(
            (key, msgpack.unpackb(value)) for key, value in self._items(PREFIX_HISTORY))

    def _load_auth(self):
        mode = self._db.get(KEY_AUTH_MODE)
        self.auth_mode = mode.decode() if mode is not None else "none"
        self.auth = {key[len(PREFIX_AUTH):].decode(): tuple(msgpack.unpackb(value))
                     for key, value in self._items(PREFIX_AUTH)}
        self.service = {_epoch_of(key, PREFIX_SERVICE): tuple(msgpack.unpackb(value))
                        for key, value in self._items(PREFIX_SERVICE)}
        self.s3keys = {key[len(PREFIX_S3KEY):].decode(): tuple(msgpack.unpackb(value))
                       for key, value in self._items(PREFIX_S3KEY)}

    def _seal_key(self):
        found = self.auth.get("mon.")
        if found is None:
            raise MonStoreError("this monitor holds no mon. key: secrets cannot travel")
        return auth.proof(found[0], "raft-seal")

    def seal(self, secret):
        """[sealed, nonce]: a secret as it may travel between monitors."""
        nonce = os.urandom(auth.CHALLENGE_BYTES)
        return [auth.wrap(self._seal_key(), secret, nonce), nonce]

    def unseal(self, sealed):
        return auth.unwrap(self._seal_key(), sealed[0], sealed[1])

    def apply_auth(self, index, change, rid=None):
        """Entry `index` changed the keys: {"set": {entity: [sealed, caps]}, "rm": [entity],
        "svc": [generation, sealed, created], "s3set": {access key: [sealed, entity]},
        "s3rm": [access key]} (any of them). Removing an entity removes its S3 keys."""
        batch = WriteBatch(raw_mode=True)
        for entity, (sealed, caps) in change.get("set", {}).items():
            entry = (self.unseal(sealed), list(caps))
            batch.put(PREFIX_AUTH + entity.encode(), msgpack.packb(list(entry)))
            self.auth[entity] = entry
        for entity in change.get("rm", []):
            batch.delete(PREFIX_AUTH + entity.encode())
            self.auth.pop(entity, None)
            for access_key, (_, owner) in list(self.s3keys.items()):
                if owner == entity:
                    batch.delete(PREFIX_S3KEY + access_key.encode())
                    del self.s3keys[access_key]
        for access_key, (sealed, entity) in change.get("s3set", {}).items():
            self.s3keys[access_key] = (self.unseal(sealed), entity)
            batch.put(PREFIX_S3KEY + access_key.encode(),
                      msgpack.packb(list(self.s3keys[access_key])))
        for access_key in change.get("s3rm", []):
            batch.delete(PREFIX_S3KEY + access_key.encode())
            self.s3keys.pop(access_key, None)
        if "svc" in change:
            generation, sealed, created = change["svc"]
            self.service[generation] = (self.unseal(sealed), created)
            batch.put(_key(PREFIX_SERVICE, generation),
                      msgpack.packb(list(self.service[generation])))
            for old in sorted(self.service)[:-auth.SERVICE_KEYS_KEPT]:
                del self.service[old]
                batch.delete(_key(PREFIX_SERVICE, old))
        self._request_batch(batch, index, None if rid is None else (rid, {"auth": True}))
        batch.put(KEY_APPLIED, msgpack.packb(index))
        self._db.write(batch)

    def _request_batch(self, batch, index, request):
        """Remember `request` = (rid, outcome) as done by entry `index`, forgetting the oldest
        beyond REQUESTS_KEPT (in index order, so every monitor forgets the same ones)."""
        if request is None:
            return
        rid, outcome = request
        batch.put(_key(PREFIX_REQUEST, index), msgpack.packb([rid, outcome]))
        self.requests[rid] = (index, outcome)
        while len(self.requests) > REQUESTS_KEPT:
            oldest = next(iter(self.requests))
            batch.delete(_key(PREFIX_REQUEST, self.requests.pop(oldest)[0]))

    def load(self):
        """The newest map: the newest full map with every later incremental applied."""
        newest = next(self._items(PREFIX_FULL, backwards=True), None)
        if newest is None:
            raise MonStoreError(f"{self.path} holds no full map")
        cmap = ClusterMap.from_dict(msgpack.unpackb(newest[1], strict_map_key=False))
        for key, value in self._items(PREFIX_LOG, start=_key(PREFIX_LOG, cmap.epoch + 1)):
            cmap = cmap.apply(Incremental.from_dict(msgpack.unpackb(value,
                                                                    strict_map_key=False)))
        first = next(self._items(PREFIX_LOG), None)
        self.first_log_epoch = _epoch_of(first[0], PREFIX_LOG) if first else None
        return cmap

    def _map_batch(self, batch, incremental, new_map):
        assert new_map.epoch == incremental.epoch
        batch.put(_key(PREFIX_LOG, incremental.epoch), msgpack.packb(incremental.to_dict()))
        if incremental.epoch % FULL_MAP_EVERY_EPOCHS == 0:
            batch.put(_key(PREFIX_FULL, new_map.epoch), msgpack.packb(new_map.to_dict()))
            for key, _ in self._items(PREFIX_FULL):
                if _epoch_of(key, PREFIX_FULL) < new_map.epoch:
                    batch.delete(key)
        oldest_kept = incremental.epoch - LOG_EPOCHS_KEPT
        if self.first_log_epoch is None:
            self.first_log_epoch = incremental.epoch
        elif self.first_log_epoch < oldest_kept:
            for key, _ in self._items(PREFIX_LOG):
                if _epoch_of(key, PREFIX_LOG) >= oldest_kept:
                    break
                batch.delete(key)
            self.first_log_epoch = oldest_kept

    def append(self, incremental, new_map):
        """Durably log `incremental` (which made `new_map`) outside Raft; returns once
        fsynced. Tests use it to build stores."""
        batch = WriteBatch(raw_mode=True)
        self._map_batch(batch, incremental, new_map)
        self._db.write(batch, self._sync)

    # -- the state machine, driven by committed Raft entries ----------------------------------------

    def apply_map(self, index, incremental, new_map, rid=None):
        batch = WriteBatch(raw_mode=True)
        self._map_batch(batch, incremental, new_map)
        self._request_batch(batch, index, None if rid is None else
                            (rid, {"epoch": new_map.epoch}))
        batch.put(KEY_APPLIED, msgpack.packb(index))
        self._db.write(batch)

    def apply_pg_active(self, index, pool_id, pg_index, record):
        batch = WriteBatch(raw_mode=True)
        batch.put(PREFIX_PG_ACTIVE + struct.pack(">II", pool_id, pg_index), msgpack.packb(record))
        batch.put(KEY_APPLIED, msgpack.packb(index))
        self._db.write(batch)

    def apply_history(self, index, events):
        """Entry `index` recorded health `events`; the oldest beyond HISTORY_KEPT go."""
        self._append_kept(index, events, PREFIX_HISTORY, self.history, HISTORY_KEPT)

    def apply_audit(self, index, events):
        """Entry `index` recorded audit `events`; the oldest beyond AUDIT_KEPT go."""
        self._append_kept(index, events, PREFIX_AUDIT, self.audit, audit.AUDIT_KEPT)

    def _append_kept(self, index, events, prefix, kept, limit):
        batch = WriteBatch(raw_mode=True)
        for position, found in enumerate(events):
            key = prefix + struct.pack(">QI", index, position)
            batch.put(key, msgpack.packb(found))
            kept.append((key, found))
        while len(kept) > limit:
            batch.delete(kept.popleft()[0])
        batch.put(KEY_APPLIED, msgpack.packb(index))
        self._db.write(batch)

    def events(self):
        """The health events kept, oldest first."""
        return [event for _, event in self.history]

    def apply_nothing(self, index, request=None):
        """Entry `index` changed nothing; `request` (rid, outcome): a refusal to remember."""
        batch = WriteBatch(raw_mode=True)
        self._request_batch(batch, index, request)
        batch.put(KEY_APPLIED, msgpack.packb(index))
        self._db.write(batch)

    def applied(self):
        return msgpack.unpackb(self._db.get(KEY_APPLIED))

    def state(self, cmap):
        """The state machine as snapshot bytes: the map, every PG activation record, the
        requests done and the health history."""
        records = [[*struct.unpack(">II", key[len(PREFIX_PG_ACTIVE):]), msgpack.unpackb(value)]
                   for key, value in self._items(PREFIX_PG_ACTIVE)]
        requests = [[index, rid, outcome] for rid, (index, outcome) in self.requests.items()]
        history = [[key[len(PREFIX_HISTORY):], event] for key, event in self.history]
        state = {"map": cmap.to_dict(), "pgact": records, "requests": requests,
                 "history": history, "authmode": self.auth_mode,
                 "audit": [[key[len(PREFIX_AUDIT):], found] for key, found in self.audit]}
        if self.auth_mode != "none":
            state["auth"] = {entity: [self.seal(secret), caps]
                             for entity, (secret, caps) in self.auth.items() if entity != "mon."}
            state["svc"] = [[generation, self.seal(secret), created]
                            for generation, (secret, created) in self.service.items()]
            state["s3keys"] = {access_key: [self.seal(secret), entity]
                               for access_key, (secret, entity) in self.s3keys.items()}
        return msgpack.packb(state)

    # -- the Raft log ---------------------------------------------------------------------------

    def restored(self):
        """What the Raft core starts from (mon/raft.py Restored)."""
        term, vote, commit = msgpack.unpackb(self._db.get(KEY_HARD))
        index, snap_term, members = msgpack.unpackb(self._db.get(KEY_SNAPSHOT))
        offset, offset_term = msgpack.unpackb(self._db.get(KEY_OFFSET))
        entries = tuple(_entry(key, value) for key, value in self._items(PREFIX_RAFT_LOG))
        return Restored(HardState(term, vote, commit),
                        Snapshot(index, snap_term, members, self._db.get(KEY_SNAPSHOT_DATA)),
                        offset, offset_term, entries, self.applied())

    def persist(self, ready):
        """Write the durable part of a Raft Ready in one synchronous batch; with a snapshot to
        install, replace the state machine in the same batch and return the new map."""
        batch = WriteBatch(raw_mode=True)
        new_map = None
        if ready.hard_state is not None:
            hard = ready.hard_state
            batch.put(KEY_HARD, msgpack.packb([hard.term, hard.vote, hard.commit]))
        if ready.install:
            for key, _ in self._items(PREFIX_RAFT_LOG):
                batch.delete(key)
            new_map = self._install(batch, ready.snapshot)
        elif ready.entries_from is not None:
            for key, _ in self._items(PREFIX_RAFT_LOG,
                                      start=_key(PREFIX_RAFT_LOG, ready.entries_from)):
                batch.delete(key)
        for entry in ready.entries:
            batch.put(_key(PREFIX_RAFT_LOG, entry.index),
                      msgpack.packb([entry.term, entry.kind, entry.data] +
                                    ([entry.context] if entry.context else [])))
        if ready.snapshot is not None:
            snap = ready.snapshot
            batch.put(KEY_SNAPSHOT, msgpack.packb([snap.index, snap.term, snap.members]))
            if snap.data is not None:
                batch.put(KEY_SNAPSHOT_DATA, snap.data)
        if ready.compacted_to is not None:
            index, term = ready.compacted_to
            batch.put(KEY_OFFSET, msgpack.packb([index, term]))
            if not ready.install:
                for key, _ in self._items(PREFIX_RAFT_LOG):
                    if _epoch_of(key, PREFIX_RAFT_LOG) > index:
                        break
                    batch.delete(key)
        self._db.write(batch, self._sync)
        return new_map

    def _install(self, batch, snapshot):
        state = msgpack.unpackb(snapshot.data, strict_map_key=False)
        cmap = ClusterMap.from_dict(state["map"])
        for prefix in (PREFIX_FULL, PREFIX_LOG, PREFIX_PG_ACTIVE, PREFIX_REQUEST,
                       PREFIX_HISTORY, PREFIX_AUDIT):
            for key, _ in self._items(prefix):
                batch.delete(key)
        batch.put(_key(PREFIX_FULL, cmap.epoch), msgpack.packb(cmap.to_dict()))
        for pool_id, pg_index, record in state["pgact"]:
            batch.put(PREFIX_PG_ACTIVE + struct.pack(">II", pool_id, pg_index),
                      msgpack.packb(record))
        self.requests = {}
        for index, rid, outcome in state.get("requests", []):
            batch.put(_key(PREFIX_REQUEST, index), msgpack.packb([rid, outcome]))
            self.requests[rid] = (index, outcome)
        self.history = collections.deque()
        for suffix, event in state.get("history", []):
            batch.put(PREFIX_HISTORY + suffix, msgpack.packb(event))
            self.history.append((PREFIX_HISTORY + suffix, event))
        self.audit = collections.deque()
        for suffix, found in state.get("audit", []):
            batch.put(PREFIX_AUDIT + suffix, msgpack.packb(found))
            self.audit.append((PREFIX_AUDIT + suffix, found))
        self._install_auth(batch, state)
        batch.put(KEY_APPLIED, msgpack.packb(snapshot.index))
        self.first_log_epoch = None
        return cmap

    def _install_auth(self, batch, state):
        mode = state.get("authmode", "none")
        batch.put(KEY_AUTH_MODE, mode.encode())
        self.auth_mode = mode
        if mode == "none":
            return
        keep = {"mon.": self.auth["mon."]} if "mon." in self.auth else {}
        entries = {entity: (self.unseal(sealed), list(caps))
                   for entity, (sealed, caps) in state.get("auth", {}).items()}
        service = {generation: (self.unseal(sealed), created)
                   for generation, sealed, created in state.get("svc", [])}
        s3keys = {access_key: (self.unseal(sealed), entity)
                  for access_key, (sealed, entity) in state.get("s3keys", {}).items()}
        for prefix in (PREFIX_AUTH, PREFIX_SERVICE, PREFIX_S3KEY):
            for key, _ in self._items(prefix):
                if key != PREFIX_AUTH + b"mon.":
                    batch.delete(key)
        self.auth = {**entries, **keep}
        for entity, entry in entries.items():
            batch.put(PREFIX_AUTH + entity.encode(), msgpack.packb(list(entry)))
        self.service = service
        for generation, entry in service.items():
            batch.put(_key(PREFIX_SERVICE, generation), msgpack.packb(list(entry)))
        self.s3keys = s3keys
        for access_key, entry in s3keys.items():
            batch.put(PREFIX_S3KEY + access_key.encode(), msgpack.packb(list(entry)))

    def incrementals(self, after_epoch, through_epoch):
        """Incremental dicts for epochs after_epoch+1..through_epoch, or None if trimmed."""
        if after_epoch >= through_epoch:
            return []
        if self.first_log_epoch is None or after_epoch + 1 < self.first_log_epoch:
            return None
        found = []
        for key, value in self._items(PREFIX_LOG, start=_key(PREFIX_LOG, after_epoch + 1)):
            if _epoch_of(key, PREFIX_LOG) > through_epoch:
                break
            found.append(msgpack.unpackb(value, strict_map_key=False))
        if len(found) != through_epoch - after_epoch:
            return None
        return found

    # -- PG activation records (osd/peering.py) ----------------------------------------------------

    def pg_active(self, pool_id, pg_index):
        """[epoch, acting, complete] of the PG's last activation, or None."""
        raw = self._db.get(PREFIX_PG_ACTIVE + struct.pack(">II", pool_id, pg_index))
        return None if raw is None else msgpack.unpackb(raw)

    def close(self):
        self._db.close()
