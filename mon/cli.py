"""`cairn-mon`: make and run a monitor.

    cairn-mon mkfs --dir DIR [--fsid UUID]
    cairn-mon run  --dir DIR --bind HOST:PORT [--name mon.0] [--ready-file PATH]

`run` serves until SIGTERM or SIGINT. With `--ready-file` it writes {name, addr, pid, fsid} there
once it is serving (port 0 in --bind picks a free port; the file says which).
Exit status: 0 success; 2 bad usage or an operating error (the message says what to do).
"""

import argparse
import logging
import os
import sys

from cairn.common import daemon
from cairn.common.messenger import parse_addr
from cairn.mon import store
from cairn.mon.monitor import Monitor

log = logging.getLogger("cairn.mon")


def _addr(text):
    try:
        parse_addr(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser():
    parser = argparse.ArgumentParser(prog="cairn-mon", description="Make and run a cairn "
                                     "monitor (it holds the cluster map).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    mkfs = commands.add_parser("mkfs", help="make a new monitor store (a new cluster)")
    mkfs.add_argument("--dir", required=True, help="the monitor's data directory")
    mkfs.add_argument("--fsid", help="cluster id (default: a new uuid)")
    run = commands.add_parser("run", help="serve the cluster map until SIGTERM")
    run.add_argument("--dir", required=True, help="the monitor's data directory")
    run.add_argument("--bind", required=True, type=_addr, help="HOST:PORT to listen on (port 0: "
                     "any free port)")
    run.add_argument("--name", default="mon.0")
    run.add_argument("--ready-file", help="write {name, addr, pid, fsid} as JSON here once "
                     "serving")
    run.add_argument("--verbose", action="store_true")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "mkfs":
        try:
            fsid = store.mkfs(args.dir, args.fsid)
        except store.MonStoreError as exc:
            print(f"cairn-mon: {exc}", file=sys.stderr)
            return 2
        print(f"made monitor store in {args.dir} (fsid {fsid})")
        return 0
    daemon.setup_logging(args.name, args.verbose)

    async def serve(stop):
        monitor = Monitor(args.dir, args.bind, args.name)
        try:
            await monitor.start()
        except (store.MonStoreError, OSError) as exc:
            log.error("cannot start: %s", exc)
            await monitor.stop()
            return 2
        try:
            if args.ready_file:
                daemon.write_ready_file(args.ready_file, {
                    "name": args.name, "addr": monitor.addr, "pid": os.getpid(),
                    "fsid": monitor.map.fsid})
            await stop.wait()
        finally:
            await monitor.stop()
        log.info("%s stopped cleanly at epoch %d", args.name, monitor.map.epoch)
        return 0

    return daemon.run(serve, args.name)


if __name__ == "__main__":
    sys.exit(main())
