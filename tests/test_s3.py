"""cairn-s3 against real clients (boto3, the aws CLI, s3fs, urllib/curl) on a real cluster
(`cairn-cluster up --s3 1`): every operation and its errors, presigned URLs, caps by prefix,
audit, paging, a large multipart upload and the gateway's memory."""

import base64
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import msgpack
import pytest

boto3 = pytest.importorskip("boto3", reason="boto3 is a test dependency (pip install -e "
                            "'.[test]')")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

pytestmark = pytest.mark.cluster


def client(endpoint, key, secret, **config):
    cfg = Config(**{"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 2},
                    "request_checksum_calculation": "when_required",
                    "response_checksum_validation": "when_required", **config})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg,
                        aws_access_key_id=key, aws_secret_access_key=secret)


def code_of(call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except ClientError as exc:
        return exc.response["Error"]["Code"]
    return None


def s3_key(cluster, entity, *caps):
    cluster.cairn("auth", "add", entity, *[arg for cap in caps for arg in ("--caps", cap)])
    _, found = cluster.cairn("auth", "s3-key", "add", entity)
    return found["access_key"], found["secret_key"]


@pytest.fixture
def s3(local_cluster):
    """(cluster, endpoint, boto3 client of an osd=rw entity)."""
    cluster = local_cluster(device_size="2G", extra=["--s3", "1"])
    endpoint = cluster.description["s3"][0]
    key, secret = s3_key(cluster, "client.s3user", "mon=r", "osd=rw")
    return cluster, endpoint, client(endpoint, key, secret), (key, secret)


def test_buckets_objects_and_their_errors(s3):
    cluster, endpoint, c, _ = s3
    assert code_of(c.head_bucket, Bucket="nope") == "404"
    assert code_of(c.get_object, Bucket="nope", Key="k") == "NoSuchBucket"
    assert code_of(c.create_bucket, Bucket="Bad_Name") == "InvalidBucketName"
    c.create_bucket(Bucket="bk1")
    assert code_of(c.create_bucket, Bucket="bk1") == "BucketAlreadyOwnedByYou"
    assert [b["Name"] for b in c.list_buckets()["Buckets"]] == ["bk1"]
    c.head_bucket(Bucket="bk1")

    body = os.urandom(5 << 20) + b"tail"                # two stripes
    put = c.put_object(Bucket="bk1", Key="dir/one", Body=body, ContentType="text/x-test",
                       Metadata={"run": "7", "who": "tests"})
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    got = c.get_object(Bucket="bk1", Key="dir/one")
    assert got["Body"].read() == body and got["Metadata"] == {"run": "7", "who": "tests"}
    assert got["ContentType"] == "text/x-test" and got["ETag"] == put["ETag"]
    head = c.head_object(Bucket="bk1", Key="dir/one")
    assert head["ContentLength"] == len(body) and head["ETag"] == put["ETag"]
    # ranges: inside a stripe, across the stripe boundary, a suffix, open-ended, past the end
    for spec, want in (("bytes=10-19", body[10:20]), ("bytes=4194300-4194310",
                                                     body[4194300:4194311]),
                       ("bytes=-4", b"tail"), (f"bytes={len(body) - 3}-", body[-3:])):
        r = c.get_object(Bucket="bk1", Key="dir/one", Range=spec)
        assert r["Body"].read() == want and r["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert code_of(c.get_object, Bucket="bk1", Key="dir/one",
                   Range=f"bytes={len(body)}-") == "InvalidRange"
    # conditions
    assert code_of(c.get_object, Bucket="bk1", Key="dir/one", IfMatch='"0000"') == \
        "PreconditionFailed"
    assert code_of(c.get_object, Bucket="bk1", Key="dir/one", IfNoneMatch=put["ETag"]) == "304"
    assert c.get_object(Bucket="bk1", Key="dir/one", IfMatch=put["ETag"])["ContentLength"] == \
        len(body)
    # digests: Content-MD5 and x-amz-checksum-crc32c, right and wrong
    small = b"hello s3"
    c.put_object(Bucket="bk1", Key="md5", Body=small,
                 ContentMD5=base64.b64encode(hashlib.md5(small).digest()).decode())
    assert code_of(c.put_object, Bucket="bk1", Key="bad-md5", Body=small,
                   ContentMD5=base64.b64encode(hashlib.md5(b"other").digest()).decode()) == \
        "BadDigest"
    from cairn.native.checksum import crc32c
    good = base64.b64encode(crc32c(small).to_bytes(4, "big")).decode()
    c.put_object(Bucket="bk1", Key="crc", Body=small, ChecksumCRC32C=good)
    assert code_of(c.put_object, Bucket="bk1", Key="bad-crc", Body=small,
                   ChecksumCRC32C=base64.b64encode(b"\0\0\0\1").decode()) == "BadDigest"
    assert code_of(c.head_object, Bucket="bk1", Key="bad-md5") == "404"
    assert code_of(c.get_object, Bucket="bk1", Key="bad-crc") == "NoSuchKey"
    # an empty object, an overwrite, copies
    c.put_object(Bucket="bk1", Key="empty", Body=b"")
    assert c.get_object(Bucket="bk1", Key="empty")["Body"].read() == b""
    c.put_object(Bucket="bk1", Key="md5", Body=b"second")
    assert c.get_object(Bucket="bk1", Key="md5")["Body"].read() == b"second"
    c.copy_object(Bucket="bk1", Key="copy", CopySource={"Bucket": "bk1", "Key": "dir/one"})
    copied = c.get_object(Bucket="bk1", Key="copy")
    assert copied["Body"].read() == body and copied["Metadata"]["run"] == "7"
    c.copy_object(Bucket="bk1", Key="copy2", CopySource="bk1/dir/one", Metadata={"new": "1"},
                  MetadataDirective="REPLACE")
    assert c.head_object(Bucket="bk1", Key="copy2")["Metadata"] == {"new": "1"}
    assert code_of(c.copy_object, Bucket="bk1", Key="x", CopySource="bk1/none") == "NoSuchKey"
    # deletes: one, many (missing keys are not errors), then the bucket
    assert code_of(c.delete_bucket, Bucket="bk1") == "BucketNotEmpty"
    c.delete_object(Bucket="bk1", Key="copy2")
    c.delete_object(Bucket="bk1", Key="never-was")
    result = c.delete_objects(Bucket="bk1", Delete={"Objects": [
        {"Key": k} for k in ("dir/one", "md5", "crc", "empty", "copy", "absent")]})
    assert sorted(d["Key"] for d in result["Deleted"]) == \
        sorted(["dir/one", "md5", "crc", "empty", "copy", "absent"])
    assert c.list_objects_v2(Bucket="bk1")["KeyCount"] == 0
    c.delete_bucket(Bucket="bk1")
    assert code_of(c.head_bucket, Bucket="bk1") == "404"
    # what is not implemented says so
    c.create_bucket(Bucket="bk2")
    assert code_of(c.get_bucket_policy, Bucket="bk2") == "NotImplemented"


def test_listing_pages_prefixes_and_markers(s3):
    _, _, c, _ = s3
    c.create_bucket(Bucket="many")
    names = [f"d{i % 10}/{i:05d}" for i in range(10_000)] + ["top-a", "top-b", "zz/√ünïcødé +&<>"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: c.put_object(Bucket="many", Key=k, Body=k.encode()), names))
    seen, pages = [], 0
    for page in c.get_paginator("list_objects_v2").paginate(
            Bucket="many", PaginationConfig={"PageSize": 1000}):
        pages += 1
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == sorted(names, key=lambda k: k.encode()) and pages == 11
    top = c.list_objects_v2(Bucket="many", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == [f"d{i}/" for i in range(10)] + \
        ["zz/"]
    assert [o["Key"] for o in top["Contents"]] == ["top-a", "top-b"]
    # delimiter with paging: common prefixes count toward max-keys and are not repeated
    rolled = []
    for page in c.get_paginator("list_objects_v2").paginate(
            Bucket="many", Delimiter="/", PaginationConfig={"PageSize": 3}):
        rolled += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        rolled += [o["Key"] for o in page.get("Contents", [])]
    assert rolled == [f"d{i}/" for i in range(10)] + ["top-a", "top-b", "zz/"]
    inner = c.list_objects_v2(Bucket="many", Prefix="d3/", StartAfter="d3/09990")
    assert [o["Key"] for o in inner["Contents"]] == [f"d3/{i:05d}" for i in range(9993, 10_000, 10)]
    v1 = c.list_objects(Bucket="many", Prefix="d1/", Marker="d1/00981", MaxKeys=5)
    assert [o["Key"] for o in v1["Contents"]] == ["d1/00991", "d1/01001", "d1/01011",
                                                  "d1/01021", "d1/01031"]
    assert v1["IsTruncated"]
    assert c.list_objects_v2(Bucket="many", Prefix="zz/")["Contents"][0]["Key"] == \
        "zz/√ünïcødé +&<>"
    assert c.get_object(Bucket="many", Key="zz/√ünïcødé +&<>")["Body"].read() == \
        "zz/√ünïcødé +&<>".encode()


def test_multipart_uploads(s3):
    _, _, c, _ = s3
    c.create_bucket(Bucket="mpu")
    upload = c.create_multipart_upload(Bucket="mpu", Key="big", ContentType="x/y",
                                       Metadata={"a": "b"})["UploadId"]
    parts = [os.urandom(5 << 20), os.urandom(6 << 20), b"last part"]
    etags = {}

    def one(n):
        etags[n] = c.upload_part(Bucket="mpu", Key="big", UploadId=upload, PartNumber=n,
                                 Body=parts[n - 1])["ETag"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(one, (1, 2, 3)))
    listed = c.list_parts(Bucket="mpu", Key="big", UploadId=upload)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == \
        [(n, len(parts[n - 1]), etags[n]) for n in (1, 2, 3)]
    uploads = c.list_multipart_uploads(Bucket="mpu")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("big", upload)]
    wanted = [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]
    assert code_of(c.complete_multipart_upload, Bucket="mpu", Key="big", UploadId=upload,
                   MultipartUpload={"Parts": wanted[::-1]}) == "InvalidPartOrder"
    assert code_of(c.complete_multipart_upload, Bucket="mpu", Key="big", UploadId=upload,
                   MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00"'}]}) == \
        "InvalidPart"
    assert code_of(c.complete_multipart_upload, Bucket="mpu", Key="big", UploadId=upload,
                   MultipartUpload={"Parts": [wanted[0], {"PartNumber": 4, "ETag": etags[1]}]}
                   ) == "InvalidPart"
    assert code_of(c.head_object, Bucket="mpu", Key="big") == "404"     # nothing visible yet
    done = c.complete_multipart_upload(Bucket="mpu", Key="big", UploadId=upload,
                                       MultipartUpload={"Parts": wanted})
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert done["ETag"] == f'"{digest}-3"'
    got = c.get_object(Bucket="mpu", Key="big")
    whole = b"".join(parts)
    assert got["Body"].read() == whole and got["ContentType"] == "x/y" and \
        got["Metadata"] == {"a": "b"}
    span = c.get_object(Bucket="mpu", Key="big", Range=f"bytes={(5 << 20) - 5}-{(5 << 20) + 4}")
    assert span["Body"].read() == whole[(5 << 20) - 5:(5 << 20) + 5]     # across two parts
    assert c.list_multipart_uploads(Bucket="mpu").get("Uploads", []) == []
    assert code_of(c.upload_part, Bucket="mpu", Key="big", UploadId=upload, PartNumber=1,
                   Body=b"x") == "NoSuchUpload"
    # too small a part that is not the last
    small = c.create_multipart_upload(Bucket="mpu", Key="small")["UploadId"]
    e1 = c.upload_part(Bucket="mpu", Key="small", UploadId=small, PartNumber=1, Body=b"a")["ETag"]
    e2 = c.upload_part(Bucket="mpu", Key="small", UploadId=small, PartNumber=2, Body=b"b")["ETag"]
    assert code_of(c.complete_multipart_upload, Bucket="mpu", Key="small", UploadId=small,
                   MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1},
                                              {"PartNumber": 2, "ETag": e2}]}) == \
        "EntityTooSmall"
    c.abort_multipart_upload(Bucket="mpu", Key="small", UploadId=small)
    assert code_of(c.list_parts, Bucket="mpu", Key="small", UploadId=small) == "NoSuchUpload"
    assert code_of(c.abort_multipart_upload, Bucket="mpu", Key="small", UploadId="0" * 32) == \
        "NoSuchUpload"


