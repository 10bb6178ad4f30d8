"""`cairn status | osd ... | pool ... | map ... | config ...`: the cluster's admin commands.

Every command finds the monitors from `--cluster DIR` (a directory made by `cairn-cluster up`, or
its cluster.json, or HOST:PORT,...) or the CAIRN_CLUSTER environment variable, and with `--json`
prints exactly one JSON object on stdout. Errors go to stderr; the exit status is 0 on success,
1 when the monitor refused the request (the message says why), 2 for bad usage or an unreachable
cluster.
"""

import argparse
import asyncio
import json
import os
import sys
import time

from cairn.common import auth, messenger, sessions, tls
from cairn.common.codes import Code
from cairn.common.monclient import ClusterNotFound, MonClient, MonitorsUnavailable, load_cluster
from cairn.common.placement import PlacementError
from cairn.common.units import format_size, parse_size

# Admin commands give up sooner than daemons: a person is waiting.
ADMIN_DEADLINE_S = 10.0


def add_parsers(commands, common):
    """Register the admin subcommands on `commands`; `common` holds --cluster and --json."""
    commands.add_parser("status", parents=[common], help="cluster health, monitors, OSDs, pools")
    commands.add_parser(
        "console", parents=[common], help="the operations console's URL and a one-time "
        "sign-in link", description="Prints the URL of a monitor's operations console (a web "
        "page: health, OSDs, pools, recovery) and a link that signs a browser in once, within "
        "5 minutes, as the entity this command runs as (client.admin by default, or "
        "--name/--keyring), with its caps: a read-only key sees and cannot change. --json "
        "prints {url, login_url}.")
    health = commands.add_parser(
        "health", parents=[common], help="health checks: severity, summary (detail: and what "
        "each names; history: the last raises and clears)",
        description="Every health check the monitors raise, worst first. --json prints "
        "{status, checks: {NAME: {severity, summary, detail, since}}}. 'history' lists the "
        "newest raises and clears the monitors recorded (--json: {events: [{cluster, check, "
        "severity, summary, detail, state, time}], kept}).")
    health.add_argument("detail", nargs="?", choices=["detail", "history"],
                        metavar="detail|history",
                        help="detail: also list what each check names, and since when; history: "
                        "the last raises and clears, oldest first")
    health.add_argument("--limit", type=int, default=50, help="history: how many of the newest "
                        "events (default 50)")

    osd = commands.add_parser("osd", help="OSD commands: tree, perf, out, in, down, reweight, "
                              "weight")
    osd_commands = osd.add_subparsers(dest="osd_command", required=True, metavar="SUBCOMMAND")
    osd_commands.add_parser("tree", parents=[common], help="OSDs by host and rack, with up/in")
    osd_commands.add_parser(
        "perf", parents=[common], help="each OSD's device latency and its hedged reads",
        description="Per OSD, from its heartbeats: its device's read and write latency (mean, "
        "over the slow-disk window of 10 s), how many reads a second went around it lately "
        "(clients steered away from it, erasure-coded primaries decoded around its late "
        "shards: READS_HEDGED names it at health.hedged_reads_per_s), and its hedge counters "
        "since it started: reads it served as a replica for a client's hedge, clients' reads "
        "hedged around it as their primary (sent, won: the replica answered first, wasted: "
        "the rest), reads steered around it, and, as an erasure-coded primary, shard hedges "
        "sent, won (decoded before the late shard came) and wasted.")
    for state, text in (("out", "take an OSD out of placement (stays out until 'osd in')"),
                        ("in", "put an OSD back into placement"),
                        ("down", "mark an OSD down (a running OSD boots again at once)")):
        sub = osd_commands.add_parser(state, parents=[common], help=text)
        sub.add_argument("osd", help="OSD id: 3 or osd.3")
    reweight = osd_commands.add_parser("reweight", parents=[common], help="the share of its "
                                       "PGs an OSD keeps, 0..1 (1: all its weight gives it; "
                                       "data moves gently in steps: 'cairn-cluster add-host')")
    reweight.add_argument("osd", help="OSD id: 3 or osd.3")
    reweight.add_argument("reweight", type=float, help="0.0 to 1.0")
    weight = osd_commands.add_parser("weight", parents=[common], help="an OSD's placement "
                                     "weight (its capacity's share; changing it moves data "
                                     "only to or from that OSD)")
    weight.add_argument("osd", help="OSD id: 3 or osd.3")
    weight.add_argument("weight", type=float, help="0 or more (1.0 by default)")

    pool = commands.add_parser("pool", help="pool commands: create, ls, rm")
    pool_commands = pool.add_subparsers(dest="pool_command", required=True, metavar="SUBCOMMAND")
    create = pool_commands.add_parser("create", parents=[common], help="create a pool")
    create.add_argument("name")
    kind = create.add_mutually_exclusive_group(required=True)
    kind.add_argument("--replicated", type=int, metavar="N", help="N copies")
    kind.add_argument("--erasure", metavar="K+M", help="erasure coded, e.g. 18+6")
    create.add_argument("--min-size", type=int, help="writes need this many copies or shards "
                        "up (default: a majority of N; k+1 for erasure, k allowed with a "
                        "warning)")
    create.add_argument("--backend", help="erasure: the pyeclib backend (default "
                        "isa_l_rs_cauchy; liberasurecode_rs_vand; isa_l_rs_vand for m <= 4)")
    create.add_argument("--failure-domain", default="host", help="no two copies or shards in "
                        "one of these (default host)")
    create.add_argument("--osds-per-domain", type=int, help="erasure: shards per failure domain "
                        "(e.g. 3 to put 18+6 on 8 hosts; at most M)")
    create.add_argument("--fast-read", action="store_true", help="erasure: every read asks "
                        "all k+m members and decodes from the first k to answer (Ceph's "
                        "fast_read): no wait on one slow disk, at m/k more disk reads and a "
                        "decode per read. Without it a shard late past the hedge delay is "
                        "read around instead (default: off, measured in docs/perf/hedged.md)")
    create.add_argument("--pg-num", type=int, default=128, help="placement groups, a power of "
                        "two (default 128)")
    quota = pool_commands.add_parser(
        "set-quota", parents=[common], help="limit a pool's objects and/or bytes (0: no limit)",
        description="Writes to the pool are refused with a quota error once it holds this many "
        "objects or bytes (counted from the OSDs' reports, so a write or two may pass in the "
        "second it takes); POOL_NEAR_QUOTA warns at pool.near_quota_ratio (0.8).")
    quota.add_argument("name")
    quota.add_argument("--max-objects", type=int, metavar="N", help="at most N objects (0: no "
                       "limit)")
    quota.add_argument("--max-bytes", metavar="SIZE", help="at most SIZE bytes stored, e.g. "
                       "10G (0: no limit)")
    setter = pool_commands.add_parser(
        "set", parents=[common], help="set a pool property: allow-from CIDR[,CIDR...] "
        "[--prefix PATH] (only these addresses may use its objects; 'any' lifts it), or "
        "fast-read on|off (an erasure pool's reads ask every member)",
        description="allow-from: OSDs serve the pool's objects (under PATH with --prefix) only "
        "to connections whose real peer address lies in one of the ranges, with or without "
        "authentication; an object must pass every allowlist whose prefix starts its name, "
        "and listings show only the names the address may use. 'allow-from any' removes the "
        "allowlist of that prefix. OSD-to-OSD traffic is not affected. fast-read (erasure "
        "pools): reads ask every member for its shard and decode the first k that come, so "
        "none waits on one slow disk, at m/k more disk reads and a decode per read; off, a "
        "shard late past the hedge delay is read around instead. Takes effect at once.")
    setter.add_argument("name", metavar="POOL")
    setter.add_argument("key", choices=["allow-from", "fast-read"],
                        help="the property (allow-from, fast-read)")
    setter.add_argument("value", help="allow-from: CIDR[,CIDR...] like "
                        "10.0.0.0/8,192.168.1.7 (an address alone is a /32), or 'any'; "
                        "fast-read: on or off")
    setter.add_argument("--prefix", default="", metavar="PATH", help="only objects whose "
                        "names start with PATH (default: the whole pool)")
    pool_commands.add_parser("ls", parents=[common], help="list pools (with quotas and "
                             "allowlists)")
    remove = pool_commands.add_parser("rm", parents=[common], help="delete a pool")
    remove.add_argument("name")

    commands.add_parser("df", parents=[common], help="raw capacity, each OSD's use, each pool's "
                        "objects, bytes and quota", description="--json prints {raw: {total_bytes, "
                        "used_bytes, avail_bytes, used_ratio}, osds: [...], pools: [{name, id, "
                        "kind, objects, stored_bytes, raw_bytes, max_objects, max_bytes, "
                        "quota_ratio, quota_full}], ratios}. Figures come from the OSDs' last "
                        "heartbeats.")

    mapping = commands.add_parser("map", parents=[common], help="where an object lives: its PG, "
                                  "OSDs and primary")
    mapping.add_argument("pool")
    mapping.add_argument("object")

    configuration = commands.add_parser("config", help="cluster config: set, get")
    config_commands = configuration.add_subparsers(dest="config_command", required=True,
                                                   metavar="SUBCOMMAND")
    setter = config_commands.add_parser("set", parents=[common], help="set KEY to VALUE")
    setter.add_argument("key")
    setter.add_argument("value")
    getter = config_commands.add_parser("get", parents=[common], help="show KEY (or every "
                                        "option with no KEY)")
    getter.add_argument("key", nargs="?")
    unset = config_commands.add_parser("rm", parents=[common], help="unset KEY (back to its "
                                       "default)")
    unset.add_argument("key")


    monitors = commands.add_parser("mon", help="monitor membership: add, remove (one at a "
                                   "time)")
    mon_commands = monitors.add_subparsers(dest="mon_command", required=True,
                                           metavar="SUBCOMMAND")
    adder = mon_commands.add_parser(
        "add", parents=[common], help="add a monitor: make it first with 'cairn-mon mkfs --join "
        "--fsid FSID --keyring BOOTSTRAP_KEYRING', start it on HOST:PORT, then add it here; it catches up from the leader")
    adder.add_argument("name", help="the new monitor's name, like mon.3")
    adder.add_argument("addr", help="HOST:PORT it listens on")
    remover = mon_commands.add_parser("remove", parents=[common], help="remove a monitor (it "
                                      "stops once the change is committed)")
    remover.add_argument("name")

    keys = commands.add_parser(
        "auth", help="entities, keys and caps: add, ls, get, get-key, caps, rm, s3-key",
        description="Every client, OSD and monitor authenticates with a key (cairn-cluster up "
        "makes client.admin's, in DIR/client.admin.keyring). Caps say what a key may do, one "
        "--caps each: mon=r (read the map and health), mon=rw (also change pools, config, "
        "OSDs), osd=r or osd=rw [pool=P] [prefix=PATH] (objects of pool P, or of every pool, "
        "whose names start with PATH), admin (everything, keys included).")
    key_commands = keys.add_subparsers(dest="auth_command", required=True, metavar="SUBCOMMAND")
    add = key_commands.add_parser("add", parents=[common], help="add an entity with a new key")
    add.add_argument("entity", help="client.NAME")
    add.add_argument("--caps", action="append", default=[], metavar="CAP", help='one cap, e.g. '
                     '"mon=r" or "osd=rw pool=ckpt prefix=team-a/"; repeat for more')
    add.add_argument("--keyring-out", metavar="FILE", help="write the new key here (mode 0600)")
    key_commands.add_parser("ls", parents=[common], help="every entity and its caps (no keys)")
    get = key_commands.add_parser("get", parents=[common], help="an entity's caps")
    get.add_argument("entity")
    get_key = key_commands.add_parser("get-key", parents=[common], help="an entity's key, as a "
                                      "keyring file (mode 0600) or printed")
    get_key.add_argument("entity")
    get_key.add_argument("--keyring-out", metavar="FILE", help="write it here (default: print "
                         "the keyring)")
    caps = key_commands.add_parser("caps", parents=[common], help="replace an entity's caps")
    caps.add_argument("entity")
    caps.add_argument("--caps", action="append", default=[], metavar="CAP", help="as for add")
    rm = key_commands.add_parser("rm", parents=[common], help="remove an entity (its sessions "
                                 "and tickets end within auth.ticket_ttl_s)")
    rm.add_argument("entity")
    s3_keys = key_commands.add_parser(
        "s3-key", help="S3 access keys of an entity: add, rm, ls",
        description="An S3 access key lets S3 clients (boto3, the aws CLI, s3fs) act as a "
        "client entity through cairn-s3: the entity's osd caps decide what they may do, with "
        "BUCKET/KEY as the object name (osd=rw pool=s3.data prefix=team-a/: bucket team-a). "
        "Removing the key, or the entity, revokes it within the gateways' cache time (10 s).")
    s3_commands = s3_keys.add_subparsers(dest="s3_command", required=True,
                                         metavar="SUBCOMMAND")
    s3_add = s3_commands.add_parser("add", parents=[common], help="a new access key and "
                                    "secret for ENTITY (printed once: keep the secret)")
    s3_add.add_argument("entity", help="client.NAME")
    s3_rm = s3_commands.add_parser("rm", parents=[common], help="revoke an access key")
    s3_rm.add_argument("access_key")
    s3_ls = s3_commands.add_parser("ls", parents=[common], help="access keys and their "
                                   "entities (no secrets)")
    s3_ls.add_argument("entity", nargs="?", help="only this entity's")


