"""Erasure coding: pyeclib against the numpy reference twin, and the stripe layout.

Goal: the shipped codec (ISA-L parity in place, native/_isal.pyx, writing pyeclib's fragments)
produces exactly the fragments pyeclib produces and the parity a plainly written Reed-Solomon
over GF(2^8) produces, and all give back every byte from any k fragments; the layout puts object
bytes where a healthy read looks for them and decodes degraded ranges and rebuilt shards right
for every size, including 0 and 1 byte. Method: hypothesis draws the profile (any k + m up to
18 + 6), the data and the lost fragments.
"""

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cairn.native import erasure
from cairn.osd import ecstripe

pytestmark = pytest.mark.unit

_CODECS = {}


def codec(k, m):
    if (k, m) not in _CODECS:
        _CODECS[k, m] = (erasure.Codec(k, m), erasure.ReferenceCodec(k, m))
    return _CODECS[k, m]


profiles = st.tuples(st.integers(1, 18), st.integers(1, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=profiles, data=st.binary(min_size=1, max_size=3000), seed=st.integers(0, 2**32))
def test_pyeclib_parity_matches_the_reference_and_any_k_fragments_decode(profile, data, seed):
    k, m = profile
    fast, reference = codec(k, m)
    assert fast.native, fast.native_refused
    fragments = fast.encode(data)
    assert [bytes(f) for f in fragments] == fast._driver.encode(data)      # pyeclib's, exactly
    payloads = reference.encode_payloads(data)
    assert [bytes(fast.payload(f)) for f in fragments] == payloads
    lost = random.Random(seed).sample(range(k + m), random.Random(seed + 1).randint(0, m))
    kept = {i: fragments[i] for i in range(k + m) if i not in lost}
    assert fast.decode(kept, len(data)) == data
    assert reference.decode_payloads({i: payloads[i] for i in kept}, len(data)) == data


def test_every_loss_of_m_fragments_decodes_for_small_profiles():
    data = random.Random(7).randbytes(1001)
    for k, m in ((2, 1), (4, 2), (3, 3)):
        fast, reference = codec(k, m)
        fragments = fast.encode(data)
        for lost in itertools.combinations(range(k + m), m):
            kept = {i: fragments[i] for i in range(k + m) if i not in lost}
            assert fast.decode(kept, len(data)) == data, (k, m, lost)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 10), m=st.integers(1, 4), data=st.binary(min_size=1, max_size=5000))
def test_isal_vandermonde_in_place_matches_pyeclib(k, m, data):
    vand = erasure.Codec(k, m, "isa_l_rs_vand")
    assert vand.native, vand.native_refused
    assert [bytes(f) for f in vand.encode(data)] == vand._driver.encode(data)


def test_backends_without_isal_and_disabled_extensions_encode_through_pyeclib(monkeypatch):
    data = random.Random(3).randbytes(10_001)
    native = erasure.Codec(4, 2)
    liberasurecode = erasure.Codec(4, 2, "liberasurecode_rs_vand")
    assert not liberasurecode.native and "not an ISA-L backend" in liberasurecode.native_refused
    assert liberasurecode.encode(data) == liberasurecode._driver.encode(data)
    monkeypatch.setenv("CAIRN_NO_EXTENSIONS", "1")
    plain = erasure.Codec(4, 2)
    assert not plain.native and "CAIRN_NO_EXTENSIONS" in plain.native_refused
    assert plain.encode(data) == [bytes(f) for f in native.encode(data)]
    # encode_into works on either path, at any offset of longer buffers.
    for codec_ in (plain, native):
        shards = [bytearray(b"\xee" * 30_000) for _ in range(6)]
        codec_.encode_into(shards, 777, data)
        size = codec_.fragment_bytes(len(data))
        assert [bytes(s[777:777 + size]) for s in shards] == plain.encode(data)
        assert all(s[:777] == b"\xee" * 777 and s[777 + size:] == b"\xee" * (30_000 - 777 - size)
                   for s in shards)


def test_a_native_path_that_disagrees_with_pyeclib_is_refused(monkeypatch):
    """The probe stripes check both native paths (in place and as pieces) against pyeclib."""
    header = erasure.Codec._header

    def wrong_index(self, index, payload, size):
        return header(self, (index + 1) % (self.k + self.m), payload, size)
    monkeypatch.setattr(erasure.Codec, "_header", wrong_index)
    refused = erasure.Codec(4, 2)
    assert not refused.native and "did not match pyeclib" in refused.native_refused
    data = random.Random(5).randbytes(5000)
    assert refused.encode(data) == refused._driver.encode(data)


def test_fewer_than_k_fragments_is_a_clear_error():
    fast, reference = codec(4, 2)
    fragments = fast.encode(b"0123456789")
    with pytest.raises(erasure.NotEnoughFragments, match=r"3 fragments present \[0, 2, 5\], 4"):
        fast.decode({0: fragments[0], 2: fragments[2], 5: fragments[5]}, 10)
    with pytest.raises(erasure.NotEnoughFragments):
        reference.decode_payloads({0: b"ab"}, 10)


