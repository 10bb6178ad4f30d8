"""Bring-up over ssh against real sshd daemons: each "machine" is a network namespace on its own
bridge, running its own OpenSSH server on its own address with a test key (as root). The
commands under test run the plain ssh client against those addresses, exactly as against real
machines; the namespaces share this machine's filesystem, so file devices stand in for disks.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from cairn.cluster import isolated

pytestmark = pytest.mark.faults

SSHD = "/usr/sbin/sshd"
SSHD_READY_S = 10.0


def _missing():
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        return "needs openssh-server and openssh-client (bash cluster-scripts/setup.sh)"
    if not shutil.which("ip"):
        return "needs iproute2"
    return None


def sshd_config(ip, folder, extra=""):
    """An sshd listening on `ip`:22 for root with the key in FOLDER/authorized_keys only."""
    return (f"ListenAddress {ip}\nPort 22\nHostKey {folder}/host_key\n"
            f"AuthorizedKeysFile {folder}/authorized_keys\n{extra}"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n")


def wait_for_ssh(ip, process, timeout_s, failure):
    """Until `ip`:22 takes connections; AssertionError(failure) if `process` ends first or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((ip, 22), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(failure) from None
            time.sleep(0.1)


class Machines:
    """Namespaces h1..hN, each with an sshd on 10.231.X.(K+1):22 accepting `self.key`."""

    def __init__(self, directory, count):
        self.dir = directory
        self.tag, self.octet = isolated.choose_network(directory)
        self.names = {f"h{i}": isolated.host_ip(self.octet, i) for i in range(1, count + 1)}
        self.pids = {}
        self.key = os.path.join(directory, "client_key")

    def start(self):
        isolated.create_network(self.tag, self.octet, self.names, 1500)
        os.makedirs("/run/sshd", exist_ok=True)        # sshd's privilege-separation folder
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key],
                       check=True)
        host_key = os.path.join(self.dir, "host_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key],
                       check=True)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        for host in self.names:
            self.start_sshd(host)

    def start_sshd(self, host):
        ip = self.names[host]
        config = os.path.join(self.dir, f"sshd-{host}.conf")
        with open(config, "w") as handle:
            handle.write(sshd_config(ip, self.dir, f"PidFile {self.dir}/sshd-{host}.pid\n"))
        process = subprocess.Popen(
            isolated.exec_prefix(self.tag, host) + [SSHD, "-D", "-e", "-f", config],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, f"sshd-{host}.log"),
                                                   "ab"), start_new_session=True)
        self.pids[host] = process.pid
        wait_for_ssh(ip, process, SSHD_READY_S, f"sshd on {host} ({ip}) did not start")

    def stop_sshd(self, host):
        pid = self.pids.pop(host, None)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def stop(self):
        for host in list(self.pids):
            self.stop_sshd(host)
        isolated.destroy_network(self.tag, self.names)

    def hosts_file(self, hosts, path=None, install_dir=None, data_root=None):
        """A hosts file naming `hosts` {name: {"mon": bool, "devices": [...]}} by address; the
        machines share this filesystem, so each gets its own data folder under `data_root`."""
        lines = ["[cluster]", 'user = "root"', f'identity = "{self.key}"',
                 'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", '
                 '"UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]']
        if install_dir:
            lines.append(f'install_dir = "{install_dir}"')
        lines.append("")
        for name, spec in hosts.items():
            lines += ["[[host]]", f'name = "{name}"', f'address = "{self.names[name]}"',
                      *([f'data_dir = "{data_root}/{name}"'] if data_root else []),
                      f'location = {{ rack = "r{name[1:]}" }}',
                      f"mon = {'true' if spec.get('mon') else 'false'}",
                      "devices = [" + ", ".join(
                          f'{{ path = "{d}", size = "1G" }}' if not d.startswith("/dev/")
                          else f'"{d}"' for d in spec.get("devices", [])) + "]", ""]
        path = path or os.path.join(self.dir, "hosts.toml")
        with open(path, "w") as handle:
            handle.write("\n".join(lines))
        return path


