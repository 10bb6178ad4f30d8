"""Request/reply messaging over TCP with cairn frames (the asyncio shell around `frame`).

Two roles, one frame format; this module is the client's side and what both share (errors,
the outbox, frame writing), common/server.py the server's:
- `connect(addr)` gives a `Connection`: `await conn.request(header, payload)` sends a REQUEST
  and returns the matching REPLY frame; an ERROR reply raises `RequestFailed` carrying the
  remote's error code and message. PUSH frames (map updates) go to the `on_push` callback.
  `conn.cancel(future)` gives up on a request and tells the server to stop answering it;
  `conn.send_oneway(header)` sends a request that wants no answer.
- `server.serve(addr, handler)` accepts connections and calls `await handler(peer, frame)` for every
  REQUEST; the handler returns `(header, payload)` or raises `RequestFailed` (sent back as an
  ERROR frame). `peer.push(header, payload)` sends unsolicited frames on that connection.

Malformed input (anything `frame` rejects) is answered with one ERROR frame whose code is
`protocol` and the connection is closed; the server goes on serving everyone else. Every wait on
the network has a deadline (`timeout_s`), and requests in flight on one connection are bounded.
"""

import asyncio
import logging
import ssl

from cairn.common import auth, codes, frame, wire
from cairn.common.frame import Kind, RemoteProtocolError

log = logging.getLogger("cairn.messenger")

# Default deadline of one request. Control messages answer in milliseconds; 10 s leaves room for
# a monitor's fsync under load.
REQUEST_TIMEOUT_S_DEFAULT = 10.0
# A request's deadline counts as come this much early: uvloop's timers have a resolution of a
# millisecond, and a sweep that woke a little early would otherwise set itself again at once.
SWEEP_SLACK_S = 0.001
CONNECT_TIMEOUT_S_DEFAULT = 3.0


class MessengerError(Exception):
    """Base of messaging errors."""


class ConnectionClosed(MessengerError):
    """The connection closed (or never opened) before the reply came."""


class RequestTimeout(MessengerError):
    """No reply within the deadline."""


class RequestFailed(MessengerError):
    """The remote answered with an error: `code` (a `codes.Code`; a word this build does not
    know stays a string) and a message for people."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message

    def to_header(self):
        return {"error": self.code, "message": self.message}


def parse_addr(addr):
    """'host:port' -> (host, port); ValueError names the bad part."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"address must be host:port (was {addr!r})")
    return host, int(port)


async def read_frame(reader):
    """The next frame from an asyncio StreamReader (tests read raw sockets with it); None at a
    clean end of stream; RemoteProtocolError. Bytes after the frame are not read."""
    frames, errors = [], []
    receiver = wire.FrameReceiver(frames.append, errors.append)
    got = 0
    while not frames and not errors:
        wanted = frame.FIXED_BYTES - got if got < frame.FIXED_BYTES else 1
        chunk = await reader.read(wanted)
        if not chunk:
            if got:
                raise RemoteProtocolError(f"connection closed inside a frame ({got} bytes in)")
            return None
        got += len(chunk)
        receiver.feed(chunk)
    if errors:
        raise errors[0]
    return frames[0]


# asyncio's own socket transports (Python 3.11) inherit WriteTransport.writelines, which joins
# its buffers into one bytes object before writing: a copy of every payload byte (a profile of
# `cairn bench cluster` writing 4 MiB objects put that join at a quarter of the client's CPU).
# A frame of at least this many bytes goes out buffer by buffer on such a transport instead;
# smaller ones are joined, which costs less than a system call per buffer. uvloop's transports
# (the daemons') write lists of buffers without joining them.
_JOINING_WRITELINES = asyncio.WriteTransport.writelines
WRITE_UNJOINED_BYTES_MIN = 64 * 1024