def test_signatures_presigned_urls_and_refusals(s3):
    cluster, endpoint, c, (key, secret) = s3
    c.create_bucket(Bucket="sig")
    c.put_object(Bucket="sig", Key="a b/c+d", Body=b"signed body")
    v4 = client(endpoint, key, secret, signature_version="s3v4")
    for signer in (c, v4):                      # boto3 presigns with V2 unless told s3v4
        url = signer.generate_presigned_url("get_object", Params={"Bucket": "sig",
                                                                  "Key": "a b/c+d"}, ExpiresIn=60)
        assert urllib.request.urlopen(url).read() == b"signed body"
        curl = subprocess.run(["curl", "-sf", url], capture_output=True, timeout=30)
        assert curl.returncode == 0 and curl.stdout == b"signed body"
    put_url = v4.generate_presigned_url("put_object", Params={"Bucket": "sig", "Key": "up"},
                                        ExpiresIn=60)
    request = urllib.request.Request(put_url, data=b"presigned put", method="PUT")
    assert urllib.request.urlopen(request).status == 200
    assert c.get_object(Bucket="sig", Key="up")["Body"].read() == b"presigned put"
    expired = v4.generate_presigned_url("get_object", Params={"Bucket": "sig", "Key": "up"},
                                        ExpiresIn=1)
    time.sleep(2)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(expired)
    assert refused.value.code == 403 and b"expired" in refused.value.read()
    tampered = url.replace("Key", "Kez") if "Kez" in url else url[:-3] + "AAA"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(tampered)
    assert refused.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{endpoint}/sig/up")
    assert refused.value.code == 403 and b"AccessDenied" in refused.value.read()
    assert code_of(client(endpoint, key, "wrong" * 8).list_objects_v2, Bucket="sig") == \
        "SignatureDoesNotMatch"
    assert code_of(client(endpoint, "CKNOSUCHKEY000000000", secret).list_buckets) == \
        "InvalidAccessKeyId"
    # botocore's default checksums (CRC32 in an aws-chunked body with a trailer) work too
    modern = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key, aws_secret_access_key=secret,
                          config=Config(s3={"addressing_style": "path"}))
    modern.put_object(Bucket="sig", Key="modern", Body=b"m" * 100_000)
    assert modern.get_object(Bucket="sig", Key="modern")["Body"].read() == b"m" * 100_000
    # a malformed request gets an error reply and the gateway serves on
    raw = subprocess.run(["curl", "-s", "-X", "PUT", "-H", "Authorization: AWS4-HMAC-SHA256 "
                          "garbage", f"{endpoint}/sig/x"], capture_output=True, timeout=30)
    assert b"AuthorizationHeaderMalformed" in raw.stdout
    assert c.get_object(Bucket="sig", Key="up")["Body"].read() == b"presigned put"


