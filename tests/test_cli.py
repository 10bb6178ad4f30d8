"""The command lines as a user runs them: `cairn-osd mkfs|fsck|demo` and `cairn bench`, as real
processes, checking exit codes, messages and the JSON contract of the benchmarks."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import make_file

pytestmark = pytest.mark.unit

BENCH_FIELDS = {"op", "size_bytes", "ops", "seconds", "MBps", "iops", "lat_us_p50", "lat_us_p99"}


def cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "cairn.osd.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def cairn(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "cairn.client.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_mkfs_refuses_to_overwrite_and_fsck_is_clean(disk_dir):
    path = make_file(disk_dir, 32 << 20)
    made = cli("mkfs", "--device", path)
    assert made.returncode == 0, made.stderr
    assert "uuid" in made.stdout and os.path.isdir(path + ".meta")
    assert "1M commit journal" in made.stdout               # 1/32 of 32 MiB
    again = cli("mkfs", "--device", path)
    assert again.returncode == 2 and "--force" in again.stderr
    plain = cli("mkfs", "--device", path, "--force", "--no-journal")
    assert plain.returncode == 0 and "no commit journal" in plain.stdout, plain.stderr
    assert cli("mkfs", "--device", path, "--force").returncode == 0
    checked = cli("fsck", "--device", path, "--deep", "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["clean"] and report["objects"] == 0 and report["deep"]


def test_errors_are_clear(disk_dir):
    path = make_file(disk_dir, 8 << 20)
    unformatted = cli("fsck", "--device", path)
    assert unformatted.returncode == 2 and "mkfs" in unformatted.stderr
    missing = cli("mkfs", "--device", os.path.join(disk_dir, "nope", "x.img"))
    assert missing.returncode == 2 and "no such" in missing.stderr
    bad_size = cairn("bench", "device", "--device", path, "--size", "lots")
    assert bad_size.returncode == 2 and "not a size" in bad_size.stderr


@pytest.mark.parametrize("op", ["write", "randread"])
def test_bench_device_json(disk_dir, op):
    path = make_file(disk_dir, 64 << 20)
    done = cairn("bench", "device", "--device", path, "--op", op, "--size", "64K",
                 "--concurrency", "4", "--seconds", "0.5", "--region", "16M", "--no-fio",
                 "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert BENCH_FIELDS <= set(result)
    assert result["op"] == op and result["size_bytes"] == 65536 and result["ops"] > 0
    from cairn.native import implementation
    assert result["implementation"] == implementation()


def test_bench_store_put_then_get_json(disk_dir):
    path = make_file(disk_dir, 64 << 20)
    assert cli("mkfs", "--device", path).returncode == 0
    for op in ("put", "get"):
        done = cairn("bench", "store", "--device", path, "--op", op, "--size", "64K",
                     "--concurrency", "4", "--seconds", "0.5", "--no-fio", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert BENCH_FIELDS <= set(result) and result["ops"] > 0 and result["op"] == op
        from cairn.common.daemon import GC_THRESHOLDS
        assert tuple(result["gc_thresholds"]) == GC_THRESHOLDS     # measured as an OSD runs
    # The timed puts cycled over a bounded name set and left the store consistent.
    checked = cli("fsck", "--device", path, "--deep", "--json")
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["clean"] and 0 < report["objects"] <= 4096


def test_demo_small(disk_dir):
    env = dict(os.environ, CAIRN_SCRATCH_DIR=str(disk_dir))
    done = subprocess.run([sys.executable, "-m", "cairn.osd.cli", "demo", "--data", "32M",
                           "--device-size", "256M"], capture_output=True, text=True,
                          timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 of 8 byte-identical" in done.stdout and "clean" in done.stdout
    assert not [name for name in os.listdir(disk_dir) if name.startswith("cairn-")]


def test_round_ratios_compare_each_round_with_the_fio_runs_around_it():
    from cairn.osd.bench import _FioBaseline, _with_ratio
    fio = _FioBaseline(job=None)
    fio.runs = [{"rw": "write", "bs": 4096, "iodepth": 1, "MBps": mbps, "iops": mbps * 1e6 / 4096,
                 "lat_us_p50": 1.0, "lat_us_p99": 2.0} for mbps in (100.0, 300.0, 200.0, 200.0)]
    fio.ours = [mbps * 1e6 / 4096 for mbps in (100.0, 500.0, 180.0)]
    result = _with_ratio({"size_bytes": 4096}, fio)
    assert [round_["fio_MBps"] for round_ in result["rounds"]] == [200.0, 250.0, 200.0]
    assert [round_["ratio"] for round_ in result["rounds"]] == [0.5, 2.0, 0.9]
    assert result["ratio_vs_fio"] == 0.9            # the median: one odd round does not decide
    assert result["fio"]["MBps"] == 200.0 and len(result["fio"]["runs"]) == 4


@pytest.mark.skipif(not __import__("shutil").which("fio"),
                    reason="fio is not installed (cluster-scripts/setup.sh installs it)")
def test_bench_device_interleaves_fio_rounds(disk_dir):
    path = make_file(disk_dir, 64 << 20)
    done = cairn("bench", "device", "--device", path, "--op", "write", "--size", "64K",
                 "--concurrency", "4", "--seconds", "2", "--rounds", "2", "--region", "16M",
                 "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["rounds"]) == 2 and len(result["fio"]["runs"]) == 3
    assert all(run["MBps"] > 0 for run in result["fio"]["runs"])
    assert result["ratio_vs_fio"] > 0
    assert "median over rounds" in done.stderr


@pytest.mark.skipif(not __import__("shutil").which("fio"),
                    reason="fio is not installed (cluster-scripts/setup.sh installs it)")
def test_bench_store_put_also_compares_with_durable_fio(disk_dir):
    path = make_file(disk_dir, 64 << 20)
    assert cli("mkfs", "--device", path).returncode == 0
    done = cairn("bench", "store", "--device", path, "--op", "put", "--size", "64K",
                 "--concurrency", "4", "--seconds", "1", "--rounds", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["fio"]["fdatasync"] == 0 and len(result["fio"]["runs"]) == 2
    assert result["fio_durable"]["fdatasync"] == 4 and len(result["fio_durable"]["runs"]) == 2
    assert result["ratio_vs_fio"] > 0 and result["ratio_vs_fio_durable"] > 0
    assert not os.path.exists(path + ".fio-scratch")
    # Large objects: fio writes blocks of the object's size, sequentially, at the same depth.
    done = cairn("bench", "store", "--device", path, "--op", "put", "--size", "4M",
                 "--concurrency", "2", "--seconds", "1", "--rounds", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["fio"]["rw"], result["fio"]["bs"], result["fio"]["iodepth"]) == \
        ("write", 4 << 20, 2)
    assert result["fio_durable"]["fdatasync"] == 2 and result["fio_durable"]["bs"] == 4 << 20


def test_fio_scratch_may_be_a_block_device(disk_dir):
    """`--fio-file` on a block device: used as it is when large enough (it was truncated, which
    a block device refuses), refused with its size when too small; a file grows sparse."""
    from cairn.osd.bench import _fio_room
    grown = os.path.join(str(disk_dir), "scratch")
    _fio_room(grown, 1 << 20)
    assert os.path.getsize(grown) == 1 << 20
    if os.geteuid() != 0:
        pytest.skip("a loop device needs root (losetup)")
    backing = make_file(disk_dir, 8 << 20)
    loop = subprocess.run(["losetup", "-f", "--show", backing], capture_output=True, text=True)
    if loop.returncode != 0:
        pytest.skip(f"no loop device here: {loop.stderr.strip()}")
    device = loop.stdout.strip()
    try:
        _fio_room(device, 8 << 20)
        with pytest.raises(ValueError, match="holds 8388608 bytes"):
            _fio_room(device, 16 << 20)
    finally:
        subprocess.run(["losetup", "-d", device])


def test_local_monitor_ports_are_below_the_ephemeral_range_and_distinct():
    """An ephemeral port (the kernel's pick for port 0) can be handed to another monitor's
    outgoing connection before its own monitor binds it ('address in use' in CI)."""
    import socket
    from cairn.cluster import cli, daemons
    low = daemons._ephemeral_low()
    ports = []
    for _ in range(5):
        ports.append(cli.free_port(ports))
    assert len(set(ports)) == 5
    assert all(daemons.MONITOR_PORT_LOW <= port < low for port in ports), (ports, low)
    with socket.socket() as holder:                      # a port in use is never chosen
        holder.bind((cli.MONITOR_IP, ports[0]))
        holder.listen()
        for _ in range(50):
            assert cli.free_port() != ports[0]


def test_up_warns_when_sparse_device_files_could_outgrow_their_filesystem(tmp_path):
    from cairn.cluster import cli
    assert cli.room_warning(str(tmp_path), 1 << 20) is None
    warning = cli.room_warning(str(tmp_path), 1 << 60)
    assert warning.startswith("warning: the OSDs' device files total 1073741824.0 GiB but"), \
        warning
    assert f"filesystem ({tmp_path})" in warning and "fail with 'no space'" in warning
