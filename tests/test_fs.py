"""The file namespace (client/fs.py) on a real cluster: POSIX behaviour and errno of each op,
files over many stripes and on an erasure-coded data pool, two clients, renames across
directories finished by readers, fsck, and random op sequences checked against a model."""

import errno
import os
import stat

import msgpack
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cairn.client import errors, fs_format as fsmod
from cairn.client.fs import Filesystem
from cairn.client.fs_format import STRIPE_BYTES
from cairn.client.fs_check import check
from cairn.client.sync import connect

pytestmark = pytest.mark.cluster

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


def make_cluster(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1, device_size="512M", config=FAST)
    cluster.cairn("pool", "create", "meta", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "data", "--erasure", "2+1", "--pg-num", "8")
    return cluster


def expect(code, call):
    with pytest.raises(OSError) as failure:
        call()
    assert failure.value.errno == code, failure.value


def test_posix_behaviour_errno_and_two_clients(local_cluster):
    cluster = make_cluster(local_cluster)
    with connect(cluster.dir) as one, connect(cluster.dir) as two:
        a = one.call(Filesystem.open(one._cluster, "data", metadata_pool="meta"))
        b = two.call(Filesystem.open(two._cluster, "data", metadata_pool="meta"))
        run_a, run_b = one.call, two.call

        def write(fs, call, path, data, mode="wb"):
            async def go():
                async with await fs.open_path(path, mode) as f:
                    await f.write(data)
            call(go())

        def read(fs, call, path, offset=0, size=-1):
            async def go():
                async with await fs.open_path(path, "rb") as f:
                    return await f.read(size, offset)
            return call(go())

        run_a(a.makedirs("/ckpt/step-1"))
        big = os.urandom(2 * STRIPE_BYTES + 12345)
        write(a, run_a, "/ckpt/step-1/model.pt", big)
        assert read(b, run_b, "/ckpt/step-1/model.pt") == big          # the other client
        assert read(b, run_b, "/ckpt/step-1/model.pt", STRIPE_BYTES - 5, 10) == \
            big[STRIPE_BYTES - 5:STRIPE_BYTES + 5]
        assert run_b(b.stat("/ckpt/step-1/model.pt")).size == len(big)

        # Overwrite in the middle, extend with a hole, truncate.
        async def patch():
            async with await a.open_path("/ckpt/step-1/model.pt", "r+b") as f:
                await f.write(b"X" * 100, offset=STRIPE_BYTES - 50)
                await f.write(b"tail", offset=len(big) + 1000)
        run_a(patch())
        model = bytearray(big)
        model[STRIPE_BYTES - 50:STRIPE_BYTES + 50] = b"X" * 100
        model += bytes(1000) + b"tail"
        assert read(b, run_b, "/ckpt/step-1/model.pt") == bytes(model)
        ino, _ = run_a(a.resolve("/ckpt/step-1/model.pt"))
        run_a(a.setattr(ino, size=STRIPE_BYTES + 7))
        assert read(b, run_b, "/ckpt/step-1/model.pt") == bytes(model[:STRIPE_BYTES + 7])
        run_a(a.setattr(ino, size=STRIPE_BYTES + 20))            # grows with zeros, not old bytes
        assert read(a, run_a, "/ckpt/step-1/model.pt") == \
            bytes(model[:STRIPE_BYTES + 7]) + bytes(13)

        # errno of each error case.
        expect(errno.ENOENT, lambda: run_a(a.stat("/nope")))
        expect(errno.ENOENT, lambda: run_a(a.open_path("/nope/x", "wb")))
        expect(errno.EEXIST, lambda: run_a(a.mkdir_path("/ckpt")))
        expect(errno.EEXIST, lambda: run_a(a.open_path("/ckpt/step-1/model.pt", "xb")))
        expect(errno.ENOTEMPTY, lambda: run_a(a.rmdir_path("/ckpt")))
        expect(errno.ENOTDIR, lambda: run_a(a.listdir("/ckpt/step-1/model.pt")))
        expect(errno.ENOTDIR, lambda: run_a(a.stat("/ckpt/step-1/model.pt/x")))
        expect(errno.ENOTDIR, lambda: run_a(a.rmdir_path("/ckpt/step-1/model.pt")))
        expect(errno.EISDIR, lambda: run_a(a.unlink_path("/ckpt")))
        expect(errno.EISDIR, lambda: run_a(a.open_path("/ckpt", "rb")))
        expect(errno.EINVAL, lambda: run_a(a.rename_path("/ckpt", "/ckpt/step-1/inside")))
        expect(errno.ENAMETOOLONG, lambda: run_a(a.mkdir_path("/" + "n" * 256)))

        # Renames: within a directory, across, over a file (atomic replace), a non-empty
        # directory, and over an empty / non-empty directory.
        write(a, run_a, "/ckpt/a", b"a")
        write(a, run_a, "/ckpt/b", b"bb")
        run_a(a.rename_path("/ckpt/a", "/ckpt/b"))
        assert read(b, run_b, "/ckpt/b") == b"a" and not run_b(b.exists("/ckpt/a"))
        run_b(b.rename_path("/ckpt/step-1", "/ckpt/step-2"))
        assert read(a, run_a, "/ckpt/step-2/model.pt")[:10] == bytes(model[:10])
        run_a(a.makedirs("/other/empty"))
        run_a(a.rename_path("/ckpt/b", "/other/b"))                 # across directories
        assert run_b(b.listdir("/other")) == ["b", "empty"]
        assert "b" not in run_b(b.listdir("/ckpt"))
        run_a(a.rename_path("/ckpt/step-2", "/other/empty"))         # over an empty directory
        assert run_b(b.listdir("/other/empty")) == ["model.pt"]
        run_a(a.mkdir_path("/ckpt/full"))
        write(a, run_a, "/ckpt/full/x", b"x")
        run_a(a.mkdir_path("/ckpt/d2"))
        expect(errno.ENOTEMPTY, lambda: run_a(a.rename_path("/ckpt/d2", "/ckpt/full")))
        expect(errno.EISDIR, lambda: run_a(a.rename_path("/other/b", "/ckpt/full")))
        expect(errno.ENOTDIR, lambda: run_a(a.rename_path("/ckpt/d2", "/other/b")))
        assert run_a(a.stat("/other/empty")).get("p") == run_a(a.resolve("/other"))[0]

        # Symlinks.
        run_a(a.symlink_path("/other/empty/model.pt", "/link"))
        assert read(b, run_b, "/link", 0, 10) == bytes(model[:10])
        assert run_b(b.stat("/link", follow=False)).kind == "l"
        run_a(a.symlink_path("empty", "/other/rel"))
        assert run_b(b.listdir("/other/rel")) == ["model.pt"]

        # unlink and rmdir remove the data too; what is left is consistent.
        data_ino, _ = run_a(a.resolve("/other/empty/model.pt"))
        run_a(a.unlink_path("/other/empty/model.pt"))
        names, _ = run_a(a.data.list(prefix=f"f.{data_ino:016x}."))
        assert names == []
        run_a(a.rmdir_path("/other/empty"))
        expect(errno.ENOENT, lambda: run_a(a.stat("/other/empty")))
        report = run_a(check(a, grace_s=0))
        assert report.clean, report.errors
        assert (report.files, report.directories, report.symlinks) == (2, 5, 2), report