COMMANDS = ("status", "console", "health", "df", "osd", "pool", "map", "config", "mon", "auth")


def _osd_id(text):
    digits = text[4:] if text.startswith("osd.") else text
    if not digits.isdigit():
        raise ValueError(f"an OSD is a number or osd.N (was {text!r})")
    return int(digits)


def _request_for(args):
    """(request header, formatter) for a command that is one monitor request."""
    if args.command == "status":
        return {"op": "status"}, _format_status
    if args.command == "console":
        return {"op": "console_login"}, _format_console
    if args.command == "health" and args.detail == "history":
        return {"op": "health_history", "limit": args.limit}, _format_history
    if args.command == "health":
        return {"op": "health"}, lambda reply: _format_health(reply, bool(args.detail))
    if args.command == "osd" and args.osd_command == "tree":
        return {"op": "osd_tree"}, _format_tree
    if args.command == "osd" and args.osd_command == "perf":
        return {"op": "osd_perf"}, _format_perf
    if args.command == "osd" and args.osd_command in ("reweight", "weight"):
        osd_id, field = _osd_id(args.osd), args.osd_command
        value = getattr(args, field)
        return ({"op": "osd_mark", "id": osd_id, "state": field, field: value},
                lambda reply: f"osd.{osd_id} {field} set to {value:g} (epoch "
                              f"{reply['epoch']})")
    if args.command == "osd":
        osd_id = _osd_id(args.osd)
        return ({"op": "osd_mark", "id": osd_id, "state": args.osd_command},
                lambda reply: f"marked osd.{osd_id} {args.osd_command} (epoch {reply['epoch']})")
    if args.command == "pool" and args.pool_command == "create":
        return _pool_create_request(args), _format_pool_created
    if args.command == "df":
        return {"op": "df"}, _format_df
    if args.command == "pool" and args.pool_command == "set-quota":
        return _quota_request(args), lambda reply: (
            f"pool {_describe_pool(reply['pool'])} (epoch {reply['epoch']})")
    if args.command == "pool" and args.pool_command == "set":
        request = _fast_read_request(args) if args.key == "fast-read" else \
            _allow_from_request(args)
        return request, lambda reply: (
            f"pool {_describe_pool(reply['pool'])} (epoch {reply['epoch']})")
    if args.command == "pool" and args.pool_command == "ls":
        return {"op": "pool_ls"}, _format_pools
    if args.command == "pool" and args.pool_command == "rm":
        return ({"op": "pool_delete", "name": args.name},
                lambda reply: f"deleted pool {args.name} (epoch {reply['epoch']})")
    if args.command == "config" and args.config_command == "set":
        return ({"op": "config_set", "key": args.key, "value": args.value},
                lambda reply: f"set {args.key} = {args.value} (epoch {reply['epoch']})")
    if args.command == "config" and args.config_command == "rm":
        return ({"op": "config_set", "key": args.key, "value": None},
                lambda reply: f"unset {args.key} (epoch {reply['epoch']})")
    if args.command == "config" and args.config_command == "get":
        return {"op": "config_get", "key": args.key}, _format_config
    if args.command == "mon" and args.mon_command == "add":
        return ({"op": "mon_add", "name": args.name, "addr": args.addr},
                lambda reply: f"{'already a monitor: ' if reply.get('already') else 'added '}"
                              f"{args.name} at {args.addr}; monitors now "
                              f"{', '.join(reply['members'])}")
    if args.command == "mon" and args.mon_command == "remove":
        return ({"op": "mon_remove", "name": args.name},
                lambda reply: f"removed {args.name}; monitors now {', '.join(reply['members'])}")
    return None, None


