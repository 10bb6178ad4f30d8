"""Bring-up over ssh against real sshd daemons: each "machine" is a network namespace on its own
bridge, running its own OpenSSH server on its own address with a test key (as root). The
commands under test run the plain ssh client against those addresses, exactly as against real
machines; the namespaces share this machine's filesystem, so file devices stand in for disks.
"""

import json
import os
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
            handle.write(f"ListenAddress {ip}\nPort 22\n"
                         f"HostKey {self.dir}/host_key\n"
                         f"PidFile {self.dir}/sshd-{host}.pid\n"
                         f"AuthorizedKeysFile {self.dir}/authorized_keys\n"
                         "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                         "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                         "LogLevel ERROR\n")
        process = subprocess.Popen(
            isolated.exec_prefix(self.tag, host) + [SSHD, "-D", "-e", "-f", config],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, f"sshd-{host}.log"),
                                                   "ab"), start_new_session=True)
        self.pids[host] = process.pid
        deadline = time.monotonic() + SSHD_READY_S
        while True:
            try:
                socket.create_connection((ip, 22), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError(f"sshd on {host} ({ip}) did not start")
                time.sleep(0.05)

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


@pytest.fixture
def machines(tmp_path):
    """`machines(count)`: that many namespaces with a running sshd each; all stopped (by pid)
    and removed afterwards, even on failure."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    made = []

    def make(count):
        group = Machines(str(tmp_path), count)
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
    reaches 1.0 in several steps, the misplaced share sampled from the monitors never passes
    the 5% limit, no read is wrong, and the cluster ends clean."""
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
    assert max(seen["misplaced"]) <= 0.05, sorted(seen["misplaced"])[-5:]
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
