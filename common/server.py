"""The server's side of cairn's messaging: `serve(addr, handler)`, its connections and their
budgets (the client's side, and what both share, is common/messenger.py).

Theory of operation: `serve` accepts connections and gives each a `_ServerConnection`, whose
frame receiver (common/wire.py) cuts frames from the socket without copies. A guard runs the
handshake first (common/sessions.py); until it is done a connection may send only small frames.
Every REQUEST is answered by `await handler(peer, frame)`, which returns `(header, payload)` or
raises `RequestFailed` (sent back as an ERROR frame with its code), except a one-way request
(request id 0), whose answer is dropped; a one-way `cancel` {of: id} stops the task answering
request `of` as a lost connection would (a client's hedged read that lost its race);
`fast(connection, received)`
may take a request first and answer it from callbacks (the OSD's gets and puts). Requests in
flight per connection, request bytes held and reply bytes built are bounded per connection and
per server, so a peer that floods, stalls or never reads its replies costs only its own share;
idle, slow (slowloris) and stalled connections are swept. Malformed input is answered with one
`protocol` ERROR frame and the connection is closed; a handler's AssertionError (a broken
invariant of this daemon, never a peer's input: docs/STYLE.md 2.10) ends the process.
"""

import asyncio
import collections
import contextvars
import logging
import os
import time
import weakref

from cairn.common import auth, frame, wire
from cairn.common.codes import Code
from cairn.common.frame import Kind
from cairn.common.messenger import Outbox, RequestFailed, parse_addr

log = logging.getLogger("cairn.messenger")

# Requests a server runs at once for one connection; more wait in the socket (TCP backpressure).
# 64 covers a client's 16-64 ops in flight, as Ceph's ms_dispatch_throttle bounds bytes.
SERVER_REQUESTS_PER_CONNECTION_MAX = 64
# Bytes of request payloads a server holds received and not yet answered, all connections
# together (as Ceph's osd_client_message_size_cap, 500 MiB) and one connection alone (two
# largest frames: a peer cannot take the whole server's share). Over either, reading from the
# peer that wants more stops until bytes are given back (common/wire.py).
SERVER_REQUEST_BYTES_MAX = 512 << 20
CONNECTION_REQUEST_BYTES_MAX = 2 * frame.PAYLOAD_BYTES_MAX
assert SERVER_REQUEST_BYTES_MAX >= CONNECTION_REQUEST_BYTES_MAX
# Bytes of large replies (reads) a server builds and holds until the transport has sent them,
# per connection and all together: a handler reserves them (`reserve_reply`) before it reads
# what it will send, so a peer that does not read its replies stalls its own reads, not the
# daemon's memory. A waiting reservation looks again every REPLY_RECHECK_S (sent bytes free
# reservations, and a transport says no more than how much it still holds).
SERVER_REPLY_BYTES_MAX = 1 << 30
CONNECTION_REPLY_BYTES_MAX = 2 * frame.PAYLOAD_BYTES_MAX
REPLY_RECHECK_S = 0.005
# Connections one server keeps at once; more are answered `busy` and closed. A cluster of a
# few hundred OSDs, each with a connection or two per peer, plus clients, fits.
SERVER_CONNECTIONS_MAX = 4096
# Of those, connections that have not finished their handshake (where one is required): beyond
# this many, a new one is answered `busy` (a flood of silent sockets cannot crowd out the keyed).
SERVER_UNAUTHENTICATED_MAX = int(os.environ.get("CAIRN_UNAUTHENTICATED_MAX", 1024))
# A connection that sends nothing, is sent nothing and has no request in flight for this long
# is closed (as Ceph's ms_connection_idle_timeout); clients reconnect when they next need it.
IDLE_S = float(os.environ.get("CAIRN_IDLE_S", 900.0))
# A peer holding part of a frame that completes no frame for this long is dropped (slowloris):
# a 64 MiB frame arrives within it at 2.3 MB/s.
# A peer that leaves its replies unread this long (our write buffer stays over its high-water
# mark) is dropped, freeing what they hold. While replies wait, no new request is read from it.
# (Both can be shortened through the environment, for the tests of these very drops.)
FRAME_DEADLINE_S = float(os.environ.get("CAIRN_FRAME_DEADLINE_S", 30.0))
REPLY_STALL_S = float(os.environ.get("CAIRN_REPLY_STALL_S", 60.0))
SWEEP_INTERVAL_S = 1.0
# Before its handshake a connection may send only small frames (a handshake is a few hundred
# bytes) and must finish it within HANDSHAKE_S.
PREAUTH_HEADER_BYTES_MAX = 16 * 1024
HANDSHAKE_S = float(os.environ.get("CAIRN_HANDSHAKE_S", 10.0))