def _quota_request(args):
    request = {"op": "pool_set_quota", "name": args.name}
    if args.max_objects is not None:
        if args.max_objects < 0:
            raise ValueError(f"--max-objects must be 0 or more (was {args.max_objects})")
        request["max_objects"] = args.max_objects
    if args.max_bytes is not None:
        request["max_bytes"] = parse_size(args.max_bytes)
        if request["max_bytes"] < 0:
            raise ValueError(f"--max-bytes must be 0 or more (was {args.max_bytes})")
    if len(request) == 2:
        raise ValueError("give --max-objects, --max-bytes or both (0 removes a limit)")
    return request


def _fast_read_request(args):
    value = args.value.strip().lower()
    if value not in ("on", "off"):
        raise ValueError(f"fast-read is on or off (was {args.value!r})")
    if args.prefix:
        raise ValueError("--prefix applies to allow-from, not fast-read")
    return {"op": "pool_fast_read", "name": args.name, "fast_read": value == "on"}


def _allow_from_request(args):
    networks = []
    if args.value.strip().lower() != "any":
        try:
            networks = [str(network) for network in auth.parse_networks(args.value)]
        except auth.AuthError as exc:
            raise ValueError(f"allow-from: {exc}") from None
    return {"op": "pool_allow_from", "name": args.name, "prefix": args.prefix,
            "networks": networks}


