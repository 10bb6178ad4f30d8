"""A daemon's supervisor on a host without systemd: `python -m cairn.cluster.supervise --pidfile P
--log L -- ARGV...` runs ARGV, restarts it when it exits (after 1 s, doubling up to 30 s while it
keeps failing within a minute of starting), and on SIGTERM stops it (SIGTERM, then SIGKILL after
STOP_GRACE_S) and exits. The pid file holds the supervisor's pid, written once it runs and
removed when it ends; the daemon's output goes to the log, with a line per start and exit.
`cairn-cluster up --hosts-file` starts one per daemon, detached (setsid), on hosts where systemd
is not running.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

RESTART_DELAY_S = 1.0
RESTART_DELAY_S_MAX = 30.0
HEALTHY_AFTER_S = 60.0           # a run this long resets the back-off
STOP_GRACE_S = 15.0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cairn.cluster.supervise")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the daemon's command after --")
    stopping = []
    child = [None]

    def on_term(signum, frame):
        stopping.append(signum)
        if child[0] is not None and child[0].poll() is None:
            child[0].send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(args.pidfile + ".tmp", "w") as handle:
        handle.write(f"{os.getpid()}\n")
    os.replace(args.pidfile + ".tmp", args.pidfile)
    delay = RESTART_DELAY_S
    try:
        with open(args.log, "ab", buffering=0) as log:
            while not stopping:
                started = time.monotonic()
                log.write(f"supervise: starting {' '.join(command)}\n".encode())
                child[0] = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log)
                status = _wait(child[0], stopping)
                log.write(f"supervise: exited with status {status}\n".encode())
                if stopping:
                    break
                delay = RESTART_DELAY_S if time.monotonic() - started > HEALTHY_AFTER_S else \
                    min(delay * 2, RESTART_DELAY_S_MAX)
                deadline = time.monotonic() + delay
                while not stopping and time.monotonic() < deadline:
                    time.sleep(0.1)
    finally:
        try:
            os.unlink(args.pidfile)
        except FileNotFoundError:
            pass
    return 0


def _wait(process, stopping):
    """The child's exit status; once asked to stop, SIGKILL it after the grace period."""
    asked_at = None
    while True:
        try:
            return process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if stopping and asked_at is None:
            asked_at = time.monotonic()
        if asked_at is not None and time.monotonic() - asked_at > STOP_GRACE_S:
            process.kill()


if __name__ == "__main__":
    sys.exit(main())
