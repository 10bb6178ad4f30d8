"""The cluster map: epochs, OSDs, pools and config, changed only by incrementals (pure: no I/O).

The monitor owns the map. Every change is an `Incremental`: a list of operations that turns epoch N
into epoch N+1. The monitor logs each one durably before it acknowledges it, and pushes it to
subscribers, who apply the same function and so hold the same map. `apply()` validates before it
changes anything, so a bad operation is refused whole and the map never holds a half-applied
incremental.

The placement tree is not stored. It is derived from each OSD's location (`host=h1 rack=r1`,
filled up to the root `default`), so registering an OSD is all it takes to place it. Each pool's
rule is derived from its kind:
- replicated pools: `chooseleaf size <failure domain>` (firstn);
- erasure k+m pools: `chooseleaf k+m <failure domain>` (indep); with `osds_per_domain` d > 1,
  `choose (k+m)/d <domain>` then `choose d osd` (indep): 18+6 on 8 hosts × 3.

Operations (each a dict with "op"):
    osd_add      id, uuid, location {type: name}, weight
    osd_boot     id, addr             (up, and in unless it was marked out by hand)
    osd_down     id
    osd_out      id, [manual]         (manual: stays out on boot until osd_in)
    osd_in       id
    osd_reweight id, reweight
    osd_weight   id, weight           (its placement weight: a new host's OSDs join at 0 and
                                       are raised in steps, cairn-cluster add-host)
    pool_create  name, kind (replicated|erasure), size, min_size | k, m, failure_domain, pg_num,
                 [osds_per_domain], [backend], [fast_read]
    pool_delete  name
    pool_set_quota name, [max_objects], [max_bytes]   (0: no limit; a field left out stays)
    pool_fast_read name, fast_read    (an erasure pool's reads ask every member, decode the first
                                       k shards; takes effect at each OSD's next read)
    pool_quota_full name, full        (the leader: the pool reached its quota; writes refused)
    pool_allow_from name, prefix, networks   (["CIDR", ...]: only these addresses may use the
                                       pool's objects under prefix; []: the rule goes)
    osd_full     id, full             (the leader: the OSD reached the full ratio; writes to
                                       its PGs refused)
    osd_slow     id, slow             (the leader: SLOW_DISK names it; reads avoid it)
    config_set   key, value           (value None deletes)
"""

import copy
import dataclasses
import ipaddress

from cairn.common import config
from cairn.common.placement import DEFAULT_TYPES, PlacementError, PlacementMap
from cairn.native.erasure import BACKENDS as EC_BACKENDS, DEFAULT_BACKEND as EC_BACKEND_DEFAULT

ROOT_NAME = "default"
PG_NUM_MAX = 1 << 16
POOL_SIZE_MAX = 64
# liberasurecode codes at most 32 fragments (EC_MAX_FRAGMENTS).
EC_SIZE_MAX = 32
CONFIG_KEY_BYTES_MAX = 128
CONFIG_VALUE_BYTES_MAX = 4096
# IP allowlists: rules (prefixes) per pool, ranges per rule, bytes of a prefix.
ALLOW_RULES_MAX = 64
ALLOW_NETWORKS_MAX = 64
PREFIX_BYTES_MAX = 1024


class MapError(ValueError):
    """An incremental was refused; the message says why. The map is unchanged."""


@dataclasses.dataclass(frozen=True)
class Incremental:
    epoch: int              # the epoch this incremental creates
    ops: tuple              # operation dicts, applied in order

    def to_dict(self):
        return {"epoch": self.epoch, "ops": [dict(op) for op in self.ops]}

    @classmethod
    def from_dict(cls, data):
        if not isinstance(data, dict) or not isinstance(data.get("epoch"), int) \
                or not isinstance(data.get("ops"), list):
            raise MapError("an incremental is {epoch: int, ops: [...]}")
        return cls(epoch=data["epoch"], ops=tuple(data["ops"]))