class Peer:
    """The server's side of one accepted connection."""

    def __init__(self, transport):
        self._transport = transport
        self._outbox = Outbox(transport)
        self.loop = asyncio.get_running_loop()
        peername = transport.get_extra_info("peername")
        self.addr = f"{peername[0]}:{peername[1]}" if peername else "?"
        self.ip = peername[0] if peername else None
        self.closed = False
        self.state = {}                     # handlers keep per-connection facts here
        # Who is at the other end, once a handshake said so (common/sessions.py): the entity
        # name, its auth.Caps, when its ticket expires (time.time(); None: no end). Without a
        # guard (auth none) all three stay None and handlers check nothing.
        self.entity = None
        self.caps = None
        self.expires = None
        self.send_mac = None
        self.sent_total = 0                 # bytes of frames handed to the transport

    def push(self, header, payload=b""):
        """Queue a PUSH frame (no wait; a peer that stops reading is dropped by the server's
        write-buffer limit)."""
        self.send(Kind.PUSH, 0, header, payload)
        if not self.closed and self._outbox.unsent_bytes() > frame.PAYLOAD_BYTES_MAX:
            log.warning("dropping %s: it does not read its pushes", self.addr)
            self.close()

    def send(self, kind, request_id, header, payload=b"", payload_crc=None):
        """Queue one frame; a connection the peer already closed just drops it. `payload_crc`:
        the payload's crc32c where the caller has it (`frame.encode`)."""
        if self.closed or self._transport.is_closing():
            self.closed = True
            return
        buffers = wire.encode(kind, request_id, header, payload, self.send_mac, payload_crc)
        # The frame's size without a memoryview per buffer (its head is bytes; a get's reply
        # is a memoryview or bytes).
        nbytes = len(buffers[0]) + (len(payload) if type(payload) is bytes else
                                    payload.nbytes if type(payload) is memoryview else
                                    sum(memoryview(piece).nbytes for piece in buffers[1:]))
        self.sent_total += nbytes
        self._outbox.add(buffers, nbytes)

    def unsent_bytes(self):
        """Bytes we queued that the transport has not sent yet."""
        return 0 if self.closed else self._outbox.unsent_bytes()

    def close(self):
        if not self.closed:
            self.closed = True
            self._outbox.flush()
            self._transport.close()

    def abort(self):
        """Drop the connection now, with whatever is still queued for the peer."""
        self.closed = True
        self._transport.abort()


