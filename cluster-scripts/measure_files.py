"""Where a file op's time goes through `cairn mount`: for create, stat, read and unlink of
FILES files of SIZE bytes in one directory with THREADS threads, each phase's files per second,
the client ops the OSDs served per file (by op, from their /metrics) and the CPU per file of the
mount process and of each OSD (from /proc). One JSON line per phase (docs/perf/files.md).

    python cluster-scripts/measure_files.py CLUSTER_DIR MOUNTPOINT MOUNT_PID FILES SIZE THREADS

Run as root on a mount of a fresh local cluster (it drops the page cache before stat and read).
"""
import concurrent.futures
import json
import os
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def op_counts(osds):
    total = {}
    for osd in osds:
        text = urllib.request.urlopen(osd["metrics"], timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name != "cairn_osd_op_latency_seconds":
                continue
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    op = sample.labels["op"]
                    total[op] = total.get(op, 0) + sample.value
    return total


def main(cluster_dir, mountpoint, mount_pid, files, size, threads):
    osds = json.load(open(os.path.join(cluster_dir, "cluster.json")))["osds"]
    pids = [mount_pid] + [osd["pid"] for osd in osds]
    payload = os.urandom(size)
    directory = os.path.join(mountpoint, "measure-files")
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"f{index:07d}") for index in range(files)]

    def create(path):
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, payload)
        os.close(fd)

    def read(path):
        with open(path, "rb") as handle:
            if len(handle.read()) != size:
                raise AssertionError(f"{path}: wrong size")

    for phase, work in (("create", create), ("stat", os.stat), ("read", read),
                        ("unlink", os.unlink)):
        if phase in ("stat", "read"):
            os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
        ops_before, cpu_before = op_counts(osds), [cpu_s(pid) for pid in pids]
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, paths))
        wall = time.monotonic() - began
        ops_after, cpu_after = op_counts(osds), [cpu_s(pid) for pid in pids]
        per_file = {op: round((count - ops_before.get(op, 0)) / files, 2)
                    for op, count in ops_after.items() if count - ops_before.get(op, 0)}
        cpu_ms = [round((after - before) * 1000 / files, 3)
                  for before, after in zip(cpu_before, cpu_after)]
        print(json.dumps({"phase": phase, "ops_per_s": round(files / wall, 1),
                          "osd_ops_per_file": per_file,
                          "osd_ops_per_file_total": round(sum(per_file.values()), 2),
                          "cpu_ms_per_file": {"mount": cpu_ms[0], "osds": cpu_ms[1:],
                                              "osds_sum": round(sum(cpu_ms[1:]), 3)}}),
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:]))