def _pool_create_request(args):
    request = {"op": "pool_create", "name": args.name, "failure_domain": args.failure_domain,
               "pg_num": args.pg_num}
    if args.replicated is not None:
        request.update(kind="replicated", size=args.replicated)
        if args.min_size is not None:
            request["min_size"] = args.min_size
    else:
        k, plus, m = args.erasure.partition("+")
        if not plus or not k.isdigit() or not m.isdigit():
            raise ValueError(f"--erasure takes K+M, e.g. 18+6 (was {args.erasure!r})")
        request.update(kind="erasure", k=int(k), m=int(m))
        if args.min_size is not None:
            request["min_size"] = args.min_size
            if args.min_size == int(k) and int(m) > 1:
                print(f"warning: min_size {k} = k: a write acknowledged with only k shards up "
                      "is lost if one more shard fails before recovery", file=sys.stderr)
        if args.backend is not None:
            request["backend"] = args.backend
    if args.backend is not None and args.replicated is not None:
        raise ValueError("--backend applies to erasure pools")
    if args.fast_read:
        if args.replicated is not None:
            raise ValueError("--fast-read applies to erasure pools (replicated reads are hedged "
                             "by the client)")
        request["fast_read"] = True
    if args.osds_per_domain is not None:
        if args.replicated is not None:
            raise ValueError("--osds-per-domain applies to erasure pools")
        request["osds_per_domain"] = args.osds_per_domain
    return request


