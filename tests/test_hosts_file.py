"""The hosts file of `cairn-cluster validate|up --hosts-file` (cluster-scripts/hosts.py): what a
valid one gives, and that every mistake in a bad one is named at once."""

import json
import subprocess
import sys

import pytest

from cairn.cluster import hosts

pytestmark = pytest.mark.unit

EXAMPLE = """
[cluster]
user = "cairn"
sudo = true
identity = "/root/.ssh/id_ed25519"
ssh_options = ["-o", "ConnectTimeout=3"]

[[host]]
name = "store1"
address = "10.0.0.11"
location = { rack = "r1", room = "a" }
mon = true
devices = ["/dev/nvme0n1", "/dev/nvme1n1"]

[[host]]
name = "store2"
address = "10.0.0.12"
location = { rack = "r2" }
devices = [{ path = "/srv/cairn/osd0.img", size = "64G" }]
user = "root"
sudo = false
port = 2222
service_manager = "supervise"
"""


def write(tmp_path, text):
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return str(path)


def test_a_valid_hosts_file_gives_hosts_with_defaults_and_overrides(tmp_path):
    spec = hosts.load(write(tmp_path, EXAMPLE))
    first, second = spec.hosts
    assert (first.name, first.address, first.user, first.sudo, first.port) == \
        ("store1", "10.0.0.11", "cairn", True, 22)
    assert first.location == {"rack": "r1", "room": "a"} and first.mon
    assert [d.path for d in first.devices] == ["/dev/nvme0n1", "/dev/nvme1n1"]
    assert not any(d.is_file for d in first.devices)
    assert (second.user, second.sudo, second.port, second.mon) == ("root", False, 2222, False)
    assert second.devices[0].is_file and second.devices[0].size_bytes == 64 << 30
    assert second.identity == "/root/.ssh/id_ed25519"
    assert spec.monitors == (first,) and spec.ssh_options == ("-o", "ConnectTimeout=3")
    assert (spec.install_dir, spec.data_dir) == ("/opt/cairn", "/var/lib/cairn")
    assert (first.service_manager, second.service_manager) == ("auto", "supervise")


def test_a_bad_hosts_file_names_every_problem_at_once(tmp_path):
    bad = """
[cluster]
colour = "blue"
port = 70000

[[host]]
name = "a"
address = "10.0.0.1:22"
mon = true
devices = ["relative/path", "/srv/x.img", "/dev/sdb", "/dev/sdb"]
speed = 3

[[host]]
name = "a"
address = "10.0.0.2"
mon = true
location = { shelf = "s1" }
devices = [{ path = "/srv/y.img", size = "1M" }]

[[host]]
name = "c"
address = "10.0.0.2"
mon = "yes"
service_manager = "runit"
"""
    with pytest.raises(hosts.HostsError) as caught:
        hosts.load(write(tmp_path, bad))
    message = str(caught.value)
    for expected in ("unknown keys ['colour']", "port must be 1-65535 (was 70000)",
                     "must not carry a port", "device path must be absolute",
                     "/srv/x.img is not under /dev: a file device needs a size",
                     "duplicate device on host a '/dev/sdb'", "unknown keys ['speed']",
                     "duplicate host name 'a'", "duplicate host address '10.0.0.2'",
                     "location is a table of rack", "below the 256M minimum",
                     "mon must be true or false", "a cluster needs 1, 3 or 5 monitors",
                     "service_manager must be one of auto, systemd, supervise (was 'runit')"):
        assert expected in message, (expected, message)


def test_hosts_file_syntax_and_emptiness_are_refused_clearly(tmp_path):
    with pytest.raises(hosts.HostsError, match="not valid TOML"):
        hosts.load(write(tmp_path, "[[host]\nname = 1"))
    with pytest.raises(hosts.HostsError, match="no hosts: add a"):
        hosts.load(write(tmp_path, "[cluster]\nuser = 'x'\n"))
    with pytest.raises(hosts.HostsError, match="no hosts file at"):
        hosts.load(str(tmp_path / "missing.toml"))
    with pytest.raises(hosts.HostsError, match="no host lists devices"):
        hosts.load(write(tmp_path, "[[host]]\nname = 'a'\naddress = 'x'\nmon = true\n"))


