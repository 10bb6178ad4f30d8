"""Receiving frames without copies, and without trusting the sender: the one frame parser.

`FrameReceiver` is the parser every daemon and client runs, and the one the fuzz tests drive
(tests/test_frame.py feeds it random, truncated, bit-flipped and lying-length streams in random
chunk sizes through the same `get_buffer` / `buffer_updated` calls the event loop makes).
`FrameProtocol` is the asyncio BufferedProtocol around it.

With a plain Protocol every received byte is copied three times in Python land (the loop's
bytes object, StreamReader's buffer, readexactly's slice); a profile of 4 MiB replicated writes
put those copies at ~19% of OSD time. Here the event loop reads straight into our buffers:

- Small frames land in a scratch buffer, from which every complete frame is cut (many small
  frames per read call, as with a stream reader).
- A frame whose payload is large (PAYLOAD_DIRECT_BYTES_MIN and up) gets its own page-aligned
  buffer from a pool once its header is known and checked; what already sits in the scratch is
  moved over once, and the rest of the payload is read by the kernel directly into it. The
  payload handed on is a memoryview of that buffer: the store writes it with O_DIRECT as it is.

Hostile input (rules, in order):
1. The fixed prefix is checked (magic, version, kind, lengths against the receiver's limits).
2. Only the header is awaited next, and its checksum (which covers the prefix too) is checked
   before a byte of payload is buffered or a payload buffer is reserved: a 32-byte prefix that
   claims a 64 MiB payload costs nothing until a correct header follows it.
3. A large payload's buffer is reserved from a `ByteBudget` shared by the daemon's connections
   (and one per connection); while it is spent, the receiver waits (`on_pause`) and reads
   nothing more from that peer until bytes come back (TCP backpressure), instead of growing.
The first error is reported to `on_error` and nothing more is read.
"""

import asyncio
import collections
import os

from cairn.common import frame
from cairn.native.bufpool import BufferPool

# Payloads from this size on are received directly into their own aligned buffer.
PAYLOAD_DIRECT_BYTES_MIN = 64 * 1024
# The scratch buffer small frames are read into (and its growth bound: one frame's header and
# a sub-direct payload always fit).
SCRATCH_BYTES = 256 * 1024
assert SCRATCH_BYTES >= frame.FIXED_BYTES + PAYLOAD_DIRECT_BYTES_MIN

_POOL = BufferPool()


def receive_pool():
    """The pool that large payloads are received into. An OSD's device takes its buffers from
    it too (osd/daemon.py): received writes and device reads then share one set of slabs,
    where two pools each kept the slabs of their own busiest moment."""
    return _POOL


class ByteBudget:
    """Bytes a daemon (or one connection) may hold for requests it received and has not yet
    answered. `take` never fails when nothing is held, so one frame larger than the limit still
    goes through alone; otherwise a taker that does not fit waits in line (`wait`)."""

    def __init__(self, limit):
        assert limit > 0
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiting = collections.deque()      # callbacks, first come first served

    def fits(self, nbytes):
        return self.used == 0 or self.used + nbytes <= self.limit

    def take(self, nbytes):
        """Take `nbytes` if they fit (True), else take nothing (False)."""
        if not self.fits(nbytes):
            return False
        self.force(nbytes)
        return True

    def force(self, nbytes):
        """Take `nbytes` even over the limit (bytes already received or built)."""
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def wait(self, callback):
        """Call `callback()` once some bytes are given back (it then tries again)."""
        self._waiting.append(callback)

    def give(self, nbytes):
        self.used -= nbytes
        assert self.used >= 0, f"budget given back more than it lent ({self.used})"
        waiting, self._waiting = self._waiting, collections.deque()
        for callback in waiting:
            callback()


class Limits:
    """What one receiver accepts: header and payload bytes per frame, and the budgets that
    reserve large payload buffers (None: no budget, as on a client's own connections)."""

    def __init__(self, header_bytes_max=frame.HEADER_BYTES_MAX,
                 payload_bytes_max=frame.PAYLOAD_BYTES_MAX, budgets=()):
        self.header_bytes_max = header_bytes_max
        self.payload_bytes_max = payload_bytes_max
        self.budgets = tuple(budgets)


