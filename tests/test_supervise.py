"""The supervisor daemons run under on hosts without systemd (cluster-scripts/supervise.py):
a daemon that dies is started again, and SIGTERM stops both and removes the pid file."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit


def test_a_supervised_daemon_is_restarted_when_it_dies_and_stopped_with_its_supervisor(tmp_path):
    pidfile, log, marks = tmp_path / "d.pid", tmp_path / "d.log", tmp_path / "starts"
    # The "daemon": notes each start, then sleeps (so it can be killed).
    script = f"echo started >> {marks}; exec sleep 60"
    supervisor = subprocess.Popen([sys.executable, "-m", "cairn.cluster.supervise", "--pidfile",
                                   str(pidfile), "--log", str(log), "--", "sh", "-c", script],
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (marks.exists() and pidfile.exists()):
            assert time.monotonic() < deadline, "the supervisor did not start its daemon"
            time.sleep(0.05)
        assert int(pidfile.read_text()) == supervisor.pid
        daemon = int(subprocess.run(["pgrep", "-P", str(supervisor.pid)], capture_output=True,
                                    text=True).stdout.split()[0])
        os.kill(daemon, signal.SIGKILL)                 # dies: started again after 1-2 s
        while marks.read_text().count("started") < 2:
            assert time.monotonic() < deadline + 10, "the daemon was not restarted"
            time.sleep(0.05)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0
        assert not pidfile.exists()
        text = log.read_text()
        assert text.count("supervise: starting") == 2 and "exited with status -9" in text
        assert subprocess.run(["pgrep", "-f", str(marks)], capture_output=True).returncode == 1
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
