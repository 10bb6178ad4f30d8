"""Shared fixtures: scratch directories on a disk that accepts O_DIRECT, and the device twins.

Every test carries exactly one tier marker (unit, cluster, faults); collection fails otherwise,
so `pytest -m unit` and friends always select the whole suite between them.
"""

import atexit
import faulthandler
import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

from cairn.native import FileBlockDevice, MemoryBlockDevice, UringBlockDevice
from tests.helpers import LocalCluster, kill_leftovers, make_file

TIERS = ("unit", "cluster", "faults")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid} must carry exactly one tier marker of "
                                    f"{TIERS} (has {tiers})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item: fixtures read `item.failed_call` to leave
    evidence behind when the test itself failed."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.failed_call = True


def _print_daemon_warnings(directory, lines=40):
    """The last warning and error lines of every daemon log of a cluster: printed in the
    failed test's captured output, since CI keeps nothing else of a cluster it tears down."""
    logs = Path(directory) / "logs"
    if not logs.is_dir():
        return
    for log in sorted(logs.glob("*.log")):
        try:
            text = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        found = [line for line in text
                 if any(word in line for word in ("WARNING", "ERROR", "Traceback", "Error"))]
        if found:
            print(f"--- {log.name}: last {min(lines, len(found))} of {len(found)} warning lines")
            print("\n".join(found[-lines:]))


def pytest_sessionfinish(session, exitstatus):
    """Drop what the tests left behind while the interpreter is whole.

    History: on 2026-11-25 and twice on 2026-11-27 a full run passed every test and then died
    of SIGSEGV after the summary, the kernel placing the fault in PyThreadState_New at address
    0x28: a thread with no Python thread state asking for the GIL after the interpreter had
    dropped its state. That is what a library's late destructor does when it releases a Python
    reference from a static or thread-local destructor at process exit (pyo3, under rocksdict,
    takes the GIL that way). Our own extensions never take the GIL from a thread of their own.
    The test process used to skip finalization to hide it; it now finalizes as any Python
    process does. Native objects still reachable are collected here, before finalization
    begins, and faulthandler stays on through finalization (`_keep_faulthandler`), so if the
    fault comes back its output names every thread's stack instead of a bare exit status."""
    gc.collect()
    atexit.register(_keep_faulthandler)


def _keep_faulthandler():
    # pytest's own faulthandler plugin turns it off when the session ends; atexit handlers run
    # before the interpreter finalizes its modules and threads, where the fault was seen.
    faulthandler.enable(file=sys.__stderr__, all_threads=True)


@pytest.fixture(autouse=True)
def _drop_device_images(request):
    """After each test, delete the device images (`*.img`) under its tmp_path, passed or failed.

    A cluster test's sparse images fill as it writes (8 GB for the slow-disk test), and pytest
    keeps the last three runs' directories: on 2026-11-28 leftovers of earlier runs filled the
    disk and a CI run failed with 206 setup errors. The daemons' logs stay for reading; a
    loop device still attached keeps its file until it is detached, so nothing in use breaks.
    Runs after the test's own fixtures are torn down (an autouse fixture is set up first)."""
    yield
    root = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if root is None:
        return
    for path in Path(root).rglob("*.img"):
        try:
            if path.is_file() and not path.is_symlink():
                path.unlink()
        except OSError:
            pass


def _direct_io_works(directory):
    probe = os.path.join(directory, ".cairn-odirect-probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@pytest.fixture
def disk_dir(tmp_path):
    """A scratch directory whose filesystem accepts O_DIRECT (tmpfs does not)."""
    if _direct_io_works(tmp_path):
        yield tmp_path
        return
    fallback = os.environ.get("CAIRN_SCRATCH_DIR") or "/var/tmp"
    if not _direct_io_works(fallback):
        pytest.skip(f"no scratch filesystem here accepts O_DIRECT ({tmp_path}, {fallback}); "
                    "set CAIRN_SCRATCH_DIR to a directory on ext4 or xfs")
    directory = tempfile.mkdtemp(prefix="cairn-test-", dir=fallback)
    yield directory
    import shutil
    shutil.rmtree(directory, ignore_errors=True)


DEVICE_KINDS = ("uring", "file", "memory")


@pytest.fixture(params=DEVICE_KINDS)
def device_kind(request):
    return request.param


@pytest.fixture
def open_twin(disk_dir, device_kind):
    """`await open_twin(size_bytes)` opens a fresh device of the parametrized kind."""
    opened = []

    async def opener(size_bytes=64 << 20, name="device.img"):
        if device_kind == "memory":
            device = MemoryBlockDevice(size_bytes, path=name)
        else:
            path = make_file(disk_dir, size_bytes, name)
            cls = UringBlockDevice if device_kind == "uring" else FileBlockDevice
            device = cls.open(path)
        opened.append(device)
        return device

    yield opener
    for device in opened:
        if not device.closed:
            device.close()


@pytest.fixture
def local_cluster(disk_dir, request):
    """`local_cluster(hosts=3, osds_per_host=1, ...)` brings up a cluster of real processes with
    `cairn-cluster up`; every daemon is stopped by pid afterwards, even if the test failed."""
    import subprocess
    import sys
    made = []

    def up(hosts=3, osds_per_host=1, racks=0, device_size="256M", config=(), mons=1,
           extra=()):
        directory = os.path.join(str(disk_dir), f"cluster{len(made)}")
        made.append(directory)
        argv = [sys.executable, "-m", "cairn.cluster.cli", "up", "--dir", directory,
                "--hosts", str(hosts), "--osds-per-host", str(osds_per_host), "--racks",
                str(racks), "--device-size", device_size, "--mons", str(mons), *extra]
        for pair in config:
            argv += ["--config", pair]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, f"cairn-cluster up failed:\n{result.stdout}{result.stderr}"
        os.environ["CAIRN_TEST_CLUSTER"] = directory      # tests.helpers.connect_as_admin
        return LocalCluster(directory)

    yield up
    os.environ.pop("CAIRN_TEST_CLUSTER", None)
    for directory in made:
        if getattr(request.node, "failed_call", False):
            _print_daemon_warnings(directory)
        subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "down", "--dir", directory],
                       capture_output=True, timeout=120)
        kill_leftovers(directory)
