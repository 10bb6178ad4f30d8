"""`cairn`: the cluster command line.

- `cairn placement test --map FILE --pool NAME [--compare FILE]`: offline placement report.
- `cairn bench device|store ...`: the local benchmarks. Those drive an OSD's store engine
  directly, and the client never imports the OSD (DESIGN.md, "Layout"), so they run in the
  `cairn-osd` program: `cairn bench ...` hands its arguments to `python -m cairn.osd.cli bench`.
"""

import argparse
import os
import sys

from cairn.client import placement_tool


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cairn", description="cairn cluster command line")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("bench", help="benchmarks: 'cairn bench device|store --help'",
                        add_help=False)
    placement_tool.add_parser(commands)
    if argv[:1] == ["bench"]:
        os.execv(sys.executable, [sys.executable, "-m", "cairn.osd.cli", "bench", *argv[1:]])
    args = parser.parse_args(argv)
    if args.command == "placement":
        return placement_tool.main(args)
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
