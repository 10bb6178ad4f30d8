"""Who may ask an OSD what (pure): the caps of the peer's ticket against the request.

- Client ops on objects need `osd=r` (get, stat, list, omap reads, shard reads) or `osd=rw`
  (put, delete, omap changes) on the object's pool and a prefix of its name. A listing shows
  only the names under the prefixes the caps can read.
- Everything else (replication, peering, recovery, scrub) is OSD-to-OSD: an `osd.N` entity
  only. `ping` and `status` likewise (admin keys too).
- Without authentication (`auth none`: the peer has no caps) no cap is checked.
- A pool's IP allowlists (`cairn pool set POOL allow-from CIDR,... [--prefix PATH]`, kept in the
  map as pool["allow_from"] {prefix: [CIDR, ...]}) hold with or without authentication: a client
  op on an object is served only if the connection's real peer address lies in every allowlist
  whose prefix starts the object's name. A listing shows only the names the address may use.
A refusal is `permission_denied` naming the entity, the op and the cap (or address) it lacks.
"""

from cairn.common import auth
from cairn.common.auth import admits, in_networks as _in
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.common.pg import pool_by_id

READ_OPS = frozenset({"get", "stat", "list", "omap_get", "omap_list", "shard_read",
                      "hedge_won"})
WRITE_OPS = frozenset({"put", "delete", "omap"})


def _denied(peer, what, missing):
    return RequestFailed(Code.PERMISSION_DENIED, auth.denied(peer.entity, what, missing))


def check(peer, cmap, header):
    """None if the peer may send this request, else raise `permission_denied`. For a listing
    the caller gets a Listing to filter the names with (`visible`)."""
    if peer is None:
        return None
    op, caps = header.get("op"), peer.caps
    if op not in READ_OPS and op not in WRITE_OPS:
        if caps is None or peer.entity.startswith("osd.") or caps.admin:
            return None
        raise _denied(peer, op, "an osd. key (OSD-to-OSD request)")
    pool = pool_by_id(cmap, header.get("pool")) if cmap is not None else None
    pool_name = pool["name"] if pool is not None else None
    rules = pool.get("allow_from") if pool is not None else None
    if op == "list":
        prefixes = [""]
        if caps is not None:
            prefixes = caps.list_prefixes(pool_name)
            if not prefixes:
                raise _denied(peer, f"list {pool_name}", f"osd=r pool={pool_name}")
        if rules and not all(_in(peer.ip, networks) for networks in rules.values()):
            if not admits(rules, peer.ip, ""):            # the whole pool's allowlist
                raise _denied(peer, f"list {pool_name}", _from(peer, rules, ""))
            return Listing(prefixes, rules, peer.ip)
        return Listing(prefixes) if prefixes != [""] else None
    name = header.get("name")
    if caps is not None:
        perm = "r" if op in READ_OPS else "w"
        if not isinstance(name, str) or not caps.allows_object(perm, pool_name, name):
            raise _denied(peer, f"{op} {pool_name}/{name}", f"osd={'r' if perm == 'r' else 'rw'} "
                          f"pool={pool_name} prefix covering it")
    if rules and not admits(rules, peer.ip, name if isinstance(name, str) else ""):
        raise _denied(peer, f"{op} {pool_name}/{name}",
                      _from(peer, rules, name if isinstance(name, str) else ""))
    return None


def _from(peer, rules, name):
    """What a refused address lacks: the first allowlist covering `name` it is not in."""
    for prefix in sorted(rules):
        if name.startswith(prefix) and not _in(peer.ip, rules[prefix]):
            where = f" for prefix {prefix!r}" if prefix else ""
            return f"an address in {','.join(rules[prefix])}{where}, not {peer.ip}"
    return f"an allowed address, not {peer.ip}"


class Listing:
    """What a listing may show: names under the caps' prefixes ([""]: all) and, when the
    pool has allowlists the address is not in everywhere, only names whose allowlists admit
    it."""

    def __init__(self, prefixes, rules=None, ip=None):
        self.prefixes, self.rules, self.ip = prefixes, rules, ip

    def shows(self, name):
        return ((self.prefixes == [""] or any(name.startswith(p) for p in self.prefixes))
                and (self.rules is None or admits(self.rules, self.ip, name)))


def visible(names, listing):
    """The names a listing may show."""
    if listing is None:
        return names
    return [name for name in names if listing.shows(name)]
