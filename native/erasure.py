"""Erasure coding: pyeclib (liberasurecode + ISA-L) for the data path, a numpy twin as reference.

`Codec(k, m, backend)` encodes one stripe of an object into k + m fragments and decodes a stripe
from any k of them. Each fragment is pyeclib's: a fixed header (`header_bytes`, 80 with
liberasurecode 1.6) then the payload. The codes are systematic: the payload of fragment j < k is
the slice `[j * p, (j + 1) * p)` of the stripe, p = ceil(len / k), the last slices padded with
zeros; fragments k.. hold parity. So a healthy read takes data straight out of data fragments and
never decodes (osd/ecstripe.py does that arithmetic).

Encoding writes the fragments straight into the buffers that go to the device and the network
(`encode_into`). For ISA-L's backends the parity comes from ISA-L's `ec_encode_data` run in place
(native/_isal.pyx) and the headers are written here; the result is pyeclib's output byte for byte,
which `Codec` checks on probe stripes when it is made (else it says why in `native_refused` and
encodes through pyeclib). Why: pyeclib's `encode` zeroes and fills fresh fragments and then copies
each into a Python bytes object, 3.5 ms for a 4 MiB 4+2 stripe on the development VM against
0.47 ms in place (ISA-L's arithmetic alone: 0.26 ms). Decoding (degraded reads, recovery) is
pyeclib's.

Why `isa_l_rs_cauchy` by default: over all C(24, 6) ways to lose 6 of 18+6 fragments,
`isa_l_rs_vand` failed to decode 440 (a Vandermonde matrix is not MDS for m > 4); the Cauchy
matrix decoded every one (docs/DESIGN.md, "Erasure coding").

`ReferenceCodec(k, m)` is the twin: Reed-Solomon over GF(2^8) (polynomial 0x11d) with the same
Cauchy generator ISA-L's `gf_gen_cauchy1_matrix` builds (parity row i, column j: 1 / (i ^ j)),
written with numpy lookup tables so it is short and obviously right. It works on payloads (no
headers) and is used by the tests to check pyeclib's parity byte for byte and its decoding from
every pattern of losses. It is far too slow for the data path (measured 70 MB/s for 4+2,
44 MB/s for 18+6).

pyeclib allocates fresh buffers for every call; with glibc's default thresholds each large one is
an mmap plus page faults, which costs 5x (measured: 4+2 on 4 MiB stripes encodes at 0.74 GB/s
with the defaults, 3.7 GB/s after `tune_malloc()`). Daemons call `tune_malloc()` at start-up: it
still serves decoding and the backends ISA-L does not run.
"""

import ctypes
import ctypes.util
import struct
import zlib

import numpy as np

DEFAULT_BACKEND = "isa_l_rs_cauchy"
# Backends cairn accepts for a pool: Cauchy Reed-Solomon from ISA-L (default), liberasurecode's
# own Vandermonde RS (MDS, slower), ISA-L Vandermonde only where m <= 4 (not MDS beyond).
BACKENDS = ("isa_l_rs_cauchy", "liberasurecode_rs_vand", "isa_l_rs_vand")
# glibc mallopt parameters (malloc.h) and the values daemons set: blocks up to 1 GiB come from
# the heap, and the heap is not trimmed back below 1 GiB of free space, so stripes reuse memory.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MALLOC_THRESHOLD_BYTES = 1 << 30
# The backends whose parity cairn computes itself with ISA-L (native/_isal.pyx), and the
# generator matrix liberasurecode builds for each.
_ISAL_MATRICES = {"isa_l_rs_cauchy": "cauchy", "isa_l_rs_vand": "vandermonde"}
# liberasurecode 1.6's fragment header (little-endian, packed): index u32, payload length u32,
# backend metadata length u32, stripe length u64, checksum type u8, checksums 8 x u32, mismatch
# u8, backend id u8, backend version u32 (the 59 bytes of metadata), then magic u32, library
# version u32, the zlib crc32 of the metadata u32, 9 bytes of padding.
_HEADER_BYTES = 80
_META_BYTES = 59
_HEADER_FIELDS = struct.Struct("<II")
_HEADER_SIZE, _HEADER_SIZE_AT = struct.Struct("<Q"), 12
_HEADER_CRC, _HEADER_CRC_AT = struct.Struct("<I"), 67


