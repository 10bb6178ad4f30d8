"""Identities, keyrings, capabilities, tickets and frame MACs (pure: no I/O but keyring files).

The shape of cephx, simpler where simpler is as safe (issue 16):

- Every entity (`client.NAME`, `osd.N`, `mon.`) has a 32-byte secret. Monitors keep them all
  (replicated through Raft); a keyring file holds one entity's (mode 0600).
- **Monitor handshake** (one round trip): the client sends its entity and a fresh challenge
  `cc`; the monitor answers a fresh challenge `sc` and `proof(K, "mon", entity, cc, sc)`, which
  only a holder of the entity's secret K can make, so the client knows the monitor is real.
  Both then derive the session's two MAC keys from K, cc and sc. The client proves it holds K
  by the MAC of its next frame: every frame after the handshake carries one, so a peer without
  K can send nothing the monitor accepts. No secret crosses the wire.
- **Tickets** let OSDs check clients without asking a monitor: the monitor seals
  `{entity, caps, expires, generation, nonce}` with the service secret of that generation (which
  every OSD and monitor holds; the leader makes a new one every hour and keeps three) and gives
  the client the ticket and its session key `proof(S, "ticket-key", body)`, wrapped with the
  client's session key. The client shows the ticket and a challenge to an OSD, which recomputes
  the ticket key, answers as the monitor does, and both derive MAC keys from it. A ticket expires
  (`auth.ticket_ttl_s`); a client gets a new one before, so a revoked entity is refused within
  one ticket lifetime.
- **Frame MACs**: keyed BLAKE2b (16 bytes) over the frame's fixed prefix (which holds the
  payload's crc32c: the payload is not hashed again) and msgpack header, with the per-direction
  frame counter as its salt: a frame cannot be forged, replayed, reordered or moved into another
  session. Keyed BLAKE2 is a MAC by design (no HMAC construction needed); for a frame header it
  takes 0.9 us here against 2.4 us for HMAC-SHA256, and a small write makes about a dozen
  frames across the cluster.

Proofs use HMAC-SHA256 (Python's `hmac.digest`, OpenSSL).
"""

import base64
import configparser
import dataclasses
import functools
import hashlib
import hmac
import ipaddress
import os
import re
import struct

import msgpack

from cairn.common.frame import MAC_BYTES
from cairn.common.wire import native_codec

SECRET_BYTES = 32
CHALLENGE_BYTES = 16
# Service secrets: a new generation every hour, three kept, so a ticket sealed just before a
# rotation stays valid for its whole lifetime (tickets live at most TICKET_TTL_S_MAX).
SERVICE_KEY_ROTATE_S = 3600
SERVICE_KEYS_KEPT = 3
# A new service key seals tickets only once it is this old: OSDs fetch the keys every
# SERVICE_KEYS_REFRESH_S, so by then every OSD holds it.
SERVICE_KEY_GRACE_S = 60.0
SERVICE_KEYS_REFRESH_S = 20.0
assert SERVICE_KEYS_REFRESH_S * 2 < SERVICE_KEY_GRACE_S
TICKET_TTL_S_DEFAULT = 600
TICKET_TTL_S_MAX = SERVICE_KEY_ROTATE_S
assert TICKET_TTL_S_MAX <= SERVICE_KEY_ROTATE_S * (SERVICE_KEYS_KEPT - 1)
ENTITY_BYTES_MAX = 64
CAPS_BYTES_MAX = 4096

ENTITY_RE = re.compile(r"^(client\.[A-Za-z0-9_.@-]{1,56}|osd\.[0-9]{1,7}|mon\.)$")


class AuthError(Exception):
    """Bad credentials, a bad keyring or bad caps: the message says which."""


def check_entity(entity):
    if not isinstance(entity, str) or not ENTITY_RE.match(entity):
        raise AuthError(f"entity must be client.NAME, osd.N or mon. (was {entity!r})")
    return entity


def new_secret():
    return os.urandom(SECRET_BYTES)


def encode_secret(secret):
    return base64.b64encode(secret).decode()


def decode_secret(text):
    try:
        secret = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise AuthError("a key must be base64") from None
    if len(secret) != SECRET_BYTES:
        raise AuthError(f"a key is {SECRET_BYTES} bytes (this one is {len(secret)})")
    return secret


# -- keyring files ---------------------------------------------------------------------------------

def keyring_text(entries):
    """{entity: (secret, [caps strings])} as a keyring file's text."""
    lines = []
    for entity, (secret, caps) in entries.items():
        lines.append(f"[{check_entity(entity)}]")
        lines.append(f"\tkey = {encode_secret(secret)}")
        if caps:
            lines.append(f"\tcaps = {'; '.join(caps)}")
    return "\n".join(lines) + "\n"