async def run(args):
    mons = load_cluster(args.cluster)
    try:
        authenticate = sessions.client_handshake(args.cluster)
    except auth.AuthError as exc:
        raise messenger.RequestFailed(Code.PERMISSION_DENIED, str(exc)) from None
    try:
        context = tls.for_cluster(args.cluster)
    except tls.TlsError as exc:
        raise messenger.RequestFailed(Code.TLS, str(exc)) from None
    monc = MonClient(mons, deadline_s=ADMIN_DEADLINE_S, name="cairn", authenticate=authenticate,
                     tls=context)
    try:
        if args.command == "map":
            cmap = await monc.get_map()
            return _map_object(cmap, args.pool, args.object), _format_map
        if args.command == "auth":
            return await _auth(monc, args)
        header, formatter = _request_for(args)
        assert header is not None, args
        reply = await monc.request(header)
        if args.command == "status":
            return {**reply.header, "s3": _gateways(args.cluster)}, formatter
        if args.command == "console":
            return {"url": reply.header["url"], "login_url": reply.header["login_url"]}, \
                formatter
        return reply.header, formatter
    finally:
        await monc.close()


def _gateways(where):
    """The S3 gateways' URLs the cluster's description lists (cairn-cluster up --s3)."""
    where = where or os.environ.get("CAIRN_CLUSTER") or ""
    path = os.path.join(where, "cluster.json") if os.path.isdir(where) else where
    try:
        with open(path) as handle:
            found = json.load(handle).get("s3", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [url for url in found if isinstance(url, str)] if isinstance(found, list) else []


async def _auth(monc, args):
    """(result, formatter) of a `cairn auth` command."""
    command = args.auth_command
    if command == "ls":
        reply = await monc.request({"op": "auth_ls"})
        return reply.header, lambda r: "\n".join(
            f"{e['entity']}: {'; '.join(e['caps']) or 'no caps'}" for e in r["entities"])
    if command == "s3-key":
        return await _s3_key(monc, args)
    if command in ("add", "caps"):
        try:
            auth.Caps.parse(args.caps)                  # a clear error before asking
        except auth.AuthError as exc:
            raise ValueError(str(exc)) from None
    op = {"add": "auth_add", "get": "auth_get", "get-key": "auth_get", "caps": "auth_caps",
          "rm": "auth_rm"}[command]
    header = {"op": op, "entity": args.entity}
    if command in ("add", "caps"):
        header["caps"] = args.caps
    reply, connection = await monc.request_with_session(header)
    result = {key: value for key, value in reply.header.items() if key not in ("key", "nonce")}
    if command in ("add", "get-key"):
        secret = sessions.unwrap_reply(connection, reply.header)
        if args.keyring_out:
            auth.write_keyring(args.keyring_out, {args.entity: (secret, reply.header["caps"])})
            result["keyring"] = os.path.abspath(args.keyring_out)
        elif command == "get-key":
            result["key"] = auth.encode_secret(secret)
    caps = "; ".join(result.get("caps", [])) or "no caps"
    if command == "add":
        where = f"; keyring written to {result['keyring']}" if "keyring" in result else \
            " (no --keyring-out: get it later with 'cairn auth get-key')"
        return result, lambda r: f"added {args.entity} ({caps}){where}"
    if command == "get-key":
        if "keyring" in result:
            return result, lambda r: f"wrote {args.entity}'s keyring to {r['keyring']}"
        return result, lambda r: f"[{args.entity}]\n\tkey = {r['key']}\n\tcaps = {caps}"
    if command == "rm":
        return result, lambda r: f"removed {args.entity}"
    return result, lambda r: f"{args.entity}: {caps}"


async def _s3_key(monc, args):
    """(result, formatter) of `cairn auth s3-key add|rm|ls`."""
    if args.s3_command == "ls":
        header = {"op": "auth_s3_key_ls"}
        if args.entity:
            header["entity"] = args.entity
        reply = await monc.request(header)
        return reply.header, lambda r: "\n".join(
            f"{k['access_key']} {k['entity']}" for k in r["keys"]) or "no S3 keys"
    if args.s3_command == "rm":
        reply = await monc.request({"op": "auth_s3_key_rm", "key": args.access_key})
        return reply.header, lambda r: f"revoked S3 access key {args.access_key}"
    reply, connection = await monc.request_with_session({"op": "auth_s3_key_add",
                                                         "entity": args.entity})
    if "key" not in reply.header:
        raise ValueError("this cluster runs without authentication (auth none): S3 keys need "
                         "it")
    secret = sessions.unwrap_reply(connection, reply.header)
    result = {"access_key": reply.header["access_key"],
              "secret_key": auth.s3_secret_text(secret), "entity": args.entity}
    return result, lambda r: (f"added an S3 key for {r['entity']}\n"
                              f"aws_access_key_id = {r['access_key']}\n"
                              f"aws_secret_access_key = {r['secret_key']}")


def _map_object(cmap, pool_name, object_name):
    if pool_name not in cmap.pools:
        raise LookupError(f"no pool named {pool_name!r} (pools: "
                          f"{', '.join(sorted(cmap.pools)) or 'none'})")
    pool = cmap.pools[pool_name]
    pg, osds = cmap.placement().map_object(pool_name, object_name)
    up = [osd for osd in osds if osd is not None and cmap.osds[osd]["up"]]
    return {"epoch": cmap.epoch, "pool": pool_name, "object": object_name, "pg": pg,
            "pg_id": f"{pool['id']}.{pg:x}", "osds": osds, "up": up,
            "primary": up[0] if up else None}


def main(args):
    try:
        result, formatter = asyncio.run(run(args))
    except (ClusterNotFound, MonitorsUnavailable, ValueError) as exc:
        return fail(args, "unavailable" if isinstance(exc, MonitorsUnavailable) else "usage",
                     str(exc), 2)
    except messenger.RequestFailed as exc:
        return fail(args, exc.code, exc.message, 1)
    except (LookupError, PlacementError) as exc:
        return fail(args, "not_found", str(exc.args[0] if exc.args else exc), 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(formatter(result))
    return 0


def fail(args, code, message, status):
    if args.json:
        print(json.dumps({"error": code, "message": message}))
    print(f"cairn {args.command}: error: {message}", file=sys.stderr)
    return status


# -- human-readable output --------------------------------------------------------------------

def _format_health(report, detail):
    lines = [report["status"]]
    order = {"HEALTH_ERR": 0, "HEALTH_WARN": 1}
    for name, check in sorted(report["checks"].items(),
                              key=lambda item: (order.get(item[1]["severity"], 2), item[0])):
        lines.append(f"  {check['severity'][7:]:4} {name}: {check['summary']}")
        if detail:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(check["since"]))
            lines.append(f"       since {since}")
            lines.extend(f"       {line}" for line in check["detail"])
    return "\n".join(lines)


def _format_history(reply):
    if not reply["events"]:
        return "no health events recorded"
    lines = []
    for event in reply["events"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["time"]))
        lines.append(f"{when}  {event['state']:7} {event['severity'][7:]:4} {event['check']}: "
                     f"{event['summary']}")
        lines.extend(f"{'':30}{line}" for line in event["detail"])
    shown = len(reply["events"])
    if reply["kept"] > shown:
        lines.append(f"({shown} newest of {reply['kept']} kept; --limit N for more)")
    return "\n".join(lines)


