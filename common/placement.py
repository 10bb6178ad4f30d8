"""Placement: which OSDs hold a placement group, as a pure function of the map (no I/O, no clock).

Every client, OSD, monitor and the offline `cairn placement test` tool computes the same answer
from the same map, so no metadata server sits in the data path (DESIGN.md, "Placement").

Objects map to placement groups (PGs) by a stable hash of the name: `pg = crc32c(name) mod pg_num`,
pg_num a power of two. A PG maps to OSDs by a *rule* run over a weighted tree of typed buckets
(root > room > rack > host > osd by default).

Theory of operation: straw2, made consistent across levels.

- Each OSD draws a straw for PG x: `u = hash(x, osd, salt)` in [1, 65536], then
  `draw = ln(u / 65536) / weight`, the exponential race of Ceph's straw2. The largest draw wins, so
  an OSD wins with probability proportional to its weight. The logarithm is a table of fixed-point
  log2 built with integer arithmetic only, and the division is an integer division, so every
  process on every machine computes bit-identical draws.
- A bucket's draw is the best draw among the OSDs under it. The maximum of exponential races is
  itself an exponential race with the summed weight, so choosing among buckets this way *is* straw2
  with bucket weight = the sum of its OSDs' weights. Unlike per-level independent draws (Ceph),
  every level agrees with the one below it. That gives the property DESIGN.md relies on: changing
  one OSD's weight changes that OSD's draws only, so PGs move only to or from that OSD.
- `chooseleaf N TYPE` walks the OSDs under the step's bucket in draw order and keeps each OSD whose
  TYPE-ancestor (its failure domain) is not used yet, until N are kept. `choose N TYPE` does the
  same but keeps the TYPE buckets themselves, for the next step to choose inside each of them
  ("choose 8 hosts, then 3 OSDs in each"). Each step has its own salt.
- Out and reweighted OSDs are handled after the raw choice, in the style of Ceph's reweight: an
  OSD is accepted for PG x if it is in and `hash(x, osd, REWEIGHT_SALT) mod 65536 < reweight`. A
  rejected member is replaced by the next OSD in the same step's draw order whose failure domain no
  other member uses. Under `indep` the replacement takes the rejected member's position (shards
  keep their positions; a position with no candidate left is None). Under `firstn` the rejected
  members are dropped, the rest move up, and replacements are appended (a replica set's primary
  stays a member that holds data). Because replacements avoid the domains of every other member,
  marking one OSD out changes only the positions it held.

Map format (`PlacementMap.from_dict`, also the JSON the offline tool reads):

    {"types": ["osd", "host", "rack", "root"],                 # leaf type first
     "buckets": [{"name": "default", "type": "root", "children": ["rack1", ...]},
                 {"name": "h1", "type": "host", "children": ["osd.0", "osd.1"]}, ...],
     "osds": [{"id": 0, "weight": 1.0, "reweight": 1.0, "in": true}, ...],
     "rules": [{"name": "replicated-host", "mode": "firstn",
                "steps": [{"take": "default"}, {"chooseleaf": 0, "type": "host"}]}],
     "pools": [{"name": "data", "id": 1, "size": 3, "pg_num": 256, "rule": "replicated-host"}]}

A step's count N > 0 is taken as is; N <= 0 means pool size + N (0: the pool size). The last
step must produce OSDs.
"""

import dataclasses

import numpy as np

from cairn.native.checksum import crc32c

DEFAULT_TYPES = ("osd", "host", "rack", "room", "root")

# Fixed point: weights and reweights in 16.16 (1.0 = 0x10000), log2 with 24 fraction bits.
WEIGHT_ONE = 0x10000
LOG_FRACTION_BITS = 24
WEIGHT_MAX = 1_000_000.0

# Salts: each step draws with its own; the reweight test has one of its own.
REWEIGHT_SALT = 0x5EED_0F_0FF
STEP_SALT_BASE = 0x57E9_0000

_M64 = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_NO_DRAW = np.iinfo(np.int64).min + 1         # + 1: it is negated for sorting


class PlacementError(ValueError):
    """The map or a rule is malformed, or a pool cannot be placed; the message says which."""


# -- deterministic arithmetic ----------------------------------------------------------------------