def write_keyring(path, entries):
    """Write {entity: (secret, [caps strings])} as a keyring file, mode 0600 from its creation."""
    text = keyring_text(entries)
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def read_keyring(path, with_caps=False):
    """{entity: secret} from a keyring file ({entity: (secret, [caps])} `with_caps`);
    AuthError names what is wrong."""
    try:
        with open(path) as handle:
            text = handle.read(1 << 20)
    except OSError as exc:
        raise AuthError(f"cannot read keyring {path}: {exc.strerror or exc}") from None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text, source=path)
    except configparser.Error as exc:
        raise AuthError(f"{path} is not a keyring: {str(exc).splitlines()[0]}") from None
    found = {}
    for section in parser.sections():
        entity = check_entity(section)
        if not parser.has_option(section, "key"):
            raise AuthError(f"{path}: [{section}] has no key")
        secret = decode_secret(parser.get(section, "key").strip())
        if with_caps:
            caps = [part.strip() for part in parser.get(section, "caps", fallback="").split(";")
                    if part.strip()]
            Caps.parse(caps)
            found[entity] = (secret, caps)
        else:
            found[entity] = secret
    if not found:
        raise AuthError(f"{path} holds no keys")
    return found


# -- capabilities ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Grant:
    kind: str                   # mon | osd | admin
    perms: frozenset            # subset of {"r", "w"}
    pool: object = None         # osd grants: a pool name, or None for every pool
    prefix: str = ""            # osd grants: an object-name prefix ("" for every name)

    def text(self):
        if self.kind in ("admin", "s3gw"):
            return self.kind
        words = [f"{self.kind}={''.join(sorted(self.perms))}"]
        if self.pool is not None:
            words.append(f"pool={self.pool}")
        if self.prefix:
            words.append(f"prefix={self.prefix}")
        return " ".join(words)


def parse_cap(text):
    """One `KIND=PERMS [pool=P] [prefix=PATH]` (or `admin`) -> Grant; AuthError says why not."""
    if not isinstance(text, str) or not text.strip() or len(text) > CAPS_BYTES_MAX or \
            ";" in text:
        raise AuthError(f"a cap is text: KIND=PERMS [pool=P] [prefix=PATH] (was {text!r})")
    words = text.split()
    head, sep, perms = words[0].partition("=")
    if head == "admin" and (not sep or perms in ("*", "rw")) and len(words) == 1:
        return Grant("admin", frozenset("rw"))
    if head == "s3gw" and not sep and len(words) == 1:
        return Grant("s3gw", frozenset("rw"))   # an S3 gateway: key lookups, its audit
    if head not in ("mon", "osd") or perms not in ("r", "rw", "wr"):
        raise AuthError(f"cap {text!r}: it starts with mon=r, mon=rw, osd=r, osd=rw or is "
                        "admin or s3gw")
    pool, prefix = None, ""
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if head == "osd" and key == "pool" and sep and value and pool is None:
            pool = value
        elif head == "osd" and key == "prefix" and sep and value and not prefix:
            prefix = value
        else:
            raise AuthError(f"cap {text!r}: {word!r} is not pool=P or prefix=PATH (osd caps "
                            "only, each at most once)")
    return Grant(head, frozenset(perms), pool, prefix)


class Caps:
    """What an entity may do: the union of its grants."""

    def __init__(self, grants=()):
        self.grants = tuple(grants)
        # Asked on every request: worked out once (a Caps is never changed).
        self.admin = any(grant.kind == "admin" for grant in self.grants)
        self.s3_gateway = self.admin or any(grant.kind == "s3gw" for grant in self.grants)

    @classmethod
    def parse(cls, texts):
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise AuthError("caps are a list of texts")
        return cls([parse_cap(text) for text in texts])

    def texts(self):
        return [grant.text() for grant in self.grants]

    def allows_mon(self, perm):
        return self.admin or any(grant.kind == "mon" and perm in grant.perms
                                 for grant in self.grants)

    def allows_object(self, perm, pool, name):
        """`perm` ("r" or "w") on object `name` of pool `pool` (a name)."""
        return self.admin or any(
            grant.kind == "osd" and perm in grant.perms and grant.pool in (None, pool) and
            name.startswith(grant.prefix) for grant in self.grants)

    def list_prefixes(self, pool):
        """The name prefixes whose objects a listing of `pool` may show ([""]: all; []: none)."""
        if self.admin:
            return [""]
        prefixes = sorted({grant.prefix for grant in self.grants if grant.kind == "osd" and
                           "r" in grant.perms and grant.pool in (None, pool)})
        return [""] if "" in prefixes else prefixes

    def describe(self):
        return ", ".join(self.texts()) or "no caps"


def denied(entity, op, missing):
    """The `permission_denied` message: entity, op and the cap it lacks."""
    return f"permission denied: {entity} may not {op} (needs {missing})"


# -- S3 keys (s3/) -----------------------------------------------------------------------------------

S3_ACCESS_KEY_RE = re.compile(r"^[A-Z0-9]{16,128}$")


def new_s3_access_key():
    """A new S3 access key id: 20 upper-case letters and digits, AWS's shape."""
    return "CK" + base64.b32encode(os.urandom(15)).decode()[:18]


def s3_secret_text(secret):
    """The S3 secret key of a 32-byte secret, as S3 clients hold it: 40 base64 characters."""
    return base64.b64encode(secret).decode()[:40]