class FrameReceiverTwin:
    """Calls `on_frame(frame)` for every frame received and `on_error(exc)` once on a protocol
    error (then reads nothing more). `on_pause()` / `on_resume()` ask the caller to stop and
    start reading while a payload waits for its budget. Each frame's `reserved` bytes were
    taken from the limits' budgets; whoever handles the frame gives them back (`release`).

    The reference: what ships is `FrameReceiver` below, this class with its frame-cutting
    loop in C (common/_wire.pyx), which the tests hold to the same behaviour."""

    def __init__(self, on_frame, on_error, limits=None, on_pause=None, on_resume=None):
        self._on_frame = on_frame
        self._on_error = on_error
        self._on_pause = on_pause or (lambda: None)
        self._on_resume = on_resume or (lambda: None)
        self.limits = limits or Limits()
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0                 # first unparsed byte in scratch
        self._end = 0                   # end of received bytes in scratch
        self._direct = None             # (prefix, header bytes, payload view, bytes filled)
        self._needed = 0                # scratch bytes the frame being received needs
        self._stalled = None            # (prefix, header bytes) waiting for budget
        self.failed = False
        self.frame_started = False      # bytes of an unfinished frame are held
        self.held = False               # the owner paused reading: cut no more frames either
        self.mac = None                 # the session's receiving auth.FrameMac, once there is one
        self._header = None             # the header of the frame at _start, once checked

    # -- the event loop's calls --------------------------------------------------------------------

    def get_buffer(self, sizehint):
        if self._direct is not None:
            _, _, payload, filled = self._direct
            return payload[filled:]
        if self._end == len(self._scratch):
            self._make_room()
        return memoryview(self._scratch)[self._end:]

    def buffer_updated(self, nbytes):
        if self.failed:
            return
        try:
            if self._direct is not None:
                prefix, header, payload, filled = self._direct
                filled += nbytes
                if filled < len(payload):
                    self._direct = (prefix, header, payload, filled)
                    return
                self._direct = None
                self._deliver(prefix, header, payload)
            else:
                self._end += nbytes
            self._parse()
        except frame.RemoteProtocolError as exc:
            self.failed = True
            self._on_error(exc)

    def feed(self, data):
        """Receive `data` exactly as the event loop would (tests, and reading from a stream):
        through `get_buffer` and `buffer_updated`, in the pieces the buffers allow."""
        view = memoryview(data)
        while view.nbytes and not self.failed:
            if self._stalled is not None:
                raise BlockingIOError("the receiver waits for its budget")
            buffer = self.get_buffer(-1)
            count = min(len(buffer), view.nbytes)
            buffer[:count] = view[:count]
            view = view[count:]
            self.buffer_updated(count)

    @property
    def waiting_for_budget(self):
        return self._stalled is not None

    def close(self):
        """The connection ended: give back what the unfinished frame reserved."""
        self.failed = True
        if self._direct is not None:
            prefix = self._direct[0]
            self._direct = None
            for budget in self.limits.budgets:
                budget.give(prefix.payload_bytes)
        self._stalled = None

    def resume(self):
        """The owner resumed reading: cut the frames already buffered."""
        self.held = False
        if self.failed or self._direct is not None:
            return
        try:
            self._parse()
        except frame.RemoteProtocolError as exc:
            self.failed = True
            self._on_error(exc)

    def release(self, received):
        """Give back the budget bytes a delivered frame holds, once it is answered (exactly
        once per frame)."""
        if received.reserved:
            for budget in self.limits.budgets:
                budget.give(received.reserved)

    # -- parsing -----------------------------------------------------------------------------------

    def _make_room(self):
        """A fresh scratch buffer holding the unparsed tail, big enough for the frame being
        received. (A new bytearray rather than an in-place move or resize: the loop may still
        hold a view of the old one, and a bytearray with views cannot be resized.)"""
        pending = self._end - self._start
        fresh = bytearray(max(SCRATCH_BYTES, self._needed, pending + 1))
        fresh[:pending] = memoryview(self._scratch)[self._start:self._end]
        self._scratch = fresh
        self._start, self._end = 0, pending

    def _check_limits(self, prefix):
        if prefix.header_bytes > self.limits.header_bytes_max:
            raise frame.RemoteProtocolError(
                f"frame header of {prefix.header_bytes} bytes is over this connection's limit "
                f"({self.limits.header_bytes_max})")
        if prefix.payload_bytes > self.limits.payload_bytes_max:
            raise frame.RemoteProtocolError(
                f"frame payload of {prefix.payload_bytes} bytes is over this connection's "
                f"limit ({self.limits.payload_bytes_max})")

    def _parse(self):
        """Cut every complete frame out of the scratch buffer; stop at the first incomplete
        one, at a payload that starts its own buffer, or at one waiting for its budget."""
        while self._stalled is None and self._direct is None and not self.held:
            scratch = memoryview(self._scratch)    # slices of it copy once, into bytes
            if self._end - self._start < frame.FIXED_BYTES:
                self._needed = frame.FIXED_BYTES
                break
            prefix = frame.decode_prefix(scratch, self._start)
            self._check_limits(prefix)
            body_start = self._start + frame.FIXED_BYTES
            if self._end - body_start < prefix.header_bytes:
                self._needed = frame.FIXED_BYTES + prefix.header_bytes
                break
            if self._header is None:
                # Decoded once per frame: a MAC check advances the session's frame counter.
                self._header = frame.decode_header(
                    prefix, scratch[body_start:body_start + prefix.header_bytes], self.mac)
            header = self._header
            payload_start = body_start + prefix.header_bytes
            if prefix.payload_bytes >= PAYLOAD_DIRECT_BYTES_MIN:
                self._start = payload_start
                self._header = None
                self._reserve(prefix, header)
                continue
            if self._end - payload_start < prefix.payload_bytes:
                self._needed = frame.FIXED_BYTES + prefix.header_bytes + prefix.payload_bytes
                break
            payload = bytes(scratch[payload_start:payload_start + prefix.payload_bytes])
            self._start = payload_start + prefix.payload_bytes
            self._header = None
            for budget in self.limits.budgets:
                budget.force(prefix.payload_bytes)
            self._deliver(prefix, header, payload)
        if self._direct is None and self._start == self._end:
            self._start = self._end = 0
        self.frame_started = self._direct is not None or self._stalled is not None or \
            self._end > self._start

    def _reserve(self, prefix, header):
        """Take the payload's bytes from every budget (all or none) and start receiving it
        into its own buffer; while they do not fit, pause reading and wait for them."""
        budgets = self.limits.budgets
        short = [budget for budget in budgets if not budget.fits(prefix.payload_bytes)]
        if short:
            self._stalled = (prefix, header)
            self._on_pause()
            short[0].wait(self._retry)
            return
        for budget in budgets:
            budget.force(prefix.payload_bytes)
        payload = _POOL.get(prefix.payload_bytes)[:prefix.payload_bytes]
        have = min(self._end - self._start, prefix.payload_bytes)
        payload[:have] = memoryview(self._scratch)[self._start:self._start + have]
        self._start += have
        if have < prefix.payload_bytes:
            self._direct = (prefix, header, payload, have)
            self._start = self._end = 0          # nothing else is buffered
            return
        self._deliver(prefix, header, payload)

    def _retry(self):
        if self._stalled is None or self.failed:
            return
        prefix, header = self._stalled
        self._stalled = None
        try:
            self._reserve(prefix, header)
            if self._stalled is None:
                self._on_resume()
                self._parse()
        except frame.RemoteProtocolError as exc:
            self.failed = True
            self._on_error(exc)

    def _deliver(self, prefix, header, payload):
        reserved = prefix.payload_bytes if self.limits.budgets else 0
        self._on_frame(frame.decode_payload(prefix, header, payload, reserved))


