"""pjdfstest, the POSIX file-system suite FUSE file systems run in their CI (JuiceFS does),
through `cairn mount`: every one of its ~8,800 tests passes except those in ALLOWED, each
listed with its reason. A test that starts passing must leave the list (the run fails on it
too), so the list stays the truth."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_mount import mountable_cluster

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="pjdfstest checks ownership and modes as "
                       "root (CI runs as root)"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
]

REPO = Path(__file__).resolve().parents[1]
# The copy built for this machine kind (the project's shared tools), or $CAIRN_PJDFSTEST.
CANDIDATES = [os.environ.get("CAIRN_PJDFSTEST", ""), REPO.parent / "shared/tools/pjdfstest",
              "/work/shared/tools/pjdfstest"]
SUITE = next((Path(p) for p in CANDIDATES if p and (Path(p) / "pjdfstest").is_file()), None)

# test file -> ({subtest numbers allowed to fail}, why).
ALLOWED = {
    "rename/24.t": ({4, 5, 8, 9}, "a directory's link count is 1 (not 2 + its subdirectories), "
                    "as btrfs's"),
    "unlink/14.t": ({4, 6}, "a file unlinked while open loses its data with the unlink (README)"),
}


@pytest.mark.skipif(SUITE is None, reason="pjdfstest is not built here: looked in "
                    f"{', '.join(str(p) for p in CANDIDATES if p)} (set CAIRN_PJDFSTEST)")
@pytest.mark.skipif(shutil.which("prove") is None, reason="prove (perl) is not installed")
def test_pjdfstest_passes_but_for_the_listed_tests(local_cluster, tmp_path):
    mounts = mountable_cluster(local_cluster, tmp_path)
    runs = []
    try:
        point = Path(mounts.mount("m"))
        # Two prove runs at once, each over half the suite's directories in a directory of
        # its own (some tests check that their working directory's times did not move).
        groups = sorted(p for p in (SUITE / "tests").iterdir() if p.is_dir())
        started = time.monotonic()
        for half in (groups[0::2], groups[1::2]):
            cwd = point / f"pjd{len(runs)}"
            cwd.mkdir()
            runs.append(subprocess.Popen(["prove", "-r", *map(str, half)], cwd=cwd,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True))
        outputs = [run.communicate(timeout=1500)[0] for run in runs]
        took = time.monotonic() - started
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
        mounts.stop()
    report = "\n".join(outputs)
    totals = [int(n) for n in re.findall(r"Files=\d+, Tests=(\d+)", report)]
    assert len(totals) == 2 and sum(totals) > 8000, report[-3000:]
    failed = {}
    for path, numbers in re.findall(r"tests/(\S+\.t)\s+\(Wstat: \d+ Tests: \d+ Failed: \d+\)"
                                    r"\s+Failed tests?:\s+([\d, \-\n]+)", report):
        failed[path] = _numbers(numbers)
    dead = re.findall(r"tests/(\S+\.t)\s+\(Wstat: (\d+) Tests: \d+ Failed: 0\)\s+"
                      r"Non-zero (?:exit|wait) status", report)
    assert not dead, f"test files that died: {dead}"
    unexpected = {path: sorted(numbers - ALLOWED.get(path, (set(),))[0])
                  for path, numbers in failed.items()
                  if numbers - ALLOWED.get(path, (set(),))[0]}
    passing = {path: sorted(allowed - failed.get(path, set()))
               for path, (allowed, _) in ALLOWED.items() if allowed - failed.get(path, set())}
    assert not unexpected, f"failed and not allowed: {unexpected}"
    assert not passing, f"allowed but passing now (take them off ALLOWED): {passing}"
    print(f"pjdfstest: {sum(totals)} tests, {sum(map(len, failed.values()))} failed (all "
          f"allowed) in {took:.0f} s")


def _numbers(text):
    """'1-3, 7' -> {1, 2, 3, 7}."""
    out = set()
    for part in re.split(r"[,\s]+", text.strip()):
        if "-" in part:
            first, last = part.split("-")
            out.update(range(int(first), int(last) + 1))
        elif part:
            out.add(int(part))
    return out
