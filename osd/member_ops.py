"""The ops an OSD answers for another OSD: a primary's replica writes, peering and recovery
queries and pushes, and scrubs (osd/service.py routes them here through its op table).

Theory of operation: every op but `pg_scrub` and `pg_info` comes from the PG's primary, so it
first passes `_from_primary`: the sender must be the primary of the PG in this OSD's map (a
newer epoch is waited for), and its epoch no older than the PG's last peering (`min_epoch`,
raised by `pg_query`). A replica write then applies the same transaction the primary made
(osd/backend.py); the `pg_*` ops read or change this member's copy of the PG for the
primary's peering (osd/pgs.py) and recovery. Each takes (service, header, payload) and returns
(reply header, payload), as the client ops do.
"""

from cairn.common import pg as pgs
from cairn.common.codes import Code
from cairn.common.limits import OMAP_PAGE_ENTRIES_MAX
from cairn.common.messenger import RequestFailed
from cairn.native.checksum import crc32c
from cairn.osd import omap
from cairn.osd.backend import OMAP_PAGE_BYTES, PUSH_PREFIX
from cairn.osd.errors import ChecksumError, CollectionNotFound, ObjectNotFound
from cairn.osd.request import LIST_PAGE_DEFAULT, byte_ranges, object_name, op_version
from cairn.osd.store import Transaction


# -- replica ops ------------------------------------------------------------------------------


def admit_from_primary(service, pg, header):
    """The checks of an op from a PG's primary that need no waiting (the usual path and the
    fast replica write alike): `from` is the PG's primary in our map, at an epoch no older
    than the PG's last peering. Returns the Pg; raises the refusals."""
    if pg is None:
        raise RequestFailed(Code.WRONG_PRIMARY, f"osd.{header.get('from')} is not the primary "
                            f"of pg {header.get('pool')}.{header.get('pg'):x} at epoch "
                            f"{service.port.map.epoch}")
    pg.core.check_from_primary(header.get("from"), header.get("epoch", 0))
    return pg


async def _from_primary(service, header):
    """(pool, Pg) of an op from the PG's primary, once our map has its epoch."""
    pool, pg = await service.pg_of(header, as_primary=False)
    return pool, admit_from_primary(service, pg, header)


async def rep_put(service, header, payload):
    return await _replicated_write(service, header, payload, delete=False)


async def rep_delete(service, header, payload):
    return await _replicated_write(service, header, payload, delete=True)


async def rep_omap(service, header, payload):
    pool, pg = await _from_primary(service, header)
    name, version = object_name(header), op_version(header)
    prior = header.get("prior", 0)
    if not isinstance(prior, int) or prior < 0:
        raise RequestFailed(Code.INVALID, "rep_omap carries the version it applies to")
    update = omap.parse_update(header).update
    await pg.backend.apply_omap(pg, name, version, prior, update, bool(header.get("complete")),
                                log_only=bool(header.get("log_only")))
    return {}, b""


async def _replicated_write(service, header, payload, delete):
    pool, pg = await _from_primary(service, header)
    object_name(header)                  # both checked before the backend reads them
    op_version(header)
    await pg.backend.apply_message(pg, header, payload, delete)
    return {}, b""


# -- peering and recovery ops -------------------------------------------------------------------


async def pg_query(service, header, payload):
    pool, pg = await _from_primary(service, header)
    service.local.load_log(pg)
    return {"last_update": pg.core.query(header.get("epoch", 0)),
            "complete_to": pg.core.complete_to}, b""


async def pg_list(service, header, payload):
    pool, pg = await _from_primary(service, header)
    entries, following = service.local.listing(pg, header.get("start_after"),
                                                  header.get("limit", LIST_PAGE_DEFAULT),
                                                  as_target=bool(header.get("as_target")))
    service.local.load_log(pg)
    return {"entries": entries, "next": following, "last_update": pg.core.last_update}, b""


async def pg_log(service, header, payload):
    pool, pg = await _from_primary(service, header)
    return pg.core.log_summary(service.local.log_entries(pg)), b""


async def pg_stat(service, header, payload):
    pool, pg = await _from_primary(service, header)
    names = header.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise RequestFailed(Code.INVALID, "pg_stat needs names: a list of object names")
    versions, sizes = [], []
    for name in names:
        record = service.local.local_record(pg, name)
        versions.append(pgs.version_of(record.attrs) if record else None)
        sizes.append(record.size if record else 0)
    return {"versions": versions, "sizes": sizes}, b""


