"""cairn-s3: the S3 API over HTTP (aiohttp's low-level server), on a cairn cluster.

Each request: find the key's secret and entity (`Keys`, cached), check the signature
(s3/sigv4.py), check the entity's caps on BUCKET/KEY and the data pool's IP allowlists, then
run the operation on the store (s3/store.py). Bodies stream both ways: a PUT is hashed and
written stripe by stripe as it arrives, a GET sent stripe by stripe as it is read, with a few
stripes in flight, so memory stays bounded whatever the object's size and a slow client slows
its own transfer (aiohttp stops reading the socket when its buffer is full; writes wait for the
socket to drain). Changes and refusals go to the cluster's audit log (`cairn audit`).
"""

import asyncio
import base64
import collections
import logging
import secrets
import time
from urllib.parse import unquote

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cairn.client.errors import (ClientError, DataUnavailable, NoSpace, ObjectNotFound,
                                 PermissionDenied, PoolNotFound, PoolUnavailable, QuotaExceeded,
                                 Timeout)
from cairn.common import audit, auth, sessions
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.s3 import request as s3req, sigv4, xmlio
from cairn.s3.store import S3Error, no_such_key

log = logging.getLogger("cairn.s3")

KEY_CACHE_S = 10.0
AUDIT_FLUSH_S = 1.0
AUDIT_QUEUED_MAX = 1000
SMALL_BODY_BYTES = 1 << 20
WRITE_OPS = frozenset({"CreateBucket", "DeleteBucket", "PutObject", "CopyObject",
                       "DeleteObject", "DeleteObjects", "CreateMultipartUpload", "UploadPart",
                       "UploadPartCopy",
                       "CompleteMultipartUpload", "AbortMultipartUpload"})


class Caller:
    """Who sent a request: entity, caps and address."""
    __slots__ = ("entity", "caps", "ip")

    def __init__(self, entity, caps, ip):
        self.entity, self.caps, self.ip = entity, caps, ip