class _ServerConnection:
    """Frames in, handler tasks out, for one accepted connection. Reading pauses while
    SERVER_REQUESTS_PER_CONNECTION_MAX requests are being answered, while the requests' bytes
    are over a budget, and while the peer leaves our replies unread (TCP backpressure)."""

    def __init__(self, server, handler, on_close):
        self._server = server
        self._handler = handler
        self._on_close = on_close
        self.budget = wire.ByteBudget(CONNECTION_REQUEST_BYTES_MAX)
        self._limits = wire.Limits(budgets=(self.budget, server.budget))
        self.reply_budget = wire.ByteBudget(CONNECTION_REPLY_BYTES_MAX)
        self._unsent = collections.deque()  # [peer.sent_total after a reply, bytes reserved]
        guarded = server.guard is not None and server.guard.required
        self.protocol = wire.FrameProtocol(
            self._on_frame, self._on_error, self._on_lost,
            wire.Limits(PREAUTH_HEADER_BYTES_MAX, 0, self._limits.budgets) if guarded
            else self._limits, self._writing)
        self.opened = time.monotonic()
        self.authenticated = not guarded
        self.protocol.connection_made = self._connection_made
        self.peer = None
        self._tasks = set()
        self._by_id = {}                    # request id -> the task answering it (`_cancel`)
        self._to_finish = set()             # of those, the ones a lost connection does not cancel
        self._fast = 0                      # requests `fast` took, not yet answered
        self.partial_since = None           # monotonic time: a frame is held unfinished since
        self.stalled_since = None           # monotonic time: our replies wait unread since
        self.active_at = self.opened        # monotonic time: last frame in or out, or a request
        self._sent_seen = 0

    def _connection_made(self, transport):
        self.protocol.transport = transport
        self.peer = Peer(transport)
        if len(self._server.connections) >= SERVER_CONNECTIONS_MAX:
            log.warning("refusing %s: %d connections already", self.peer.addr,
                        len(self._server.connections))
            self.peer.send(Kind.ERROR, 0, {"error": "busy", "message": "the daemon has "
                                           f"{SERVER_CONNECTIONS_MAX} connections; retry later"})
            self.peer.close()
            return
        if not self.authenticated:
            if self._server.unauthenticated >= SERVER_UNAUTHENTICATED_MAX:
                log.warning("refusing %s: %d connections without a handshake already",
                            self.peer.addr, self._server.unauthenticated)
                self.peer.send(Kind.ERROR, 0, {"error": "busy", "message": "the daemon has "
                                               f"{SERVER_UNAUTHENTICATED_MAX} connections "
                                               "without a handshake; retry later"})
                self.peer.close()
                return
            self._server.unauthenticated += 1
        self._server.connections.add(self)

    def _on_frame(self, received):
        self.partial_since = None
        self.active_at = time.monotonic()
        if self.peer.closed:
            self.protocol.receiver.release(received)
            return
        guard = self._server.guard
        if guard is not None and received.header.get("op") in guard.ops:
            self.protocol.receiver.release(received)
            self._handshake(guard, received)
            return
        if not self.authenticated:
            self.protocol.receiver.release(received)
            self._refuse(received, "permission_denied", "permission denied: this daemon "
                         "requires authentication and the connection has none (give a key: "
                         "cairn --name client.NAME --keyring FILE, or $CAIRN_KEYRING)")
            return
        if self.peer.expires is not None and time.time() > self.peer.expires:
            self.protocol.receiver.release(received)
            self._refuse(received, "auth_expired", f"{self.peer.entity}'s ticket expired; "
                         "reconnect with a new one")
            return
        if received.kind != Kind.REQUEST:
            self.protocol.receiver.release(received)
            self.peer.send(Kind.ERROR, received.request_id,
                           {"error": "protocol",
                            "message": f"a server expects requests, not {received.kind.name}"})
            self.peer.close()
            return
        if received.request_id == 0:        # one-way: a cancel, or a request with no reply
            if received.header.get("op") == "cancel":
                self.protocol.receiver.release(received)
                self._cancel(received.header.get("of"))
            else:
                self._start_task(received)
            return
        fast = self._server.fast
        if fast is not None:
            self._fast += 1                 # counted first: `fast` may answer before it returns
            if fast(self, received):
                if len(self._tasks) + self._fast >= SERVER_REQUESTS_PER_CONNECTION_MAX:
                    self.protocol.pause_reading("requests")
                return
            self._fast -= 1
        self._start_task(received)

    def _start_task(self, received):
        # Reply bytes reserved, and the task (see _answer): a weak reference, since the task's
        # context holds this slot; a strong one made a cycle that kept every received payload
        # alive until the cyclic collector ran (OSD RSS 850 MiB after 4 MiB writes, not 180).
        slot = [0, None]
        task = self.peer.loop.create_task(_answer(self, self._handler, received, slot))
        slot[1] = weakref.ref(task)
        self._tasks.add(task)
        if received.request_id:
            self._by_id[received.request_id] = task
        task.add_done_callback(lambda done: self._done(done, received))
        if len(self._tasks) + self._fast >= SERVER_REQUESTS_PER_CONNECTION_MAX:
            self.protocol.pause_reading("requests")

    # -- requests answered without a task (serve's `fast`) ------------------------------------

    def reserve_now(self, nbytes):
        """Take `nbytes` of the reply budgets if they fit now (a fast request's
        `reserve_reply`, which never waits); False if they do not."""
        budgets = (self.reply_budget, self._server.reply_budget)
        if not (budgets[0].fits(nbytes) and budgets[1].fits(nbytes)):
            return False
        budgets[0].force(nbytes)
        budgets[1].force(nbytes)
        return True

    def answer_fast(self, received, header, payload, reserved, payload_crc=None):
        """Send the REPLY of a request `fast` took, which reserved `reserved` reply bytes
        (`payload_crc`: the payload's crc32c where the caller has it, `frame.encode`)."""
        self.peer.send(Kind.REPLY, received.request_id, header, payload, payload_crc)
        self.replied(reserved)
        self._fast_done(received)

    def fail_fast(self, received, exc):
        """Answer a request `fast` took, whose work raised `exc`, as a handler's failure is
        answered (RequestFailed: its error; a broken invariant stops the daemon; anything
        else: `internal`, logged)."""
        _send_failure(self.peer, received, exc)
        self._fast_done(received)

    def fall_back(self, received, reserved):
        """A request `fast` took goes the usual way after all (a task running the handler):
        what it reserved is given back first."""
        if reserved:
            self._give_replies(reserved)
        self._fast -= 1
        if self.peer.closed:
            self.protocol.receiver.release(received)
            return
        self._start_task(received)

    def _fast_done(self, received):
        self._fast -= 1
        self.protocol.receiver.release(received)
        if len(self._tasks) + self._fast < SERVER_REQUESTS_PER_CONNECTION_MAX // 2 and \
                not self.peer.closed:
            self.protocol.resume_reading("requests")

    # -- reply reservations ----------------------------------------------------------------

    async def reserve_reply(self, nbytes):
        """Wait until `nbytes` fit this connection's and the server's reply budgets; take them."""
        budgets = (self.reply_budget, self._server.reply_budget)
        if budgets[0].fits(nbytes) and budgets[1].fits(nbytes):
            budgets[0].force(nbytes)        # room already (the common case): no sweep first
            budgets[1].force(nbytes)
            return
        loop = asyncio.get_running_loop()
        while True:
            self._server.release_sent()
            if all(budget.fits(nbytes) for budget in budgets):
                for budget in budgets:
                    budget.force(nbytes)
                return
            waiter = loop.create_future()

            def wake():
                if not waiter.done():
                    waiter.set_result(None)
            for budget in budgets:
                if not budget.fits(nbytes):
                    budget.wait(wake)
            recheck = loop.call_later(REPLY_RECHECK_S, wake)
            try:
                await waiter
            finally:
                recheck.cancel()

    def replied(self, reserved):
        """A reply that reserved `reserved` bytes was queued (or failed): hold them until the
        transport has sent it."""
        if reserved:
            if self.peer.closed:
                self._give_replies(reserved)
                return
            self._unsent.append((self.peer.sent_total, reserved))
            self._server.holding.add(self)
        self.release_sent()

    def release_sent(self):
        """Give back what replies the transport has sent since reserved."""
        if not self._unsent:
            return
        sent = self.peer.sent_total - self.peer.unsent_bytes()
        given = 0
        while self._unsent and (self.peer.closed or self._unsent[0][0] <= sent):
            given += self._unsent.popleft()[1]
        if not self._unsent:
            self._server.holding.discard(self)
        if given:
            self._give_replies(given)

    def _give_replies(self, nbytes):
        self.reply_budget.give(nbytes)
        self._server.reply_budget.give(nbytes)

    def _refuse(self, received, code, message):
        self.peer.send(Kind.ERROR, received.request_id, {"error": code, "message": message})
        self.peer.close()

    def _handshake(self, guard, received):
        """Answer a handshake op (in order: the next frame may already be MACed)."""
        if not guard.required:
            self.peer.send(Kind.REPLY, received.request_id, {"auth": "none"})
            return
        if self.authenticated or received.kind != Kind.REQUEST:
            self._refuse(received, "protocol", "one handshake per connection")
            return
        try:
            reply, send_key, receive_key, entity, caps, expires = \
                guard.handshake(self.peer, received.header)
        except RequestFailed as exc:
            log.info("refused %s: %s", self.peer.addr, exc.message)
            self._refuse(received, exc.code, exc.message)
            return
        self.peer.send(Kind.REPLY, received.request_id, reply)
        self.peer.send_mac = auth.FrameMac(send_key)
        self.protocol.receiver.mac = auth.FrameMac(receive_key)
        self.protocol.receiver.limits = self._limits
        self.peer.entity, self.peer.caps, self.peer.expires = entity, caps, expires
        self.authenticated = True
        self._server.unauthenticated -= 1

    def _cancel(self, request_id):
        """The peer no longer wants the answer to `request_id`: the task answering it stops,
        as a lost connection stops it (not one that must finish, `finish_even_if_lost`), and
        sends nothing. One answered already, or taken by `fast` (answered from a callback
        within a device read), is left to finish."""
        task = self._by_id.get(request_id) if type(request_id) is int else None
        if task is not None and task not in self._to_finish:
            task.cancel()
            self._server.cancelled_total += 1

    def _done(self, task, received):
        if self._by_id.get(received.request_id) is task:
            del self._by_id[received.request_id]
        self._tasks.discard(task)
        self._to_finish.discard(task)
        self.protocol.receiver.release(received)
        if len(self._tasks) + self._fast < SERVER_REQUESTS_PER_CONNECTION_MAX // 2 and \
                not self.peer.closed:
            self.protocol.resume_reading("requests")

    def _writing(self, paused):
        self.release_sent()
        if paused:
            self.stalled_since = time.monotonic()
            self.protocol.pause_reading("replies")
        else:
            self.stalled_since = None
            if not self.peer.closed:
                self.protocol.resume_reading("replies")

    def sweep(self, now):
        """Drop the peer if it holds an unfinished frame or leaves replies unread too long."""
        receiver = self.protocol.receiver
        if receiver.frame_started and (not receiver.held or receiver.waiting_for_budget):
            if self.partial_since is None:
                self.partial_since = now
        else:
            self.partial_since = None
        if self._tasks or self._fast or self.peer.sent_total != self._sent_seen:
            self.active_at, self._sent_seen = now, self.peer.sent_total
        reason = None
        if not self.authenticated and now - self.opened > HANDSHAKE_S:
            reason = f"no handshake in {HANDSHAKE_S:g} s"
        elif self.partial_since is not None and now - self.partial_since > FRAME_DEADLINE_S:
            reason = f"no frame completed in {FRAME_DEADLINE_S:g} s"
        elif self.stalled_since is not None and now - self.stalled_since > REPLY_STALL_S:
            reason = f"our replies left unread for {REPLY_STALL_S:g} s"
        elif now - self.active_at > IDLE_S:
            reason = f"idle for {IDLE_S:g} s"
        if reason is not None:
            log.warning("dropping %s: %s", self.peer.addr, reason)
            self.peer.abort()

    def _on_error(self, exc):
        log.warning("bad frame from %s: %s; dropping the connection", self.peer.addr, exc)
        self.peer.send(Kind.ERROR, 0, {"error": "protocol", "message": str(exc)})
        self.peer.close()

    def _on_lost(self, exc):
        if self in self._server.connections and not self.authenticated:
            self._server.unauthenticated -= 1
        self._server.connections.discard(self)
        self.protocol.receiver.close()
        for task in list(self._tasks - self._to_finish):
            task.cancel()
        if self.peer is not None:
            self.peer.closed = True
            self.release_sent()
            if self._on_close is not None:
                self._on_close(self.peer)


