"""The hosts file: which machines a real cluster runs on, read and checked without touching them.

A TOML file; README "Bring-up on real machines" shows a whole one. `[cluster]` holds the
defaults (CLUSTER_KEYS: ssh user, sudo, port, identity, ssh_options, install_dir, data_dir,
service_manager); each `[[host]]` table names one machine (HOST_KEYS): its name, ssh address,
location (rack, room, ...), whether it runs a monitor, its devices (a block device path, or
`{ path, size }` for a file device made on first use), and per-host overrides of the defaults.

`load(path)` returns a `HostsFile`; every problem found is raised at once as one HostsError whose
message lists them all, each naming the host and key. Checks that need the hosts themselves
(devices present, empty) are `cairn-cluster validate` (cluster-scripts/remote.py).
"""

import dataclasses
import ipaddress
import re
import tomllib

from cairn.common.units import parse_size

MONITOR_COUNTS = (1, 3, 5)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
LOCATION_TYPES = ("rack", "room", "row", "datacenter")
CLUSTER_KEYS = {"user", "sudo", "port", "identity", "ssh_options", "install_dir", "data_dir",
                "service_manager"}
HOST_KEYS = {"name", "address", "location", "mon", "devices", "user", "sudo", "port", "identity",
             "install_dir", "data_dir", "service_manager"}
# How daemons run on a host: "systemd" units, cluster-scripts/supervise.py ("supervise"), or
# "auto": systemd where it runs and cairn-cluster may write units (root or sudo), else supervise.
SERVICE_MANAGERS = ("auto", "systemd", "supervise")
DEVICE_KEYS = {"path", "size"}
FILE_DEVICE_BYTES_MIN = 256 << 20


class HostsError(Exception):
    """The hosts file cannot be used; the message lists every problem found."""


@dataclasses.dataclass(frozen=True)
class Device:
    path: str
    size_bytes: int = None              # a file device's size; None: a block device

    @property
    def is_file(self):
        return self.size_bytes is not None


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str
    location: dict
    mon: bool
    devices: tuple
    user: str
    sudo: bool
    port: int
    identity: str = None
    install_dir: str = None             # per-host overrides of [cluster]'s (None: those)
    data_dir: str = None
    service_manager: str = "auto"


@dataclasses.dataclass(frozen=True)
class HostsFile:
    path: str
    hosts: tuple
    install_dir: str
    data_dir: str
    ssh_options: tuple

    @property
    def monitors(self):
        return tuple(host for host in self.hosts if host.mon)

    def host(self, name):
        for host in self.hosts:
            if host.name == name:
                return host
        raise HostsError(f"{self.path}: no host {name!r} (hosts: "
                         f"{', '.join(h.name for h in self.hosts)})")


def load(path):
    """The hosts file at `path`, checked; HostsError listing every problem."""
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise HostsError(f"no hosts file at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HostsError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise HostsError(f"cannot read {path}: {exc}") from None
    return parse(raw, path)


def parse(raw, path="<hosts>"):
    problems = []
    unknown = set(raw) - {"cluster", "host"}
    if unknown:
        problems.append(f"unknown top-level keys {sorted(unknown)} (expected [cluster] and "
                        "[[host]] tables)")
    cluster = raw.get("cluster", {})
    if not isinstance(cluster, dict):
        problems.append("[cluster] must be a table")
        cluster = {}
    _unknown_keys(problems, "[cluster]", cluster, CLUSTER_KEYS)
    defaults = {"user": _text(problems, "[cluster]", cluster, "user", "root"),
                "sudo": _flag(problems, "[cluster]", cluster, "sudo", False),
                "port": _port(problems, "[cluster]", cluster, 22),
                "identity": _text(problems, "[cluster]", cluster, "identity", None),
                "service_manager": _choice(problems, "[cluster]", cluster, "service_manager",
                                           SERVICE_MANAGERS, "auto")}
    install_dir = _absolute(problems, "[cluster]", cluster, "install_dir", "/opt/cairn")
    data_dir = _absolute(problems, "[cluster]", cluster, "data_dir", "/var/lib/cairn")
    options = cluster.get("ssh_options", [])
    if not (isinstance(options, list) and all(isinstance(o, str) for o in options)):
        problems.append("[cluster] ssh_options must be a list of strings")
        options = []
    entries = raw.get("host", [])
    if not isinstance(entries, list) or not entries:
        problems.append("no hosts: add a [[host]] table per machine")
        entries = []
    hosts = []
    for index, entry in enumerate(entries):
        host = _host(problems, index, entry, defaults)
        if host is not None:
            hosts.append(host)
    _duplicates(problems, "host name", [h.name for h in hosts])
    _duplicates(problems, "host address", [h.address for h in hosts])
    for host in hosts:
        _duplicates(problems, f"device on host {host.name}", [d.path for d in host.devices])
    monitors = sum(1 for host in hosts if host.mon)
    if hosts and monitors not in MONITOR_COUNTS:
        problems.append(f"{monitors} hosts have mon = true; a cluster needs 1, 3 or 5 monitors "
                        "(an odd number, so a majority survives a loss)")
    if hosts and not any(host.devices for host in hosts):
        problems.append("no host lists devices: the cluster would have no OSDs")
    if problems:
        raise HostsError(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}:"
                         + "".join(f"\n  - {problem}" for problem in problems))
    return HostsFile(path, tuple(hosts), install_dir, data_dir, tuple(options))