class Keys:
    """S3 access key -> (secret text, entity, Caps), asked of the monitors and kept
    KEY_CACHE_S: a revoked key, or changed caps, take effect within that."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._found = {}

    async def lookup(self, access_key):
        now = time.monotonic()
        found = self._found.get(access_key)
        if found is not None and now - found[0] < KEY_CACHE_S:
            return found[1]
        if not auth.S3_ACCESS_KEY_RE.match(access_key):
            raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not "
                          "exist in our records.", 403)
        try:
            reply, connection = await self.cluster.monc.request_with_session(
                {"op": "auth_s3_key_get", "key": access_key})
        except RequestFailed as exc:
            if exc.code == Code.NOT_FOUND:
                self._found.pop(access_key, None)
                raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does "
                              "not exist in our records.", 403) from None
            raise
        secret = auth.s3_secret_text(sessions.unwrap_reply(connection, reply.header))
        value = (secret, reply.header["entity"], auth.Caps.parse(reply.header["caps"]))
        if len(self._found) > 10_000:
            self._found.clear()
        self._found[access_key] = (now, value)
        return value


class Metrics:
    def __init__(self):
        self.requests = collections.Counter()       # (op, status) -> count
        self.bytes_in = 0
        self.bytes_out = 0
        self.seconds = collections.Counter()        # op -> wall seconds spent handling it
        self.in_flight = 0

    def collect(self):
        requests = CounterMetricFamily("cairn_s3_requests", "S3 requests by operation and "
                                       "HTTP status", labels=["op", "status"])
        for (op, status), count in sorted(self.requests.items()):
            requests.add_metric([op, str(status)], count)
        seconds = CounterMetricFamily("cairn_s3_request_seconds", "wall seconds spent on "
                                      "requests, by operation", labels=["op"])
        for op, total in sorted(self.seconds.items()):
            seconds.add_metric([op], total)
        yield requests
        yield seconds
        yield CounterMetricFamily("cairn_s3_received_bytes", "object bytes received",
                                  value=self.bytes_in)
        yield CounterMetricFamily("cairn_s3_sent_bytes", "object bytes sent",
                                  value=self.bytes_out)
        yield GaugeMetricFamily("cairn_s3_requests_in_flight", "requests being served",
                                value=self.in_flight)


class Gateway:
    def __init__(self, cluster, store, region="us-east-1", domains=()):
        self.cluster, self.store, self.region = cluster, store, region
        # Virtual-host addressing: a request to BUCKET.DOMAIN names the bucket in its Host.
        self.domains = tuple(domain.lower().strip(".") for domain in domains)
        self.keys = Keys(cluster)
        self.metrics = Metrics()
        self._audit = collections.deque()
        self.audit_dropped_total = 0
        self._request_ids = secrets.randbits(32)

    # -- the HTTP side ----------------------------------------------------------------------------

    async def handle(self, request):
        started = time.monotonic()
        self._request_ids += 1
        request_id = "%016X" % self._request_ids
        op = "Unknown"
        self.metrics.in_flight += 1
        try:
            try:
                op, response = await self._serve(request)
            except S3Error as err:
                response = self._error(request, err, request_id)
                op = getattr(err, "op", op)
            except sigv4.SigError as err:
                response = self._error(request, S3Error(err.code, err.message, 403), request_id)
                op = "Authenticate"
            except asyncio.CancelledError:
                raise
            except Exception as exc:                        # noqa: BLE001 (a reply, not a crash)
                err = self._client_error(exc)
                if err.status >= 500 and err.code == "InternalError":
                    log.exception("%s %s failed", request.method, request.path)
                response = self._error(request, err, request_id)
        finally:
            self.metrics.in_flight -= 1
        response.headers["x-amz-request-id"] = request_id
        response.headers["Server"] = "cairn-s3"
        self.metrics.requests[(op, response.status)] += 1
        self.metrics.seconds[op] += time.monotonic() - started
        return response

    def _client_error(self, exc):
        if isinstance(exc, PermissionDenied):
            return S3Error("AccessDenied", f"Access Denied ({exc})", 403)
        if isinstance(exc, NoSpace):
            return S3Error("InsufficientStorage", f"no space: {exc}", 507)
        if isinstance(exc, QuotaExceeded):
            return S3Error("QuotaExceeded", f"the pool's quota is reached: {exc}", 403)
        if isinstance(exc, (Timeout, DataUnavailable, PoolUnavailable, RequestFailed)):
            return S3Error("ServiceUnavailable", f"the cluster did not answer in time, retry: "
                           f"{exc}", 503)
        if isinstance(exc, PoolNotFound):
            return S3Error("NoSuchBucket", f"the bucket's pool is gone: {exc}", 404)
        if isinstance(exc, ObjectNotFound):
            return S3Error("ServiceUnavailable", "the object changed while it was read; retry",
                           503)
        if isinstance(exc, ClientError):
            return S3Error("InternalError", str(exc), 500)
        return S3Error("InternalError", "We encountered an internal error. Please try again.",
                       500)

    def _error(self, request, err, request_id):
        headers = {"Content-Type": "application/xml"}
        if request.method == "HEAD":
            return web.Response(status=err.status, headers=headers)
        return web.Response(status=err.status, headers=headers,
                            body=xmlio.error(err, request.path, request_id))

    # -- routing ------------------------------------------------------------------------------

    async def _serve(self, request):
        raw_path = request.raw_path.partition("?")[0]
        query = s3req.query_pairs(request.query_string)
        q = dict(query)
        path = unquote(raw_path)
        virtual = self._virtual_bucket(request.host)
        if virtual is None:
            bucket, _, key = path.lstrip("/").partition("/")
        else:
            bucket, key = virtual, path[1:] if path.startswith("/") else path
        request["virtual_bucket"] = virtual
        method = request.method
        op = s3req.operation(method, bucket, key, q, request.headers)
        try:
            caller = await self._authenticate(request, raw_path, query)
        except (S3Error, sigv4.SigError) as err:
            # The refused caller as far as known: the key's entity (a bad signature), the
            # unknown access key, or anonymous.
            who = Caller(getattr(err, "entity", None), None, request.remote)
            self._record(who, request.remote, op, f"{bucket}/{key}" if key else bucket,
                         getattr(err, "code", "AccessDenied"))
            if isinstance(err, S3Error):
                err.op = op
            raise
        if request.headers.get("Expect", "").lower() == "100-continue" and \
                request.version >= (1, 1):
            # The client waits for this before it sends the body (boto3 does for every PUT):
            # sent once the request is known to be signed by a key we hold.
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            response = await self._run(op, request, caller, bucket, key, q)
        except S3Error as err:
            err.op = op
            if op in WRITE_OPS or err.code == "AccessDenied":
                self._record(caller, caller.ip, op, f"{bucket}/{key}" if key else bucket,
                             err.code)
            raise
        except Exception as exc:
            if op in WRITE_OPS:
                self._record(caller, caller.ip, op, f"{bucket}/{key}" if key else bucket,
                             type(exc).__name__)
            raise
        if op in WRITE_OPS:
            self._record(caller, caller.ip, op, f"{bucket}/{key}" if key else bucket, "ok")
        return op, response

    def _virtual_bucket(self, host):
        """The bucket a Host of BUCKET.DOMAIN names (one of --domain), else None (path-style:
        the bucket is the path's first segment)."""
        if not self.domains or not host:
            return None
        name = host.lower()
        if name.startswith("["):
            return None                             # an IPv6 literal
        name = name.rpartition(":")[0] if ":" in name else name
        for domain in self.domains:
            if name.endswith("." + domain) and len(name) > len(domain) + 1:
                return name[:-len(domain) - 1]
        return None

    async def _run(self, op, request, caller, bucket, key, q):
        handler = getattr(self, "op_" + op, None)
        if handler is None:
            raise S3Error("NotImplemented", f"cairn-s3 does not implement {op}", 501)
        if op != "ListBuckets":
            found = await self.store.bucket(bucket) if op != "CreateBucket" else None
            return await handler(request, caller, found if found else bucket, key, q)
        return await handler(request, caller)

    # -- authentication and caps ----------------------------------------------------------------

    async def _authenticate(self, request, raw_path, query):
        signed = sigv4.parse(request.headers, query)
        if signed is None:
            raise S3Error("AccessDenied", "Access Denied: anonymous requests are refused; sign "
                          "with an S3 key ('cairn auth s3-key add client.NAME')", 403)
        try:
            secret, entity, caps = await self.keys.lookup(signed.access_key)
        except S3Error as err:
            err.entity = f"unknown S3 key {signed.access_key[:32]}"
            raise
        try:
            key = sigv4.verify(signed, secret, request.method, raw_path, query, request.headers,
                               v2_bucket=request.get("virtual_bucket"))
        except sigv4.SigError as err:
            err.entity = entity
            raise
        request["signed"], request["signing_key"] = signed, key
        return Caller(entity, caps, request.remote)

    def _allow(self, caller, perm, bucket, name):
        """AccessDenied unless the caller's caps and the address allow `perm` on BUCKET/KEY
        (`name`) in the bucket's data pool."""
        pool = bucket.pool if hasattr(bucket, "pool") else self.store.data_pool
        if not caller.caps.allows_object(perm, pool, name):
            raise S3Error("AccessDenied", f"Access Denied: {caller.entity} lacks "
                          f"osd={'r' if perm == 'r' else 'rw'} on {name!r} in pool {pool}", 403)
        cmap_pool = self.cluster.map.pools.get(pool)
        rules = cmap_pool.get("allow_from") if cmap_pool is not None else None
        if rules and not auth.admits(rules, caller.ip, name):
            raise S3Error("AccessDenied", f"Access Denied: {caller.ip} is not in the pool's "
                          "allowlist", 403)

    def _list_filter(self, caller, bucket, prefix):
        """None (every key under `prefix` is readable) or a function that tells which keys
        are; AccessDenied if none can be."""
        full = f"{bucket.name}/{prefix}"
        if caller.caps.admin:
            return None
        grants = caller.caps.list_prefixes(bucket.pool)
        if any(full.startswith(grant) for grant in grants):
            rules = (self.cluster.map.pools.get(bucket.pool) or {}).get("allow_from")
            if rules and not auth.admits(rules, caller.ip, full):
                raise S3Error("AccessDenied", f"Access Denied: {caller.ip} is not in the "
                              "pool's allowlist", 403)
            return None
        narrower = [grant[len(bucket.name) + 1:] for grant in grants if grant.startswith(full)]
        if not narrower:
            raise S3Error("AccessDenied", f"Access Denied: {caller.entity} may not list "
                          f"{full!r}", 403)
        return lambda key: any(key.startswith(grant) for grant in narrower)

    def _record(self, caller, addr, op, target, result):
        if len(self._audit) >= AUDIT_QUEUED_MAX:
            self._audit.popleft()
            self.audit_dropped_total += 1
        self._audit.append(audit.event(caller.entity if caller else None, addr, "s3:" + op,
                                       target[:256], result))

    async def audit_loop(self):
        """Send the queued audit events to the monitors once a second (and at the end)."""
        while True:
            await asyncio.sleep(AUDIT_FLUSH_S)
            await self.flush_audit()

    async def flush_audit(self):
        if not self._audit:
            return
        events = list(self._audit)
        try:
            await self.cluster.monc.request({"op": "audit_report", "events": events})
        except Exception as exc:                            # noqa: BLE001 (kept, sent again)
            log.warning("audit: %d events not sent yet: %s", len(events), exc)
            return
        for _ in events:
            self._audit.popleft()

    # -- buckets ------------------------------------------------------------------------------

    async def op_ListBuckets(self, request, caller):
        shown = []
        for bucket in await self.store.buckets():
            prefix = bucket.name + "/"
            if caller.caps.admin or any(
                    grant.startswith(prefix) or prefix.startswith(grant)
                    for grant in caller.caps.list_prefixes(bucket.pool)):
                shown.append(bucket)
        body = "".join(f"<Bucket>{xmlio.element('Name', b.name)}"
                       f"{xmlio.element('CreationDate', xmlio.iso(b.created))}</Bucket>"
                       for b in shown)
        return _xml("ListAllMyBucketsResult",
                    f"<Owner><ID>{xmlio.text(caller.entity)}</ID>"
                    f"<DisplayName>{xmlio.text(caller.entity)}</DisplayName></Owner>"
                    f"<Buckets>{body}</Buckets>")

    async def op_CreateBucket(self, request, caller, name, key, q):
        self._allow(caller, "w", _Named(name, self.store.data_pool), f"{name}/")
        body = await s3req.small_body(request)
        pool = None
        if body.strip():
            tree = xmlio.parse(body, "CreateBucketConfiguration")
            location = xmlio.child_text(tree, "LocationConstraint")
            if location and location != self.region:
                pool = location
                self._allow(caller, "w", _Named(name, pool), f"{name}/")
        await self.store.create_bucket(name, caller.entity, pool)
        return web.Response(headers={"Location": f"/{name}"})

    async def op_HeadBucket(self, request, caller, bucket, key, q):
        self._list_filter(caller, bucket, "")
        return web.Response(headers={"x-amz-bucket-region": self.region})

    async def op_GetBucketLocation(self, request, caller, bucket, key, q):
        self._list_filter(caller, bucket, "")
        return web.Response(body=xmlio.HEAD.encode() + f'<LocationConstraint xmlns="'
                            f'{xmlio.NS}">{xmlio.text(bucket.pool)}</LocationConstraint>'
                            .encode(), content_type="application/xml")

    async def op_GetBucketVersioning(self, request, caller, bucket, key, q):
        self._list_filter(caller, bucket, "")
        return _xml("VersioningConfiguration", "")

    async def op_DeleteBucket(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/")
        await self.store.delete_bucket(bucket.name)
        return web.Response(status=204)

    async def op_ListObjects(self, request, caller, bucket, key, q, v2=False):
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        url = q.get("encoding-type") == "url"
        if "encoding-type" in q and not url:
            raise S3Error("InvalidArgument", "encoding-type must be url")
        try:
            max_keys = int(q.get("max-keys", "1000"))
        except ValueError:
            raise S3Error("InvalidArgument", "max-keys must be a number") from None
        if max_keys < 0:
            raise S3Error("InvalidArgument", "max-keys must not be negative")
        max_keys = min(max_keys, 1000)
        visible = self._list_filter(caller, bucket, prefix)
        if v2:
            token = q.get("continuation-token")
            if token is not None:
                try:
                    after = base64.urlsafe_b64decode(token.encode())
                except ValueError:
                    raise S3Error("InvalidArgument", "The continuation token provided is "
                                  "incorrect") from None
            else:
                after = q.get("start-after", "").encode()
        else:
            after = q.get("marker", "").encode()
        if delimiter and after.startswith(prefix.encode()) and \
                after.endswith(delimiter.encode()) and \
                after.find(delimiter.encode(), len(prefix.encode())) == len(after) - \
                len(delimiter.encode()):
            after = after + b"\xff"             # a common prefix: past everything under it
        if max_keys == 0:
            entries, prefixes, truncated, last = [], [], False, None
        else:
            entries, prefixes, truncated, last = await self.store.list(
                bucket, prefix, delimiter, after, max_keys, visible)
        out = [xmlio.element("Name", bucket.name),
               f"<Prefix>{xmlio.key_text(prefix, url)}</Prefix>",
               xmlio.element("MaxKeys", max_keys),
               xmlio.element("IsTruncated", "true" if truncated else "false")]
        if delimiter:
            out.append(f"<Delimiter>{xmlio.key_text(delimiter, url)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        if v2:
            out.append(xmlio.element("KeyCount", len(entries) + len(prefixes)))
            if "continuation-token" in q:
                out.append(xmlio.element("ContinuationToken", q["continuation-token"]))
            if "start-after" in q:
                out.append(f"<StartAfter>{xmlio.key_text(q['start-after'], url)}</StartAfter>")
            if truncated:
                out.append(xmlio.element("NextContinuationToken",
                                         base64.urlsafe_b64encode(last).decode()))
        else:
            out.append(f"<Marker>{xmlio.key_text(q.get('marker', ''), url)}</Marker>")
            if truncated and last is not None:
                out.append(f"<NextMarker>{xmlio.key_text(last.decode(), url)}</NextMarker>")
        key_text, iso = xmlio.key_text, xmlio.iso
        for name, entry in entries:
            out.append(f"<Contents><Key>{key_text(name, url)}</Key>"
                       f"<LastModified>{iso(entry['m'])}</LastModified>"
                       f"<ETag>&quot;{entry['e']}&quot;</ETag><Size>{entry['s']}</Size>"
                       f"<StorageClass>STANDARD</StorageClass></Contents>")
        for common in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{xmlio.key_text(common, url)}</Prefix>"
                       f"</CommonPrefixes>")
        return _xml("ListBucketResult", "".join(out))

    async def op_ListObjectsV2(self, request, caller, bucket, key, q):
        return await self.op_ListObjects(request, caller, bucket, key, q, v2=True)

    # -- objects ------------------------------------------------------------------------------

    async def op_PutObject(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        meta = s3req.user_metadata(request.headers)
        body = s3req.Body(request)
        etag = await self.store.put(bucket, key, body.pieces(),
                                    request.headers.get("Content-Type"), meta, body.check,
                                    body.digest)
        self.metrics.bytes_in += body.size
        return web.Response(headers={"ETag": f'"{etag}"', **body.echo()})

    async def op_GetObject(self, request, caller, bucket, key, q, head=False):
        self._allow(caller, "r", bucket, f"{bucket.name}/{key}")
        for attempt in range(3):
            entry = await self.store.entry(bucket, key)
            status = s3req.preconditions(request.headers, entry)
            headers = s3req.object_headers(entry)
            if status is not None:
                if status == 304:
                    return web.Response(status=304, headers={"ETag": headers["ETag"],
                                        "Last-Modified": headers["Last-Modified"]})
                raise S3Error("PreconditionFailed", "At least one of the pre-conditions you "
                              "specified did not hold", 412)
            start, end, status = 0, entry.size, 200
            wanted = request.headers.get("Range")
            if "partNumber" in q:
                raise S3Error("NotImplemented", "GetObject by partNumber is not supported", 501)
            if wanted is not None:
                found = s3req.byte_range(wanted, entry.size)
                if found is not None:
                    start, end = found
                    status = 206
                    headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
            headers["Content-Length"] = str(end - start)
            if head:
                return web.Response(status=status, headers=headers)
            stream = self.store.read(bucket, entry, start, end)
            try:
                if end - start <= SMALL_BODY_BYTES:
                    body = b"".join([bytes(piece) async for piece in stream])
                    self.metrics.bytes_out += len(body)
                    return web.Response(status=status, headers=headers, body=body)
                first = await stream.__anext__()
            except ObjectNotFound:
                if attempt == 2:
                    raise
                continue                # replaced while we read: read the new one
            response = web.StreamResponse(status=status, headers=headers)
            await response.prepare(request)
            sent = 0
            try:
                await response.write(first)
                sent = len(first)
                async for piece in stream:
                    await response.write(piece)
                    sent += len(piece)
                await response.write_eof()
            except (ClientError, RequestFailed) as exc:
                # The status is sent: all that is left is to cut the body short, which the
                # client sees as a short read (and retries).
                log.warning("GET %s/%s cut after %d bytes: %s", bucket.name, key, sent, exc)
                if request.transport is not None:
                    request.transport.close()
            finally:
                self.metrics.bytes_out += sent
            return response
        raise no_such_key(key)

    async def op_HeadObject(self, request, caller, bucket, key, q):
        return await self.op_GetObject(request, caller, bucket, key, q, head=True)

    async def op_DeleteObject(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        await self.store.delete(bucket, key)
        return web.Response(status=204)

    async def op_DeleteObjects(self, request, caller, bucket, key, q):
        body = await s3req.small_body(request)
        s3req.check_md5(request.headers, body)
        keys, quiet = xmlio.delete_request(body)
        gate = asyncio.Semaphore(16)

        async def one(name):
            async with gate:
                try:
                    self._allow(caller, "w", bucket, f"{bucket.name}/{name}")
                    await self.store.delete(bucket, name)
                    return name, None
                except S3Error as err:
                    return name, err
                except ClientError as exc:
                    return name, self._client_error(exc)

        results = await asyncio.gather(*(one(name) for name in keys))
        out = []
        for name, err in results:
            if err is None:
                if not quiet:
                    out.append(f"<Deleted>{xmlio.element('Key', name)}</Deleted>")
            else:
                out.append(f"<Error>{xmlio.element('Key', name)}{xmlio.element('Code', err.code)}"
                           f"{xmlio.element('Message', err.message)}</Error>")
        return _xml("DeleteResult", "".join(out))

    async def _copy_source(self, request, caller):
        """(bucket, entry) of `x-amz-copy-source`, readable by the caller and meeting the
        `x-amz-copy-source-if-*` conditions."""
        source = unquote(request.headers["x-amz-copy-source"]).lstrip("/")
        source_bucket_name, _, source_key = source.partition("/")
        source_key = source_key.partition("?versionId=")[0]
        if not source_key:
            raise S3Error("InvalidArgument", "x-amz-copy-source must be BUCKET/KEY")
        source_bucket = await self.store.bucket(source_bucket_name)
        self._allow(caller, "r", source_bucket, f"{source_bucket.name}/{source_key}")
        entry = await self.store.entry(source_bucket, source_key)
        copy_headers = {name[len("x-amz-copy-source-"):]: value
                        for name, value in request.headers.items()
                        if name.lower().startswith("x-amz-copy-source-if-")}
        if copy_headers and s3req.preconditions(
                {name.replace("if-", "If-", 1): value for name, value in copy_headers.items()},
                entry) is not None:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you "
                          "specified did not hold", 412)
        return source_bucket, entry

    async def op_CopyObject(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        source_bucket, entry = await self._copy_source(request, caller)
        source_key = entry.key
        directive = request.headers.get("x-amz-metadata-directive", "COPY").upper()
        if directive not in ("COPY", "REPLACE"):
            raise S3Error("InvalidArgument", "x-amz-metadata-directive is COPY or REPLACE")
        if directive == "COPY":
            if source_bucket.name == bucket.name and source_key == key:
                raise S3Error("InvalidRequest", "This copy request is illegal because it is "
                              "trying to copy an object to itself without changing the "
                              "object's metadata.")
            meta, content_type = entry.meta, entry.content_type
        else:
            meta, content_type = s3req.user_metadata(request.headers), \
                request.headers.get("Content-Type")
        etag = await self.store.put(bucket, key, self.store.read(source_bucket, entry),
                                    content_type, meta)
        return _xml("CopyObjectResult", f"{xmlio.element('LastModified', xmlio.iso(time.time()))}"
                    f"<ETag>&quot;{etag}&quot;</ETag>")

    # -- multipart ----------------------------------------------------------------------------

    async def op_CreateMultipartUpload(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        upload_id = await self.store.create_upload(bucket, key, caller.entity,
                                                   request.headers.get("Content-Type"),
                                                   s3req.user_metadata(request.headers))
        return _xml("InitiateMultipartUploadResult", xmlio.element("Bucket", bucket.name) +
                    xmlio.element("Key", key) + xmlio.element("UploadId", upload_id))

    async def op_UploadPartCopy(self, request, caller, bucket, key, q):
        """A part made of (a range of) another object: what `aws s3 cp s3://... s3://...`
        and boto3's managed copy send for objects past their multipart threshold."""
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        number = s3req.part_number(q.get("partNumber"))
        source_bucket, entry = await self._copy_source(request, caller)
        start, end = 0, entry.size
        wanted = request.headers.get("x-amz-copy-source-range")
        if wanted is not None:
            start, end = s3req.copy_range(wanted, entry.size)
        etag = await self.store.put_part(bucket, key, q["uploadId"], number,
                                         self.store.read(source_bucket, entry, start, end))
        return _xml("CopyPartResult", xmlio.element("LastModified", xmlio.iso(time.time())) +
                    f"<ETag>&quot;{etag}&quot;</ETag>")

    async def op_UploadPart(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        number = s3req.part_number(q.get("partNumber"))
        body = s3req.Body(request)
        etag = await self.store.put_part(bucket, key, q["uploadId"], number, body.pieces(),
                                         body.check, body.digest)
        self.metrics.bytes_in += body.size
        return web.Response(headers={"ETag": f'"{etag}"', **body.echo()})

    async def op_CompleteMultipartUpload(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        parts = xmlio.complete_request(await s3req.small_body(request))
        etag = await self.store.complete(bucket, key, q["uploadId"], parts)
        return _xml("CompleteMultipartUploadResult",
                    xmlio.element("Location", f"/{bucket.name}/{key}") +
                    xmlio.element("Bucket", bucket.name) + xmlio.element("Key", key) +
                    f"<ETag>&quot;{etag}&quot;</ETag>")

    async def op_AbortMultipartUpload(self, request, caller, bucket, key, q):
        self._allow(caller, "w", bucket, f"{bucket.name}/{key}")
        await self.store.abort(bucket, key, q["uploadId"])
        return web.Response(status=204)

    async def op_ListParts(self, request, caller, bucket, key, q):
        self._allow(caller, "r", bucket, f"{bucket.name}/{key}")
        upload_id = q["uploadId"]
        record = await self.store.upload(bucket, key, upload_id)
        try:
            after = int(q.get("part-number-marker", "0"))
            limit = max(1, min(1000, int(q.get("max-parts", "1000"))))
        except ValueError:
            raise S3Error("InvalidArgument", "part-number-marker and max-parts are "
                          "numbers") from None
        parts, more = await self.store.parts(bucket, upload_id, after, limit)
        out = [xmlio.element("Bucket", bucket.name), xmlio.element("Key", key),
               xmlio.element("UploadId", upload_id),
               xmlio.element("PartNumberMarker", after), xmlio.element("MaxParts", limit),
               xmlio.element("IsTruncated", "true" if more else "false"),
               f"<Initiator><ID>{xmlio.text(record.get('o'))}</ID></Initiator>",
               "<StorageClass>STANDARD</StorageClass>"]
        if more and parts:
            out.append(xmlio.element("NextPartNumberMarker", parts[-1][0]))
        for number, part in parts:
            out.append(f"<Part>{xmlio.element('PartNumber', number)}"
                       f"{xmlio.element('LastModified', xmlio.iso(part['m']))}"
                       f"<ETag>&quot;{part['e']}&quot;</ETag>{xmlio.element('Size', part['s'])}"
                       f"</Part>")
        return _xml("ListPartsResult", "".join(out))

    async def op_ListMultipartUploads(self, request, caller, bucket, key, q):
        prefix = q.get("prefix", "")
        visible = self._list_filter(caller, bucket, prefix)
        try:
            limit = max(1, min(1000, int(q.get("max-uploads", "1000"))))
        except ValueError:
            raise S3Error("InvalidArgument", "max-uploads is a number") from None
        after = b""
        if q.get("key-marker"):
            after = q["key-marker"].encode() + b"\0" + q.get("upload-id-marker", "").encode()
            if not q.get("upload-id-marker"):
                after = q["key-marker"].encode() + b"\0\xff"
        uploads, more = await self.store.uploads(bucket, prefix, after, limit)
        out = [xmlio.element("Bucket", bucket.name),
               xmlio.element("KeyMarker", q.get("key-marker", "")),
               xmlio.element("UploadIdMarker", q.get("upload-id-marker", "")),
               xmlio.element("Prefix", prefix), xmlio.element("MaxUploads", limit),
               xmlio.element("IsTruncated", "true" if more else "false")]
        if more and uploads:
            out.append(xmlio.element("NextKeyMarker", uploads[-1][0]) +
                       xmlio.element("NextUploadIdMarker", uploads[-1][1]))
        for name, upload_id, record in uploads:
            if visible is not None and not visible(name):
                continue
            out.append(f"<Upload>{xmlio.element('Key', name)}"
                       f"{xmlio.element('UploadId', upload_id)}"
                       f"<Initiator><ID>{xmlio.text(record.get('o'))}</ID></Initiator>"
                       f"<StorageClass>STANDARD</StorageClass>"
                       f"{xmlio.element('Initiated', xmlio.iso(record['i']))}</Upload>")
        return _xml("ListMultipartUploadsResult", "".join(out))


class _Named:
    """A bucket not made yet: its name and the pool it would live in (for caps)."""

    def __init__(self, name, pool):
        self.name, self.pool = name, pool


def _xml(root, body):
    return web.Response(body=xmlio.document(root, body), content_type="application/xml")