class ErasureError(Exception):
    """Base class of the codec's errors."""


class NotEnoughFragments(ErasureError):
    """Fewer than k usable fragments of a stripe: it cannot be decoded."""

    def __init__(self, present, needed):
        self.present, self.needed = sorted(present), needed
        super().__init__(f"{len(self.present)} fragments present {self.present}, {needed} needed")


class BadFragment(ErasureError):
    """A fragment whose header or payload pyeclib refused."""


def tune_malloc():
    """Raise glibc's mmap and trim thresholds for this process (see the module docstring).
    Returns True when glibc took both settings; False where there is no glibc mallopt."""
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    libc = ctypes.CDLL(path)
    if not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_THRESHOLD_BYTES)) and \
        bool(libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_THRESHOLD_BYTES))


def check_profile(k, m, backend):
    """Raise ValueError naming the problem if (k, m, backend) is not a profile cairn serves."""
    if backend not in BACKENDS:
        raise ValueError(f"erasure backend must be one of {', '.join(BACKENDS)} (was {backend!r})")
    if not (isinstance(k, int) and isinstance(m, int) and k >= 1 and m >= 1):
        raise ValueError(f"k and m must be positive integers (were {k!r}, {m!r})")
    if k + m > 32:
        raise ValueError(f"k + m must be at most 32 (was {k + m})")
    if backend == "isa_l_rs_vand" and m > 4:
        raise ValueError("isa_l_rs_vand cannot decode every loss for m > 4; use isa_l_rs_cauchy")


