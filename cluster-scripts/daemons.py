"""A local cluster's daemons, for `cairn-cluster` (cluster-scripts/cli.py): the description
file (DIR/cluster.json), launching daemons in their own sessions, waiting for them to be ready
and for the monitors to elect a leader, stopping them by pid, ports, and the fault state an
isolated cluster leaves behind.

Every signal goes to a pid recorded in cluster.json only after `is_ours` checked that the
process's command line names the cluster's directory, so a recycled pid is never signalled.
"""

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

from cairn.cluster import isolated
from cairn.common import sessions, tls
from cairn.common.monclient import MonClient, MonitorsUnavailable

MONITOR_IP = "127.0.0.1"
# Local monitors listen on a port from here up to the kernel's ephemeral range (`free_port`).
MONITOR_PORT_LOW = 20000
MONITOR_PORT = 6789                   # isolated mode: each monitor has its own address
CONSOLE_PORT = 8080                   # ... and serves its console here
HOSTS_MAX = 200                       # 127.0.0.2 .. 127.0.0.201
OSDS_PER_HOST_MAX = 64
DAEMON_READY_S_MAX = 60.0             # one daemon's start-up, generous for a loaded machine
STOP_GRACE_S = 10.0                   # SIGTERM, then SIGKILL after this


class ClusterError(Exception):
    """A bring-up step failed; the message says what and where its log is."""


# -- cluster.json -------------------------------------------------------------------------------

def description_path(directory):
    return os.path.join(directory, "cluster.json")


def load(directory):
    path = description_path(directory)
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {directory} (no cluster.json); bring one up with "
                           f"'cairn-cluster up --dir {directory} ...'") from None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from None


def save(directory, description):
    path = description_path(directory)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(description, handle, indent=1)
        handle.write("\n")
    os.replace(temporary, path)


def daemons(description):
    return description["mons"] + description["osds"] + description.get("gateways", [])


def find(description, name):
    for entry in daemons(description):
        if entry["name"] == name:
            return entry
    names = ", ".join(entry["name"] for entry in daemons(description))
    raise ClusterError(f"no daemon {name!r} in this cluster (daemons: {names})")


# -- processes ------------------------------------------------------------------------------------

def is_ours(pid, directory):
    """True if `pid` is alive (not a zombie) and its command line names `directory`."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and os.path.abspath(directory) in cmdline


def launch(directory, entry):
    """Start the daemon described by `entry` (its argv); wait for its ready file; update entry."""
    ready = entry["ready_file"]
    if os.path.exists(ready):
        os.unlink(ready)
    log_path = entry["log"]
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(entry["argv"], stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=log_file, start_new_session=True, cwd=directory)
    entry["pid"] = process.pid
    return process


def wait_ready(processes, entries, timeout_s, progress=None):
    """Wait until every entry's ready file exists; fill in addr/pid. ClusterError otherwise."""
    deadline = time.monotonic() + timeout_s
    pending = {entry["name"]: (process, entry) for process, entry in zip(processes, entries)}
    while pending:
        for name, (process, entry) in list(pending.items()):
            if os.path.exists(entry["ready_file"]):
                with open(entry["ready_file"]) as handle:
                    info = json.load(handle)
                entry.update(addr=info["addr"], pid=info["pid"], metrics=info.get("metrics"))
                if info.get("console"):
                    entry["console"] = info["console"]
                del pending[name]
            elif process.poll() is not None:
                raise ClusterError(f"{name} exited with status {process.returncode} while "
                                   f"starting; its log: {entry['log']}\n{_tail(entry['log'])}")
        if progress is not None:
            progress(len(entries) - len(pending), len(entries))
        if pending and time.monotonic() > deadline:
            names = ", ".join(sorted(pending))
            raise ClusterError(f"not ready after {timeout_s:g} s: {names} (logs in "
                               f"{os.path.dirname(entries[0]['log'])})")
        if pending:
            time.sleep(0.05)


def _tail(path, lines=8):
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def stop(directory, entry, sig=signal.SIGTERM, wait_s=STOP_GRACE_S):
    """Signal the daemon by pid (only if it is ours); wait for it to go; SIGKILL after wait_s.
    True if it was running."""
    pid = entry.get("pid")
    if not is_ours(pid, directory):
        return False
    if sig == signal.SIGTERM:
        os.kill(pid, signal.SIGCONT)                    # a stopped process cannot exit
    os.kill(pid, sig)
    if sig in (signal.SIGSTOP, signal.SIGCONT):
        return True
    deadline = time.monotonic() + wait_s
    while is_ours(pid, directory):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + wait_s
        time.sleep(0.02)
    return True


