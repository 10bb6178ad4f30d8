"""Reads of a replicated object served by a member that is not its primary: a client's hedge
(its read at the primary is late) or a read it steers away from a primary it found slow
(common/hedge.py).

Theory of operation: a replica may hold an older copy than the one acknowledged (a write it
has not applied yet, or recovery still owed to it), or a newer one not yet acknowledged (a
write in flight). It may serve its copy only if that copy is the version a client reading
through the primary would get. So the replica asks the primary, while its own device read
runs, which version of the object is settled (`pg_settled`): the primary answers from its map,
its PG's state and its record cache, never its disk, so a primary whose disk is slow answers
at once. It answers only when its PG is active, the object is not waiting for recovery there
(the primary's copy is the newest) and no write of it in this interval is unacknowledged
(`PgCore.unsettled`): the version it names is then the one its own read would return. The
replica serves its copy when the versions match (a version names one write's bytes) and
refuses the read as `stale` otherwise (the client then waits for the primary's own answer),
so a member still owed recovery, or holding a write the PG's log rolled back, never serves.
A degraded PG (a member down) still hedges between the members it has. A primary that is no longer one (a newer map) refuses as
`wrong_primary`, exactly as it would refuse the client's own read; so a hedged read is never
staler than a read through the primary, at the cost of one small round trip between the two
OSDs, which runs beside the replica's device read.
"""

import asyncio

from cairn.common import pg as pgs, server
from cairn.common.codes import Code
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.osd.backend import ZERO_COPY_READ_BYTES_MIN
from cairn.osd.errors import ChecksumError, CollectionNotFound, ObjectNotFound
from cairn.osd.request import object_name

# How long a replica waits for the primary's word on a hedged read before refusing it. The
# primary answers from memory; a primary this late is not one a hedge can lean on.
SETTLED_TIMEOUT_S = 2.0


def _refuse(why):
    return RequestFailed(Code.STALE, why + "; read through the primary")


async def replica_get(service, header):
    """A client's `get` with `replica` set, sent to a member that is not the PG's primary:
    (reply header, data) as the primary's `get` would answer, or refused as `stale`. A client
    whose primary answered first cancels it (common/server.py `cancel`): it stops wherever it
    is, its device read or the primary's word, and sends nothing."""
    try:
        return await _replica_get(service, header)
    except asyncio.CancelledError:
        service.hedge_reads_cancelled += 1
        raise


async def _replica_get(service, header):
    pool, pg = await service.pg_of(header, as_primary=False)
    name, offset, length = service._admit_read(header)
    me = service.port.me
    interval = pg.core.interval if pg is not None else None
    if pool["kind"] != "replicated" or interval is None or me not in interval[1].members \
            or interval[1].primary in (None, me):
        raise _refuse(f"osd.{me} is not a replica of pg {header['pool']}.{header['pg']:x} at "
                      f"epoch {service.port.map.epoch}")
    asked = asyncio.ensure_future(service.port.call(interval[1].primary, service.port.header(
        pg, "pg_settled", service.port.map.epoch, name=name,
        steered=bool(header.get("steered")))))
    record = data = None
    try:
        await server.reserve_reply(pg.backend.reply_bytes(pg, name, offset, length))
        record, data = await service.port.store.read_with_stat(
            pg.collection, name, offset, length, copy_below=ZERO_COPY_READ_BYTES_MIN)
    except (ObjectNotFound, CollectionNotFound):
        pass
    except ChecksumError as exc:
        asked.add_done_callback(_quiet)
        raise _refuse(f"osd.{me}'s copy of {name!r} failed its checksum ({exc})") from None
    except BaseException:
        asked.add_done_callback(_quiet)
        raise
    try:
        answer, _ = await asyncio.wait_for(asked, SETTLED_TIMEOUT_S)
    except (RequestFailed, ConnectionClosed, RequestTimeout, TimeoutError) as exc:
        raise _refuse(f"osd.{interval[1].primary} did not confirm {name!r} ({exc})") from None
    settled = answer.get("version")
    held = pgs.version_of(record.attrs) if record is not None else None
    if settled != held:
        raise _refuse(f"osd.{me} holds version {held} of {name!r}, the primary "
                      f"osd.{interval[1].primary} version {settled}")
    service.hedge_reads_served += 1
    if record is None:
        raise ObjectNotFound(pg.collection, name)
    return {"size": record.size, "version": held,
            "manifest": pgs.MANIFEST_ATTR in record.attrs}, data


async def pg_settled(service, header, payload):
    """On the primary, for a replica serving a hedged read: {"version": V} (None: absent), the
    object's version when every acting member holds it and no write of it is unacknowledged;
    refused as `again` otherwise (see the module's text)."""
    pool, pg = await service.pg_of(header)               # wrong_primary unless ours
    name = object_name(header)
    core = pg.core if pg is not None else None
    if core is None or not core.serving:
        raise RequestFailed(Code.AGAIN, f"pg {header['pool']}.{header['pg']:x} is not active "
                            "here")
    if name in core.missing or name in core.unsettled.values():
        raise RequestFailed(Code.AGAIN, f"{name!r} has a write or recovery in flight")
    if header.get("steered"):
        service.reads_steered_around += 1
    else:
        service.reads_hedged_around += 1
    record = service.local.local_record(pg, name)
    return {"version": pgs.version_of(record.attrs) if record is not None else None}, b""


def _quiet(future):
    if not future.cancelled():
        future.exception()


async def hedge_won(service, header, payload):
    """A client's word (one-way, common/messenger.py `send_oneway`) to the primary of a read it
    hedged: the replica's answer came first. The primary counts it beside the hedges it
    confirmed (`pg_settled`): hedges sent around it, won, and wasted (the rest)."""
    service.reads_hedged_won += 1
    return {}, b""
