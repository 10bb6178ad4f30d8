"""Pure cores of the store: allocator, extent arithmetic, records, superblock; and the layering
rule that cores and native code import no I/O of their own (STYLE.md 2.1)."""

import importlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cairn.osd import records
from cairn.osd.allocator import SEGMENT_BLOCKS, Allocator
from cairn.osd.errors import InvalidArgument, NotAStore
from cairn.osd.records import ObjectRecord
from cairn.native.checksum import crc32c
from cairn.osd import journal
from cairn.osd.superblock import Superblock

pytestmark = pytest.mark.unit


@given(st.lists(st.tuples(st.sampled_from(["reserve", "commit", "free", "unreserve"]),
                          st.integers(1, 40)), max_size=60),
       st.integers(50, 300))
@settings(max_examples=150, deadline=None)
def test_allocator_never_double_allocates(steps, block_count):
    """Random reserve/commit/free/unreserve sequences: reservations never overlap, counts stay
    exact, and the persisted form round-trips."""
    allocator = Allocator(block_count)
    reserved, committed = [], []
    for action, count in steps:
        if action == "reserve":
            extents = allocator.reserve(count)
            if extents is None:
                assert allocator.free_count < count
                continue
            assert sum(length for _, length in extents) == count
            reserved.append(extents)
        elif action == "commit" and reserved:
            extents = reserved.pop(0)
            allocator.commit(extents, [])
            committed.append(extents)
        elif action == "unreserve" and reserved:
            allocator.unreserve(reserved.pop())
        elif action == "free" and committed:
            extents = committed.pop(0)
            allocator.commit([], extents)
            allocator.release(extents)
        owned = np.zeros(block_count, dtype=np.int32)
        for group in reserved + committed:
            for start, length in group:
                owned[start:start + length] += 1
        assert owned.max(initial=0) <= 1
        assert (owned > 0).sum() == allocator.in_use_count
        assert allocator.committed_count == sum(length for group in committed
                                                for _, length in group)
    restored = Allocator(block_count)
    for index in range(allocator.segment_count):
        restored.load_segment(index, allocator.segment_bytes(index))
    restored.loaded()
    assert (restored.committed == allocator.committed).all()
    assert restored.committed_count == allocator.committed_count


def test_allocator_fragmented_and_full():
    allocator = Allocator(10)
    first = allocator.reserve(4)
    second = allocator.reserve(4)
    allocator.unreserve(first)
    # 6 free blocks but no run of 6: the allocation is split over runs.
    extents = allocator.reserve(6)
    assert sorted(extents) == [(0, 4), (8, 2)]
    assert allocator.reserve(1) is None
    assert second == [(4, 4)]


def test_allocator_segments_span():
    allocator = Allocator(SEGMENT_BLOCKS * 2 + 10)
    extents = allocator.reserve(SEGMENT_BLOCKS + 5)
    dirty = allocator.commit(extents, [])
    assert dirty == {0, 1}


extent_lists = st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 20)), max_size=8)


@given(extent_lists, st.data())
def test_slice_and_splice(extents, data):
    blocks = [start + i for start, length in extents for i in range(length)]
    total = len(blocks)
    first = data.draw(st.integers(0, total))
    count = data.draw(st.integers(0, total - first))
    sliced = records.slice_extents(extents, first, count)
    assert [s + i for s, n in sliced for i in range(n)] == blocks[first:first + count]
    new = [(5000, count + 2)]
    merged, replaced = records.splice_extents(extents, first, count, new)
    expect = blocks[:first] + list(range(5000, 5000 + count + 2)) + blocks[first + count:]
    assert [s + i for s, n in merged for i in range(n)] == expect
    assert [s + i for s, n in replaced for i in range(n)] == blocks[first:first + count]


def test_record_round_trip():
    record = ObjectRecord(size=5000, extents=((10, 1), (20, 1)), crcs=b"\x01" * 8,
                          attrs={"k": b"v"}, version=7, mtime_ns=123)
    assert ObjectRecord.decode(record.encode()) == record


def test_names_are_checked():
    with pytest.raises(InvalidArgument):
        records.check_object_name("")
    with pytest.raises(InvalidArgument, match="limit"):
        records.check_object_name("x" * 5000)
    with pytest.raises(InvalidArgument, match="NUL"):
        records.check_collection_name("a\x00b")
    with pytest.raises(InvalidArgument):
        records.check_attrs({"k": "not bytes"})


def test_superblock_round_trip_and_corruption():
    superblock = Superblock.new(1 << 30)
    raw = superblock.encode()
    assert len(raw) == 4096
    assert Superblock.decode(raw, "dev") == superblock
    damaged = bytearray(raw)
    damaged[20] ^= 1
    with pytest.raises(NotAStore, match="corrupt"):
        Superblock.decode(damaged, "dev")
    with pytest.raises(NotAStore, match="mkfs"):
        Superblock.decode(bytes(4096), "dev")


