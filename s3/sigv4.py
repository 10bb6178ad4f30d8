"""AWS Signature Version 4 (and 2) as an S3 server checks it (pure: no I/O).

A request is signed in its `Authorization` header or in its query (a presigned URL). Both sign
the same canonical request: method, path, sorted query, the signed headers, the payload's hash.
`parse` reads which form a request uses (None: anonymous); `verify` recomputes the signature
with the key's secret and raises `SigError` with S3's code when it differs or has expired.

The payload hash is the `x-amz-content-sha256` header: the body's SHA-256 (the gateway hashes
the body as it streams and refuses to commit on a mismatch), `UNSIGNED-PAYLOAD`, or one of the
aws-chunked forms, where every chunk carries its own signature chained from the request's
(`ChunkVerifier`), or none (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`, with a checksum trailer).

Signature Version 2 (HMAC-SHA1 over method, Content-MD5, Content-Type, date, x-amz- headers and
the resource) is checked too, because boto3's `generate_presigned_url` still makes V2 URLs
unless the client is configured for s3v4; it signs no payload.
"""

import base64
import calendar
import dataclasses
import email.utils
import functools
import hashlib
import hmac
import time
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER})
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# A header-signed request's time may differ from ours by this much (S3's own limit).
CLOCK_SKEW_S = 15 * 60
# A presigned URL lives at most a week (S3's limit).
PRESIGN_EXPIRES_S_MAX = 7 * 24 * 3600


