"""What an OSD lets a connection do (osd/access.py): caps and IP allowlists, through the real
check the daemon runs, against a real cluster map that `pool_allow_from` incrementals built.

Allowlists are checked against a model with hypothesis: an op on an object is served exactly
when the peer's address lies in every allowlist whose prefix starts the object's name, and a
listing shows exactly those names.
"""

import ipaddress
import types

import pytest
from hypothesis import given, settings, strategies as st

from cairn.common.auth import Caps
from cairn.common.clustermap import ALLOW_RULES_MAX, ClusterMap, Incremental, MapError
from cairn.common.messenger import RequestFailed
from cairn.osd import access

pytestmark = pytest.mark.unit

NETWORKS = ["10.0.0.0/8", "10.1.0.0/16", "192.168.7.0/24", "127.0.0.1/32", "::1/128"]
ADDRESSES = ["10.1.2.3", "10.9.0.1", "192.168.7.9", "127.0.0.1", "::1", "::ffff:10.1.2.3",
             "172.16.0.1"]
names = st.text(alphabet="ab/", min_size=0, max_size=5)


def step(cmap, *ops):
    return cmap.apply(Incremental(cmap.epoch + 1, ops))


def pool_map():
    return step(ClusterMap("fsid", epoch=1),
                {"op": "osd_add", "id": 0, "uuid": "u0", "location": {"host": "h1"}},
                {"op": "pool_create", "name": "data", "kind": "replicated", "size": 1,
                 "pg_num": 1})


def peer(ip, caps=None, entity=None):
    return types.SimpleNamespace(ip=ip, caps=caps, entity=entity, addr=f"{ip}:1")


def request(cmap, op, name=None):
    header = {"op": op, "pool": cmap.pools["data"]["id"]}
    if name is not None:
        header["name"] = name
    return header


def test_allowlists_are_validated_kept_canonical_and_removed():
    cmap = step(pool_map(), {"op": "pool_allow_from", "name": "data", "prefix": "",
                             "networks": ["10.1.2.3", "10.1.2.0/16"]})
    assert cmap.pools["data"]["allow_from"] == {"": ["10.1.2.3/32", "10.1.0.0/16"]}
    for bad, words in ([{"networks": ["10.0.0.300"]}, "not an address"],
                       [{"networks": "10.0.0.0/8"}, "must be a list"],
                       [{"networks": [], "prefix": "x/"}, "no allowlist for prefix 'x/'"],
                       [{"networks": ["10.0.0.0/8"], "prefix": 7}, "prefix must be"],
                       [{"networks": ["10.0.0.0/8"], "name": "nope"}, "no pool named"]):
        with pytest.raises(MapError, match=words):
            step(cmap, {"op": "pool_allow_from", "name": "data", **bad})
    with pytest.raises(MapError, match=f"at most {ALLOW_RULES_MAX}"):
        step(cmap, *[{"op": "pool_allow_from", "name": "data", "prefix": f"p{i}/",
                      "networks": ["10.0.0.0/8"]} for i in range(ALLOW_RULES_MAX)])
    cmap = step(cmap, {"op": "pool_allow_from", "name": "data", "networks": []})
    assert "allow_from" not in cmap.pools["data"]


@given(st.dictionaries(names, st.lists(st.sampled_from(NETWORKS), min_size=1, max_size=2),
                       max_size=3),
       st.sampled_from(ADDRESSES), st.lists(names, max_size=6))
@settings(max_examples=300, deadline=None)
def test_an_address_reaches_exactly_the_objects_every_covering_allowlist_admits(
        rules, ip, objects):
    cmap = pool_map()
    if rules:
        cmap = step(cmap, *[{"op": "pool_allow_from", "name": "data", "prefix": prefix,
                             "networks": networks} for prefix, networks in rules.items()])
    address = ipaddress.ip_address(ip)
    address = address.ipv4_mapped or address if address.version == 6 else address

    def model(name):
        return all(any(address in ipaddress.ip_network(n) for n in networks)
                   for prefix, networks in rules.items() if name.startswith(prefix))

    for name in objects:
        for op in ("get", "shard_read", "put", "delete", "omap"):
            if model(name):
                assert access.check(peer(ip), cmap, request(cmap, op, name)) is None
            else:
                with pytest.raises(RequestFailed, match=f"needs an address in .*not {ip}"):
                    access.check(peer(ip), cmap, request(cmap, op, name))
    if not model(""):
        with pytest.raises(RequestFailed, match="permission denied"):
            access.check(peer(ip), cmap, request(cmap, "list"))
    else:
        listing = access.check(peer(ip), cmap, request(cmap, "list"))
        assert access.visible(objects, listing) == [name for name in objects if model(name)]


def test_allowlists_hold_for_keyed_clients_and_caps_still_apply():
    cmap = step(pool_map(), {"op": "pool_allow_from", "name": "data", "prefix": "team-a/",
                             "networks": ["10.1.0.0/16"]})
    reader = Caps.parse(["osd=r pool=data prefix=team-"])
    inside, outside = peer("10.1.0.5", reader, "client.a"), peer("10.2.0.5", reader, "client.a")
    assert access.check(inside, cmap, request(cmap, "get", "team-a/x")) is None
    with pytest.raises(RequestFailed, match="client.a may not get data/team-a/x"):
        access.check(outside, cmap, request(cmap, "get", "team-a/x"))
    assert access.check(outside, cmap, request(cmap, "get", "team-b/x")) is None
    with pytest.raises(RequestFailed, match="needs osd=rw"):
        access.check(inside, cmap, request(cmap, "put", "team-a/x"))
    names = ["team-a/x", "team-b/y", "other"]
    assert access.visible(names, access.check(outside, cmap, request(cmap, "list"))) == \
        ["team-b/y"]
    assert access.visible(names, access.check(inside, cmap, request(cmap, "list"))) == \
        ["team-a/x", "team-b/y"]
    # OSD-to-OSD requests are not client ops: no allowlist applies to them.
    osd = peer("10.9.9.9", Caps.parse(["osd=rw"]), "osd.3")
    assert access.check(osd, cmap, {"op": "rep_put", "pool": cmap.pools["data"]["id"],
                                     "name": "team-a/x"}) is None
    # A connection with no address (a Unix socket) is in no allowlist.
    with pytest.raises(RequestFailed, match="permission denied"):
        access.check(peer(None), cmap, request(cmap, "get", "team-a/x"))