# -- IP allowlists -----------------------------------------------------------------------------------

def parse_networks(text):
    """'CIDR[,CIDR...]' -> [ip_network]; AuthError names a bad one."""
    networks = []
    for part in str(text).split(","):
        try:
            networks.append(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            raise AuthError(f"{part.strip()!r} is not an address or CIDR range") from None
    return networks


def admits(rules, ip, name):
    """Whether address `ip` lies in every allowlist whose prefix starts `name`."""
    return all(in_networks(ip, networks) for prefix, networks in rules.items()
               if name.startswith(prefix))


def in_networks(ip, networks):
    address = _address(ip)
    return address is not None and any(address in network
                                       for network in _networks(tuple(networks)))


@functools.lru_cache(maxsize=1024)
def _address(ip):
    try:
        address = ipaddress.ip_address(ip)
    except (TypeError, ValueError):
        return None                     # no peer address (a Unix socket): in no allowlist
    return address.ipv4_mapped or address if address.version == 6 else address


@functools.lru_cache(maxsize=256)
def _networks(cidrs):
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


# -- proofs, session keys, wrapping ----------------------------------------------------------------

def proof(key, label, *parts):
    """HMAC-SHA256 of a label and length-prefixed parts (bytes or text)."""
    message = [label.encode()]
    for part in parts:
        data = part.encode() if isinstance(part, str) else bytes(part)
        message.append(struct.pack("<I", len(data)))
        message.append(data)
    return hmac.digest(key, b"".join(message), "sha256")


def session_keys(key, client_challenge, server_challenge):
    """(client-to-server, server-to-client) MAC keys of one connection."""
    return (proof(key, "c2s", client_challenge, server_challenge),
            proof(key, "s2c", client_challenge, server_challenge))


def wrap(key, secret, nonce):
    """`secret` (32 bytes) hidden under `key`: XOR with a pseudo-random pad (HMAC as a PRF over a
    fresh nonce), so it may travel on the wire."""
    pad = proof(key, "wrap", nonce)
    return bytes(a ^ b for a, b in zip(secret, pad, strict=True))


unwrap = wrap


def check_proof(expected, given):
    return isinstance(given, bytes) and hmac.compare_digest(expected, given)


# -- tickets -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ticket:
    entity: str
    caps: Caps
    expires: float
    generation: int
    key: bytes                  # the ticket's session key


def seal_ticket(service_keys, generation, entity, caps_texts, expires, nonce=None):
    """(ticket bytes, ticket key) sealed with service key `generation` ({generation: key})."""
    body = msgpack.packb({"e": entity, "c": list(caps_texts), "x": float(expires),
                          "g": generation, "n": nonce or os.urandom(CHALLENGE_BYTES)})
    secret = service_keys[generation]
    return body + proof(secret, "ticket", body), proof(secret, "ticket-key", body)


def open_ticket(service_keys, blob, now):
    """The Ticket in `blob` if a service key we hold sealed it and it has not expired;
    AuthError otherwise."""
    if not isinstance(blob, bytes) or len(blob) <= 32 or len(blob) > 8192:
        raise AuthError("malformed ticket")
    body, tag = blob[:-32], blob[-32:]
    try:
        fields = msgpack.unpackb(body)
        entity, caps, expires, generation = fields["e"], fields["c"], fields["x"], fields["g"]
    except Exception:           # garbage from the wire: msgpack raises many types
        raise AuthError("malformed ticket") from None
    secret = service_keys.get(generation) if isinstance(generation, int) else None
    if secret is None:
        raise AuthError("ticket sealed with a service key this daemon does not hold "
                        "(expired, or from another cluster)")
    if not check_proof(proof(secret, "ticket", body), tag):
        raise AuthError("ticket seal does not check (forged or damaged)")
    if not isinstance(expires, float) or expires < now:
        raise AuthError("ticket expired; get a new one from the monitors")
    return Ticket(check_entity(entity), Caps.parse(caps), expires, generation,
                  proof(secret, "ticket-key", body))


# -- frame MACs --------------------------------------------------------------------------------------

class FrameMacTwin:
    """One direction's MAC key and frame counter: the reference. What ships is `FrameMac`,
    this in C (common/_wire.pyx; the frame codec computes it without Python objects), the
    same function: keyed BLAKE2b-128, salted with the frame's number."""

    def __init__(self, key):
        self.key = key
        self.count = 0

    def next(self, fixed, header_raw):
        """The MAC of the next frame (fixed: its first 28 bytes, header_raw: its msgpack map)."""
        self.count += 1
        mac = hashlib.blake2b(fixed, key=self.key, salt=self.count.to_bytes(16, "little"),
                              digest_size=MAC_BYTES)
        mac.update(header_raw)
        return mac.digest()


# The shipped MAC is native where every frame passes (common/_wire.pyx), as the frame codec is
# (common/wire.py); CAIRN_NO_EXTENSIONS=1 selects the twin.
_native = native_codec()
FrameMac = FrameMacTwin if _native is None else _native.FrameMac
