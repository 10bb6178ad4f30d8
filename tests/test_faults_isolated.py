"""Isolated clusters (root): hosts in network namespaces on a bridge, loop devices, and the fault
tools: packet loss and partitions (nftables), slow disks (blkio cgroup), each undone after.

Method: measure each fault from the outside with real traffic (UDP probes between namespaces,
O_DIRECT reads through io_uring inside the throttled cgroup), and check what the monitor does
about a partitioned host."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import isolated_marks, isolated_up

pytestmark = isolated_marks()

FAST = ("mon.osd_grace_s=3", "mon.osd_down_out_interval_s=600", "osd.heartbeat_interval_s=0.5")

PROBE = """
import socket, sys, time
role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if role == "recv":
    s.bind((host, port)); s.settimeout(1.5); n = 0
    try:
        while True:
            s.recv(16); n += 1
    except socket.timeout:
        print(n)
else:
    for i in range(1000):
        s.sendto(b"x", (host, port)); time.sleep(0.0003)
"""


@pytest.fixture
def isolated_cluster(disk_dir):
    with isolated_up(os.path.join(str(disk_dir), "isolated"),
                     *[arg for pair in FAST for arg in ("--config", pair)]) as directory:
        yield directory


def script(directory, *args):
    result = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", args[0], "--dir",
                             directory, *args[1:]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def cairn(directory, *args):
    result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                             "--json", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def description(directory):
    with open(os.path.join(directory, "cluster.json")) as handle:
        return json.load(handle)


def udp_received(directory, source, target):
    """Datagrams of 1000 sent from host `source` that host `target` receives."""
    isolation = description(directory)["isolation"]
    tag, ip = isolation["tag"], isolation["hosts"][target]
    receiver = subprocess.Popen(["ip", "netns", "exec", f"cairn-{tag}-{target}", sys.executable,
                                 "-c", PROBE, "recv", ip, "9999"], stdout=subprocess.PIPE,
                                text=True)
    try:
        time.sleep(0.3)
        subprocess.run(["ip", "netns", "exec", f"cairn-{tag}-{source}", sys.executable, "-c",
                        PROBE, "send", ip, "9999"], check=True, timeout=30)
        return int(receiver.communicate(timeout=30)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def wait_for(what, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)


def osd_up(directory, osd_id):
    return next(o for o in cairn(directory, "osd", "tree")["osds"] if o["id"] == osd_id)["up"]


def test_isolated_cluster_packet_loss_and_partition(isolated_cluster):
    directory = isolated_cluster
    cluster = description(directory)
    assert cluster["mode"] == "isolated"
    assert all(osd["device"].startswith("/dev/loop") for osd in cluster["osds"])
    assert cairn(directory, "status")["osds"] == {"total": 3, "up": 3, "in": 3}
    isolation = cluster["isolation"]
    assert isolation["mtu"] == 9000                             # jumbo frames by default
    link = subprocess.run(["ip", "-n", f"cairn-{isolation['tag']}-h1", "link", "show", "eth0"],
                          capture_output=True, text=True, check=True).stdout
    assert " mtu 9000 " in link, link

    assert udp_received(directory, "h1", "h2") >= 990
    script(directory, "fault", "loss", "h1", "h2", "--percent", "30")
    received = udp_received(directory, "h1", "h2")
    assert 550 <= received <= 850, received                     # 30% dropped, give or take
    assert udp_received(directory, "h1", "h3") >= 990           # other pairs untouched
    script(directory, "fault", "clear")
    assert udp_received(directory, "h1", "h2") >= 990

    # Cut h1 off from everyone, the monitor included: osd.0 goes down within the grace.
    script(directory, "fault", "partition", "h1", "h2,h3,mon")
    assert udp_received(directory, "h2", "h1") == 0
    wait_for("partitioned osd.0 down", lambda: not osd_up(directory, 0), 3 + 5)
    assert osd_up(directory, 1) and osd_up(directory, 2)
    script(directory, "fault", "clear")
    wait_for("osd.0 back up after the partition heals", lambda: osd_up(directory, 0), 10)


def test_throttled_osd_device(isolated_cluster):
    directory = isolated_cluster
    out = script(directory, "fault", "throttle", "osd.1", "--bps", "8M")
    assert "throttled osd.1" in out
    fault = description(directory)["faults"][0]
    with open(os.path.join(fault["cgroup"], "cgroup.procs")) as handle:
        assert str(description(directory)["osds"][1]["pid"]) in handle.read().split()

    def read_rate(in_cgroup):
        bench = (f"{sys.executable} -m cairn.osd.cli bench device --device {fault['device']} "
                 f"--op read --size 1M --concurrency 4 --seconds 2 --no-fio --rounds 1 "
                 f"--region 64M --json")
        command = f"echo $$ > {fault['cgroup']}/cgroup.procs; exec {bench}" if in_cgroup \
            else bench
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                timeout=60, check=True)
        return json.loads(result.stdout.strip().splitlines()[-1])["MBps"]

    throttled = read_rate(True)
    assert throttled <= 8.4 * 1.15, throttled                   # 8 MiB/s = 8.39 MB/s
    assert read_rate(False) > 4 * throttled
    script(directory, "fault", "clear")
    assert not os.path.exists(fault["cgroup"])
    assert description(directory)["faults"] == []


def cairn_from(directory, host, *args, stdin=None):
    """(exit status, stdout, stderr) of `cairn --json ARGS` run inside `host`'s namespace (its
    own address), or in the root namespace (the bridge's address) when host is None."""
    isolation = description(directory)["isolation"]
    prefix = [] if host is None else ["ip", "netns", "exec", f"cairn-{isolation['tag']}-{host}"]
    result = subprocess.run(prefix + [sys.executable, "-m", "cairn.client.cli", "--cluster",
                                      directory, "--json", *args], input=stdin,
                            capture_output=True, timeout=60)
    return result.returncode, result.stdout, result.stderr.decode()


def test_pool_allowlists_refuse_other_addresses(isolated_cluster, tmp_path):
    directory = isolated_cluster
    isolation = description(directory)["isolation"]
    root_ip, h1_ip = f"10.231.{isolation['octet']}.1", isolation["hosts"]["h1"]
    cairn(directory, "pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    source = tmp_path / "payload"
    source.write_bytes(os.urandom(100_000))
    for name in ("team-a/w", "other"):
        assert cairn_from(directory, None, "put", "data", name, str(source))[0] == 0

    # The whole pool for h1's address only: the root namespace's client is refused (and the
    # refusal names the address it came from), h1's reads and writes.
    cairn(directory, "pool", "set", "data", "allow-from", f"{h1_ip}/32")
    status, _, err = cairn_from(directory, None, "get", "data", "other", "-")
    assert status != 0 and "permission denied" in err and f"not {root_ip}" in err, err
    copy = tmp_path / "copy"
    status, _, err = cairn_from(directory, "h1", "get", "data", "other", str(copy))
    assert status == 0 and copy.read_bytes() == source.read_bytes(), err
    assert cairn_from(directory, "h1", "put", "data", "team-a/h1", str(source))[0] == 0

    # Then only team-a/ is fenced, to the root namespace's address: h1 may use the rest and
    # sees only the rest when it lists.
    cairn(directory, "pool", "set", "data", "allow-from", "any")
    cairn(directory, "pool", "set", "data", "allow-from", root_ip, "--prefix", "team-a/")
    status, _, err = cairn_from(directory, "h1", "put", "data", "team-a/x", str(source))
    assert status != 0 and "permission denied" in err and "for prefix 'team-a/'" in err, err
    assert "may not put data/team-a/x (" in err, err    # the object, not its stripe
    assert cairn_from(directory, "h1", "get", "data", "other", "-")[0] == 0
    status, out, _ = cairn_from(directory, "h1", "ls", "data")
    assert status == 0 and json.loads(out)["names"] == ["other"], out
    status, _, err = cairn_from(directory, None, "get", "data", "team-a/h1", str(copy))
    assert status == 0 and copy.read_bytes() == source.read_bytes(), err
    pools = cairn(directory, "pool", "ls")["pools"]
    assert pools[0]["allow_from"] == {"team-a/": [f"{root_ip}/32"]}

    # Every refusal is in the audit log with the address it came from.
    refused = [event for event in cairn(directory, "audit")["events"]
               if event["result"] == "permission_denied"]
    assert any(e["addr"].startswith(root_ip + ":") and e["target"] == "data/other"
               for e in refused), refused
    # (the CLI writes through staged stripe objects, data/team-a/x.~s.ID.N)
    assert any(e["addr"].startswith(h1_ip + ":") and e["target"].startswith("data/team-a/x")
               and e["op"] == "put" for e in refused), refused