def test_caps_by_prefix_revocation_and_audit(s3):
    cluster, endpoint, admin_client, _ = s3
    key, secret = s3_key(cluster, "client.team-a", "osd=rw pool=s3.data prefix=team-a/",
                         "osd=r pool=s3.data prefix=shared/public/")
    a = client(endpoint, key, secret)
    admin_client.create_bucket(Bucket="shared")
    admin_client.put_object(Bucket="shared", Key="public/readme", Body=b"for all")
    admin_client.put_object(Bucket="shared", Key="private/x", Body=b"not for a")
    a.create_bucket(Bucket="team-a")
    a.put_object(Bucket="team-a", Key="model.bin", Body=b"weights")
    assert a.get_object(Bucket="team-a", Key="model.bin")["Body"].read() == b"weights"
    assert code_of(a.create_bucket, Bucket="team-b") == "AccessDenied"
    assert sorted(b["Name"] for b in a.list_buckets()["Buckets"]) == ["shared", "team-a"]
    assert a.get_object(Bucket="shared", Key="public/readme")["Body"].read() == b"for all"
    assert code_of(a.get_object, Bucket="shared", Key="private/x") == "AccessDenied"
    assert code_of(a.put_object, Bucket="shared", Key="public/new", Body=b"") == "AccessDenied"
    assert code_of(a.list_objects_v2, Bucket="shared", Prefix="private/") == "AccessDenied"
    with pytest.raises(urllib.error.HTTPError):               # anonymous: refused, audited
        urllib.request.urlopen(f"{endpoint}/shared/public/readme")
    listed = a.list_objects_v2(Bucket="shared")
    assert [o["Key"] for o in listed["Contents"]] == ["public/readme"]
    # the data pool's IP allowlists hold for BUCKET/KEY: a bucket only 10.9.9.0/24 may use
    admin_client.create_bucket(Bucket="guarded")
    cluster.cairn("pool", "set", "s3.data", "allow-from", "10.9.9.0/24", "--prefix", "guarded/")
    cluster.wait_for("the allowlist in the gateway's map", lambda: code_of(
        admin_client.put_object, Bucket="guarded", Key="x", Body=b"") == "AccessDenied", 10)
    admin_client.put_object(Bucket="shared", Key="public/still", Body=b"elsewhere: allowed")
    cluster.cairn("pool", "set", "s3.data", "allow-from", "any", "--prefix", "guarded/")
    # revoking the key: refused once the gateway's cache (10 s) has passed
    cluster.cairn("auth", "s3-key", "rm", key)
    cluster.wait_for("the revoked key refused", lambda: code_of(a.list_buckets) ==
                     "InvalidAccessKeyId", timeout_s=20)
    # the audit log names the entity, the operation and the refusals
    def audited(entity="client.team-a"):
        _, found = cluster.cairn("audit", "--entity", entity)
        return found["events"]
    cluster.wait_for("s3 events in the audit log", lambda: any(
        e["op"] == "s3:PutObject" and e["entity"] == "client.team-a" and
        e["target"] == "team-a/model.bin" and e["result"] == "ok" for e in audited()), 15)
    events = audited()
    assert any(e["op"] == "s3:CreateBucket" and e["result"] == "AccessDenied" and
               e["entity"] == "client.team-a" for e in events), events
    cluster.wait_for("the revoked key's refusal in the audit log", lambda: any(
        e["op"] == "s3:ListBuckets" and e["result"] == "InvalidAccessKeyId"
        for e in audited(f"unknown S3 key {key}")), 15)
    assert any(e["result"] == "AccessDenied" and e["op"] == "s3:GetObject"
               for e in audited("anonymous"))