# A machine that runs systemd: systemd-nspawn boots this machine's own OS as a container, on a
# copy-on-write overlay of / (the upper layer in memory, gone with the container), in the
# machine's network namespace, with its own sshd as a unit. Nothing it does reaches this
# machine's files or services: its /etc/systemd/system starts empty (this machine's enabled
# services stay off), nspawn keeps /sys and /proc/sys read-only and drops the capabilities
# that would load modules or set sysctls. Its disks folder is bound from the test's tmp_path.
_BOOT = r"""
set -e
base=$1 ns=$2 name=$3 conf=$4 disks=$5
mount --make-rprivate /
mkdir -p "$base/layer" "$base/root"
mount -t tmpfs tmpfs "$base/layer"
mkdir "$base/layer/upper" "$base/layer/work"
mount -t overlay overlay \
  -o "lowerdir=/,upperdir=$base/layer/upper,workdir=$base/layer/work" "$base/root"
root=$base/root units=$base/root/etc/systemd/system
rm -rf "$units"/*
mkdir -p "$units/multi-user.target.wants" "$root/etc/cairn-test-ssh" "$root/var/lib/cairn-disks"
cp "$conf"/* "$root/etc/cairn-test-ssh/"
printf '%s\n' '[Service]' 'RuntimeDirectory=sshd' \
  'ExecStart=/usr/sbin/sshd -D -e -f /etc/cairn-test-ssh/sshd.conf' \
  '[Install]' 'WantedBy=multi-user.target' > "$units/cairn-test-sshd.service"
ln -s ../cairn-test-sshd.service "$units/multi-user.target.wants/"
# nspawn makes its cgroups below its own: each container gets a group of its own.
for tree in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
  if [ -f "$tree/cgroup.procs" ]; then
    mkdir -p "$tree/$name" && echo $$ > "$tree/$name/cgroup.procs"
  fi
done
exec systemd-nspawn -q -D "$root" --register=no --keep-unit --boot -M "$name" \
  --network-namespace-path="/run/netns/$ns" --console=passive \
  --bind="$disks:/var/lib/cairn-disks"
"""
SYSTEMD_BOOT_S = 60.0


def _systemd_missing():
    if not shutil.which("systemd-nspawn") or not os.path.exists("/lib/systemd/systemd"):
        return "needs systemd and systemd-nspawn (systemd-container; cluster-scripts/setup.sh)"
    if not os.path.isfile("/sys/fs/cgroup/systemd/cgroup.procs"):
        return ("the systemd machines are made for a hybrid cgroup layout "
                "(/sys/fs/cgroup/systemd); this machine has another")
    return None