def _host(problems, index, entry, defaults):
    where = f"host #{index + 1}"
    if not isinstance(entry, dict):
        problems.append(f"{where} must be a table")
        return None
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(f"{where}: name must be 1-63 letters, digits, '.', '_' or '-' "
                        f"(was {name!r})")
        return None
    where = f"host {name}"
    _unknown_keys(problems, where, entry, HOST_KEYS)
    address = entry.get("address")
    if not isinstance(address, str) or not address or any(c.isspace() for c in address):
        problems.append(f"{where}: address (the ssh address, an IP or a DNS name) is required")
        address = ""
    elif ":" in address:
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            problems.append(f"{where}: address {address!r} must not carry a port (use port = N)")
    location = entry.get("location", {})
    if not isinstance(location, dict) or not all(
            key in LOCATION_TYPES and isinstance(value, str) and NAME_RE.match(value)
            for key, value in location.items()):
        problems.append(f"{where}: location is a table of {', '.join(LOCATION_TYPES)} names "
                        f"(was {location!r})")
        location = {}
    devices = []
    raw_devices = entry.get("devices", [])
    if not isinstance(raw_devices, list):
        problems.append(f"{where}: devices must be a list")
        raw_devices = []
    for device in raw_devices:
        parsed = _device(problems, where, device)
        if parsed is not None:
            devices.append(parsed)
    return Host(name=name, address=address, location=dict(location),
                mon=_flag(problems, where, entry, "mon", False), devices=tuple(devices),
                user=_text(problems, where, entry, "user", defaults["user"]),
                sudo=_flag(problems, where, entry, "sudo", defaults["sudo"]),
                port=_port(problems, where, entry, defaults["port"]),
                identity=_text(problems, where, entry, "identity", defaults["identity"]),
                install_dir=_absolute(problems, where, entry, "install_dir", None),
                data_dir=_absolute(problems, where, entry, "data_dir", None),
                service_manager=_choice(problems, where, entry, "service_manager",
                                        SERVICE_MANAGERS, defaults["service_manager"]))


def _device(problems, where, device):
    if isinstance(device, str):
        device = {"path": device}
    if not isinstance(device, dict):
        problems.append(f"{where}: a device is a path or {{ path = ..., size = ... }} "
                        f"(was {device!r})")
        return None
    _unknown_keys(problems, f"{where} device", device, DEVICE_KEYS)
    path = device.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        problems.append(f"{where}: device path must be absolute (was {path!r})")
        return None
    size = device.get("size")
    if size is None:
        if not path.startswith("/dev/"):
            problems.append(f"{where}: {path} is not under /dev: a file device needs a size "
                            "(size = \"64G\")")
            return None
        return Device(path)
    try:
        size_bytes = parse_size(str(size))
    except ValueError as exc:
        problems.append(f"{where}: device {path} size: {exc}")
        return None
    if size_bytes < FILE_DEVICE_BYTES_MIN:
        problems.append(f"{where}: device {path} of {size} is below the 256M minimum")
        return None
    return Device(path, size_bytes)


def _unknown_keys(problems, where, table, known):
    unknown = set(table) - known
    if unknown:
        problems.append(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")


def _duplicates(problems, what, values):
    seen, repeated = set(), []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.add(value)
    for value in repeated:
        problems.append(f"duplicate {what} {value!r}")


def _text(problems, where, table, key, default):
    value = table.get(key, default)
    if value is not None and (not isinstance(value, str) or not value):
        problems.append(f"{where}: {key} must be a non-empty string (was {value!r})")
        return default
    return value


def _flag(problems, where, table, key, default):
    value = table.get(key, default)
    if not isinstance(value, bool):
        problems.append(f"{where}: {key} must be true or false (was {value!r})")
        return default
    return value


def _choice(problems, where, table, key, choices, default):
    value = table.get(key, default)
    if value not in choices:
        problems.append(f"{where}: {key} must be one of {', '.join(choices)} (was {value!r})")
        return default
    return value


def _port(problems, where, table, default):
    value = table.get("port", default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        problems.append(f"{where}: port must be 1-65535 (was {value!r})")
        return default
    return value


def _absolute(problems, where, table, key, default):
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        problems.append(f"{where}: {key} must be an absolute path (was {value!r})")
        return default
    return value