def _mix(h):
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def hash3(a, b, c):
    """A well-mixed 64-bit hash of three non-negative integers (or uint64 arrays, broadcast)."""
    # At least 1-d: numpy checks overflow on scalars, and wrapping is what we want here.
    a = np.atleast_1d(np.asarray(a, dtype=np.uint64))
    b = np.atleast_1d(np.asarray(b, dtype=np.uint64))
    c = np.atleast_1d(np.asarray(c, dtype=np.uint64))
    h = _mix(a * np.uint64(0x9E3779B97F4A7C15) + b)
    return _mix(h ^ (c * np.uint64(0xC2B2AE3D27D4EB4F) + np.uint64(0x165667B19E3779F9)))


def _log2_table():
    """LOG2[u] = log2(u) in fixed point (LOG_FRACTION_BITS fraction bits) for u in 0..65536,
    computed by repeated squaring in integers: no floating point, identical everywhere."""
    u = np.arange(65537, dtype=np.uint64)
    u[0] = 1                                          # never used: draws take u >= 1
    exponent = np.zeros(65537, dtype=np.uint64)
    for bit in range(1, 17):
        exponent += (u >= np.uint64(1 << bit)).astype(np.uint64)
    mantissa = u << (np.uint64(31) - exponent)        # x = mantissa / 2^31, in [1, 2)
    fraction = np.zeros(65537, dtype=np.uint64)
    top = np.uint64(1 << 32)
    for _ in range(LOG_FRACTION_BITS):
        mantissa = (mantissa * mantissa) >> np.uint64(31)
        carry = mantissa >= top
        mantissa = np.where(carry, mantissa >> np.uint64(1), mantissa)
        fraction = (fraction << np.uint64(1)) | carry.astype(np.uint64)
    return ((exponent << np.uint64(LOG_FRACTION_BITS)) | fraction).astype(np.int64)


_LOG2 = _log2_table()
_LOG2_MAX = 16 << LOG_FRACTION_BITS


