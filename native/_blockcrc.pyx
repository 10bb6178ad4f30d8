# cython: language_level=3, boundscheck=False, wraparound=False
"""Native twin of `checksum.block_crcs_reference`: crc32c of each block of a buffer, in C.

Arguments are checked here, at the edge; the kernel in `crc32c_blocks.h` trusts them and runs
without the GIL."""

import sys

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport uint32_t

# The crcs are returned as the bytes of a native uint32 array; the store's format says
# little-endian, which x86-64 and aarch64 Linux are.
assert sys.byteorder == "little"

cdef extern from "crc32c_blocks.h" nogil:
    void cairn_crc32c_init_table()
    void cairn_crc32c_blocks(const unsigned char *p, size_t block, size_t count, uint32_t *out,
                             int hw)
    int cairn_crc32c_hw_available()
    void cairn_crc32c_init_zeros(size_t block)
    uint32_t cairn_crc32c_fold(uint32_t crc, const uint32_t *crcs, size_t count)

cdef int HW = cairn_crc32c_hw_available()
cairn_crc32c_init_table()

# The block size whose crcs `fold` combines: the store's (cairn.common.limits checks it).
FOLD_BLOCK_BYTES = 4096
cairn_crc32c_init_zeros(FOLD_BLOCK_BYTES)

HARDWARE = bool(HW)


def block_crcs(data, Py_ssize_t block_size):
    """crc32c of each `block_size` block of `data` (length a multiple of it), as the bytes of a
    little-endian uint32 array."""
    cdef Py_buffer view
    cdef Py_ssize_t count
    cdef uint32_t *target
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if block_size <= 0 or view.len % block_size != 0:
            raise ValueError(f"buffer of {view.len} bytes is not a whole number of "
                             f"{block_size}-byte blocks")
        count = view.len // block_size
        out = PyBytes_FromStringAndSize(NULL, count * 4)
        target = <uint32_t *>PyBytes_AS_STRING(out)
        with nogil:
            cairn_crc32c_blocks(<const unsigned char *>view.buf, block_size, count, target, HW)
        return out
    finally:
        PyBuffer_Release(&view)


def fold(crcs, unsigned int crc=0):
    """The crc32c of bytes whose crc32c is `crc` followed by FOLD_BLOCK_BYTES blocks whose
    crc32cs are `crcs` (the bytes of a little-endian uint32 array, as `block_crcs` gives)."""
    cdef Py_buffer view
    cdef uint32_t result
    PyObject_GetBuffer(crcs, &view, PyBUF_SIMPLE)
    try:
        if view.len % 4:
            raise ValueError(f"block crcs are 4 bytes each, not {view.len} bytes in all")
        with nogil:
            result = cairn_crc32c_fold(crc, <const uint32_t *>view.buf, view.len // 4)
        return result
    finally:
        PyBuffer_Release(&view)


def buffer_address(data):
    """The address of `data`'s first byte (any contiguous buffer): a cheap alignment check for
    the store's zero-copy path."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    address = <size_t>view.buf
    PyBuffer_Release(&view)
    return address
