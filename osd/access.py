"""Who may ask an OSD what (pure): the caps of the peer's ticket against the request.

- Client ops on objects need `osd=r` (get, stat, list, omap reads) or `osd=rw` (put, delete,
  omap changes) on the object's pool and a prefix of its name. A listing shows only the names
  under the prefixes the caps can read.
- Everything else (replication, peering, recovery, scrub) is OSD-to-OSD: an `osd.N` entity
  only. `ping` and `status` likewise (admin keys too).
- Without authentication (`auth none`: the peer has no caps) nothing is checked.
A refusal is `permission_denied` naming the entity, the op and the cap it lacks.
"""

from cairn.common import auth
from cairn.common.messenger import RequestFailed
from cairn.common.pg import pool_by_id

READ_OPS = frozenset({"get", "stat", "list", "omap_get", "omap_list"})
WRITE_OPS = frozenset({"put", "delete", "omap"})


def _denied(peer, what, missing):
    return RequestFailed("permission_denied", auth.denied(peer.entity, what, missing))


def check(peer, cmap, header):
    """None if the peer may send this request, else raise `permission_denied`. For a listing
    the caller gets the name prefixes it may show (a list; [""] for all)."""
    if peer is None or peer.caps is None:
        return None
    op, caps = header.get("op"), peer.caps
    if op not in READ_OPS and op not in WRITE_OPS:
        if peer.entity.startswith("osd.") or caps.admin:
            return None
        raise _denied(peer, op, "an osd. key (OSD-to-OSD request)")
    pool = pool_by_id(cmap, header.get("pool")) if cmap is not None else None
    pool_name = pool["name"] if pool is not None else None
    perm = "r" if op in READ_OPS else "w"
    missing = f"osd={'r' if perm == 'r' else 'rw'} pool={pool_name}"
    if op == "list":
        prefixes = caps.list_prefixes(pool_name)
        if not prefixes:
            raise _denied(peer, f"list {pool_name}", missing)
        return prefixes
    name = header.get("name")
    if not isinstance(name, str) or not caps.allows_object(perm, pool_name, name):
        raise _denied(peer, f"{op} {pool_name}/{name}", f"{missing} prefix covering it")
    return None


def visible(names, prefixes):
    """The names a listing may show."""
    if prefixes is None or prefixes == [""]:
        return names
    return [name for name in names if any(name.startswith(prefix) for prefix in prefixes)]