def write_frame(transport, buffers):
    """Queue one frame's buffers (`frame.encode`'s list) on `transport`, in order."""
    if len(buffers) > 1 and type(transport).writelines is _JOINING_WRITELINES and \
            sum(memoryview(buffer).nbytes for buffer in buffers) >= WRITE_UNJOINED_BYTES_MIN:
        for buffer in buffers:
            transport.write(buffer)
    else:
        transport.writelines(buffers)


class Outbox:
    """The frames one connection sends in one loop turn leave together, in one write call.

    A transport writes at once when its buffer is empty: one send system call per frame. The
    replies of one commit group, the replica writes a burst of client requests makes, and a
    client's requests sent as their replies come in are all queued in the same turn; here they
    wait for the end of that turn (one `call_soon`) and go out as one `writelines`: a third to a
    tenth of the system calls at 16 ops in flight, and as many fewer wake-ups at the receiver.
    Frames keep their order. `flush()` first, before the transport is closed."""

    __slots__ = ("transport", "_call_soon", "_pending", "_pending_bytes", "_scheduled")

    def __init__(self, transport):
        self.transport = transport
        self._call_soon = asyncio.get_running_loop().call_soon
        self._pending = []
        self._pending_bytes = 0
        self._scheduled = False

    def add(self, buffers, nbytes):
        self._pending += buffers
        self._pending_bytes += nbytes
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self.flush)

    def flush(self):
        self._scheduled = False
        if not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if self.transport.is_closing():
            return
        try:
            write_frame(self.transport, pending)
        except (ConnectionError, OSError, RuntimeError) as exc:
            # RuntimeError: uvloop refuses a write on a transport closed under us. The
            # connection is gone either way; its owner hears of it from connection_lost.
            log.info("dropping a connection whose write failed: %s", exc)
            self.transport.abort()

    def unsent_bytes(self):
        """Bytes queued here or in the transport, not yet sent."""
        return self._pending_bytes + self.transport.get_write_buffer_size()