def test_aws_cli_and_s3fs(s3, tmp_path):
    cluster, endpoint, c, (key, secret) = s3
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    if not os.path.exists(aws):
        pytest.skip("the aws CLI is a test dependency (pip install -e '.[test]')")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
           "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    (tmp_path / "files").mkdir()
    source = tmp_path / "files" / "model.bin"
    source.write_bytes(os.urandom(20 << 20))              # multipart in the CLI (8 MiB parts)

    def run(*args):
        result = subprocess.run([aws, "--endpoint-url", endpoint, *args], env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"aws {' '.join(args)}: {result.stderr}"
        return result.stdout
    run("s3", "mb", "s3://cli")
    run("s3", "cp", str(source), "s3://cli/models/model.bin")
    assert "models/" in run("s3", "ls", "s3://cli/")
    run("s3", "cp", "s3://cli/models/model.bin", str(tmp_path / "files" / "back.bin"))
    assert (tmp_path / "files" / "back.bin").read_bytes() == source.read_bytes()
    run("s3", "sync", str(tmp_path / "files"), "s3://cli/synced/")
    listed = json.loads(run("s3api", "list-objects-v2", "--bucket", "cli", "--prefix",
                            "synced/"))
    assert sorted(o["Key"] for o in listed["Contents"]) == ["synced/back.bin",
                                                            "synced/model.bin"]
    # bucket to bucket: past 8 MiB the CLI copies in parts (UploadPartCopy)
    run("s3", "mb", "s3://cli-copy")
    run("s3", "cp", "s3://cli/models/model.bin", "s3://cli-copy/model.bin")
    assert c.get_object(Bucket="cli-copy", Key="model.bin")["Body"].read() == \
        source.read_bytes()
    s3fs = pytest.importorskip("s3fs", reason="s3fs is a test dependency")
    fs = s3fs.S3FileSystem(key=key, secret=secret, client_kwargs={
        "endpoint_url": endpoint, "region_name": "us-east-1"})
    with fs.open("cli/fsspec/data.txt", "wb") as handle:
        handle.write(b"through s3fs\n" * 1000)
    with fs.open("cli/fsspec/data.txt", "rb") as handle:
        handle.seek(13)
        assert handle.read(13) == b"through s3fs\n"
    assert fs.cat("cli/models/model.bin") == source.read_bytes()
    assert "cli/fsspec/data.txt" in fs.ls("cli/fsspec")


def test_large_objects_stream_with_bounded_gateway_memory(s3, tmp_path):
    cluster, endpoint, c, _ = s3
    pid = next(g["pid"] for g in cluster.description["gateways"])

    def rss_mib():
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS")) / 1024
    c.create_bucket(Bucket="large")
    before = rss_mib()
    size = 1 << 30
    block = os.urandom(1 << 20)

    class Source:                                   # 1 GiB without holding it here either
        def __init__(self):
            self.left = size

        def read(self, n=-1):
            n = self.left if n is None or n < 0 else min(n, self.left)
            self.left -= n
            return (block * (n // len(block) + 1))[:n]
    from boto3.s3.transfer import TransferConfig
    c.upload_fileobj(Source(), "large", "one-gib", Config=TransferConfig(
        multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4))
    digest = hashlib.sha256()
    got = c.get_object(Bucket="large", Key="one-gib")
    for chunk in got["Body"].iter_chunks(1 << 20):
        digest.update(chunk)
    expected = hashlib.sha256()
    for _ in range(size // len(block)):
        expected.update(block)
    assert digest.digest() == expected.digest() and got["ContentLength"] == size
    grew = rss_mib() - before
    assert grew < 200, f"the gateway grew by {grew:.0f} MiB moving 1 GiB each way"


def _gc(cluster, *args):
    result = subprocess.run([sys.executable, "-m", "cairn.s3.cli", "gc", "--cluster",
                             cluster.dir, "--json", *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_gc_collects_unnamed_data_and_nothing_else(s3):
    """`cairn-s3 gc`: data no entry, part or manifest names goes (once old enough); every
    object, an upload in progress and its parts stay whole."""
    import asyncio

    from cairn.client.cluster import Cluster

    cluster, _, c, _ = s3
    c.create_bucket(Bucket="gcb")
    bodies = {"small": b"tiny", "two-stripes": os.urandom((4 << 20) + 7)}
    for key, body in bodies.items():
        c.put_object(Bucket="gcb", Key=key, Body=body)
    upload = c.create_multipart_upload(Bucket="gcb", Key="mp")["UploadId"]
    part = os.urandom(5 << 20)
    etag = c.upload_part(Bucket="gcb", Key="mp", UploadId=upload, PartNumber=1,
                         Body=part)["ETag"]
    done = c.create_multipart_upload(Bucket="gcb", Key="done")["UploadId"]
    e1 = c.upload_part(Bucket="gcb", Key="done", UploadId=done, PartNumber=1,
                       Body=b"whole")["ETag"]
    c.complete_multipart_upload(Bucket="gcb", Key="done", UploadId=done,
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})

    async def plant():
        # What a writer that died before its entry leaves: stripes under this bucket's id,
        # and under the id of a bucket that is gone.
        async with await Cluster.connect(cluster.dir) as admin:
            registry = dict([item async for item in
                             admin.pool("s3.index").omap_items("s3.buckets")])
            bucket_id = msgpack.unpackb(registry[b"gcb"])["id"]
            data = admin.pool("s3.data")
            planted = [f"s3.{bucket_id}.{'ab' * 8}.0", f"s3.{bucket_id}.{'ab' * 8}.1",
                       f"s3.{bucket_id}.{upload}.2.0badf00d.0", "s3.gone.0badbeef.00ff.0"]
            for name in planted:
                await data.put(name, b"garbage")
            return planted

    planted = asyncio.run(plant())
    time.sleep(1.1)
    young = _gc(cluster, "--min-age-s", "3600")
    assert young["deleted"] == 0 and young["garbage"] == 0 and young["young"] == 4
    dry = _gc(cluster, "--min-age-s", "0", "--dry-run")
    assert dry["garbage"] == 4 and dry["deleted"] == 0 and dry["names"] == sorted(planted)
    assert dry["orphaned"] == 1 and dry["bytes"] == 4 * len(b"garbage")
    report = _gc(cluster, "--min-age-s", "0")
    assert report["deleted"] == 4 and report["names"] == sorted(planted), report
    assert _gc(cluster, "--min-age-s", "0")["garbage"] == 0

    for key, body in bodies.items():
        assert c.get_object(Bucket="gcb", Key=key)["Body"].read() == body
    assert c.get_object(Bucket="gcb", Key="done")["Body"].read() == b"whole"
    c.complete_multipart_upload(Bucket="gcb", Key="mp", UploadId=upload,
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert c.get_object(Bucket="gcb", Key="mp")["Body"].read() == part
    # the text form explains itself
    text = subprocess.run([sys.executable, "-m", "cairn.s3.cli", "gc", "--cluster",
                           cluster.dir, "--dry-run"], capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 0 and "would delete 0" in text.stdout, text.stdout


def test_a_retried_commit_that_had_landed_keeps_its_data(s3):
    """The client library retries an update whose OSD died before answering; when the first
    attempt had landed, the retry's condition fails (PreconditionFailed, maybe_applied). The
    store must see its own entry there, not a replaced one (whose data it would delete)."""
    import asyncio

    from cairn.client.cluster import Cluster
    from cairn.client.errors import PreconditionFailed
    from cairn.s3.store import Store

    cluster, _, c, _ = s3
    c.create_bucket(Bucket="retry")
    c.put_object(Bucket="retry", Key="replaced", Body=b"first")

    class Landed:
        """The index pool, whose conditional updates land and then answer as a retried
        attempt does."""

        def __init__(self, pool):
            self.pool = pool

        def __getattr__(self, name):
            return getattr(self.pool, name)

        async def omap_update(self, name, **kw):
            await self.pool.omap_update(name, **kw)
            if kw.get("absent") or kw.get("equals") or kw.get("present"):
                raise PreconditionFailed("condition failed", maybe_applied=True)

    async def run():
        async with await Cluster.connect(cluster.dir) as admin:
            store = Store(admin, "s3.index", "s3.data")
            plain = store.index
            store.index = lambda: Landed(plain())
            bucket = await store.bucket("retry")

            async def body(data):
                yield data
            await store.put(bucket, "new", body(b"new object"))
            await store.put(bucket, "replaced", body(b"second"))
            await store.delete(bucket, "gone-anyway")
            await store.drain()

    c.put_object(Bucket="retry", Key="gone-anyway", Body=b"x")
    # (a store that takes the retry for a rival writer loops, or deletes its own data)
    asyncio.run(asyncio.wait_for(run(), 60))
    assert c.get_object(Bucket="retry", Key="new")["Body"].read() == b"new object"
    assert c.get_object(Bucket="retry", Key="replaced")["Body"].read() == b"second"
    assert code_of(c.head_object, Bucket="retry", Key="gone-anyway") == "404"
    # nothing left unnamed: the replaced object's data went, the new ones' stayed
    assert _gc(cluster, "--min-age-s", "0", "--dry-run")["garbage"] == 0


def test_an_overwrite_does_not_cut_a_get_in_flight(s3):
    """A GET streaming an object that is overwritten meanwhile gets the old object whole (its
    data is deleted only after a grace period); the next GET gets the new one."""
    _, _, c, _ = s3
    c.create_bucket(Bucket="ovw")
    old, new = os.urandom(48 << 20), os.urandom(5 << 20)
    c.put_object(Bucket="ovw", Key="latest.pt", Body=old)
    stream = c.get_object(Bucket="ovw", Key="latest.pt")["Body"]
    first = stream.read(1 << 20)                # the gateway is a few stripes ahead, no more
    c.put_object(Bucket="ovw", Key="latest.pt", Body=new)
    time.sleep(0.5)                             # time for a deletion that is not deferred
    assert hashlib.sha256(first + stream.read()).digest() == hashlib.sha256(old).digest()
    assert c.get_object(Bucket="ovw", Key="latest.pt")["Body"].read() == new


def test_delete_bucket_racing_puts_never_drops_an_acknowledged_object(s3):
    """Writers put and delete keys while DeleteBucket is retried until it succeeds: no PUT is
    acknowledged into a bucket that is then deleted under it (a writer would find its
    acknowledged object's bucket gone before it deleted the object)."""
    import threading

    _, endpoint, _, (key, secret) = s3
    c = client(endpoint, key, secret, retries={"max_attempts": 1})
    c.create_bucket(Bucket="racedel")
    stop, lost, deleted = threading.Event(), [], []

    def writer(n):
        w = client(endpoint, key, secret, retries={"max_attempts": 1})
        i = 0
        while not stop.is_set():
            name = f"w{n}/{i}"
            i += 1
            try:
                w.put_object(Bucket="racedel", Key=name, Body=b"x" * 100)
            except ClientError:
                continue                        # refused: the bucket is gone or going
            try:
                w.delete_object(Bucket="racedel", Key=name)
            except ClientError as exc:
                if exc.response["Error"]["Code"] == "NoSuchBucket":
                    lost.append(name)           # acknowledged, then its bucket vanished
                    return

    def deleter():
        while not stop.is_set():
            if code_of(c.delete_bucket, Bucket="racedel") is None:
                deleted.append(time.monotonic())
                return

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=deleter))
    for thread in threads:
        thread.start()
    threads[-1].join(20)
    time.sleep(3)                               # past the gateway's bucket cache
    stop.set()
    for thread in threads:
        thread.join(30)
    assert deleted, "DeleteBucket never found the bucket empty in 20 s"
    assert lost == []
    assert code_of(c.head_bucket, Bucket="racedel") == "404"


def test_virtual_host_addressing_with_a_domain(s3, tmp_path):
    """`cairn-s3 --domain NAME`: boto3 in virtual-host style (its default for an endpoint with
    a DNS name) reaches BUCKET.NAME; path-style requests keep working on the same gateway.
    The names resolve to 127.0.0.1 through a getaddrinfo wrapper, as an /etc/hosts line or a
    wildcard DNS record would make them."""
    import socket

    cluster, _, c, (key, secret) = s3
    gateway, ready = _gateway(cluster, tmp_path, "client.admin",
                              os.path.join(cluster.dir, "client.admin.keyring"),
                              "--domain", "s3.cairn.test")
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, str) and (host == "s3.cairn.test" or
                                      host.endswith(".s3.cairn.test")):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    socket.getaddrinfo = resolve
    try:
        cluster.wait_for("the second gateway ready", ready.exists, 30)
        port = json.loads(ready.read_text())["url"].rpartition(":")[2]
        v = client(f"http://s3.cairn.test:{port}", key, secret,
                   s3={"addressing_style": "virtual"})
        v.create_bucket(Bucket="vhost")
        v.put_object(Bucket="vhost", Key="a/b.txt", Body=b"by host")
        assert v.get_object(Bucket="vhost", Key="a/b.txt")["Body"].read() == b"by host"
        assert [o["Key"] for o in v.list_objects_v2(Bucket="vhost")["Contents"]] == ["a/b.txt"]
        assert "vhost" in [b["Name"] for b in v.list_buckets()["Buckets"]]
        url = v.generate_presigned_url("get_object", Params={"Bucket": "vhost",
                                                             "Key": "a/b.txt"})
        assert "//vhost.s3.cairn.test:" in url                 # V2, signed over /vhost/a/b.txt
        assert urllib.request.urlopen(url, timeout=10).read() == b"by host"
        p = client(f"http://s3.cairn.test:{port}", key, secret)   # path-style, same gateway
        assert p.get_object(Bucket="vhost", Key="a/b.txt")["Body"].read() == b"by host"
        assert c.get_object(Bucket="vhost", Key="a/b.txt")["Body"].read() == b"by host"
        v.delete_object(Bucket="vhost", Key="a/b.txt")
        v.delete_bucket(Bucket="vhost")
        assert code_of(v.head_bucket, Bucket="vhost") == "404"
        # (the other gateway may know the bucket for its 2 s cache)
        cluster.wait_for("the bucket gone on the other gateway",
                         lambda: code_of(c.head_bucket, Bucket="vhost") == "404", 10)
    finally:
        socket.getaddrinfo = real
        _stop(gateway)


def _gateway(cluster, tmp_path, name, keyring, *extra):
    ready = tmp_path / f"{name}.ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "cairn.s3.cli", "--bind", "127.0.0.1:0", "--cluster",
         cluster.dir, "--name", name, "--keyring", keyring, "--ready-file", str(ready),
         *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return process, ready


def _stop(process):
    import signal
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_a_gateway_needs_the_s3gw_cap_not_admin(s3, tmp_path):
    """A gateway whose entity holds `s3gw`, `mon=r` and `osd=rw` (no admin) serves and audits;
    one without `s3gw` refuses to start and says which cap it lacks."""
    cluster, _, c, (key, secret) = s3
    narrow, plain = str(tmp_path / "gw.keyring"), str(tmp_path / "plain.keyring")
    cluster.cairn("auth", "add", "client.gw", "--caps", "s3gw", "--caps", "mon=r", "--caps",
                  "osd=rw", "--keyring-out", narrow)
    cluster.cairn("auth", "add", "client.plain", "--caps", "mon=r", "--caps", "osd=rw",
                  "--keyring-out", plain)
    refused, _ = _gateway(cluster, tmp_path, "client.plain", plain)
    try:
        assert refused.wait(60) == 2
        assert "s3gw cap" in refused.stderr.read()
    finally:
        _stop(refused)
    gateway, ready = _gateway(cluster, tmp_path, "client.gw", narrow)
    try:
        cluster.wait_for("the s3gw gateway ready", ready.exists, 30)
        g = client(json.loads(ready.read_text())["url"], key, secret)
        g.create_bucket(Bucket="narrow")
        g.put_object(Bucket="narrow", Key="k", Body=b"through a narrow gateway")
        assert c.get_object(Bucket="narrow", Key="k")["Body"].read() == \
            b"through a narrow gateway"
        assert code_of(g.put_object, Bucket="narrow", Key="k", Body=b"x",
                       ContentMD5="AAAAAAAAAAAAAAAAAAAAAA==") == "BadDigest"
        cluster.wait_for("the narrow gateway's events in the audit log", lambda: any(
            event.get("op") == "s3:PutObject" and event.get("target") == "narrow/k"
            for event in cluster.cairn("audit", "--entity", "client.s3user")[1]["events"]), 15)
    finally:
        _stop(gateway)


def test_upload_part_copy(s3):
    """UploadPartCopy: parts copied from ranges of other objects (boto3's managed copy sends
    them past its threshold), with S3's errors for a malformed or too long range."""
    from boto3.s3.transfer import TransferConfig

    _, _, c, _ = s3
    c.create_bucket(Bucket="upc")
    source = os.urandom((12 << 20) + 5)
    c.put_object(Bucket="upc", Key="src", Body=source)
    c.copy({"Bucket": "upc", "Key": "src"}, "upc", "dst",
           Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    got = c.get_object(Bucket="upc", Key="dst")
    assert got["Body"].read() == source and got["ETag"].endswith('-3"')

    upload = c.create_multipart_upload(Bucket="upc", Key="mix")["UploadId"]
    copied = c.upload_part_copy(Bucket="upc", Key="mix", UploadId=upload, PartNumber=1,
                                CopySource={"Bucket": "upc", "Key": "src"},
                                CopySourceRange=f"bytes=100-{100 + (5 << 20) - 1}")
    assert copied["CopyPartResult"]["ETag"] == \
        f'"{hashlib.md5(source[100:100 + (5 << 20)]).hexdigest()}"'
    tail = c.upload_part(Bucket="upc", Key="mix", UploadId=upload, PartNumber=2,
                         Body=b"own bytes")["ETag"]
    for bad, code in (("bytes=5-", "InvalidArgument"), ("items=0-4", "InvalidArgument"),
                      (f"bytes=0-{len(source)}", "InvalidRange")):
        assert code_of(c.upload_part_copy, Bucket="upc", Key="mix", UploadId=upload,
                       PartNumber=3, CopySource={"Bucket": "upc", "Key": "src"},
                       CopySourceRange=bad) == code, bad
    assert code_of(c.upload_part_copy, Bucket="upc", Key="mix", UploadId=upload, PartNumber=3,
                   CopySource={"Bucket": "upc", "Key": "nope"}) == "NoSuchKey"
    c.complete_multipart_upload(Bucket="upc", Key="mix", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": copied["CopyPartResult"]["ETag"]},
                  {"PartNumber": 2, "ETag": tail}]})
    assert c.get_object(Bucket="upc", Key="mix")["Body"].read() == \
        source[100:100 + (5 << 20)] + b"own bytes"


def test_a_stale_claim_is_settled_by_the_next_request(s3):
    """A gateway that died holding an upload's claim (a complete or an abort begun): after
    CLAIM_STALE_S the next request that meets the upload finishes or undoes what it began. The
    claims are planted in the uploads table as a dead gateway leaves them."""
    import asyncio

    from cairn.client.cluster import Cluster
    from cairn.s3.store import CLAIM_STALE_S

    _, _, c, _ = s3
    c.create_bucket(Bucket="claims")
    uploads = {}
    for key in ("aborting", "completing", "completed"):
        upload = c.create_multipart_upload(Bucket="claims", Key=key)["UploadId"]
        etag = c.upload_part(Bucket="claims", Key=key, UploadId=upload, PartNumber=1,
                             Body=key.encode() * 1000)["ETag"]
        uploads[key] = (upload, etag)
    done, done_etag = uploads["completed"]
    c.complete_multipart_upload(Bucket="claims", Key="completed", UploadId=done,
                                MultipartUpload={"Parts": [{"PartNumber": 1,
                                                            "ETag": done_etag}]})

    async def plant():
        async with await Cluster.connect(cluster.dir) as admin:
            index = admin.pool("s3.index")
            registry = dict([item async for item in index.omap_items("s3.buckets")])
            bucket_id = msgpack.unpackb(registry[b"claims"])["id"]
            table = f"s3.uploads.{bucket_id}"
            entry_shards = [f"s3.index.{bucket_id}.{n}" for n in range(16)]
            manifest = None
            for shard in entry_shards:
                found = await index.omap_get(shard, [b"completed"])
                if found:
                    manifest = msgpack.unpackb(found[b"completed"])["mf"]
            old = time.time() - CLAIM_STALE_S - 10
            for key, claim in (("aborting", None),
                               ("completing", f"s3.{bucket_id}.x.manifest.deadbeef"),
                               ("completed", manifest)):
                upload = uploads[key][0]
                record = {"i": old, "o": "client.s3user",
                          "end": {"t": old, "mf": claim, "tok": "0" * 16}}
                await index.omap_update(table, set={key.encode() + b"\0" + upload.encode():
                                                    msgpack.packb(record)})

    cluster = s3[0]
    asyncio.run(plant())
    # the abort is carried out; the complete that never landed gives the upload back; the
    # complete that landed is tidied away
    assert code_of(c.list_parts, Bucket="claims", Key="aborting",
                   UploadId=uploads["aborting"][0]) == "NoSuchUpload"
    parts = c.list_parts(Bucket="claims", Key="completing", UploadId=uploads["completing"][0])
    assert [p["ETag"] for p in parts["Parts"]] == [uploads["completing"][1]]
    assert code_of(c.list_parts, Bucket="claims", Key="completed", UploadId=done) == \
        "NoSuchUpload"
    assert [u["Key"] for u in c.list_multipart_uploads(Bucket="claims")["Uploads"]] == \
        ["completing"]
    c.complete_multipart_upload(Bucket="claims", Key="completing",
                                UploadId=uploads["completing"][0], MultipartUpload={
                                    "Parts": [{"PartNumber": 1,
                                               "ETag": uploads["completing"][1]}]})
    assert c.get_object(Bucket="claims", Key="completing")["Body"].read() == \
        b"completing" * 1000
    assert c.get_object(Bucket="claims", Key="completed")["Body"].read() == b"completed" * 1000
    # nothing left that no object names: the aborted upload's part went with it
    assert _gc(cluster, "--min-age-s", "0", "--dry-run")["garbage"] == 0
