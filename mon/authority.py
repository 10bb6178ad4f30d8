"""The monitors' side of authentication: who may ask what, the key table's requests, tickets
and service keys (common/auth.py has the cryptography, common/sessions.py the handshakes).

Every request a monitor serves is checked against the caller's caps before anything runs
(`check`): reads of the map and health need `mon=r`, changes `mon=rw`, the key table `admin`,
the OSDs' own requests an `osd.N` entity (booting as another OSD is refused), Raft and
internal forwarding the `mon.` entity. A refusal is the error `permission_denied`, naming the
entity, the request and the cap it lacks, and changes nothing. Without authentication (`auth
none`) nothing is checked.

Key changes commit through Raft like map changes: a follower seals the new secret under the
`mon.` key and hands the change to the leader (`auth_change`), so a secret never crosses the
wire in the clear and the one the caller gets back is wrapped under its session's key.
"""

import os
import time

from cairn.common import audit, auth, config
from cairn.common.codes import Code
from cairn.common.frame import Frame, Kind
from cairn.common.messenger import RequestFailed

READ_OPS = frozenset({"hello", "get_map", "subscribe", "status", "health", "health_history",
                      "df", "osd_tree", "pool_ls", "config_get", "osd_perf", "throughput",
                      "console_login"})
WRITE_OPS = frozenset({"pool_create", "pool_delete", "pool_set_quota", "pool_allow_from",
                       "pool_fast_read", "config_set", "alert_test",
                       "osd_mark", "mon_add", "mon_remove"})
DAEMON_OPS = frozenset({"osd_boot", "osd_heartbeat", "osd_failure", "osd_stop",
                        "pg_last_active", "pg_set_active", "auth_service_keys"})
MON_OPS = frozenset({"raft", "auth_change"})
ADMIN_OPS = frozenset({"auth_add", "auth_get", "auth_ls", "auth_rm", "auth_caps",
                       "audit_read", "auth_s3_key_add", "auth_s3_key_rm", "auth_s3_key_ls"})
# An S3 gateway's: an S3 key's secret and its entity's caps (wrapped under the gateway's
# session key), and the gateway's own audit events. The `s3gw` cap (or admin).
GATEWAY_OPS = frozenset({"auth_s3_key_get", "audit_report"})
ANY_OPS = frozenset({"auth_get_ticket"})
MON_OPS = MON_OPS | {"audit_append", "peer_invalid_report"}
# Recorded in the audit log (with refusals of anything): changes, and reads of keys.
# An S3 gateway's key lookups (auth_s3_key_get, cached) and its own events (audit_report)
# are not events themselves.
AUDITED_OPS = WRITE_OPS | (ADMIN_OPS - {"auth_ls", "audit_read", "auth_s3_key_ls"})
# Audit events a monitor queues for Raft; beyond, the oldest are dropped (and counted).
AUDIT_QUEUED_MAX = 1000


def refuse(peer, op, missing):
    return RequestFailed(Code.PERMISSION_DENIED, auth.denied(peer.entity, op, missing))


def check(peer, op, header):
    """Raise `permission_denied` unless the caller may send `op` (peer None: this monitor's
    own call, as forwarding makes; peer.caps None: no authentication)."""
    if peer is None or peer.caps is None:
        return
    entity, caps = peer.entity, peer.caps
    if entity == "mon.":
        return                          # another monitor: forwarding, Raft, internal calls
    if op in MON_OPS:
        raise refuse(peer, op, "the mon. key")
    if op in READ_OPS:
        if not caps.allows_mon("r"):
            raise refuse(peer, op, "mon=r")
    elif op in WRITE_OPS:
        if not caps.allows_mon("w"):
            raise refuse(peer, op, "mon=rw")
    elif op in ADMIN_OPS:
        if not caps.admin:
            raise refuse(peer, op, "admin")
    elif op in GATEWAY_OPS:
        if not caps.s3_gateway:
            raise refuse(peer, op, "s3gw or admin")
    elif op in DAEMON_OPS:
        if not (entity.startswith("osd.") or caps.admin):
            raise refuse(peer, op, "an osd. key")
        claimed = header.get("id", header.get("reporter"))
        if entity.startswith("osd.") and op in ("osd_boot", "osd_heartbeat", "osd_failure",
                                                "osd_stop") and claimed != int(entity[4:]):
            raise RequestFailed(Code.PERMISSION_DENIED, f"permission denied: {entity} may not "
                                f"{op} as osd.{claimed}")


