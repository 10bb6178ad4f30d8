"""`cairn-s3`: serve the S3 API on a cairn cluster.

    cairn-s3 --bind 0.0.0.0:7480 --cluster DIR [--data-pool s3.data] [--index-pool s3.index]
    cairn-s3 gc --cluster DIR [--min-age-s 86400] [--dry-run] [--json]

Stateless: run as many as you like behind any HTTP load balancer; they share everything through
the cluster. It connects as --name (default client.admin, whose keyring is in the cluster
directory): the gateway reads S3 keys and reports audit events, so that entity needs `admin`
caps. Requests are then checked against the caps of the entity each S3 key belongs to.
"""

import argparse
import asyncio
import json
import logging
import os
import sys

from aiohttp import web

from cairn.client.cluster import Cluster
from cairn.client.errors import ClientError
from cairn.common import daemon, metrics
from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed
from cairn.common.monclient import MonitorsUnavailable
from cairn.s3 import gc
from cairn.s3.gateway import Gateway
from cairn.s3.store import SHARDS_DEFAULT, SHARDS_MAX, Store

log = logging.getLogger("cairn.s3")

# Pools made by --create-pools when missing: the index replicated (omaps need it), the data
# replicated too (a bucket may live on any pool, erasure-coded ones included:
# CreateBucketConfiguration's LocationConstraint names it).
INDEX_POOL_PGS = 32
DATA_POOL_PGS = 128
# How long a stopping gateway lets requests in flight finish.
SHUTDOWN_GRACE_S = 10.0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="cairn-s3", description="Serve the S3 API (boto3, the aws CLI, s3fs) on a cairn "
        "cluster. Buckets live in --index-pool (their index, replicated) and --data-pool "
        "(objects' bytes, any kind); S3 keys come from 'cairn auth s3-key add client.NAME'. "
        "'cairn-s3 gc --help': collect data that no object names.")
    parser.add_argument("--bind", required=True, metavar="HOST:PORT",
                        help="listen here (port 0: any free port, written to --ready-file)")
    parser.add_argument("--cluster", default=os.environ.get("CAIRN_CLUSTER"),
                        help="the cluster directory or cluster.json ($CAIRN_CLUSTER)")
    parser.add_argument("--name", help="the entity the gateway connects as (default "
                        "$CAIRN_NAME or client.admin); it needs the caps s3gw, mon=r and "
                        "osd=rw on the pools it serves (or admin)")
    parser.add_argument("--keyring", help="that entity's keyring (default: the cluster "
                        "directory's)")
    parser.add_argument("--index-pool", default="s3.index")
    parser.add_argument("--data-pool", default="s3.data", help="where new buckets keep their "
                        "objects unless CreateBucket names another pool")
    parser.add_argument("--create-pools", action="store_true", help="make the two pools "
                        "(replicated, 3 copies or as many as there are hosts) if missing")
    parser.add_argument("--index-shards", type=int, default=SHARDS_DEFAULT,
                        help=f"index objects per new bucket (1..{SHARDS_MAX}; "
                        f"default {SHARDS_DEFAULT})")
    parser.add_argument("--region", default="us-east-1", help="the region clients sign for")
    parser.add_argument("--domain", action="append", default=[], metavar="NAME",
                        help="serve virtual-host requests: Host BUCKET.NAME names the bucket "
                        "(boto3's default style for an endpoint with a DNS name; point "
                        "*.NAME at the gateways). Repeat for more names. Path-style requests "
                        "work either way")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this "
                        "port (0: any free port)")
    parser.add_argument("--ready-file", help="write {addr, url, pid, metrics} as JSON here "
                        "once serving")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


async def ensure_pools(cluster, args):
    missing = [name for name in (args.index_pool, args.data_pool)
               if name not in cluster.map.pools]
    if not missing:
        return
    if not args.create_pools:
        raise SystemExit(f"cairn-s3: no pool {', '.join(missing)}; make them ('cairn pool "
                         f"create {args.index_pool} --replicated 3', 'cairn pool create "
                         f"{args.data_pool} ...') or pass --create-pools")
    hosts = len({osd.get("location", {}).get("host") for osd in cluster.map.osds.values()}) or 1
    for name in missing:
        request = {"op": "pool_create", "name": name, "failure_domain": "host",
                   "kind": "replicated", "size": min(3, hosts),
                   "pg_num": INDEX_POOL_PGS if name == args.index_pool else DATA_POOL_PGS}
        try:
            await cluster.monc.request(request)
        except RequestFailed as exc:
            if exc.code != Code.EXISTS:
                raise
        log.info("made pool %s (replicated, %d copies)", name, min(3, hosts))
    for _ in range(200):
        if all(name in cluster.map.pools for name in missing):
            return
        await asyncio.sleep(0.05)


async def may_serve(cluster):
    """Whether the gateway's entity may look S3 keys up (the `s3gw` cap, or admin): asked
    once at start with a key no one has, so a gateway that could only answer 503s refuses
    to start and says why."""
    try:
        await cluster.monc.request_with_session({"op": "auth_s3_key_get",
                                                 "key": "CK" + "0" * 18})
    except RequestFailed as exc:
        if exc.code == Code.PERMISSION_DENIED:
            log.error("%s may not look S3 keys up: give the gateway's entity the s3gw cap "
                      "('cairn auth caps %s --caps s3gw --caps mon=r --caps osd=rw', or "
                      "osd=rw per pool it serves)", os.environ.get("CAIRN_NAME", "its entity"),
                      os.environ.get("CAIRN_NAME", "client.NAME"))
            return False
    return True


