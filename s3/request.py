"""What an S3 request says: its operation, its body (de-chunked, hashed, checked), its range,
its conditions and its metadata (s3/gateway.py serves it).
"""

import asyncio
import base64
import email.utils
import hashlib
import zlib
from urllib.parse import unquote

from cairn.native.checksum import crc32c
from cairn.s3 import sigv4, xmlio
from cairn.s3.store import PART_NUMBER_MAX, USER_METADATA_BYTES_MAX, S3Error

CHUNK_LINE_BYTES_MAX = 4096
CHECKSUMS = ("crc32c", "crc32", "sha1", "sha256")


# -- request bodies ----------------------------------------------------------------------------

class Body:
    """A PUT's body as it arrives: de-chunked (aws-chunked, chunk signatures checked), hashed
    for the checks the request asks (x-amz-content-sha256, Content-MD5, x-amz-checksum-*),
    which fail the request before its object becomes visible."""

    def __init__(self, request):
        self.request = request
        headers = request.headers
        self.signed = request.get("signed")
        self.payload = self.signed.payload_hash if self.signed else sigv4.UNSIGNED
        self.size = 0
        self.checksums = {}         # algorithm -> expected base64 (header or trailer)
        for algorithm in CHECKSUMS:
            value = headers.get(f"x-amz-checksum-{algorithm}")
            if value is not None:
                self.checksums[algorithm] = value
        self.trailers = [name.strip().lower() for name in
                         headers.get("x-amz-trailer", "").split(",") if name.strip()]
        for name in self.trailers:
            if not (name.startswith("x-amz-checksum-") and name[15:] in CHECKSUMS):
                raise S3Error("InvalidRequest", f"unsupported trailer {name!r}")
        self.content_md5 = headers.get("Content-MD5")
        self.decoded_length = headers.get("x-amz-decoded-content-length")
        self.hashers = {}

    def _hashers(self):
        hashers = {}
        if self.payload not in sigv4.STREAMING and self.payload != sigv4.UNSIGNED:
            if len(self.payload) != 64:
                raise S3Error("InvalidArgument", "x-amz-content-sha256 must be a SHA-256 hex "
                              "digest, UNSIGNED-PAYLOAD or a STREAMING- form")
            hashers["payload"] = hashlib.sha256()
        for algorithm in list(self.checksums) + [t[15:] for t in self.trailers]:
            if algorithm in ("sha1", "sha256"):
                hashers[algorithm] = hashlib.new(algorithm)
            else:
                hashers[algorithm] = [0]
        return hashers

    def digest(self, pieces):
        """Hash a stripe's pieces for the checks asked (store.write_data calls this in order,
        in a thread for large stripes)."""
        for name, hasher in self.hashers.items():
            for piece in pieces:
                if name == "crc32c":
                    hasher[0] = crc32c(piece, hasher[0])
                elif name == "crc32":
                    hasher[0] = zlib.crc32(piece, hasher[0])
                else:
                    hasher.update(piece)

    async def pieces(self):
        self.hashers = self._hashers()
        if self.payload in sigv4.STREAMING:
            source = self._dechunk()
        else:
            source = self.request.content.iter_any()
        async for piece in source:
            self.size += len(piece)
            yield piece
        if self.decoded_length is not None and str(self.size) != self.decoded_length.strip():
            raise S3Error("IncompleteBody", "You did not provide the number of bytes specified "
                          "by the x-amz-decoded-content-length header.")

    async def _dechunk(self):
        content = self.request.content
        verifier = None
        if self.payload != sigv4.STREAMING_UNSIGNED_TRAILER:
            verifier = sigv4.ChunkVerifier(self.request["signing_key"], self.signed)
        while True:
            line = await content.readline()
            if not line.endswith(b"\r\n") or len(line) > CHUNK_LINE_BYTES_MAX:
                raise S3Error("IncompleteBody", "an aws-chunked body ended or broke inside a "
                              "chunk header")
            size_text, _, extension = line[:-2].decode("latin-1").partition(";")
            try:
                size = int(size_text, 16)
            except ValueError:
                raise S3Error("InvalidRequest", "an aws-chunked chunk size is not hex") \
                    from None
            signature = extension.partition("chunk-signature=")[2] if verifier else None
            if verifier is not None and not signature:
                raise S3Error("SignatureDoesNotMatch", "an aws-chunked chunk has no signature",
                              403)
            try:
                data = await content.readexactly(size) if size else b""
            except asyncio.IncompleteReadError:
                raise S3Error("IncompleteBody", "the body ended inside a chunk") from None
            if verifier is not None:
                try:
                    verifier.check(signature, hashlib.sha256(data).hexdigest())
                except sigv4.SigError as err:
                    raise S3Error(err.code, err.message, 403) from None
            if size == 0:
                break
            if await content.readexactly(2) != b"\r\n":
                raise S3Error("IncompleteBody", "a chunk's data is not followed by CRLF")
            yield data
        await self._trailer(verifier)

    async def _trailer(self, verifier):
        content = self.request.content
        lines = []
        while True:
            line = await content.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            if len(line) > CHUNK_LINE_BYTES_MAX or len(lines) > 16:
                raise S3Error("InvalidRequest", "the aws-chunked trailer is too long")
            lines.append(line.decode("latin-1").strip())
        found, signature = {}, None
        for line in lines:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "x-amz-trailer-signature":
                signature = value.strip()
            else:
                found[name] = value.strip()
        if verifier is not None and self.payload == sigv4.STREAMING_SIGNED_TRAILER:
            text = "".join(f"{name}:{value}\n" for name, value in found.items())
            try:
                verifier.check_trailer(signature or "", text)
            except sigv4.SigError as err:
                raise S3Error(err.code, err.message, 403) from None
        for name in self.trailers:
            if name not in found:
                raise S3Error("InvalidRequest", f"the trailer {name} was announced but not sent")
            self.checksums[name[15:]] = found[name]

    def check(self, size, md5_hex):
        """Raise if the body does not match what the request said of it (nothing of it is
        visible yet)."""
        if "payload" in self.hashers and \
                self.hashers["payload"].hexdigest() != self.payload.lower():
            raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' "
                          "header does not match what was computed.")
        for algorithm, expected in self.checksums.items():
            if digest_b64(algorithm, self.hashers[algorithm]) != expected:
                raise S3Error("BadDigest", f"The {algorithm.upper()} you specified did not "
                              "match the calculated checksum.")
        if self.content_md5 is not None:
            try:
                wanted = base64.b64decode(self.content_md5, validate=True)
            except ValueError:
                wanted = b""
            if len(wanted) != 16:
                raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.")
            if wanted.hex() != md5_hex:
                raise S3Error("BadDigest", "The Content-MD5 you specified did not match what "
                              "we received.")

    def echo(self):
        """The checksum headers a PUT's reply carries back."""
        return {f"x-amz-checksum-{algorithm}": value
                for algorithm, value in self.checksums.items()}