def stop_all(directory, entries, wait_s=STOP_GRACE_S):
    """SIGTERM every running daemon of `entries` at once, wait, SIGKILL stragglers after
    wait_s. The names of those that were running."""
    running = [entry for entry in entries if is_ours(entry.get("pid"), directory)]
    for entry in running:
        os.kill(entry["pid"], signal.SIGCONT)            # a stopped process cannot exit
        os.kill(entry["pid"], signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while any(is_ours(entry["pid"], directory) for entry in running):
        if time.monotonic() > deadline:
            for entry in running:
                if is_ours(entry["pid"], directory):
                    os.kill(entry["pid"], signal.SIGKILL)
            deadline = time.monotonic() + wait_s
        time.sleep(0.02)
    return [entry["name"] for entry in running]


def undo_isolation(description):
    """Clear faults, detach loop devices, remove namespaces and bridge; a summary or ''."""
    isolation = description.get("isolation")
    if not isolation:
        return ""
    clear_faults(description)
    loops = [entry["device"] for entry in description["osds"]
             if entry["device"].startswith("/dev/loop")]
    for device in loops:
        isolated.detach_loop(device)
    isolated.destroy_network(isolation["tag"], isolation["hosts"])
    return (f"removed bridge {isolation['bridge']}, {len(isolation['hosts'])} namespaces, "
            f"{len(loops)} loop devices")


def clear_faults(description):
    isolation = description["isolation"]
    for host in isolation["hosts"]:
        isolated.clear_drops(isolation["tag"], host)
    for fault in description.get("faults", []):
        if fault["kind"] == "throttle":
            isolated.unthrottle(fault["cgroup"], fault["device"])
    cleared = len(description.get("faults", []))
    description["faults"] = []
    return cleared


# -- up -------------------------------------------------------------------------------------------

def free_port(taken=()):
    """A TCP port free on the monitor address now, below the kernel's ephemeral range.

    Not the kernel's pick for port 0: that is an ephemeral port, and between choosing it and the
    monitor binding it, an outgoing connection (the other monitors dialling their peers) can be
    given the same number as its local port, and the monitor fails with 'address in use' (seen
    in CI). Ports below the range are never handed to outgoing connections."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(MONITOR_PORT_LOW, max(MONITOR_PORT_LOW + 1, low))
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((MONITOR_IP, port))
            except OSError:
                continue
            return port
    raise ClusterError(f"no free TCP port for a monitor on {MONITOR_IP} between "
                       f"{MONITOR_PORT_LOW} and {low}")


def _ephemeral_low():
    """The low end of the kernel's ephemeral port range (32768 when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as lines:
            return int(lines.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def wait_quorum(addrs, timeout_s, directory=None):
    """Wait until the monitors at `addrs` have a leader; its name. ClusterError otherwise.
    (As client.admin when `directory` holds its keyring.)"""
    async def ask():
        monc = MonClient(addrs, deadline_s=timeout_s, name="cairn-cluster",
                         authenticate=sessions.client_handshake(directory, "client.admin")
                         if directory else None,
                         tls=tls.for_cluster(directory) if directory else None)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                reply = await monc.request({"op": "status"})
                leader = reply.header["mons"]["leader"]
                if leader is not None:
                    return leader
                if time.monotonic() > deadline:
                    raise ClusterError(f"the monitors elected no leader within {timeout_s:g} s")
                await asyncio.sleep(0.2)
        finally:
            await monc.close()
    try:
        return asyncio.run(ask())
    except MonitorsUnavailable as exc:
        raise ClusterError(f"monitors unreachable: {exc}") from None


def room_warning(folder, device_bytes):
    """A warning when the sparse device files to be made in `folder` could outgrow the free
    space of its filesystem (each OSD would then fail its writes with `no space`), else None."""
    free = shutil.disk_usage(folder).free
    if device_bytes <= free:
        return None
    return (f"warning: the OSDs' device files total {device_bytes / 2**30:.1f} GiB but their "
            f"filesystem ({folder}) has {free / 2**30:.1f} GiB free: they are sparse, but filled "
            "they will fill it and writes will fail with 'no space' (use a smaller "
            "--device-size or free some space)")


def layout(hosts, osds_per_host, racks):
    """[(host name, rack name or None, ip, [osd ids])] for the requested shape."""
    shape = []
    for index in range(hosts):
        rack = f"r{index % racks + 1}" if racks else None
        ids = list(range(index * osds_per_host, (index + 1) * osds_per_host))
        shape.append((f"h{index + 1}", rack, f"127.0.0.{index + 2}", ids))
    return shape


def python_argv(module, *args):
    return [sys.executable, "-m", module, *args]
