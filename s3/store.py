"""Buckets and objects on cairn pools: what the S3 gateway stores, and how (DESIGN.md, "S3").

    registry    index pool, object `s3.buckets`: omap BUCKET -> {id, pool, shards, created,
                owner}; a bucket's id is its name and a random token, so a bucket made again
                under an old name never meets the old one's leftovers.
    index       index pool, objects `s3.index.<id>.<n>` (n < shards): omap KEY -> the entry
                {s: size, e: ETag, m: mtime, ct, md: user metadata, d: data name, mf: manifest}.
                A key's shard is crc32c(key) % shards, so no one object holds a big bucket's
                index and a listing merges the shards' ordered pages.
    data        the bucket's data pool (any kind), objects `<d>.<i>`: the body in stripes of
                STRIPE_BYTES, written STRIPES_IN_FLIGHT at a time before the entry names them.
                A multipart object's entry names a manifest object (`mf`) listing its parts'
                data names and sizes.
    uploads     index pool, `s3.uploads.<id>`: omap KEY\\0UPLOAD -> {initiated, ct, md, owner};
                `s3.parts.<id>.<upload>`: omap NNNNN -> {s, e, d, m} per part.

An entry is set only once its data is whole (compare-and-swap on the key, so of two writers one
object wins whole and the other's data is deleted), so a reader sees the old object or the new
one, never a mix; the replaced object's data is deleted after. Data written by a writer that
died before its entry was set is never visible (it is garbage: DESIGN.md says how it goes).
"""

import asyncio
import concurrent.futures
import hashlib
import heapq
import secrets
import time

import msgpack

from cairn.client.errors import ClientError, ObjectNotFound, PreconditionFailed
from cairn.native.checksum import crc32c

REGISTRY = "s3.buckets"
STRIPE_BYTES = 4 << 20
STRIPES_IN_FLIGHT = 4
SHARDS_DEFAULT = 16
SHARDS_MAX = 1024
# S3's limits.
KEY_BYTES_MAX = 1024
PART_NUMBER_MAX = 10_000
PART_BYTES_MIN = 5 << 20
OBJECT_BYTES_MAX = 5 << 40
USER_METADATA_BYTES_MAX = 2048
# A listing asks each shard for a bit more than its share of a page, and at least this many.
LIST_SHARD_PAGE_MIN = 32
# A stripe at least this big is hashed (MD5 for the ETag, and what the request asks) in a
# thread, in order, while the event loop receives the next one: hashlib releases the GIL, and
# MD5 alone runs at about 630 MB/s here, a core's worth at the gateway's 4 MiB PUT rate.
HASH_THREAD_BYTES = 1 << 20
_HASHERS = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="s3-hash")
# A complete or an abort claims its upload first; a claim this old belongs to a gateway that
# died holding it, and the next request that meets it finishes or undoes what it began.
CLAIM_STALE_S = 300.0
# A replaced object's data is deleted this long after the entry that replaced it landed, so a
# GET streaming it (a 10 GiB object at 100 MB/s: 100 s) is not cut by an overwrite. If the
# gateway dies meanwhile, `cairn-s3 gc` collects it.
REPLACED_GRACE_S = 120.0
# Past every key with a given prefix: UTF-8 never holds 0xff.
AFTER_ALL = b"\xff"
# A shard's omap key while a DeleteBucket seals it (no object key can be it: 0xff), and how
# long a PUT waits for such a delete to end, and when a seal is a dead gateway's.
SEAL = b"\xff"
SEAL_WAIT_S = 5.0
SEAL_STALE_S = 60.0


class S3Error(Exception):
    """An S3 error: `code` (NoSuchKey, ...) and HTTP `status`."""

    def __init__(self, code, message, status=400, **fields):
        super().__init__(message)
        self.code, self.message, self.status, self.fields = code, message, status, fields


def no_such_bucket(bucket):
    return S3Error("NoSuchBucket", "The specified bucket does not exist", 404, BucketName=bucket)


def no_such_key(key):
    return S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)


def no_such_upload(upload_id):
    return S3Error("NoSuchUpload", "The specified multipart upload does not exist.", 404,
                   UploadId=upload_id)


def check_bucket_name(name):
    """S3's rules for a new bucket's name: 3-63 lower-case letters, digits, dots and hyphens,
    starting and ending with a letter or digit, not an IP address."""
    ok = 3 <= len(name) <= 63 and all(c.islower() or c.isdigit() or c in ".-" for c in name) \
        and name.isascii() and name[0].isalnum() and name[-1].isalnum() and ".." not in name \
        and not all(part.isdigit() for part in name.split("."))
    if not ok:
        raise S3Error("InvalidBucketName", "The specified bucket is not valid: 3 to 63 "
                      "lower-case letters, digits, dots and hyphens", 400, BucketName=name)


