"""One large object through cairn-s3, with the gateway's memory watched (docs/perf/s3.md).

    python -m cairn.cluster.s3_large_object --gateway-pid PID --gib 10

PUTs a sparse file of --gib GiB in one request (boto3, SigV4; botocore reads the file twice,
once for the payload's SHA-256), GETs it back, and samples the gateway's RSS every half second.
Credentials and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and S3_ENDPOINT. Prints
one JSON line: seconds and MB/s each way, bytes read back, RSS at start and at its peaks.
"""

import argparse
import json
import os
import tempfile
import threading
import time


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS")) / 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gateway-pid", type=int, required=True)
    parser.add_argument("--gib", type=int, default=10)
    parser.add_argument("--bucket", default="large-object")
    parser.add_argument("--scratch", default="/var/tmp", help="where the sparse file goes")
    args = parser.parse_args(argv)
    import boto3
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, read_timeout=600,
                                        signature_version="s3v4",
                                        request_checksum_calculation="when_required",
                                        response_checksum_validation="when_required"))
    size = args.gib << 30
    start = rss_mib(args.gateway_pid)
    peak, stop = [start], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(args.gateway_pid))
            time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()
    try:
        client.create_bucket(Bucket=args.bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    with tempfile.NamedTemporaryFile(dir=args.scratch) as sparse:
        sparse.truncate(size)
        sparse.seek(0)
        began = time.monotonic()
        client.put_object(Bucket=args.bucket, Key="large", Body=sparse)
        put_s = time.monotonic() - began
    put_peak = peak[0]
    began, read = time.monotonic(), 0
    for chunk in client.get_object(Bucket=args.bucket, Key="large")["Body"].iter_chunks(1 << 20):
        read += len(chunk)
    get_s = time.monotonic() - began
    stop.set()
    client.delete_object(Bucket=args.bucket, Key="large")
    print(json.dumps({"bytes": size, "read": read, "put_s": round(put_s, 1),
                      "put_MBps": round(size / put_s / 1e6), "get_s": round(get_s, 1),
                      "get_MBps": round(size / get_s / 1e6), "rss_start_mib": round(start),
                      "rss_peak_put_mib": round(put_peak), "rss_peak_mib": round(peak[0])}))
    return 0 if read == size else 1


if __name__ == "__main__":
    raise SystemExit(main())