def test_validate_offline_checks_the_hosts_file_only(tmp_path):
    def validate(*args):
        return subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "validate", *args],
                              capture_output=True, text=True, timeout=60)
    good = validate(write(tmp_path, EXAMPLE), "--offline", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout.strip().splitlines()[-1])["ok"] is True
    assert "2 hosts, 1 monitors (store1), 3 devices" in good.stderr
    bad = validate(write(tmp_path, EXAMPLE.replace('name = "store2"', 'name = "store1"')),
                   "--offline")
    assert bad.returncode == 1 and "duplicate host name 'store1'" in bad.stderr


def test_any_hosts_file_content_is_read_or_refused_with_a_clear_message():
    """Whatever a hosts file holds (wrong types anywhere, odd names, empty tables), parsing
    gives a HostsFile or a HostsError with a message: never another exception."""
    from hypothesis import given, settings, strategies as st
    keys = st.sampled_from(sorted(hosts.CLUSTER_KEYS | hosts.HOST_KEYS | hosts.DEVICE_KEYS
                                  | {"host", "cluster", "rack", "x"}))
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000),
                        st.text(max_size=12), st.sampled_from(["/dev/sda", "/srv/a.img", "1G",
                                                              "10.0.0.1", "h1"]))
    values = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(["cluster", "host", "other"]), values, max_size=3))
    def check(raw):
        try:
            parsed = hosts.parse(raw)
        except hosts.HostsError as exc:
            assert str(exc)
        else:
            assert parsed.hosts and len(parsed.monitors) in hosts.MONITOR_COUNTS
    check()


def test_the_service_manager_is_systemd_only_where_it_runs_and_units_may_be_written():
    from cairn.cluster import remote
    spec = hosts.parse({"host": [
        {"name": "a", "address": "10.0.0.1", "mon": True, "devices": ["/dev/sdb"]},
        {"name": "b", "address": "10.0.0.2", "user": "cairn"},
        {"name": "c", "address": "10.0.0.3", "user": "cairn", "sudo": True,
         "service_manager": "systemd"},
        {"name": "d", "address": "10.0.0.4", "user": "cairn", "service_manager": "systemd"},
        {"name": "e", "address": "10.0.0.5", "service_manager": "supervise"}]})
    a, b, c, d, e = spec.hosts
    assert remote.service_manager(a, True) == ("systemd", None)
    assert remote.service_manager(a, False) == ("supervise", None)
    assert remote.service_manager(b, True) == ("supervise", None)      # may not write units
    assert remote.service_manager(c, True) == ("systemd", None)
    assert remote.service_manager(c, False)[1] == ("host c: service_manager = systemd, but "
                                                    "systemd does not run there (no "
                                                    "/run/systemd/system)")
    assert "needs user root or sudo = true" in remote.service_manager(d, True)[1]
    assert remote.service_manager(e, True) == ("supervise", None)


def test_a_systemd_unit_runs_the_daemon_as_given_and_restarts_it_on_failure():
    from cairn.cluster import fleet
    where = {"data": "/var/lib/cairn", "venv": "/opt/cairn/venv"}
    control = fleet.Systemd(where, "0123456789abcdef")
    argv = ["/opt/cairn/venv/bin/cairn-osd", "run", "--device", "/srv/disk 1.img", "--host",
            "100%$HOME", 'say "hi"\\']
    text = control.unit_text("osd.3", argv)
    assert control.unit("osd.3") == "cairn-01234567-osd.3.service"
    lines = text.splitlines()
    assert ("ExecStart=/opt/cairn/venv/bin/cairn-osd run --device \"/srv/disk 1.img\" --host "
            '100%%$$HOME "say \\"hi\\"\\\\"') in lines
    for expected in ("Restart=on-failure", "WorkingDirectory=/var/lib/cairn",
                     "WantedBy=multi-user.target", "After=network-online.target"):
        assert expected in lines
    assert control.where_logs("osd.3") == "journalctl -u cairn-01234567-osd.3.service"
    start = control.start("osd.3", argv)
    assert "systemctl enable -q cairn-01234567-osd.3.service" in start
    assert "systemctl is-active -q cairn-01234567-osd.3.service || systemctl start" in start
    assert control.stop(["mon.0", "osd.3"]) == ("systemctl disable -q --now "
                                                "cairn-01234567-mon.0.service "
                                                "cairn-01234567-osd.3.service")
