"""`cairn-cluster bench-auth`: what authentication and TLS cost, measured in one run.

Brings up three local clusters of the same shape side by side (`--auth none`, the default
authentication, and authentication with `--tls`), then alternates `cairn bench cluster` writes
between them, round after round, so a drift of the machine (the disk's speed changes between
minutes too) hits every mode alike: 4 MiB writes and 4 KiB writes, 16 in flight, cycling over a
fixed set of object names so the devices do not fill. Prints one JSON line per run and a table
of medians with the ratios the security issue's targets are stated in (auth / none >= 0.95 for
4 MiB, >= 0.9 for 4 KiB). The clusters are brought down at the end, also on failure.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

MODES = {"none": ["--auth", "none"], "auth": [], "auth+tls": ["--tls"]}
LOADS = (("4M", 64), ("4K", 4096))      # object size, names cycled over


def _cli(module, *args):
    return [sys.executable, "-m", module, *args]


def add_parser(commands):
    bench = commands.add_parser(
        "bench-auth", help="what authentication and TLS cost: three clusters, writes "
        "alternated between them", description=__doc__.split("\n\n", 1)[1])
    bench.add_argument("--rounds", type=int, default=3, help="rounds over the three clusters "
                       "(default 3)")
    bench.add_argument("--seconds", type=float, default=10.0, help="each write run (default 10)")
    bench.add_argument("--hosts", type=int, default=3)
    bench.add_argument("--dir", help="where the clusters go (default: a new directory under "
                       "/var/tmp, removed afterwards)")
    bench.add_argument("--size", action="append", choices=[size for size, _ in LOADS],
                       help="only this object size (repeatable; default: 4M and 4K)")
    bench.add_argument("--json", action="store_true", help="print one JSON object at the end")


def main(args):
    base = args.dir or tempfile.mkdtemp(prefix="cairn-bench-auth-", dir="/var/tmp")
    made = []
    try:
        for mode, options in MODES.items():
            directory = os.path.join(base, mode.replace("+", "-"))
            made.append(directory)
            subprocess.run(_cli("cairn.cluster.cli", "up", "--dir", directory, "--hosts",
                                str(args.hosts), "--device-size", "4G", *options),
                           check=True, capture_output=True, text=True)
            subprocess.run(_cli("cairn.client.cli", "--cluster", directory, "pool", "create",
                                "bench", "--replicated", "3", "--pg-num", "32"),
                           check=True, capture_output=True, text=True)
            print(f"cluster {mode}: up in {directory}", file=sys.stderr, flush=True)
        loads = [(size, names) for size, names in LOADS if not args.size or size in args.size]
        results = {mode: {size: [] for size, _ in loads} for mode in MODES}
        for round_number in range(1, args.rounds + 1):
            for size, names in loads:
                order = list(MODES) if round_number % 2 else list(reversed(MODES))
                for mode in order:
                    directory = os.path.join(base, mode.replace("+", "-"))
                    out = subprocess.run(
                        _cli("cairn.client.cli", "--cluster", directory, "bench", "cluster",
                             "--pool", "bench", "--op", "write", "--size", size,
                             "--concurrency", "16", "--seconds", str(args.seconds),
                             "--objects", str(names), "--json"),
                        check=True, capture_output=True, text=True).stdout
                    line = json.loads(out.strip().splitlines()[-1])
                    results[mode][size].append(line)
                    print(json.dumps({"round": round_number, "mode": mode, **line}), flush=True)
        summary = _summary(results)
        if args.json:
            print(json.dumps(summary))
        else:
            print(_table(summary))
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"cairn-cluster bench-auth: {' '.join(exc.cmd[2:])} failed: "
              f"{(exc.stderr or exc.stdout or '').strip()}", file=sys.stderr)
        return 1
    finally:
        for directory in made:
            subprocess.run(_cli("cairn.cluster.cli", "down", "--dir", directory, "--purge"),
                           capture_output=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def _summary(results):
    summary = {}
    for size in results["none"]:
        field = "MBps" if size == "4M" else "iops"
        medians = {mode: statistics.median(line[field] for line in results[mode][size])
                   for mode in MODES}
        summary[size] = {"field": field, "median": medians,
                         "runs": {mode: [line[field] for line in results[mode][size]]
                                  for mode in MODES},
                         "auth_ratio": medians["auth"] / medians["none"],
                         "tls_ratio": medians["auth+tls"] / medians["none"]}
    return summary


def _table(summary):
    lines = ["size  measure   none        auth        auth+tls    auth/none  auth+tls/none"]
    for size, entry in summary.items():
        medians = entry["median"]
        lines.append(f"{size:<5} {entry['field']:<9} {medians['none']:<11.1f} "
                     f"{medians['auth']:<11.1f} {medians['auth+tls']:<11.1f} "
                     f"{entry['auth_ratio']:<10.3f} {entry['tls_ratio']:.3f}")
    lines.append("(medians over the rounds; targets: auth/none >= 0.95 at 4M, >= 0.9 at 4K)")
    return "\n".join(lines)