def draws(x, osd_ids, weights, salt):
    """Straw2 draws of OSDs `osd_ids` (int array) with 16.16 `weights` for PG seed(s) `x`;
    larger wins. `x` may be a column vector of seeds: the result is then one row per seed.
    Weight 0 never wins."""
    u = ((hash3(x, osd_ids, salt) >> np.uint64(48)) + np.uint64(1)).astype(np.int64)
    numerator = (_LOG2[u] - _LOG2_MAX) << 16          # <= 0: ln(u/65536) scaled
    safe = np.where(weights > 0, weights, 1)
    return np.where(weights > 0, numerator // safe, _NO_DRAW)


def accepted(x, osd_ids, reweights):
    """The reweight test: True where the OSD takes PG x (reweight 0x10000 always, 0 never)."""
    coin = (hash3(x, osd_ids, REWEIGHT_SALT) >> np.uint64(48)).astype(np.int64)
    return coin < reweights


def stable_pg(object_name, pg_num):
    """The PG index of an object (pg_num a power of two)."""
    return crc32c(object_name.encode() if isinstance(object_name, str) else object_name) \
        % pg_num


def pg_seed(pool_id, pg_index):
    """The placement input x of a PG: distinct for every (pool, pg)."""
    return int((hash3(pool_id, pg_index, 0x9C5EED) >> np.uint64(1))[0])


# -- the map ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Osd:
    id: int
    weight: int          # 16.16 fixed point (the placement weight, usually its size in TiB)
    reweight: int        # 16.16, 0..WEIGHT_ONE
    is_in: bool


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    mode: str            # "firstn" | "indep"
    steps: tuple         # (("take", name), ("choose"|"chooseleaf", n, type), ...)


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    id: int
    size: int
    pg_num: int
    rule: str


@dataclasses.dataclass
class _Scope:
    """The OSDs under one bucket, with each one's ancestor of one type (its failure domain)."""
    osd_ids: np.ndarray          # int64, in tree order
    weights: np.ndarray          # int64 16.16
    domains: list                # per OSD: the domain's name (an OSD's own name for type osd)


def _fixed(value, what, upper):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= upper:
        raise PlacementError(f"{what} must be a number within 0..{upper} (was {value!r})")
    return int(round(value * WEIGHT_ONE))


def osd_name(osd_id):
    return f"osd.{osd_id}"


class PlacementMap:
    """The placement part of the cluster map: types, buckets, OSDs, rules, pools. Immutable once
    built; `map_pg()` and `map_pool()` are pure."""

    def __init__(self, types, buckets, osds, rules, pools):
        self.types = tuple(types)
        self.buckets = buckets          # name -> (type, (child names...))
        self.osds = osds                # id -> Osd
        self.rules = rules              # name -> Rule
        self.pools = pools              # name -> Pool
        self._parent = {}
        for name, (_, children) in buckets.items():
            for child in children:
                self._parent[child] = name
        self._scopes = {}
        self._validate()

    # -- building and checking ----------------------------------------------------------------

    @classmethod
    def from_dict(cls, data):
        if not isinstance(data, dict):
            raise PlacementError("a placement map is a JSON object")
        types = data.get("types", list(DEFAULT_TYPES))
        if not (isinstance(types, list) and types and all(isinstance(t, str) and t
                                                          for t in types)
                and len(set(types)) == len(types)):
            raise PlacementError("types must be a list of distinct names, leaf type first")
        buckets = {}
        for entry in data.get("buckets", []):
            try:
                name, kind, children = entry["name"], entry["type"], entry["children"]
            except (KeyError, TypeError):
                raise PlacementError(f"a bucket needs name, type and children (got {entry!r})") \
                    from None
            if not isinstance(name, str) or not name or name.startswith("osd."):
                raise PlacementError(f"bad bucket name {name!r} (osd.N names OSDs)")
            if name in buckets:
                raise PlacementError(f"bucket {name!r} appears twice")
            if kind not in types[1:]:
                raise PlacementError(f"bucket {name!r} has type {kind!r}; bucket types are "
                                     f"{', '.join(types[1:])}")
            if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
                raise PlacementError(f"children of {name!r} must be a list of names")
            buckets[name] = (kind, tuple(children))
        osds = {}
        for entry in data.get("osds", []):
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), int) \
                    or isinstance(entry.get("id"), bool) or entry["id"] < 0:
                raise PlacementError(f"an OSD needs a non-negative integer id (got {entry!r})")
            osd_id = entry["id"]
            if osd_id in osds:
                raise PlacementError(f"osd.{osd_id} appears twice")
            osds[osd_id] = Osd(id=osd_id,
                               weight=_fixed(entry.get("weight", 1.0), f"weight of osd.{osd_id}",
                                             WEIGHT_MAX),
                               reweight=_fixed(entry.get("reweight", 1.0),
                                               f"reweight of osd.{osd_id}", 1.0),
                               is_in=bool(entry.get("in", True)))
        rules = {}
        for entry in data.get("rules", []):
            rule = _parse_rule(entry, types)
            if rule.name in rules:
                raise PlacementError(f"rule {rule.name!r} appears twice")
            rules[rule.name] = rule
        pools = {}
        for entry in data.get("pools", []):
            pool = _parse_pool(entry)
            if pool.name in pools:
                raise PlacementError(f"pool {pool.name!r} appears twice")
            pools[pool.name] = pool
        return cls(types, buckets, osds, rules, pools)

    def to_dict(self):
        return {
            "types": list(self.types),
            "buckets": [{"name": name, "type": kind, "children": list(children)}
                        for name, (kind, children) in self.buckets.items()],
            "osds": [{"id": osd.id, "weight": osd.weight / WEIGHT_ONE,
                      "reweight": osd.reweight / WEIGHT_ONE, "in": osd.is_in}
                     for osd in self.osds.values()],
            "rules": [{"name": rule.name, "mode": rule.mode,
                       "steps": [_step_dict(step) for step in rule.steps]}
                      for rule in self.rules.values()],
            "pools": [dataclasses.asdict(pool) for pool in self.pools.values()],
        }

    def _validate(self):
        seen_osds = set()
        for name, (_, children) in self.buckets.items():
            for child in children:
                if child.startswith("osd."):
                    try:
                        osd_id = int(child[4:])
                    except ValueError:
                        raise PlacementError(f"bucket {name!r}: bad OSD name {child!r}") from None
                    if osd_id not in self.osds:
                        raise PlacementError(f"bucket {name!r} holds {child}, which is not in "
                                             f"the OSD list")
                    if osd_id in seen_osds:
                        raise PlacementError(f"{child} is in two buckets")
                    seen_osds.add(osd_id)
                elif child not in self.buckets:
                    raise PlacementError(f"bucket {name!r} holds {child!r}, which is not a "
                                         f"bucket")
        for name in self.buckets:                       # no cycles, types strictly descend
            kind = self.buckets[name][0]
            for child in self.buckets[name][1]:
                child_type = "osd" if child.startswith("osd.") else self.buckets[child][0]
                if child_type == "osd":
                    child_type = self.types[0]
                if self.types.index(child_type) >= self.types.index(kind):
                    raise PlacementError(f"bucket {name!r} ({kind}) holds {child!r} "
                                         f"({child_type}): children must be of a lower type")
        for rule in self.rules.values():
            for step in rule.steps:
                if step[0] == "take" and step[1] not in self.buckets:
                    raise PlacementError(f"rule {rule.name!r} takes {step[1]!r}, which is not "
                                         f"a bucket")
        for pool in self.pools.values():
            if pool.rule not in self.rules:
                raise PlacementError(f"pool {pool.name!r} uses rule {pool.rule!r}, which does "
                                     f"not exist")

    def check_pool(self, pool_name):
        """Raise PlacementError unless the pool's rule can give it `size` OSDs in distinct
        failure domains with every OSD in and weighted (the question a monitor asks before it
        creates the pool)."""
        pool = self.pool(pool_name)
        rule = self.rules[pool.rule]
        steps = rule.steps[1:]

        def feasible(bucket, index):
            """How many distinct domains step `index` can use under `bucket`."""
            _, count, kind = steps[index]
            scope = self._scope(bucket, kind)
            usable = {domain for osd_id, domain in zip(scope.osd_ids.tolist(), scope.domains)
                      if self.osds[osd_id].weight > 0 and self.osds[osd_id].is_in
                      and self.osds[osd_id].reweight > 0}
            if index + 1 < len(steps):
                need_next = _count(steps[index + 1][1], pool.size)
                usable = {domain for domain in usable if feasible(domain, index + 1) >= need_next}
            return len(usable)

        need = _count(steps[0][1], pool.size)
        have = feasible(rule.steps[0][1], 0)
        if have < need:
            _, _, kind = steps[0]
            raise PlacementError(
                f"pool {pool.name!r} (size {pool.size}, rule {rule.name!r}) needs {need} {kind} "
                f"failure domains under {rule.steps[0][1]!r} that can hold it, and the map has "
                f"{have}")
        total = need
        for step in steps[1:]:
            total *= _count(step[1], pool.size)
        if total < pool.size:
            raise PlacementError(f"pool {pool.name!r}: rule {rule.name!r} yields {total} OSDs per "
                                 f"PG, fewer than the pool size {pool.size}")
        return True

    def pool(self, name):
        try:
            return self.pools[name]
        except KeyError:
            raise PlacementError(f"no pool named {name!r} (pools: "
                                 f"{', '.join(sorted(self.pools)) or 'none'})") from None

    # -- the tree -----------------------------------------------------------------------------

    def _type_of(self, name):
        return self.types[0] if name.startswith("osd.") else self.buckets[name][0]

    def ancestor(self, name, kind):
        """`name`'s ancestor of type `kind` (itself if it has that type), or None."""
        while name is not None and self._type_of(name) != kind:
            name = self._parent.get(name)
        return name

    def _scope(self, bucket, kind):
        key = (bucket, kind)
        scope = self._scopes.get(key)
        if scope is None:
            ids, domains = [], []
            stack = [bucket]
            while stack:                                # depth-first, children in order
                name = stack.pop()
                if name.startswith("osd."):
                    ids.append(int(name[4:]))
                    domains.append(self.ancestor(name, kind) or name)
                else:
                    stack.extend(reversed(self.buckets[name][1]))
            ids_array = np.array(ids, dtype=np.int64)
            weights = np.array([self.osds[i].weight for i in ids], dtype=np.int64)
            scope = self._scopes[key] = _Scope(ids_array, weights, domains)
        return scope

    # -- placement ----------------------------------------------------------------------------

    def map_pg(self, pool_name, pg_index):
        """The OSD ids holding PG `pg_index` of the pool, in order (None where an indep position
        has no OSD left)."""
        return self.map_pool(pool_name, [pg_index])[0]

    def map_object(self, pool_name, object_name):
        """(pg index, OSD ids) of an object."""
        pool = self.pool(pool_name)
        pg_index = stable_pg(object_name, pool.pg_num)
        return pg_index, self.map_pg(pool_name, pg_index)

    def map_pool(self, pool_name, pg_indexes=None):
        """OSD lists for the given PGs of a pool (all of them by default), computed together."""
        pool = self.pool(pool_name)
        rule = self.rules[pool.rule]
        if pg_indexes is None:
            pg_indexes = range(pool.pg_num)
        seeds = np.array([pg_seed(pool.id, index) for index in pg_indexes], dtype=np.uint64)
        results = [None] * len(seeds)
        # Each entry of `working` is, per PG, the list of bucket names a step chooses inside.
        working = [[] for _ in seeds]
        final_groups = [[] for _ in seeds]              # per PG: (scope key, salt, members)
        for step_index, step in enumerate(rule.steps):
            if step[0] == "take":
                working = [[step[1]] for _ in seeds]
                continue
            op, count, kind = step
            need = _count(count, pool.size)
            salt = STEP_SALT_BASE + step_index
            leaf = op == "chooseleaf" or kind == self.types[0]
            new_working = [[] for _ in seeds]
            new_groups = [[] for _ in seeds]
            # Group PGs by the bucket they choose inside, to draw for all of them at once.
            by_bucket = {}
            for row, buckets in enumerate(working):
                for position, bucket in enumerate(buckets):
                    by_bucket.setdefault(bucket, []).append((row, position))
            slots = [dict() for _ in seeds]
            for bucket, places in by_bucket.items():
                scope = self._scope(bucket, kind)
                rows = np.array([row for row, _ in places], dtype=np.int64)
                table = draws(seeds[rows][:, None], scope.osd_ids[None, :],
                              scope.weights[None, :], salt)
                orders = np.argsort(-table, axis=1, kind="stable")
                for (row, position), order, drawn in zip(places, orders, table):
                    picked = _walk(order, drawn, scope.domains, need)
                    if leaf:
                        members = [int(scope.osd_ids[i]) for i in picked]
                        slots[row][position] = ((bucket, kind), salt, members, order, drawn)
                    else:
                        slots[row][position] = [scope.domains[i] for i in picked]
            for row in range(len(seeds)):
                for position in sorted(slots[row]):
                    value = slots[row][position]
                    if leaf:
                        new_groups[row].append(value)
                    else:
                        new_working[row].extend(value)
            if leaf:
                final_groups = new_groups
                working = [[] for _ in seeds]
            else:
                working = new_working
        for row, seed in enumerate(seeds):
            results[row] = self._finish(rule.mode, int(seed), final_groups[row])
        return results

    def _finish(self, mode, seed, groups):
        """Apply out/reweight to the raw choice (see the module docstring)."""
        out = []
        for (bucket, kind), _salt, members, order, drawn in groups:
            scope = self._scope(bucket, kind)
            ids = scope.osd_ids
            ok = self._accepted(seed, members)
            if all(ok):
                out.extend(members)
                continue
            index_of = {int(ids[i]): i for i in range(len(ids))}
            kept = [m if good else None for m, good in zip(members, ok)]
            if mode == "firstn":
                kept = [m for m in kept if m is not None]
                slots = [None] * (len(members) - len(kept))
                kept = kept + slots
            for position, member in enumerate(kept):
                if member is not None:
                    continue
                used = {scope.domains[index_of[m]] for m in kept if m is not None}
                kept[position] = self._replacement(seed, order, drawn, scope, used, kept)
            if mode == "firstn":
                kept = [m for m in kept if m is not None]
            out.extend(kept)
        return out

    def _replacement(self, seed, order, drawn, scope, used_domains, members):
        for index in order:
            if drawn[index] == _NO_DRAW:
                break
            osd_id = int(scope.osd_ids[index])
            if osd_id in members or scope.domains[index] in used_domains:
                continue
            if self._accepted(seed, [osd_id])[0]:
                return osd_id
        return None

    def _accepted(self, seed, osd_ids):
        """Per OSD: in, and passing the reweight test for this seed (one numpy call)."""
        osds = [self.osds[i] for i in osd_ids]
        coins = accepted(seed, osd_ids, np.array([osd.reweight for osd in osds], dtype=np.int64))
        return [osd.is_in and bool(coin) for osd, coin in zip(osds, coins)]


