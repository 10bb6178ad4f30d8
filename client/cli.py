"""`cairn`: the cluster command line.

For now it runs the local benchmarks (`cairn bench device|store`). Those drive an OSD's store
engine directly, and the client never imports the OSD (DESIGN.md, "Layout"), so they run in the
`cairn-osd` program: `cairn bench ...` hands its arguments to `python -m cairn.osd.cli bench ...`.
"""

import argparse
import os
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cairn", description="cairn cluster command line")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("bench", help="benchmarks: 'cairn bench device|store --help'",
                        add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        os.execv(sys.executable, [sys.executable, "-m", "cairn.osd.cli", "bench", *rest])
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