def test_a_fragment_of_the_wrong_length_is_refused():
    fast, _ = codec(4, 2)
    fragments = fast.encode(b"x" * 100)
    with pytest.raises(erasure.BadFragment, match="fragment lengths"):
        fast.decode({i: fragments[i][:-1] for i in range(4)}, 100)


def test_profiles_cairn_refuses():
    with pytest.raises(ValueError, match="not decode every loss|cannot decode"):
        erasure.Codec(18, 6, "isa_l_rs_vand")
    with pytest.raises(ValueError, match="backend must be one of"):
        erasure.Codec(4, 2, "jerasure")
    with pytest.raises(ValueError, match="at most 32"):
        erasure.check_profile(30, 6, "isa_l_rs_cauchy")


def test_tune_malloc_takes_effect_on_glibc():
    assert erasure.tune_malloc() is True


# -- the layout -----------------------------------------------------------------------------------

def test_stripe_unit_is_aligned_and_near_four_mib():
    assert ecstripe.unit_for(4) == 1 << 20
    assert ecstripe.unit_for(18) == 229376 and ecstripe.unit_for(18) % 4096 == 0
    assert ecstripe.unit_for(1) == 4 << 20
    assert ecstripe.unit_for(4096) == 4096


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=st.sampled_from([(1, 1), (2, 1), (4, 2), (5, 3), (18, 6)]),
       unit=st.sampled_from([1, 7, 64, 4096]),
       size=st.one_of(st.just(0), st.just(1), st.integers(0, 20000)),
       window=st.tuples(st.integers(0, 20000), st.integers(0, 20000)),
       seed=st.integers(0, 2**32))
def test_layout_healthy_and_degraded_reads_and_rebuilds(profile, unit, size, window, seed):
    k, m = profile
    fast, _ = codec(k, m)
    rng = random.Random(seed)
    data = rng.randbytes(size)
    layout = ecstripe.Layout(k, m, unit, fast.header_bytes, size)
    shards = ecstripe.encode_shards(fast, layout, data)
    assert [len(s) for s in shards] == [layout.shard_bytes] * (k + m)
    # Into whole-block buffers holding old bytes (the write path's pool buffers): the same
    # shards, then zeros.
    rounded = -(-layout.shard_bytes // 4096) * 4096 or 4096
    pooled = ecstripe.encode_shards(fast, layout, data,
                                    [bytearray(b"\xa5" * rounded) for _ in range(k + m)])
    assert all(p[:layout.shard_bytes] == s and not any(p[layout.shard_bytes:])
               for p, s in zip(pooled, shards))
    if size:
        # The write path's pieces: the same shards; data shards are views of the object's
        # bytes (only a short last chunk is copied), parity lands in the given buffers.
        payload = bytearray(data)
        parity = [bytearray(b"\x5a" * rounded) for _ in range(m)]
        pieces = ecstripe.encode_pieces(fast, layout, payload, parity)
        assert [b"".join(bytes(piece) for piece in shard) for shard in pieces[:k]] == shards[:k]
        assert all(p[:layout.shard_bytes] == s and not any(p[layout.shard_bytes:])
                   for p, s in zip(parity, shards[k:]))
        assert [shard[0] for shard in pieces[k:]] == parity
        views = [piece for shard in pieces[:k] for piece in shard
                 if isinstance(piece, memoryview)]
        assert views and all(view.obj is payload for view in views)
        assert sum(view.nbytes for view in views) >= size - k * layout.unit
    offset, length = layout.clamp(*window)
    # Healthy: data shards only, no decoding.
    got = b"".join(shards[shard][start:start + n]
                   for shard, start, n in layout.data_extents(offset, length))
    assert all(shard < k for shard, _, _ in layout.data_extents(offset, length))
    assert got == data[offset:offset + length]
    # Degraded: any k shards, the stripes under the range only.
    kept = sorted(rng.sample(range(k + m), k))
    if length:
        first, last, start, span_bytes = layout.stripe_span(offset, length)
        spans = {i: shards[i][start:start + span_bytes] for i in kept}
        decoded = ecstripe.decode_span(fast, layout, first, last, spans)
        skip = offset - first * layout.stripe_bytes
        assert decoded[skip:skip + length] == data[offset:offset + length]
    # Recovery: the lost shards rebuilt byte-identical from k others.
    lost = [i for i in range(k + m) if i not in kept]
    rebuilt = ecstripe.rebuild_shards(fast, layout, {i: shards[i] for i in kept}, lost)
    assert rebuilt == {i: shards[i] for i in lost}


def test_clamp_cuts_reads_at_the_end_and_refuses_negatives():
    layout = ecstripe.Layout(4, 2, 4096, 80, 100)
    assert layout.clamp(90, 50) == (90, 10)
    assert layout.clamp(200, None) == (100, 0)
    with pytest.raises(ValueError, match="negative"):
        layout.clamp(-1, 5)
