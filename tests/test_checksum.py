"""crc32c: the native-backed function against crcmod, the oracle (differential, random input)."""

import random

import crcmod.predefined
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cairn.native import block_crcs, crc32c

pytestmark = pytest.mark.unit

oracle = crcmod.predefined.mkCrcFun("crc-32c")


def test_known_vector():
    # The check value of CRC-32C (RFC 3720 appendix B.4 lists the iSCSI test vectors).
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA


@given(st.binary(max_size=20_000))
@settings(max_examples=200)
def test_matches_oracle(data):
    assert crc32c(data) == oracle(data)
    assert crc32c(memoryview(data)) == oracle(data)


@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_continuation(first, second):
    assert crc32c(second, crc32c(first)) == oracle(first + second)


@given(st.integers(min_value=0, max_value=8).map(lambda n: n * 4096), st.integers(0, 2**32))
@settings(max_examples=30)
def test_block_crcs(length, seed):
    data = random.Random(seed).randbytes(length)
    crcs = block_crcs(memoryview(data), 4096)
    assert crcs.dtype == np.uint32
    assert crcs.tolist() == [oracle(data[i:i + 4096]) for i in range(0, length, 4096)]


def test_block_crcs_rejects_partial_block():
    with pytest.raises(AssertionError):
        block_crcs(b"x" * 5000, 4096)
