"""The authentication core (common/auth.py): keyrings, caps, proofs, tickets and frame MACs.

Caps are checked against a model with hypothesis: a grant never allows an op outside its pool
or prefix, and a read grant never allows a write. Tickets: a forged, damaged, expired or
unknown-generation ticket is refused; the ticket key a monitor hands out is the one an OSD
recomputes. Frame MACs: a frame moved to another session, replayed, or altered fails.
"""

import hashlib
import os
import stat

import pytest

from cairn.common import server as serving
from hypothesis import given, settings, strategies as st

from cairn.common import auth
from cairn.common.auth import AuthError, Caps

pytestmark = pytest.mark.unit

names = st.text(alphabet="ab/-", min_size=0, max_size=6)
pools = st.sampled_from(["ckpt", "data", "meta"])


def test_keyring_round_trip_is_private(tmp_path):
    path = str(tmp_path / "alice.keyring")
    secret = auth.new_secret()
    auth.write_keyring(path, {"client.alice": (secret, ["mon=r", "osd=rw pool=ckpt"])})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert auth.read_keyring(path) == {"client.alice": secret}
    for text, message in ((b"nokey", "not a keyring"), (b"[client.a]\n", "has no key"),
                          (b"[client.a]\nkey = !!\n", "base64"),
                          (b"[client.a]\nkey = YWJj\n", "32 bytes"),
                          (b"[bogus]\nkey = YWJj\n", "entity must be")):
        bad = tmp_path / "bad.keyring"
        bad.write_bytes(text)
        with pytest.raises(AuthError, match=message):
            auth.read_keyring(str(bad))
    with pytest.raises(AuthError, match="cannot read keyring"):
        auth.read_keyring(str(tmp_path / "missing"))


def test_caps_parse_and_refuse_what_they_cannot_mean():
    caps = Caps.parse(["mon=r", "osd=rw pool=ckpt prefix=team-a/", "osd=r"])
    assert caps.texts() == ["mon=r", "osd=rw pool=ckpt prefix=team-a/", "osd=r"]
    assert caps.allows_mon("r") and not caps.allows_mon("w")
    assert caps.allows_object("w", "ckpt", "team-a/x")
    assert not caps.allows_object("w", "ckpt", "team-b/x")
    assert caps.allows_object("r", "data", "anything")
    assert Caps.parse(["admin"]).allows_object("w", "x", "y")
    for bad in ("", "mon", "mon=x", "osd=rw pool=", "osd=rw color=red", "mon=r pool=a",
                "osd=r pool=a pool=b", "disk=rw"):
        with pytest.raises(AuthError):
            Caps.parse([bad])
    assert "needs osd=rw" in auth.denied("client.alice", "put ckpt/team-b/x", "osd=rw")


grants = st.tuples(st.sampled_from(["r", "rw"]), st.one_of(st.none(), pools), names)


@given(st.lists(grants, max_size=4), st.sampled_from(["r", "w"]), pools, names)
@settings(max_examples=400, deadline=None)
def test_a_cap_never_grants_an_op_outside_its_pool_or_prefix(granted, perm, pool, name):
    texts = []
    for perms, grant_pool, prefix in granted:
        text = f"osd={perms}" + (f" pool={grant_pool}" if grant_pool else "") + \
            (f" prefix={prefix}" if prefix else "")
        texts.append(text)
    caps = Caps.parse(texts)
    model = any(perm in perms and grant_pool in (None, pool) and name.startswith(prefix)
                for perms, grant_pool, prefix in granted)
    assert caps.allows_object(perm, pool, name) == model
    assert not caps.allows_mon("r") and not caps.admin
    shown = caps.list_prefixes(pool)
    readable = any("r" in perms and grant_pool in (None, pool) and name.startswith(prefix)
                   for perms, grant_pool, prefix in granted)
    assert any(name.startswith(prefix) for prefix in shown) == readable


