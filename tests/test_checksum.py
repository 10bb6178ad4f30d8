"""crc32c: the native-backed function against crcmod, the oracle (differential, random input)."""

import os
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


from cairn.native._blockcrc import block_crcs as native_block_crcs  # noqa: E402
from cairn.native.checksum import block_crcs_reference  # noqa: E402

TWINS = {"native": native_block_crcs, "reference": block_crcs_reference}


@pytest.fixture(params=sorted(TWINS))
def twin(request):
    return TWINS[request.param]


@given(count=st.integers(min_value=0, max_value=8), block_size=st.sampled_from([8, 512, 4096, 4100]),
       seed=st.integers(0, 2**32))
@settings(max_examples=60)
def test_block_crcs_twins_match_oracle(count, block_size, seed):
    """Both twins against crcmod, on block counts that exercise the 3-way interleave and its
    remainder, and a block size that is not a multiple of 8."""
    data = random.Random(seed).randbytes(count * block_size)
    expected = [oracle(data[i:i + block_size]) for i in range(0, len(data), block_size)]
    for name, function in TWINS.items():
        crcs = function(memoryview(data), block_size)
        assert isinstance(crcs, bytes), name
        assert np.frombuffer(crcs, dtype="<u4").tolist() == expected, name


def test_block_crcs_rejects_partial_block(twin):
    with pytest.raises(ValueError, match="whole number"):
        twin(b"x" * 5000, 4096)


def test_block_crcs_is_the_native_twin():
    if os.environ.get("CAIRN_NO_EXTENSIONS", "") not in ("", "0"):
        pytest.skip("CAIRN_NO_EXTENSIONS=1 selects the reference twin")
    assert block_crcs is native_block_crcs


from cairn.native import checksum  # noqa: E402
from cairn.native._blockcrc import fold as native_fold  # noqa: E402


@given(count=st.integers(0, 7), tail=st.integers(0, 4095), seed=st.integers(0, 2**32),
       head=st.binary(max_size=100))
@settings(max_examples=40, deadline=None)
def test_folded_block_crcs_are_the_crc_of_the_whole(count, tail, seed, head):
    """One read for both checksums: block crcs folded (native and reference) equal the crc of
    the concatenation, after any prefix; a payload's tail short of a block is continued."""
    data = random.Random(seed).randbytes(count * 4096 + tail)
    whole = data[:count * 4096]
    crcs = block_crcs(whole, 4096)
    assert native_fold(crcs) == oracle(whole)
    assert native_fold(crcs, oracle(head)) == oracle(head + whole)
    if count <= 2:                                  # the reference goes bit by bit
        assert checksum.fold_reference(crcs, oracle(head)) == oracle(head + whole)
    crc, crcs_too = checksum.crc_and_block_crcs(memoryview(data))
    assert crc == oracle(data) and crcs_too == crcs


def test_fold_refuses_a_partial_crc():
    with pytest.raises(ValueError, match="4 bytes each"):
        native_fold(b"abc")


@given(blocks=st.integers(1, 6), seed=st.integers(0, 2**32), data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_range_crc_is_the_crc_of_the_range(blocks, seed, data):
    """A get's reply checksum from the block crcs the store just checked (`range_crc`): any
    range of the blocks, partial first and last blocks, ranges inside one block, empty ones."""
    whole = random.Random(seed).randbytes(blocks * 4096)
    start = data.draw(st.integers(0, len(whole)))
    length = data.draw(st.integers(0, len(whole) - start))
    crcs = block_crcs(whole, 4096)
    assert checksum.range_crc(memoryview(whole), crcs, start, length) == \
        oracle(whole[start:start + length])


@pytest.mark.skipif(checksum.fold is checksum.fold_reference,
                    reason="CAIRN_NO_EXTENSIONS=1: the reference fold goes bit by bit, so "
                    "range_crc reads the whole range instead")
def test_a_range_crc_reads_only_the_partial_blocks():
    """The blocks wholly inside the range are folded from their crcs, not read: a middle block
    changed after its crc was taken does not change the result (the data was read once)."""
    data = bytearray(random.Random(7).randbytes(3 * 4096))
    crcs = block_crcs(bytes(data), 4096)
    expected = oracle(bytes(data[100:3 * 4096 - 100]))
    data[4096:2 * 4096] = bytes(4096)
    assert checksum.range_crc(memoryview(data), crcs, 100, 3 * 4096 - 200) == expected
    data[0:4096] = bytes(4096)                      # a partial block is read: it counts
    assert checksum.range_crc(memoryview(data), crcs, 100, 3 * 4096 - 200) != expected
