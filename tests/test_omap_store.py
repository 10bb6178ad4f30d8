"""Omaps in the store: per-object sorted key/value tables (directory entries live in them).

Checked on every device twin: updates, pages, what put/rename/delete do to a table, atomicity,
persistence, fsck's orphan check, and a model-based run against a dict."""

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cairn.osd import records
from cairn.osd.errors import InvalidArgument, ObjectNotFound
from cairn.osd.fsck import fsck
from cairn.osd.records import ObjectRecord
from cairn.osd.store import Store, Transaction
from tests.helpers import run
from tests.test_store import assert_fsck_clean, fresh_store, memory_store

pytestmark = pytest.mark.unit


def test_updates_pages_and_conditions_of_listing(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.put("c", "dir", b"")
        assert store.omap_list("c", "dir") == ([], False)
        assert not store.stat("c", "dir").omap
        entries = {f"f{i:05d}".encode(): f"inode-{i}".encode() for i in range(2500)}
        items = list(entries.items())
        for start in range(0, len(items), 1000):
            await store.apply(Transaction().omap_update("c", "dir", items[start:start + 1000]))
        assert store.stat("c", "dir").omap
        # Pages by count, then by bytes; prefix; start_after.
        got, after = [], None
        while True:
            page, more = store.omap_list("c", "dir", start_after=after, limit=700)
            got.extend(page)
            if not more:
                break
            after = page[-1][0]
        assert got == sorted(items)
        page, more = store.omap_list("c", "dir", limit=5000, max_bytes=100)
        assert more and 1 <= len(page) <= 10
        page, more = store.omap_list("c", "dir", prefix=b"f0001")
        assert [k for k, _ in page] == [f"f0001{i}".encode() for i in range(10)] and not more
        page, _ = store.omap_list("c", "dir", prefix=b"f0001", start_after=b"f00015")
        assert [k for k, _ in page] == [f"f0001{i}".encode() for i in range(6, 10)]
        assert store.omap_get("c", "dir", [b"f00007", b"nope"]) == {b"f00007": b"inode-7"}
        # Remove some, set others, in one update; then clear and set.
        await store.apply(Transaction().omap_update("c", "dir", {b"new": b"1"},
                                                    remove=[b"f00000", b"absent"]))
        assert store.omap_get("c", "dir", [b"f00000", b"new"]) == {b"new": b"1"}
        await store.apply(Transaction().omap_update("c", "dir", {b"only": b"x"}, clear=True))
        assert store.omap_list("c", "dir") == ([(b"only", b"x")], False)
        # The data and attributes are untouched by omap updates, and a write keeps the omap.
        await store.write("c", "dir", 0, b"header")
        assert await store.read_bytes("c", "dir") == b"header"
        assert store.omap_list("c", "dir")[0] == [(b"only", b"x")]
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_put_rename_and_delete_carry_or_drop_the_table(open_twin, tmp_path):
    async def body():
        device, meta, store = await fresh_store(open_twin, tmp_path)
        await store.apply(Transaction().put("c", "a", b"A").omap_update("c", "a", {b"k": b"a"}))
        await store.apply(Transaction().put("c", "b", b"B").omap_update("c", "b", {b"k": b"b"}))
        # A rename carries the table and drops the replaced target's.
        await store.apply(Transaction().rename("c", "a", "c", "b"))
        assert store.omap_list("c", "b")[0] == [(b"k", b"a")]
        with pytest.raises(ObjectNotFound):
            store.omap_list("c", "a")
        await assert_fsck_clean(store)
        # A put replaces the object whole: an empty table.
        await store.put("c", "b", b"new")
        assert store.omap_list("c", "b") == ([], False)
        await store.apply(Transaction().omap_update("c", "b", {b"x": b"1"}))
        await assert_fsck_clean(store)
        await store.delete("c", "b")
        report = await assert_fsck_clean(store)
        assert report.objects == 0
        # An update of a missing object fails and changes nothing; bad keys are refused.
        with pytest.raises(ObjectNotFound):
            await store.apply(Transaction().omap_update("c", "gone", {b"k": b"v"}))
        for bad in ({b"": b"v"}, {b"k" * 2000: b"v"}, {"text": b"v"}, {b"k": "text"}):
            with pytest.raises(InvalidArgument):
                Transaction().omap_update("c", "x", bad)
        with pytest.raises(InvalidArgument):
            Transaction().omap_update("c", "x", {b"k%d" % i: b"v" * 60_000 for i in range(9)})
        await store.close()
        await device.aclose()
    run(body())


def test_a_failed_transaction_leaves_the_table_and_ids_are_never_reused(tmp_path):
    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.apply(Transaction().put("c", "d", b"").omap_update("c", "d", {b"k": b"1"}))
        with pytest.raises(ObjectNotFound):
            await store.apply(Transaction().omap_update("c", "d", {b"k": b"2"}, clear=True)
                              .delete("c", "missing"))
        assert store.omap_list("c", "d")[0] == [(b"k", b"1")]
        first_id = store._record("c", "d").omap_id
        await store.close()
        store = await Store.open(device, meta)
        assert store.omap_list("c", "d")[0] == [(b"k", b"1")]
        await store.apply(Transaction().put("c", "e", b"").omap_update("c", "e", {b"k": b"e"}))
        assert store._record("c", "e").omap_id > first_id
        await assert_fsck_clean(store)
        await store.close()
        await device.aclose()
    run(body())


def test_fsck_finds_orphaned_omap_entries_and_old_records_decode(tmp_path):
    async def body():
        device, meta, store = await memory_store(tmp_path)
        await store.apply(Transaction().put("c", "d", b"").omap_update("c", "d", {b"k": b"1"}))
        store._db.put(records.omap_key(999, b"stray"), b"x")
        report = await fsck(store)
        assert not report.clean
        assert any("omap id 999" in problem for problem in report.problems)
        await store.close()
        await device.aclose()
    run(body())
    # A record written before omaps existed has six fields and no table.
    old = msgpack.packb([5, 7, 9, [0, 1], b"\0" * 4, {"a": b"b"}], use_bin_type=True)
    record = ObjectRecord.decode(old)
    assert record.omap_id == 0 and record.size == 5 and record.attrs == {"a": b"b"}
    assert ObjectRecord.decode(record.encode()) == record
    record.omap_id = 3
    assert ObjectRecord.decode(record.encode()).omap_id == 3


KEYS = st.binary(min_size=1, max_size=4).map(lambda key: b"k" + key)
OPS = st.lists(st.one_of(
    st.tuples(st.just("update"), st.sampled_from(["a", "b"]),
              st.dictionaries(KEYS, st.binary(max_size=8), max_size=6),
              st.lists(KEYS, max_size=3), st.booleans()),
    st.tuples(st.just("put"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("rename"), st.sampled_from(["a", "b"]), st.sampled_from(["a", "b"])),
    st.tuples(st.just("delete"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("remount"),)), max_size=25)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_tables_follow_a_model(tmp_path_factory, ops):
    """Random updates, puts, renames, deletes and remounts against a dict per object."""
    tmp_path = tmp_path_factory.mktemp("omap")

    async def body():
        device, meta, store = await memory_store(tmp_path)
        model = {}                       # name -> {key: value}
        for op in ops:
            kind = op[0]
            if kind == "update":
                _, name, sets, removes, clear = op
                if name not in model:
                    with pytest.raises(ObjectNotFound):
                        await store.apply(Transaction().omap_update("c", name, sets, removes))
                    continue
                await store.apply(Transaction().omap_update("c", name, sets, removes, clear))
                table = {} if clear else model[name]
                for key in removes:
                    table.pop(key, None)
                table.update(sets)
                model[name] = table
            elif kind == "put":
                await store.put("c", op[1], b"x")
                model[op[1]] = {}
            elif kind == "rename":
                _, source, target = op
                if source not in model:
                    continue
                await store.apply(Transaction().rename("c", source, "c", target))
                model[target] = model.pop(source)
            elif kind == "delete":
                if op[1] in model:
                    await store.delete("c", op[1])
                    del model[op[1]]
            else:
                await store.close()
                store = await Store.open(device, meta)
            for name, table in model.items():
                page, more = store.omap_list("c", name, limit=1000)
                assert dict(page) == table and not more
        await assert_fsck_clean(store, deep=False)
        await store.close()
        await device.aclose()
    run(body())


# -- the omap op's parsing and conditions (osd/omap.py, what the primary runs) --------------------

def test_conditions_decide_and_bad_requests_are_refused_clearly():
    from cairn.common.messenger import RequestFailed
    from cairn.osd import omap

    request = omap.parse_update({"set": [[b"n", b"1"]], "remove": [b"old"], "create": True,
                                 "if": [["absent", b"n"], ["present", b"old"],
                                        ["equals", b"v", b"x"]], "if_version": 7})
    assert request.update.sets == ((b"n", b"1"),) and request.update.removes == (b"old",)
    assert request.keys_checked == [b"n", b"old", b"v"] and request.create
    omap.check_conditions(request, "d", 7, {b"old": b"", b"v": b"x"})
    for version, current in ((8, {b"old": b"", b"v": b"x"}),
                             (7, {b"n": b"", b"old": b"", b"v": b"x"}),
                             (7, {b"v": b"x"}), (7, {b"old": b"", b"v": b"y"})):
        with pytest.raises(RequestFailed) as failure:
            omap.check_conditions(request, "d", version, current)
        assert failure.value.code == "precondition"
    assert omap.parse_update({}).update.sets == ()
    empty = omap.parse_update({"if": [["none", b"d/"]]})
    assert empty.prefixes_checked == [b"d/"] and empty.keys_checked == []
    omap.check_conditions(empty, "d", 1, {}, [])
    with pytest.raises(RequestFailed):
        omap.check_conditions(empty, "d", 1, {}, [b"d/"])


@settings(max_examples=300, deadline=None)
@given(header=st.dictionaries(
    st.sampled_from(["set", "remove", "if", "if_version", "clear", "create", "keys",
                     "start_after", "prefix", "limit"]),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.binary(max_size=8),
                           st.text(max_size=4)),
                 lambda children: st.lists(children, max_size=3), max_leaves=8)))
def test_any_header_parses_or_is_refused_as_invalid(header):
    """Whatever a client sends, the parsers the OSD runs answer a request or `invalid`,
    never another exception."""
    from cairn.common.messenger import RequestFailed
    from cairn.osd import omap

    for parse in (omap.parse_update, omap.parse_keys, omap.parse_listing):
        try:
            parse(header)
        except RequestFailed as exc:
            assert exc.code == "invalid"
