"""`cairn-cluster`: bring a multi-host cairn cluster up on this machine, and down again; or on
real machines over ssh from a hosts file (cluster-scripts/hosts.py, fleet.py).

    cairn-cluster up      --dir DIR --hosts H --osds-per-host N [--racks R] [--mons 1|3]
                          [--device-size 2G] [--isolated] [--config KEY=VALUE ...]
    cairn-cluster down    --dir DIR [--purge]
    cairn-cluster status  --dir DIR [--json]
    cairn-cluster kill    --dir DIR NAME [--signal KILL|TERM|STOP|CONT]
    cairn-cluster restart --dir DIR NAME

    cairn-cluster validate HOSTS [--offline] [--force-wipe] [--json]
    cairn-cluster up|status|down|restart|upgrade --hosts-file HOSTS [--dir DIR]
    cairn-cluster add-host HOSTS NEWHOST [--step 0.25] [--max-misplaced 0.05]

Local mode (the default, no root): every host is its own loopback address (127.0.0.2, .3, ...;
the monitor is on 127.0.0.1), every OSD's device is a sparse file under DIR/devices. Each daemon
is a real process in its own session, logging to DIR/logs/NAME.log.

DIR/cluster.json describes everything (monitor addresses; every daemon's pid, host, address,
device and command line), so `cairn --cluster DIR ...`, tests and these subcommands find it all.
`down`, `kill` and `restart` act only on the pids recorded there, and only after checking that
the process really is the daemon we started (its command line names DIR), so a recycled pid is
never signalled.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

from cairn.cluster import bench_auth, demo, fleet, hosts, isolated, remote
from cairn.cluster.cli_parser import SIGNALS, build_parser
from cairn.cluster.daemons import (clear_faults, ClusterError, DAEMON_READY_S_MAX, daemons,
                                   description_path, find, free_port, is_ours, launch, layout, load,
                                   CONSOLE_PORT, MONITOR_IP, MONITOR_PORT, python_argv, room_warning, save, stop,
                                   stop_all, undo_isolation, wait_quorum, wait_ready)
from cairn.common import auth, tls
from cairn.client.errors import ClientError
from cairn.common.monclient import MonitorsUnavailable
from cairn.common.units import format_size


def _cluster_dir(args):
    """--dir, or for a hosts file HOSTS.toml its default, HOSTS.cluster beside it."""
    if args.dir:
        return os.path.abspath(args.dir)
    if getattr(args, "hosts_file", None):
        return os.path.splitext(os.path.abspath(args.hosts_file))[0] + ".cluster"
    raise ClusterError("give --dir DIR (a local cluster) or --hosts-file HOSTS (real machines)")


def up(args):
    if args.hosts_file:
        return up_hosts(args)
    directory = _cluster_dir(args)
    if os.path.exists(description_path(directory)):
        existing = load(directory)
        alive = [entry["name"] for entry in daemons(existing) if is_ours(entry.get("pid"),
                                                                         directory)]
        if alive:
            raise ClusterError(f"a cluster is already running in {directory} ({len(alive)} "
                               f"daemons); 'cairn-cluster down --dir {directory}' first")
        raise ClusterError(f"{directory} holds a stopped cluster; 'cairn-cluster down --dir "
                           f"{directory} --purge' removes it, or restart its daemons")
    if args.isolated:
        try:
            isolated.require_root()
        except isolated.IsolationError as exc:
            raise ClusterError(str(exc)) from None
    started = time.monotonic()
    for sub in ("logs", "run", "devices"):
        os.makedirs(os.path.join(directory, sub), exist_ok=True)
    say = (lambda message: print(message, file=sys.stderr)) if args.json else print
    shape = layout(args.hosts, args.osds_per_host, args.racks)
    warning = room_warning(os.path.join(directory, "devices"),
                           args.device_size * sum(len(ids) for *_, ids in shape))
    if warning:
        print(warning, file=sys.stderr)
    mon_names = [f"mon.{index}" for index in range(args.mons)]
    mon_hosts = {name: "mon" if index == 0 else f"mon{index}"
                 for index, name in enumerate(mon_names)}
    mon_ips = {name: MONITOR_IP for name in mon_names}
    description = {"mode": "isolated" if args.isolated else "local", "dir": directory,
                   "created": time.strftime("%FT%T%z"), "mons": [], "osds": [], "faults": []}
    if args.isolated:
        tag, octet = isolated.choose_network(directory)
        shape = [(host, rack, isolated.host_ip(octet, index + 1), ids)
                 for index, (host, rack, _, ids) in enumerate(shape)]
        mon_ips = {name: isolated.mon_ip(octet, index) for index, name in enumerate(mon_names)}
        names = {mon_hosts[name]: mon_ips[name] for name in mon_names} | \
            {host: ip for host, _, ip, _ in shape}
        description["isolation"] = {"tag": tag, "octet": octet, "bridge": f"cb-{tag}",
                                    "hosts": names, "mtu": args.mtu}
        save(directory, description)
        try:
            isolated.create_network(tag, octet, names, args.mtu)
        except isolated.IsolationError as exc:
            isolated.destroy_network(tag, names)
            raise ClusterError(str(exc)) from None
        say(f"network: bridge cb-{tag}, {len(names)} namespaces on "
            f"{isolated.SUBNET_PREFIX}.{octet}.0/24, MTU {args.mtu}")
    description["hosts"] = [{"name": host, "rack": rack, "ip": ip, "osds": ids}
                            for host, rack, ip, ids in shape]
    # Monitors need fixed addresses: each one's peers find it there, restarts included.
    ports = []
    for _ in mon_names:
        ports.append(MONITOR_PORT if args.isolated else free_port(ports))
    members = {name: f"{mon_ips[name]}:{port}" for name, port in zip(mon_names, ports)}
    # The consoles too: a restarted monitor serves its console at the same URL.
    console_ports = []
    for _ in mon_names:
        console_ports.append(CONSOLE_PORT if args.isolated else free_port(ports + console_ports))
    fsid = str(uuid.uuid4())
    mkfs_auth = ["--auth", "none"]
    if args.auth == "hmac":
        bootstrap = _make_keys(directory, [osd_id for *_, ids in shape for osd_id in ids])
        mkfs_auth = ["--keyring", bootstrap]
        say(f"keys: {directory}/client.admin.keyring (client.admin), {directory}/keys/")
    tls_argv = []
    if args.tls:
        try:
            tls.make(os.path.join(directory, "tls"), fsid)
        except tls.TlsError as exc:
            raise ClusterError(str(exc)) from None
        description["tls"] = "tls"
        tls_argv = ["--tls", os.path.join(directory, "tls")]
        save(directory, description)
        say(f"tls: every connection encrypted; the cluster certificate is "
            f"{directory}/tls/cluster.crt")
    processes = []
    for name, console_port in zip(mon_names, console_ports):
        mon_dir = os.path.join(directory, name)
        subprocess.run(python_argv("cairn.mon.cli", "mkfs", "--dir", mon_dir, "--fsid", fsid,
                                   "--name", name, "--members",
                                   ",".join(f"{n}={a}" for n, a in members.items()),
                                   *mkfs_auth),
                       check=True, stdout=subprocess.DEVNULL)
        mon = {"name": name, "host": mon_hosts[name] if args.isolated else None,
               "ip": mon_ips[name], "dir": mon_dir,
               "log": os.path.join(directory, "logs", f"{name}.log"),
               "ready_file": os.path.join(directory, "run", f"{name}.ready")}
        prefix = isolated.exec_prefix(tag, mon["host"]) if args.isolated else []
        mon["argv"] = prefix + python_argv("cairn.mon.cli", "run", "--dir", mon_dir, "--bind",
                                           members[name], "--name", name, "--ready-file",
                                           mon["ready_file"], "--metrics-port", "0",
                                           "--console-port", str(console_port), *tls_argv)
        description["mons"].append(mon)
    save(directory, description)
    processes = [launch(directory, mon) for mon in description["mons"]]
    save(directory, description)
    try:
        _start_daemons(args, directory, description, shape, processes, say, tls_argv)
        if args.s3:
            _start_gateways(args, directory, description, say)
    except (ClusterError, KeyboardInterrupt):
        stop_all(directory, description.get("gateways", []), wait_s=2.0)
        stop_all(directory, description["osds"] + description["mons"], wait_s=2.0)
        undo_isolation(description)
        say(f"bring-up failed: stopped what had started; logs are in {directory}/logs")
        raise
    elapsed = time.monotonic() - started
    racks = f" in {args.racks} racks" if args.racks else ""
    say(f"cluster up in {elapsed:.1f} s: {args.mons} monitor{'s' if args.mons > 1 else ''}, "
        f"{len(description['osds'])} OSDs on "
        f"{args.hosts} hosts{racks} ({format_size(args.device_size)} {'loop' if args.isolated else 'file'} devices)")
    say(f"  use it: export CAIRN_CLUSTER={directory}; cairn status")
    if description.get("console"):
        say(f"  console: {description['console']} (cairn console prints a sign-in link)")
    if args.json:
        print(json.dumps({"dir": directory, "seconds": round(elapsed, 2),
                          "mons": [m["addr"] for m in description["mons"]],
                          "osds": len(description["osds"]), "s3": description.get("s3", [])}))
    return 0


def _start_gateways(args, directory, description, say):
    """N cairn-s3 gateways on loopback (the first makes the pools s3.index and s3.data)."""
    description["gateways"], description["s3"] = [], []
    ports = []
    for index in range(args.s3):
        ports.append(free_port(ports))          # fixed: a restart keeps the URL
        name = f"s3.{index}"
        entry = {"name": name, "host": None, "ip": "127.0.0.1",
                 "log": os.path.join(directory, "logs", f"{name}.log"),
                 "ready_file": os.path.join(directory, "run", f"{name}.ready")}
        entry["argv"] = python_argv(
            "cairn.s3.cli", "--bind", f"127.0.0.1:{ports[-1]}", "--cluster", directory,
            "--create-pools",
            "--ready-file", entry["ready_file"], "--metrics-port", "0",
            *(["--keyring", _keyring_path(directory, "client.admin")]
              if args.auth == "hmac" else []))
        description["gateways"].append(entry)
        save(directory, description)
        process = launch(directory, entry)
        save(directory, description)
        wait_ready([process], [entry], DAEMON_READY_S_MAX)
        description["s3"].append(f"http://{entry['addr']}")
        save(directory, description)
        say(f"{name} serving S3 at http://{entry['addr']} (pid {entry['pid']})")


def _load_hosts(path):
    try:
        return hosts.load(path)
    except hosts.HostsError as exc:
        raise ClusterError(str(exc)) from None


def up_hosts(args):
    """`up --hosts-file HOSTS`: the cluster on the machines the file names, over ssh (see
    cluster-scripts/fleet.py for the steps); running it again changes nothing."""
    say = (lambda message: print(message, file=sys.stderr)) if args.json else print
    spec = _load_hosts(args.hosts_file)
    directory = _cluster_dir(args)
    existing = load(directory) if os.path.exists(description_path(directory)) else None
    if existing is not None and existing.get("mode") != "ssh":
        raise ClusterError(f"{directory} holds a local cluster, not one on the hosts of "
                           f"{args.hosts_file}; give another --dir")
    started = time.monotonic()
    os.makedirs(directory, exist_ok=True)
    description = fleet.plan(spec, existing)
    ours = {(o["host"], o["device"]) for o in (existing or {}).get("osds", [])}
    added = [o for o in description["osds"] if existing and (o["host"], o["device"]) not in ours]
    if added:
        # Devices at full weight at once would move data all at once: add-host does it in steps.
        raise ClusterError(
            "not started, nothing changed: the hosts file lists devices the cluster does not "
            f"have ({', '.join(o['host'] + ':' + o['device'] for o in added)}); bring them in "
            f"with 'cairn-cluster add-host {args.hosts_file} HOST' for "
            f"{', '.join(sorted({o['host'] for o in added}))} (they join at weight 0 and take "
            "data in steps)")
    say(f"checking {len(spec.hosts)} hosts over ssh ...")
    checks = remote.validate(spec, force_wipe=args.force_wipe, ours=ours)
    problems = [problem for check in checks for problem in check.problems]
    if problems:
        raise ClusterError("not started, nothing changed: " + "; ".join(problems))
    # Daemons already running under one manager stay under it (a host that gained systemd
    # since keeps its supervised daemons); a new host gets what validate found.
    before = {h["name"]: h.get("service_manager", "supervise")
              for h in (existing or {}).get("hosts", [])}
    for entry, check in zip(description["hosts"], checks):
        entry["service_manager"] = before.get(entry["name"], check.service_manager)
    if args.auth == "hmac":
        if not os.path.exists(os.path.join(directory, "keys", "bootstrap.keyring")):
            _make_keys(directory, [osd["id"] for osd in description["osds"]])
        missing = [o["name"] for o in description["osds"]
                   if not os.path.exists(_keyring_path(directory, o["name"]))]
        if missing:
            raise ClusterError(f"no keys for {', '.join(missing)} in {directory}/keys: devices "
                               "added to an existing cluster's hosts file are not supported yet")
    description["auth"] = args.auth
    save(directory, description)
    try:
        folder, build = fleet.wheelhouse(directory, say)
        installed = 0
        for host in spec.hosts:
            installed += fleet.install(spec, host, folder, build, say)
            if args.auth == "hmac":
                fleet.ship_keys(spec, host, description, _keyring_path, directory)
        say(f"cairn installed on {installed} hosts ({len(spec.hosts) - installed} had build "
            f"{build})")
        fleet.start_monitors(spec, description, args.auth, say)
        save(directory, description)                # with the consoles' URLs
        leader = wait_quorum([m["addr"] for m in description["mons"]], fleet.READY_S_MAX,
                             directory)
        say(f"monitors in quorum: leader {leader}")
        fleet.start_osds(spec, description, args.auth, args.force_wipe, say)

        def progress(up_count, total):
            say(f"  OSDs up and in: {up_count}/{total}")
        fleet.wait_for_osds(directory, len(description["osds"]), progress=progress)
    except fleet.FleetError as exc:
        raise ClusterError(f"{exc} (hosts done before it are left as they are; fix it and run "
                           "up again)") from None
    elapsed = time.monotonic() - started
    say(f"cluster up in {elapsed:.1f} s: {len(description['mons'])} monitors, "
        f"{len(description['osds'])} OSDs on {len(spec.hosts)} hosts")
    say(f"  use it: export CAIRN_CLUSTER={directory}; cairn status")
    if description.get("console"):
        say(f"  console: {description['console']} (cairn console prints a sign-in link)")
    if args.json:
        print(json.dumps({"dir": directory, "seconds": round(elapsed, 2),
                          "mons": [m["addr"] for m in description["mons"]],
                          "osds": len(description["osds"]), "hosts": len(spec.hosts),
                          "installed": installed}))
    return 0


def _keyring_path(directory, entity):
    if entity == "client.admin":
        return os.path.join(directory, "client.admin.keyring")
    return os.path.join(directory, "keys", f"{entity.rstrip('.')}.keyring")


def _make_keys(directory, osd_ids):
    """New keys for a new cluster: the monitors' (mon.), the administrator's (client.admin,
    admin caps) and one per OSD, each in its own keyring (mode 0600), and the bootstrap keyring
    that holds them all for the monitors' mkfs; its path."""
    os.makedirs(os.path.join(directory, "keys"), mode=0o700, exist_ok=True)
    entities = {"mon.": (auth.new_secret(), []), "client.admin": (auth.new_secret(), ["admin"])}
    for osd_id in osd_ids:
        entities[f"osd.{osd_id}"] = (auth.new_secret(), ["mon=rw", "osd=rw"])
    for entity, entry in entities.items():
        auth.write_keyring(_keyring_path(directory, entity), {entity: entry})
    bootstrap = os.path.join(directory, "keys", "bootstrap.keyring")
    auth.write_keyring(bootstrap, entities)
    return bootstrap


