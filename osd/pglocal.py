"""What one OSD's store holds of its PGs: the log, the stash, the listing and the versions of
its copy (or shard), read and changed for the PG code that needs them.

Theory of operation. A PG's copy on this OSD is three collections of the store: its objects
(`pg.POOL.PG`), its log (`pglog.POOL.PG`: a key table keyed by version, plus the tail object;
older stores hold entries as empty objects) and, for erasure-coded PGs, its rollback stash. The
core (osd/pg.py) decides what the log and stash hold; `LocalCopies` reads them from the store
once per PG (`load_log`, `load_stash`), adds a write's log entry to its transaction (`log_ops`),
and answers what a member op or a recovery plan asks of the copy here (`listing`,
`local_version`, `log_entries`). It does no I/O but the store's, and talks to nobody: the
registry (peering, recovery), the backends (writes, reads) and the member ops share it.
"""

import asyncio

from cairn.common import pg as pgs
from cairn.osd.errors import CollectionExists, ObjectNotFound
from cairn.osd.pg import ACKED_ATTR, COMPLETE_ATTR, TAIL_NAME, log_entry_attrs
from cairn.osd.store import Transaction

# Names or log entries read from the store per page.
LIST_PAGE = 1000


class LocalCopies:
    """This OSD's copies of its PGs, through the port's store."""

    def __init__(self, port):
        self.port = port
        self.collection_lock = asyncio.Lock()           # creating a PG's collections

    def local_record(self, pg, name):
        """The store's stat of this OSD's copy of `name`, or None."""
        if not self.port.store.has_collection(pg.collection):
            return None
        try:
            return self.port.store.stat(pg.collection, name)
        except ObjectNotFound:
            return None

    def local_version(self, pg, name):
        """The version of this OSD's copy of `name`, or None (also for a shard of another
        position than this OSD's: it must be rebuilt)."""
        record = self.local_record(pg, name)
        return self._version_here(pg, record) if record else None

    def _version_here(self, pg, record):
        shard = pgs.shard_of(record.attrs)
        if shard is not None:
            members = pg.core.acting.members if pg.core.acting else ()
            if shard >= len(members) or members[shard] != self.port.me:
                return None
        return pgs.version_of(record.attrs)

    def present(self, pg, name):
        """Whether this OSD's copy of the PG has `name`."""
        return self.port.store.size_of(pg.collection, name) is not None

    def exists(self, pg, name):
        """Whether the PG holds `name`, as this primary serves it (the missing set first)."""
        return pg.core.exists(name, lambda: self.present(pg, name))

    def has_collections(self, pg):
        """Whether the PG's object and log collections exist here (`ensure_collections`)."""
        store = self.port.store
        return store.has_collection(pg.collection) and store.has_collection(pg.log_collection)

    async def ensure_collections(self, pg, stash=False):
        """Create the PG's object and log collections on first use (and its rollback stash
        for an erasure-coded PG)."""
        wanted = [c for c in (pg.collection, pg.log_collection) + ((pg.stash_collection,) if
                                                                    stash else ())
                  if not self.port.store.has_collection(c)]
        if not wanted:
            return
        async with self.collection_lock:
            txn = Transaction()
            for collection in wanted:
                if not self.port.store.has_collection(collection):
                    txn.create_collection(collection)
            if not txn.ops:
                return
            try:
                await self.port.store.apply(txn)
            except CollectionExists:
                pass

    def load_log(self, pg):
        """Hand the PG's log as the store holds it to the core (once per PG): the entries of
        its log collection's key table, and any held as objects by an older store."""
        if pg.core.log_names is not None:
            return
        values = self._log_values(pg.log_collection)
        legacy = self.all_names(pg.log_collection)
        tail_attrs = None
        if TAIL_NAME in legacy:
            legacy.remove(TAIL_NAME)
            tail_attrs = self.port.store.stat(pg.log_collection, TAIL_NAME).attrs
        for entry in legacy:
            values[entry] = self.port.store.stat(pg.log_collection, entry).attrs
        names = sorted(values)
        newest_complete = next((entry for entry in reversed(names)
                                if COMPLETE_ATTR in values[entry]), None)
        pg.core.log_loaded(names, tail_attrs, newest_complete, legacy)

    def _log_values(self, collection):
        """{entry name: its fields} of a log collection's key table (none if no collection)."""
        values, start_after = {}, None
        if not self.port.store.has_collection(collection):
            return values
        while True:
            page, more = self.port.store.keys_list(collection, start_after=start_after,
                                                   limit=LIST_PAGE)
            for key, value in page:
                values[key.decode()] = log_entry_attrs(value)
            if not more:
                return values
            start_after = page[-1][0]

    def _log_attrs(self, pg, entry):
        """The fields of one log entry here, or None if it is gone."""
        if entry in pg.core.log_legacy:
            try:
                return self.port.store.stat(pg.log_collection, entry).attrs
            except ObjectNotFound:
                return None
        value = self.port.store.keys_get(pg.log_collection, entry.encode())
        return log_entry_attrs(value) if value is not None else None

    def load_stash(self, pg):
        """Hand the PG's rollback stash entries, and the highest acked_to its log entries
        carry, to the core (once per PG; erasure-coded PGs only)."""
        if pg.core.stash_names is None:
            pg.core.stash_loaded(self.all_names(pg.stash_collection), self._acked_in_log(pg))

    def _acked_in_log(self, pg):
        """The highest acked_to on the PG's log entries, newest first; an entry's acked_to is
        below its own version, so the scan stops at the first entry no newer than the best."""
        self.load_log(pg)
        best = 0
        for entry in reversed(pg.core.log_names):
            if int(entry, 16) <= best:
                break
            attrs = self._log_attrs(pg, entry) or {}
            if ACKED_ATTR in attrs:
                best = max(best, int(attrs[ACKED_ATTR].decode(), 16))
        return best

    def all_names(self, collection):
        """Every object name in `collection` (none if it does not exist), page by page."""
        names, start_after = [], None
        if not self.port.store.has_collection(collection):
            return names
        while True:
            batch, start_after = self.port.store.list_objects(collection, start_after=start_after,
                                                              limit=LIST_PAGE)
            names.extend(batch)
            if start_after is None:
                return names

    def log_ops(self, pg, txn, version, name, delete, complete, acked_to=None):
        self.load_log(pg)
        pg.core.log_ops(txn, version, name, delete, complete, acked_to)

    def mark_ops(self, pg, txn, version):
        self.load_log(pg)
        pg.core.mark_ops(txn, version)

    def log_entries(self, pg):
        """[(version, object name)] of the PG's log here, oldest first."""
        self.load_log(pg)
        values = self._log_values(pg.log_collection)    # one scan, not a lookup per entry
        entries = []
        for entry in sorted(pg.core.log_names):
            attrs = self._log_attrs(pg, entry) if entry in pg.core.log_legacy else values.get(entry)
            if attrs is None:
                continue
            entries.append((int(entry, 16), attrs.get("n", b"").decode()))
        return entries

    def listing(self, pg, start_after, limit, as_target=False):
        """([(name, version)], next start_after) of the PG's objects here. `as_target`: this
        OSD is to be recovered, so a shard held for another position counts as absent."""
        if not self.port.store.has_collection(pg.collection):
            return [], None
        names, following = self.port.store.list_objects(pg.collection, start_after=start_after,
                                                        limit=limit)
        entries = []
        for name in names:
            try:
                record = self.port.store.stat(pg.collection, name)
                version = self._version_here(pg, record) if as_target else \
                    pgs.version_of(record.attrs)
                entries.append((name, version))
            except ObjectNotFound:
                continue
        return entries, following