def _walk(order, drawn, domains, need):
    """Indexes of the first `need` OSDs in draw order with distinct domains (weight > 0)."""
    picked, used = [], set()
    for index in order:
        if drawn[index] == _NO_DRAW:
            break
        domain = domains[index]
        if domain in used:
            continue
        used.add(domain)
        picked.append(int(index))
        if len(picked) == need:
            break
    return picked


def _count(count, size):
    need = count if count > 0 else size + count
    if need <= 0:
        raise PlacementError(f"a step asks for {count} with pool size {size}: nothing to choose")
    return need


def _parse_rule(entry, types):
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise PlacementError(f"a rule needs a name (got {entry!r})")
    name = entry["name"]
    mode = entry.get("mode", "firstn")
    if mode not in ("firstn", "indep"):
        raise PlacementError(f"rule {name!r}: mode must be firstn or indep (was {mode!r})")
    raw_steps = entry.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise PlacementError(f"rule {name!r} needs a list of steps")
    steps = []
    for raw in raw_steps:
        if not isinstance(raw, dict):
            raise PlacementError(f"rule {name!r}: a step is an object (got {raw!r})")
        if "take" in raw:
            steps.append(("take", raw["take"]))
            continue
        op = "chooseleaf" if "chooseleaf" in raw else "choose" if "choose" in raw else None
        if op is None:
            raise PlacementError(f"rule {name!r}: unknown step {raw!r} (take, choose, "
                                 f"chooseleaf)")
        count, kind = raw[op], raw.get("type")
        if not isinstance(count, int) or isinstance(count, bool):
            raise PlacementError(f"rule {name!r}: {op} needs an integer count (got {count!r})")
        if kind not in types:
            raise PlacementError(f"rule {name!r}: {op} type {kind!r} is not one of "
                                 f"{', '.join(types)}")
        if not steps or (steps[-1][0] not in ("take", "choose")) or \
                (steps[-1][0] == "choose" and steps[-1][2] == types[0]):
            raise PlacementError(f"rule {name!r}: {op} must follow take or a choose of buckets")
        steps.append((op, count, kind))
    if steps[0][0] != "take" or len(steps) < 2:
        raise PlacementError(f"rule {name!r} must start with take and choose something")
    last = steps[-1]
    if last[0] == "take" or (last[0] == "choose" and last[2] != types[0]):
        raise PlacementError(f"rule {name!r} must end with chooseleaf or a choose of "
                             f"{types[0]}s")
    if any(step[0] == "take" for step in steps[1:]):
        raise PlacementError(f"rule {name!r}: take only once, first")
    return Rule(name=name, mode=mode, steps=tuple(steps))


def _step_dict(step):
    if step[0] == "take":
        return {"take": step[1]}
    return {step[0]: step[1], "type": step[2]}


def _parse_pool(entry):
    if not isinstance(entry, dict):
        raise PlacementError(f"a pool is an object (got {entry!r})")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise PlacementError(f"a pool needs a name (got {entry!r})")
    values = {}
    for field in ("id", "size", "pg_num"):
        value = entry.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if field == "id"
                                                                              else 1):
            raise PlacementError(f"pool {name!r}: {field} must be a positive integer "
                                 f"(was {value!r})")
        values[field] = value
    if values["pg_num"] & (values["pg_num"] - 1):
        raise PlacementError(f"pool {name!r}: pg_num must be a power of two (was "
                             f"{values['pg_num']})")
    if not isinstance(entry.get("rule"), str):
        raise PlacementError(f"pool {name!r} needs a rule name")
    return Pool(name=name, id=values["id"], size=values["size"], pg_num=values["pg_num"],
                rule=entry["rule"])
