# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native framing: the frame-cutting loop of the shipped `wire.FrameReceiver`, and `encode`.

`wire.FrameReceiver` is its Python twin `wire.FrameReceiverTwin` with `cut_frames` as its
`_parse`: the same state and the same rules, error message for error message, with the loop
that every received frame goes through in C; the rest of the receiver (buffers, budgets, large
payloads) is the twin's own code. `encode` is `frame.encode` in C. tests/test_frame.py runs its
round trips and its fuzzing against both receivers and holds the encoders to the same bytes.
What is native: the fixed fields read from the buffer, both checksums, the limits, and building
the frame, with no intermediate objects; what stays a Python call: msgpack (already C), the
session MAC (hashlib's blake2b) and the frame's callback. A profile of 4 KiB gets put the
Python parser and encoder at a quarter of an OSD's interpreted time per op.

Errors: a bad prefix is named by `frame.decode_prefix` and an exceeded limit by the receiver's
own `_check_limits`, so those messages cannot drift apart from the twin's.
"""

import sys

import hmac
import msgpack

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.bytearray cimport PyByteArray_AS_STRING
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memcmp

from cairn.common import frame as _frame

assert sys.byteorder == "little"

cdef extern from "blake2b_mac.h" nogil:
    void cairn_frame_mac(const unsigned char *key, size_t keylen, uint64_t counter,
                         const unsigned char *a, size_t alen, const unsigned char *b,
                         size_t blen, unsigned char *out, size_t outlen)

cdef extern from "crc32c_blocks.h" nogil:
    void cairn_crc32c_init_table()
    int cairn_crc32c_hw_available()
    uint32_t cairn_crc32c_update(uint32_t crc, const unsigned char *p, size_t n, int hw)

cdef int HW = cairn_crc32c_hw_available()
cairn_crc32c_init_table()

cdef Py_ssize_t FIXED = _frame.FIXED_BYTES           # 32: the fixed fields and the header crc
cdef Py_ssize_t CRC_COVERED = 28                     # the fixed fields a header crc covers
cdef Py_ssize_t MAC_BYTES = _frame.MAC_BYTES
cdef uint16_t FLAG_MAC = _frame.FLAG_MAC
cdef Py_ssize_t HEADER_MAX = _frame.HEADER_BYTES_MAX
cdef Py_ssize_t PAYLOAD_MAX = _frame.PAYLOAD_BYTES_MAX
# Payloads from this size on are received into their own buffer (wire.PAYLOAD_DIRECT_BYTES_MIN,
# which wire.py checks equals this) and checked block by block.
cdef Py_ssize_t DIRECT_MIN = _frame.BLOCK_CRCS_BYTES_MIN
cdef bytes MAGIC = _frame.MAGIC
cdef int VERSION = _frame.VERSION
cdef object KINDS = _frame._KINDS
cdef object Frame = _frame.Frame
cdef object Prefix = _frame.Prefix
cdef object RemoteProtocolError = _frame.RemoteProtocolError
cdef object LocalProtocolError = _frame.LocalProtocolError
cdef object decode_prefix = _frame.decode_prefix
cdef object unpackb = msgpack.unpackb
# One packer for every frame: packb makes a Packer per call (0.49 against 0.18 µs for a
# reply's header). Its buffer is reset after each pack (autoreset), and encode never yields.
cdef object _pack = msgpack.Packer(use_bin_type=True).pack
cdef object compare_digest = hmac.compare_digest


cdef inline uint32_t load32(const unsigned char *p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return v


cdef inline uint64_t load64(const unsigned char *p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


cdef inline void store32(unsigned char *p, uint32_t v) noexcept nogil:
    memcpy(p, &v, 4)


cdef inline void store64(unsigned char *p, uint64_t v) noexcept nogil:
    memcpy(p, &v, 8)


cdef uint32_t crc_of(object data, uint32_t crc) except? 0xFFFFFFFF:
    """crc32c of any buffer, continuing from `crc`."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            crc = cairn_crc32c_update(crc, <const unsigned char *> view.buf, view.len, HW)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32c(data, uint32_t value=0):
    """crc32c of `data` continuing from `value` (checksum.crc32c; the tests compare them)."""
    return crc_of(data, value)


cdef class FrameMac:
    """auth.FrameMac in C (one direction's MAC key and frame counter): keyed BLAKE2b-128 of
    the frame's first 28 bytes and its msgpack header, salted with the frame's number
    (native/blake2b_mac.h). The frame codec below computes it without a Python object per
    frame; `next` is the same for everyone else. auth.FrameMacTwin is the reference (hashlib)."""

    cdef unsigned char _key[64]
    cdef size_t _key_bytes
    cdef public uint64_t count

    def __cinit__(self, key):
        cdef const unsigned char[::1] raw = key
        if not 0 < raw.shape[0] <= 64:
            raise ValueError(f"a MAC key is 1 to 64 bytes (got {raw.shape[0]})")
        memcpy(self._key, &raw[0], raw.shape[0])
        self._key_bytes = raw.shape[0]
        self.count = 0

    @property
    def key(self):
        return PyBytes_FromStringAndSize(<const char *> self._key, self._key_bytes)

    cdef void tag(self, const unsigned char *fixed, const unsigned char *header,
                  Py_ssize_t header_bytes, unsigned char *out) noexcept:
        """The next frame's MAC into `out` (MAC_BYTES): `fixed` is its first 28 bytes."""
        self.count += 1
        cairn_frame_mac(self._key, self._key_bytes, self.count, fixed, CRC_COVERED, header,
                        header_bytes, out, MAC_BYTES)

    def next(self, fixed, header_raw):
        """The MAC of the next frame (fixed: its first 28 bytes, header_raw: its msgpack map)."""
        cdef const unsigned char[::1] a = fixed
        cdef const unsigned char[::1] b = header_raw
        cdef unsigned char out[64]
        if a.shape[0] != CRC_COVERED:
            raise ValueError(f"a frame's fixed part is {CRC_COVERED} bytes")
        self.tag(&a[0], &b[0] if b.shape[0] else NULL, b.shape[0], out)
        return PyBytes_FromStringAndSize(<const char *> out, MAC_BYTES)


cdef object _header_of(object mac, const unsigned char *p, Py_ssize_t header_bytes,
                       uint16_t flags, uint32_t header_crc):
    """frame.decode_header, on the frame at `p` whose header is in."""
    cdef uint32_t crc = cairn_crc32c_update(0, p, CRC_COVERED, HW)
    crc = cairn_crc32c_update(crc, p + FIXED, header_bytes, HW)
    if crc != header_crc:
        raise RemoteProtocolError("frame header checksum mismatch (corrupted in flight?)")
    cdef unsigned char expected[64]
    cdef unsigned char difference = 0
    cdef Py_ssize_t i
    if mac is None:
        if flags & FLAG_MAC:
            raise RemoteProtocolError("frame with a MAC on a connection that has no session")
        header_raw = PyBytes_FromStringAndSize(<const char *> p + FIXED, header_bytes)
    else:
        if not flags & FLAG_MAC:
            raise RemoteProtocolError("frame without a MAC on an authenticated connection")
        header_raw = PyBytes_FromStringAndSize(<const char *> p + FIXED,
                                               header_bytes - MAC_BYTES)
        if type(mac) is FrameMac:
            (<FrameMac> mac).tag(p, p + FIXED, header_bytes - MAC_BYTES, expected)
            for i in range(MAC_BYTES):      # constant time, as hmac.compare_digest
                difference |= expected[i] ^ p[FIXED + header_bytes - MAC_BYTES + i]
        else:                               # a twin's MAC (tests)
            difference = not compare_digest(
                mac.next(PyBytes_FromStringAndSize(<const char *> p, CRC_COVERED), header_raw),
                PyBytes_FromStringAndSize(<const char *> p + FIXED + header_bytes - MAC_BYTES,
                                          MAC_BYTES))
        if difference:
            raise RemoteProtocolError("frame MAC does not check (forged, replayed or from "
                                      "another session)")
    try:
        header = unpackb(header_raw, raw=False, strict_map_key=False)
    except Exception as exc:        # msgpack raises several unrelated types on garbage
        raise RemoteProtocolError(f"frame header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise RemoteProtocolError(f"frame header is a {type(header).__name__}, not a map")
    return header


def cut_frames(self):
    """wire.FrameReceiverTwin._parse in C, for the receiver that ships (wire.FrameReceiver:
    the twin with this as its `_parse`): the same state, steps and errors. A large payload is
    handed to the receiver's own `_reserve`; a frame whose limits are exceeded is named by its
    `_check_limits`."""
    cdef const unsigned char *p
    cdef uint8_t version, kind
    cdef uint16_t flags
    cdef uint64_t request_id
    cdef Py_ssize_t start, end, header_bytes, payload_bytes, body_start, payload_start
    cdef uint32_t payload_crc, header_crc, crc
    cdef bytearray scratch
    while self._stalled is None and self._direct is None and not self.held:
        start, end = self._start, self._end
        if end - start < FIXED:
            self._needed = FIXED
            break
        scratch = self._scratch
        p = <const unsigned char *> PyByteArray_AS_STRING(scratch) + start
        version, kind = p[4], p[5]
        flags = p[6] | (p[7] << 8)
        request_id = load64(p + 8)
        header_bytes = load32(p + 16)
        payload_bytes = load32(p + 20)
        payload_crc = load32(p + 24)
        header_crc = load32(p + 28)
        if memcmp(p, PyBytes_AS_STRING(MAGIC), 4) != 0 or version != VERSION or \
                kind < 1 or kind > 4 or flags & ~FLAG_MAC or \
                (flags & FLAG_MAC and header_bytes < MAC_BYTES) or \
                header_bytes > HEADER_MAX or payload_bytes > PAYLOAD_MAX:
            decode_prefix(scratch, start)                       # names what is wrong
            raise RemoteProtocolError("bad frame prefix")       # (not reached)
        limits = self.limits
        if header_bytes > limits.header_bytes_max or payload_bytes > limits.payload_bytes_max:
            self._check_limits(decode_prefix(scratch, start))   # names which
        body_start = start + FIXED
        if end - body_start < header_bytes:
            self._needed = FIXED + header_bytes
            break
        header = self._header
        if header is None:
            # Decoded once per frame: a MAC check advances the session's frame counter.
            header = self._header = _header_of(self.mac, p, header_bytes, flags, header_crc)
        payload_start = body_start + header_bytes
        if payload_bytes >= DIRECT_MIN:
            self._start = payload_start
            self._header = None
            self._reserve(Prefix(KINDS[kind], request_id, header_bytes, payload_bytes,
                                 payload_crc, header_crc,
                                 PyBytes_FromStringAndSize(<const char *> p, CRC_COVERED),
                                 flags), header)
            continue
        if end - payload_start < payload_bytes:
            self._needed = FIXED + header_bytes + payload_bytes
            break
        payload = PyBytes_FromStringAndSize(<const char *> p + FIXED + header_bytes,
                                            payload_bytes)
        self._start = payload_start + payload_bytes
        self._header = None
        budgets = limits.budgets
        for budget in budgets:
            budget.force(payload_bytes)
        # frame.decode_payload for a payload under BLOCK_CRCS_BYTES_MIN (= DIRECT_MIN)
        crc = cairn_crc32c_update(0, <const unsigned char *> PyBytes_AS_STRING(payload),
                                  payload_bytes, HW) if payload_bytes else 0
        if crc != payload_crc:
            raise RemoteProtocolError(f"frame payload checksum mismatch ({payload_bytes} "
                                      "bytes)")
        self._on_frame(Frame(KINDS[kind], request_id, header, payload,
                             payload_bytes if budgets else 0))
    if self._direct is None and self._start == self._end:
        self._start = self._end = 0
    self.frame_started = self._direct is not None or self._stalled is not None or \
        self._end > self._start


def encode(kind, request_id, header, payload=b"", mac=None, payload_crc=None):
    """frame.encode in C: [fixed + msgpack header (+ MAC), payload pieces...]."""
    cdef uint64_t rid
    cdef Py_ssize_t packed_bytes, head_bytes, payload_bytes
    cdef uint32_t crc
    cdef unsigned char *q
    cdef Py_buffer view
    if not isinstance(header, dict):
        raise LocalProtocolError(f"a frame header is a dict (got {type(header).__name__})")
    try:
        packed = _pack(header)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"frame header cannot be packed: {exc}") from None
    packed_bytes = len(<bytes> packed)
    if packed_bytes > HEADER_MAX:
        raise LocalProtocolError(f"frame header is {packed_bytes} bytes; the limit is "
                                 f"{HEADER_MAX}")
    if type(payload) is tuple:
        pieces = payload
        payload_bytes = 0
        for piece in pieces:
            payload_bytes += memoryview(piece).nbytes
    else:
        pieces = (payload,)
        payload_bytes = len(<bytes> payload) if type(payload) is bytes else \
            memoryview(payload).nbytes
    if payload_bytes > PAYLOAD_MAX:
        raise LocalProtocolError(f"frame payload is {payload_bytes} bytes; the limit is "
                                 f"{PAYLOAD_MAX}")
    if not 0 <= request_id < 1 << 64:
        raise LocalProtocolError(f"request id {request_id} does not fit 64 bits")
    if kind not in KINDS:
        raise LocalProtocolError(f"unknown frame kind {kind!r}")
    rid = request_id
    if payload_crc is None:
        crc = 0
        for piece in pieces:
            crc = crc_of(piece, crc)
    else:
        crc = payload_crc
    head_bytes = FIXED + packed_bytes + (MAC_BYTES if mac is not None else 0)
    head = PyBytes_FromStringAndSize(NULL, head_bytes)
    q = <unsigned char *> PyBytes_AS_STRING(head)
    memcpy(q, PyBytes_AS_STRING(MAGIC), 4)
    q[4] = VERSION
    q[5] = <uint8_t> int(kind)
    q[6] = FLAG_MAC if mac is not None else 0
    q[7] = 0
    store64(q + 8, rid)
    store32(q + 16, <uint32_t> (head_bytes - FIXED))
    store32(q + 20, <uint32_t> payload_bytes)
    store32(q + 24, crc)
    memcpy(q + FIXED, PyBytes_AS_STRING(packed), packed_bytes)
    if type(mac) is FrameMac:
        (<FrameMac> mac).tag(q, q + FIXED, packed_bytes, q + FIXED + packed_bytes)
    elif mac is not None:
        tag = mac.next(PyBytes_FromStringAndSize(<const char *> q, CRC_COVERED), packed)
        memcpy(q + FIXED + packed_bytes, PyBytes_AS_STRING(tag), MAC_BYTES)
    store32(q + CRC_COVERED, cairn_crc32c_update(cairn_crc32c_update(0, q, CRC_COVERED, HW),
                                                 q + FIXED, head_bytes - FIXED, HW))
    return [head, *pieces]