class SystemdMachines(Machines):
    """Like Machines, but each machine boots systemd (see _BOOT) and its sshd is a unit there;
    DISKS/hN on this machine is /var/lib/cairn-disks on machine hN."""

    def start_sshd(self, host):
        ip = self.names[host]
        conf = os.path.join(self.dir, f"ssh-{host}")
        os.makedirs(conf, exist_ok=True)
        for name in ("host_key", "authorized_keys"):
            shutil.copy(os.path.join(self.dir, name), conf)
        with open(os.path.join(conf, "sshd.conf"), "w") as handle:
            handle.write(sshd_config(ip, "/etc/cairn-test-ssh"))
        disks = self.disks(host)
        os.makedirs(disks, exist_ok=True)
        base = os.path.join(self.dir, f"machine-{host}")
        name = f"{self.tag}-{host}"
        process = subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", _BOOT, "boot", base,
             isolated.namespace(self.tag, host), name, conf, disks],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, f"machine-{host}.log"), "ab"),
            start_new_session=True)
        self.pids[host] = process.pid
        wait_for_ssh(ip, process, SYSTEMD_BOOT_S, f"machine {host} ({ip}) did not boot: see "
                     f"{self.dir}/machine-{host}.log")

    def disks(self, host):
        return os.path.join(self.dir, "disks", host)

    def stop_sshd(self, host):
        """Power the machine off (SIGTERM to nspawn halts it); its init killed if it lingers,
        which ends every process in it; its cgroups removed."""
        pid = self.pids.pop(host, None)
        if pid is None:
            return
        leaders = _children(pid)
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while not os.waitpid(pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    for leader in leaders:
                        _kill(leader)
                    _kill(pid)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.1)
        except ChildProcessError:
            pass
        name = f"{self.tag}-{host}"
        for tree in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
            top = os.path.join(tree, name)
            for folder, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass

    def ssh(self, host, command, check=True):
        """Run `command` on machine `host` over ssh as root; its stdout."""
        done = subprocess.run(
            ["ssh", "-i", self.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             f"root@{self.names[host]}", command], capture_output=True, text=True, timeout=60)
        assert not check or done.returncode == 0, (command, done.stdout, done.stderr)
        return done.stdout


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def machines(tmp_path):
    """`machines(count)`: that many namespaces with a running sshd each; all stopped (by pid)
    and removed afterwards, even on failure."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    made = []

    def make(count, systemd=False):
        if systemd and _systemd_missing():
            pytest.skip(_systemd_missing())
        group = (SystemdMachines if systemd else Machines)(str(tmp_path), count)
        made.append(group)
        group.start()
        return group
    yield make
    for group in made:
        group.stop()


def cluster_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "cairn.cluster.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_validate_checks_hosts_and_devices_over_ssh_and_names_each_problem(machines, tmp_path):
    group = machines(4)
    disks = tmp_path / "disks"
    for host in ("h1", "h2", "h3", "h4"):
        (disks / host).mkdir(parents=True)
    used = disks / "h2" / "osd0.img"                   # another cluster's OSD store
    used.write_bytes(b"CAIRNOSD" + bytes(4088))
    spec = {"h1": {"mon": True, "devices": [str(disks / "h1" / "osd0.img")]},
            "h2": {"mon": True, "devices": [str(used)]},
            "h3": {"mon": True, "devices": ["/dev/cairn-no-such-disk",
                                            str(disks / "nowhere" / "osd0.img")]},
            "h4": {"devices": [str(disks / "h4" / "osd0.img")]}}
    path = group.hosts_file(spec)
    group.stop_sshd("h4")
    done = cluster_cli("validate", path, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    by_name = {check["name"]: check for check in report["checked"]}
    assert report["ok"] is False and set(by_name) == {"h1", "h2", "h3", "h4"}
    assert by_name["h1"]["reachable"] and by_name["h1"]["problems"] == []
    assert by_name["h1"]["devices"][0]["kind"] == "absent"        # made by `up`
    assert by_name["h2"]["devices"][0]["holds"] == "a cairn OSD store"
    assert "never overwritten without --force-wipe" in by_name["h2"]["problems"][0]
    assert any("/dev/cairn-no-such-disk does not exist" in p for p in by_name["h3"]["problems"])
    assert any("its folder does not exist" in p for p in by_name["h3"]["problems"])
    assert not by_name["h4"]["reachable"]
    assert f"host h4 ({group.names['h4']}): ssh: ssh to root@{group.names['h4']}:22 failed" \
        in by_name["h4"]["problems"][0]
    assert used.read_bytes()[:8] == b"CAIRNOSD"                    # nothing was touched
    # Mended (h3's devices fixed, h4 back, h2 allowed to be wiped): valid.
    spec["h3"]["devices"] = [str(disks / "h3" / "osd0.img")]
    group.hosts_file(spec)
    group.start_sshd("h4")
    done = cluster_cli("validate", path, "--force-wipe")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every host and device is ready" in done.stdout
    assert "h2 (" in done.stdout and "holds a cairn OSD store" in done.stdout


class ClientLoad:
    """A client writing and reading objects in a thread while the cluster is changed: reads
    are checked against what was written (or may have been: writes that failed), misplaced
    object shares and PG_UNAVAILABLE are sampled from the monitors' status."""

    def __init__(self, directory):
        import threading
        self.directory = directory
        self.stop = threading.Event()
        self.seen = {"ops": 0, "failed": 0, "unavailable": [], "wrong": [], "misplaced": []}
        self.thread = threading.Thread(target=self._run)

    def __enter__(self):
        self.thread.start()
        time.sleep(2)
        return self.seen

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=180)
        assert not self.thread.is_alive(), "the client load did not stop"

    def _run(self):
        import asyncio
        asyncio.run(self._load())

    async def _load(self):
        import random
        from cairn.client import errors
        from cairn.client.cluster import Cluster
        rng, seen = random.Random(18), self.seen
        acked, maybe = {}, {}
        async with await Cluster.connect(self.directory, op_timeout_s=30) as cluster:
            pool = cluster.pool("data")
            while not self.stop.is_set():
                name = f"load-{rng.randrange(40)}"
                if rng.random() < 0.6:
                    value = os.urandom(rng.choice([10, 5000, 70000]))
                    try:
                        await pool.put(name, value)
                        acked[name], maybe[name] = value, set()
                    except (errors.Timeout, errors.PoolUnavailable):
                        maybe.setdefault(name, set()).add(value)
                        seen["failed"] += 1
                elif name in acked:
                    try:
                        got = await pool.get(name)
                    except (errors.Timeout, errors.DataUnavailable):
                        seen["failed"] += 1
                        continue
                    if got != acked[name] and got not in maybe.get(name, ()):
                        seen["wrong"].append(name)
                seen["ops"] += 1
                status = (await cluster.monc.request({"op": "status"})).header
                if "PG_UNAVAILABLE" in status["checks"]:
                    seen["unavailable"].append(status["checks"]["PG_UNAVAILABLE"])
                objects = status["objects"]
                if objects.get("total"):
                    seen["misplaced"].append(objects.get("misplaced", 0) / objects["total"])
            for name, value in acked.items():
                got = await pool.get(name)
                if got != value and got not in maybe.get(name, ()):
                    seen["wrong"].append(name)


