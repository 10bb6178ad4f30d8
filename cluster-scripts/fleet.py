"""A cluster on real machines, over ssh: `cairn-cluster up|status|down --hosts-file HOSTS --dir
DIR` (the hosts file: cluster-scripts/hosts.py; ssh: cluster-scripts/remote.py).

`up`, host by host, each step skipped where it is already done (so a second `up` changes
nothing):
  1. validate every host and device (remote.validate); any problem stops it before anything
     is touched;
  2. build a wheelhouse here once (cairn and every dependency as wheels, DIR/wheelhouse) and
     install it on each host into INSTALL_DIR/venv without any index (hosts need no internet),
     unless the host already has this very build (INSTALL_DIR/installed holds its hash);
  3. ship keys (DIR/keys: each host gets only the keyrings of its daemons);
  4. make and start the monitors, wait for their quorum;
  5. make each OSD's file device if missing, wipe a foreign store only under --force-wipe,
     and start the OSDs; wait until every OSD is up and in.
Daemons run as systemd units where systemd runs the host (`Systemd`: restart on failure, logs
in the journal, enabled for boot) and otherwise under `python -m cairn.cluster.supervise`
(`Supervised`: restart on failure, a pid file, a log in DATA_DIR/logs), started detached with
setsid; the hosts file's service_manager can insist on either. A failed step raises FleetError
naming the host and the step; hosts already done are left as they are.

DIR/cluster.json (cairn-cluster's `save`) records the cluster (mode "ssh"): the fsid, the
monitors' addresses, each daemon's host and device, each host's service manager, so `cairn
--cluster DIR` talks to it and a second `up` keeps the same ids, keys and managers.
"""

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid

from cairn.cluster import remote
from cairn.common.monclient import MonitorsUnavailable

MONITOR_PORT = 6789
CONSOLE_PORT = 8080                     # each monitor's operations console (mon/console.py)
READY_S_MAX = 120.0
STOP_S_MAX = 30.0


class FleetError(Exception):
    """A bring-up step failed on a host; the message names both."""


def paths(spec, host):
    """Where things live on `host`: its install and data folders."""
    install = host.install_dir or spec.install_dir
    data = host.data_dir or spec.data_dir
    return {"install": install, "venv": f"{install}/venv", "data": data,
            "logs": f"{data}/logs", "run": f"{data}/run", "keys": f"{data}/keys"}


def plan(spec, existing=None):
    """The cluster's layout from the hosts file: fsid, monitors (name, host, addr) and OSDs
    (id, host, device) numbered in the file's order; an existing description keeps its fsid
    and the entries (ids, join weights) of the devices it already had."""
    known = {(o["host"], o["device"]): o for o in (existing or {}).get("osds", [])}
    next_id = max((o["id"] for o in known.values()), default=-1) + 1
    osds = []
    for host in spec.hosts:
        for device in host.devices:
            osd = known.get((host.name, device.path))
            if osd is None:
                osd = {"name": f"osd.{next_id}", "id": next_id, "host": host.name,
                       "device": device.path, "size_bytes": device.size_bytes}
                next_id += 1
            osds.append(dict(osd))
    mons = [{"name": f"mon.{index}", "host": host.name,
             "addr": f"{host.address}:{MONITOR_PORT}"}
            for index, host in enumerate(spec.monitors)]
    return {"mode": "ssh", "fsid": (existing or {}).get("fsid") or str(uuid.uuid4()),
            "hosts_file": os.path.abspath(spec.path), "mons": mons, "osds": osds,
            "hosts": [{"name": h.name, "address": h.address, "location": h.location}
                      for h in spec.hosts]}


def wheelhouse(directory, say):
    """DIR/wheelhouse: cairn (built from this checkout) and its dependencies as wheels; built
    once. Returns (folder, build id: the hash of cairn's wheel)."""
    folder = os.path.join(directory, "wheelhouse")
    wheels = [name for name in os.listdir(folder)] if os.path.isdir(folder) else []
    if not any(name.startswith("cairn-") for name in wheels):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if not os.path.exists(os.path.join(root, "setup.py")):
            raise FleetError(f"no cairn checkout at {root} to build wheels from")
        say(f"building wheels for the hosts (cairn and its dependencies) in {folder} ...")
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir",
                                 folder, root], capture_output=True, text=True, cwd=directory)
        if result.returncode != 0:
            raise FleetError(f"building wheels failed: {result.stderr.strip()[-800:]}")
        say(f"  wheels built in {time.monotonic() - started:.0f} s")
    cairn_wheel = sorted(name for name in os.listdir(folder) if name.startswith("cairn-"))[-1]
    with open(os.path.join(folder, cairn_wheel), "rb") as handle:
        build = hashlib.sha256(handle.read()).hexdigest()[:16]
    return folder, build