def test_proofs_and_session_keys_depend_on_every_part():
    key, cc, sc = auth.new_secret(), os.urandom(16), os.urandom(16)
    assert auth.proof(key, "mon", "client.a", cc, sc) != auth.proof(key, "mon", "client.b", cc, sc)
    assert auth.proof(key, "mon", "ab", "c") != auth.proof(key, "mon", "a", "bc")
    c2s, s2c = auth.session_keys(key, cc, sc)
    assert c2s != s2c and auth.session_keys(key, cc, os.urandom(16))[0] != c2s
    secret, nonce = auth.new_secret(), os.urandom(16)
    wrapped = auth.wrap(s2c, secret, nonce)
    assert wrapped != secret and auth.unwrap(s2c, wrapped, nonce) == secret
    assert auth.unwrap(c2s, wrapped, nonce) != secret


def test_tickets_open_only_when_sealed_by_a_held_key_and_unexpired():
    keys = {1: auth.new_secret(), 2: auth.new_secret()}
    blob, key = auth.seal_ticket(keys, 2, "client.alice", ["osd=r pool=ckpt"], 1000.0)
    ticket = auth.open_ticket(keys, blob, now=999.0)
    assert (ticket.entity, ticket.caps.texts(), ticket.key) == \
        ("client.alice", ["osd=r pool=ckpt"], key)
    with pytest.raises(AuthError, match="expired"):
        auth.open_ticket(keys, blob, now=1000.5)
    with pytest.raises(AuthError, match="does not hold"):
        auth.open_ticket({1: keys[1]}, blob, now=0.0)
    with pytest.raises(AuthError, match="does not check"):
        auth.open_ticket({1: keys[1], 2: auth.new_secret()}, blob, now=0.0)
    for position in range(0, len(blob), 7):
        damaged = bytearray(blob)
        damaged[position] ^= 0x40
        with pytest.raises(AuthError):
            auth.open_ticket(keys, bytes(damaged), now=0.0)
    for garbage in (b"", b"x" * 40, os.urandom(200), "text"):
        with pytest.raises(AuthError, match="malformed|does not"):
            auth.open_ticket(keys, garbage, now=0.0)


def test_frame_macs_bind_the_session_the_order_and_the_bytes():
    key = auth.new_secret()
    sender, receiver = auth.FrameMac(key), auth.FrameMac(key)
    fixed, header = os.urandom(28), b"\x81\xa2op\xa3get"
    tags = [sender.next(fixed, header) for _ in range(3)]
    assert len(set(tags)) == 3 and all(len(tag) == auth.MAC_BYTES for tag in tags)
    assert receiver.next(fixed, header) == tags[0]
    assert receiver.next(fixed, header) != tags[0]               # a replay fails
    assert auth.FrameMac(auth.new_secret()).next(fixed, header) != tags[0]
    assert auth.FrameMac(key).next(fixed[:-1] + b"x", header) != tags[0]


@given(st.binary(min_size=1, max_size=64), st.integers(0, 2**64 - 2), st.binary(min_size=28,
       max_size=28), st.one_of(st.binary(max_size=400), st.integers(0, 3).map(
           lambda k: bytes(range(256)) * k)))
@settings(max_examples=300, deadline=None)
def test_the_shipped_frame_mac_is_keyed_blake2b_salted_with_the_frame_number(key, count, fixed,
                                                                             header):
    """The MAC every frame carries (in C where extensions are built) is the twin's function:
    BLAKE2b-128 under the session key, salted with the frame's number, of the fixed part
    and the header; headers across block boundaries (100 and 228 bytes) and counters near
    2**64."""
    shipped, twin = auth.FrameMac(key), auth.FrameMacTwin(key)
    shipped.count = twin.count = count
    assert shipped.next(fixed, header) == twin.next(fixed, header) == hashlib.blake2b(
        fixed + header, key=key, salt=(count + 1).to_bytes(16, "little"),
        digest_size=auth.MAC_BYTES).digest()
    assert shipped.count == count + 1 and shipped.key == key


