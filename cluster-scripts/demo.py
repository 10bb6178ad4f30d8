"""`cairn-cluster demo`: the README's main job, as far as the system goes today.

It runs the same commands a user would, printing each one and its output:
1. bring up a local cluster of real processes (3 monitors in a Raft quorum, 4 hosts x 2 OSDs,
   file devices);
2. `cairn status`, `cairn osd tree`; create a replicated pool and an erasure-coded pool on the
   host failure domain, and show where a few objects live;
3. write real data through the client library (`cairn put`: a file of --data bytes striped over
   4 MiB objects, each acknowledged once on all 3 replicas), printing the throughput, and the
   same file into the 4+2 erasure-coded pool (each object as 6 shards);
4. SIGKILL an OSD and time how long the monitor takes to mark it down and then out; read the
   erasure-coded copy back while it is down (degraded reads decode); restart it,
   watch it come back up and in while its PGs recover; SIGKILL the monitors' leader and time the
   next map change (the other two elect a new leader), restart it; read the data back
   (`cairn get`), comparing checksums;
5. bring the cluster down (the directory is removed unless --keep).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

from cairn.common.units import format_size, parse_size


def _run(argv, show=True):
    if show:
        print(f"$ {' '.join(argv)}", flush=True)
    result = subprocess.run(argv, capture_output=True, text=True)
    if show and result.stdout.strip():
        print("  " + result.stdout.strip().replace("\n", "\n  "), flush=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip()}")
    return result.stdout


def _bin(name):
    return os.path.join(os.path.dirname(sys.executable), name)


def demo(args):
    scratch = os.environ.get("CAIRN_SCRATCH_DIR") or "/var/tmp"
    directory = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(
        prefix="cairn-demo-", dir=scratch)
    if args.dir is None:
        os.rmdir(directory)
    cairn = [_bin("cairn"), "--cluster", directory]
    cluster = [_bin("cairn-cluster")]
    started = time.monotonic()
    print(f"cairn demo: a local cluster in {directory}\n", flush=True)
    _run(cluster + ["up", "--dir", directory, "--mons", str(args.mons), "--hosts",
                    str(args.hosts), "--osds-per-host", str(args.osds_per_host),
                    "--device-size", "4G",
                    "--config", "mon.osd_grace_s=3", "--config", "mon.osd_down_out_interval_s=5",
                    "--config", "osd.heartbeat_interval_s=0.5"])
    try:
        _run(cairn + ["status"])
        _run(cairn + ["osd", "tree"])
        _run(cairn + ["pool", "create", "checkpoints", "--replicated", "3", "--pg-num", "128"])
        _run(cairn + ["pool", "create", "datasets", "--erasure", "4+2", "--osds-per-domain", "2",
                      "--pg-num", "128"])
        for pool, name in (("checkpoints", "llama/step-1000/shard-00"),
                           ("datasets", "corpus/part-00017")):
            _run(cairn + ["map", pool, name])

        source = os.path.join(directory, "checkpoint.bin")
        size = parse_size(args.data)
        print(f"\ndata: a {format_size(size)} file of random bytes, stored through the client "
              f"library", flush=True)
        digest = _make_file(source, size)
        _run(cairn + ["put", "checkpoints", "llama/step-1000.ckpt", source])
        _run(cairn + ["stat", "checkpoints", "llama/step-1000.ckpt"])
        print("\nthe same file into the 4+2 erasure-coded pool (1.5x the bytes on disk, not 3x)",
              flush=True)
        _run(cairn + ["put", "datasets", "llama/step-1000.ckpt", source])

        victim = f"osd.{args.osds_per_host}"          # the first OSD of the second host
        osd_id = args.osds_per_host
        print(f"\nfault: SIGKILL {victim}; the monitor should mark it down within the grace "
              f"period (3 s here) and out 5 s later", flush=True)
        _run(cluster + ["kill", "--dir", directory, victim])
        killed = time.monotonic()
        down_s = _wait(cairn, osd_id, lambda osd: not osd["up"])
        out_s = _wait(cairn, osd_id, lambda osd: not osd["in"])
        print(f"  {victim} marked down after {down_s - killed:.1f} s, out after "
              f"{out_s - killed:.1f} s", flush=True)
        _run(cairn + ["status"])
        print(f"\nread the erasure-coded copy back with {victim} gone (its shards are rebuilt "
              "on the fly from the others)", flush=True)
        target = source + ".ec"
        _run(cairn + ["get", "datasets", "llama/step-1000.ckpt", target])
        _check(target, digest, size)
        _run(cluster + ["restart", "--dir", directory, victim])
        back_s = _wait(cairn, osd_id, lambda osd: osd["up"] and osd["in"])
        print(f"  {victim} up and in again {back_s - out_s:.1f} s after the restart began",
              flush=True)
        _run(cairn + ["status"])
        if args.mons > 1:
            _monitor_fault(cairn, cluster, directory)
        target = source + ".back"
        _run(cairn + ["get", "checkpoints", "llama/step-1000.ckpt", target])
        _check(target, digest, size)
        os.unlink(source)
    finally:
        _run(cluster + ["down", "--dir", directory] + ([] if args.keep else ["--purge"]))
    print(f"\ncairn demo finished in {time.monotonic() - started:.1f} s", flush=True)
    return 0


def _monitor_fault(cairn, cluster, directory):
    leader = json.loads(_run(cairn + ["--json", "status"], show=False))["mons"]["leader"]
    print(f"\nfault: SIGKILL the monitors' leader {leader}; the other two elect a new one and "
          f"map changes go on", flush=True)
    _run(cluster + ["kill", "--dir", directory, leader])
    killed = time.monotonic()
    _run(cairn + ["config", "set", "recovery.max_active", "4"])
    print(f"  map change committed {time.monotonic() - killed:.1f} s after the leader died",
          flush=True)
    _run(cairn + ["status"])
    _run(cluster + ["restart", "--dir", directory, leader])


def _check(path, digest, size):
    same = _digest(path) == digest
    os.unlink(path)
    print(f"  read back {format_size(size)}: sha256 {'matches' if same else 'DIFFERS'}",
          flush=True)
    if not same:
        raise RuntimeError("the data read back differs from what was written")


def _make_file(path, size):
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        remaining = size
        while remaining:
            chunk = os.urandom(min(remaining, 16 * 1024 * 1024))
            digest.update(chunk)
            handle.write(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def _digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _wait(cairn, osd_id, predicate, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = json.loads(_run(cairn + ["--json", "osd", "tree"], show=False))
        if predicate(next(o for o in tree["osds"] if o["id"] == osd_id)):
            return time.monotonic()
        time.sleep(0.2)
    raise RuntimeError(f"osd.{osd_id}: state not reached within {timeout_s} s")