def _step(host, step, command, options, timeout_s=remote.SSH_TIMEOUT_S, stdin=None):
    try:
        return remote.run(host, command, options, step=step, timeout_s=timeout_s,
                          stdin=stdin)
    except remote.RemoteError as exc:
        raise FleetError(str(exc)) from None


class Supervised:
    """Daemons under cluster-scripts/supervise.py on a host without systemd: each started
    detached (setsid) with a pid file in DATA_DIR/run and its log in DATA_DIR/logs. Each method
    returns a POSIX shell line to run on the host."""

    kind = "supervise"

    def __init__(self, where):
        self.where = where

    def where_logs(self, name):
        return f"{self.where['logs']}/{name}.log"

    def _pidfile(self, name):
        return shlex.quote(f"{self.where['run']}/{name}.pid")

    def running(self, name):
        """Shell test: the supervisor of `name` runs (its pid file names a live process)."""
        pidfile = self._pidfile(name)
        return f"[ -f {pidfile} ] && kill -0 $(cat {pidfile}) 2>/dev/null"

    def start(self, name, argv):
        """Start `argv` under the supervisor, detached, unless it already runs."""
        supervised = [f"{self.where['venv']}/bin/python", "-m", "cairn.cluster.supervise",
                      "--pidfile", f"{self.where['run']}/{name}.pid", "--log",
                      self.where_logs(name), "--", *argv]
        return (f"{self.running(name)} || (cd {shlex.quote(self.where['data'])} && setsid -f "
                f"{' '.join(shlex.quote(a) for a in supervised)} </dev/null >/dev/null 2>&1)")

    def stop(self, names):
        """SIGTERM to each supervisor (which stops its daemon), then wait until all are gone."""
        pidfiles = " ".join(self._pidfile(name) for name in names)
        return (f"for f in {pidfiles}; do [ -f $f ] && kill -TERM $(cat $f) 2>/dev/null; "
                f"done; for i in $(seq {int(STOP_S_MAX * 10)}); do left=0; for f in "
                f"{pidfiles}; do [ -f $f ] && kill -0 $(cat $f) 2>/dev/null && left=1; done;"
                f" [ $left = 0 ] && break; sleep 0.1; done; [ $left = 0 ]")

    def remove(self, names):
        return "true"


class Systemd:
    """Daemons as systemd units where systemd runs the host: /etc/systemd/system/
    cairn-FSID8-NAME.service, enabled (they start again at boot), restarted on failure, their
    output in the journal (`journalctl -u UNIT`). `down` stops and disables them; `down
    --purge` removes the unit files."""

    kind = "systemd"
    UNIT_DIR = "/etc/systemd/system"

    def __init__(self, where, fsid):
        self.where = where
        self.fsid = fsid

    def unit(self, name):
        return f"cairn-{self.fsid[:8]}-{name}.service"

    def where_logs(self, name):
        return f"journalctl -u {self.unit(name)}"

    def running(self, name):
        return f"systemctl is-active -q {self.unit(name)}"

    def unit_text(self, name, argv):
        return "\n".join([
            f"# Made by cairn-cluster up for cluster {self.fsid}; 'cairn-cluster down --purge'",
            "# removes it.",
            "[Unit]",
            f"Description=cairn {name} (cluster {self.fsid})",
            "Wants=network-online.target",
            "After=network-online.target",
            # A daemon that keeps failing stays down (systemctl reset-failed, then start).
            "StartLimitIntervalSec=600",
            "StartLimitBurst=10",
            "",
            "[Service]",
            f"WorkingDirectory={self.where['data']}",
            "ExecStart=" + " ".join(systemd_quote(arg) for arg in argv),
            "Restart=on-failure",
            "RestartSec=3",
            f"TimeoutStopSec={int(STOP_S_MAX)}",
            "LimitNOFILE=1048576",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            ""])

    def start(self, name, argv):
        """Write the unit (only if it changed: then systemd reloads), enable it, start it
        unless it runs."""
        path = f"{self.UNIT_DIR}/{self.unit(name)}"
        return (f"printf %s {shlex.quote(self.unit_text(name, argv))} > {path}.new && "
                f"if cmp -s {path}.new {path}; then rm {path}.new; else mv {path}.new {path} "
                f"&& systemctl daemon-reload; fi && systemctl enable -q {self.unit(name)} && "
                f"( {self.running(name)} || systemctl start {self.unit(name)} )")

    def stop(self, names):
        """Stop and disable (systemctl waits until they are stopped)."""
        return f"systemctl disable -q --now {' '.join(self.unit(name) for name in names)}"

    def remove(self, names):
        units = " ".join(f"{self.UNIT_DIR}/{self.unit(name)}" for name in names)
        return (f"rm -f {units} && systemctl daemon-reload && "
                f"(systemctl reset-failed {' '.join(self.unit(name) for name in names)} "
                "2>/dev/null || true)")