class _Server:
    """What one listening socket's connections share: the request-bytes budget, the
    connection count, and a sweeper that drops stalled peers."""

    def __init__(self, handler, on_close, guard, fast):
        self.handler = handler
        self.on_close = on_close
        self.guard = guard
        self.fast = fast
        self.budget = wire.ByteBudget(SERVER_REQUEST_BYTES_MAX)
        self.reply_budget = wire.ByteBudget(SERVER_REPLY_BYTES_MAX)
        self.holding = set()                # connections with replies reserved, not yet sent
        self.connections = set()
        self.unauthenticated = 0            # of those, how many have no handshake yet
        self.cancelled_total = 0            # requests stopped by their peer's `cancel`
        self.sweeper = None
        self.server = None

    def make_protocol(self):
        if self.sweeper is None:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return _ServerConnection(self, self.handler, self.on_close).protocol

    def release_sent(self):
        for connection in list(self.holding):
            connection.release_sent()

    async def _sweep(self):
        while self.server is None or self.server.is_serving() or self.connections:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.sweep(now)
            self.release_sent()


async def serve(addr, handler, on_close=None, guard=None, tls=None, fast=None):
    """Start serving 'host:port' (port 0 picks one); the asyncio Server.

    `handler(peer, frame)` -> (header, payload); `on_close(peer)` runs when a connection ends.
    `fast(connection, frame)`, called first for every request: True when it has taken the
    request to answer without a task (the common case of a hot op, where a task per request is
    most of its cost); it then calls, once, `connection.answer_fast` with the reply or
    `connection.fall_back` to hand the request to `handler` after all (every error and every
    unusual case goes that way; `fast` itself never raises), possibly before it returns True
    (a get from the OSD's read cache is answered at once).
    `guard` (common/sessions.py) answers the handshake ops it names; while `guard.required`,
    a connection may send nothing else (and only small frames) until its handshake is done.
    `tls`: a server ssl.SSLContext (common/tls.py); then every connection is TLS, and one
    whose TLS handshake takes over HANDSHAKE_S is dropped."""
    host, port = parse_addr(addr)
    shared = _Server(handler, on_close, guard, fast)
    server = await asyncio.get_running_loop().create_server(
        shared.make_protocol, host, port, reuse_address=True, ssl=tls,
        ssl_handshake_timeout=HANDSHAKE_S if tls is not None else None)
    shared.server = server
    return server


