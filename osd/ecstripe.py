"""Where the bytes of an erasure-coded object live in its shards (pure: no I/O).

An object of `size` bytes is cut into stripes of `k * unit` bytes (the last one shorter). Each
stripe is encoded on its own (native/erasure.py) into k + m fragments: a `header` of
`header_bytes` then a payload of `unit` bytes (for the last stripe, ceil(rest / k) bytes). Shard i
of the object, stored on the acting member at position i, is fragment i of every stripe, one after
another. Every fragment but the last is full, so stripe s starts at `s * (header + unit)` in every
shard.

Why stripes of a few MiB and not the whole object: encoding touches every byte k + m times in
cache; ISA-L ran 18+6 at about 11 GB/s on 4 MiB and 3.3 GB/s on 64 MiB (docs/DESIGN.md). And a
degraded read of a range decodes only the stripes under it.

The code is systematic, so the payload of fragment j < k is the stripe's bytes
`[j * p, (j + 1) * p)` (p the payload length): a healthy read copies those out of the data shards
(`data_extents`) and never decodes. A degraded read fetches the same byte range of the stripes
under the range from any k shards (`stripe_span`) and decodes each stripe.

The unit is chosen per object at write time (`unit_for(k)`, a multiple of 4 KiB near 4 MiB / k)
and stored with every shard, so changing the default never misreads old objects.
"""

import dataclasses

STRIPE_BYTES_TARGET = 4 << 20
UNIT_ALIGN_BYTES = 4096