class SigError(Exception):
    """A request whose signature cannot be accepted: `code` is S3's error code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class Signed:
    access_key: str
    date: str               # YYYYMMDD of the scope
    region: str
    service: str
    signed_headers: tuple   # lower-case names, in the order signed
    signature: str
    amz_date: str           # YYYYMMDDTHHMMSSZ
    payload_hash: str
    presigned: bool
    expires_s: int = 0

    @property
    def scope(self):
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


@dataclasses.dataclass(frozen=True)
class SignedV2:
    access_key: str
    signature: str
    presigned: bool
    expires: int = 0                # presigned: the URL's end, seconds since the epoch
    payload_hash: str = UNSIGNED


# Query parameters that are part of a V2 signature's resource.
V2_SUBRESOURCES = frozenset({
    "acl", "cors", "delete", "lifecycle", "location", "logging", "notification", "partNumber",
    "policy", "requestPayment", "restore", "tagging", "torrent", "uploadId", "uploads",
    "versionId", "versioning", "versions", "website", "response-content-type",
    "response-content-language", "response-expires", "response-cache-control",
    "response-content-disposition", "response-content-encoding", "select", "select-type",
    "object-lock", "replication", "analytics", "metrics", "inventory", "accelerate",
    "storageClass", "defaultObjectAcl"})


def _malformed(message, presigned=False):
    return SigError("AuthorizationQueryParametersError" if presigned
                    else "AuthorizationHeaderMalformed", message)


def _credential(text, presigned):
    parts = text.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise _malformed(f"the credential {text!r} is not ACCESS_KEY/DATE/REGION/SERVICE/"
                         "aws4_request", presigned)
    if len(parts[1]) != 8 or not parts[1].isdigit():
        raise _malformed(f"the credential's date {parts[1]!r} is not YYYYMMDD", presigned)
    return parts[:4]


def parse(headers, query):
    """The request's signature (`headers`: a case-insensitive mapping; `query`: decoded
    (name, value) pairs), or None if it carries none. SigError if it is malformed."""
    authorization = headers.get("Authorization")
    if authorization is not None:
        algorithm, _, rest = authorization.strip().partition(" ")
        if algorithm == "AWS":
            access_key, sep, signature = rest.strip().rpartition(":")
            if not sep or not access_key:
                raise _malformed("a V2 Authorization header is AWS ACCESS_KEY:SIGNATURE")
            return SignedV2(access_key, signature, False)
        if algorithm != ALGORITHM:
            raise SigError("InvalidRequest" if algorithm.startswith("AWS") else
                           "AuthorizationHeaderMalformed",
                           f"only {ALGORITHM} (Signature Version 4) is supported, not "
                           f"{algorithm[:32]!r}")
        fields = {}
        for part in rest.split(","):
            name, sep, value = part.strip().partition("=")
            if sep:
                fields[name] = value
        missing = {"Credential", "SignedHeaders", "Signature"} - set(fields)
        if missing:
            raise _malformed(f"the Authorization header lacks {', '.join(sorted(missing))}")
        key, date, region, service = _credential(fields["Credential"], False)
        amz_date = headers.get("x-amz-date") or ""
        if not amz_date:
            raise SigError("AccessDenied", "a signed request needs an x-amz-date header")
        payload = headers.get("x-amz-content-sha256")
        if payload is None:
            raise SigError("InvalidRequest", "a Signature Version 4 request needs an "
                           "x-amz-content-sha256 header")
        return Signed(key, date, region, service,
                      tuple(fields["SignedHeaders"].lower().split(";")), fields["Signature"],
                      amz_date, payload, False)
    names = {name for name, _ in query}
    if "X-Amz-Signature" not in names and "X-Amz-Credential" not in names:
        if "Signature" in names or "AWSAccessKeyId" in names:
            fields = dict(query)
            try:
                return SignedV2(fields["AWSAccessKeyId"], fields["Signature"], True,
                                int(fields["Expires"]))
            except (KeyError, ValueError):
                raise _malformed("a V2 presigned URL needs AWSAccessKeyId, Signature and "
                                 "Expires (seconds since 1970)", True) from None
        return None
    fields = dict(query)
    missing = {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders",
               "X-Amz-Signature", "X-Amz-Expires"} - set(fields)
    if missing:
        raise _malformed(f"the presigned URL lacks {', '.join(sorted(missing))}", True)
    if fields["X-Amz-Algorithm"] != ALGORITHM:
        raise _malformed(f"X-Amz-Algorithm must be {ALGORITHM}", True)
    try:
        expires = int(fields["X-Amz-Expires"])
    except ValueError:
        raise _malformed("X-Amz-Expires is not a number of seconds", True) from None
    if not 0 < expires <= PRESIGN_EXPIRES_S_MAX:
        raise _malformed(f"X-Amz-Expires must be within 1..{PRESIGN_EXPIRES_S_MAX}", True)
    key, date, region, service = _credential(fields["X-Amz-Credential"], True)
    return Signed(key, date, region, service,
                  tuple(fields["X-Amz-SignedHeaders"].lower().split(";")),
                  fields["X-Amz-Signature"], fields["X-Amz-Date"],
                  headers.get("x-amz-content-sha256") or UNSIGNED, True, expires)


def _epoch(amz_date):
    try:
        return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SigError("AccessDenied", f"the request's date {amz_date[:32]!r} is not "
                       "YYYYMMDDTHHMMSSZ") from None


def check_time(signed, now=None):
    """SigError unless the request is fresh (header) or its URL has not expired (query)."""
    now = time.time() if now is None else now
    when = _epoch(signed.amz_date)
    if not signed.amz_date.startswith(signed.date):
        raise SigError("SignatureDoesNotMatch", "the credential's date is not the request's")
    if signed.presigned:
        if now > when + signed.expires_s:
            raise SigError("AccessDenied", "Request has expired")
        if when - now > CLOCK_SKEW_S:
            raise SigError("AccessDenied", "the presigned URL's date is in the future")
    elif abs(now - when) > CLOCK_SKEW_S:
        raise SigError("RequestTimeTooSkewed", "The difference between the request time and "
                       "the server's time is too large.")


@functools.lru_cache(maxsize=256)
def signing_key(secret, date, region, service):
    key = hmac.digest(("AWS4" + secret).encode(), date.encode(), "sha256")
    for part in (region, service, "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    return key


def _encode(text):
    return quote(text, safe="-_.~")


def canonical_query(query, presigned):
    pairs = sorted((_encode(name), _encode(value)) for name, value in query
                   if not (presigned and name == "X-Amz-Signature"))
    return "&".join(f"{name}={value}" for name, value in pairs)


def _canonical_headers(signed, headers):
    lines = []
    for name in signed.signed_headers:
        values = headers.getall(name, None) if hasattr(headers, "getall") else \
            [headers.get(name)] if headers.get(name) is not None else None
        if values is None:
            raise SigError("SignatureDoesNotMatch", f"the signed header {name!r} is missing")
        lines.append(f"{name}:{','.join(' '.join(value.split()) for value in values)}\n")
    return "".join(lines)


def _signature(key, signed, canonical_request):
    to_sign = "\n".join((ALGORITHM, signed.amz_date, signed.scope,
                         hashlib.sha256(canonical_request.encode()).hexdigest()))
    return hmac.digest(key, to_sign.encode(), "sha256").hex()


def verify(signed, secret, method, raw_path, query, headers, now=None, v2_bucket=None):
    """Check `signed` against the request with the key's `secret`; the signing key (chunk
    signatures chain from it; None for V2). `raw_path` is the path as sent (percent-encoded);
    `v2_bucket`: the bucket a virtual-host request named in its Host, which a V2 signature's
    resource starts with."""
    if isinstance(signed, SignedV2):
        if v2_bucket is not None:
            raw_path = f"/{v2_bucket}{raw_path}"
        return _verify_v2(signed, secret, method, raw_path, query, headers, now)
    if signed.service != "s3":
        raise _malformed(f"the credential's service must be s3, not {signed.service!r}",
                         signed.presigned)
    if "host" not in signed.signed_headers:
        raise _malformed("the signed headers must include host", signed.presigned)
    check_time(signed, now)
    key = signing_key(secret, signed.date, signed.region, signed.service)
    rest = "\n".join((canonical_query(query, signed.presigned),
                      _canonical_headers(signed, headers), ";".join(signed.signed_headers),
                      signed.payload_hash))
    # The path as the client sent it (what SDKs sign), else its canonical encoding (what the
    # specification says to sign): a client that encoded a character the other way still
    # matches.
    canonical = quote(unquote(raw_path), safe="/~")
    for path in (raw_path, canonical) if canonical != raw_path else (raw_path,):
        if hmac.compare_digest(_signature(key, signed, f"{method}\n{path}\n{rest}"),
                               signed.signature):
            return key
    raise SigError("SignatureDoesNotMatch", "The request signature we calculated does not "
                   "match the signature you provided. Check your key and signing method.")


def _verify_v2(signed, secret, method, raw_path, query, headers, now):
    now = time.time() if now is None else now
    fields = dict(query)
    if signed.presigned:
        if now > signed.expires:
            raise SigError("AccessDenied", "Request has expired")
        date = str(signed.expires)
    else:
        date = "" if "x-amz-date" in headers else headers.get("Date", "")
        when = email.utils.parsedate_tz(headers.get("x-amz-date") or headers.get("Date") or "")
        if when is None:
            raise SigError("AccessDenied", "a V2-signed request needs a Date or x-amz-date")
        if abs(now - email.utils.mktime_tz(when)) > CLOCK_SKEW_S:
            raise SigError("RequestTimeTooSkewed", "The difference between the request time "
                           "and the server's time is too large.")
    amz = {}
    for name, value in headers.items():
        if name.lower().startswith("x-amz-"):
            amz.setdefault(name.lower(), []).append(value.strip())
    if signed.presigned:
        for name, value in query:
            if name.lower().startswith("x-amz-"):
                amz.setdefault(name.lower(), []).append(value.strip())
    lines = [method, headers.get("Content-MD5", fields.get("content-md5", "")),
             headers.get("Content-Type", fields.get("content-type", "")), date]
    lines += [f"{name}:{','.join(values)}" for name, values in sorted(amz.items())]
    subresources = sorted((name, value) for name, value in query if name in V2_SUBRESOURCES)
    resource = raw_path
    if subresources:
        resource += "?" + "&".join(f"{name}={value}" if value else name
                                   for name, value in subresources)
    lines.append(resource)
    expected = base64.b64encode(hmac.digest(secret.encode(), "\n".join(lines).encode(),
                                            "sha1")).decode()
    if not hmac.compare_digest(expected, signed.signature):
        raise SigError("SignatureDoesNotMatch", "The request signature we calculated does not "
                       "match the signature you provided. Check your key and signing method.")
    return None


class ChunkVerifier:
    """The signatures of an aws-chunked body: each chunk's covers its data and the previous
    signature, starting from the request's, so no chunk can be changed, dropped or moved."""

    def __init__(self, key, signed):
        self.key, self.signed, self.previous = key, signed, signed.signature

    def check(self, signature, data_sha256_hex):
        to_sign = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", self.signed.amz_date,
                             self.signed.scope, self.previous, EMPTY_SHA256, data_sha256_hex))
        expected = hmac.digest(self.key, to_sign.encode(), "sha256").hex()
        if not hmac.compare_digest(expected, signature):
            raise SigError("SignatureDoesNotMatch", "a chunk's signature does not match its "
                           "data")
        self.previous = signature

    def check_trailer(self, signature, trailer_text):
        to_sign = "\n".join(("AWS4-HMAC-SHA256-TRAILER", self.signed.amz_date,
                             self.signed.scope, self.previous,
                             hashlib.sha256(trailer_text.encode()).hexdigest()))
        expected = hmac.digest(self.key, to_sign.encode(), "sha256").hex()
        if not hmac.compare_digest(expected, signature):
            raise SigError("SignatureDoesNotMatch", "the trailer's signature does not match")