class Connection:
    """One TCP connection on which we send requests (and may receive pushes). Received frames
    land in our buffers without copies (common/wire.py)."""

    def __init__(self, addr, on_push=None):
        self.addr = addr
        self._on_push = on_push
        self._waiting = {}                  # request id -> (future, deadline, header,
        #                                     timeout_s); deadline None: none
        self._sweep_at = None               # when the sweep timer fires (loop.time())
        self._sweeper = None                # its handle
        self._next_id = 1
        self._loop = None                   # the loop it was opened on
        self._closed = None                 # the reason, once closed
        self._protocol = None
        self._transport = None
        self._outbox = None                 # Outbox, once connected
        self._send_mac = None               # auth.FrameMac once the session is authenticated
        self.session = None                 # what the handshake learned (common/sessions.py)

    def _make_protocol(self):
        self._protocol = wire.FrameProtocol(self._on_frame, self._on_error, self._on_lost)
        return self._protocol

    @property
    def closed(self):
        return self._closed is not None

    def start_request(self, header, payload=b"", timeout_s=REQUEST_TIMEOUT_S_DEFAULT,
                      payload_crc=None):
        """Send a request now (it leaves at the end of this loop turn); a future of its REPLY
        frame, which fails with RequestFailed (an ERROR reply), RequestTimeout or
        ConnectionClosed. No task is made: a primary starts its replica writes this way and
        awaits them after its own. `payload_crc`: the payload's crc32c if known
        (`frame.encode`). Raises ConnectionClosed at once on a closed connection."""
        self._check_open()
        buffers = wire.encode(Kind.REQUEST, self._next_id, header, payload, self._send_mac,
                               payload_crc)
        request_id = self._next_id
        self._next_id += 1
        loop = self._loop
        future = loop.create_future()
        # No timer per request (call_at and cancel were ~5% of a client's 4 KiB get): the
        # entry keeps its deadline, and one timer per connection, set for the earliest
        # deadline waiting, expires what is due (`_sweep`). The reply, the sweep or a close
        # ends the entry, whichever comes first.
        if timeout_s is None:
            self._waiting[request_id] = (future, None, header, None)
        else:
            deadline = loop.time() + timeout_s
            self._waiting[request_id] = (future, deadline, header, timeout_s)
            if self._sweep_at is None or deadline < self._sweep_at:
                self._sweep_at = deadline
                if self._sweeper is not None:
                    self._sweeper.cancel()
                self._sweeper = loop.call_at(deadline, self._sweep)
        self._outbox.add(buffers, 0)
        return future

    def _check_open(self):
        if self._closed is not None:
            raise ConnectionClosed(f"connection to {self.addr} is closed: {self._closed}")
        if self._transport.is_closing():
            self._close("closed by peer")
            raise ConnectionClosed(f"connection to {self.addr} is closed")

    def send_oneway(self, header, payload=b""):
        """Send a request that wants no reply (request id 0: the server sends none, and an
        answer that came anyway would be dropped here). Raises ConnectionClosed at once on a
        closed connection."""
        self._check_open()
        self._outbox.add(wire.encode(Kind.REQUEST, 0, header, payload, self._send_mac), 0)

    def cancel(self, future):
        """Give up on the request `future` came from (`start_request`): it stops waiting here,
        the future is cancelled, and the server is told (`cancel`, common/server.py) to stop
        answering it where it still can. Nothing is sent for one already answered."""
        for request_id, entry in self._waiting.items():
            if entry[0] is future:
                del self._waiting[request_id]
                if self._closed is None and not self._transport.is_closing():
                    self._outbox.add(wire.encode(Kind.REQUEST, 0, {"op": "cancel",
                                                                   "of": request_id},
                                                 b"", self._send_mac), 0)
                break
        future.cancel()

    async def request(self, header, payload=b"", timeout_s=REQUEST_TIMEOUT_S_DEFAULT,
                      payload_crc=None):
        """Send a request; the REPLY frame. Raises RequestFailed, RequestTimeout,
        ConnectionClosed. `payload_crc`: the payload's crc32c if known (`frame.encode`)."""
        future = self.start_request(header, payload, timeout_s, payload_crc)
        if self._protocol.writing_paused:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._protocol.drain()
            except TimeoutError:
                future.cancel()
                raise RequestTimeout(f"{header.get('op', 'request')} to {self.addr}: could "
                                     f"not send in {timeout_s:g} s") from None
        return await future

    def waiting_for(self, future):
        """Whether the request `future` came from (`start_request`) still has no reply, even
        if its caller has settled the future itself (a hedged read takes another's answer)."""
        return any(entry[0] is future for entry in self._waiting.values())

    def longest_wait_s(self):
        """How long the oldest request still without a reply has waited (0.0: none; requests
        sent without a timeout are not counted)."""
        now, longest = self._loop.time(), 0.0
        for _, deadline, _, timeout_s in self._waiting.values():
            if deadline is not None:
                longest = max(longest, now - (deadline - timeout_s))
        return longest

    def _sweep(self):
        """Fail the requests whose deadline has come; set the timer for the next one."""
        self._sweeper = self._sweep_at = None
        now = self._loop.time()
        following = None
        for request_id, (future, deadline, header, timeout_s) in list(self._waiting.items()):
            if deadline is None:
                continue
            if deadline <= now + SWEEP_SLACK_S:
                del self._waiting[request_id]
                if not future.done():
                    future.set_exception(RequestTimeout(
                        f"{header.get('op', 'request')} to {self.addr}: no reply in "
                        f"{timeout_s:g} s"))
            elif following is None or deadline < following:
                following = deadline
        if following is not None:
            self._sweep_at = following
            self._sweeper = self._loop.call_at(following, self._sweep)

    def secure(self, send_key, receive_key):
        """From the next frame on, every frame each way carries a MAC under these keys."""
        self._send_mac = auth.FrameMac(send_key)
        self._protocol.receiver.mac = auth.FrameMac(receive_key)

    def _on_frame(self, received):
        if received.kind == Kind.PUSH:
            if self._on_push is not None:
                self._on_push(received)
            return
        entry = self._waiting.pop(received.request_id, None)
        if entry is None:
            return                          # timed out, or an id we never sent
        future = entry[0]
        if future.done():
            return                          # its caller went away
        if received.kind == Kind.ERROR:
            future.set_exception(RequestFailed(codes.parse(received.header.get("error", "error")),
                                               str(received.header.get("message", ""))))
        else:
            future.set_result(received)

    def _on_error(self, exc):
        log.warning("dropping connection to %s: %s", self.addr, exc)
        self._close(f"protocol error: {exc}")

    def _on_lost(self, exc):
        self._close(str(exc) if exc else "closed by peer")

    def _close(self, reason):
        if self._closed is None:
            self._closed = reason
            if self._transport is not None:
                self._outbox.flush()
                self._transport.close()
        waiting, self._waiting = self._waiting, {}
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = self._sweep_at = None
        for future, *_ in waiting.values():
            if not future.done():
                future.set_exception(ConnectionClosed(f"connection to {self.addr} lost: "
                                                      f"{reason}"))

    async def close(self):
        self._close("closed")


