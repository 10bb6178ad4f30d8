"""Handshakes over the messenger: the client's side (`monitor_handshake`, `Tickets`) and the
server's guards (`MonGuard`, `TicketGuard`); the cryptography is in common/auth.py.

A guard is handed to `server.serve`: it names its handshake op and answers it with the reply
and the session's keys; until then a connection may send nothing else. With `required` False
(the `auth none` configuration, for benchmarks) a guard answers `{"auth": "none"}` and every
connection is trusted: `peer.entity` and `peer.caps` stay None and no check is made.
"""

import asyncio
import os
import time

from cairn.common import auth
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed

# A client renews its ticket once less than this share of its lifetime is left.
TICKET_RENEW_SHARE = 1 / 3


def refused(message):
    return RequestFailed(Code.PERMISSION_DENIED, message)


def _challenge(header, field="cc"):
    value = header.get(field)
    if not isinstance(value, bytes) or len(value) != auth.CHALLENGE_BYTES:
        raise RequestFailed(Code.INVALID, f"{field} must be {auth.CHALLENGE_BYTES} bytes")
    return value


# -- the servers' side ---------------------------------------------------------------------------

class MonGuard:
    """A monitor's guard: entities prove they hold their key (auth_hello). `lookup(entity)` ->
    (secret, caps texts) or None; `ttl_s()` -> session lifetime (a revoked entity's sessions
    end within it)."""

    ops = frozenset({"auth_hello"})

    def __init__(self, lookup, required, ttl_s):
        self._lookup = lookup
        self.required = required
        self._ttl_s = ttl_s

    def handshake(self, peer, header):
        entity = header.get("entity")
        try:
            auth.check_entity(entity)
        except auth.AuthError as exc:
            raise RequestFailed(Code.INVALID, str(exc)) from None
        client_challenge = _challenge(header)
        found = self._lookup(entity)
        if found is None:
            raise refused(f"permission denied: no entity {entity} in this cluster")
        secret, caps = found
        server_challenge = os.urandom(auth.CHALLENGE_BYTES)
        to_server, to_client = auth.session_keys(secret, client_challenge, server_challenge)
        peer.state["wrap_key"] = to_client      # for what the monitor hands out wrapped
        reply = {"sc": server_challenge,
                 "proof": auth.proof(secret, "mon", entity, client_challenge, server_challenge)}
        return (reply, to_client, to_server, entity, auth.Caps.parse(caps),
                time.time() + self._ttl_s())


class TicketGuard:
    """An OSD's guard: clients show a ticket the monitors sealed (auth_ticket).
    `service_keys()` -> {generation: secret} this OSD holds."""

    ops = frozenset({"auth_ticket"})

    def __init__(self, service_keys, required):
        self._service_keys = service_keys
        self.required = required

    def handshake(self, peer, header):
        client_challenge = _challenge(header)
        try:
            ticket = auth.open_ticket(self._service_keys(), header.get("ticket"), time.time())
        except auth.AuthError as exc:
            raise refused(f"permission denied: {exc}") from None
        server_challenge = os.urandom(auth.CHALLENGE_BYTES)
        to_server, to_client = auth.session_keys(ticket.key, client_challenge,
                                                 server_challenge)
        reply = {"sc": server_challenge,
                 "proof": auth.proof(ticket.key, "osd", client_challenge, server_challenge)}
        return reply, to_client, to_server, ticket.entity, ticket.caps, ticket.expires


# -- the clients' side ---------------------------------------------------------------------------

def monitor_handshake(entity, secret):
    """`authenticate(connection)` for a monitor connection as `entity`."""

    async def authenticate(connection):
        client_challenge = os.urandom(auth.CHALLENGE_BYTES)
        reply = await connection.request({"op": "auth_hello", "entity": entity,
                                           "cc": client_challenge})
        if reply.header.get("auth") == "none":
            connection.session = {"auth": "none"}
            return
        server_challenge = reply.header.get("sc")
        if not isinstance(server_challenge, bytes) or not auth.check_proof(
                auth.proof(secret, "mon", entity, client_challenge, server_challenge),
                reply.header.get("proof")):
            raise refused(f"permission denied: the monitor at {connection.addr} does not know "
                          f"{entity}'s key as the keyring has it (a wrong or revoked key, or "
                          "not this cluster's monitor)")
        to_server, to_client = auth.session_keys(secret, client_challenge, server_challenge)
        connection.secure(to_server, to_client)
        connection.session = {"entity": entity, "wrap_key": to_client}
    return authenticate


