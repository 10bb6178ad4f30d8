"""The operations console: a web page every monitor serves (`cairn-mon run --console-port`).

Theory of operation: the page (console_static/) is static; it asks this module's JSON API
for what it shows and posts what it changes. Every API call is a monitor request made on the
signed-in user's behalf through `Monitor.handle`, the path the CLI's requests take: the same
caps check (a `mon=r` key sees everything and changes nothing: the server refuses its
changes, not just the page), the same forwarding of changes to the leader, the same audit
log. So the console has no powers of its own and no second implementation of any command.

Signing in: `cairn console` asks a monitor (`console_login`, on the caller's authenticated
session) for a one-time link, good for LOGIN_TOKEN_TTL_S, which signs the browser in as that
entity with its caps; or the login form takes an entity and its key (the keyring's base64
`key`). Either way the browser gets a random session cookie (HttpOnly, SameSite=Strict) that
this monitor keeps for SESSION_TTL_S; a change also needs the session's CSRF token in the
`X-Cairn-Csrf` header and, when the browser sends one, an `Origin` naming this console, so
another site cannot post on a signed-in user's behalf. Sessions live in this monitor's
memory: after it restarts, or at another monitor, sign in again.

Everything the page shows from the cluster goes in as text (the script never builds HTML
from data), so a pool named `<b>x</b>` shows as those characters.
"""

import base64
import hmac
import json
import logging
import os
import pathlib
import secrets
import time

from aiohttp import web

from cairn.common import audit, auth, config
from cairn.common.codes import Code
from cairn.common.frame import Frame, Kind
from cairn.common.messenger import RequestFailed

log = logging.getLogger("cairn.console")

COOKIE = "cairn_console"
SESSION_TTL_S = 8 * 3600
LOGIN_TOKEN_TTL_S = 300
SESSIONS_MAX = 1024
TOKENS_MAX = 256
BODY_BYTES_MAX = 64 * 1024
STATIC = pathlib.Path(__file__).with_name("console_static")
STATIC_FILES = {"app.js": "application/javascript", "style.css": "text/css"}

# What the page may ask (GET /api/OP, with the query's fields) and change (POST /api/OP, a
# JSON object): monitor requests, checked and answered as any client's.
READS = frozenset({"status", "health", "health_history", "df", "osd_tree", "osd_perf",
                   "pool_ls", "config_get", "throughput", "auth_ls", "audit_read"})
CHANGES = frozenset({"pool_create", "pool_delete", "pool_set_quota", "pool_allow_from",
                     "pool_fast_read", "config_set", "osd_mark", "auth_add", "auth_caps",
                     "auth_rm", "alert_test"})


class ConsolePeer:
    """The signed-in user as the monitor's request handlers see a connection's peer."""

    def __init__(self, entity, caps, addr):
        self.entity = entity
        self.caps = caps                    # auth.Caps; None: the cluster runs without auth
        self.addr = addr
        self.expires = None
        self.state = {}


class Session:
    __slots__ = ("entity", "caps", "csrf", "expires")

    def __init__(self, entity, caps, now):
        self.entity, self.caps = entity, caps
        self.csrf = secrets.token_urlsafe(24)
        self.expires = now + SESSION_TTL_S


