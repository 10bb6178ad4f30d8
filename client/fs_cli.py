"""`cairn fsck POOL [--metadata-pool META] [--repair] [--grace S] [--json]`: check a file
namespace (client/fs_check.py). Exit status 0 when clean (or everything found was repaired),
1 when problems remain."""

import json
import sys

from cairn.client import errors
from cairn.client.cluster import Cluster, run_loop
from cairn.client.fs import Filesystem
from cairn.client.fs_format import prefix_argument
from cairn.client.fs_check import GRACE_S_DEFAULT, check

COMMANDS = ("fsck",)


def add_parsers(commands, common):
    fsck = commands.add_parser(
        "fsck", parents=[common], help="check (and repair) a pool's file namespace",
        description="Walk the namespace from its root, finishing renames caught midway, and "
                    "report dangling entries, orphaned inodes and data, interrupted rmdirs and "
                    "wrong parent pointers; --repair mends them.")
    fsck.add_argument("pool", help="the data pool (as given to 'cairn mount')")
    fsck.add_argument("--metadata-pool", help="the pool holding the directories (default: "
                      "POOL)")
    fsck.add_argument("--prefix", default="", type=prefix_argument, metavar="PATH", help="the namespace under this "
                      "object-name prefix (as given to 'cairn mount --prefix')")
    fsck.add_argument("--repair", action="store_true", help="mend what is found")
    fsck.add_argument("--grace", type=float, default=GRACE_S_DEFAULT, metavar="S",
                      help="leave orphans younger than S seconds alone: a client may be "
                      f"creating them (default {GRACE_S_DEFAULT:g})")


def main(args):
    async def run():
        async with await Cluster.connect(args.cluster) as cluster:
            fs = await Filesystem.open(cluster, args.pool, metadata_pool=args.metadata_pool,
                                       prefix=args.prefix)

            def progress(report):
                if not args.json:
                    print(f"fsck: {report.directories} directories, {report.files} files so "
                          "far", file=sys.stderr)
            return await check(fs, repair=args.repair, grace_s=args.grace, progress=progress)
    try:
        report = run_loop(run())
    except (errors.ClientError, OSError) as exc:
        print(f"cairn fsck: {exc}", file=sys.stderr)
        return 1
    remaining = len(report.errors) - report.repaired
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(f"{report.directories} directories, {report.files} files ({report.bytes} bytes), "
              f"{report.symlinks} symlinks, {report.special} special files: "
              f"{len(report.errors)} problems, "
              f"{report.repaired} repaired")
        for error in report.errors:
            print(f"  {error['kind']}: {error['path'] or error['object']}")
    return 0 if remaining == 0 else 1