def systemd_quote(arg):
    """One ExecStart argument as systemd.service(5) reads it: `%` and `$` escaped (specifiers,
    variables), quoted when it holds spaces, quotes or backslashes."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c.isspace() or c in "\"'\\;" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def manager(spec, description, host):
    """How `host`'s daemons run (its entry in the cluster description; supervise for a
    description written before there was a choice)."""
    where = paths(spec, host)
    kind = next((h.get("service_manager") for h in description["hosts"]
                 if h["name"] == host.name), None)
    return Systemd(where, description["fsid"]) if kind == "systemd" else Supervised(where)


def install(spec, host, folder, build, say):
    where = paths(spec, host)
    options = spec.ssh_options
    q = {key: shlex.quote(value) for key, value in where.items()}
    _step(host, "make folders", f"mkdir -p {q['install']} {q['logs']} {q['run']} && "
          f"mkdir -p -m 700 {q['keys']}", options)
    have = _step(host, "installed version", f"cat {q['install']}/installed 2>/dev/null || true",
                 options).strip()
    if have == build:
        return False
    system_packages(spec, host, say)
    say(f"  {host.name}: installing cairn (build {build}) into {where['venv']}")
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(folder, arcname="wheelhouse")
        archive.seek(0)
        _step(host, "ship wheels", f"rm -rf {q['install']}/wheelhouse && "
              f"tar -x -C {q['install']}", options, stdin=archive)
    _step(host, "install", f"( [ -x {q['venv']}/bin/python ] || python3 -m venv {q['venv']} ) "
          f"&& {q['venv']}/bin/python -m pip install -q --no-index --find-links "
          f"{q['install']}/wheelhouse --force-reinstall --no-deps {q['install']}/wheelhouse/*.whl"
          f" && echo {build} > {q['install']}/installed", options, timeout_s=900)
    return True


# What the wheels need from the host's system, each as (shell test, what is missing, the Debian
# package that brings it): Python 3.11 with venv and pip, and ISA-L (cairn's parity code and
# pyeclib's isa_l backends load libisal.so.2). pyeclib's wheel carries its own liberasurecode;
# the io_uring code is built in.
RUNTIME_NEEDS = (
    ("python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'", "Python 3.11 or newer",
     "python3"),
    ("python3 -c 'import venv, ensurepip'", "python3's venv and ensurepip", "python3-venv"),
    ("ldconfig -p 2>/dev/null | grep -q 'libisal.so.2 '", "ISA-L (libisal.so.2)", "libisal2"),
)


def system_packages(spec, host, say):
    """Check what the wheels need from the host's system; install what is missing with apt-get
    where the host has it (from the host's own package mirror: cairn itself needs no index).
    FleetError naming each missing part and its package if it cannot be had."""
    probe = "; ".join(f"{test} || echo {index}"
                      for index, (test, _, _) in enumerate(RUNTIME_NEEDS)) + "; true"
    missing = [RUNTIME_NEEDS[int(i)] for i in _step(host, "system packages", probe,
                                                      spec.ssh_options).split()]
    if not missing:
        return
    packages = " ".join(package for _, _, package in missing)
    say(f"  {host.name}: installing system packages: {packages}")
    try:
        remote.run(host, f"command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive "
                   f"apt-get install -y -q --no-install-recommends {packages}",
                   spec.ssh_options, step="apt-get install", timeout_s=600)
    except remote.RemoteError as exc:
        raise FleetError(f"host {host.name} ({host.address}): system packages: missing "
                         f"{', '.join(what for _, what, _ in missing)}; "
                         f"installing them failed ({exc.reason}): install "
                         f"{packages} there (Debian names) and run up again") from None
    still = _step(host, "system packages", probe, spec.ssh_options).split()
    if still:
        raise FleetError(f"host {host.name} ({host.address}): system packages: still missing "
                         f"{', '.join(RUNTIME_NEEDS[int(i)][1] for i in still)} after "
                         f"apt-get install {packages}")


def ship_keys(spec, host, description, keyring_path, directory):
    """The keyrings this host's daemons need (mode 0600), unless already there."""
    where = paths(spec, host)
    # A monitor's mkfs takes the bootstrap keyring (every entity's key: the monitors keep
    # them); an OSD, its own.
    entities = ["bootstrap"] if any(m["host"] == host.name for m in description["mons"]) \
        else []
    entities += [o["name"] for o in description["osds"] if o["host"] == host.name]
    for entity in entities:
        source = os.path.join(directory, "keys", "bootstrap.keyring") if entity == "bootstrap" \
            else keyring_path(directory, entity)
        target = f"{where['keys']}/{os.path.basename(source)}"
        with open(source, "rb") as handle:
            _step(host, f"ship key {entity}", f"umask 077 && cat > {shlex.quote(target)}",
                  spec.ssh_options, stdin=handle)


def start_monitors(spec, description, auth, say, only=None):
    """Make (once) and start each monitor, or only those on the hosts named in `only`."""
    members = ",".join(f"{m['name']}={m['addr']}" for m in description["mons"])
    for mon in description["mons"]:
        if only is not None and mon["host"] not in only:
            continue
        host = spec.host(mon["host"])
        where = paths(spec, host)
        mon_dir = f"{where['data']}/{mon['name']}"
        keys = (["--keyring", f"{where['keys']}/bootstrap.keyring"] if auth == "hmac"
                else ["--auth", "none"])
        mkfs = [f"{where['venv']}/bin/cairn-mon", "mkfs", "--dir", mon_dir, "--fsid",
                description["fsid"], "--name", mon["name"], "--members", members, *keys]
        _step(host, f"make {mon['name']}", f"[ -d {shlex.quote(mon_dir)}/store.db ] || "
              + " ".join(shlex.quote(a) for a in mkfs), spec.ssh_options)
        run = [f"{where['venv']}/bin/cairn-mon", "run", "--dir", mon_dir, "--bind", mon["addr"],
               "--name", mon["name"], "--console-port", str(CONSOLE_PORT)]
        mon["console"] = f"http://{mon['addr'].rpartition(':')[0]}:{CONSOLE_PORT}/"
        description.setdefault("console", mon["console"])
        _step(host, f"start {mon['name']}",
              manager(spec, description, host).start(mon["name"], run), spec.ssh_options)
        say(f"  {mon['name']} on {host.name} at {mon['addr']}")


def start_osds(spec, description, auth, force_wipe, say, only=None):
    """Start each OSD (its file device made first), or only those on the hosts in `only`."""
    mon_addrs = ",".join(m["addr"] for m in description["mons"])
    for osd in description["osds"]:
        if only is not None and osd["host"] not in only:
            continue
        host = spec.host(osd["host"])
        where = paths(spec, host)
        device, meta = osd["device"], f"{where['data']}/{osd['name']}.meta"
        q = shlex.quote
        prepare = []
        if osd["size_bytes"]:
            prepare.append(f"[ -e {q(device)} ] || truncate -s {osd['size_bytes']} {q(device)}")
        if force_wipe:
            # A device that holds a store this cluster did not make (no metadata here) is
            # wiped: its superblock and first blocks zeroed.
            prepare.append(f"[ -d {q(meta)} ] || dd if=/dev/zero of={q(device)} bs=1M count=4 "
                           "conv=notrunc status=none")
        keys = ["--keyring", f"{where['keys']}/{osd['name']}.keyring"] if auth == "hmac" else []
        location = [arg for kind, value in host.location.items() if kind in ("rack", "room")
                    for arg in (f"--{kind}", value)]
        # An OSD of a host added to a running cluster joins at weight 0 (add-host raises it);
        # the weight only counts at its first boot.
        weight = ["--weight", str(osd["join_weight"])] if "join_weight" in osd else []
        run = [f"{where['venv']}/bin/cairn-osd", "run", "--device", device, "--meta", meta,
               "--mkfs", "--mon", mon_addrs, "--bind", f"{host.address}:0", "--host",
               host.name, "--id", str(osd["id"]), *location, *weight, *keys]
        _step(host, f"start {osd['name']}",
              " && ".join(prepare + [manager(spec, description, host).start(osd["name"], run)]),
              spec.ssh_options)


def running(spec, description, host, names):
    """The names among `names` whose daemon runs on `host` (under its supervisor or unit)."""
    control = manager(spec, description, host)
    command = "; ".join(f"{control.running(name)} && echo {name}" for name in names) + "; true"
    return set(_step(host, "status", command, spec.ssh_options).split())


def names_on(description, host):
    return [d["name"] for d in description["mons"] + description["osds"]
            if d["host"] == host.name]


def stop_host(spec, host, description, purge=False):
    """Stop the host's daemons and wait until they are gone; `purge` also removes their units,
    the data folder and the file devices."""
    where = paths(spec, host)
    control = manager(spec, description, host)
    names = names_on(description, host)
    command = control.stop(names) if names else "true"
    if purge:
        files = [d["device"] for d in description["osds"]
                 if d["host"] == host.name and d.get("size_bytes")]
        command += (f" && {control.remove(names) if names else 'true'} && rm -rf "
                    f"{shlex.quote(where['data'])} " + " ".join(shlex.quote(p) for p in files))
    _step(host, "stop daemons" + (" and purge" if purge else ""), command, spec.ssh_options,
          timeout_s=STOP_S_MAX + 15)
    return names


def stop(spec, description, say, purge=False):
    """Stop every daemon on every host; hosts that cannot be reached are named, the others are
    stopped anyway."""
    failures = []
    for host in spec.hosts:
        try:
            names = stop_host(spec, host, description, purge)
            say(f"  {host.name}: stopped {len(names)} daemons" + (", purged" if purge else ""))
        except FleetError as exc:
            failures.append(str(exc))
    if failures:
        raise FleetError("; ".join(failures))


def rolling(spec, description, directory, auth, say, upgrade=None):
    """Restart the cluster's daemons one host at a time, each host only once the cluster is
    clean, and the next only once it is clean again; `upgrade` (wheel folder, build): install
    that build on each host before its daemons start again."""
    total = len(description["osds"])
    for host in spec.hosts:
        if not names_on(description, host):
            continue
        wait_clean(directory, total)
        started = time.monotonic()
        names = stop_host(spec, host, description)
        if upgrade is not None:
            install(spec, host, *upgrade, say)
        start_monitors(spec, description, auth, say, only={host.name})
        start_osds(spec, description, auth, False, say, only={host.name})
        wait_for_osds(directory, total)
        wait_clean(directory, total)
        say(f"  {host.name}: {len(names)} daemons {'upgraded' if upgrade else 'restarted'}, "
            f"cluster clean again in {time.monotonic() - started:.1f} s")


def cluster_status(directory):
    """(the monitors' status reply, the map), asked as the administrator through DIR."""
    import asyncio
    from cairn.client.cluster import Cluster

    async def ask():
        async with await Cluster.connect(directory) as cluster:
            reply = await cluster.monc.request({"op": "status"})
            return reply.header, cluster.map
    return asyncio.run(ask())


def is_clean(status, cmap, osds):
    """Every OSD up and in, every PG of every pool active and nothing degraded."""
    pgs = sum(pool["pg_num"] for pool in cmap.pools.values())
    return (status["osds"]["up"] == status["osds"]["in"] == osds
            and status["pg_states"] == ({"active": pgs} if pgs else {})
            and not status["objects"].get("degraded"))


def budget_in_force(status):
    """The recovery budget the monitors have in force now, in words (a step's data moves
    under it: recovery.windows, common/throttle.py)."""
    recovery = status["recovery"]
    rate = recovery["max_bytes_per_s"]
    return (f"window {recovery['window']}: "
            f"{'unlimited' if not rate else f'{rate / 1e6:g} MB/s'}, "
            f"{recovery['max_active']} PGs at once per OSD")


def wait_clean(directory, osds, timeout_s=READY_S_MAX):
    from cairn.client.errors import ClientError
    deadline = time.monotonic() + timeout_s
    status = None
    while True:
        try:
            status, cmap = cluster_status(directory)
            if is_clean(status, cmap, osds):
                return status
        except (ClientError, MonitorsUnavailable, OSError) as exc:
            status = str(exc)
        if time.monotonic() > deadline:
            raise FleetError(f"the cluster is not clean after {timeout_s:g} s (last: "
                             f"{status if isinstance(status, str) else status.get('pg_states')})")
        time.sleep(0.5)


def wait_for_osds(directory, count, timeout_s=READY_S_MAX, progress=None):
    """Until `count` OSDs are up and in in the monitors' map (FleetError on timeout); the map."""
    from cairn.client.errors import ClientError
    deadline = time.monotonic() + timeout_s
    last, seen = None, None
    while True:
        try:
            cmap = cluster_status(directory)[1]
            up = sum(1 for osd in cmap.osds.values() if osd["up"] and osd.get("in", True))
        except (ClientError, MonitorsUnavailable, OSError) as exc:
            cmap, up, last = None, 0, str(exc)
        if progress is not None and up != seen:
            progress(up, count)
            seen = up
        if up >= count:
            return cmap
        if time.monotonic() > deadline:
            raise FleetError(f"only {up} of {count} OSDs up and in after {timeout_s:g} s"
                             + (f" (last: {last})" if last else "") + "; see each host's "
                             "DATA_DIR/logs")
        time.sleep(1.0)


# -- progressive reweighting (add-host) ----------------------------------------------------------

def _acting(cmap):
    """{pool name: its PGs' acting sets} on `cmap`."""
    from cairn.common import pg as pgs
    return {name: pgs.acting_sets(cmap, name) for name in cmap.pools}


def moved_fraction(cmap, changes, before=None):
    """The share of every pool's PG member slots that the weight `changes` ({osd id: weight})
    would move, computed with the placement itself on the map as it would be (`before`:
    `_acting(cmap)`, when the caller has it already)."""
    from cairn.common.clustermap import Incremental
    before = before if before is not None else _acting(cmap)
    after = _acting(cmap.apply(Incremental(cmap.epoch + 1, tuple(
        {"op": "osd_weight", "id": osd_id, "weight": weight}
        for osd_id, weight in changes.items()))))
    slots = moved = 0
    for name, pool in cmap.pools.items():
        for old, new in zip(before[name], after[name]):
            slots += len(old.members)
            if pool["kind"] == "erasure":       # shard i lives at position i
                moved += sum(1 for position, member in enumerate(new.members)
                             if position >= len(old.members) or old.members[position] != member)
            else:                               # a copy is a copy wherever it is listed
                moved += len(set(new.members) - set(old.members))
    return moved / slots if slots else 0.0


def next_weights(cmap, osd_ids, target, step, max_misplaced):
    """The weights of the next step for `osd_ids` (all raised together, at most `step` each
    and not past `target`): the largest raise that keeps the share of PG copies moving within
    `max_misplaced` (bisected). Where even the first copy to move is more than that share (a
    small cluster), the smallest raise that moves anything: one indivisible move."""
    current = min(cmap.osds[osd_id]["weight"] for osd_id in osd_ids)
    full = min(step, target - current)
    if full <= 0:
        return None
    before = _acting(cmap)

    def raised(by):
        return {osd_id: min(target, cmap.osds[osd_id]["weight"] + by) for osd_id in osd_ids}

    def moved(by):
        return moved_fraction(cmap, raised(by), before)
    if moved(full) <= max_misplaced:
        return raised(full)
    within, beyond = 0.0, full              # moved(within) <= max_misplaced < moved(beyond)
    moved_within = 0.0
    for _ in range(14):
        middle = (within + beyond) / 2
        share = moved(middle)
        if share <= max_misplaced:
            within, moved_within = middle, share
        else:
            beyond = middle
    return raised(within if moved_within > 0 else beyond)