# The server connection and reserved reply bytes of the request a task is answering.
_serving = contextvars.ContextVar("cairn_serving", default=None)


async def reserve_reply(nbytes):
    """Called by a handler before it reads what it will send: wait until a reply of about
    `nbytes` fits the connection's and the server's reply budgets, and hold them until the
    reply has left (outside a served request: at once). One reply larger than a budget still
    goes when nothing else holds it."""
    serving = _serving.get()
    if serving is None or nbytes <= 0:
        return
    connection, slot = serving[:2]
    await connection.reserve_reply(nbytes)
    slot[0] += nbytes


def finish_even_if_lost():
    """The request being served runs to its end even if its connection is lost (its reply is
    then dropped). A lost connection cancels its requests; one that changes the store must not
    stop between the store's commit and the daemon's record of it (a replica once committed a
    write, was cancelled before it counted it, and told the next primary it did not have it),
    nor free its received buffer while the store still writes from it."""
    serving = _serving.get()
    if serving is None:
        return
    task = serving[1][1]()              # the request's task (a task it started may call this)
    if task is not None and task in serving[0]._tasks:
        serving[0]._to_finish.add(task)


def received_checksums(payload):
    """(block crcs, crc32c) that the request being served arrived with, if `payload` is that
    request's payload (the very object) and it was checked block by block (frame.Frame.
    block_crcs); else (None, None). A store writing the buffer as it is takes its block crcs
    from here, and a primary forwarding it sends its crc, instead of reading it again."""
    serving = _serving.get()
    if serving is None:
        return None, None
    received = serving[2]
    if received.block_crcs is None or received.payload is not payload:
        return None, None
    return received.block_crcs, received.payload_crc