def build_gc_parser():
    parser = argparse.ArgumentParser(
        prog="cairn-s3 gc", description="Delete data objects that no bucket entry, upload "
        "part or manifest names: what a gateway killed mid-PUT, or a commit whose outcome it "
        "could not read, left behind. Safe beside running gateways: only objects older than "
        "--min-age-s go, and only when nothing named them after they were listed.")
    parser.add_argument("--cluster", default=os.environ.get("CAIRN_CLUSTER"),
                        help="the cluster directory or cluster.json ($CAIRN_CLUSTER)")
    parser.add_argument("--name", help="the entity to connect as (default $CAIRN_NAME or "
                        "client.admin)")
    parser.add_argument("--keyring", help="that entity's keyring")
    parser.add_argument("--index-pool", default="s3.index")
    parser.add_argument("--data-pool", default="s3.data")
    parser.add_argument("--min-age-s", type=float, default=gc.MIN_AGE_S_DEFAULT,
                        help="collect only objects written at least this long ago (default "
                        f"{gc.MIN_AGE_S_DEFAULT:.0f}: a day; an upload must finish within it)")
    parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def gc_main(argv):
    args = build_gc_parser().parse_args(argv)
    if args.min_age_s < 0:
        build_gc_parser().error("--min-age-s must be 0 or more")
    if args.name:
        os.environ["CAIRN_NAME"] = args.name

    def progress(text):
        if not args.json:
            print(f"  {text}", file=sys.stderr, flush=True)

    async def run():
        cluster = await Cluster.connect(args.cluster, keyring=args.keyring)
        try:
            if args.index_pool not in cluster.map.pools:
                raise SystemExit(f"cairn-s3 gc: no pool {args.index_pool!r}: no buckets")
            store = Store(cluster, args.index_pool, args.data_pool)
            return await gc.collect(store, args.min_age_s, args.dry_run, progress)
        finally:
            await cluster.close()

    try:
        report = asyncio.run(run())
    except (ClientError, MonitorsUnavailable, OSError, ValueError) as exc:
        print(f"cairn-s3 gc: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    count = report["garbage"] if args.dry_run else report["deleted"]
    print(f"{report['buckets']} buckets, {report['objects']} data objects in "
          f"{', '.join(report['pools']) or 'no pool'}: {report['named']} named, "
          f"{report['garbage']} unnamed and older than {args.min_age_s:g} s "
          f"({report['bytes']} bytes, {report['orphaned']} of buckets that are gone), "
          f"{report['young']} unnamed but younger; {verb} {count}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gc"]:
        return gc_main(argv[1:])
    args = build_parser().parse_args(argv)
    host, sep, port = args.bind.rpartition(":")
    if not sep or not port.isdigit():
        build_parser().error(f"--bind takes HOST:PORT (was {args.bind!r})")
    if not 1 <= args.index_shards <= SHARDS_MAX:
        build_parser().error(f"--index-shards must be within 1..{SHARDS_MAX}")
    if args.name:
        os.environ["CAIRN_NAME"] = args.name
    daemon.setup_logging("cairn-s3", args.verbose)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def serve(stop):
        try:
            cluster = await Cluster.connect(args.cluster, keyring=args.keyring)
        except (ClientError, MonitorsUnavailable, OSError, ValueError) as exc:
            log.error("cannot connect to the cluster: %s", exc)
            return 2
        runner = metrics_runner = None
        try:
            await ensure_pools(cluster, args)
            if not await may_serve(cluster):
                return 2
            store = Store(cluster, args.index_pool, args.data_pool, args.index_shards)
            gateway = Gateway(cluster, store, args.region, args.domain)
            server = web.Server(gateway.handle, handler_cancellation=False)
            runner = web.ServerRunner(server, handle_signals=False, access_log=None,
                                      shutdown_timeout=SHUTDOWN_GRACE_S)
            await runner.setup()
            site = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port),
                               backlog=1024, reuse_address=True)
            await site.start()
            bound = runner.addresses[0]
            addr = f"{bound[0]}:{bound[1]}"
            url = f"http://{addr}"
            metrics_url = None
            if args.metrics_port is not None:
                metrics_runner, metrics_url = await metrics.serve(
                    bound[0], args.metrics_port, gateway.metrics.collect)
            audit_task = asyncio.get_running_loop().create_task(gateway.audit_loop())
            log.info("serving S3 on %s (index pool %s, data pool %s)", url, args.index_pool,
                     args.data_pool)
            if args.ready_file:
                daemon.write_ready_file(args.ready_file, {"addr": addr, "url": url,
                                                          "pid": os.getpid(),
                                                          "metrics": metrics_url})
            await stop.wait()
            log.info("stopping: %d requests in flight", gateway.metrics.in_flight)
            await runner.cleanup()              # waits for requests in flight
            runner = None
            audit_task.cancel()
            await store.drain()
            await gateway.flush_audit()
            return 0
        finally:
            if runner is not None:
                await runner.cleanup()
            if metrics_runner is not None:
                await metrics_runner.cleanup()
            await cluster.close()

    return daemon.run(serve, "cairn-s3")


if __name__ == "__main__":
    raise SystemExit(main())