class ClusterMap:
    """One epoch of the cluster map. Treat as immutable: `apply()` returns a new map."""

    def __init__(self, fsid, epoch=0, types=DEFAULT_TYPES, osds=None, pools=None, config=None,
                 next_pool_id=1):
        self.fsid = fsid
        self.epoch = epoch
        self.types = tuple(types)
        self.osds = osds if osds is not None else {}        # id -> dict (see osd_add/boot)
        self.pools = pools if pools is not None else {}     # name -> dict
        self.config = config if config is not None else {}
        self.next_pool_id = next_pool_id
        self._placement = None

    # -- persistence ----------------------------------------------------------------------------

    def to_dict(self):
        return {"fsid": self.fsid, "epoch": self.epoch, "types": list(self.types),
                "osds": [self.osds[i] for i in sorted(self.osds)],
                "pools": [self.pools[name] for name in sorted(self.pools)],
                "config": dict(self.config), "next_pool_id": self.next_pool_id}

    @classmethod
    def from_dict(cls, data):
        try:
            return cls(fsid=data["fsid"], epoch=data["epoch"], types=data["types"],
                       osds={osd["id"]: dict(osd) for osd in data["osds"]},
                       pools={pool["name"]: dict(pool) for pool in data["pools"]},
                       config=dict(data["config"]), next_pool_id=data["next_pool_id"])
        except (KeyError, TypeError) as exc:
            raise MapError(f"not a cluster map: {exc}") from None

    # -- changes --------------------------------------------------------------------------------

    def apply(self, incremental):
        """The map of `incremental.epoch` (which must be this epoch + 1), or MapError."""
        if incremental.epoch != self.epoch + 1:
            raise MapError(f"incremental for epoch {incremental.epoch} does not follow epoch "
                           f"{self.epoch}")
        new = ClusterMap(self.fsid, incremental.epoch, self.types, copy.deepcopy(self.osds),
                         copy.deepcopy(self.pools), dict(self.config), self.next_pool_id)
        for op in incremental.ops:
            if not isinstance(op, dict) or not isinstance(op.get("op"), str):
                raise MapError(f"an operation is a dict with 'op' (got {op!r})")
            handler = _HANDLERS.get(op["op"])
            if handler is None:
                raise MapError(f"unknown operation {op['op']!r} (known: "
                               f"{', '.join(sorted(_HANDLERS))})")
            handler(new, op)
        # A new pool must be placeable on the registered OSDs (in or out, up or down: the
        # topology decides; OSDs come and go). Refused whole otherwise.
        created = [op["name"] for op in incremental.ops if op["op"] == "pool_create"
                   and op["name"] in new.pools]
        if created:
            topology = new.placement_dict(all_in=True)
            try:
                check = PlacementMap.from_dict(topology)
                for name in created:
                    check.check_pool(name)
            except PlacementError as exc:
                raise MapError(str(exc)) from None
        return new

    # -- derived views ----------------------------------------------------------------------------

    def placement(self):
        """The PlacementMap of this epoch (built once)."""
        if self._placement is None:
            self._placement = PlacementMap.from_dict(self.placement_dict())
        return self._placement

    def placement_dict(self, all_in=False):
        """The map in `PlacementMap.from_dict` form; `all_in` treats every OSD as in."""
        bucket_types = self.types[1:]
        children = {ROOT_NAME: []}
        kind_of = {ROOT_NAME: self.types[-1]}
        for osd_id in sorted(self.osds):
            osd = self.osds[osd_id]
            chain = [(kind, osd["location"][kind]) for kind in bucket_types[:-1]
                     if kind in osd["location"]]
            parent = ROOT_NAME
            for kind, name in reversed(chain):          # top-down: rack before host
                if name not in children:
                    children[name] = []
                    kind_of[name] = kind
                    children[parent].append(name)
                parent = name
            children[parent].append(f"osd.{osd_id}")
        buckets = [{"name": name, "type": kind_of[name], "children": kids}
                   for name, kids in children.items()]
        osds = [{"id": osd["id"], "weight": osd["weight"],
                 "reweight": 1.0 if all_in else osd["reweight"],
                 "in": True if all_in else osd["in"]} for osd in self.osds.values()]
        rules, pools = [], []
        for pool in self.pools.values():
            rules.append(_rule_of(pool, self.types[0]))
            pools.append({"name": pool["name"], "id": pool["id"], "size": pool["size"],
                          "pg_num": pool["pg_num"], "rule": f"pool-{pool['name']}"})
        return {"types": list(self.types), "buckets": buckets, "osds": osds, "rules": rules,
                "pools": pools}

    def osd_tree(self):
        """[{id, host, rack, weight, reweight, up, in, full, slow}] in id order (for `cairn
        osd tree`)."""
        return [{"id": osd["id"], "host": osd["location"].get("host"),
                 "rack": osd["location"].get("rack"), "weight": osd["weight"],
                 "reweight": osd["reweight"], "up": osd["up"], "in": osd["in"],
                 "full": bool(osd.get("full")), "slow": bool(osd.get("slow"))}
                for osd in (self.osds[i] for i in sorted(self.osds))]