def digest_b64(algorithm, hasher):
    if algorithm in ("crc32c", "crc32"):
        return base64.b64encode(hasher[0].to_bytes(4, "big")).decode()
    return base64.b64encode(hasher.digest()).decode()


async def small_body(request):
    """A request body that is XML (bucket configuration, DeleteObjects, Complete...)."""
    if request.content_length is not None and \
            request.content_length > xmlio.REQUEST_XML_BYTES_MAX:
        raise S3Error("MalformedXML", "the XML request body is too large")
    body = bytearray()
    async for piece in request.content.iter_any():
        body += piece
        if len(body) > xmlio.REQUEST_XML_BYTES_MAX:
            raise S3Error("MalformedXML", "the XML request body is too large")
    signed = request.get("signed")
    if signed is not None and len(signed.payload_hash) == 64 and \
            hashlib.sha256(body).hexdigest() != signed.payload_hash.lower():
        raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' "
                      "header does not match what was computed.")
    return bytes(body)


def check_md5(headers, body):
    wanted = headers.get("Content-MD5")
    if wanted is not None and base64.b64encode(hashlib.md5(body).digest()).decode() != wanted:
        raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we "
                      "received.")


# -- small helpers -----------------------------------------------------------------------------

def query_pairs(query_string):
    """Decoded (name, value) pairs of a raw query string, in order."""
    pairs = []
    for part in query_string.split("&") if query_string else ():
        name, _, value = part.partition("=")
        pairs.append((unquote(name), unquote(value)))
    return pairs