def find_credentials(where=None, name=None, keyring=None):
    """(entity, secret or None) for a client: the entity from `name`, $CAIRN_NAME or
    client.admin; its key from `keyring`, $CAIRN_KEYRING, or the cluster directory's
    ENTITY.keyring (cairn-cluster up writes client.admin.keyring there). No keyring found: no
    key (enough for a cluster with auth none). AuthError names a bad one."""
    entity = auth.check_entity(name or os.environ.get("CAIRN_NAME") or "client.admin")
    path = keyring or os.environ.get("CAIRN_KEYRING")
    if path is None:
        where = where if where is not None else os.environ.get("CAIRN_CLUSTER")
        if isinstance(where, str) and where:
            directory = where if os.path.isdir(where) else \
                os.path.dirname(os.path.abspath(where)) if where.endswith(".json") else None
            candidate = os.path.join(directory, f"{entity}.keyring") if directory else None
            if candidate and os.path.exists(candidate):
                path = candidate
    if path is None:
        return entity, None
    keys = auth.read_keyring(path)
    if entity not in keys:
        raise auth.AuthError(f"{path} holds no key for {entity} (it has "
                             f"{', '.join(sorted(keys))}); give --name")
    return entity, keys[entity]


def client_handshake(where=None, name=None, keyring=None):
    """`authenticate` for a MonClient acting as the entity `find_credentials` finds (None: no
    key found, enough for a cluster with auth none). AuthError names a bad keyring."""
    entity, secret = find_credentials(where, name, keyring)
    return None if secret is None else monitor_handshake(entity, secret)


def unwrap_reply(connection, header, field="key"):
    """A secret the monitor sent wrapped under this session's key (header[field], "nonce")."""
    session = connection.session or {}
    wrapped, nonce = header.get(field), header.get("nonce")
    if "wrap_key" not in session or not isinstance(wrapped, bytes) or \
            len(wrapped) != auth.SECRET_BYTES or not isinstance(nonce, bytes):
        raise RequestFailed(Code.INVALID, "the monitor's reply holds no wrapped key")
    return auth.unwrap(session["wrap_key"], wrapped, nonce)


class Tickets:
    """This process's ticket for OSDs, fetched from the monitors and renewed before it
    expires. `fetch()` -> coroutine giving the monitor's reply to auth_get_ticket and the
    connection it came on (None when the cluster runs without auth)."""

    def __init__(self, fetch):
        self._fetch = fetch
        self._ticket = None         # (blob, key, expires, lifetime) or "none"
        self._lock = asyncio.Lock()

    async def current(self):
        async with self._lock:
            ticket = self._ticket
            now = time.time()
            if ticket is None or (ticket != "none" and
                                  ticket[2] - now < ticket[3] * TICKET_RENEW_SHARE):
                self._ticket = await self._renew()
            return self._ticket

    async def _renew(self):
        fetched = await self._fetch()
        if fetched is None:
            return "none"
        reply, connection = fetched
        blob, expires, lifetime = (reply.header.get(key) for key in ("ticket", "expires", "ttl"))
        if not isinstance(blob, bytes) or not isinstance(expires, float) or \
                not isinstance(lifetime, (int, float)):
            raise RequestFailed(Code.INVALID, "malformed ticket reply from the monitor")
        return blob, unwrap_reply(connection, reply.header), expires, lifetime

    def forget(self):
        self._ticket = None

    async def authenticate(self, connection):
        """`authenticate(connection)` for an OSD connection."""
        ticket = await self.current()
        client_challenge = os.urandom(auth.CHALLENGE_BYTES)
        header = {"op": "auth_ticket", "cc": client_challenge}
        if ticket != "none":
            header["ticket"] = ticket[0]
        reply = await connection.request(header)
        if reply.header.get("auth") == "none":
            connection.session = {"auth": "none"}
            return
        if ticket == "none":
            raise refused(f"permission denied: {connection.addr} wants a ticket and the "
                          "monitors gave none")
        server_challenge = reply.header.get("sc")
        if not isinstance(server_challenge, bytes) or not auth.check_proof(
                auth.proof(ticket[1], "osd", client_challenge, server_challenge),
                reply.header.get("proof")):
            raise refused(f"permission denied: {connection.addr} could not open our ticket "
                          "(not an OSD of this cluster)")
        connection.secure(*auth.session_keys(ticket[1], client_challenge, server_challenge))
        connection.session = {"ticket": True}