def pid_files(directory):
    return {p.name: p.read_text() for p in (tmp_path_of(directory) / "data").glob("*/run/*.pid")}


def rolling_restart_under_load(directory, path):
    """`restart --hosts-file` while a client writes and reads: every host's daemons restart
    in turn (new pids), no read returns a value that was not written, every acknowledged write
    reads back at the end, and no PG went below min_size (PG_UNAVAILABLE never raised)."""
    with ClientLoad(directory) as seen:
        before = pid_files(directory)
        started = time.monotonic()
        done = cluster_cli("restart", "--hosts-file", path, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        print(f"rolling restart of 4 hosts under load: {time.monotonic() - started:.1f} s")
        after = pid_files(directory)
        assert set(after) == set(before) and all(after[n] != before[n] for n in before)
        assert done.stdout.count("restarted, cluster clean again") == 4
    assert seen["ops"] > 50 and not seen["wrong"] and not seen["unavailable"], seen


def add_host_under_load(directory, group, spec, tmp_path):
    """`add-host HOSTS h5` while a client writes and reads: h5's OSD joins at weight 0 and
    reaches 1.0 in several steps, each planned to move at most 5% of the PG copies (the
    contract of --max-misplaced), the misplaced share of objects sampled from the monitors
    stays near that, no read is wrong, and the cluster ends clean."""
    spec = dict(spec, h5={"devices": [str(tmp_path / "disks" / "h5" / "osd0.img")]})
    (tmp_path / "disks" / "h5").mkdir(parents=True)
    path = group.hosts_file(spec, install_dir=str(tmp_path / "opt"),
                            data_root=str(tmp_path / "data"))
    with ClientLoad(directory) as seen:
        started = time.monotonic()
        done = cluster_cli("add-host", path, "h5", "--dir", directory, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        print(f"add-host under load: {time.monotonic() - started:.1f} s, "
              f"{done.stdout.count('step ')} steps")
    assert "h5: 1 OSDs started at weight 0" in done.stdout
    assert done.stdout.count("step ") >= 3 and "is in at weight 1 after" in done.stdout
    assert seen["ops"] > 50 and not seen["wrong"] and not seen["unavailable"], seen
    planned = [float(share) / 100 for share in
               re.findall(r"\(([0-9.]+)% of PG copies move", done.stdout)]
    assert planned and max(planned) <= 0.05, done.stdout
    # The monitors count objects, not PG copies: with the ~60 objects here a PG copy holds 0 to
    # 5 of them, so a step within 5% of the copies moved up to 6.1% of the objects once in CI
    # (11 of 180). Raising h5 to full weight at once would move about a fifth of them.
    assert max(seen["misplaced"]) <= 0.08, sorted(seen["misplaced"])[-5:]
    tree = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                           "--json", "osd", "tree"], capture_output=True, text=True, timeout=60)
    osds = json.loads(tree.stdout.strip().splitlines()[-1])["osds"]
    assert len(osds) == 5 and all(o["weight"] == 1.0 and o["up"] for o in osds), osds
    return path