def operation(method, bucket, key, q, headers):
    if not bucket:
        return "ListBuckets" if method == "GET" else "Unknown"
    if not key:
        if method == "GET":
            for sub, op in (("uploads", "ListMultipartUploads"),
                            ("location", "GetBucketLocation"),
                            ("versioning", "GetBucketVersioning")):
                if sub in q:
                    return op
            if unsupported(q):
                return "Unsupported"
            return "ListObjectsV2" if q.get("list-type") == "2" else "ListObjects"
        if unsupported(q):
            return "Unsupported"
        return {"PUT": "CreateBucket", "HEAD": "HeadBucket", "DELETE": "DeleteBucket",
                "POST": "DeleteObjects" if "delete" in q else "Unknown"}.get(method, "Unknown")
    if unsupported(q):
        return "Unsupported"
    if method == "PUT":
        if "uploadId" in q:
            return "UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"
        return "CopyObject" if "x-amz-copy-source" in headers else "PutObject"
    if method == "GET":
        return "ListParts" if "uploadId" in q else "GetObject"
    if method == "HEAD":
        return "HeadObject"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    if method == "POST":
        if "uploads" in q:
            return "CreateMultipartUpload"
        if "uploadId" in q:
            return "CompleteMultipartUpload"
    return "Unknown"


SUBRESOURCES_UNSUPPORTED = ("acl", "tagging", "policy", "cors", "lifecycle", "website",
                            "replication", "notification", "logging", "encryption",
                            "object-lock", "retention", "legal-hold", "torrent", "restore",
                            "select", "versions", "accelerate", "requestPayment", "analytics",
                            "inventory", "metrics", "intelligent-tiering", "ownershipControls",
                            "publicAccessBlock", "attributes")


def unsupported(q):
    return any(sub in q for sub in SUBRESOURCES_UNSUPPORTED)


def user_metadata(headers):
    meta = {name[len("x-amz-meta-"):].lower(): value for name, value in headers.items()
            if name.lower().startswith("x-amz-meta-")}
    if sum(len(k) + len(v) for k, v in meta.items()) > USER_METADATA_BYTES_MAX:
        raise S3Error("MetadataTooLarge", "Your metadata headers exceed the maximum allowed "
                      "metadata size.")
    return meta


def object_headers(entry):
    headers = {"ETag": f'"{entry.etag}"', "Last-Modified": xmlio.http_date(entry.mtime),
               "Accept-Ranges": "bytes",
               "Content-Type": entry.content_type or "binary/octet-stream"}
    for name, value in entry.meta.items():
        headers[f"x-amz-meta-{name}"] = value
    return headers


def parse_http_date(text):
    try:
        found = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return found.timestamp() if found is not None else None


def etag_matches(header, etag):
    wanted = [part.strip().strip('"') for part in header.split(",")]
    return "*" in wanted or etag in wanted


def preconditions(headers, entry):
    """None if the request's conditions hold, else 412 or 304 (S3's order of evaluation)."""
    mtime = int(entry.mtime)
    if_match, if_none = headers.get("If-Match"), headers.get("If-None-Match")
    if if_match is not None and not etag_matches(if_match, entry.etag):
        return 412
    if if_match is None and headers.get("If-Unmodified-Since") is not None:
        since = parse_http_date(headers["If-Unmodified-Since"])
        if since is not None and mtime > since:
            return 412
    if if_none is not None and etag_matches(if_none, entry.etag):
        return 304
    if if_none is None and headers.get("If-Modified-Since") is not None:
        since = parse_http_date(headers["If-Modified-Since"])
        if since is not None and mtime <= since:
            return 304
    return None


def byte_range(text, size):
    """(start, end) of a `bytes=` Range header, None to send it all (an unparsable range, as
    S3), S3Error InvalidRange when it lies past the end."""
    unit, _, spec = text.strip().partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            count = int(last)
            if count <= 0:
                raise S3Error("InvalidRange", "The requested range is not satisfiable", 416,
                              RangeRequested=text, ActualObjectSize=size)
            return max(0, size - count), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", 416,
                      RangeRequested=text, ActualObjectSize=size)
    return start, min(end, size)


def copy_range(text, size):
    """(start, end) of an `x-amz-copy-source-range` header: `bytes=FIRST-LAST`, both given,
    within the source (S3 refuses any other form)."""
    unit, _, spec = text.strip().partition("=")
    first, dash, last = spec.strip().partition("-")
    try:
        start, end = int(first), int(last) + 1
    except ValueError:
        start = end = -1
    if unit.strip() != "bytes" or not dash or start < 0 or end <= start:
        raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the "
                      "form bytes=first-last where first and last are the zero-based offsets "
                      "of the first and last bytes to copy", 400)
    if end > size:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", 416,
                      RangeRequested=text, ActualObjectSize=size)
    return start, end


def part_number(text):
    try:
        number = int(text)
    except (TypeError, ValueError):
        number = 0
    if not 1 <= number <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{PART_NUMBER_MAX}, inclusive")
    return number