def check_key(key):
    raw = key.encode("utf-8", "surrogatepass")
    if not key or len(raw) > KEY_BYTES_MAX:
        raise S3Error("KeyTooLongError" if key else "InvalidArgument",
                      f"an object key is 1 to {KEY_BYTES_MAX} bytes of UTF-8", 400)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise S3Error("InvalidArgument", "an object key must be valid UTF-8", 400) from None
    return raw


class Bucket:
    __slots__ = ("name", "id", "pool", "shards", "created", "owner", "fetched")

    def __init__(self, name, record, fetched):
        self.name, self.id, self.pool = name, record["id"], record["pool"]
        self.shards, self.created, self.owner = record["shards"], record["created"], \
            record.get("owner")
        self.fetched = fetched

    def shard(self, raw_key):
        return f"s3.index.{self.id}.{crc32c(raw_key) % self.shards}"

    def shard_names(self):
        return [f"s3.index.{self.id}.{n}" for n in range(self.shards)]

    @property
    def uploads(self):
        return f"s3.uploads.{self.id}"

    def parts(self, upload_id):
        return f"s3.parts.{self.id}.{upload_id}"


class Entry:
    """An object as its index entry describes it."""
    __slots__ = ("key", "size", "etag", "mtime", "content_type", "meta", "data", "manifest",
                 "raw")

    def __init__(self, key, raw):
        value = msgpack.unpackb(raw)
        self.key, self.raw = key, raw
        self.size, self.etag, self.mtime = value["s"], value["e"], value["m"]
        self.content_type, self.meta = value.get("ct"), value.get("md") or {}
        self.data, self.manifest = value.get("d"), value.get("mf")

    @staticmethod
    def encode(size, etag, content_type, meta, data=None, manifest=None):
        value = {"s": size, "e": etag, "m": time.time()}
        if content_type:
            value["ct"] = content_type
        if meta:
            value["md"] = meta
        if data is not None:
            value["d"] = data
        if manifest is not None:
            value["mf"] = manifest
        return msgpack.packb(value)


def _seal_stale(seal):
    try:
        return time.time() - msgpack.unpackb(seal)["t"] > SEAL_STALE_S
    except (ValueError, KeyError, TypeError):
        return True


def upload_key(raw_key, upload_id):
    """An upload's record key in the bucket's uploads table."""
    return raw_key + b"\0" + upload_id.encode()


