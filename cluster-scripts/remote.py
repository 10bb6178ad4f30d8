"""Hosts over ssh: run commands on the machines a hosts file names (cluster-scripts/hosts.py),
and `cairn-cluster validate`, which checks them without changing anything.

Plain OpenSSH client, key authentication only (BatchMode: never a password prompt), the user,
port, identity and sudo the hosts file gives. Each remote command is a POSIX shell line, so a
host needs nothing of ours installed to be checked.
"""

import concurrent.futures
import dataclasses
import shlex
import subprocess

SSH_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5
STORE_MAGIC = "CAIRNOSD"                 # osd/superblock.py: the first bytes of an OSD store

# One line per device: path|kind|size|magic|filesystem. kind: block, file, absent (a file
# device not made yet, its folder exists), missing (neither), other (not a block device or a
# regular file). Only the first 8 bytes and blkid's signature scan are read.
_PROBE = r"""
for d in "$@"; do
  kind=missing; size=0; magic=; fs=
  if [ -b "$d" ]; then kind=block; size=$(blockdev --getsize64 "$d" 2>/dev/null || echo 0)
  elif [ -f "$d" ]; then kind=file; size=$(stat -c %s "$d")
  elif [ -e "$d" ]; then kind=other
  elif [ -d "$(dirname "$d")" ]; then kind=absent
  fi
  if [ "$kind" = block ] || [ "$kind" = file ]; then
    magic=$(head -c 8 "$d" 2>/dev/null | tr -dc 'A-Z')
    fs=$(blkid -p -o value -s TYPE "$d" 2>/dev/null || true)
  fi
  echo "$d|$kind|$size|$magic|$fs"
done
"""


# Whether systemd runs the host (sd_booted(3)'s test) and systemctl is there.
_SYSTEMD_PROBE = ("if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; "
                  "then echo systemd; else echo none; fi")


class RemoteError(Exception):
    """An ssh command failed; the message names the host and the step, `reason` is what
    failed (the command's last line of output, or ssh's)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = reason or message


def ssh_argv(host, options=(), command=""):
    """The ssh command line that runs `command` (a shell line) on `host`."""
    argv = ["ssh", "-p", str(host.port), "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    if host.identity:
        argv += ["-i", host.identity]
    argv += list(options) + [f"{host.user}@{host.address}", "--"]
    if host.sudo:
        command = f"sudo -n sh -c {shlex.quote(command)}"
    return argv + [command]


def run(host, command, options=(), step="command", timeout_s=SSH_TIMEOUT_S, stdin=None):
    """Run `command` on `host` (`stdin`: a binary file to feed it); its stdout. RemoteError
    naming host and step on failure."""
    try:
        result = subprocess.run(ssh_argv(host, options, command), capture_output=True,
                                timeout=timeout_s,
                                stdin=subprocess.DEVNULL if stdin is None else stdin)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"host {host.name} ({host.address}): {step}: no answer in "
                          f"{timeout_s:g} s") from None
    except FileNotFoundError:
        raise RemoteError("the ssh client is not installed (apt-get install -y "
                          "openssh-client)") from None
    stdout = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        stderr = result.stderr.decode(errors="replace")
        reason = (stderr.strip() or stdout.strip()).splitlines()
        reason = reason[-1] if reason else f"exit status {result.returncode}"
        if result.returncode == 255:
            reason = f"ssh to {host.user}@{host.address}:{host.port} failed: {reason}"
        raise RemoteError(f"host {host.name} ({host.address}): {step}: {reason}", reason)
    return stdout


@dataclasses.dataclass
class DeviceCheck:
    path: str
    kind: str
    size_bytes: int
    holds: str = None                   # "cairn OSD store", "ext4 filesystem", ... or None
    problem: str = None


@dataclasses.dataclass
class HostCheck:
    name: str
    address: str
    reachable: bool = False
    service_manager: str = None         # how its daemons will run: "systemd" or "supervise"
    devices: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)

    def to_json(self):
        return {"name": self.name, "address": self.address, "reachable": self.reachable,
                "service_manager": self.service_manager,
                "devices": [dataclasses.asdict(d) for d in self.devices],
                "problems": self.problems}


def service_manager(host, has_systemd):
    """(how daemons will run on `host`, or None; the problem, or None), from the hosts file's
    service_manager and whether systemd runs there. Units go to /etc/systemd/system, so
    systemd needs user root or sudo."""
    may_write_units = host.user == "root" or host.sudo
    if host.service_manager == "supervise":
        return "supervise", None
    if host.service_manager == "systemd":
        if not has_systemd:
            return None, (f"host {host.name}: service_manager = systemd, but systemd does not "
                          "run there (no /run/systemd/system)")
        if not may_write_units:
            return None, (f"host {host.name}: service_manager = systemd needs user root or "
                          "sudo = true (units are written to /etc/systemd/system)")
        return "systemd", None
    return ("systemd" if has_systemd and may_write_units else "supervise"), None


def check_host(host, options=(), force_wipe=False, ours=()):
    """What `validate` finds on one host: reachable over ssh, and each device present (or, for
    a file device, its folder) and empty, or wiping it allowed. `ours`: (host, device) pairs
    of a cluster being brought up again, whose devices hold its own stores."""
    check = HostCheck(host.name, host.address)
    try:
        found_systemd = run(host, _SYSTEMD_PROBE, options, step="ssh").strip() == "systemd"
        check.reachable = True
        check.service_manager, problem = service_manager(host, found_systemd)
        if problem:
            check.problems.append(problem)
        paths = [device.path for device in host.devices]
        output = run(host, f"sh -c {shlex.quote(_PROBE)} probe "
                     + " ".join(shlex.quote(p) for p in paths), options,
                     step="device probe") if paths else ""
    except RemoteError as exc:
        check.problems.append(str(exc))
        return check
    found = {}
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            found[parts[0]] = parts
    for device in host.devices:
        path, kind, size, magic, fs = found.get(device.path, (device.path, "?", "0", "", ""))
        result = DeviceCheck(path, kind, int(size) if size.isdigit() else 0)
        if magic == STORE_MAGIC:
            result.holds = "a cairn OSD store"
        elif fs:
            result.holds = f"a {fs} signature"
        if kind == "?":
            result.problem = "the probe did not report it"
        elif device.is_file and kind not in ("file", "absent"):
            result.problem = (f"is a file device in the hosts file but {kind} on the host"
                              if kind != "missing" else "its folder does not exist")
        elif not device.is_file and kind != "block":
            result.problem = {"missing": "does not exist", "absent": "does not exist",
                              "file": "is a regular file: give it a size to use it as a file "
                                      "device"}.get(kind, f"is not a block device ({kind})")
        elif result.holds and not force_wipe and not (
                magic == STORE_MAGIC and (host.name, path) in ours):
            result.problem = (f"holds {result.holds}; it is never overwritten without "
                              "--force-wipe")
        if result.problem:
            check.problems.append(f"host {host.name}: device {path} {result.problem}")
        check.devices.append(result)
    return check


def validate(hosts_file, force_wipe=False, progress=None, ours=()):
    """Every host checked over ssh, in parallel; [HostCheck] in the file's order."""
    workers = max(1, min(16, len(hosts_file.hosts)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(check_host, host, hosts_file.ssh_options, force_wipe, ours)
                   for host in hosts_file.hosts]
        checks = []
        for future in futures:
            checks.append(future.result())
            if progress is not None:
                progress(checks[-1])
    return checks