class Console:
    def __init__(self, monitor):
        self.monitor = monitor
        self.url = None
        self._runner = None
        self._sessions = {}                 # cookie value -> Session
        self._tokens = {}                   # one-time login token -> (entity, caps, expires)
        self._secure = False                # served over HTTPS: cookies are Secure

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self, ip, port):
        """Serve on ip:port (0: any free port); the console's URL."""
        app = web.Application(client_max_size=BODY_BYTES_MAX)
        app.router.add_get("/", self._page)
        app.router.add_get("/login", self._login_link)
        app.router.add_post("/login", self._login_form)
        app.router.add_post("/logout", self._logout)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/{op}", self._read)
        app.router.add_post("/api/{op}", self._change)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A cluster that speaks TLS serves its console over HTTPS with the same certificate.
        tls = self.monitor.tls_server
        await web.TCPSite(self._runner, ip, port, ssl_context=tls).start()
        self._secure = tls is not None
        self.url = f"{'https' if tls else 'http'}://{ip}:{self._runner.addresses[0][1]}/"
        return self.url

    async def stop(self):
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- signing in -------------------------------------------------------------------------------

    def login_token(self, entity, caps):
        """A one-time token that signs a browser in as `entity` (`console_login`)."""
        now = time.monotonic()
        self._expire(now)
        if len(self._tokens) >= TOKENS_MAX:
            raise RequestFailed(Code.BUSY, f"{TOKENS_MAX} console login links are waiting to "
                                "be used; try again in a few minutes")
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (entity, caps, now + LOGIN_TOKEN_TTL_S)
        return token

    def _expire(self, now):
        for table in (self._sessions, self._tokens):
            for key in [key for key, value in table.items()
                        if (value.expires if isinstance(value, Session) else value[2]) <= now]:
                del table[key]

    def _signed_in(self, entity, caps):
        now = time.monotonic()
        self._expire(now)
        if len(self._sessions) >= SESSIONS_MAX:       # the oldest makes room
            del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].expires)]
        cookie = secrets.token_urlsafe(32)
        self._sessions[cookie] = Session(entity, caps, now)
        response = web.HTTPSeeOther("/")
        response.set_cookie(COOKIE, cookie, max_age=SESSION_TTL_S, httponly=True,
                            samesite="Strict", path="/", secure=self._secure)
        return response

    async def _login_link(self, request):
        token = request.query.get("token", "")
        found = self._tokens.pop(token, None)
        if found is None or found[2] <= time.monotonic():
            return self._login_page("That sign-in link is used or expired: run `cairn "
                                    "console` for a new one, or sign in with a key.", 403)
        return self._signed_in(found[0], found[1])

    async def _login_form(self, request):
        form = await request.post()
        entity, key = str(form.get("entity", "")).strip(), str(form.get("key", "")).strip()
        store = self.monitor.store
        if store.auth_mode == "none":
            return self._signed_in(entity or "client.admin", None)
        entry = store.auth.get(entity)
        try:
            given = base64.b64decode(key, validate=True)
        except ValueError:
            given = b""
        if entry is None or entity == "mon." or not hmac.compare_digest(given, entry[0]):
            log.warning("console: refused a sign-in as %r from %s", entity, request.remote)
            self.monitor.queue_audit(audit.event(entity[:64] or None, request.remote,
                                                 "console_login", entity[:64],
                                                 Code.PERMISSION_DENIED))
            return self._login_page("Unknown entity or wrong key.", 403)
        return self._signed_in(entity, auth.Caps.parse(entry[1]))

    async def _logout(self, request):
        session = self._session(request)
        if session is not None:
            self._check_origin(request)
            self._sessions.pop(request.cookies.get(COOKIE), None)
        response = web.HTTPSeeOther("/")
        response.del_cookie(COOKIE, path="/")
        return response

    def _session(self, request):
        session = self._sessions.get(request.cookies.get(COOKIE, ""))
        if session is None or session.expires <= time.monotonic():
            return None
        return session

    # -- pages --------------------------------------------------------------------------------

    async def _page(self, request):
        session = self._session(request)
        if session is None:
            return self._login_page(None, 200)
        page = (STATIC / "index.html").read_text()
        page = page.replace("{{csrf}}", session.csrf).replace(
            "{{entity}}", _escape(session.entity or ""))
        return web.Response(text=page, content_type="text/html", headers=_NO_STORE)

    def _login_page(self, message, status):
        page = (STATIC / "login.html").read_text().replace(
            "{{message}}", f'<p class="error">{_escape(message)}</p>' if message else "")
        return web.Response(text=page, content_type="text/html", status=status,
                            headers=_NO_STORE)

    async def _static(self, request):
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_FILES[name])

    # -- the API ------------------------------------------------------------------------------

    async def _read(self, request):
        op = request.match_info["op"]
        session = self._session(request)
        if session is None:
            return _json({"error": Code.PERMISSION_DENIED, "message": "sign in first"}, 401)
        if op not in READS:
            return _json({"error": Code.UNKNOWN_OP, "message": f"no such view {op!r}"}, 404)
        header = {key: int(value) if value.isdigit() else value
                  for key, value in request.query.items() if key not in _RESERVED}
        return await self._ask(request, session, {**header, "op": op})

    async def _change(self, request):
        op = request.match_info["op"]
        session = self._session(request)
        if session is None:
            return _json({"error": Code.PERMISSION_DENIED, "message": "sign in first"}, 401)
        if not hmac.compare_digest(request.headers.get("X-Cairn-Csrf", ""), session.csrf):
            return _json({"error": Code.PERMISSION_DENIED, "message": "missing or wrong "
                          "X-Cairn-Csrf header (reload the page)"}, 403)
        try:
            self._check_origin(request)
        except web.HTTPForbidden as exc:
            return _json({"error": Code.PERMISSION_DENIED, "message": exc.text}, 403)
        if op not in CHANGES:
            return _json({"error": Code.UNKNOWN_OP, "message": f"no such change {op!r}"}, 404)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json({"error": Code.INVALID, "message": "the body must be a JSON object"},
                         400)
        return await self._ask(request, session, {**{key: value for key, value in body.items()
                                                     if key not in _RESERVED}, "op": op})

    def _check_origin(self, request):
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(text=f"a change from {origin} is not from this console")

    async def _ask(self, request, session, header):
        peer = ConsolePeer(session.entity, session.caps, request.remote)
        if header["op"] == "auth_add":          # the new key comes back wrapped under this
            peer.state["wrap_key"] = os.urandom(auth.SECRET_BYTES)
        try:
            reply, _ = await self.monitor.handle(peer, Frame(Kind.REQUEST, 0, header, b""))
        except RequestFailed as exc:
            status = 403 if exc.code == Code.PERMISSION_DENIED else \
                404 if exc.code in (Code.NOT_FOUND, Code.UNKNOWN_OP) else \
                503 if exc.code == Code.NO_QUORUM else 400
            return _json({"error": str(exc.code), "message": exc.message}, status)
        if header["op"] == "auth_add" and "key" in reply:
            secret = auth.unwrap(peer.state["wrap_key"], bytes(reply["key"]),
                                 bytes(reply["nonce"]))
            reply = {"entity": reply["entity"], "caps": reply["caps"],
                     "keyring": auth.keyring_text({reply["entity"]: (secret, reply["caps"])})}
        return _json(reply, 200)


