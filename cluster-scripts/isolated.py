"""Isolated mode (root): every host a network namespace on one bridge, every device a loop device,
and the fault tools that need them: packet loss and partitions with nftables, slow disks with the
blkio cgroup. Each fault is recorded in cluster.json so `fault clear` and `down` undo it.

Names are derived from a short cluster tag (4 hex digits of the directory's hash, changed until
free), so several isolated clusters can run side by side:
    bridge      cb-TAG                 (10.231.N.1/24 in the root namespace: the CLI's way in)
    namespace   cairn-TAG-h1 ...       host hK has 10.231.N.(K+1); the monitors' hosts "mon",
                cairn-TAG-mon ...      "mon1", "mon2" have 10.231.N.250, .249, .248
    veth        cvTAGK (root side) <-> eth0 (namespace side)
    nft table   inet cairn_fault       (inside each namespace; only ours is ever touched)
    cgroup      blkio/cairn-TAG-osd.N  (one per throttled OSD)

Every command here is a real `ip`, `losetup`, `nft` call; failures raise IsolationError with the
command and its stderr.
"""

import hashlib
import os
import subprocess

SUBNET_PREFIX = "10.231"
MON_HOST_OCTET = 250
BLKIO_ROOT = "/sys/fs/cgroup/blkio"
NFT_TABLE = "cairn_fault"
# The hosts' links: jumbo frames by default, as storage networks use (and as loopback, where
# peers such as Ceph are benchmarked, has 64 KiB); veth takes up to 64 KiB.
MTU_DEFAULT = 9000
MTU_MAX = 65535


class IsolationError(Exception):
    """A namespace, bridge, loop device, nftables or cgroup step failed."""