def test_superblock_sizes_the_journal_and_reads_format_1():
    """Format 2 keeps the commit journal between 1 MiB and the data start (1/32 of the
    device, at most 64 MiB); a tiny device or journal=False gets none; a format 1 superblock
    (no journal) still decodes, and one whose data start is not 1 MiB is refused."""
    import struct
    from cairn.osd import superblock as sb
    assert Superblock.new(8 << 30).journal_bytes == 64 << 20
    assert Superblock.new(8 << 20).journal_bytes == 256 << 10
    assert Superblock.new(2 << 20).journal_bytes == 0
    assert Superblock.new(8 << 30, journal=False).journal_bytes == 0
    big = Superblock.new(8 << 30)
    assert big.data_start_bytes == sb.DATA_START_BYTES + (64 << 20)
    assert Superblock.decode(big.encode(), "dev") == big
    old = Superblock(uuid=big.uuid, device_size_bytes=8 << 30, format_version=1)
    assert Superblock.decode(old.encode(), "dev").journal_bytes == 0
    bad = Superblock(uuid=big.uuid, device_size_bytes=8 << 30, format_version=1,
                     data_start_bytes=big.data_start_bytes).encode()
    with pytest.raises(NotAStore, match="data start"):
        Superblock.decode(bad, "dev")
    future = bytearray(big.encode())
    struct.pack_into("<I", future, 8, 3)
    struct.pack_into("<I", future, 48, crc32c(bytes(future[:48])))
    with pytest.raises(NotAStore, match="version 3 is not supported"):
        Superblock.decode(future, "dev")


def test_journal_scan_takes_whole_consecutive_records_across_a_wrap():
    """scan() follows records and wrap markers from a start position, and stops at a torn
    record, one of another store, one left from an earlier lap, or a sequence gap."""
    ring = 64 << 10
    uuid, other = b"u" * 16, b"v" * 16
    region = bytearray(ring)

    def put(record, position):
        region[position % ring:position % ring + len(record)] = record

    ops = [[journal.PUT, b"Ok", b"v" * 5000], [journal.DELETE, b"Ox"]]
    first = journal.encode(journal.KIND_GROUP, uuid, 56 << 10, 7, 8, journal.encode_payload(ops))
    assert len(first) == 8 << 10                     # ends at the ring's end exactly
    put(first, 56 << 10)
    lap = ring + (0 << 10)
    second = journal.encode(journal.KIND_GROUP, uuid, lap, 9, 9, journal.encode_payload([]))
    put(second, lap)
    found = journal.scan(region, ring, 56 << 10, 7, uuid)
    assert [(r.position, r.first, r.last) for r in found] == [(56 << 10, 7, 8), (lap, 9, 9)]
    assert found[0].ops == ops and found[1].end == lap + 4096
    assert journal.scan(region, ring, 56 << 10, 6, uuid) == []          # a sequence gap
    assert journal.scan(region, ring, 56 << 10, 7, other) == []         # another store
    assert journal.scan(region, ring, (56 << 10) - ring, 7, uuid) == []   # an earlier lap
    torn = bytearray(region)
    torn[(56 << 10) + 3000] ^= 1
    assert journal.scan(torn, ring, 56 << 10, 7, uuid) == []
    # A record that does not fit before the ring's end goes after a wrap marker.
    ring_state = journal.Ring(ring, 60 << 10)
    assert ring_state.place(8 << 10) == (ring, 4 << 10)
    region[60 << 10:(60 << 10) + 4096] = journal.encode(journal.KIND_WRAP, uuid, 60 << 10, 3, 3)
    put(journal.encode(journal.KIND_GROUP, uuid, ring, 3, 3, journal.encode_payload([])), ring)
    assert [r.position for r in journal.scan(region, ring, 60 << 10, 3, uuid)] == [ring]
    # The ring refuses what would overwrite records a checkpoint has not covered yet.
    ring_state.tail = ring_state.head - ring + (8 << 10)
    assert ring_state.place(8 << 10) is None


FORBIDDEN = {"asyncio", "socket", "os", "random", "time", "subprocess"}
CORES = ["cairn.osd.allocator", "cairn.osd.records", "cairn.osd.superblock", "cairn.osd.journal",
         "cairn.common.units", "cairn.common.hedge", "cairn.common.limits",
         "cairn.common.placement",
         "cairn.common.clustermap", "cairn.common.config", "cairn.common.frame",
         "cairn.mon.failure", "cairn.mon.health", "cairn.osd.heartbeat", "cairn.mon.raft",
         "cairn.osd.peering", "cairn.osd.ecstripe", "cairn.native.erasure", "cairn.osd.pg",
         "cairn.osd.scrub", "cairn.osd.txn", "cairn.mon.peerguard", "cairn.common.codes",
         "cairn.mon.raft_types", "cairn.mon.throughput"]


@pytest.mark.parametrize("module", CORES)
def test_cores_import_no_io(module):
    """A core must not import asyncio, socket, os, random or time itself, nor pull asyncio in
    through anything it uses (STYLE.md 2.1, 'Guard the boundary'). The check on `socket` is on
    the source: the crc32c package itself imports socket."""
    code = f"import sys, {module}; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False", f"{module} pulls in asyncio"
    source = open(importlib.import_module(module).__file__).read()
    for line in source.splitlines():
        words = line.split()
        if words[:1] in (["import"], ["from"]) and len(words) > 1:
            assert words[1].split(".")[0] not in FORBIDDEN, f"{module}: {line}"