def stripe_names(data, size):
    return [f"{data}.{index:x}" for index in range((size + STRIPE_BYTES - 1) // STRIPE_BYTES)]


class Store:
    """The gateway's view of the cluster: buckets in `index_pool`'s registry, data in each
    bucket's pool (`data_pool` unless the bucket was made on another)."""

    def __init__(self, cluster, index_pool, data_pool, shards=SHARDS_DEFAULT,
                 bucket_cache_s=2.0):
        self.cluster, self.index_pool, self.data_pool = cluster, index_pool, data_pool
        self.shards, self.bucket_cache_s = shards, bucket_cache_s
        self._buckets = {}
        self._background = set()
        self._hurry = asyncio.Event()

    def index(self):
        return self.cluster.pool(self.index_pool)

    def data(self, bucket):
        return self.cluster.pool(bucket.pool)

    async def _value(self, name, key):
        """Index object `name`'s omap value at `key`; None if the key or the object is
        absent."""
        try:
            return (await self.index().omap_get(name, [key])).get(key)
        except ObjectNotFound:
            return None

    def later(self, coroutine, delay_s=0.0):
        """Run `coroutine` (a tidy-up: deleting replaced data) without waiting for it, after
        `delay_s` (cut short by `drain`)."""
        async def run():
            try:
                if delay_s > 0 and not self._hurry.is_set():
                    try:
                        await asyncio.wait_for(self._hurry.wait(), delay_s)
                    except TimeoutError:
                        pass
                await coroutine
            finally:
                coroutine.close()       # never started (cancelled while waiting): no warning
        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def replaced(self, bucket, key, old):
        """Delete a replaced entry's data once REPLACED_GRACE_S have passed: a GET that began
        streaming the old object (on any gateway) finishes it instead of being cut."""
        self.later(self._delete_data(bucket, Entry(key, old)), REPLACED_GRACE_S)

    async def drain(self):
        """Finish every tidy-up now (a stopping gateway), without the grace period."""
        self._hurry.set()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- buckets --------------------------------------------------------------------------------

    async def bucket(self, name):
        """The bucket named `name` (cached for bucket_cache_s); S3Error NoSuchBucket."""
        now = time.monotonic()
        found = self._buckets.get(name)
        if found is not None and now - found.fetched < self.bucket_cache_s:
            return found
        try:
            raw = (await self.index().omap_get(REGISTRY, [name.encode()])).get(name.encode())
        except ObjectNotFound:
            raw = None
        if raw is None:
            self._buckets.pop(name, None)
            raise no_such_bucket(name)
        found = Bucket(name, msgpack.unpackb(raw), now)
        self._buckets[name] = found
        return found

    async def buckets(self):
        """[Bucket] of every bucket, by name."""
        found = []
        try:
            async for key, raw in self.index().omap_items(REGISTRY):
                found.append(Bucket(key.decode(), msgpack.unpackb(raw), time.monotonic()))
        except ObjectNotFound:
            pass
        return found

    async def create_bucket(self, name, owner, pool=None):
        check_bucket_name(name)
        pool = pool or self.data_pool
        if pool not in self.cluster.map.pools:
            raise S3Error("InvalidLocationConstraint", f"no pool named {pool!r} to hold the "
                          "bucket's data", 400)
        record = {"id": f"{name}.{secrets.token_hex(4)}", "pool": pool, "shards": self.shards,
                  "created": time.time(), "owner": owner}
        bucket = Bucket(name, record, time.monotonic())
        index = self.index()
        await asyncio.gather(*(index.omap_update(shard, create=True)
                               for shard in bucket.shard_names()))
        value = msgpack.packb(record)
        try:
            await index.omap_update(REGISTRY, set={name.encode(): value},
                                    absent=[name.encode()], create=True)
        except PreconditionFailed:
            now = (await index.omap_get(REGISTRY, [name.encode()])).get(name.encode())
            if now == value:            # our own attempt, landed and retried
                self._buckets[name] = bucket
                return bucket
            await asyncio.gather(*(index.delete(shard, plain=True)
                                   for shard in bucket.shard_names()), return_exceptions=True)
            existing = await self.bucket(name)
            if existing.owner == owner:
                raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the "
                              "named bucket succeeded and you already own it.", 409,
                              BucketName=name) from None
            raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.",
                          409, BucketName=name) from None
        self._buckets[name] = bucket
        return bucket

    async def delete_bucket(self, name):
        """Delete an empty bucket. Each index shard is first sealed, atomically with the
        check that it is empty (an omap `empty` condition), so a PUT racing the delete either
        lands first (the delete then finds the bucket not empty) or finds the seal (and then
        no bucket): never an acknowledged object in a deleted bucket."""
        bucket = await self.bucket(name)
        index = self.index()
        try:
            uploads, _ = await index.omap_list(bucket.uploads, limit=1)
        except ObjectNotFound:
            uploads = []
        if uploads:
            raise S3Error("BucketNotEmpty", "The bucket has multipart uploads in progress "
                          "(abort them first)", 409, BucketName=name)
        seal = msgpack.packb({"t": time.time(), "tok": secrets.token_hex(8)})
        outcomes = await asyncio.gather(*(self._seal(bucket, shard, seal)
                                          for shard in bucket.shard_names()),
                                        return_exceptions=True)
        failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failed:
            await asyncio.gather(*(self._unseal(shard, seal) for shard, outcome in
                                   zip(bucket.shard_names(), outcomes)
                                   if not isinstance(outcome, BaseException)),
                                 return_exceptions=True)
            raise failed[0]
        raw = (await index.omap_get(REGISTRY, [name.encode()])).get(name.encode())
        if raw is None:
            raise no_such_bucket(name)
        try:
            await index.omap_update(REGISTRY, remove=[name.encode()],
                                    equals={name.encode(): raw})
        except PreconditionFailed as exc:
            if not exc.maybe_applied or (await index.omap_get(
                    REGISTRY, [name.encode()])).get(name.encode()) is not None:
                raise no_such_bucket(name) from None
        self._buckets.pop(name, None)
        await asyncio.gather(*(index.delete(shard, plain=True) for shard in
                               bucket.shard_names() + [bucket.uploads]), return_exceptions=True)

    async def _seal(self, bucket, shard, seal):
        index = self.index()
        try:
            await index.omap_update(shard, set={SEAL: seal}, empty=[b""], create=True)
            return
        except PreconditionFailed:
            entries, _ = await index.omap_list(shard, limit=2)
        if entries and entries[0][0] != SEAL:
            raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", 409,
                          BucketName=bucket.name)
        if entries == [(SEAL, seal)]:
            return                      # our own seal, landed and retried
        if entries and _seal_stale(entries[0][1]):
            try:                        # a DeleteBucket whose gateway died: take its seal over
                await index.omap_update(shard, set={SEAL: seal}, equals={SEAL: entries[0][1]})
                return
            except PreconditionFailed:
                pass
        raise S3Error("OperationAborted", "A conflicting conditional operation is currently "
                      "in progress against this resource. Please try again.", 409)

    async def _unseal(self, shard, seal):
        try:
            await self.index().omap_update(shard, remove=[SEAL], equals={SEAL: seal})
        except PreconditionFailed:
            pass

    async def _wait_unsealed(self, bucket, shard, seal):
        """A PUT met a DeleteBucket's seal: wait for it to go (the delete failed: the bucket
        holds something) or the shard with it (NoSuchBucket); take a stale one away."""
        deadline = time.monotonic() + SEAL_WAIT_S
        while time.monotonic() < deadline:
            if _seal_stale(seal):
                await self._unseal(shard, seal)
                return
            await asyncio.sleep(0.05)
            try:
                seal = (await self.index().omap_get(shard, [SEAL])).get(SEAL)
            except ObjectNotFound:
                raise no_such_bucket(bucket.name) from None
            if seal is None:
                return
        raise S3Error("ServiceUnavailable", "the bucket is being deleted; retry", 503)

    # -- entries --------------------------------------------------------------------------------

    async def entry(self, bucket, key):
        raw_key = check_key(key)
        raw = await self._value(bucket.shard(raw_key), raw_key)
        if raw is None:
            raise no_such_key(key)
        return Entry(key, raw)

    async def _commit(self, bucket, raw_key, value):
        """Set the key's entry to `value` (unique: it names fresh data); the entry it replaced
        (raw) or None. NoSuchBucket if the bucket was deleted (its shard sealed or gone)."""
        index, shard = self.index(), bucket.shard(raw_key)
        expected = None                 # what the key holds, as far as we know: None, absent
        while True:
            try:
                if expected is None:
                    await index.omap_update(shard, set={raw_key: value},
                                            absent=[raw_key, SEAL])
                else:
                    await index.omap_update(shard, set={raw_key: value}, absent=[SEAL],
                                            equals={raw_key: expected})
                return expected
            except PreconditionFailed:
                try:
                    found = await index.omap_get(shard, [raw_key, SEAL])
                except ObjectNotFound:
                    raise no_such_bucket(bucket.name) from None
            except ObjectNotFound:
                raise no_such_bucket(bucket.name) from None
            current = found.get(raw_key)
            if SEAL in found and current != value:
                await self._wait_unsealed(bucket, shard, found[SEAL])
                continue
            if current == value:
                # An attempt the client library retried (its OSD died before answering) had
                # landed: the key went from `expected` to our value. Answering from the retry
                # alone would name our own data as the replaced object, and delete it.
                return expected
            expected = current

    async def _landed(self, bucket, raw_key, value):
        """Whether the key's entry is `value` now (after an error that leaves it unknown
        whether an update landed); None if that cannot be read either."""
        try:
            return await self._value(bucket.shard(raw_key), raw_key) == value
        except ClientError:
            return None

    async def _delete_data(self, bucket, entry):
        """Delete an entry's data (its stripes, or its parts' and its manifest)."""
        pool = self.data(bucket)
        names = []
        if entry.manifest is not None:
            try:
                parts = msgpack.unpackb(await pool.get(entry.manifest))
            except ObjectNotFound:
                parts = []
            for data, size in parts:
                names += stripe_names(data, size)
            names.append(entry.manifest)
        else:
            names = stripe_names(entry.data, entry.size)
        await _delete_all(pool, names)

    # -- objects --------------------------------------------------------------------------------

    async def write_data(self, bucket, data, body, size_max=OBJECT_BYTES_MAX, digest=None):
        """Write `body` (an async iterator of bytes-like pieces) as stripes `<data>.<i>`, at
        most STRIPES_IN_FLIGHT at a time; (size, md5 hex). `digest(pieces)` sees every
        stripe's pieces in order (the request's own hashes), in a thread for large stripes.
        On any error what was written is deleted and the error raised."""
        pool = self.data(bucket)
        md5 = hashlib.md5()
        in_flight, written, size = set(), [], 0
        gathered, gathered_bytes = [], 0        # the stripe being gathered, as its pieces
        failure = None
        hashing = None                          # the last stripe's hashing in the thread
        loop = asyncio.get_running_loop()

        def hash_stripe(pieces):
            # One buffer, so each hash takes the GIL once per stripe: per 64 KiB piece, a
            # thread waiting out the event loop's switch interval fell behind the network and
            # a 10 GiB PUT held 900 MiB of stripes waiting to be hashed.
            if len(pieces) > 1:
                pieces = [b"".join(pieces)]
            for piece in pieces:
                md5.update(piece)
            if digest is not None:
                digest(pieces)

        async def hash_after(previous, pieces):
            if previous is not None:
                await previous
            await loop.run_in_executor(_HASHERS, hash_stripe, pieces)

        async def flush(chunk, name):
            await pool.put(name, chunk)

        async def send():
            # A stripe goes as the received pieces (one frame's payload): no copy here.
            nonlocal failure, gathered, gathered_bytes, hashing
            chunk = gathered[0] if len(gathered) == 1 else tuple(gathered)
            if gathered_bytes >= HASH_THREAD_BYTES:
                if hashing is not None and not hashing.done():
                    await hashing               # at most one stripe waits to be hashed
                hashing = asyncio.ensure_future(hash_after(hashing, gathered))
            else:
                if hashing is not None:
                    await hashing
                    hashing = None
                hash_stripe(gathered)
            gathered, gathered_bytes = [], 0
            while len(in_flight) >= STRIPES_IN_FLIGHT:
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    in_flight.discard(task)
                    if task.exception() is not None:
                        failure = failure or task.exception()
            if failure is not None:
                raise failure
            written.append(f"{data}.{len(written):x}")
            in_flight.add(asyncio.ensure_future(flush(chunk, written[-1])))

        try:
            async for piece in body:
                size += len(piece)
                if size > size_max:
                    raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum "
                                  "allowed object size.", 400)
                while len(piece):
                    room = STRIPE_BYTES - gathered_bytes
                    if len(piece) < room:
                        gathered.append(piece)
                        gathered_bytes += len(piece)
                        break
                    view = memoryview(piece)
                    gathered.append(view[:room])
                    gathered_bytes += room
                    piece = view[room:]
                    await send()
            if gathered:
                await send()
            if in_flight:
                await asyncio.gather(*in_flight)
            if hashing is not None:
                await hashing
        except BaseException:
            for task in in_flight:
                task.cancel()
            if hashing is not None:
                hashing.cancel()
            self.later(_delete_all(pool, list(written)))
            raise
        return size, md5.hexdigest()

    async def put(self, bucket, key, body, content_type=None, meta=None, check=None,
                  digest=None):
        """Store the object: data first, then its entry. `check(size, md5_hex)` may raise
        (a digest that does not match) before anything becomes visible. The ETag."""
        raw_key = check_key(key)
        data = f"s3.{bucket.id}.{secrets.token_hex(8)}"
        size, md5 = await self.write_data(bucket, data, body, digest=digest)
        if check is not None:
            try:
                check(size, md5)
            except BaseException:
                self.later(_delete_all(self.data(bucket), stripe_names(data, size)))
                raise
        value = Entry.encode(size, md5, content_type, meta, data=data)
        old = await self._commit_or_keep(bucket, raw_key, value, stripe_names(data, size))
        if old is not None:
            self.replaced(bucket, key, old)
        return md5

    async def _commit_or_keep(self, bucket, raw_key, value, names):
        """`_commit`, and if it fails, delete the data `names` only when the entry is known
        not to name it: an update that timed out may have landed, and deleting the data of
        a visible entry loses the object. (Data left when that is unknown is garbage that
        `cairn-s3 gc` collects.) The replaced entry, or None."""
        try:
            return await self._commit(bucket, raw_key, value)
        except BaseException as exc:
            landed = await self._landed(bucket, raw_key, value)
            if landed:
                # It landed; what it replaced is unknown now: left for the collector.
                if isinstance(exc, Exception):
                    return None
            elif landed is False:
                self.later(_delete_all(self.data(bucket), names))
            raise

    async def delete(self, bucket, key):
        """Delete the object (no error if there is none, as S3)."""
        raw_key = check_key(key)
        index, shard = self.index(), bucket.shard(raw_key)
        while True:
            old = await self._value(shard, raw_key)
            if old is None:
                return
            try:
                await index.omap_update(shard, remove=[raw_key], equals={raw_key: old})
            except PreconditionFailed as exc:
                if not exc.maybe_applied:
                    continue
                # A retried attempt may have removed it: if the key is gone, `old` is named
                # by nothing (whoever removed it, its data goes; deleting twice is harmless).
                if await self._value(shard, raw_key) is not None:
                    continue
            await self._delete_data(bucket, Entry(key, old))
            return

    async def segments(self, bucket, entry):
        """[(data name, size)] of the object's body in order."""
        if entry.manifest is None:
            return [(entry.data, entry.size)]
        return [tuple(part) for part in
                msgpack.unpackb(await self.data(bucket).get(entry.manifest))]

    async def read(self, bucket, entry, start=0, end=None, ahead=STRIPES_IN_FLIGHT):
        """Yield the object's bytes from `start` to `end` (exclusive), stripe by stripe,
        `ahead` stripes fetched in parallel. ObjectNotFound if the data went (replaced)."""
        end = entry.size if end is None else end
        pool = self.data(bucket)
        pieces = []                     # (name, offset, length) in order
        position = 0
        for data, size in await self.segments(bucket, entry):
            segment_end = position + size
            if segment_end > start and position < end:
                first = max(start, position) - position
                last = min(end, segment_end) - position
                index = first // STRIPE_BYTES
                while index * STRIPE_BYTES < last:
                    lo = max(first, index * STRIPE_BYTES)
                    hi = min(last, (index + 1) * STRIPE_BYTES)
                    pieces.append((f"{data}.{index:x}", lo - index * STRIPE_BYTES, hi - lo,
                                   min(STRIPE_BYTES, size - index * STRIPE_BYTES)))
                    index += 1
            position = segment_end
            if position >= end:
                break

        def fetch(piece):
            name, offset, length, whole = piece
            if offset == 0 and length == whole:
                return asyncio.ensure_future(pool.get_view(name))
            return asyncio.ensure_future(pool.get(name, offset, length))

        pending = [fetch(piece) for piece in pieces[:ahead]]
        try:
            for position, piece in enumerate(pieces):
                chunk = await pending.pop(0)
                if position + ahead < len(pieces):
                    pending.append(fetch(pieces[position + ahead]))
                if len(chunk) != piece[2]:
                    raise ObjectNotFound(f"{piece[0]} holds {len(chunk)} bytes, not {piece[2]}")
                yield chunk
        finally:
            for task in pending:
                task.cancel()

    # -- listing --------------------------------------------------------------------------------

    async def list(self, bucket, prefix="", delimiter="", after=b"", max_keys=1000,
                   visible=None):
        """One page of the bucket's keys in order: ([(key, entry's fields)], [common prefix], truncated,
        last key or prefix given). Keys after `after` (bytes), starting with `prefix`; with a
        `delimiter`, keys holding it after the prefix are rolled up into common prefixes.
        `visible(key)`: only keys it accepts (caps by prefix)."""
        index, raw_prefix, raw_delim = self.index(), prefix.encode(), delimiter.encode()
        # A shard's share of a page, with room for chance (3 standard deviations at 1,000
        # keys over 16 shards); a shard that runs out is asked again.
        per_shard = max(LIST_SHARD_PAGE_MIN, max_keys * 5 // (4 * bucket.shards) + 16)
        shards = bucket.shard_names()
        buffers = [[] for _ in shards]      # entries not yet taken, reversed (pop from the end)
        cursors = [after] * len(shards)     # the last key each shard was read up to
        more = [True] * len(shards)
        skip = None                         # the common prefix being passed over (bytes)

        async def refill(n):
            start = cursors[n]
            if skip is not None and start < skip + AFTER_ALL and start.startswith(skip):
                start = skip + AFTER_ALL
            try:
                entries, has_more = await index.omap_list(
                    shards[n], start_after=start or None, prefix=raw_prefix, limit=per_shard)
            except ObjectNotFound:
                entries, has_more = [], False
            buffers[n] = entries[::-1]
            more[n] = has_more
            if entries:
                cursors[n] = entries[-1][0]

        await asyncio.gather(*(refill(n) for n in range(len(shards))))
        # A heap of each shard's next key: the smallest is the listing's next. A shard whose
        # page runs out is asked again before its next key joins (its keys can be smaller
        # than any other shard's next).
        heap = [(buffers[n][-1][0], n) for n in range(len(shards)) if buffers[n]]
        heapq.heapify(heap)
        keys, prefixes, last = [], [], None
        while heap:
            raw_key, n = heap[0]
            skipped = skip is not None and raw_key.startswith(skip)
            if not skipped and len(keys) + len(prefixes) >= max_keys:
                return keys, prefixes, True, last
            heapq.heappop(heap)
            raw = buffers[n].pop()[1]
            if not buffers[n] and more[n]:
                await refill(n)
            if buffers[n]:
                heapq.heappush(heap, (buffers[n][-1][0], n))
            if skipped or raw_key[:1] == SEAL:
                continue
            key = raw_key.decode()
            if visible is not None and not visible(key):
                continue
            if raw_delim:
                cut = raw_key.find(raw_delim, len(raw_prefix))
                if cut >= 0:
                    skip = raw_key[:cut + len(raw_delim)]
                    prefixes.append(skip.decode())
                    last = skip
                    continue
            keys.append((key, msgpack.unpackb(raw)))
            last = raw_key
        return keys, prefixes, False, last

    # -- multipart ------------------------------------------------------------------------------

    async def create_upload(self, bucket, key, owner, content_type=None, meta=None):
        raw_key = check_key(key)
        upload_id = secrets.token_hex(16)
        record = {"i": time.time(), "o": owner}
        if content_type:
            record["ct"] = content_type
        if meta:
            record["md"] = meta
        await self.index().omap_update(bucket.uploads,
                                       set={upload_key(raw_key, upload_id):
                                            msgpack.packb(record)}, create=True)
        return upload_id

    async def upload(self, bucket, key, upload_id):
        """The upload's record; S3Error NoSuchUpload (also while a complete or an abort
        holds it)."""
        raw_key = check_key(key)
        if not (isinstance(upload_id, str) and len(upload_id) == 32 and
                all(c in "0123456789abcdef" for c in upload_id)):
            raise no_such_upload(upload_id)
        raw = await self._value(bucket.uploads, upload_key(raw_key, upload_id))
        if raw is None:
            raise no_such_upload(upload_id)
        record = msgpack.unpackb(raw)
        if "end" in record:
            if time.time() - record["end"]["t"] < CLAIM_STALE_S or \
                    not await self._settle(bucket, raw_key, upload_id, raw, record):
                raise no_such_upload(upload_id)
            record = {k: v for k, v in record.items() if k != "end"}
        return record

    async def _claim(self, bucket, raw_key, upload_id, manifest=None):
        """Mark the upload as ending (by a complete naming `manifest`, or an abort): from
        then on uploads, parts and other completes and aborts find NoSuchUpload. (claimed
        raw record, the record before). Retry-safe: the claim carries a token, so an attempt
        the client library retried after it landed is recognised as ours."""
        record_key = upload_key(raw_key, upload_id)
        index = self.index()
        record = await self.upload(bucket, raw_key.decode(), upload_id)
        before = msgpack.packb(record)
        claimed = msgpack.packb(dict(record, end={"t": time.time(), "mf": manifest,
                                                  "tok": secrets.token_hex(8)}))
        try:
            await index.omap_update(bucket.uploads, set={record_key: claimed},
                                    equals={record_key: before})
        except PreconditionFailed:
            if await self._value(bucket.uploads, record_key) != claimed:
                raise no_such_upload(upload_id) from None
        return claimed, before

    async def _unclaim(self, bucket, raw_key, upload_id, claimed, before):
        """Give the upload back (a complete that failed before its entry landed), so the
        client may retry it."""
        record_key = upload_key(raw_key, upload_id)
        try:
            await self.index().omap_update(bucket.uploads, set={record_key: before},
                                           equals={record_key: claimed})
        except ClientError:
            pass                        # a stale claim: `upload()` settles it later

    async def _release(self, bucket, raw_key, upload_id, claimed):
        """Remove the claimed upload's record: the end of a complete or an abort."""
        record_key = upload_key(raw_key, upload_id)
        try:
            await self.index().omap_update(bucket.uploads, remove=[record_key],
                                           equals={record_key: claimed})
        except PreconditionFailed:
            pass                        # removed already (an attempt that was retried)

    async def _settle(self, bucket, raw_key, upload_id, raw, record):
        """Finish what a gateway that died holding an upload's claim had begun: an abort
        is carried out; a complete whose entry landed is tidied up; one whose entry did not
        land gives the upload back. True if the upload is open again."""
        manifest = record["end"]["mf"]
        if manifest is not None:
            try:
                entry = await self.entry(bucket, raw_key.decode())
                landed = entry.manifest == manifest
            except S3Error:
                landed = False
            if not landed:
                await self._unclaim(bucket, raw_key, upload_id, raw,
                                    msgpack.packb({k: v for k, v in record.items()
                                                   if k != "end"}))
                self.later(_delete_all(self.data(bucket), [manifest]))
                return True
            used = set(name for name, _ in msgpack.unpackb(
                await self.data(bucket).get(manifest)))
        else:
            used = set()
        await self._drop_parts(bucket, raw_key, upload_id, raw, used)
        return False

    async def _drop_parts(self, bucket, raw_key, upload_id, claimed, used=()):
        """The end of a claimed upload: its parts' data (but the `used` data names), its
        parts table, then its record."""
        have = await self._all_parts(bucket, upload_id)
        await _delete_all(self.data(bucket), [
            name for part in have.values() if part["d"] not in used
            for name in stripe_names(part["d"], part["s"])])
        try:
            await self.index().delete(bucket.parts(upload_id), plain=True)
        except ObjectNotFound:
            pass
        await self._release(bucket, raw_key, upload_id, claimed)

    async def put_part(self, bucket, key, upload_id, number, body, check=None, digest=None):
        await self.upload(bucket, key, upload_id)
        data = f"s3.{bucket.id}.{upload_id}.{number}.{secrets.token_hex(4)}"
        size, md5 = await self.write_data(bucket, data, body, digest=digest)
        part_key = b"%05d" % number
        try:
            if check is not None:
                check(size, md5)
            await self.upload(bucket, key, upload_id)   # not aborted or completed meanwhile
            index = self.index()
            old = await self._value(bucket.parts(upload_id), part_key)
            await index.omap_update(bucket.parts(upload_id), set={part_key: msgpack.packb(
                {"s": size, "e": md5, "d": data, "m": time.time()})}, create=True)
        except BaseException:
            self.later(_delete_all(self.data(bucket), stripe_names(data, size)))
            raise
        if old is not None:
            old = msgpack.unpackb(old)
            if old["d"] != data:
                # The replaced part's data goes only if no complete has claimed the upload
                # since our entry landed: a complete reads the parts after its claim, so it
                # names ours, not the old one. Otherwise the old data is left to the collector.
                try:
                    await self.upload(bucket, key, upload_id)
                except S3Error:
                    return md5
                self.later(_delete_all(self.data(bucket), stripe_names(old["d"], old["s"])))
        return md5

    async def parts(self, bucket, upload_id, after=0, limit=1000):
        """([(number, record)], more) of an upload's parts after part `after`."""
        try:
            entries, more = await self.index().omap_list(
                bucket.parts(upload_id), start_after=b"%05d" % after if after else None,
                limit=limit)
        except ObjectNotFound:
            return [], False
        return [(int(k), msgpack.unpackb(v)) for k, v in entries], more

    async def _all_parts(self, bucket, upload_id):
        found, after = {}, 0
        while True:
            page, more = await self.parts(bucket, upload_id, after)
            found.update(page)
            if not more or not page:
                return found
            after = page[-1][0]

    async def complete(self, bucket, key, upload_id, wanted):
        """Complete the upload from `wanted` [(number, etag)] in order: the ETag.

        The upload is claimed first (a racing abort, part upload or complete then finds
        NoSuchUpload), its parts read after the claim, the manifest written, the entry set;
        only then is the record removed. A complete that fails before its entry lands gives
        the upload back, so the client may retry it."""
        if not wanted:
            raise S3Error("MalformedXML", "CompleteMultipartUpload needs at least one part")
        numbers = [number for number, _ in wanted]
        if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
            raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
        raw_key = check_key(key)
        manifest = f"s3.{bucket.id}.{upload_id}.manifest.{secrets.token_hex(4)}"
        claimed, before = await self._claim(bucket, raw_key, upload_id, manifest)
        record = msgpack.unpackb(before)
        pool = self.data(bucket)
        try:
            have = await self._all_parts(bucket, upload_id)
            segments, digests, total = [], [], 0
            for position, (number, etag) in enumerate(wanted):
                part = have.get(number)
                if part is None or etag.strip('"') != part["e"]:
                    raise S3Error("InvalidPart", "One or more of the specified parts could "
                                  "not be found or its ETag did not match.", 400,
                                  PartNumber=number)
                if position < len(wanted) - 1 and part["s"] < PART_BYTES_MIN:
                    raise S3Error("EntityTooSmall", "Your proposed upload is smaller than the "
                                  "minimum allowed object size.", 400, PartNumber=number,
                                  ProposedSize=part["s"], MinSizeAllowed=PART_BYTES_MIN)
                segments.append([part["d"], part["s"]])
                digests.append(bytes.fromhex(part["e"]))
                total += part["s"]
            etag = f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(wanted)}"
            await pool.put(manifest, msgpack.packb(segments))
        except BaseException:
            await self._unclaim(bucket, raw_key, upload_id, claimed, before)
            raise
        value = Entry.encode(total, etag, record.get("ct"), record.get("md"),
                             manifest=manifest)
        if time.time() - msgpack.unpackb(claimed)["end"]["t"] > CLAIM_STALE_S / 2:
            # So slow (a cluster that barely answers) that another gateway may soon take
            # the claim for a dead one's and give the upload back: stop before the entry.
            await self._unclaim(bucket, raw_key, upload_id, claimed, before)
            self.later(_delete_all(pool, [manifest]))
            raise S3Error("ServiceUnavailable", "completing the upload took too long; retry",
                          503)
        try:
            old = await self._commit(bucket, raw_key, value)
        except BaseException:
            landed = await self._landed(bucket, raw_key, value)
            if landed is False:
                await self._unclaim(bucket, raw_key, upload_id, claimed, before)
                self.later(_delete_all(pool, [manifest]))
            raise                       # unknown: the claim goes stale and is settled then
        used = {data for data, _ in segments}
        unused = [name for part in have.values() if part["d"] not in used
                  for name in stripe_names(part["d"], part["s"])]
        await self._release(bucket, raw_key, upload_id, claimed)
        self.later(_delete_all(pool, unused))
        self.later(self.index().delete(bucket.parts(upload_id), plain=True))
        if old is not None:
            self.replaced(bucket, key, old)
        return etag

    async def abort(self, bucket, key, upload_id):
        raw_key = check_key(key)
        claimed, _ = await self._claim(bucket, raw_key, upload_id)
        await self._drop_parts(bucket, raw_key, upload_id, claimed)

    async def uploads(self, bucket, prefix="", after=b"", limit=1000):
        """([(key, upload id, record)], more) of the bucket's uploads in progress."""
        try:
            entries, more = await self.index().omap_list(
                bucket.uploads, start_after=after or None, prefix=prefix.encode(), limit=limit)
        except ObjectNotFound:
            return [], False
        found, now = [], time.time()
        for raw, value in entries:
            key, _, upload_id = raw.rpartition(b"\0")
            record = msgpack.unpackb(value)
            if "end" in record and now - record["end"]["t"] < CLAIM_STALE_S:
                continue                # being completed or aborted right now
            found.append((key.decode(), upload_id.decode(), record))
        return found, more


async def _delete_all(pool, names, concurrency=16):
    gate = asyncio.Semaphore(concurrency)

    async def one(name):
        async with gate:
            try:
                await pool.delete(name, plain=True)
            except ObjectNotFound:
                pass

    await asyncio.gather(*(one(name) for name in names), return_exceptions=True)