async def pg_read(service, header, payload):
    """This member's copy or shard: whole, or the byte `ranges` [[offset, length], ...]
    one after another (none: its attributes only)."""
    pool, pg = await _from_primary(service, header)
    ranges = byte_ranges(header, required=False)
    stash = header.get("stash")
    if stash is not None and not (isinstance(stash, str) and stash):
        raise RequestFailed(Code.INVALID, "stash names a rollback stash entry")
    name = object_name(header)
    record, data = await pg.backend.read_local(pg, name, ranges, stash)
    reply = {"version": pgs.version_of(record.attrs),
             "manifest": pgs.MANIFEST_ATTR in record.attrs}
    if header.get("omap") and record.omap and stash is None:
        entries, more = service.port.store.omap_list(pg.collection, name,
                                                     limit=OMAP_PAGE_ENTRIES_MAX,
                                                     max_bytes=OMAP_PAGE_BYTES)
        reply.update(omap=[list(pair) for pair in entries], omap_more=more)
    if pgs.SHARD_ATTR in record.attrs:
        reply["shard"] = pgs.shard_of(record.attrs)
        reply["ec"] = list(pgs.ec_geometry(record.attrs))
    return reply, data


async def pg_omap(service, header, payload):
    """A further page of this member's omap of an object, for a recovery push; refused
    when the copy is no longer at `version`."""
    pool, pg = await _from_primary(service, header)
    name = object_name(header)
    start_after = omap.parse_listing(header)[0]
    record = service.local.local_record(pg, name)
    if record is None or pgs.version_of(record.attrs) != header.get("version"):
        raise RequestFailed(Code.AGAIN, f"{name!r} changed on osd.{service.port.me} during "
                            "its recovery; retry")
    entries, more = service.port.store.omap_list(pg.collection, name, start_after,
                                            limit=OMAP_PAGE_ENTRIES_MAX,
                                            max_bytes=OMAP_PAGE_BYTES)
    return {"entries": [list(pair) for pair in entries], "more": more}, b""


async def pg_push_omap(service, header, payload):
    """A further page of a pushed object's omap; the last one moves the object into
    place."""
    pool, pg = await _from_primary(service, header)
    name = object_name(header)
    temporary = PUSH_PREFIX + name
    update = omap.parse_update({"set": header.get("omap", [])}).update
    try:
        stat = service.port.store.stat(pg.stash_collection, temporary)
    except (ObjectNotFound, CollectionNotFound):
        stat = None
    if stat is None or pgs.version_of(stat.attrs) != header.get("version"):
        raise RequestFailed(Code.AGAIN, f"no push of {name!r} at this version is in progress "
                            f"on osd.{service.port.me}; retry the recovery")
    txn = Transaction().omap_update(pg.stash_collection, temporary, update.sets)
    if header.get("final"):
        txn.rename(pg.stash_collection, temporary, pg.collection, name)
    await service.port.store.apply(txn)
    return {}, b""


async def pg_push(service, header, payload):
    pool, pg = await _from_primary(service, header)
    await service.local.ensure_collections(pg, stash=bool(header.get("partial")))
    attrs = {pgs.VERSION_ATTR: pgs.version_bytes(op_version(header))}
    if header.get("manifest"):
        attrs[pgs.MANIFEST_ATTR] = b"1"
    if pool["kind"] == "erasure":
        shard, geometry = header.get("shard"), header.get("ec")
        if not (isinstance(shard, int) and 0 <= shard < pool["size"] and
                pgs.valid_geometry(geometry)):
            raise RequestFailed(Code.INVALID, "pg_push of a shard needs shard and ec: "
                                "[size, unit]")
        attrs.update(pgs.ec_attrs(shard, *geometry))
        size = pg.backend.shard_bytes(pg, geometry, payload)
    else:
        size = None
    name = object_name(header)
    update = omap.parse_update({"set": header.get("omap") or []}).update
    collection, target = pg.collection, name
    if header.get("partial"):                   # more omap pages follow (pg_push_omap)
        collection, target = pg.stash_collection, PUSH_PREFIX + name
    txn = Transaction().put(collection, target, payload, attrs=attrs, size=size)
    if update.sets:
        txn.omap_update(collection, target, update.sets)
    await service.port.store.apply(txn)
    return {}, b""


async def pg_remove(service, header, payload):
    pool, pg = await _from_primary(service, header)
    try:
        await service.port.store.apply(Transaction().delete(pg.collection, object_name(header)))
    except (ObjectNotFound, CollectionNotFound):       # nothing to remove
        pass
    return {}, b""