def _run(*argv, check=True):
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise IsolationError(f"{' '.join(argv)} failed ({result.returncode}): "
                             f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def require_root():
    if os.geteuid() != 0:
        raise IsolationError("isolated mode needs root (network namespaces, loop devices, "
                             "cgroups); run as root or use local mode")
    for tool in ("ip", "losetup", "nft"):
        if _run("sh", "-c", f"command -v {tool}", check=False).returncode != 0:
            raise IsolationError(f"isolated mode needs '{tool}' (apt-get install -y iproute2 "
                                 f"mount nftables)")


def choose_network(directory):
    """(tag, subnet third octet) not used by another bridge on this machine."""
    used = set(os.listdir("/sys/class/net"))
    digest = hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()
    for attempt in range(64):
        tag = digest[attempt * 4 % 60:attempt * 4 % 60 + 4]
        octet = int(tag, 16) % 250 + 1
        if f"cb-{tag}" not in used and not any(
                _bridge_octet(name) == octet for name in used if name.startswith("cb-")):
            return tag, octet
    raise IsolationError("no free cairn bridge name or subnet; bring other clusters down")


def _bridge_octet(name):
    try:
        with open(f"/sys/class/net/{name}/address"):
            pass
        out = _run("ip", "-4", "-o", "addr", "show", "dev", name, check=False).stdout
        return int(out.split("inet ")[1].split(".")[2]) if "inet " in out else None
    except (OSError, IndexError, ValueError):
        return None


def namespace(tag, host):
    return f"cairn-{tag}-{host}"


def mon_ip(octet, index):
    """IP of monitor number `index` (0-based): .250, .249, ..."""
    return f"{SUBNET_PREFIX}.{octet}.{MON_HOST_OCTET - index}"


def host_ip(octet, index):
    """IP of host number `index` (1-based), or of the monitor host with index None."""
    last = MON_HOST_OCTET if index is None else index + 1
    return f"{SUBNET_PREFIX}.{octet}.{last}"


def create_network(tag, octet, hosts, mtu=MTU_DEFAULT):
    """Bridge plus one namespace per host name in `hosts` ({name: ip}), links at `mtu`."""
    bridge = f"cb-{tag}"
    _run("ip", "link", "add", bridge, "mtu", str(mtu), "type", "bridge")
    _run("ip", "addr", "add", f"{SUBNET_PREFIX}.{octet}.1/24", "dev", bridge)
    _run("ip", "link", "set", bridge, "up")
    for position, (host, ip) in enumerate(hosts.items()):
        ns = namespace(tag, host)
        veth = f"cv{tag}{position}"
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "link", "add", veth, "mtu", str(mtu), "type", "veth", "peer", "name", "eth0",
             "mtu", str(mtu), "netns", ns)
        _run("ip", "link", "set", veth, "master", bridge)
        _run("ip", "link", "set", veth, "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "route", "add", "default", "via", f"{SUBNET_PREFIX}.{octet}.1")
    return bridge


def destroy_network(tag, hosts):
    """Remove namespaces and bridge (missing ones are fine: undo is idempotent)."""
    for host in hosts:
        _run("ip", "netns", "del", namespace(tag, host), check=False)
    _run("ip", "link", "del", f"cb-{tag}", check=False)


def attach_loop(path):
    """A loop device (with direct I/O) over `path`."""
    return _run("losetup", "--find", "--show", "--direct-io=on", path).stdout.strip()


def detach_loop(device):
    _run("losetup", "-d", device, check=False)


def exec_prefix(tag, host):
    """argv prefix that runs a command inside `host`'s namespace."""
    return ["ip", "netns", "exec", namespace(tag, host)]


# -- faults -----------------------------------------------------------------------------------------

def _nft(tag, host, script):
    result = subprocess.run(["ip", "netns", "exec", namespace(tag, host), "nft", "-f", "-"],
                            input=script, capture_output=True, text=True)
    if result.returncode != 0:
        raise IsolationError(f"nft in {host}: {result.stderr.strip()}")


def _ensure_table(tag, host):
    _nft(tag, host, f"table inet {NFT_TABLE} {{\n"
                    f"  chain input {{ type filter hook input priority 0; policy accept; }}\n"
                    f"}}\n")


def drop_between(tag, host, peer_ip, percent):
    """In `host`, drop `percent`% of the packets arriving from `peer_ip` (100: a partition).

    Only on input: a drop in the output hook returns EPERM to the sender, which a real lossy
    network never does. Callers add the rule on both hosts to make loss symmetric."""
    _ensure_table(tag, host)
    if percent >= 100:
        match = "drop"
    else:
        match = f"numgen random mod 100 < {int(percent)} drop"
    _nft(tag, host, f"add rule inet {NFT_TABLE} input ip saddr {peer_ip} {match}\n")


def clear_drops(tag, host):
    _run("ip", "netns", "exec", namespace(tag, host), "nft", "delete", "table", "inet",
         NFT_TABLE, check=False)


def _device_numbers(device):
    st = os.stat(device)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def throttle(tag, name, pid, device, bytes_per_s):
    """Put `pid` in its own blkio cgroup limiting reads and writes on `device` to bytes_per_s.
    Returns the cgroup path."""
    if not os.path.isdir(BLKIO_ROOT):
        raise IsolationError(f"no blkio cgroup at {BLKIO_ROOT} (cgroup v1 blkio controller "
                             "needed for device throttling)")
    path = os.path.join(BLKIO_ROOT, f"cairn-{tag}-{name}")
    os.makedirs(path, exist_ok=True)
    numbers = _device_numbers(device)
    for kind in ("read", "write"):
        with open(os.path.join(path, f"blkio.throttle.{kind}_bps_device"), "w") as handle:
            handle.write(f"{numbers} {int(bytes_per_s)}")
    with open(os.path.join(path, "cgroup.procs"), "w") as handle:
        handle.write(str(pid))
    return path


def unthrottle(path, device):
    """Move the cgroup's processes back to the root and remove it."""
    if not os.path.isdir(path):
        return
    try:
        numbers = _device_numbers(device)
        for kind in ("read", "write"):
            with open(os.path.join(path, f"blkio.throttle.{kind}_bps_device"), "w") as handle:
                handle.write(f"{numbers} 0")
    except OSError:
        pass
    with open(os.path.join(path, "cgroup.procs")) as handle:
        pids = handle.read().split()
    for pid in pids:
        try:
            with open(os.path.join(BLKIO_ROOT, "cgroup.procs"), "w") as handle:
                handle.write(pid)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass
