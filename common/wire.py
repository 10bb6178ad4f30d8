"""Receiving frames without copies: an asyncio BufferedProtocol over the frame codec.

With a plain Protocol every received byte is copied three times in Python land (the loop's
bytes object, StreamReader's buffer, readexactly's slice); a profile of 4 MiB replicated writes
put those copies at ~19% of OSD time. Here the event loop reads straight into our buffers:

- Small frames land in a scratch buffer, from which every complete frame is cut (many small
  frames per read call, as with a stream reader).
- A frame whose payload is large (PAYLOAD_DIRECT_BYTES_MIN and up) gets its own page-aligned
  buffer from a pool as soon as its header is known; what already sits in the scratch is moved
  over once, and the rest of the payload is read by the kernel directly into it. The payload
  handed on is a memoryview of that buffer: the store writes it with O_DIRECT as it is.

Frames are checked exactly as `frame.decode_prefix` / `decode_body` check them; the first error
is reported to `on_error` and nothing more is read.
"""

import asyncio

from cairn.common import frame
from cairn.native.bufpool import BufferPool

# Payloads from this size on are received directly into their own aligned buffer.
PAYLOAD_DIRECT_BYTES_MIN = 64 * 1024
# The scratch buffer small frames are read into (and its growth bound: one frame's header and
# a sub-direct payload always fit).
SCRATCH_BYTES = 256 * 1024
assert SCRATCH_BYTES >= frame.FIXED_BYTES + PAYLOAD_DIRECT_BYTES_MIN

_POOL = BufferPool()


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls `on_frame(frame)` for every frame received, `on_error(exc)` once on a protocol
    error (then reads nothing more), and `on_lost(exc or None)` when the connection ends."""

    def __init__(self, on_frame, on_error, on_lost):
        self._on_frame = on_frame
        self._on_error = on_error
        self._on_lost = on_lost
        self.transport = None
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0                 # first unparsed byte in scratch
        self._end = 0                   # end of received bytes in scratch
        self._direct = None             # (prefix, header bytes, payload view, bytes filled)
        self._needed = 0                # scratch bytes the frame being received needs
        self._failed = False
        self._can_write = asyncio.Event()
        self._can_write.set()

    # -- asyncio callbacks -------------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        if self._direct is not None:
            _, _, payload, filled = self._direct
            return payload[filled:]
        if self._end == len(self._scratch):
            self._make_room()
        return memoryview(self._scratch)[self._end:]

    def buffer_updated(self, nbytes):
        if self._failed:
            return
        try:
            if self._direct is not None:
                prefix, header_raw, payload, filled = self._direct
                filled += nbytes
                if filled < len(payload):
                    self._direct = (prefix, header_raw, payload, filled)
                    return
                self._direct = None
                self._on_frame(frame.decode_body(prefix, header_raw, payload))
                return
            self._end += nbytes
            self._parse()
        except frame.RemoteProtocolError as exc:
            self._failed = True
            self._on_error(exc)

    def connection_lost(self, exc):
        self._can_write.set()
        self._on_lost(exc)

    def pause_writing(self):
        self._can_write.clear()

    def resume_writing(self):
        self._can_write.set()

    async def drain(self):
        """Wait until the transport's write buffer is below its high-water mark."""
        await self._can_write.wait()

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

    def _parse(self):
        scratch = memoryview(self._scratch)        # slices of it copy once, into bytes
        while self._end - self._start >= frame.FIXED_BYTES:
            prefix = frame.decode_prefix(bytes(scratch[self._start:self._start +
                                                       frame.FIXED_BYTES]))
            body_start = self._start + frame.FIXED_BYTES
            available = self._end - body_start
            direct = prefix.payload_bytes >= PAYLOAD_DIRECT_BYTES_MIN
            wanted = prefix.header_bytes if direct else prefix.header_bytes + prefix.payload_bytes
            if available < wanted:
                self._needed = frame.FIXED_BYTES + wanted
                return
            header_raw = bytes(scratch[body_start:body_start + prefix.header_bytes])
            payload_start = body_start + prefix.header_bytes
            if not direct:
                payload = bytes(scratch[payload_start:payload_start + prefix.payload_bytes])
                self._start = payload_start + prefix.payload_bytes
                self._on_frame(frame.decode_body(prefix, header_raw, payload))
                continue
            payload = _POOL.get(prefix.payload_bytes)[:prefix.payload_bytes]
            have = min(available - prefix.header_bytes, prefix.payload_bytes)
            payload[:have] = scratch[payload_start:payload_start + have]
            self._start = payload_start + have
            if have < prefix.payload_bytes:
                self._direct = (prefix, header_raw, payload, have)
                self._start = self._end = 0         # nothing else is buffered
                return
            self._on_frame(frame.decode_body(prefix, header_raw, payload))
        self._needed = 0
        if self._start == self._end:
            self._start = self._end = 0