def test_native_imports_nothing_of_ours():
    code = ("import sys, cairn.native; "
            "print(sorted(m for m in sys.modules if m.startswith('cairn.') "
            "and not m.startswith('cairn.native')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_block_size_is_a_multiple_of_direct_io_alignment():
    from cairn.common.limits import BLOCK_SIZE_BYTES
    from cairn.native.bufpool import ALIGN_BYTES
    assert BLOCK_SIZE_BYTES % ALIGN_BYTES == 0


def test_buffers_from_64_kib_up_are_reclaimed_when_dropped_and_smaller_ones_pooled_on_put():
    from cairn.native.bufpool import SLAB_CLASS_MIN_BYTES, BufferPool, _buffer_address
    pool = BufferPool()
    addresses = set()
    for _ in range(500):
        view = pool.get(SLAB_CLASS_MIN_BYTES)
        view[::4096] = b"x" * (SLAB_CLASS_MIN_BYTES // 4096)
        addresses.add(_buffer_address(view))
        del view                             # no put(): a read sent as it is, say
    stats = pool.statistics()
    assert len(addresses) == 1 and stats["allocated_total"] == 32      # one slab's buffers
    assert stats["reused_total"] == 499
    held = [pool.get(SLAB_CLASS_MIN_BYTES) for _ in range(40)]   # more than one slab at once
    assert len({_buffer_address(view) for view in held}) == 40
    assert pool.statistics()["slab_bytes_total"] == 2 * 32 * SLAB_CLASS_MIN_BYTES
    small = pool.get(SLAB_CLASS_MIN_BYTES // 2)
    address = _buffer_address(small)
    pool.put(small)
    assert _buffer_address(pool.get(SLAB_CLASS_MIN_BYTES // 2)) == address


def test_large_buffers_come_from_aligned_slabs_and_are_reclaimed_when_dropped():
    import gc
    from cairn.native.bufpool import HUGE_PAGE_BYTES, BufferPool, _buffer_address, is_aligned
    pool = BufferPool()
    views = [pool.get(1 << 20) for _ in range(3)] + [pool.get(3 << 20)]
    assert [len(view) for view in views] == [1 << 20] * 3 + [3 << 20]
    addresses = [_buffer_address(view) for view in views]
    assert all(address % (1 << 20) == 0 for address in addresses[:3])
    assert addresses[3] % HUGE_PAGE_BYTES == 0 and all(is_aligned(view) for view in views)
    spans = sorted((address, address + len(view)) for address, view in zip(addresses, views))
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))   # no overlap
    for index, view in enumerate(views):
        view[:] = bytes([index]) * len(view)
    assert all(bytes(view[:1]) == bytes([index]) for index, view in enumerate(views))
    slabs = pool.statistics()["slab_bytes_total"]
    free_before = pool.statistics()["free_large"][1 << 20]
    pool.put(views[0])                       # returned: reused by the next get
    assert pool.statistics()["free_large"][1 << 20] == free_before + 1
    again = pool.get(1 << 20)
    assert _buffer_address(again) == addresses[0]
    sliced = views[1][4096:8192]             # forgotten, along with a slice of it
    del views[1], sliced
    gc.collect()
    assert pool.statistics()["free_large"][1 << 20] == free_before + 1
    assert pool.statistics()["lent_large"] == 3
    assert pool.statistics()["slab_bytes_total"] == slabs      # no new slab was needed


MUTATING_METHODS = {"add", "append", "clear", "discard", "pop", "remove", "update",
                    "difference_update", "setdefault", "extend", "insert"}


def core_field_writes(source):
    """(line, text) of every statement in `source` that changes a field of a PG's core from
    outside it: `x.core.f = ...`, `x.core.f += ...`, `x.core.f[k] = ...`, `del x.core.f[k]`,
    `x.core.f.add(...)` and the other mutating methods of a set, dict, list or deque."""
    import ast

    def field_of_core(node):
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "core"
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if field_of_core(target):
                found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in MUTATING_METHODS and field_of_core(node.func.value):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_pg_shell_never_changes_its_core_s_fields():
    """A `Pg` holds its `PgCore` (osd/pgs.py); what happens to the PG reaches the core as a
    call of one of its methods, never as an assignment from the shell code (issue 40). The
    checker itself is checked on a planted write of each kind."""
    import pathlib
    planted = ("pg.core.removing = True\npg.core.remaining[t] -= 1\n"
               "pg.core.damaged.add(n)\ndel pg.core.missing[n]\npg.core.applied(v, True)\n")
    assert sorted(line for line, _ in core_field_writes(planted)) == [1, 2, 3, 4]
    package = pathlib.Path(records.__file__).resolve().parents[1]
    writes = []
    for path in sorted(package.glob("osd/*.py")):
        if path.name != "pg.py":
            writes += [f"{path.name}:{line}: {text}"
                       for line, text in core_field_writes(path.read_text())]
    assert not writes, "\n".join(writes)