def payload_bytes(data_bytes, k):
    """The payload length of each fragment of a stripe of `data_bytes`."""
    return -(-data_bytes // k)


class Codec:
    """pyeclib's code for one (k, m, backend); one instance per pool, shared by its PGs.

    Encoding writes each fragment straight into the caller's buffers (`encode_into`): with
    ISA-L's parity computed in place (native/_isal.pyx) where the backend is one of ISA-L's and
    the fragments it makes are pyeclib's byte for byte (checked here on a probe stripe; `native`
    says which path is in use), through pyeclib otherwise. Decoding is pyeclib's."""

    def __init__(self, k, m, backend=DEFAULT_BACKEND):
        check_profile(k, m, backend)
        from pyeclib.ec_iface import ECDriver
        self.k, self.m, self.backend = k, m, backend
        self._driver = ECDriver(k=k, m=m, ec_type=backend)
        probe = self._driver.encode(b"\0" * k)
        self.header_bytes = len(probe[0]) - 1
        assert self.header_bytes > 0, self.header_bytes
        self._tables, self._template = None, bytes(probe[0][:self.header_bytes])
        self.native, self.native_refused = False, None
        self._try_native()

    def _try_native(self):
        """Use ISA-L in place if this backend is ISA-L's, the extension is built, and a probe
        stripe comes out byte-identical to pyeclib's; else say why in `native_refused`."""
        from cairn import native
        matrix = _ISAL_MATRICES.get(self.backend)
        if matrix is None:
            self.native_refused = f"{self.backend} is not an ISA-L backend"
            return
        if native.extensions_disabled():
            self.native_refused = "CAIRN_NO_EXTENSIONS is set"
            return
        try:
            from cairn.native import _isal
        except ImportError as exc:
            self.native_refused = f"cairn.native._isal is not built ({exc})"
            return
        if self.header_bytes != _HEADER_BYTES or \
                zlib.crc32(self._template[:_META_BYTES]) != \
                _HEADER_CRC.unpack_from(self._template, _HEADER_CRC_AT)[0]:
            self.native_refused = "pyeclib's fragment header is not the layout cairn writes"
            return
        self._tables = _isal.encode_tables(self.k, self.m, matrix)
        self._encode_parity = _isal.encode_parity
        probe = bytes(range(256)) * 40 + b"cairn"            # stripes cut unevenly too
        self.native = True                  # the native paths, on trial until the probe says
        for size in (1, self.k, len(probe)):
            ours = [bytes(fragment) for fragment in self._encode_native(probe[:size])]
            parity = [bytearray(self.fragment_bytes(size)) for _ in range(self.m)]
            pieces = [b"".join(bytes(piece) for piece in fragment) for fragment in
                      self.encode_pieces(probe[:size], parity, 0)] + [bytes(p) for p in parity]
            theirs = self._driver.encode(probe[:size])
            if ours != theirs or pieces != theirs:
                self._tables, self.native = None, False
                self.native_refused = "ISA-L in place did not match pyeclib on a probe stripe"
                return

    def fragment_bytes(self, data_bytes):
        """The length of every fragment of a stripe of `data_bytes`."""
        return self.header_bytes + payload_bytes(data_bytes, self.k)

    def encode(self, data):
        """The k + m fragments (bytes-like, header included) of one stripe; `data` is
        bytes-like and not empty."""
        assert len(data) > 0, "an empty stripe has no fragments"
        if self.native:
            return self._encode_native(data)
        # pyeclib 1.6-1.8 takes only `bytes` (a memoryview or bytearray is "invalid
        # arguments"): one copy of the stripe, at memcpy speed beside the encoding.
        fragments = self._driver.encode(data if type(data) is bytes else bytes(data))
        expected = self.fragment_bytes(len(data))
        assert len(fragments) == self.k + self.m, len(fragments)
        assert all(len(fragment) == expected for fragment in fragments), expected
        return fragments

    def _encode_native(self, data):
        fragments = [bytearray(self.fragment_bytes(len(data))) for _ in range(self.k + self.m)]
        self.encode_into(fragments, 0, data)
        return fragments

    def encode_into(self, shards, offset, data):
        """Write the k + m fragments of the stripe `data` (bytes-like, not empty) at `offset`
        of the writable buffers `shards` (one per fragment, each at least `offset +
        fragment_bytes(len(data))` long): data fragments take one copy of the stripe, parity is
        computed in place."""
        size = len(data)
        assert size > 0, "an empty stripe has no fragments"
        if not self.native:
            for shard, fragment in zip(shards, self.encode(data), strict=True):
                memoryview(shard)[offset:offset + len(fragment)] = fragment
            return
        for shard, fragment in zip(shards, self.encode_pieces(data, shards[self.k:], offset)):
            target, at = memoryview(shard)[offset:], 0
            for piece in fragment:
                length = memoryview(piece).nbytes
                target[at:at + length] = piece
                at += length

    def encode_pieces(self, data, parity, offset):
        """One stripe without a copy of its bytes (native codecs only): the k data fragments,
        each a list of pieces (its header, then a view of `data`; a zero-padded copy where the
        stripe ends short of whole fragments), with the m parity fragments written at `offset`
        of the writable buffers `parity` (each at least `offset + fragment_bytes(len(data))`
        long)."""
        size = len(data)
        assert self.native and size > 0, (self.native, size)
        view = memoryview(data).cast("B")
        payload = payload_bytes(size, self.k)
        chunks = []
        for index in range(self.k):
            chunk = view[index * payload:(index + 1) * payload]
            if len(chunk) < payload:
                chunk = bytes(chunk) + bytes(payload - len(chunk))
            chunks.append(chunk)
        start = offset + self.header_bytes
        for index, buffer in enumerate(parity, self.k):
            self._write_header(buffer, offset, index, payload, size)
        self._encode_parity(self._tables, self.k, self.m,
                            chunks + [memoryview(buffer)[start:start + payload]
                                      for buffer in parity], 0, payload)
        return [[self._header(index, payload, size), chunk] for index, chunk in enumerate(chunks)]

    def _header(self, index, payload, size):
        """liberasurecode's fragment header: pyeclib's probe header with this fragment's index,
        payload length and stripe length, and the zlib crc32 of its metadata."""
        header = bytearray(self._template)
        _HEADER_FIELDS.pack_into(header, 0, index, payload)
        _HEADER_SIZE.pack_into(header, _HEADER_SIZE_AT, size)
        _HEADER_CRC.pack_into(header, _HEADER_CRC_AT, zlib.crc32(header[:_META_BYTES]))
        return header

    def _write_header(self, shard, offset, index, payload, size):
        memoryview(shard)[offset:offset + self.header_bytes] = self._header(index, payload, size)

    def decode(self, fragments, data_bytes):
        """The stripe from `fragments` ({fragment index: bytes-like, header included}); at
        least k of them. Raises NotEnoughFragments or BadFragment."""
        from pyeclib.ec_iface import ECDriverError, ECInsufficientFragments
        if len(fragments) < self.k:
            raise NotEnoughFragments(fragments, self.k)
        expected = self.header_bytes + payload_bytes(data_bytes, self.k)
        chosen = [bytes(fragment) for _, fragment in sorted(fragments.items())]
        if any(len(fragment) != expected for fragment in chosen):
            raise BadFragment(f"fragment lengths {[len(f) for f in chosen]}, expected "
                              f"{expected} for a stripe of {data_bytes} bytes")
        try:
            data = self._driver.decode(chosen)
        except ECInsufficientFragments:
            raise NotEnoughFragments(fragments, self.k) from None
        except ECDriverError as exc:
            raise BadFragment(str(exc)) from None
        if len(data) != data_bytes:
            raise BadFragment(f"decoded {len(data)} bytes, expected {data_bytes}")
        return data

    def payload(self, fragment):
        """The payload of a fragment, without a copy."""
        return memoryview(fragment)[self.header_bytes:]


# -- the reference twin --------------------------------------------------------------------------

def _gf_tables():
    exp = np.zeros(512, dtype=np.int64)
    log = np.zeros(256, dtype=np.int64)
    x = 1
    for i in range(255):
        exp[i], log[x] = x, i
        x <<= 1
        if x & 0x100:
            x ^= 0x11D
    exp[255:510] = exp[:255]
    product = np.zeros((256, 256), dtype=np.uint8)
    nonzero = np.arange(1, 256)
    product[1:, 1:] = exp[(log[nonzero][:, None] + log[nonzero][None, :])]
    return exp, log, product


_EXP, _LOG, _PRODUCT = _gf_tables()


def gf_mul(a, b):
    return int(_PRODUCT[a, b])


def gf_inv(a):
    assert a != 0, "0 has no inverse"
    return int(_EXP[255 - _LOG[a]])


class ReferenceCodec:
    """Reed-Solomon with ISA-L's Cauchy generator, on fragment payloads (no headers)."""

    def __init__(self, k, m):
        check_profile(k, m, DEFAULT_BACKEND)
        self.k, self.m = k, m
        # Row r of the generator gives fragment r: identity for data, Cauchy for parity.
        self.generator = [[int(r == c) for c in range(k)] for r in range(k)]
        self.generator += [[gf_inv(r ^ c) for c in range(k)] for r in range(k, k + m)]

    def _combine(self, rows, sources):
        out = []
        for row in rows:
            acc = np.zeros(len(sources[0]), dtype=np.uint8)
            for coefficient, source in zip(row, sources):
                if coefficient:
                    acc ^= _PRODUCT[coefficient][source]
            out.append(acc)
        return out

    def encode_payloads(self, data):
        """The k + m payloads (bytes) of a stripe of `data` (not empty)."""
        size = payload_bytes(len(data), self.k)
        padded = np.zeros(size * self.k, dtype=np.uint8)
        padded[:len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)
        chunks = [padded[j * size:(j + 1) * size] for j in range(self.k)]
        return [chunk.tobytes() for chunk in self._combine(self.generator, chunks)]

    def decode_payloads(self, payloads, data_bytes):
        """The stripe from {fragment index: payload}, any k of them."""
        if len(payloads) < self.k:
            raise NotEnoughFragments(payloads, self.k)
        chosen = sorted(payloads)[:self.k]
        inverse = _gf_invert([self.generator[i] for i in chosen])
        sources = [np.frombuffer(bytes(payloads[i]), dtype=np.uint8) for i in chosen]
        data = b"".join(chunk.tobytes() for chunk in self._combine(inverse, sources))
        return data[:data_bytes]


def _gf_invert(matrix):
    """The inverse of a square matrix over GF(2^8) (Gauss-Jordan); it must be invertible."""
    size = len(matrix)
    rows = [list(row) + [int(r == c) for c in range(size)] for r, row in enumerate(matrix)]
    for column in range(size):
        pivot = next(r for r in range(column, size) if rows[r][column])
        rows[column], rows[pivot] = rows[pivot], rows[column]
        scale = gf_inv(rows[column][column])
        rows[column] = [gf_mul(scale, value) for value in rows[column]]
        for r in range(size):
            factor = rows[r][column]
            if r != column and factor:
                rows[r] = [value ^ gf_mul(factor, pivot_value)
                           for value, pivot_value in zip(rows[r], rows[column])]
    return [row[size:] for row in rows]