def unit_for(k):
    """The stripe unit (payload bytes per shard per full stripe) for k data shards."""
    assert k >= 1, k
    return max(UNIT_ALIGN_BYTES, STRIPE_BYTES_TARGET // k // UNIT_ALIGN_BYTES * UNIT_ALIGN_BYTES)


@dataclasses.dataclass(frozen=True)
class Layout:
    k: int
    m: int
    unit: int               # payload bytes per shard of a full stripe
    header_bytes: int       # the codec's header before each fragment's payload
    size: int               # the object's bytes

    def __post_init__(self):
        assert self.k >= 1 and self.m >= 1, (self.k, self.m)
        assert self.unit >= 1 and self.header_bytes >= 0 and self.size >= 0

    @property
    def stripe_bytes(self):
        return self.k * self.unit

    @property
    def stripe_count(self):
        return -(-self.size // self.stripe_bytes)

    def stripe_data_bytes(self, stripe_index):
        """The object bytes in stripe `stripe_index`."""
        assert 0 <= stripe_index < self.stripe_count, stripe_index
        return min(self.stripe_bytes, self.size - stripe_index * self.stripe_bytes)

    def payload_bytes(self, stripe_index):
        return -(-self.stripe_data_bytes(stripe_index) // self.k)

    def fragment_bytes(self, stripe_index):
        return self.header_bytes + self.payload_bytes(stripe_index)

    def fragment_offset(self, stripe_index):
        """Where stripe `stripe_index`'s fragment starts in every shard."""
        return stripe_index * (self.header_bytes + self.unit)

    @property
    def shard_bytes(self):
        """The length of every shard of the object (all shards are the same length)."""
        if self.stripe_count == 0:
            return 0
        last = self.stripe_count - 1
        return self.fragment_offset(last) + self.fragment_bytes(last)

    def stripes(self):
        """[(stripe index, object offset, data bytes)] of the whole object."""
        return [(s, s * self.stripe_bytes, self.stripe_data_bytes(s))
                for s in range(self.stripe_count)]

    def clamp(self, offset, length):
        """(offset, length) of a read, cut to the object: a read past the end is short."""
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"offset and length must not be negative (were {offset}, {length})")
        offset = min(offset, self.size)
        end = self.size if length is None else min(self.size, offset + length)
        return offset, end - offset

    def data_extents(self, offset, length):
        """[(shard index, shard offset, bytes)] holding object bytes [offset, offset + length)
        in order, all in data shards (a healthy read). The range must be within the object."""
        assert 0 <= offset and offset + length <= self.size, (offset, length, self.size)
        extents = []
        position, end = offset, offset + length
        while position < end:
            stripe = position // self.stripe_bytes
            within = position - stripe * self.stripe_bytes
            payload = self.payload_bytes(stripe)
            shard = within // payload
            assert shard < self.k, (shard, self.k)
            start = within - shard * payload
            take = min(payload - start, end - position)
            shard_offset = self.fragment_offset(stripe) + self.header_bytes + start
            if extents and extents[-1][0] == shard and \
                    extents[-1][1] + extents[-1][2] == shard_offset:
                extents[-1] = (shard, extents[-1][1], extents[-1][2] + take)
            else:
                extents.append((shard, shard_offset, take))
            position += take
        return extents

    def stripe_span(self, offset, length):
        """(first stripe, last stripe, shard offset, shard bytes): the stripes under object
        bytes [offset, offset + length) (not empty) and the byte range they take in any shard."""
        assert 0 <= offset and 0 < length and offset + length <= self.size, (offset, length)
        first = offset // self.stripe_bytes
        last = (offset + length - 1) // self.stripe_bytes
        start = self.fragment_offset(first)
        return first, last, start, self.fragment_offset(last) + self.fragment_bytes(last) - start

    def split_fragments(self, first, last):
        """[(stripe index, start, end)] of each stripe's fragment within the span of a shard
        that `stripe_span` gave for stripes first..last."""
        base = self.fragment_offset(first)
        return [(s, self.fragment_offset(s) - base,
                 self.fragment_offset(s) - base + self.fragment_bytes(s))
                for s in range(first, last + 1)]


def encode_shards(codec, layout, data, shards=None):
    """The k + m shards of an object: fragment i of every stripe, in order. Written into
    `shards` if given (k + m writable buffers of at least `layout.shard_bytes`, such as a buffer
    pool's whole-block buffers: what follows the shard is zeroed, so it goes to the device and
    the network as it is), else into new bytearrays."""
    assert len(data) == layout.size and codec.k == layout.k and codec.m == layout.m
    assert codec.header_bytes == layout.header_bytes
    if shards is None:
        shards = [bytearray(layout.shard_bytes) for _ in range(layout.k + layout.m)]
    assert len(shards) == layout.k + layout.m
    view = memoryview(data).cast("B")
    for stripe, start, data_bytes in layout.stripes():
        codec.encode_into(shards, layout.fragment_offset(stripe), view[start:start + data_bytes])
    _zero_tails(shards, layout.shard_bytes)
    return shards


def _zero_tails(buffers, shard_bytes):
    """Zero what follows the shard in each buffer, so it goes to the device and the network as
    it is."""
    for buffer in buffers:
        tail = memoryview(buffer)[shard_bytes:]
        if tail.nbytes:
            tail[:] = bytes(tail.nbytes)


def encode_pieces(codec, layout, data, parity):
    """The k + m shards of an object, each a tuple of pieces whose concatenation is the shard,
    without copying the object's bytes (`codec.native` only; the object is not empty). A data
    shard is its fragments' headers and views of `data`; parity shard j is written into
    `parity[j]` (m writable buffers of at least `layout.shard_bytes`, what follows the shard
    zeroed) and is `(parity[j],)`."""
    assert codec.native and layout.size > 0 and len(data) == layout.size
    assert codec.k == layout.k and codec.m == layout.m and len(parity) == layout.m
    assert codec.header_bytes == layout.header_bytes
    pieces = [[] for _ in range(layout.k)]
    view = memoryview(data).cast("B")
    for stripe, start, data_bytes in layout.stripes():
        fragments = codec.encode_pieces(view[start:start + data_bytes], parity,
                                        layout.fragment_offset(stripe))
        for shard, fragment in zip(pieces, fragments, strict=True):
            shard.extend(fragment)
    _zero_tails(parity, layout.shard_bytes)
    return [tuple(shard) for shard in pieces] + [(buffer,) for buffer in parity]


def decode_span(codec, layout, first, last, spans):
    """The object bytes of stripes first..last from {shard index: its span of bytes}, as
    `stripe_span` gave them (any k shards). Raises the codec's NotEnoughFragments or
    BadFragment."""
    pieces = []
    for stripe, start, end in layout.split_fragments(first, last):
        fragments = {shard: memoryview(span)[start:end] for shard, span in spans.items()}
        pieces.append(codec.decode(fragments, layout.stripe_data_bytes(stripe)))
    return b"".join(pieces)


def rebuild_shards(codec, layout, shards, wanted):
    """{shard index: whole shard} for the shards in `wanted`, from any k whole shards
    ({shard index: bytes}): each stripe is decoded and encoded again."""
    assert not set(wanted) & set(shards), (wanted, sorted(shards))
    parts = {shard: [] for shard in wanted}
    for stripe, start, end in layout.split_fragments(0, layout.stripe_count - 1) \
            if layout.stripe_count else ():
        fragments = {shard: memoryview(data)[start:end] for shard, data in shards.items()}
        stripe_data = codec.decode(fragments, layout.stripe_data_bytes(stripe))
        encoded = codec.encode(stripe_data)
        for shard in wanted:
            parts[shard].append(encoded[shard])
    return {shard: b"".join(pieces) for shard, pieces in parts.items()}


def parity_mismatches(codec, layout, shards):
    """The parity shard indices whose bytes differ from a fresh encoding of the data shards
    (`shards`: every shard, whole, in index order)."""
    assert len(shards) == layout.k + layout.m
    header = layout.header_bytes
    bad = set()
    for stripe, start, end in layout.split_fragments(0, layout.stripe_count - 1) \
            if layout.stripe_count else ():
        data = b"".join(bytes(memoryview(shards[j])[start + header:end]) for j in range(layout.k))
        encoded = codec.encode(data[:layout.stripe_data_bytes(stripe)])
        for index in range(layout.k, layout.k + layout.m):
            if memoryview(encoded[index])[header:] != memoryview(shards[index])[start + header:end]:
                bad.add(index)
    return sorted(bad)