def ticket_ttl_s(cmap):
    return config.value(cmap.config, "auth.ticket_ttl_s")


def _sealing_generation(service):
    """The service key that seals tickets now: the newest once every OSD has had time to
    fetch it, else the one before."""
    generations = sorted(service)
    newest = generations[-1]
    if len(generations) > 1 and time.time() - service[newest][1] < auth.SERVICE_KEY_GRACE_S:
        return generations[-2]
    return newest


def _wrapped(peer, secret):
    nonce = os.urandom(auth.CHALLENGE_BYTES)
    return {"key": auth.wrap(peer.state["wrap_key"], secret, nonce), "nonce": nonce}


def _entity_arg(header):
    try:
        return auth.check_entity(header.get("entity"))
    except auth.AuthError as exc:
        raise RequestFailed(Code.INVALID, str(exc)) from None


def _caps_arg(header):
    caps = header.get("caps")
    try:
        return auth.Caps.parse(caps).texts()
    except auth.AuthError as exc:
        raise RequestFailed(Code.INVALID, str(exc)) from None


# -- requests (bound into Monitor's request table) ---------------------------------------------

async def auth_get_ticket(monitor, peer, header):
    store = monitor.store
    if store.auth_mode == "none" or peer is None or peer.caps is None:
        return {"auth": "none"}, b""
    if not store.service:
        raise RequestFailed(Code.NO_QUORUM, "no service key yet: the leader makes the first one "
                            "within a second of its election; retry")
    generation = _sealing_generation(store.service)
    ttl = ticket_ttl_s(monitor.map)
    expires = time.time() + ttl
    keys = {generation: store.service[generation][0]}
    blob, key = auth.seal_ticket(keys, generation, peer.entity, peer.caps.texts(), expires)
    return {"ticket": blob, "expires": expires, "ttl": ttl, **_wrapped(peer, key)}, b""


async def auth_service_keys(monitor, peer, header):
    if peer is None or peer.caps is None:
        return {"keys": []}, b""
    keys = []
    for generation, (secret, _) in sorted(monitor.store.service.items()):
        wrapped = _wrapped(peer, secret)
        keys.append([generation, wrapped["key"], wrapped["nonce"]])
    return {"keys": keys}, b""


async def auth_add(monitor, peer, header):
    """Add an entity with a new key (refused if it exists: `auth caps` changes caps)."""
    entity, caps = _entity_arg(header), _caps_arg(header)
    if entity in monitor.store.auth:
        raise RequestFailed(Code.EXISTS, f"{entity} exists; 'cairn auth caps' changes its caps, "
                            "'cairn auth rm' removes it")
    secret = auth.new_secret()
    await commit(monitor, {"set": {entity: [monitor.store.seal(secret), caps]}},
                 header.get("rid"))
    reply = {"entity": entity, "caps": caps}
    if peer is not None and "wrap_key" in peer.state:
        reply.update(_wrapped(peer, secret))
    return reply, b""


async def auth_caps(monitor, peer, header):
    entity, caps = _entity_arg(header), _caps_arg(header)
    found = monitor.store.auth.get(entity)
    if found is None:
        raise RequestFailed(Code.NOT_FOUND, f"no entity {entity}")
    await commit(monitor, {"set": {entity: [monitor.store.seal(found[0]), caps]}},
                 header.get("rid"))
    return {"entity": entity, "caps": caps}, b""


