"""`cairn`: the cluster command line.

- `cairn status`, `cairn console`, `cairn osd tree|out|in|down`, `cairn pool create|ls|rm`,
  `cairn map POOL OBJECT`, `cairn config set|get|rm`: cluster administration through the
  monitors (client/admin.py).
- `cairn put|get|ls|rm|stat POOL [NAME] [FILE]`: objects through the client library
  (client/objects_cli.py); `cairn bench cluster ...`: throughput like `rados bench`;
  `cairn bench mount ...`, `cairn bench checkpoint ...`: the mount, and checkpoint staging from
  GPU memory, against the object path; `cairn bench files ...`: small files through a mount
  or the library (client/bench_files.py).
- `cairn mount POOL[/PATH] MOUNTPOINT`, `cairn umount MOUNTPOINT`: the file namespace with
  FUSE (client/mount.py); `cairn fsck POOL`: check and repair it (client/fs_check.py).
- `cairn auth add|ls|get|get-key|caps|rm`: entities, keys and caps (client/admin.py);
  `cairn audit`: the audit log (client/audit_cli.py).
- `cairn placement test --map FILE --pool NAME [--compare FILE]`: offline placement report.
- `cairn bench device|store ...`: the local benchmarks. Those drive an OSD's store engine
  directly, and the client never imports the OSD (DESIGN.md, "Layout"), so they run in the
  `cairn-osd` program: `cairn bench ...` hands its arguments to `python -m cairn.osd.cli bench`.
"""

import argparse
import os
import sys

from cairn.client import (admin, audit_cli, bench_checkpoint, bench_cluster, bench_dataloader,
                          bench_files, bench_mount, fs_cli, mount, objects_cli, placement_tool)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="cairn", parents=[admin.common_options(top_level=True)],
        description="cairn cluster command line. Commands that talk to a cluster find it from "
                    "--cluster DIR or $CAIRN_CLUSTER and print one JSON object with --json.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    admin.add_parsers(commands, admin.common_options(top_level=False))
    objects_cli.add_parsers(commands, admin.common_options(top_level=False))
    mount.add_parsers(commands, admin.common_options(top_level=False))
    fs_cli.add_parsers(commands, admin.common_options(top_level=False))
    audit_cli.add_parsers(commands, admin.common_options(top_level=False))
    bench = commands.add_parser("bench", help="benchmarks: 'cairn bench "
                                "cluster|mount|files|dataloader|checkpoint|device|store --help'")
    kinds = bench.add_subparsers(dest="kind", required=True, metavar="KIND")
    bench_cluster.add_parser(kinds)
    bench_mount.add_parser(kinds)
    bench_files.add_parser(kinds)
    bench_dataloader.add_parser(kinds)
    bench_checkpoint.add_parser(kinds)
    for kind in ("device", "store"):
        kinds.add_parser(kind, help=f"the {kind} benchmark of cairn-osd (see 'cairn-osd bench "
                         f"{kind} --help')", add_help=False)
    placement_tool.add_parser(commands)
    return parser


def main(argv=None):
    try:
        return _main(argv)
    except BrokenPipeError:
        # `cairn ... | head`: the reader went away; say nothing more (as cat does).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and argv[1:2] not in (["cluster"], ["mount"], ["checkpoint"],
                                                    ["files"], ["dataloader"], ["-h"],
                                                    ["--help"]):
        os.execv(sys.executable, [sys.executable, "-m", "cairn.osd.cli", "bench", *argv[1:]])
    parser = build_parser()
    args = parser.parse_args(argv)
    # --name and --keyring reach every command (and what it starts: a mount's server) the way
    # $CAIRN_NAME and $CAIRN_KEYRING do (common/sessions.find_credentials).
    for option, variable in (("entity_name", "CAIRN_NAME"), ("keyring", "CAIRN_KEYRING")):
        if getattr(args, option, None):
            os.environ[variable] = os.path.abspath(getattr(args, option)) \
                if option == "keyring" else getattr(args, option)
    if args.command == "placement":
        return placement_tool.main(args)
    if args.command in admin.COMMANDS:
        return admin.main(args)
    if args.command in objects_cli.COMMANDS:
        return objects_cli.main(args)
    if args.command in mount.COMMANDS:
        return mount.main(args)
    if args.command in fs_cli.COMMANDS:
        return fs_cli.main(args)
    if args.command in audit_cli.COMMANDS:
        return audit_cli.main(args)
    if args.command == "bench" and args.kind == "checkpoint":
        return bench_checkpoint.main(args)
    if args.command == "bench" and args.kind == "mount":
        return bench_mount.main(args)
    if args.command == "bench" and args.kind == "files":
        return bench_files.main(args)
    if args.command == "bench" and args.kind == "dataloader":
        return bench_dataloader.main(args)
    if args.command == "bench":
        return bench_cluster.main(args)
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
