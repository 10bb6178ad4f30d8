"""Erasure coding: pyeclib against the numpy reference twin, and the stripe layout.

Goal: the shipped codec (pyeclib, ISA-L Cauchy) produces exactly the parity a plainly written
Reed-Solomon over GF(2^8) produces, and both give back every byte from any k fragments; the
layout puts object bytes where a healthy read looks for them and decodes degraded ranges and
rebuilt shards right for every size, including 0 and 1 byte. Method: hypothesis draws the
profile (any k + m up to 18 + 6), the data and the lost fragments.
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
    fragments = fast.encode(data)
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