def _format_status(status):
    lines = [f"cluster {status['fsid']}", f"  health: {status['health']}"]
    for name, message in status["checks"].items():
        lines.append(f"    {status['severities'].get(name, '')[7:]:4} {name}: {message}")
    mons = status["mons"]
    lines.append(f"  mons:   {len(mons['members'])} ({', '.join(mons['members'])}), quorum "
                 f"{', '.join(mons['quorum']) or 'none'}, leader {mons['leader'] or 'none'}"
                 f" (term {mons.get('term', '?')})")
    positions = mons.get("positions", {})
    if len(mons["members"]) > 1 and positions:
        lines.append("          log: " + ", ".join(
            f"{name} {positions[name]['log_index']}" for name in mons["members"]
            if name in positions))
    osds = status["osds"]
    lines.append(f"  osds:   {osds['total']} total, {osds['up']} up, {osds['in']} in")
    if status.get("s3"):
        lines.append(f"  s3:     {', '.join(status['s3'])}")
    if status.get("console"):
        lines.append(f"  console: {status['console']} (cairn console: a sign-in link)")
    lines.append(f"  pools:  {len(status['pools'])}" +
                 (f" ({', '.join(status['pools'])})" if status["pools"] else ""))
    for name, pgs in status.get("pgs", {}).items():
        lines.append(f"    {name}: {pgs['total']} PGs, {pgs['degraded']} degraded, "
                     f"{pgs['unavailable']} unavailable")
    if status.get("pg_states"):
        lines.append("  pgs:    " + ", ".join(f"{count} {state}" for state, count
                                              in status["pg_states"].items()))
    objects = status.get("objects")
    if objects and objects["total"]:
        def share(count):
            return f"{count} ({100 * count / objects['total']:.1f}%)"
        lines.append(f"  objects: {objects['total']} copies wanted, {share(objects['degraded'])} "
                     f"degraded, {share(objects['misplaced'])} misplaced")
    recovery = status.get("recovery")
    if recovery:
        limit = (f"{recovery['max_bytes_per_s'] / 1e6:.0f} MB/s" if recovery["max_bytes_per_s"]
                 else "unlimited")
        cluster = recovery.get("cluster_max_bytes_per_s") or 0
        against = (f" of {cluster / 1e6:.0f} MB/s for the cluster ("
                   f"{recovery.get('recovering_osds', 0)} OSDs recovering)" if cluster else "")
        lines.append(f"  recovery: {recovery['bytes_per_s'] / 1e6:.1f} MB/s now{against}; "
                     f"budget {limit} per OSD, {recovery['max_active']} PGs at once per OSD "
                     f"(window: {recovery['window']})")
    lines.append(f"  map epoch {status['epoch']}")
    return "\n".join(lines)