async def pg_mark(service, header, payload):
    pool, pg = await _from_primary(service, header)
    version = op_version(header) if header.get("version") else 0
    if version:
        await service.local.ensure_collections(pg)
        txn = Transaction()
        service.local.mark_ops(pg, txn, version)
        await service.port.store.apply(txn, then=lambda: pg.core.marked(version))
    return {}, b""


async def pg_versions(service, header, payload):
    """Every version of one object this member holds: its current copy or shard and its
    rollback stash entries (erasure-coded PGs), for a rollback decision."""
    pool, pg = await _from_primary(service, header)
    name = object_name(header)
    held = []
    record = service.local.local_record(pg, name)
    if record is not None:
        held.append(_held(record.attrs))
    if pool["kind"] == "erasure":
        service.local.load_stash(pg)    # with acked_seen, kept in the log over restarts
        for entry in pg.core.stash_of(name):
            try:
                attrs = service.port.store.stat(pg.stash_collection, entry).attrs
            except ObjectNotFound:
                continue
            replaced_by = pgs.parse_stash_entry(entry)[0]
            if pgs.ABSENT_ATTR in attrs:
                held.append({"absent": True, "replaced_by": replaced_by})
            else:
                held.append({**_held(attrs), "entry": entry,
                             "replaced_by": replaced_by})
    return {"held": held, "acked_seen": pg.core.acked_seen}, b""


def _held(attrs):
    geometry = pgs.ec_geometry(attrs) if pgs.EC_ATTR in attrs else None
    return {"version": pgs.version_of(attrs), "shard": pgs.shard_of(attrs),
            "ec": list(geometry) if geometry else None,
            "manifest": pgs.MANIFEST_ATTR in attrs}


async def pg_scrub(service, header, payload):
    """Scrub one PG (on its primary): {deep, repair} -> the PG's report (osd/scrub.py)."""
    pool, pg = await service.pg_of(header)
    report = await service.scrubber.scrub_pg(pg, bool(header.get("deep")),
                                                    bool(header.get("repair")))
    return report, b""


async def pg_scrub_local(service, header, payload):
    """This member's copy of the PG for a scrub, a page at a time: [name, version, shard,
    size, crc32c or None, damaged] per object; with `deep` every object is read whole
    (the store checks each 4 KiB). `names`: only these."""
    pool, pg = await _from_primary(service, header)
    deep, names = bool(header.get("deep")), header.get("names")
    limit = header.get("limit", LIST_PAGE_DEFAULT)
    if not isinstance(limit, int) or not 1 <= limit <= LIST_PAGE_DEFAULT:
        raise RequestFailed(Code.INVALID, f"limit must be within 1..{LIST_PAGE_DEFAULT}")
    following = None
    if not service.port.store.has_collection(pg.collection):
        names = []
    elif names is None:
        names, following = service.port.store.list_objects(pg.collection,
                                                      start_after=header.get("start_after"),
                                                      limit=limit)
    elif not (isinstance(names, list) and len(names) <= LIST_PAGE_DEFAULT
              and all(isinstance(n, str) and n for n in names)):
        raise RequestFailed(Code.INVALID, "names must be a list of object names")
    entries = []
    for name in names:
        record = service.local.local_record(pg, name)
        if record is None:
            continue
        crc, damaged = None, False
        if deep:
            try:
                data = await service.port.store.read(pg.collection, name)
                crc = crc32c(data)
                if getattr(record, "omap", False):
                    crc = _omap_crc(service, pg, name, crc)
            except ChecksumError:
                damaged = True
            except ObjectNotFound:
                continue
        entries.append([name, pgs.version_of(record.attrs), pgs.shard_of(record.attrs),
                        record.size, crc, damaged])
    return {"entries": entries, "next": following}, b""


def _omap_crc(service, pg, name, crc):
    """`crc` continued over the object's omap (each key and value with its length), so
    a deep scrub finds replicas whose tables differ."""
    after = None
    while True:
        entries, more = service.port.store.omap_list(pg.collection, name, after,
                                                limit=OMAP_PAGE_ENTRIES_MAX)
        for key, value in entries:
            crc = crc32c(len(key).to_bytes(4, "little") + key +
                         len(value).to_bytes(4, "little") + value, crc)
        if not more:
            return crc
        after = entries[-1][0]


async def pg_info(service, header, payload):
    pool, pg = await service.pg_of(header)
    return {"state": pg.core.state, "clean": pg.core.clean,
            "acting": list(pg.core.interval[1].members)}, b""
