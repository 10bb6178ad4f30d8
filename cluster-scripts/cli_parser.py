"""`cairn-cluster`'s command line: every subcommand, its options, their checks and their help
(cluster-scripts/cli.py runs what the parser names).
"""

import argparse
import signal

from cairn.cluster import bench_auth, isolated
from cairn.cluster.daemons import HOSTS_MAX, OSDS_PER_HOST_MAX
from cairn.common.units import parse_size

# `cairn-cluster kill --signal NAME`.
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP,
           "CONT": signal.SIGCONT}


def _size(text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bounded(low, high):
    def parse(text):
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within {low}..{high} (was {value})")
        return value
    return parse


def build_parser():
    parser = argparse.ArgumentParser(prog="cairn-cluster", description="Bring a multi-host "
                                     "cairn cluster up on this machine, inspect it, fault it, "
                                     "and bring it down; or on real machines from a hosts file "
                                     "over ssh (validate, up/status/down/restart/upgrade "
                                     "--hosts-file, add-host).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start = commands.add_parser("up", help="make and start a new cluster (here, or on the "
                                "machines of a hosts file over ssh)")
    start.add_argument("--dir", help="directory for the cluster (created; with --hosts-file "
                       "HOSTS.toml, default HOSTS.cluster beside it)")
    start.add_argument("--hosts-file", metavar="HOSTS", help="bring the cluster up on the "
                       "machines this TOML file names, over ssh (README: 'Bring-up on real "
                       "machines'); --hosts, --osds-per-host, --racks, --mons, --isolated do "
                       "not apply")
    start.add_argument("--force-wipe", action="store_true", help="with --hosts-file: devices "
                       "holding a filesystem or another cluster's store are overwritten")
    start.add_argument("--hosts", type=_bounded(1, HOSTS_MAX), default=3)
    start.add_argument("--osds-per-host", type=_bounded(1, OSDS_PER_HOST_MAX), default=1)
    start.add_argument("--racks", type=_bounded(0, HOSTS_MAX), default=0,
                       help="spread hosts over this many racks (0: no racks)")
    start.add_argument("--mons", type=int, choices=(1, 3), default=1)
    start.add_argument("--device-size", type=_size, default=parse_size("2G"),
                       help="size of each OSD's (sparse) device file (default 2G)")
    start.add_argument("--isolated", action="store_true", help="hosts in network namespaces, "
                       "loop devices (root)")
    start.add_argument("--mtu", type=_bounded(1280, isolated.MTU_MAX), default=isolated.MTU_DEFAULT,
                       help=f"isolated mode: the MTU of the hosts' links (default "
                       f"{isolated.MTU_DEFAULT}: jumbo frames, as storage networks use)")
    start.add_argument("--read-cache", type=_size, metavar="SIZE",
                       help="each OSD's read cache for small objects (cairn-osd run "
                       "--read-cache; default the OSD's, 64M; 0: none)")
    start.add_argument("--config", action="append", metavar="KEY=VALUE",
                       help="cluster config to set before the OSDs start (repeatable)")
    start.add_argument("--auth", choices=("hmac", "none"), default="hmac", help="hmac "
                       "(default): every daemon and client authenticates with a key (the "
                       "admin's: DIR/client.admin.keyring); none: no authentication, for "
                       "benchmarks only")
    start.add_argument("--tls", action="store_true", help="encrypt every connection with "
                       "TLS 1.3 (a self-signed cluster certificate in DIR/tls; clients find it "
                       "through --cluster DIR, or $CAIRN_TLS_CA)")
    start.add_argument("--s3", type=_bounded(0, 16), default=0, metavar="N",
                       help="also start N S3 gateways (cairn-s3) on this machine, with pools "
                       "s3.index and s3.data; their URLs go in cluster.json as \"s3\"")
    start.add_argument("--json", action="store_true", help="print one JSON object at the end")
    finish = commands.add_parser("down", help="stop every daemon the cluster started")
    finish.add_argument("--dir")
    finish.add_argument("--hosts-file", metavar="HOSTS")
    finish.add_argument("--purge", action="store_true", help="also delete the directory (and "
                        "on hosts: the data folders and file devices)")
    show = commands.add_parser("status", help="which daemons run, with pids and addresses")
    show.add_argument("--dir")
    show.add_argument("--hosts-file", metavar="HOSTS")
    show.add_argument("--json", action="store_true")
    signal_one = commands.add_parser("kill", help="signal one daemon (default SIGKILL)")
    signal_one.add_argument("--dir", required=True)
    signal_one.add_argument("name", help="osd.N or mon.N")
    signal_one.add_argument("--signal", choices=sorted(SIGNALS), default="KILL")
    again = commands.add_parser("restart", help="stop (if running) and start one daemon; "
                                "with --hosts-file, every host in turn (rolling)")
    again.add_argument("--dir")
    again.add_argument("--hosts-file", metavar="HOSTS")
    again.add_argument("name", nargs="?", help="osd.N or mon.N (a local cluster)")
    grow = commands.add_parser("add-host", help="bring a new host of the hosts file (or new "
                               "devices listed in a member's entry) in at weight 0 and raise "
                               "the weight in steps (resumable)")
    grow.add_argument("hosts_file", metavar="HOSTS")
    grow.add_argument("new_host", metavar="NEWHOST", help="its name in HOSTS (a new host, or a "
                      "member whose entry lists new devices)")
    grow.add_argument("--dir")
    grow.add_argument("--step", type=float, default=0.25, help="the most one step raises each "
                      "new OSD's weight (default 0.25)")
    grow.add_argument("--weight", type=float, default=1.0, help="the weight to reach "
                      "(default 1.0, as every OSD starts with)")
    grow.add_argument("--max-misplaced", type=float, default=0.05, help="the largest share of "
                      "PG copies one step may move (default 0.05)")
    grow.add_argument("--clean-timeout", type=float, default=600.0, help="seconds to wait for "
                      "the cluster to be clean before each step (default 600)")
    grow.add_argument("--force-wipe", action="store_true")
    newer = commands.add_parser("upgrade", help="--hosts-file: install this checkout's build "
                                "on every host in turn, restarting its daemons (rolling)")
    newer.add_argument("--dir")
    newer.add_argument("--hosts-file", metavar="HOSTS")
    show_off = commands.add_parser("demo", help="bring up a local cluster, show it working, "
                                   "fault it, store real data, bring it down")
    show_off.add_argument("--dir", help="cluster directory (default: a new one under "
                          "$CAIRN_SCRATCH_DIR or /var/tmp, removed afterwards)")
    show_off.add_argument("--hosts", type=_bounded(3, HOSTS_MAX), default=4)
    show_off.add_argument("--mons", type=int, choices=(1, 3), default=3)
    show_off.add_argument("--osds-per-host", type=_bounded(2, OSDS_PER_HOST_MAX), default=2)
    show_off.add_argument("--data", default="2G", help="bytes to store and read back "
                          "(default 2G)")
    show_off.add_argument("--keep", action="store_true", help="keep the directory")
    faults = commands.add_parser("fault", help="isolated mode: packet loss, partitions, slow "
                                 "disks, and their undo", description=(
                                     "loss HOST HOST --percent P | partition H1,H2 H3,H4 | "
                                     "throttle osd.N --bps 10M | clear | list. Hosts are h1.. "
                                     "and mon."))
    faults.add_argument("--dir", required=True)
    faults.add_argument("fault", choices=("loss", "partition", "throttle", "clear", "list"))
    faults.add_argument("a", nargs="?", help="loss: a host; partition: hosts of one side; "
                        "throttle: osd.N")
    faults.add_argument("b", nargs="?", help="loss: the other host; partition: the other side")
    faults.add_argument("--percent", type=float, default=10.0, help="loss: percent dropped "
                        "each way (default 10)")
    faults.add_argument("--bps", type=_size, default=parse_size("10M"),
                        help="throttle: bytes per second (default 10M)")
    faults.add_argument("--json", action="store_true")
    check = commands.add_parser(
        "validate", help="check a hosts file, and its machines over ssh, changing nothing",
        description="Check HOSTS (a TOML hosts file: README, 'Bring-up on real machines'): "
        "its keys, names, addresses, monitor count and devices; then, over ssh, that every host "
        "answers and every device exists (a file device: its folder) and holds no filesystem "
        "or cairn store. Exit status 1 when anything is wrong; every problem is listed.")
    check.add_argument("hosts_file", metavar="HOSTS")
    check.add_argument("--offline", action="store_true", help="check the file only, not the "
                       "machines")
    check.add_argument("--force-wipe", action="store_true", help="devices that hold a "
                       "filesystem or a cairn store may be overwritten by 'up' (reported, not "
                       "refused)")
    check.add_argument("--json", action="store_true")
    bench_auth.add_parser(commands)
    return parser
