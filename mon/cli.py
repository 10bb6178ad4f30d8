"""`cairn-mon`: make and run a monitor.

    cairn-mon mkfs --dir DIR --keyring FILE [--fsid UUID] [--name mon.0] [--members NAME=HOST:PORT,...]
    cairn-mon mkfs --dir DIR --keyring FILE --fsid UUID --join
    cairn-mon mkfs --dir DIR --auth none ...     (no authentication: benchmarks only)
    cairn-mon run  --dir DIR --bind HOST:PORT [--name mon.0] [--ready-file PATH]

A new cluster's monitors are each made with the same fsid and the same --members (one monitor:
just --name; its address is learned when it runs). A monitor that joins a running cluster is made
with --join and the cluster's fsid, started, and then added with `cairn mon add NAME HOST:PORT`;
it catches up from the leader.

`run` serves until SIGTERM or SIGINT, or until a committed change removes this monitor. With
`--ready-file` it writes {name, addr, pid, fsid} there once it is serving (port 0 in --bind picks a
free port; the file says which; a monitor of several needs the fixed address its peers know).
Exit status: 0 success; 2 bad usage or an operating error (the message says what to do).
"""

import argparse
import asyncio
import logging
import os
import sys

from cairn.common import auth, daemon, metrics
from cairn.common.messenger import parse_addr
from cairn.common.tls import TlsError
from cairn.mon import metrics as mon_metrics, store
from cairn.mon.console import Console
from cairn.mon.monitor import Monitor

log = logging.getLogger("cairn.mon")


def _addr(text):
    try:
        parse_addr(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _members(text):
    members = {}
    for part in text.split(","):
        name, sep, addr = part.strip().partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"members are NAME=HOST:PORT,... (was {text!r})")
        members[name] = _addr(addr)
    return members


def build_parser():
    parser = argparse.ArgumentParser(prog="cairn-mon", description="Make and run a cairn "
                                     "monitor (it holds the cluster map).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    mkfs = commands.add_parser("mkfs", help="make a new monitor store (a new cluster)")
    mkfs.add_argument("--dir", required=True, help="the monitor's data directory")
    mkfs.add_argument("--fsid", help="cluster id (default: a new uuid)")
    mkfs.add_argument("--name", default="mon.0", help="this monitor's name (default mon.0)")
    mkfs.add_argument("--members", type=_members, help="the founding monitors, "
                      "NAME=HOST:PORT,... (default: this one alone)")
    mkfs.add_argument("--join", action="store_true", help="a monitor that will be added to a "
                      "running cluster with 'cairn mon add' (needs --fsid)")
    mkfs.add_argument("--keyring", help="the cluster's bootstrap keyring: the mon. key and the "
                      "first entities with their caps (cairn-cluster up writes it); a joining "
                      "monitor is made with the same one")
    mkfs.add_argument("--auth", choices=("hmac", "none"), default="hmac", help="hmac (default): "
                      "every entity authenticates, every frame carries a MAC; none: no "
                      "authentication at all (benchmarks only)")
    run = commands.add_parser("run", help="serve the cluster map until SIGTERM")
    run.add_argument("--dir", required=True, help="the monitor's data directory")
    run.add_argument("--bind", required=True, type=_addr, help="HOST:PORT to listen on (port 0: "
                     "any free port)")
    run.add_argument("--name", default="mon.0")
    run.add_argument("--ready-file", help="write {name, addr, pid, fsid, metrics} as JSON here "
                     "once serving")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port "
                     "of the --bind address (0: any free port; default: none)")
    run.add_argument("--console-port", type=int, help="serve the operations console (a web "
                     "page: mon/console.py) on this port of the monitor's address (0: any "
                     "free port; default: none)")
    run.add_argument("--tls", metavar="DIR", help="serve TLS, and speak it to the other "
                     "monitors, with the cluster certificate in DIR (cluster.crt, cluster.key; "
                     "made by cairn-cluster up --tls)")
    run.add_argument("--verbose", action="store_true")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "mkfs":
        if args.join and not args.fsid:
            print("cairn-mon: --join needs the cluster's --fsid (cairn status shows it)",
                  file=sys.stderr)
            return 2
        if args.members is not None and args.name not in args.members:
            print(f"cairn-mon: --members must include this monitor ({args.name})",
                  file=sys.stderr)
            return 2
        members = {} if args.join else args.members or {args.name: None}
        entities = None
        if args.auth == "hmac":
            if not args.keyring:
                print("cairn-mon: mkfs needs --keyring (the bootstrap keyring, holding the mon. "
                      "key) or --auth none", file=sys.stderr)
                return 2
            try:
                entities = auth.read_keyring(args.keyring, with_caps=True)
            except auth.AuthError as exc:
                print(f"cairn-mon: {exc}", file=sys.stderr)
                return 2
        try:
            fsid = store.mkfs(args.dir, args.fsid, members, entities)
        except store.MonStoreError as exc:
            print(f"cairn-mon: {exc}", file=sys.stderr)
            return 2
        print(f"made monitor store in {args.dir} (fsid {fsid})")
        return 0
    daemon.setup_logging(args.name, args.verbose)

    async def serve(stop):
        try:
            monitor = Monitor(args.dir, args.bind, args.name, tls_dir=args.tls)
        except TlsError as exc:
            log.error("cannot start: %s", exc)
            return 2
        try:
            await monitor.start()
        except (store.MonStoreError, OSError) as exc:
            log.error("cannot start: %s", exc)
            await monitor.stop()
            return 2
        runner = url = None
        try:
            ip = monitor.addr.rpartition(":")[0]
            if args.metrics_port is not None:
                runner, url = await metrics.serve(ip, args.metrics_port,
                                                  lambda: mon_metrics.collect(monitor))
            if args.console_port is not None:
                monitor.console = Console(monitor)
                try:
                    await monitor.console.start(ip, args.console_port)
                except OSError as exc:
                    log.error("cannot serve the console on %s:%s: %s", ip, args.console_port,
                              exc)
                    return 2
            if args.ready_file:
                daemon.write_ready_file(args.ready_file, {
                    "name": args.name, "addr": monitor.addr, "pid": os.getpid(),
                    "fsid": monitor.map.fsid, "metrics": url,
                    "console": monitor.console.url if monitor.console else None})
            stopping = asyncio.ensure_future(stop.wait())
            removed = asyncio.ensure_future(monitor.removed.wait())
            await asyncio.wait([stopping, removed], return_when=asyncio.FIRST_COMPLETED)
            for waiter in (stopping, removed):
                waiter.cancel()
            if monitor.removed.is_set():
                log.warning("%s leaves: it is no longer a monitor of this cluster", args.name)
        finally:
            if runner is not None:
                await runner.cleanup()
            if monitor.console is not None:
                await monitor.console.stop()
            await monitor.stop()
        log.info("%s stopped cleanly at epoch %d", args.name, monitor.map.epoch)
        return 0

    return daemon.run(serve, args.name)


if __name__ == "__main__":
    sys.exit(main())
