"""s3/sigv4.py against signatures made by others: botocore's signers (header, presigned V4
and V2) and the aws-chunked example of AWS's documentation; tampering and expiry refused."""

import hashlib
import time

import pytest
from multidict import CIMultiDict

from cairn.s3 import sigv4
from cairn.s3.request import byte_range as _range, preconditions as _preconditions, \
    query_pairs as _query
from cairn.s3.store import S3Error

botocore = pytest.importorskip("botocore", reason="botocore comes with boto3, a test "
                               "dependency")
from botocore.auth import HmacV1QueryAuth, S3SigV4Auth, S3SigV4QueryAuth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

pytestmark = pytest.mark.unit

KEY, SECRET = "CKTESTKEY00000000000", "secret/with+chars0123456789abcdefghijklm"


def signed_request(method, url, body=b"", headers=None, signer=S3SigV4Auth, **options):
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    if signer is S3SigV4Auth:
        request.headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
    signer(Credentials(KEY, SECRET), "s3", "us-east-1", **options).add_auth(request) \
        if signer is not HmacV1QueryAuth else signer(Credentials(KEY, SECRET), **options) \
        .add_auth(request)
    prepared = request.prepare()
    raw = prepared.url.split("//", 1)[1].partition("/")[2]
    path, _, query = ("/" + raw).partition("?")
    headers = CIMultiDict(prepared.headers)
    headers["Host"] = prepared.url.split("//", 1)[1].split("/", 1)[0]
    return method, path, _query(query), headers


def check(method, path, query, headers, secret=SECRET, now=None):
    signed = sigv4.parse(headers, query)
    return signed, sigv4.verify(signed, secret, method, path, query, headers, now)


def test_header_signatures_from_botocore_verify_and_tampering_does_not():
    for method, url in (("GET", "http://127.0.0.1:7480/bucket/a%20b/c%2Bd?list-type=2&"
                                "prefix=x%2Fy&max-keys=5"),
                        ("PUT", "http://127.0.0.1:7480/bucket/key~with_odd.chars"),
                        ("DELETE", "http://127.0.0.1:7480/bucket/k?uploadId=abc")):
        method, path, query, headers = signed_request(method, url, b"body" if method == "PUT"
                                                      else b"")
        signed, key = check(method, path, query, headers)
        assert signed.access_key == KEY and key is not None
        with pytest.raises(sigv4.SigError) as wrong:
            check(method, path, query, headers, secret="other")
        assert wrong.value.code == "SignatureDoesNotMatch"
        with pytest.raises(sigv4.SigError):
            check(method, path + "x", query, headers)
        with pytest.raises(sigv4.SigError):
            check("POST", path, query, headers)
        with pytest.raises(sigv4.SigError) as skewed:
            check(method, path, query, headers, now=time.time() + 3600)
        assert skewed.value.code == "RequestTimeTooSkewed"


def test_presigned_urls_v4_and_v2_verify_until_they_expire():
    url = "http://127.0.0.1:7480/bucket/some%20key"
    method, path, query, headers = signed_request("GET", url, signer=S3SigV4QueryAuth,
                                                  expires=60)
    signed, _ = check(method, path, query, headers)
    assert signed.presigned
    with pytest.raises(sigv4.SigError) as late:
        check(method, path, query, headers, now=time.time() + 120)
    assert late.value.code == "AccessDenied"
    tampered = [(k, v + "0" if k == "X-Amz-Expires" else v) for k, v in query]
    with pytest.raises(sigv4.SigError):
        check(method, path, tampered, headers)
    method, path, query, headers = signed_request("GET", url, signer=HmacV1QueryAuth,
                                                  expires=60)
    signed, key = check(method, path, query, headers)
    assert isinstance(signed, sigv4.SignedV2) and key is None
    with pytest.raises(sigv4.SigError):
        check(method, path, query, headers, now=time.time() + 120)
    with pytest.raises(sigv4.SigError):
        check(method, path, query, headers, secret="other")


def test_aws_chunked_signatures_follow_the_documented_example():
    """AWS's example 'Signature Calculation: Transferring Payload in Multiple Chunks':
    66,560 bytes of 'a' in chunks of 65,536 and 1,024, then the final empty chunk."""
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    headers = CIMultiDict({
        "Host": "s3.amazonaws.com", "x-amz-date": "20130524T000000Z",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/"
                         "s3/aws4_request,SignedHeaders=content-encoding;content-length;host;"
                         "x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;"
                         "x-amz-storage-class,Signature=4f232c4386841ef735655705268965c44a0e4690"
                         "baa4adea153f7db9fa80a0a9",
        "x-amz-content-sha256": sigv4.STREAMING_SIGNED, "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": "66560", "Content-Length": "66824"})
    then = time.mktime(time.strptime("20130524T000000Z", "%Y%m%dT%H%M%SZ")) - time.timezone
    signed, key = check("PUT", "/examplebucket/chunkObject.txt", [], headers, secret, then)
    chunks = sigv4.ChunkVerifier(key, signed)
    chunks.check("ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
                 hashlib.sha256(b"a" * 65536).hexdigest())
    chunks.check("0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
                 hashlib.sha256(b"a" * 1024).hexdigest())
    with pytest.raises(sigv4.SigError):                 # a chunk replayed or changed
        sigv4.ChunkVerifier(key, signed).check(
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
            hashlib.sha256(b"a" * 1024).hexdigest())
    chunks.check("b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
                 sigv4.EMPTY_SHA256)


def test_malformed_authorization_is_an_error_not_a_crash():
    for value in ("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA256 Credential=x", "AWS4-HMAC-SHA256 "
                  "Credential=a/b/c/d/e,SignedHeaders=host,Signature=0", "Bearer x", "AWS x"):
        headers = CIMultiDict({"Authorization": value, "x-amz-date": "20260101T000000Z",
                               "x-amz-content-sha256": sigv4.UNSIGNED, "Host": "h"})
        with pytest.raises(sigv4.SigError):
            check("GET", "/b", [], headers)
    assert sigv4.parse(CIMultiDict(), []) is None          # anonymous: the gateway refuses


def test_ranges_and_conditions():
    assert _range("bytes=0-9", 100) == (0, 10)
    assert _range("bytes=90-", 100) == (90, 100)
    assert _range("bytes=-10", 100) == (90, 100)
    assert _range("bytes=95-200", 100) == (95, 100)
    assert _range("bytes=0-1,5-6", 100) is None and _range("items=1-2", 100) is None
    for bad in ("bytes=100-", "bytes=-0"):
        with pytest.raises(S3Error) as refused:
            _range(bad, 100)
        assert refused.value.code == "InvalidRange" and refused.value.status == 416

    class Entry:
        etag, mtime = "abc", 1_700_000_000           # 2023
    assert _preconditions({"If-Match": '"abc"'}, Entry) is None
    assert _preconditions({"If-Match": '"x"'}, Entry) == 412
    assert _preconditions({"If-Modified-Since": "Sat, 01 Jan 2050 00:00:00 GMT"}, Entry) == 304
    assert _preconditions({"If-None-Match": '"abc"'}, Entry) == 304
    assert _preconditions({"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"}, Entry) is None
    assert _preconditions({"If-Unmodified-Since": "Sat, 01 Jan 1970 00:00:00 GMT"}, Entry) == 412
