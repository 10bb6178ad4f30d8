"""cairn-s3 under faults, with boto3: a gateway SIGKILLed mid-upload leaves no partial object
(and an unfinished multipart upload stays listable and abortable); an OSD SIGKILLed under load
costs retries, not errors or wrong bytes; two writers to one key leave one object whole."""

import concurrent.futures
import hashlib
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

boto3 = pytest.importorskip("boto3", reason="boto3 is a test dependency (pip install -e "
                            "'.[test]')")
from tests.test_s3 import client, code_of, s3_key  # noqa: E402

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "osd.heartbeat_interval_s=0.5")


@pytest.fixture
def gateway(local_cluster):
    cluster = local_cluster(device_size="2G", config=FAST, extra=["--s3", "1"])
    endpoint = cluster.description["s3"][0]
    key, secret = s3_key(cluster, "client.s3user", "mon=r", "osd=rw")
    return cluster, endpoint, key, secret


class Slow:
    """A body that yields 1 MiB every `pause` seconds: an upload long enough to kill into."""

    def __init__(self, size, pause):
        self.left, self.pause = size, pause

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        time.sleep(self.pause)
        n = min(self.left, 1 << 20 if n is None or n < 0 else min(n, 1 << 20))
        self.left -= n
        return b"s" * n


def test_a_gateway_killed_mid_upload_leaves_nothing_partial(gateway):
    cluster, endpoint, key, secret = gateway
    c = client(endpoint, key, secret, retries={"max_attempts": 1}, read_timeout=30)
    c.create_bucket(Bucket="kil")
    c.put_object(Bucket="kil", Key="obj", Body=b"old version")
    upload = c.create_multipart_upload(Bucket="kil", Key="mp")["UploadId"]
    etag = c.upload_part(Bucket="kil", Key="mp", UploadId=upload, PartNumber=1,
                         Body=os.urandom(5 << 20))["ETag"]
    failures = []

    def put(name, size):
        # A presigned PUT sent with http.client, 1 MiB every 50 ms: the gateway has received
        # and written stripes when it is killed (boto3 reads a body without seek() whole
        # before it sends a byte).
        url = urllib.parse.urlsplit(c.generate_presigned_url(
            "put_object", Params={"Bucket": "kil", "Key": name}, ExpiresIn=300))
        body = Slow(size, 0.05)
        try:
            connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            connection.putrequest("PUT", f"{url.path}?{url.query}")
            connection.putheader("Content-Length", str(size))
            connection.endheaders()
            while piece := body.read():
                connection.send(piece)
            failures.append(connection.getresponse().status)       # not expected
        except Exception as exc:                           # noqa: BLE001 (expected: killed)
            failures.append(exc)

    writers = [threading.Thread(target=put, args=("obj", 64 << 20)),
               threading.Thread(target=put, args=("new", 64 << 20))]
    for writer in writers:
        writer.start()
    time.sleep(1.5)                                         # a dozen MiB in: two stripes
    cluster.script("kill", "s3.0")                          # SIGKILL
    for writer in writers:
        writer.join(60)
    assert len(failures) == 2 and all(isinstance(f, Exception) for f in failures), failures
    cluster.script("restart", "s3.0")
    c = client(endpoint, key, secret)
    assert c.get_object(Bucket="kil", Key="obj")["Body"].read() == b"old version"
    assert [o["Key"] for o in c.list_objects_v2(Bucket="kil")["Contents"]] == ["obj"]
    uploads = c.list_multipart_uploads(Bucket="kil")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp", upload)]
    assert [p["ETag"] for p in c.list_parts(Bucket="kil", Key="mp", UploadId=upload)["Parts"]] \
        == [etag]
    # The killed PUTs' stripes are named by nothing: the collector takes them, and only them.
    gc = subprocess.run([sys.executable, "-m", "cairn.s3.cli", "gc", "--cluster", cluster.dir,
                         "--min-age-s", "0", "--json"], capture_output=True, text=True,
                        timeout=120)
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    assert report["deleted"] >= 1 and report["orphaned"] == 0, report
    assert all(upload not in name for name in report["names"]), report     # its part stays
    assert c.get_object(Bucket="kil", Key="obj")["Body"].read() == b"old version"
    assert [p["ETag"] for p in c.list_parts(Bucket="kil", Key="mp", UploadId=upload)["Parts"]] \
        == [etag]
    c.abort_multipart_upload(Bucket="kil", Key="mp", UploadId=upload)
    assert c.list_multipart_uploads(Bucket="kil").get("Uploads", []) == []
    assert code_of(c.list_parts, Bucket="kil", Key="mp", UploadId=upload) == "NoSuchUpload"


def test_an_osd_killed_under_load_costs_retries_not_errors(gateway):
    cluster, endpoint, key, secret = gateway
    c = client(endpoint, key, secret, retries={"max_attempts": 6, "mode": "standard"},
               read_timeout=120, max_pool_connections=16)
    c.create_bucket(Bucket="load")
    rng = random.Random(5)
    bodies = {f"o{i:04d}": rng.randbytes(rng.choice((4096, 65536, 5 << 20)))
              for i in range(240)}
    names = sorted(bodies)
    stop = time.monotonic() + 60

    def put_then_get(name):
        c.put_object(Bucket="load", Key=name, Body=bodies[name])
        got = c.get_object(Bucket="load", Key=name)["Body"].read()
        assert got == bodies[name], f"{name}: wrong bytes"
        return name

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(put_then_get, name) for name in names[:80]]
        time.sleep(1.0)
        cluster.script("kill", "osd.2")
        futures += [pool.submit(put_then_get, name) for name in names[80:]]
        done = [future.result(timeout=max(1, stop - time.monotonic() + 120))
                for future in futures]
    assert sorted(done) == names
    for name in names:                                      # everything reads back, again
        assert c.get_object(Bucket="load", Key=name)["Body"].read() == bodies[name]


def test_two_writers_to_one_key_leave_one_whole_object(gateway):
    cluster, endpoint, key, secret = gateway
    c = client(endpoint, key, secret, max_pool_connections=8)
    c.create_bucket(Bucket="race")
    bodies = [bytes([n]) * (9 << 20) + os.urandom(1000) for n in range(4)]
    digests = {hashlib.sha256(body).hexdigest() for body in bodies}
    for round_ in range(5):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda body: c.put_object(Bucket="race", Key="k", Body=body),
                          bodies))
        got = c.get_object(Bucket="race", Key="k")
        data = got["Body"].read()
        assert hashlib.sha256(data).hexdigest() in digests, f"round {round_}: a mix"
        assert got["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert [o["Key"] for o in c.list_objects_v2(Bucket="race")["Contents"]] == ["k"]
    # The losers' data is deleted after the grace period (a GET streaming it finishes), or
    # at once when the gateway stops: the data pool comes to hold only the winner's 3 stripes.
    cluster.script("kill", "s3.0", "--signal", "TERM")
    cluster.wait_for("the replaced objects' data deleted", lambda: len(
        cluster.cairn("ls", "s3.data", "--prefix", "s3.race.")[1]["names"]) == 3, 30)