def _rule_of(pool, leaf_type):
    domain = pool["failure_domain"]
    if pool["kind"] == "replicated":
        steps = [{"take": ROOT_NAME}, {"chooseleaf": 0, "type": domain}]
        mode = "firstn"
    else:
        per_domain = pool.get("osds_per_domain", 1)
        mode = "indep"
        if per_domain > 1:
            steps = [{"take": ROOT_NAME}, {"choose": pool["size"] // per_domain, "type": domain},
                     {"choose": per_domain, "type": leaf_type}]
        else:
            steps = [{"take": ROOT_NAME}, {"chooseleaf": 0, "type": domain}]
    return {"name": f"pool-{pool['name']}", "mode": mode, "steps": steps}


# -- operation handlers: validate, then change `new` in place --------------------------------------

def _int(op, field, low, high):
    value = op.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MapError(f"{op['op']}: {field} must be an integer within {low}..{high} "
                       f"(was {value!r})")
    return value


def _number(op, field, low, high, default=None):
    value = op.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise MapError(f"{op['op']}: {field} must be a number within {low}..{high} "
                       f"(was {value!r})")
    return float(value)


def _osd(new, op):
    osd_id = _int(op, "id", 0, 1 << 30)
    if osd_id not in new.osds:
        raise MapError(f"{op['op']}: osd.{osd_id} does not exist")
    return new.osds[osd_id]


def _osd_add(new, op):
    osd_id = _int(op, "id", 0, 1 << 30)
    uuid = op.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise MapError("osd_add: uuid must be a non-empty string")
    if osd_id in new.osds:
        if new.osds[osd_id]["uuid"] == uuid:
            return                                      # the same OSD registering again
        raise MapError(f"osd_add: osd.{osd_id} exists with another uuid")
    if any(osd["uuid"] == uuid for osd in new.osds.values()):
        raise MapError(f"osd_add: uuid {uuid} is already osd.{_id_of(new, uuid)}")
    location = op.get("location")
    if not isinstance(location, dict) or not location:
        raise MapError("osd_add: location must name at least a host, e.g. {host: h1}")
    for kind, name in location.items():
        if kind not in new.types[1:-1]:
            raise MapError(f"osd_add: location type {kind!r} is not one of "
                           f"{', '.join(new.types[1:-1])}")
        if not isinstance(name, str) or not name or name == ROOT_NAME or name.startswith("osd."):
            raise MapError(f"osd_add: bad {kind} name {name!r}")
        for other in new.osds.values():                 # a name means one bucket, one place
            for other_kind, other_name in other["location"].items():
                if other_name == name and other_kind != kind:
                    raise MapError(f"osd_add: {name!r} is already a {other_kind}, not a {kind}")
            if other["location"].get(kind) == name:
                above = {k: v for k, v in location.items()
                         if new.types.index(k) > new.types.index(kind)}
                other_above = {k: v for k, v in other["location"].items()
                               if new.types.index(k) > new.types.index(kind)}
                if above != other_above:
                    raise MapError(f"osd_add: {kind} {name!r} is under {other_above or 'the root'}"
                                   f" (osd.{other['id']}), not {above or 'the root'}")
    weight = _number(op, "weight", 0.0, 1_000_000.0, 1.0)
    new.osds[osd_id] = {"id": osd_id, "uuid": uuid, "location": dict(location),
                        "weight": weight, "reweight": 1.0, "up": False, "in": False,
                        "manual_out": False, "addr": None, "up_from": 0, "down_at": 0}


def _id_of(new, uuid):
    return next(osd["id"] for osd in new.osds.values() if osd["uuid"] == uuid)


def _osd_boot(new, op):
    osd = _osd(new, op)
    addr = op.get("addr")
    if not isinstance(addr, str) or ":" not in addr:
        raise MapError("osd_boot: addr must be host:port")
    osd.update(up=True, addr=addr, up_from=new.epoch)
    if not osd["manual_out"]:
        osd["in"] = True


def _osd_down(new, op):
    osd = _osd(new, op)
    osd.update(up=False, down_at=new.epoch)


def _osd_out(new, op):
    osd = _osd(new, op)
    osd["in"] = False
    if op.get("manual"):
        osd["manual_out"] = True


def _osd_in(new, op):
    osd = _osd(new, op)
    osd.update(manual_out=False)
    osd["in"] = True


def _osd_reweight(new, op):
    osd = _osd(new, op)
    osd["reweight"] = _number(op, "reweight", 0.0, 1.0)


def _osd_weight(new, op):
    osd = _osd(new, op)
    osd["weight"] = _number(op, "weight", 0.0, 1_000_000.0)


def _pool_create(new, op):
    name = op.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or "/" in name:
        raise MapError("pool_create: name must be 1-64 characters without '/'")
    if name in new.pools:
        raise MapError(f"pool_create: pool {name!r} exists")
    kind = op.get("kind")
    domain = op.get("failure_domain", "host")
    if domain not in new.types[:-1]:
        raise MapError(f"pool_create: failure domain {domain!r} is not one of "
                       f"{', '.join(new.types[:-1])}")
    if domain != new.types[0] and new.osds and \
            not any(domain in osd["location"] for osd in new.osds.values()):
        # Without the type in the tree every OSD would be its own domain: copies could share a
        # host. Refuse rather than place data unsafely.
        raise MapError(f"pool_create: no OSD has a {domain} in its location; register OSDs "
                       f"with a {domain} (cairn-osd run --{domain} NAME) or choose another "
                       f"failure domain")
    pg_num = _int(op, "pg_num", 1, PG_NUM_MAX)
    if pg_num & (pg_num - 1):
        raise MapError(f"pool_create: pg_num must be a power of two (was {pg_num})")
    pool = {"name": name, "id": new.next_pool_id, "kind": kind, "failure_domain": domain,
            "pg_num": pg_num}
    if kind == "replicated":
        size = _int(op, "size", 1, POOL_SIZE_MAX)
        min_size = op.get("min_size", size - size // 2)
        if not isinstance(min_size, int) or not 1 <= min_size <= size:
            raise MapError(f"pool_create: min_size must be within 1..{size} (was {min_size!r})")
        pool.update(size=size, min_size=min_size)
    elif kind == "erasure":
        k = _int(op, "k", 1, POOL_SIZE_MAX)
        m = _int(op, "m", 1, POOL_SIZE_MAX)
        if k + m > EC_SIZE_MAX:
            raise MapError(f"pool_create: k+m must be at most {EC_SIZE_MAX} (liberasurecode's "
                           f"limit; was {k + m})")
        per_domain = _int(op, "osds_per_domain", 1, k + m) if "osds_per_domain" in op else 1
        if (k + m) % per_domain:
            raise MapError(f"pool_create: osds_per_domain {per_domain} must divide k+m = "
                           f"{k + m}")
        if per_domain > m:
            raise MapError(f"pool_create: {per_domain} shards per {domain} would lose data "
                           f"when one {domain} fails (m = {m})")
        # min_size k + 1 by default (as Ceph): at exactly k shards one more lost shard loses
        # data written meanwhile. k is allowed (the CLI warns).
        min_size = op.get("min_size", k + 1 if m > 1 else k)
        if not isinstance(min_size, int) or not k <= min_size <= k + m:
            raise MapError(f"pool_create: min_size of an erasure pool must be within "
                           f"{k}..{k + m} (k..k+m; was {min_size!r})")
        backend = op.get("backend", EC_BACKEND_DEFAULT)
        if backend not in EC_BACKENDS:
            raise MapError(f"pool_create: erasure backend must be one of "
                           f"{', '.join(EC_BACKENDS)} (was {backend!r})")
        if backend == "isa_l_rs_vand" and m > 4:
            raise MapError("pool_create: isa_l_rs_vand cannot decode every loss of more than 4 "
                           "shards (not MDS for m > 4); use isa_l_rs_cauchy")
        fast_read = op.get("fast_read", False)
        if not isinstance(fast_read, bool):
            raise MapError(f"pool_create: fast_read is true or false (was {fast_read!r})")
        pool.update(size=k + m, min_size=min_size, k=k, m=m, osds_per_domain=per_domain,
                    backend=backend)
        if fast_read:
            pool["fast_read"] = True    # reads ask every member, decode the first k
    else:
        raise MapError(f"pool_create: kind must be replicated or erasure (was {kind!r})")
    new.pools[name] = pool
    new.next_pool_id += 1


def _pool_delete(new, op):
    name = op.get("name")
    if name not in new.pools:
        raise MapError(f"pool_delete: no pool named {name!r}")
    del new.pools[name]


def _pool_named(new, op):
    name = op.get("name")
    if name not in new.pools:
        raise MapError(f"{op['op']}: no pool named {name!r}")
    return new.pools[name]


def _pool_set_quota(new, op):
    pool = _pool_named(new, op)
    if "max_objects" not in op and "max_bytes" not in op:
        raise MapError("pool_set_quota: give max_objects, max_bytes or both (0: no limit)")
    for field in ("max_objects", "max_bytes"):
        if field in op:
            pool[field] = _int(op, field, 0, 1 << 62)


def _pool_allow_from(new, op):
    pool = _pool_named(new, op)
    prefix, networks = op.get("prefix", ""), op.get("networks")
    if not isinstance(prefix, str) or len(prefix.encode()) > PREFIX_BYTES_MAX:
        raise MapError(f"pool_allow_from: prefix must be a string of at most "
                       f"{PREFIX_BYTES_MAX} bytes")
    if not isinstance(networks, list) or len(networks) > ALLOW_NETWORKS_MAX:
        raise MapError(f"pool_allow_from: networks must be a list of at most "
                       f"{ALLOW_NETWORKS_MAX} CIDR ranges")
    canonical = []
    for network in networks:
        try:
            canonical.append(str(ipaddress.ip_network(network, strict=False)))
        except (TypeError, ValueError):
            raise MapError(f"pool_allow_from: {network!r} is not an address or CIDR "
                           f"range") from None
    rules = dict(pool.get("allow_from", {}))
    if canonical:
        rules[prefix] = canonical
    elif prefix in rules:
        del rules[prefix]
    else:
        raise MapError(f"pool_allow_from: pool {pool['name']!r} has no allowlist for "
                       f"prefix {prefix!r}")
    if len(rules) > ALLOW_RULES_MAX:
        raise MapError(f"pool_allow_from: at most {ALLOW_RULES_MAX} allowlists per pool")
    if rules:
        pool["allow_from"] = rules
    else:
        pool.pop("allow_from", None)


def _pool_fast_read(new, op):
    pool = _pool_named(new, op)
    if pool["kind"] != "erasure":
        raise MapError(f"pool_fast_read: pool {pool['name']!r} is replicated (its reads are "
                       "hedged instead); fast_read applies to erasure pools")
    if not isinstance(op.get("fast_read"), bool):
        raise MapError("pool_fast_read: fast_read must be true or false")
    if op["fast_read"]:
        pool["fast_read"] = True
    else:
        pool.pop("fast_read", None)


def _pool_quota_full(new, op):
    pool = _pool_named(new, op)
    if not isinstance(op.get("full"), bool):
        raise MapError("pool_quota_full: full must be true or false")
    pool["quota_full"] = op["full"]


def _osd_full(new, op):
    osd = _osd(new, op)
    if not isinstance(op.get("full"), bool):
        raise MapError("osd_full: full must be true or false")
    osd["full"] = op["full"]


def _osd_slow(new, op):
    osd = _osd(new, op)
    if not isinstance(op.get("slow"), bool):
        raise MapError("osd_slow: slow must be true or false")
    osd["slow"] = op["slow"]


def _config_set(new, op):
    key, value = op.get("key"), op.get("value")
    if not isinstance(key, str) or not key or len(key.encode()) > CONFIG_KEY_BYTES_MAX:
        raise MapError(f"config_set: key must be a string of 1..{CONFIG_KEY_BYTES_MAX} bytes")
    if value is None:
        if key not in new.config:
            raise MapError(f"config_set: {key!r} is not set")
        new.config.pop(key)
        return
    if not isinstance(value, str) or len(value.encode()) > CONFIG_VALUE_BYTES_MAX:
        raise MapError(f"config_set: value must be a string of at most "
                       f"{CONFIG_VALUE_BYTES_MAX} bytes")
    try:
        config.check(key, value)
    except KeyError as exc:
        raise MapError(f"config_set: {exc.args[0]}") from None
    except ValueError as exc:
        raise MapError(f"config_set: {exc}") from None
    new.config[key] = value


_HANDLERS = {"osd_add": _osd_add, "osd_boot": _osd_boot, "osd_down": _osd_down,
             "osd_out": _osd_out, "osd_in": _osd_in, "osd_reweight": _osd_reweight,
             "osd_weight": _osd_weight,
             "pool_create": _pool_create, "pool_delete": _pool_delete,
             "pool_set_quota": _pool_set_quota, "pool_quota_full": _pool_quota_full,
             "pool_allow_from": _pool_allow_from, "pool_fast_read": _pool_fast_read,
             "osd_full": _osd_full, "osd_slow": _osd_slow, "config_set": _config_set}