def tmp_path_of(directory):
    from pathlib import Path
    return Path(directory).parent


def test_up_over_ssh_then_up_again_rolling_restart_upgrade_and_add_host_lose_nothing(
        machines, tmp_path):
    """`up --hosts-file` on four ssh machines (three monitors): a host that cannot be reached
    stops it before anything is touched, naming the host; then wheels are shipped and
    installed (once: the machines share one install folder, as an NFS /opt would), monitors
    and OSDs start under the supervisor, objects go in and come back through the cluster
    directory; `status` sees every daemon; `up` again installs and starts nothing; a rolling
    restart under a client load and an upgrade lose nothing; a fifth machine is added under
    load in steps; `down` stops them all."""
    import asyncio
    from cairn.client.cluster import Cluster
    group = machines(5)
    disks = tmp_path / "disks"
    spec = {name: {"mon": name != "h4", "devices": [str(disks / name / "osd0.img")]}
            for name in ("h1", "h2", "h3", "h4")}
    for name in spec:
        (disks / name).mkdir(parents=True)
    path = group.hosts_file(spec, install_dir=str(tmp_path / "opt"),
                            data_root=str(tmp_path / "data"))
    directory = str(tmp_path / "hosts.cluster")
    group.stop_sshd("h3")
    refused = cluster_cli("up", "--hosts-file", path, timeout=300)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "nothing changed" in refused.stderr and f"host h3 ({group.names['h3']})" in \
        refused.stderr
    assert not (tmp_path / "opt").exists() and not (tmp_path / "data").exists()
    group.start_sshd("h3")
    try:
        started = time.monotonic()
        done = cluster_cli("up", "--hosts-file", path, "--json", timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        first = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"up over ssh, 4 hosts: {time.monotonic() - started:.1f} s")
        assert first["dir"] == directory and first["osds"] == 4 and first["installed"] == 1
        assert len(first["mons"]) == 3

        made = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                               "pool", "create", "data", "--replicated", "3", "--pg-num", "16"],
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr

        async def store_and_read():
            async with await Cluster.connect(directory) as cluster:
                pool = cluster.pool("data")
                blobs = {f"obj-{i}": os.urandom(1000 * i + 1) for i in range(20)}
                await asyncio.gather(*(pool.put(n, b) for n, b in blobs.items()))
                for name, blob in blobs.items():
                    assert await pool.get(name) == blob
        asyncio.run(store_and_read())
        shown = cluster_cli("status", "--hosts-file", path, "--json")
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout.strip().splitlines()[-1])
        assert all(row["running"] for row in status["daemons"]) and len(status["daemons"]) == 7
        assert status["osds"]["up"] == 4
        pids = pid_files(directory)
        again = cluster_cli("up", "--hosts-file", path, "--json", timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout.strip().splitlines()[-1])["installed"] == 0
        assert pid_files(directory) == pids
        rolling_restart_under_load(directory, path)
        upgraded = cluster_cli("upgrade", "--hosts-file", path, timeout=900)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        build = upgraded.stdout.split("upgrading to build ")[1].split(",")[0]
        assert (tmp_path / "opt" / "installed").read_text().strip() == build
        assert upgraded.stdout.count("upgraded, cluster clean again") == 4

        async def read_back():
            async with await Cluster.connect(directory) as cluster:
                for i in range(20):
                    assert len(await cluster.pool("data").get(f"obj-{i}")) == 1000 * i + 1
        asyncio.run(read_back())
        path = add_host_under_load(directory, group, spec, tmp_path)
        asyncio.run(read_back())
    finally:
        stopped = cluster_cli("down", "--hosts-file", path, timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not list((tmp_path / "data").glob("*/run/*.pid"))


def test_up_on_machines_running_systemd_makes_units_that_restart_and_log_to_the_journal(
        machines, tmp_path):
    """Where systemd runs, `up` makes each daemon an enabled unit: a SIGKILLed OSD is started
    again by systemd (the cluster heals and objects read back), the daemon's output is in the
    journal, `status` names the units' logs, `restart` restarts the units host by host, a disk
    added to a host's entry comes in through add-host in steps, `down` stops and disables the
    units and `down --purge` removes the unit files."""
    import asyncio
    from cairn.client.cluster import Cluster
    group = machines(2, systemd=True)
    device = "/var/lib/cairn-disks/osd0.img"
    path = group.hosts_file({"h1": {"mon": True, "devices": [device]},
                             "h2": {"devices": [device]}})
    checked = cluster_cli("validate", path, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert [c["service_manager"] for c in report["checked"]] == ["systemd", "systemd"]
    assert "daemons under systemd" in checked.stderr
    directory = str(tmp_path / "hosts.cluster")
    purged = None
    try:
        # h2 lacks ISA-L (hidden, and its package cannot be fetched: no network there): `up`
        # installs h1, then stops at h2 naming the host, the step and what is missing.
        libs = "/lib/x86_64-linux-gnu"
        group.ssh("h2", f"mkdir -p /root/hidden && mv {libs}/libisal.so.2* /root/hidden/ && "
                  "ldconfig")
        started = time.monotonic()
        failed = cluster_cli("up", "--hosts-file", path, timeout=900)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        print(failed.stderr.strip().splitlines()[-1])
        assert f"host h2 ({group.names['h2']}): system packages: " in failed.stderr
        assert "ISA-L (libisal.so.2)" in failed.stderr, failed.stderr
        assert "cairn installed" not in failed.stdout
        group.ssh("h2", f"mv /root/hidden/libisal.so.2* {libs}/ && ldconfig")
        done = cluster_cli("up", "--hosts-file", path, "--json", timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["installed"] == 1   # h2 only
        print(f"up over ssh, 2 systemd hosts (one failing first): "
              f"{time.monotonic() - started:.1f} s")
        with open(os.path.join(directory, "cluster.json")) as handle:
            fsid = json.load(handle)["fsid"]
        unit = f"cairn-{fsid[:8]}-osd.1.service"
        assert group.ssh("h2", f"systemctl is-enabled {unit}").strip() == "enabled"
        assert "Restart=on-failure" in group.ssh("h2", f"systemctl cat {unit}")
        assert group.ssh("h1", f"systemctl is-active cairn-{fsid[:8]}-mon.0.service").strip() \
            == "active"
        assert os.path.getsize(os.path.join(group.disks("h2"), "osd0.img")) == 1 << 30
        made = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                               "pool", "create", "data", "--replicated", "2", "--pg-num", "8"],
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        blobs = {f"obj-{i}": os.urandom(3000 * i + 1) for i in range(12)}

        async def store(check_only=False):
            async with await Cluster.connect(directory, op_timeout_s=60) as cluster:
                pool = cluster.pool("data")
                if not check_only:
                    await asyncio.gather(*(pool.put(n, b) for n, b in blobs.items()))
                for name, blob in blobs.items():
                    assert await pool.get(name) == blob
        asyncio.run(store())

        def unit_state():
            shown = group.ssh("h2", f"systemctl show -p MainPID,NRestarts,ActiveState {unit}")
            return dict(line.split("=", 1) for line in shown.split())
        killed = int(unit_state()["MainPID"])
        group.ssh("h2", f"kill -9 {killed}")
        deadline = time.monotonic() + 60
        while not (unit_state()["ActiveState"] == "active" and int(unit_state()["NRestarts"]) >= 1
                   and int(unit_state()["MainPID"]) not in (0, killed)):
            assert time.monotonic() < deadline, unit_state()
            time.sleep(0.5)
        status = None
        while status is None or status["osds"].get("up") != 2:
            assert time.monotonic() < deadline + 60, status
            time.sleep(0.5)
            shown = cluster_cli("status", "--hosts-file", path, "--json")
            assert shown.returncode == 0, shown.stderr
            status = json.loads(shown.stdout.strip().splitlines()[-1])
        asyncio.run(store(check_only=True))
        assert all(row["running"] and row["service_manager"] == "systemd"
                   for row in status["daemons"]) and len(status["daemons"]) == 3
        assert {row["logs"] for row in status["daemons"] if row["name"] == "osd.1"} == \
            {f"journalctl -u {unit}"}
        journal = group.ssh("h2", f"journalctl -u {unit} --no-pager -o cat")
        assert journal.count(f"Started {unit}") >= 2, journal[-2000:]
        assert "osd.1 INFO" in journal, journal[-2000:]

        before = {name: unit_state()["MainPID"] for name in ("osd.1",)}
        restarted = cluster_cli("restart", "--hosts-file", path, timeout=600)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert restarted.stdout.count("restarted, cluster clean again") == 2
        assert unit_state()["MainPID"] != before["osd.1"]
        asyncio.run(store(check_only=True))

        # A second disk in h2's entry: `up` refuses it (it would take data all at once) and
        # names add-host, which brings it in at weight 0 and raises it in steps.
        group.hosts_file({"h1": {"mon": True, "devices": [device]},
                          "h2": {"devices": [device, "/var/lib/cairn-disks/osd1.img"]}})
        refused = cluster_cli("up", "--hosts-file", path, timeout=120)
        assert refused.returncode == 1 and "nothing changed" in refused.stderr
        assert f"h2:/var/lib/cairn-disks/osd1.img" in refused.stderr
        assert f"cairn-cluster add-host {path} HOST' for h2" in refused.stderr
        grown = cluster_cli("add-host", path, "h2", "--dir", directory, "--step", "0.5",
                            timeout=600)
        assert grown.returncode == 0, grown.stdout + grown.stderr
        print(grown.stdout)
        assert "h2: 1 OSDs started at weight 0" in grown.stdout
        assert "h2 is in at weight 1 after" in grown.stdout, grown.stdout
        # 8 PGs of size 2: one copy is 6.25% of them, so steps move one copy at a time.
        assert 2 <= grown.stdout.count("step ") <= 8, grown.stdout
        assert "the smallest move there is" in grown.stdout, grown.stdout
        assert group.ssh("h2", f"systemctl is-active cairn-{fsid[:8]}-osd.2.service").strip() \
            == "active"
        tree = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                               "--json", "osd", "tree"], capture_output=True, text=True,
                              timeout=60)
        osds = json.loads(tree.stdout.strip().splitlines()[-1])["osds"]
        assert len(osds) == 3 and all(o["weight"] == 1.0 and o["up"] for o in osds), osds
        again = cluster_cli("add-host", path, "h2", "--dir", directory, timeout=300)
        assert again.returncode == 0 and "after 0 steps" in again.stdout, again.stdout
        asyncio.run(store(check_only=True))
    finally:
        stopped = cluster_cli("down", "--hosts-file", path, timeout=300)
        if stopped.returncode == 0:
            purged = cluster_cli("down", "--hosts-file", path, "--purge", timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert group.ssh("h2", f"systemctl is-active {unit}", check=False).strip() == "inactive"
    assert group.ssh("h2", f"ls /etc/systemd/system/{unit}", check=False) == ""
    assert not os.path.exists(os.path.join(group.disks("h2"), "osd0.img"))