async def auth_rm(monitor, peer, header):
    entity = _entity_arg(header)
    if entity == "mon.":
        raise RequestFailed(Code.INVALID, "the mon. key cannot be removed")
    if entity not in monitor.store.auth:
        raise RequestFailed(Code.NOT_FOUND, f"no entity {entity}")
    await commit(monitor, {"rm": [entity]}, header.get("rid"))
    return {"entity": entity, "removed": True}, b""


async def auth_ls(monitor, peer, header):
    return {"entities": [{"entity": entity, "caps": caps}
                         for entity, (_, caps) in sorted(monitor.store.auth.items())
                         if entity != "mon."]}, b""


async def auth_get(monitor, peer, header):
    entity = _entity_arg(header)
    found = monitor.store.auth.get(entity)
    if found is None or entity == "mon.":
        raise RequestFailed(Code.NOT_FOUND, f"no entity {entity}")
    reply = {"entity": entity, "caps": found[1]}
    if peer is not None and "wrap_key" in peer.state:
        reply.update(_wrapped(peer, found[0]))
    return reply, b""


async def auth_change(monitor, peer, header):
    """A follower's key change, committed by this leader."""
    change = header.get("change")
    if not isinstance(change, dict) or not set(change) <= {"set", "rm", "svc", "s3set", "s3rm"}:
        raise RequestFailed(Code.INVALID, "auth_change needs a change of set, rm or svc")
    command = {"t": "auth", **change}
    if header.get("rid") is not None:
        command["rid"] = header["rid"]
    return await monitor._replicate(command) or {}, b""


def _access_key_arg(header):
    key = header.get("key")
    if not isinstance(key, str) or not auth.S3_ACCESS_KEY_RE.match(key):
        raise RequestFailed(Code.INVALID, f"an S3 access key is 16 to 128 upper-case letters and "
                            f"digits (was {str(key)[:140]!r})")
    return key


async def auth_s3_key_add(monitor, peer, header):
    """A new S3 access key and secret for an existing entity (s3/: the gateway signs requests
    with it and applies the entity's caps)."""
    entity = _entity_arg(header)
    if entity not in monitor.store.auth or not entity.startswith("client."):
        raise RequestFailed(Code.NOT_FOUND, f"no client entity {entity}; add it first with "
                            "'cairn auth add'")
    access_key, secret = auth.new_s3_access_key(), auth.new_secret()
    await commit(monitor, {"s3set": {access_key: [monitor.store.seal(secret), entity]}},
                 header.get("rid"))
    reply = {"entity": entity, "access_key": access_key}
    if peer is not None and "wrap_key" in peer.state:
        reply.update(_wrapped(peer, secret))
    return reply, b""


async def auth_s3_key_rm(monitor, peer, header):
    access_key = _access_key_arg(header)
    if access_key not in monitor.store.s3keys:
        raise RequestFailed(Code.NOT_FOUND, f"no S3 access key {access_key}")
    await commit(monitor, {"s3rm": [access_key]}, header.get("rid"))
    return {"access_key": access_key, "removed": True}, b""


async def auth_s3_key_ls(monitor, peer, header):
    entity = header.get("entity")
    return {"keys": [{"access_key": key, "entity": owner}
                     for key, (_, owner) in sorted(monitor.store.s3keys.items())
                     if entity is None or owner == entity]}, b""


async def auth_s3_key_get(monitor, peer, header):
    """An S3 gateway's lookup: the key's entity, that entity's caps and the secret (wrapped)."""
    access_key = _access_key_arg(header)
    found = monitor.store.s3keys.get(access_key)
    owner = monitor.store.auth.get(found[1]) if found is not None else None
    if owner is None:
        raise RequestFailed(Code.NOT_FOUND, f"no S3 access key {access_key}")
    reply = {"access_key": access_key, "entity": found[1], "caps": owner[1]}
    if peer is not None and "wrap_key" in peer.state:
        reply.update(_wrapped(peer, found[0]))
    return reply, b""