def _start_daemons(args, directory, description, shape, mon_processes, say, tls_argv):
    mons = description["mons"]
    wait_ready(mon_processes, mons, DAEMON_READY_S_MAX)
    description["console"] = next((mon["console"] for mon in mons if mon.get("console")), None)
    save(directory, description)
    for mon in mons:
        say(f"{mon['name']} up at {mon['addr']} (pid {mon['pid']})")
    leader = wait_quorum([mon["addr"] for mon in mons], DAEMON_READY_S_MAX, directory)
    if len(mons) > 1:
        say(f"monitors in quorum: leader {leader}")
    if args.config:
        _apply_config(directory, args.config)

    processes = []
    for host, rack, ip, ids in shape:
        for osd_id in ids:
            image = os.path.join(directory, "devices", f"osd.{osd_id}.img")
            with open(image, "wb") as handle:
                handle.truncate(args.device_size)
            name = f"osd.{osd_id}"
            entry = {"name": name, "id": osd_id, "host": host, "rack": rack, "ip": ip,
                     "image": image, "device": image, "meta": image + ".meta",
                     "log": os.path.join(directory, "logs", f"{name}.log"),
                     "ready_file": os.path.join(directory, "run", f"{name}.ready")}
            prefix = []
            if args.isolated:
                entry["device"] = isolated.attach_loop(image)
                save(directory, description | {"osds": description["osds"] + [entry]})
                prefix = isolated.exec_prefix(description["isolation"]["tag"], host)
            entry["argv"] = prefix + python_argv(
                "cairn.osd.cli", "run", "--device", entry["device"], "--meta", entry["meta"],
                "--mkfs", "--cluster", directory, "--bind", f"{ip}:0", "--host", host,
                "--id", str(osd_id), "--ready-file", entry["ready_file"],
                "--metrics-port", "0", *(["--rack", rack] if rack else []),
                *(["--keyring", _keyring_path(directory, name)] if args.auth == "hmac" else []),
                *(["--read-cache", str(args.read_cache)] if args.read_cache is not None
                  else []),
                *tls_argv)
            description["osds"].append(entry)
    save(directory, description)
    for entry in description["osds"]:
        processes.append(launch(directory, entry))
    save(directory, description)
    last = [-1]

    def progress(done, total):
        if done != last[0] and (done == total or done % max(1, total // 4) == 0):
            say(f"  OSDs ready: {done}/{total}")
            last[0] = done

    wait_ready(processes, description["osds"], DAEMON_READY_S_MAX, progress)
    save(directory, description)


def _apply_config(directory, pairs):
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ClusterError(f"--config takes KEY=VALUE (was {pair!r})")
        result = subprocess.run(python_argv("cairn.client.cli", "--cluster", directory, "config",
                                            "set", key, value), capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"config {key}: {result.stderr.strip()}")


# -- down, status, kill, restart -----------------------------------------------------------------

def down(args):
    directory = _cluster_dir(args)
    description = load(directory)
    if description.get("mode") == "ssh":
        spec = _load_hosts(args.hosts_file or description["hosts_file"])
        try:
            fleet.stop(spec, description, print, purge=args.purge)
        except fleet.FleetError as exc:
            raise ClusterError(str(exc)) from None
        if args.purge:
            shutil.rmtree(directory)
            print(f"removed {directory}")
        return 0
    # OSDs first, and all of them at once, so each can still tell the monitor it is leaving;
    # then the monitors.
    stopped = 0
    for group in (description.get("gateways", []), description["osds"], description["mons"]):
        stopped += len(stop_all(directory, group))
    print(f"stopped {stopped} daemons in {directory}")
    undone = undo_isolation(description)
    if undone:
        print(undone)
        if not args.purge:          # (a purge must work on a full disk: nothing to record)
            description["faults"] = []
            save(directory, description)
    if args.purge:
        shutil.rmtree(directory)
        print(f"removed {directory}")
    return 0


def status(args):
    directory = _cluster_dir(args)
    description = load(directory)
    if description.get("mode") == "ssh":
        return _status_hosts(args, directory, description)
    rows = [{"name": entry["name"], "pid": entry.get("pid"), "host": entry.get("host"),
             "addr": entry.get("addr"), "running": is_ours(entry.get("pid"), directory)}
            for entry in daemons(description)]
    if args.json:
        print(json.dumps({"dir": directory, "daemons": rows}))
        return 0
    for row in rows:
        print(f"{row['name']:8} {'running' if row['running'] else 'stopped':8} pid "
              f"{row['pid'] or '-':<8} {row['host'] or '-':6} {row['addr'] or '-'}")
    running = sum(row["running"] for row in rows)
    print(f"{running} of {len(rows)} daemons running")
    return 0


def _status_hosts(args, directory, description):
    """Each daemon on the hosts running or not (its supervisor's pid file, over ssh), and the
    monitors' view: OSDs up and in."""
    spec = _load_hosts(args.hosts_file or description["hosts_file"])
    rows = []
    for host in spec.hosts:
        names = [d["name"] for d in description["mons"] + description["osds"]
                 if d["host"] == host.name]
        try:
            running = fleet.running(spec, description, host, names)
        except fleet.FleetError as exc:
            rows += [{"name": name, "host": host.name, "running": None, "error": str(exc)}
                     for name in names]
            continue
        control = fleet.manager(spec, description, host)
        rows += [{"name": name, "host": host.name, "running": name in running,
                  "service_manager": control.kind, "logs": control.where_logs(name)}
                 for name in names]
    try:
        cmap = fleet.cluster_status(directory)[1]
        osds = {"up": sum(1 for o in cmap.osds.values() if o["up"]), "total": len(cmap.osds),
                "epoch": cmap.epoch}
    except (ClientError, MonitorsUnavailable, OSError) as exc:
        osds = {"error": str(exc)}
    if args.json:
        print(json.dumps({"dir": directory, "daemons": rows, "osds": osds}))
        return 0
    for row in rows:
        state = {True: "running", False: "stopped", None: "unknown"}[row["running"]]
        print(f"{row['name']:8} {state:8} {row['host']:12} "
              + (f"({row['error']})" if row.get("error") else
                 f"{row['service_manager']:9} logs: {row['logs']}"))
    running = sum(1 for row in rows if row["running"])
    print(f"{running} of {len(rows)} daemons running; "
          + (f"{osds['up']} of {osds['total']} OSDs up (epoch {osds['epoch']})" if "up" in osds
             else f"monitors: {osds['error']}"))
    return 0




def kill(args):
    directory = os.path.abspath(args.dir)
    entry = find(load(directory), args.name)
    sig = SIGNALS[args.signal]
    if not stop(directory, entry, sig):
        raise ClusterError(f"{args.name} is not running (pid {entry.get('pid')})")
    print(f"sent SIG{args.signal} to {args.name} (pid {entry['pid']})")
    return 0


def restart(args):
    directory = _cluster_dir(args)
    description = load(directory)
    if description.get("mode") == "ssh":
        if args.name:
            raise ClusterError("a cluster on hosts restarts host by host: 'cairn-cluster "
                               "restart --hosts-file HOSTS' (no daemon name)")
        return _rolling(args, directory, description, upgrade=False)
    if not args.name:
        raise ClusterError("name the daemon to restart (osd.N or mon.N)")
    entry = find(description, args.name)
    stop(directory, entry, signal.SIGTERM)
    process = launch(directory, entry)
    wait_ready([process], [entry], DAEMON_READY_S_MAX)
    save(directory, description)
    print(f"restarted {args.name}: pid {entry['pid']}, {entry['addr']}")
    return 0


def upgrade(args):
    """`upgrade --hosts-file HOSTS`: build the wheels again from this checkout and install
    them host by host, each host's daemons restarted and the cluster clean before the next."""
    directory = _cluster_dir(args)
    description = load(directory)
    if description.get("mode") != "ssh":
        raise ClusterError(f"{directory} is a local cluster: it runs this checkout's code "
                           "already (restart its daemons)")
    return _rolling(args, directory, description, upgrade=True)


def _rolling(args, directory, description, upgrade):
    spec = _load_hosts(args.hosts_file or description["hosts_file"])
    started = time.monotonic()
    new_build = None
    try:
        if upgrade:
            shutil.rmtree(os.path.join(directory, "wheelhouse"), ignore_errors=True)
            new_build = fleet.wheelhouse(directory, print)
            print(f"upgrading to build {new_build[1]}, one host at a time")
        else:
            print("restarting one host at a time, each once the cluster is clean")
        fleet.rolling(spec, description, directory, description.get("auth", "hmac"), print,
                      upgrade=new_build)
    except fleet.FleetError as exc:
        raise ClusterError(f"{exc} (hosts before it are done; run it again to go on)") from None
    print(f"{'upgraded' if upgrade else 'restarted'} {len(spec.hosts)} hosts in "
          f"{time.monotonic() - started:.1f} s; the cluster is clean")
    return 0


def add_host(args):
    """`add-host HOSTS NEWHOST`: NEWHOST (a host of the hosts file not yet in the cluster, or a
    member whose entry lists devices the cluster does not have) gets cairn, keys and OSDs for
    its new devices at weight 0; then their weight is raised in steps, each once
    the cluster is clean, each small enough that the placement itself says at most
    --max-misplaced of the PG copies move; the data moves under the recovery budget of the
    window in force (recovery.windows). Run again after an interruption, it goes on from the
    weights the map holds."""
    spec = _load_hosts(args.hosts_file)
    directory = _cluster_dir(args)
    description = load(directory)
    if description.get("mode") != "ssh":
        raise ClusterError(f"{directory} is not a cluster on hosts ('up --hosts-file' makes one)")
    try:
        host = spec.host(args.new_host)
    except hosts.HostsError as exc:
        raise ClusterError(f"{exc}: add its [[host]] table first") from None
    auth_mode = description.get("auth", "hmac")
    started = time.monotonic()
    known = {osd["device"] for osd in description["osds"] if osd["host"] == host.name}
    fresh = [device for device in host.devices if device.path not in known]
    try:
        if fresh:
            _join_host(args, spec, host, directory, description, auth_mode, fresh)
        # The OSDs add-host brought in (a resumed run finds them by their join weight).
        new = [osd for osd in description["osds"]
               if osd["host"] == host.name and "join_weight" in osd]
        if not new:
            raise ClusterError(f"host {host.name} is in the cluster with every device its "
                               "entry lists: nothing to add (list a new device in its entry, "
                               "or add a [[host]])")
        # cairn, keys and the OSDs on the host: each step skipped where done (a run
        # interrupted before its OSDs started goes on here).
        folder, build = fleet.wheelhouse(directory, print)
        fleet.install(spec, host, folder, build, print)
        if auth_mode == "hmac":
            fleet.ship_keys(spec, host, description, _keyring_path, directory)
        fleet.start_osds(spec, description, auth_mode, args.force_wipe, print,
                         only={host.name})
        if fresh:
            print(f"{host.name}: {len(fresh)} OSDs started at weight 0")
        total = len(description["osds"])
        fleet.wait_for_osds(directory, total)
        ids, steps = [osd["id"] for osd in new], 0
        while True:
            status = fleet.wait_clean(directory, total, timeout_s=args.clean_timeout)
            cmap = fleet.cluster_status(directory)[1]
            weights = fleet.next_weights(cmap, ids, args.weight, args.step, args.max_misplaced)
            if weights is None:
                break
            moving = fleet.moved_fraction(cmap, weights)
            for osd_id, weight in weights.items():
                _cairn(directory, "osd", "weight", str(osd_id), f"{weight:.6f}")
            steps += 1
            print(f"step {steps}: {host.name}'s OSDs at weight {min(weights.values()):.3f} of "
                  f"{args.weight:g} ({moving:.1%} of PG copies move, under the recovery "
                  f"{fleet.budget_in_force(status)})"
                  + (f"; more than --max-misplaced {args.max_misplaced:g}, but the smallest "
                     "move there is: one PG copy is that large a share of this cluster"
                     if moving > args.max_misplaced else ""))
    except fleet.FleetError as exc:
        raise ClusterError(f"{exc} (run add-host again to go on from here)") from None
    print(f"{host.name} is in at weight {args.weight:g} after {steps} steps, "
          f"{time.monotonic() - started:.1f} s; the cluster is clean")
    return 0


def _join_host(args, spec, host, directory, description, auth_mode, devices):
    """Check the host and record an OSD at join weight 0, with its key, for each of `devices`
    (new to the cluster: a new host's, or devices added to a member's entry)."""
    ours = {(osd["host"], osd["device"]) for osd in description["osds"]}
    check = remote.check_host(host, spec.ssh_options, args.force_wipe, ours=ours)
    if check.problems:
        raise ClusterError("not added, nothing changed: " + "; ".join(check.problems))
    first = max((osd["id"] for osd in description["osds"]), default=-1) + 1
    new = [{"name": f"osd.{first + index}", "id": first + index, "host": host.name,
            "device": device.path, "size_bytes": device.size_bytes, "join_weight": 0.0}
           for index, device in enumerate(devices)]
    if auth_mode == "hmac":
        for osd in new:
            path = _keyring_path(directory, osd["name"])
            if not os.path.exists(path):
                _cairn(directory, "auth", "add", osd["name"], "--caps", "mon=rw", "--caps",
                       "osd=rw", "--keyring-out", path)
    description["osds"] += new
    if not any(entry["name"] == host.name for entry in description["hosts"]):
        description["hosts"].append({"name": host.name, "address": host.address,
                                     "location": host.location,
                                     "service_manager": check.service_manager})
    save(directory, description)


def _cairn(directory, *args):
    """Run `cairn --cluster DIR ARGS` as the administrator; ClusterError with its message."""
    result = subprocess.run(python_argv("cairn.client.cli", "--cluster", directory, *args),
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"cairn {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def fault(args):
    directory = os.path.abspath(args.dir)
    description = load(directory)
    isolation = description.get("isolation")
    if args.fault == "list":
        print(json.dumps(description.get("faults", [])) if args.json else
              "\n".join(json.dumps(f) for f in description.get("faults", [])) or "no faults")
        return 0
    if not isolation:
        raise ClusterError("faults need an isolated cluster ('cairn-cluster up --isolated', as "
                           "root): local mode shares one network and plain files")
    tag, hosts = isolation["tag"], isolation["hosts"]

    def host(name):
        if name not in hosts:
            raise ClusterError(f"no host {name!r} (hosts: {', '.join(hosts)})")
        return name

    try:
        if args.fault == "clear":
            count = clear_faults(description)
            message = f"cleared {count} faults"
        elif args.fault in ("loss", "partition"):
            if args.fault == "loss":
                groups = [[host(args.a)], [host(args.b)]]
                percent = args.percent
                if not 0 < percent <= 100:
                    raise ClusterError(f"--percent must be within 0..100 (was {percent})")
            else:
                groups = [[host(h) for h in group.split(",") if h] for group in (args.a, args.b)]
                percent = 100
            for left in groups[0]:
                for right in groups[1]:
                    isolated.drop_between(tag, left, hosts[right], percent)
                    isolated.drop_between(tag, right, hosts[left], percent)
            description["faults"].append({"kind": args.fault, "groups": groups,
                                          "percent": percent})
            message = (f"dropping {percent:g}% of packets between {', '.join(groups[0])} and "
                       f"{', '.join(groups[1])}")
        elif args.fault == "throttle":
            entry = find(description, args.a)
            if not entry["name"].startswith("osd.") or not is_ours(entry.get("pid"), directory):
                raise ClusterError(f"{args.a} is not a running OSD")
            cgroup = isolated.throttle(tag, entry["name"], entry["pid"], entry["device"],
                                       args.bps)
            description["faults"].append({"kind": "throttle", "osd": entry["name"],
                                          "device": entry["device"], "cgroup": cgroup,
                                          "bytes_per_s": args.bps})
            message = (f"throttled {entry['name']} ({entry['device']}) to "
                       f"{format_size(args.bps)}/s reads and writes")
        else:
            raise ClusterError(f"unknown fault {args.fault!r}")
    except isolated.IsolationError as exc:
        raise ClusterError(str(exc)) from None
    finally:
        save(directory, description)
    print(message)
    return 0


# -- command line ---------------------------------------------------------------------------------

def validate(args):
    """`cairn-cluster validate HOSTS`: the file, then each machine over ssh."""
    say = (lambda message: print(message, file=sys.stderr)) if args.json else print
    try:
        spec = hosts.load(args.hosts_file)
    except hosts.HostsError as exc:
        raise ClusterError(str(exc)) from None
    devices = sum(len(host.devices) for host in spec.hosts)
    say(f"{args.hosts_file}: {len(spec.hosts)} hosts, {len(spec.monitors)} monitors "
        f"({', '.join(h.name for h in spec.monitors)}), {devices} devices")
    checks = []
    if not args.offline:
        def shown(check):
            mark = "ok" if not check.problems else f"{len(check.problems)} problem(s)"
            devices_seen = ", ".join(f"{d.path} ({d.kind}"
                                     f"{', ' + format_size(d.size_bytes) if d.size_bytes else ''}"
                                     f"{', holds ' + d.holds if d.holds else ''})"
                                     for d in check.devices)
            managed = f", daemons under {check.service_manager}" if check.service_manager else ""
            say(f"  {check.name} ({check.address}): {mark}{managed}"
                + (f": {devices_seen}" if devices_seen else ""))
            for problem in check.problems:
                say(f"    - {problem}")
        checks = remote.validate(spec, force_wipe=args.force_wipe, progress=shown)
    problems = [problem for check in checks for problem in check.problems]
    if args.json:
        print(json.dumps({"hosts_file": args.hosts_file, "hosts": len(spec.hosts),
                          "checked": [check.to_json() for check in checks],
                          "ok": not problems}))
    if problems:
        say(f"not usable: {len(problems)} problem(s) above")
        return 1
    say("ok: the file is valid" + ("" if args.offline else " and every host and device is "
                                   "ready"))
    return 0


COMMANDS = {"up": up, "down": down, "status": status, "kill": kill, "restart": restart,
            "fault": fault, "demo": lambda args: demo.demo(args), "bench-auth": bench_auth.main,
            "validate": validate, "upgrade": upgrade, "add-host": add_host}


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ClusterError as exc:
        print(f"cairn-cluster {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"cairn-cluster {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"cairn-cluster {args.command}: error: {' '.join(exc.cmd)} failed with status "
              f"{exc.returncode}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
