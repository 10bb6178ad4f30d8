"""The monitor's durable state: the cluster map's change log in RocksDB.

Every map change is an incremental, written under `log/<epoch>` in a synchronous RocksDB batch
(fsync before the monitor acknowledges it or tells anyone about the new epoch). Every
`FULL_MAP_EVERY_EPOCHS` epochs the whole map is written too (`full/<epoch>`), so a restart
replays at most that many incrementals; log entries older than `LOG_EPOCHS_KEPT` behind the head
are trimmed, and subscribers further behind get the full map instead.

Keys (epochs as 8-byte big-endian, so key order is epoch order):
    meta/fsid            the cluster's fsid (utf-8)
    full/<epoch>         msgpack of ClusterMap.to_dict()
    log/<epoch>          msgpack of Incremental.to_dict()
    pgact/<pool><pg>     msgpack [epoch, acting, complete]: the PG's last activation
                         (osd/peering.py)

The next issue replicates exactly this log with Raft; nothing else in the monitor is durable.
"""

import os
import struct
import uuid as uuid_module

import msgpack
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from cairn.common.clustermap import ClusterMap, Incremental

# A restart replays at most this many incrementals (each a few hundred bytes, microseconds).
FULL_MAP_EVERY_EPOCHS = 64
# Subscribers this many epochs behind can still catch up incrementally; Ceph keeps 500
# (mon_min_osdmap_epochs).
LOG_EPOCHS_KEPT = 500
assert FULL_MAP_EVERY_EPOCHS < LOG_EPOCHS_KEPT

KEY_FSID = b"meta/fsid"
PREFIX_PG_ACTIVE = b"pgact/"
PREFIX_FULL = b"full/"
PREFIX_LOG = b"log/"


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


def mkfs(directory, fsid=None):
    """Make a new monitor store in `directory` holding epoch 1 (an empty map); the fsid."""
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
        db.write(batch, _sync())
    finally:
        db.close()
    return fsid


class MonStore:
    """An open monitor store. `MonStore.open(dir)`; `load()`; `append()`; `close()`."""

    def __init__(self, path, db):
        self.path = path
        self._db = db
        self._sync = _sync()
        self.fsid = db.get(KEY_FSID).decode()
        self.first_log_epoch = None     # the oldest incremental kept (None: none yet)

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

    def append(self, incremental, new_map):
        """Durably log `incremental` (which made `new_map`); returns once fsynced."""
        assert new_map.epoch == incremental.epoch
        batch = WriteBatch(raw_mode=True)
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
        self._db.write(batch, self._sync)

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

    def set_pg_active(self, pool_id, pg_index, epoch, acting, complete):
        """Durably record that the PG went active at `epoch` with `acting`, of which
        `complete` hold every acknowledged write (fsync)."""
        batch = WriteBatch(raw_mode=True)
        batch.put(PREFIX_PG_ACTIVE + struct.pack(">II", pool_id, pg_index),
                  msgpack.packb([epoch, list(acting), list(complete)]))
        self._db.write(batch, self._sync)

    def close(self):
        self._db.close()
