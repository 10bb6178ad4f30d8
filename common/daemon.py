"""What every cairn daemon does at start-up: logging, the event loop, signals, the ready file.

`run(main, name)` runs `await main(stop)` on uvloop (DESIGN.md, "Messaging"; the stdlib loop when
uvloop is missing, said in the log), where `stop` is an asyncio.Event set by SIGTERM or SIGINT.
The daemon finishes its work and returns; a second signal while it is stopping exits at once.
With CAIRN_PROFILE=PATH in its environment a daemon runs under cProfile and writes its
statistics to PATH.PID when it stops (call counts per op: the profile behind DESIGN.md's
"Per-op cost" figures).
"""

import asyncio
import gc
import logging
import os
import signal
import sys

log = logging.getLogger("cairn.daemon")

# The cyclic collector's thresholds in a daemon. A served request leaves no reference cycle
# behind (tests/test_messenger.py), yet at Python's defaults (700, 10, 10) a busy OSD ran a
# young collection every 700 allocations and spent 3.4% of its CPU in the collector (perf,
# 4 KiB writes). A larger young generation lets most objects die before any collection looks
# at them, and what start-up made is frozen out of the collector's view.
GC_THRESHOLDS = (50_000, 20, 10)


def setup_logging(name, verbose=False):
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")


def write_ready_file(path, info):
    """Atomically write `info` (a dict) as JSON to `path`: the launcher waits for this file."""
    import json
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(info, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def crash_on_error(task):
    """A done-callback for a daemon's background task (peering, tidying, the monitor's Raft
    loop): one that died of anything but cancellation hit a bug or a broken disk, so stop the
    daemon rather than run on with nobody noticing (STYLE.md 2.5)."""
    if task.cancelled() or task.exception() is None:
        return
    log.critical("background task %s failed; stopping", task.get_name(),
                 exc_info=task.exception())
    os._exit(70)


def tune_collector():
    """Freeze what start-up made and raise the young generation's threshold (GC_THRESHOLDS)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(main, name):
    """Run `await main(stop_event)` to completion; returns its exit status."""
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
        flavour = "uvloop"
    except ImportError:
        loop_factory = None
        flavour = "asyncio (uvloop not installed)"

    async def wrapper():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals_seen = []

        def on_signal(signum):
            signals_seen.append(signum)
            if len(signals_seen) > 1:
                log.warning("second signal while stopping: exiting now")
                os._exit(1)
            log.info("%s: stopping", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        log.info("%s starting (pid %d, event loop %s)", name, os.getpid(), flavour)
        tune_collector()
        return await main(stop)

    profile_path = os.environ.get("CAIRN_PROFILE")
    if profile_path:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(wrapper())
    finally:
        if profile_path:
            profiler.disable()
            profiler.dump_stats(f"{profile_path}.{os.getpid()}")