async def _answer(connection, handler, received, slot):
    peer = connection.peer
    _serving.set((connection, slot, received))
    try:
        await _respond(peer, handler, received)
    finally:
        connection.replied(slot[0])


async def _respond(peer, handler, received):
    try:
        header, payload = await handler(peer, received)
        if received.request_id:             # 0: one-way, no reply wanted
            peer.send(Kind.REPLY, received.request_id, header, payload)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _send_failure(peer, received, exc)


def _send_failure(peer, received, exc):
    """Answer a request whose handling raised `exc` (a one-way one's failure is only
    logged, if it is not a RequestFailed)."""
    if isinstance(exc, RequestFailed):
        if received.request_id:
            peer.send(Kind.ERROR, received.request_id, exc.to_header())
        return
    if isinstance(exc, AssertionError):
        # A broken invariant is a bug, not bad input: stop the daemon rather than serve on in an
        # unknown state (STYLE.md 2.5). The cluster survives a dead daemon, not a lying one.
        log.critical("invariant broken while answering %r", received.header.get("op"),
                     exc_info=exc)
        os._exit(70)
    # One request is one item: log, answer, keep serving.
    log.error("request %r from %s failed", received.header.get("op"), peer.addr, exc_info=exc)
    if received.request_id:
        peer.send(Kind.ERROR, received.request_id,
                  {"error": Code.INTERNAL, "message": f"{type(exc).__name__}: {exc}"})