async def audit_report(monitor, peer, header):
    """An S3 gateway's audit events (its changes and refusals), queued like the monitor's own."""
    events = header.get("events")
    if not isinstance(events, list) or len(events) > AUDIT_QUEUED_MAX:
        raise RequestFailed(Code.INVALID, f"audit_report needs a list of at most "
                            f"{AUDIT_QUEUED_MAX} events")
    fields = ("time", "entity", "addr", "op", "target", "result")
    for found in events:
        if not isinstance(found, dict) or set(found) - set(fields) or \
                not all(isinstance(found.get(f), (str, int, float, type(None))) for f in fields):
            raise RequestFailed(Code.INVALID, "an audit event is {time, entity, addr, op, "
                                "target, result}")
        monitor.queue_audit({f: found.get(f) for f in fields})
    return {"queued": len(events)}, b""


async def commit(monitor, change, rid=None):
    """Commit a key change through Raft: here if this monitor leads, else at the leader."""
    header = {"op": "auth_change", "change": change}
    if rid is not None:
        header["rid"] = rid
    if monitor.is_leader:
        return await auth_change(monitor, None, header)
    return await monitor._forward(Frame(Kind.REQUEST, 0, header, b""))


async def rotate_service_keys(monitor):
    """The leader's part: a first service key at once, then a new one every hour."""
    service = monitor.store.service
    if monitor.store.auth_mode == "none":
        return
    newest = max(service) if service else 0
    if service and time.time() - service[newest][1] < auth.SERVICE_KEY_ROTATE_S:
        return
    sealed = monitor.store.seal(auth.new_secret())
    await monitor._replicate({"t": "auth", "svc": [newest + 1, sealed, time.time()]})


def target_of(header):
    if header.get("op") == "pool_allow_from" and header.get("prefix"):
        return f"{header.get('name')}/{header['prefix']}"[:256]
    if header.get("op") == "osd_mark":         # which OSD, and what it was set to
        state = header.get("state")
        value = header.get(state) if state in ("weight", "reweight") else None
        return (f"osd.{header.get('id')} {state}" +
                (f" {value}" if value is not None else ""))[:256]
    for field in ("name", "entity", "key", "id"):
        if header.get(field) is not None:
            return str(header[field])[:256]
    return None


async def audit_append(monitor, peer, header):
    """A follower's audit events, committed by this leader."""
    events = header.get("events")
    if not isinstance(events, list) or len(events) > AUDIT_QUEUED_MAX or \
            not all(isinstance(found, dict) for found in events):
        raise RequestFailed(Code.INVALID, "audit_append needs a list of events")
    await monitor._replicate({"t": "audit", "events": events})
    return {}, b""


async def audit_read(monitor, peer, header):
    """The audit events since `since` of `entity` (each optional), oldest first; with `limit`,
    only that many of the newest."""
    since, entity, limit = header.get("since"), header.get("entity"), header.get("limit")
    since = since if isinstance(since, (int, float)) else None
    entity = entity if isinstance(entity, str) else None
    events = [found for _, found in monitor.store.audit if audit.matches(found, since, entity)]
    if type(limit) is int and limit > 0:
        events = events[-limit:]
    return {"events": events}, b""


REQUESTS = {"audit_append": audit_append, "audit_read": audit_read,
            "auth_get_ticket": auth_get_ticket, "auth_service_keys": auth_service_keys,
            "auth_add": auth_add, "auth_caps": auth_caps, "auth_rm": auth_rm,
            "auth_ls": auth_ls, "auth_get": auth_get, "auth_change": auth_change,
            "auth_s3_key_add": auth_s3_key_add, "auth_s3_key_rm": auth_s3_key_rm,
            "auth_s3_key_ls": auth_s3_key_ls, "auth_s3_key_get": auth_s3_key_get,
            "audit_report": audit_report}