def _format_tree(reply):
    osds = reply["osds"]
    lines = [f"{'ID':>4}  {'RACK':10} {'HOST':12} {'WEIGHT':>7} {'REWEIGHT':>8}  STATUS"]
    for osd in sorted(osds, key=lambda o: (o["rack"] or "", o["host"] or "", o["id"])):
        lines.append(f"{osd['id']:>4}  {osd['rack'] or '-':10} {osd['host'] or '-':12} "
                     f"{osd['weight']:>7.3f} {osd['reweight']:>8.3f}  "
                     f"{'up' if osd['up'] else 'down'} {'in' if osd['in'] else 'out'}"
                     f"{' full' if osd.get('full') else ''}"
                     f"{' slow' if osd.get('slow') else ''}")
    lines.append(f"{len(osds)} OSDs, epoch {reply['epoch']}")
    return "\n".join(lines)


def _format_console(reply):
    return (f"console: {reply['url']}\n"
            f"sign in (this link works once, within 5 minutes): {reply['login_url']}")


def _format_perf(reply):
    lines = [f"{'ID':>4}  {'HOST':12} {'STATUS':9} {'READ ms':>8} {'WRITE ms':>8} "
             f"{'AROUND/s':>9} {'SERVED':>8} {'HEDGES sent/won/wasted':>22} {'STEERED':>8} "
             f"{'SHARD sent/won/wasted':>22}"]
    for osd in reply["osds"]:
        device, hedges = osd["device"], osd["hedges"]
        latency = [f"{device[kind]['mean_ms']:.2f}" if device.get(kind, {}).get("ops") else "-"
                   for kind in ("read", "write")]
        shards = "/".join(str(hedges.get(f"shard_{what}", 0)) for what in ("sent", "won",
                                                                           "wasted"))
        around = "/".join(str(hedges.get(f"hedged_{what}", 0)) for what in ("around", "won",
                                                                            "wasted"))
        status = ("up" if osd["up"] else "down") + (" slow" if osd["slow"] else "")
        lines.append(f"{osd['id']:>4}  {osd['host'] or '-':12} {status:9} {latency[0]:>8} "
                     f"{latency[1]:>8} {osd['reads_around_per_s']:>9.1f} "
                     f"{hedges.get('served', 0):>8} {around:>22} "
                     f"{hedges.get('steered_around', 0):>8} {shards:>22}")
    lines.append(f"{len(reply['osds'])} OSDs, epoch {reply['epoch']}; AROUND/s: reads sent "
                 "around the OSD lately; SERVED: clients' hedged reads it served as a replica; "
                 "HEDGES: clients' reads hedged around it as their primary (won: the replica "
                 "answered first; wasted: the rest); STEERED: reads sent around it; SHARD: its "
                 "shard hedges as an erasure-coded primary")
    return "\n".join(lines)