_NO_STORE = {"Cache-Control": "no-store"}
# Header fields a request's query or body may not set: the op is the URL's, and these are the
# monitors' own (forwarding, retried changes).
_RESERVED = frozenset({"op", "forwarded", "rid"})


def _escape(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;"))


def _json(value, status):
    return web.Response(text=json.dumps(value, default=_plain), status=status,
                        content_type="application/json", headers=_NO_STORE)


def _plain(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# -- monitor requests (bound into Monitor's request table) ------------------------------------

async def console_login(monitor, peer, header):
    """A one-time sign-in link to this monitor's console for the caller's own entity."""
    if monitor.console is None or monitor.console.url is None:
        raise RequestFailed(Code.UNAVAILABLE, f"{monitor.name} serves no console (start it "
                            "with --console-port)")
    entity = peer.entity if peer is not None and peer.entity else "client.admin"
    caps = peer.caps if peer is not None else None
    token = monitor.console.login_token(entity, caps)
    return {"url": monitor.console.url, "login_url": f"{monitor.console.url}login?token={token}",
            "entity": entity, "expires_s": LOGIN_TOKEN_TTL_S}, b""


async def alert_test(monitor, peer, header):
    """POST a test event to one of the configured webhooks (alert.webhooks), now."""
    url = header.get("url")
    if url not in config.value(monitor.map.config, "alert.webhooks"):
        raise RequestFailed(Code.NOT_FOUND, f"{url!r} is not one of alert.webhooks")
    event = {"cluster": monitor.map.fsid, "check": "TEST", "severity": "HEALTH_OK",
             "summary": f"a test alert sent from {monitor.name} on request",
             "detail": [], "state": "test", "time": round(time.time(), 3)}
    delivered, outcome = await monitor._alerter.test(url, event)
    if not delivered:
        raise RequestFailed(Code.UNAVAILABLE, f"{url}: {outcome}")
    return {"url": url, "outcome": outcome}, b""


async def throughput(monitor, peer, header):
    """The last hour's cluster throughput samples (mon/throughput.py), oldest first."""
    return {"samples": list(monitor._throughput.samples)}, b""


REQUESTS = {"console_login": console_login, "throughput": throughput, "alert_test": alert_test}