def test_a_sparse_file_costs_what_it_holds_and_efbig_lies_past_the_largest(local_cluster):
    """A file truncated to 1 PiB, or written one byte below it, is removed in well under a
    second (its few stripes are listed and deleted, not 268 million indices); a truncate from
    there deletes the far stripe it held; writes and truncates past FILE_BYTES_MAX fail with
    EFBIG and change nothing."""
    import time
    cluster = make_cluster(local_cluster)
    pib = 1 << 50
    with connect(cluster.dir) as client:
        fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
        run = client.call

        def stripes(ino):
            return sorted(int(name.rsplit(".", 1)[1], 16) for name in
                          run(fs.data.list(prefix=fsmod.stripe_prefix(ino)))[0])

        async def sparse(path, far_byte):
            async with await fs.open_path(path, "wb") as f:
                await f.write(b"head")
                if far_byte:
                    await f.write(b"x", pib - 1)
                else:
                    await f.truncate(pib)
            return (await fs.resolve(path))[0]

        for far_byte in (False, True):
            ino = run(sparse("/sparse", far_byte))
            assert run(fs.stat("/sparse")).size == pib
            assert stripes(ino) == ([0, (pib - 1) // STRIPE_BYTES] if far_byte else [0])
            began = time.monotonic()
            run(fs.unlink_path("/sparse"))
            assert time.monotonic() - began < 1.0
            assert stripes(ino) == []

        ino = run(sparse("/shrunk", far_byte=True))
        run(fs.setattr(ino, size=10))               # no handle open: the namespace truncates
        assert stripes(ino) == [0] and run(fs.stat("/shrunk")).size == 10

        async def past_the_largest():
            async with await fs.open_path("/shrunk", "r+b") as f:
                with pytest.raises(OSError) as failure:
                    await f.write(b"y", fsmod.FILE_BYTES_MAX)
                assert failure.value.errno == errno.EFBIG
                with pytest.raises(OSError) as failure:
                    await f.truncate(fsmod.FILE_BYTES_MAX + 1)
                assert failure.value.errno == errno.EFBIG
                await f.write(b"z", fsmod.FILE_BYTES_MAX - 1)       # the last byte there is
        run(past_the_largest())
        expect(errno.EFBIG, lambda: run(fs.setattr(ino, size=fsmod.FILE_BYTES_MAX + 1)))
        assert run(fs.stat("/shrunk")).size == fsmod.FILE_BYTES_MAX
        run(fs.unlink_path("/shrunk"))
        assert stripes(ino) == []
        report = run(check(fs, grace_s=0))
        assert report.clean, report.errors


def test_small_files_keep_their_bytes_in_their_inodes_and_move_out_when_they_grow(
        local_cluster):
    """A file of at most INLINE_BYTES_MAX bytes has no stripe: its bytes are beside its inode
    in its directory, written with its size and read with its attributes (no data-pool op
    either way), through
    hard links and renames across directories; a write or truncate past the threshold moves
    them to stripe 0, open or closed; random writes and truncates around the threshold, through
    a handle and on the closed file, always read back as a bytearray model says; fsck clean."""
    cluster = make_cluster(local_cluster)
    limit = fsmod.INLINE_BYTES_MAX
    with connect(cluster.dir) as client:
        fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
        run = client.call

        def stripes(path):
            ino = run(fs.resolve(path))[0]
            return sorted(int(name.rsplit(".", 1)[1], 16) for name in
                          run(fs.data.list(prefix=fsmod.stripe_prefix(ino)))[0])

        async def write(path, payload, mode="wb", offset=None):
            async with await fs.open_path(path, mode) as f:
                await f.write(payload, offset)

        async def read(path):
            async with await fs.open_path(path, "rb") as f:
                return await f.read()

        small = os.urandom(limit)
        run(write("/small", small))
        assert stripes("/small") == []
        get_view = fs.data.get_view

        async def no_data_op(*args, **kwargs):
            raise AssertionError("a read of a small file went to the data pool")
        fs.data.get_view = no_data_op
        try:
            assert run(read("/small")) == small
        finally:
            fs.data.get_view = get_view
        assert run(fs.stat("/small")).size == limit
        assert run(fs.stat("/small")).inline

        # Hard link and a rename into another directory carry the bytes along.
        run(fs.mkdir_path("/d"))
        run(fs.link(run(fs.resolve("/small"))[0], run(fs.resolve("/d"))[0], "linked"))
        run(fs.rename_path("/small", "/d/moved"))
        assert run(read("/d/linked")) == small == run(read("/d/moved"))
        assert stripes("/d/moved") == []

        # One byte past the threshold through a handle: stripe 0, the inode's copy gone.
        run(write("/d/moved", b"+", "r+b", offset=limit))
        assert stripes("/d/moved") == [0] and not run(fs.stat("/d/moved")).inline
        assert run(read("/d/linked")) == small + b"+"

        # Closed-file truncates: cut in the inode; grown past the threshold: out to stripe 0.
        run(write("/t", b"abcdef"))
        ino = run(fs.resolve("/t"))[0]
        run(fs.setattr(ino, size=3))
        assert run(read("/t")) == b"abc" and stripes("/t") == []
        run(fs.setattr(ino, size=10))
        assert run(read("/t")) == b"abc" + bytes(7) and stripes("/t") == []
        run(fs.setattr(ino, size=limit + 100))
        assert run(read("/t")) == b"abc" + bytes(limit + 97) and stripes("/t") == [0]

        # Random writes and truncates around the threshold against a model.
        rng = __import__("random").Random(41)
        model = bytearray()
        run(write("/r", b""))
        ino = run(fs.resolve("/r"))[0]
        for step in range(60):
            choice = rng.random()
            if choice < 0.6:
                offset = rng.choice([0, len(model), rng.randrange(0, limit + 200)])
                payload = os.urandom(rng.choice([1, 10, 100, 1000, limit // 2]))
                run(write("/r", payload, "r+b", offset=offset))
                if len(model) < offset:
                    model.extend(bytes(offset - len(model)))
                model[offset:offset + len(payload)] = payload
            elif choice < 0.8:
                size = rng.randrange(0, limit + 300)
                async def cut(size=size):
                    async with await fs.open_path("/r", "r+b") as f:
                        await f.truncate(size)
                run(cut())
                del model[size:]
                model.extend(bytes(size - len(model)))
            else:
                size = rng.randrange(0, limit + 300)
                run(fs.setattr(ino, size=size))
                del model[size:]
                model.extend(bytes(size - len(model)))
            assert run(read("/r")) == bytes(model), f"step {step}"
            assert run(fs.stat("/r")).size == len(model)
        report = run(check(fs, grace_s=0))
        assert report.clean, report.errors


def test_unlinks_answered_early_land_in_order_and_report_what_failed(local_cluster):
    """With unlink_in_background (as a mount runs) an unlink of a file's only name returns
    before its update lands: the name is absent to this client at once, making it again, a
    listing and rmdir wait for the update, another client sees it gone once the directory is
    settled, the removed stripes go too; an unlink of a hard-linked file waits; an update
    that fails is reported by the directory's settle (its fsync) and the file is back."""
    cluster = make_cluster(local_cluster)
    with connect(cluster.dir) as one, connect(cluster.dir) as two:
        fs = one.call(Filesystem.open(one._cluster, "data", metadata_pool="meta"))
        other = two.call(Filesystem.open(two._cluster, "data", metadata_pool="meta"))
        fs.unlink_in_background = fs.purge_in_background = True
        run = one.call

        async def write(path, payload, mode="wb"):
            async with await fs.open_path(path, mode) as f:
                await f.write(payload)

        async def read(filesystem, path):
            async with await filesystem.open_path(path, "rb") as f:
                return await f.read()

        run(fs.mkdir_path("/d"))
        d = run(fs.resolve("/d"))[0]
        payloads = {f"f{i:02d}": os.urandom(100 if i % 2 else STRIPE_BYTES + 10)
                    for i in range(20)}
        for name, payload in payloads.items():
            run(write(f"/d/{name}", payload))
        big = [run(fs.resolve(f"/d/{name}"))[0] for name, payload in payloads.items()
               if len(payload) > 100]

        async def unlink_and_remake():
            answered = []
            for i, name in enumerate(payloads):
                await fs.unlink_path(f"/d/{name}")
                answered.append((d, name.encode()) in fs._unlinking)   # not landed yet
                with pytest.raises(FileNotFoundError):
                    await fs.stat(f"/d/{name}")
                if i < 5:                       # made again at once: waits for the unlink
                    await write(f"/d/{name}", b"again " + name.encode())
            return answered
        answered = run(unlink_and_remake())
        assert all(answered), answered
        assert sorted(run(fs.listdir("/d"))) == [f"f{i:02d}" for i in range(5)]
        run(fs.settle_dir(d, report=True))
        assert sorted(two.call(other.listdir("/d"))) == [f"f{i:02d}" for i in range(5)]
        assert two.call(read(other, "/d/f03")) == b"again f03"
        run(fs.drain_purges())
        held = run(fs.data.list(prefix=""))[0]
        assert not [name for name in held for ino in big
                    if name.startswith(fsmod.stripe_prefix(ino))]

        # A file with two names: its unlink counts the link down before it returns.
        run(write("/d/linked", b"two names"))
        run(fs.link(run(fs.resolve("/d/linked"))[0], d, "second"))
        run(fs.unlink_path("/d/linked"))
        assert not fs._unlinking and two.call(read(other, "/d/second")) == b"two names"

        # rmdir waits for the unlinks in the directory before it checks that it is empty.
        async def empty_and_remove():
            for name in await fs.listdir("/d"):
                await fs.unlink_path(f"/d/{name}")
            await fs.rmdir_path("/d")
        run(empty_and_remove())
        expect(errno.ENOENT, lambda: two.call(other.stat("/d")))

        # An update that fails after the answer: reported by the settle, the file back.
        run(fs.mkdir_path("/e"))
        run(write("/e/kept", b"kept"))
        e = run(fs.resolve("/e"))[0]
        update = fs.meta.omap_update

        async def refused(*args, **kwargs):
            raise errors.ClientError("refused by the test")
        fs.meta.omap_update = refused
        try:
            run(fs.unlink_path("/e/kept"))
            expect(errno.EIO, lambda: run(fs.settle_dir(e, report=True)))
        finally:
            fs.meta.omap_update = update
        run(fs.settle_dir(e, report=True))      # reported once
        assert run(read(fs, "/e/kept")) == b"kept"
        report = run(check(fs, grace_s=0))
        assert report.clean, report.errors


def test_a_rename_caught_midway_is_finished_by_readers_and_fsck_repairs(local_cluster):
    cluster = make_cluster(local_cluster)
    with connect(cluster.dir) as client:
        fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
        run = client.call
        run(fs.makedirs("/src"))
        run(fs.makedirs("/dst"))

        async def make(path, data):
            async with await fs.open_path(path, "wb") as f:
                await f.write(data)
        for name in ("one", "two", "three"):
            run(make(f"/src/{name}", name.encode()))
        src, _ = run(fs.resolve("/src"))
        dst, _ = run(fs.resolve("/dst"))

        async def crash_after(step, name):
            """Steps 1..step of a rename across directories, as a client killed then."""
            ino, kind, _, attr = await fs._lookup_entry(src, name)
            assert attr is not None             # a file made here is embedded in its entry
            key, dkey = fsmod.ENTRY_PREFIX + name.encode(), fsmod.ENTRY_PREFIX + name.encode()
            to_mark = fsmod._pack_entry(ino, kind, ["to", dst, name.encode(), 0.0])
            # Step 1 moves the inode into its record as it marks the entry.
            record = fsmod.embedded_home(ino)[1]
            await fs.meta.omap_update(fs.inode_object(src), {key: to_mark,
                                                             record: msgpack.packb(dict(attr))})
            if step >= 2:
                from_mark = fsmod._pack_entry(ino, kind, ["from", src, name.encode(), None])
                await fs.meta.omap_update(fs.inode_object(dst), {dkey: from_mark})
            if step >= 3:
                await fs.meta.omap_update(fs.inode_object(src), remove=[key])
        run(crash_after(1, "one"))          # only marked: rolled back (the mark is old)
        run(crash_after(2, "two"))          # both halves: finished
        run(crash_after(3, "three"))        # source gone: the target's mark cleared
        assert run(fs.listdir("/src")) == ["one"]
        assert run(fs.listdir("/dst")) == ["three", "two"]

        async def read(path):
            async with await fs.open_path(path, "rb") as f:
                return await f.read()
        assert run(read("/src/one")) == b"one" and run(read("/dst/two")) == b"two"
        report = run(check(fs, grace_s=0))
        assert report.clean, report.errors

        # Damage fsck finds and repairs: an orphaned inode with data, a dangling entry, an
        # interrupted rmdir, a directory whose parent pointer is wrong.
        async def damage():
            orphan = await fs._new_inode(fs._new_attr("f", 0o644, None, None, s=5))
            await fs.data.put(fs.stripe_object(orphan, 0), b"hello")
            await fs.meta.omap_update(fs.inode_object(dst), {
                fsmod.ENTRY_PREFIX + b"ghost": fsmod._pack_entry(12345, "f")})
            gone = await fs.mkdir(dst, "gone")
            await fs.meta.omap_update(fs.inode_object(gone), {fsmod.DEAD_KEY: b"1"})

            def wrong(attr):
                attr["p"] = dst
            await fs._set_attr(src, wrong)
            return orphan
        orphan = run(damage())
        report = run(check(fs, grace_s=0))
        kinds = sorted(error["kind"] for error in report.errors)
        assert kinds == ["dangling", "orphan_data", "orphan_inode", "parent", "removing"], \
            report.errors
        assert any(e["ino"] == f"{orphan:x}" for e in report.errors)
        report = run(check(fs, repair=True, grace_s=0))
        # The orphan's stripe goes with the orphaned inode, before the data is listed.
        assert report.repaired == len(report.errors) == 4, report
        report = run(check(fs, grace_s=0))
        assert report.clean, report.errors
        assert run(fs.listdir("/dst")) == ["three", "two"]


def test_hard_links_special_files_atime_and_a_namespace_made_before_embedding(local_cluster):
    cluster = make_cluster(local_cluster)
    with connect(cluster.dir) as client:
        fs = client.call(Filesystem.open(client._cluster, "data", metadata_pool="meta"))
        run = client.call

        async def write(path, data):
            async with await fs.open_path(path, "wb") as f:
                await f.write(data)

        async def read(path):
            async with await fs.open_path(path, "rb") as f:
                return await f.read()

        def stripes(ino):
            return run(fs.data.list(prefix=fsmod.stripe_prefix(ino)))[0]

        def clean():
            report = run(check(fs, grace_s=0))
            assert report.clean, report.errors
            return report

        run(fs.makedirs("/a"))
        run(fs.makedirs("/b"))
        data = os.urandom(STRIPE_BYTES + 100)
        run(write("/a/one", data))
        ino, _ = run(fs.resolve("/a/one"))
        assert fsmod.is_embedded(ino) and run(fs.stat("/a/one")).nlink == 1
        a_dir, _ = run(fs.resolve("/a"))
        b_dir, _ = run(fs.resolve("/b"))
        # A directory's mtime and ctime move with every change of its entries.
        def moved(path, change):
            before = run(fs.stat(path))
            change()
            after = run(fs.stat(path))
            assert after["mt"] > before["mt"] and after["ct"] > before["ct"], (before, after)
        moved("/b", lambda: run(fs.link(ino, b_dir, "scratch")))
        moved("/b", lambda: run(fs.rename_path("/b/scratch", "/b/scratch2")))
        moved("/a", lambda: run(fs.rename_path("/b/scratch2", "/a/scratch3")))
        moved("/a", lambda: run(fs.unlink_path("/a/scratch3")))
        moved("/a", lambda: run(fs.mkdir_path("/a/sub")))
        moved("/a", lambda: run(fs.rmdir_path("/a/sub")))
        moved("/", lambda: run(write("/top", b"")))
        run(fs.setattr(a_dir, mtime_ns=10**18))           # a utime of the directory wins
        assert run(fs.stat("/a"))["mt"] == 10**18
        # Two more names, one in another directory: one inode, counted three times.
        assert run(fs.link(ino, b_dir, "two")).nlink == 2
        assert run(fs.link(ino, a_dir, "three")).nlink == 3
        assert run(fs.resolve("/b/two"))[0] == ino
        expect(errno.EEXIST, lambda: run(fs.link(ino, b_dir, "two")))
        expect(errno.EPERM, lambda: run(fs.link(b_dir, a_dir, "dir-link")))
        assert run(fs.stat("/a/one")).nlink == 3            # the failed link is not counted
        assert clean().files == 2                            # one and /top
        run(fs.unlink_path("/a/one"))
        assert run(read("/b/two")) == data and run(fs.stat("/a/three")).nlink == 2
        run(fs.rename_path("/a/three", "/b/two"))           # two names of one inode: no-op
        assert sorted(run(fs.listdir("/b"))) == ["two"] and run(fs.exists("/a/three"))
        run(fs.unlink_path("/b/two"))
        assert run(read("/a/three")) == data and run(fs.stat("/a/three")).nlink == 1
        assert len(stripes(ino)) == 2
        clean()
        run(fs.unlink_path("/a/three"))                     # the last name: the data goes
        assert stripes(ino) == []
        expect(errno.ENOENT, lambda: run(fs.getattr(ino)))

        # A link counted but never named (a client killed between the two steps): fsck
        # finds the count one too high and sets it.
        run(write("/a/crash", b"x"))
        crash, _ = run(fs.resolve("/a/crash"))
        run(fs._count_link(crash, +1))
        report = run(check(fs, grace_s=0))
        assert [e["kind"] for e in report.errors] == ["nlink"], report.errors
        assert run(check(fs, repair=True, grace_s=0)).repaired == 1
        assert run(fs.stat("/a/crash")).nlink == 1
        clean()

        # Fifos, sockets and device nodes are inodes of their own kinds, with no data.
        for name, mode, rdev in (("fifo", stat.S_IFIFO | 0o600, 0),
                                 ("sock", stat.S_IFSOCK | 0o600, 0),
                                 ("chr", stat.S_IFCHR | 0o600, os.makedev(1, 3)),
                                 ("blk", stat.S_IFBLK | 0o600, os.makedev(7, 0))):
            run(fs.mknod(a_dir, name, mode, rdev))
            attr = run(fs.stat(f"/a/{name}"))
            assert attr.st_mode() == mode and attr.get("r", 0) == rdev, (name, attr)
        expect(errno.EINVAL, lambda: run(fs.mknod(a_dir, "dir", stat.S_IFDIR | 0o755)))
        assert clean().special == 4
        for name in ("fifo", "sock", "chr", "blk"):
            run(fs.unlink_path(f"/a/{name}"))

        # Access time apart from mtime; reads leave it.
        attr = run(fs.setattr(crash, atime_ns=1_900_000_000 * 10**9,
                              mtime_ns=1_950_000_000 * 10**9))
        run(read("/a/crash"))
        attr = run(fs.stat("/a/crash"))
        assert (attr.atime_ns, attr["mt"]) == (1_900_000_000 * 10**9, 1_950_000_000 * 10**9)

        # A directory made before embedding (a number of its own above DIR_INO_LIMIT): files
        # made in it are inodes of their own, and everything still works on them.
        async def old_directory():
            attr = fs._new_attr("d", 0o755, None, None, p=fsmod.ROOT_INO)
            while True:
                ino = await fs._new_inode(attr, fsmod.EMBED_BIT)
                if ino >= fsmod.DIR_INO_LIMIT:
                    break
                await fs.meta.delete(fs.inode_object(ino))
            await fs._insert(fsmod.ROOT_INO, b"old", ino, "d")
        run(old_directory())
        run(write("/old/file", data))
        old, _ = run(fs.resolve("/old/file"))
        assert not fsmod.is_embedded(old) and run(read("/old/file")) == data
        assert run(fs.link(old, b_dir, "old-link")).nlink == 2
        run(fs.rename_path("/old/file", "/a/moved"))
        run(write("/a/moved", b"rewritten"))
        assert run(read("/b/old-link")) == b"rewritten"
        clean()
        run(fs.unlink_path("/a/moved"))
        run(fs.unlink_path("/b/old-link"))
        assert stripes(old) == []
        # Files renamed out of a directory keep their records in it; removing it keeps its
        # object for them (fsck says nothing), and the last unlink takes the record and then
        # the object.
        run(fs.makedirs("/home"))
        run(write("/home/emigrant", b"e"))
        emigrant, _ = run(fs.resolve("/home/emigrant"))
        home, _ = run(fs.resolve("/home"))
        run(fs.rename_path("/home/emigrant", "/b/emigrant"))
        run(fs.rmdir_path("/home"))
        assert run(read("/b/emigrant")) == b"e"
        clean()
        run(fs.unlink_path("/b/emigrant"))
        with pytest.raises(errors.ObjectNotFound):
            run(fs.meta.omap_list(fs.inode_object(home)))
        clean()


class NamespaceModel(RuleBasedStateMachine):
    """Random namespace ops through the library, against a dict model of paths."""

    fs = run = None                     # set by the test for each run
    counter = 0

    def __init__(self):
        super().__init__()
        NamespaceModel.counter += 1
        self.root = f"/m{NamespaceModel.counter}"
        self.run(self.fs.makedirs(self.root))
        self.model = {"": None}         # relative path -> bytes (file) or None (directory)

    def _path(self, relative):
        return f"{self.root}/{relative}" if relative else self.root

    def _dirs(self):
        return sorted(p for p, v in self.model.items() if v is None)

    @rule(data=st.data(), name=st.sampled_from(["a", "b", "c"]), is_dir=st.booleans(),
          payload=st.binary(max_size=64))
    def make(self, data, name, is_dir, payload):
        parent = data.draw(st.sampled_from(self._dirs()))
        relative = f"{parent}/{name}".lstrip("/")
        try:
            if is_dir:
                self.run(self.fs.mkdir_path(self._path(relative)))
            else:
                async def create():
                    async with await self.fs.open_path(self._path(relative), "xb") as f:
                        await f.write(payload)
                self.run(create())
        except FileExistsError:
            assert relative in self.model
            return
        assert relative not in self.model
        self.model[relative] = None if is_dir else payload

    @rule(data=st.data())
    def remove(self, data):
        candidates = sorted(p for p in self.model if p)
        if not candidates:
            return
        relative = data.draw(st.sampled_from(candidates))
        children = [p for p in self.model if p.startswith(relative + "/")]
        if self.model[relative] is None:
            try:
                self.run(self.fs.rmdir_path(self._path(relative)))
            except OSError as exc:
                assert exc.errno == errno.ENOTEMPTY and children
                return
            assert not children
        else:
            self.run(self.fs.unlink_path(self._path(relative)))
        del self.model[relative]

    @rule(data=st.data(), name=st.sampled_from(["a", "b", "c", "d"]))
    def rename(self, data, name):
        candidates = sorted(p for p in self.model if p)
        if not candidates:
            return
        source = data.draw(st.sampled_from(candidates))
        parent = data.draw(st.sampled_from(self._dirs()))
        target = f"{parent}/{name}".lstrip("/")
        try:
            self.run(self.fs.rename_path(self._path(source), self._path(target)))
        except OSError as exc:
            inside = target == source or target.startswith(source + "/")
            existing = self.model.get(target, "absent")
            if exc.errno == errno.EINVAL:
                assert inside and self.model[source] is None
            elif exc.errno == errno.ENOTEMPTY:
                assert existing is None and any(p.startswith(target + "/") for p in self.model)
            elif exc.errno == errno.EISDIR:
                assert existing is None and self.model[source] is not None
            elif exc.errno == errno.ENOTDIR:
                assert existing not in (None, "absent") and self.model[source] is None
            else:
                raise
            return
        if target == source:
            return
        moved = {p: v for p, v in self.model.items()
                 if p == source or p.startswith(source + "/")}
        for p in moved:
            del self.model[p]
        for p in [p for p in self.model if p == target or p.startswith(target + "/")]:
            del self.model[p]
        for p, v in moved.items():
            self.model[target + p[len(source):]] = v

    @invariant()
    def matches(self):
        seen = {}

        async def walk(relative):
            for name, ino, kind in await self.fs.scandir(self._path(relative)):
                child = f"{relative}/{name}".lstrip("/")
                if kind == "d":
                    seen[child] = None
                    await walk(child)
                else:
                    async with await self.fs.open_path(self._path(child), "rb") as f:
                        seen[child] = await f.read()
        self.run(walk(""))
        assert seen == {p: v for p, v in self.model.items() if p}


def test_random_namespace_ops_follow_a_model(local_cluster):
    cluster = make_cluster(local_cluster)
    with connect(cluster.dir) as client:
        NamespaceModel.fs = client.call(Filesystem.open(client._cluster, "data",
                                                        metadata_pool="meta"))
        # As a mount runs it: unlinks answered before they land, under every other op.
        NamespaceModel.fs.unlink_in_background = True
        NamespaceModel.run = staticmethod(client.call)
        run_state_machine_as_test(NamespaceModel, settings=settings(
            max_examples=12, stateful_step_count=15, deadline=None,
            suppress_health_check=list(HealthCheck)))
        client.call(NamespaceModel.fs.drain_unlinks())
        report = client.call(check(NamespaceModel.fs, grace_s=0))
        assert report.clean, report.errors