async def connect(addr, on_push=None, timeout_s=CONNECT_TIMEOUT_S_DEFAULT,
                  authenticate=None, tls=None):
    """A Connection to 'host:port'; ConnectionClosed if it cannot be opened in time.
    `authenticate(connection)`: the handshake to run before the connection is handed out (its
    errors close the connection and pass through). `tls`: an ssl.SSLContext (common/tls.py)
    for a cluster that serves TLS."""
    host, port = parse_addr(addr)
    connection = Connection(addr, on_push)
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await asyncio.get_running_loop().create_connection(
                connection._make_protocol, host, port, ssl=tls,
                server_hostname="" if tls is not None else None)
    except TimeoutError:
        raise ConnectionClosed(f"cannot connect to {addr}: no answer in {timeout_s:g} s") \
            from None
    except ssl.SSLError as exc:
        raise ConnectionClosed(f"cannot connect to {addr}: TLS failed ({exc.reason or exc}); "
                               "does the cluster serve TLS, with this certificate?") from None
    except OSError as exc:
        raise ConnectionClosed(f"cannot connect to {addr}: {exc.strerror or exc}") from None
    connection._transport = transport
    connection._loop = asyncio.get_running_loop()
    connection._outbox = Outbox(transport)
    if authenticate is not None:
        try:
            await authenticate(connection)
        except BaseException:
            await connection.close()
            raise
    return connection


class ConnectionPool:
    """One Connection per peer key (an OSD id), opened on first use and reopened when closed
    or when the peer's address changed. Concurrent callers share one connection attempt."""

    def __init__(self, connect_timeout_s=CONNECT_TIMEOUT_S_DEFAULT, authenticate=None,
                 tls=None):
        self.connect_timeout_s = connect_timeout_s
        self.authenticate = authenticate
        self.tls = tls
        self._connections = {}
        self._locks = {}

    def ready(self, key, addr):
        """The open connection to `key` at `addr`, or None (then `get` opens one)."""
        connection = self._connections.get(key)
        if connection is not None and not connection.closed and connection.addr == addr:
            return connection
        return None

    async def get(self, key, addr):
        connection = self.ready(key, addr)
        if connection is not None:
            return connection
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            connection = self._connections.get(key)
            if connection is not None and not connection.closed and connection.addr == addr:
                return connection
            if connection is not None:
                await connection.close()
            connection = await connect(addr, timeout_s=self.connect_timeout_s,
                                       authenticate=self.authenticate, tls=self.tls)
            self._connections[key] = connection
            return connection

    async def discard(self, key):
        connection = self._connections.pop(key, None)
        if connection is not None:
            await connection.close()

    def keys(self):
        return list(self._connections)

    async def close(self):
        for key in list(self._connections):
            await self.discard(key)