class FrameProtocol(asyncio.BufferedProtocol):
    """The asyncio side of a FrameReceiver. Calls `on_frame(frame)`, `on_error(exc)` once on a
    protocol error, `on_lost(exc or None)` when the connection ends, and `on_writing(paused)`
    when the transport's write buffer crosses its high (True) or low (False) water mark."""

    def __init__(self, on_frame, on_error, on_lost, limits=None, on_writing=None):
        self._on_lost = on_lost
        self._on_writing = on_writing or (lambda paused: None)
        self.transport = None
        self.receiver = FrameReceiver(on_frame, on_error, limits, self._pause_for_budget,
                                      self._resume_for_budget)
        self.get_buffer = self.receiver.get_buffer
        self.buffer_updated = self.receiver.buffer_updated
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._paused_by = set()             # why reading is paused: "budget", others by owners

    # -- asyncio callbacks -------------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self._can_write.set()
        self._on_lost(exc)

    def pause_writing(self):
        self._can_write.clear()
        self._on_writing(True)

    def resume_writing(self):
        self._can_write.set()
        self._on_writing(False)

    async def drain(self):
        """Wait until the transport's write buffer is below its high-water mark."""
        await self._can_write.wait()

    @property
    def writing_paused(self):
        return not self._can_write.is_set()

    # -- reading, paused for several reasons at once ----------------------------------------------

    def pause_reading(self, reason):
        """Stop reading from the peer, and cutting frames out of what was read, until every
        reason given is taken back: a burst of small requests read at once waits too."""
        if not self._paused_by and self.transport is not None and \
                not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused_by.add(reason)
        self.receiver.held = True

    def resume_reading(self, reason):
        if reason not in self._paused_by:
            return
        self._paused_by.discard(reason)
        if not self._paused_by:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
            self.receiver.resume()

    def _pause_for_budget(self):
        self.pause_reading("budget")

    def _resume_for_budget(self):
        self.resume_reading("budget")


def native_codec():
    """The native frame codec (common/_wire.pyx: the parser's loop, the encoder, the session
    MAC), or None where CAIRN_NO_EXTENSIONS=1 selects the Python twins; an ImportError that
    says how to build it where it is not built."""
    if os.environ.get("CAIRN_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        from cairn.common import _wire
    except ImportError as exc:
        raise ImportError("cairn's native framing extension (cairn.common._wire) is not "
                          "built; run 'pip install -e .' in the source tree, or set "
                          "CAIRN_NO_EXTENSIONS=1 for the slow reference") from exc
    return _wire


# The shipped parser and encoder are native where every frame passes (common/_wire.pyx): the
# twin's frame-cutting loop and frame.encode, in C. CAIRN_NO_EXTENSIONS=1 selects the twins.
_wire = native_codec()
if _wire is None:
    FrameReceiver, encode = FrameReceiverTwin, frame.encode
else:
    assert PAYLOAD_DIRECT_BYTES_MIN == frame.BLOCK_CRCS_BYTES_MIN

    class FrameReceiver(FrameReceiverTwin):
        """The receiver every daemon and client runs: the twin with its loop in C."""

        _parse = _wire.cut_frames

    encode = _wire.encode
