"""`cairn-s3 gc`: delete data objects that no bucket names any more.

Data is written before the entry that names it (store.py), so a writer that dies in between
(a gateway SIGKILLed mid-PUT, a commit whose outcome could not be read, a replaced part a
complete raced) leaves objects nothing names. They are never visible; they only take space.
The collector finds them in three steps:

1. list the data pools' `s3.` objects (every bucket's data pool and the default one);
2. read what names data: every bucket's index entries (`d`: a body's stripes, `mf`: a
   manifest, and the parts it lists), its uploads' parts and the manifests their claims name;
3. delete what step 1 found, step 2 does not name, and is older than `min_age_s`.

Listing before reading the references, and the age, keep it from deleting data a writer is
still about to name: an object is collected only if it was written `min_age_s` before the
collector started and no entry named it by the time the references were read. A single PUT or
UploadPart that takes longer than `min_age_s` from its first byte to its end could lose its
data to a collector running meanwhile: the default (a day) is far beyond any upload's length.
"""

import asyncio
import time

import msgpack

from cairn.client.errors import ObjectNotFound
from cairn.s3.store import REGISTRY, Bucket

MIN_AGE_S_DEFAULT = 24 * 3600.0
LIST_PAGE = 1000
STAT_CONCURRENCY = 32
# Objects of the index's own kinds, should the index and data pools be one pool.
INDEX_KINDS = (REGISTRY, "s3.index.", "s3.uploads.", "s3.parts.")


async def collect(store, min_age_s=MIN_AGE_S_DEFAULT, dry_run=False, progress=None):
    """Find (and unless `dry_run`, delete) unnamed data, bucket by bucket, then the data of
    buckets that no longer exist; the report: {pools, buckets, objects, named, garbage,
    deleted, young, bytes, orphaned (objects of buckets gone), names (the first 100)}. Memory: one bucket's
    data names at a time."""
    started = time.time()
    say = progress or (lambda text: None)
    buckets = []
    try:
        async for key, raw in store.index().omap_items(REGISTRY):
            buckets.append(Bucket(key.decode(), msgpack.unpackb(raw), 0.0))
    except ObjectNotFound:
        pass
    known = {bucket.id for bucket in buckets}
    pools = sorted(pool for pool in {store.data_pool} | {bucket.pool for bucket in buckets}
                   if pool in store.cluster.map.pools)
    report = {"pools": pools, "buckets": len(buckets), "objects": 0, "named": 0,
              "garbage": 0, "deleted": 0, "young": 0, "bytes": 0, "orphaned": 0,
              "names": []}
    gate = asyncio.Semaphore(STAT_CONCURRENCY)

    async def consider(pool, name):
        """Collect one unnamed object if it is old enough."""
        async with gate:
            try:
                stat = await pool.stat(name)
            except ObjectNotFound:
                return
            if stat.mtime_ns / 1e9 > started - min_age_s:
                report["young"] += 1
                return
            report["garbage"] += 1
            report["bytes"] += stat.size
            if len(report["names"]) < 100:
                report["names"].append(name)
            if not dry_run:
                try:
                    await pool.delete(name, plain=True)
                except ObjectNotFound:
                    return
                report["deleted"] += 1

    for bucket in buckets:
        if bucket.pool not in store.cluster.map.pools:
            continue
        pool = store.cluster.pool(bucket.pool)
        # 1. what is there (before 2: an entry set meanwhile names data listed here, or data
        # written after this listing, which this run does not see)
        found = [name async for name in _names(pool, f"s3.{bucket.id}.")
                 if _bucket_of(name, known) == bucket.id]   # not bucket "<id>.more"'s
        # 2. what is named
        named_data, named_whole = await _named(store, bucket, pool)
        unnamed = [name for name in found if name not in named_whole
                   and name.rpartition(".")[0] not in named_data]
        report["objects"] += len(found)
        report["named"] += len(found) - len(unnamed)
        # 3. old enough?
        await asyncio.gather(*(consider(pool, name) for name in unnamed))
        say(f"bucket {bucket.name}: {len(found)} data objects, {len(unnamed)} unnamed")

    # The data of buckets that are gone (DeleteBucket needs an empty bucket, so this is only
    # what writers that died left behind), and of buckets made after the registry was read
    # (younger than the start, so kept).
    for pool_name in pools:
        pool = store.cluster.pool(pool_name)
        unnamed = []
        async for name in _names(pool, "s3."):
            if name.startswith(INDEX_KINDS) or _bucket_of(name, known) is not None:
                continue
            report["objects"] += 1
            report["orphaned"] += 1
            unnamed.append(name)
        await asyncio.gather(*(consider(pool, name) for name in unnamed))
        say(f"pool {pool_name}: {len(unnamed)} objects of buckets that no longer exist")
    report["names"].sort()
    return report


async def _names(pool, prefix):
    page = None
    while True:
        names, page = await pool.list(prefix=prefix, page=page, limit=LIST_PAGE)
        for name in names:
            yield name
        if page is None:
            return


async def _named(store, bucket, pool):
    """(data names, whole object names) that the bucket's entries and uploads name."""
    named_data, named_whole = set(), set()
    index = store.index()
    for shard in bucket.shard_names():
        try:
            async for _, raw in index.omap_items(shard):
                value = msgpack.unpackb(raw)
                if value.get("d"):
                    named_data.add(value["d"])
                if value.get("mf"):
                    named_whole.add(value["mf"])
                    await _name_manifest(pool, value["mf"], named_data)
        except ObjectNotFound:
            pass
    try:
        async for raw_key, raw in index.omap_items(bucket.uploads):
            upload_id = raw_key.rpartition(b"\0")[2].decode()
            manifest = (msgpack.unpackb(raw).get("end") or {}).get("mf")
            if manifest:                # a complete in progress names it
                named_whole.add(manifest)
                await _name_manifest(pool, manifest, named_data)
            try:
                async for _, part in index.omap_items(bucket.parts(upload_id)):
                    named_data.add(msgpack.unpackb(part)["d"])
            except ObjectNotFound:
                pass
    except ObjectNotFound:
        pass
    return named_data, named_whole


def _bucket_of(name, known):
    """The id in `known` that data object `name` (`s3.<id>.<...>`) belongs to, or None. An
    id is the bucket's name (which may hold dots) and a token: the longest match wins."""
    dots = [position for position, c in enumerate(name) if c == "."]
    for position in reversed(dots[2:]):
        if name[3:position] in known:
            return name[3:position]
    return None


async def _name_manifest(pool, manifest, named_data):
    try:
        segments = msgpack.unpackb(await pool.get(manifest))
    except ObjectNotFound:
        return
    for data, _ in segments:
        named_data.add(data)