def _describe_pool(pool):
    if pool["kind"] == "replicated":
        kind = f"replicated size {pool['size']} min_size {pool['min_size']}"
    else:
        kind = f"erasure {pool['k']}+{pool['m']}"
        if pool.get("osds_per_domain", 1) > 1:
            kind += f" ({pool['osds_per_domain']} per {pool['failure_domain']})"
        kind += f" {pool.get('backend', 'isa_l_rs_cauchy')} min_size {pool['min_size']}"
        if pool.get("fast_read"):
            kind += " fast_read"
    quota = _quota_words(pool, "objects")
    return f"{pool['name']} (id {pool['id']}): {kind}, failure domain " \
           f"{pool['failure_domain']}, {pool['pg_num']} PGs" + \
           (f", quota {' / '.join(quota)}" if quota else "") + \
           (" (at its quota: writes refused)" if pool.get("quota_full") else "") + \
           "".join(f", allow-from {','.join(networks)}" + (f" for {prefix!r}" if prefix else "")
                   for prefix, networks in sorted(pool.get("allow_from", {}).items()))


def _format_pool_created(reply):
    return f"created pool {_describe_pool(reply['pool'])} (epoch {reply['epoch']})"


def _quota_words(pool, objects_word):
    words = []
    if pool.get("max_objects"):
        words.append(f"{pool['max_objects']} {objects_word}")
    if pool.get("max_bytes"):
        words.append(format_size(pool["max_bytes"]))
    return words


def _format_df(reply):
    raw = reply["raw"]
    lines = ["RAW", f"  {'SIZE':>10} {'USED':>10} {'AVAIL':>10} {'USED%':>6}",
             f"  {format_size(raw['total_bytes']):>10} {format_size(raw['used_bytes']):>10} "
             f"{format_size(raw['avail_bytes']):>10} {raw['used_ratio']:>6.1%}", "OSDS"]
    for osd in reply["osds"]:
        if osd["total_bytes"] is None:
            lines.append(f"  osd.{osd['id']:<4} {'(no report yet)':>32}")
            continue
        lines.append(f"  osd.{osd['id']:<4} {format_size(osd['total_bytes']):>10} "
                     f"{format_size(osd['used_bytes']):>10} {osd['used_ratio']:>6.1%}  "
                     f"{osd['state']}{'' if osd['up'] else ' (down)'}")
    lines += ["POOLS", f"  {'NAME':<16} {'ID':>4} {'OBJECTS':>9} {'STORED':>10} {'RAW':>10} "
              f"{'QUOTA':>16}"]
    for pool in reply["pools"]:
        text = "/".join(_quota_words(pool, "obj")) or "-"
        if pool["quota_ratio"] is not None:
            text += f" {pool['quota_ratio']:.0%}"
        lines.append(f"  {pool['name']:<16} {pool['id']:>4} {pool['objects']:>9} "
                     f"{format_size(pool['stored_bytes']):>10} "
                     f"{format_size(pool['raw_bytes']):>10} {text:>16}"
                     + ("  FULL: writes refused" if pool["quota_full"] else ""))
    return "\n".join(lines)


def _format_pools(reply):
    if not reply["pools"]:
        return "no pools"
    return "\n".join(_describe_pool(pool) for pool in reply["pools"])


def _format_map(result):
    members = ", ".join("-" if osd is None else f"osd.{osd}" for osd in result["osds"])
    primary = f"osd.{result['primary']}" if result["primary"] is not None else "none (no member up)"
    return (f"{result['pool']}/{result['object']} -> pg {result['pg_id']} -> [{members}], "
            f"primary {primary} (epoch {result['epoch']})")


def _format_config(reply):
    if "config" in reply:
        return "\n".join(f"{name} = {entry['value']}{'' if entry['set'] else ' (default)'}"
                         f"\n    {entry['help']}" for name, entry in reply["config"].items())
    return f"{reply['key']} = {reply['value']}{'' if reply['set'] else ' (default)'}"


def common_options(top_level):
    """A parent parser with --cluster and --json. At top level they default; below they only
    override what the user typed there (argparse.SUPPRESS), so both `cairn --json status` and
    `cairn status --json` work."""
    parent = argparse.ArgumentParser(add_help=False)
    default = None if top_level else argparse.SUPPRESS
    parent.add_argument("--cluster", default=default, help="cluster directory (made by "
                        "'cairn-cluster up'), its cluster.json, or HOST:PORT,... "
                        "(default: $CAIRN_CLUSTER)")
    parent.add_argument("--json", action="store_true",
                        default=False if top_level else argparse.SUPPRESS,
                        help="print one JSON object")
    parent.add_argument("--name", dest="entity_name", default=default, help="the entity to act as, client.NAME "
                        "(default: $CAIRN_NAME, else client.admin)")
    parent.add_argument("--keyring", default=default, help="its keyring file (default: "
                        "$CAIRN_KEYRING, else NAME.keyring in the --cluster directory)")
    return parent