# -- handshakes over real loopback sockets ----------------------------------------------------------

def test_monitor_and_ticket_handshakes_over_loopback():
    """A MonGuard server and a TicketGuard server: the right key gets a MACed session that
    knows who it is; a wrong key, no handshake, a forged or expired ticket get `permission
    denied`, and an expired session is cut off."""
    import asyncio
    import time

    from cairn.common import messenger, sessions
    from cairn.common.messenger import ConnectionClosed, RequestFailed
    from tests.helpers import run

    alice, service = auth.new_secret(), {1: auth.new_secret()}
    ttl = [30.0]

    async def handler(peer, received):
        op = received.header.get("op")
        if op == "whoami":
            return {"entity": peer.entity, "caps": peer.caps.texts()}, received.payload
        if op == "ticket":
            blob, key = auth.seal_ticket(service, 1, peer.entity, peer.caps.texts(),
                                         time.time() + ttl[0])
            nonce = os.urandom(16)
            return {"ticket": blob, "key": auth.wrap(peer.state["wrap_key"], key, nonce),
                    "nonce": nonce, "expires": time.time() + ttl[0], "ttl": ttl[0]}, b""
        raise RequestFailed("unknown_op", op)

    async def main():
        entities = {"client.alice": (alice, ["osd=r pool=ckpt"])}
        mon = await serving.serve("127.0.0.1:0", handler, guard=sessions.MonGuard(
            entities.get, True, lambda: 30.0))
        osd = await serving.serve("127.0.0.1:0", handler, guard=sessions.TicketGuard(
            lambda: service, True))
        mon_addr = "127.0.0.1:%d" % mon.sockets[0].getsockname()[1]
        osd_addr = "127.0.0.1:%d" % osd.sockets[0].getsockname()[1]
        try:
            connection = await messenger.connect(
                mon_addr, authenticate=sessions.monitor_handshake("client.alice", alice))
            reply = await connection.request({"op": "whoami"}, b"p" * 100_000)
            assert reply.header == {"entity": "client.alice", "caps": ["osd=r pool=ckpt"]}
            assert bytes(reply.payload) == b"p" * 100_000

            async def fetch():
                return await connection.request({"op": "ticket"}), connection
            tickets = sessions.Tickets(fetch)
            to_osd = await messenger.connect(osd_addr, authenticate=tickets.authenticate)
            reply = await to_osd.request({"op": "whoami"})
            assert reply.header["entity"] == "client.alice"
            await to_osd.close()

            with pytest.raises(RequestFailed, match="does not know client.alice's key"):
                await messenger.connect(mon_addr, authenticate=sessions.monitor_handshake(
                    "client.alice", auth.new_secret()))
            with pytest.raises(RequestFailed, match="no entity client.bob"):
                await messenger.connect(mon_addr, authenticate=sessions.monitor_handshake(
                    "client.bob", alice))
            bare = await messenger.connect(mon_addr)
            with pytest.raises(RequestFailed, match="requires authentication") as caught:
                await bare.request({"op": "whoami"})
            assert caught.value.code == "permission_denied"
            forged, _ = auth.seal_ticket({1: auth.new_secret()}, 1, "client.admin", ["admin"],
                                         time.time() + 60)
            bare = await messenger.connect(osd_addr)
            with pytest.raises(RequestFailed, match="does not check"):
                await bare.request({"op": "auth_ticket", "cc": os.urandom(16),
                                    "ticket": forged})
            # A session outlives its ticket by nothing: the next request is refused.
            ttl[0] = 1.0
            tickets.forget()
            short = await messenger.connect(osd_addr, authenticate=tickets.authenticate)
            await short.request({"op": "whoami"})
            await asyncio.sleep(1.2)
            with pytest.raises((RequestFailed, ConnectionClosed), match="expired|closed"):
                await short.request({"op": "whoami"})
            await connection.close()
        finally:
            for server in (mon, osd):
                server.close()
                await server.wait_closed()
    run(main())
