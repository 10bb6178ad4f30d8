"""The namespace at scale through `cairn mount`: FILES files of SIZE bytes created over DIRS
directories with THREADS threads (the create rate of every CHUNK files, to see it stay flat),
then `ls -l` of the first directory, `find | wc -l` of the tree, the mount's RSS and a
`cairn fsck` of the namespace, each timed. One JSON line per chunk and one at the end
(docs/perf/files.md, "Scale").

    python cluster-scripts/scale_files.py CLUSTER_DIR MOUNTPOINT MOUNT_PID DATA_POOL META_POOL \\
        FILES SIZE DIRS THREADS [CHUNK]

Run as root on a mount of a local cluster; it drops the page cache before the listings.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import time


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def timed(argv, **kwargs):
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    return time.monotonic() - began, done


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3")


def main(cluster_dir, mountpoint, mount_pid, data_pool, meta_pool, files, size, dirs, threads,
         chunk):
    top = os.path.join(mountpoint, "scale")
    for d in range(dirs):
        os.makedirs(os.path.join(top, f"d{d:04d}"), exist_ok=True)
    payload = os.urandom(size)

    def create(i):
        fd = os.open(os.path.join(top, f"d{i % dirs:04d}", f"f{i:08d}"),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, payload)
        finally:
            os.close(fd)

    rates = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for first in range(0, files, chunk):
            began = time.monotonic()
            list(pool.map(create, range(first, min(files, first + chunk))))
            rate = (min(files, first + chunk) - first) / (time.monotonic() - began)
            rates.append(round(rate, 1))
            print(json.dumps({"created": min(files, first + chunk), "files_per_s": rates[-1],
                              "mount_rss_mib": rss_mib(mount_pid)}), flush=True)
    drop_caches()
    ls_s, ls = timed(["ls", "-l", os.path.join(top, "d0000")])
    drop_caches()
    find_s, found = timed(f"find {top} | wc -l", shell=True)
    env = dict(os.environ, CAIRN_CLUSTER=cluster_dir)
    fsck_s, fsck = timed(["cairn", "fsck", data_pool, "--metadata-pool", meta_pool, "--json"],
                         env=env)
    report = {}
    if fsck.returncode == 0 and fsck.stdout.strip():
        report = json.loads(fsck.stdout.strip().splitlines()[-1])
    print(json.dumps({
        "files": files, "size": size, "dirs": dirs, "threads": threads,
        "create_files_per_s_by_chunk": rates,
        "ls_l_first_dir_s": round(ls_s, 2), "ls_l_lines": ls.stdout.count("\n"),
        "find_s": round(find_s, 2), "find_entries": int(found.stdout.strip() or 0),
        "fsck_s": round(fsck_s, 2), "fsck_clean": report.get("clean"),
        "fsck_files": report.get("files"), "mount_rss_mib": rss_mib(mount_pid)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (10, 11):
        sys.exit(__doc__)
    main(*sys.argv[1:6], *map(int, sys.argv[6:]))
