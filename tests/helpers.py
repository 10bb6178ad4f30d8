"""Small helpers shared by tests."""

import asyncio
import contextlib
import os
import shutil


def make_file(directory, size_bytes, name="device.img"):
    """A sparse file of `size_bytes` to use as a device."""
    path = os.path.join(directory, name)
    with open(path, "wb") as handle:
        handle.truncate(size_bytes)
    return path


def run(coroutine):
    """Run a coroutine on a fresh event loop (tests stay plain functions, so hypothesis works)."""
    return asyncio.run(coroutine)


class LocalCluster:
    """A cluster brought up by `cairn-cluster up` in a test's directory (real processes)."""

    def __init__(self, directory):
        self.dir = directory

    @property
    def description(self):
        import json
        with open(os.path.join(self.dir, "cluster.json")) as handle:
            return json.load(handle)

    def cairn(self, *args, check=True):
        """Run `cairn --cluster DIR --json ARGS`; (exit status, parsed JSON)."""
        import json
        import subprocess
        import sys
        result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", self.dir,
                                 "--json", *args], capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"cairn {' '.join(args)} failed ({result.returncode}): "
                                 f"{result.stderr}")
        return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])

    def script(self, *args):
        """Run `cairn-cluster ARGS --dir DIR`; the CompletedProcess (must succeed)."""
        import subprocess
        import sys
        result = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", args[0], "--dir",
                                 self.dir, *args[1:]], capture_output=True, text=True,
                                timeout=120)
        if result.returncode != 0:
            raise AssertionError(f"cairn-cluster {' '.join(args)} failed: {result.stderr}")
        return result

    def osd(self, osd_id):
        """This OSD's row of `cairn osd tree`."""
        return next(o for o in self.cairn("osd", "tree")[1]["osds"] if o["id"] == osd_id)

    def clean(self):
        """Every OSD up, every PG active, no object copy degraded (recovery has ended)."""
        _, status = self.cairn("status")
        return status["objects"]["degraded"] == 0 and set(status["pg_states"]) == {"active"} \
            and status["osds"]["up"] == status["osds"]["total"]

    def wait_for(self, what, predicate, timeout_s):
        """Poll predicate() until true; seconds it took; AssertionError naming `what`."""
        import time
        started = time.monotonic()
        while True:
            if predicate():
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            time.sleep(0.1)


class WebhookReceivers:
    """Three webhook receivers on `host` (loopback, or the bridge of an isolated cluster) in a
    thread of their own: "good" records what it gets in `events`, "hang" answers only when
    stopped, "broken" answers 500. `urls` maps each name to its URL; stop() ends them."""

    def __init__(self, host="127.0.0.1"):
        self.host = host
        self.events = []
        self.urls = {}
        import threading
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self):
        import asyncio
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self):
        import asyncio
        from aiohttp import web
        self._release = asyncio.Event()

        async def good(request):
            self.events.append(await request.json())
            return web.Response(text="ok")

        async def hang(request):
            await self._release.wait()
            return web.Response(text="late")

        async def broken(request):
            return web.Response(status=500)
        app = web.Application()
        app.router.add_post("/good", good)
        app.router.add_post("/hang", hang)
        app.router.add_post("/broken", broken)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.urls = {name: f"http://{self.host}:{port}/{name}"
                     for name in ("good", "hang", "broken")}

    def events_of(self, check):
        """The states posted for `check`, in order."""
        return [event["state"] for event in list(self.events) if event["check"] == check]

    def stop(self):
        import asyncio
        self.loop.call_soon_threadsafe(self._release.set)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def kill_leftovers(directory):
    """SIGKILL every daemon of the cluster in `directory` still running (after `down` has had its
    chance); the cluster description, or None if there is none."""
    import json
    import signal
    from cairn.cluster.cli import is_ours
    try:
        with open(os.path.join(directory, "cluster.json")) as handle:
            description = json.load(handle)
    except (OSError, ValueError):
        return None
    for entry in description["mons"] + description["osds"]:
        if is_ours(entry.get("pid"), directory):
            os.kill(entry["pid"], signal.SIGKILL)
    return description


@contextlib.contextmanager
def isolated_up(directory, *up_args):
    """`cairn-cluster up --isolated --dir DIR --hosts 3 --device-size 256M UP_ARGS`; the
    directory. Afterwards `down`, then SIGKILL of anything left and removal of the namespaces,
    bridge and loop devices, even if the test failed."""
    import subprocess
    import sys
    argv = [sys.executable, "-m", "cairn.cluster.cli"]
    result = subprocess.run(argv + ["up", "--dir", directory, "--hosts", "3", "--isolated",
                                    "--device-size", "256M", *up_args],
                            capture_output=True, text=True, timeout=120)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        os.environ["CAIRN_TEST_CLUSTER"] = directory      # connect_as_admin
        yield directory
    finally:
        os.environ.pop("CAIRN_TEST_CLUSTER", None)
        subprocess.run(argv + ["down", "--dir", directory], capture_output=True, timeout=120)
        from cairn.cluster.cli import undo_isolation
        description = kill_leftovers(directory)
        if description is not None:
            undo_isolation(description)                # idempotent: nothing left if down ran


def isolated_marks():
    """The marks of a test module that brings up isolated clusters: the faults tier, skipped
    (with the reason) without root or nftables."""
    import pytest
    return [pytest.mark.faults,
            pytest.mark.skipif(os.geteuid() != 0, reason="isolated mode needs root (network "
                               "namespaces, loop devices, cgroups); CI runs as root"),
            pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed "
                               "(cluster-scripts/setup.sh installs it)")]


async def connect_as_admin(addr, directory=None, timeout_s=3.0):
    """A connection to the monitor or OSD at `addr`, authenticated as client.admin with the
    keyring of cluster `directory` (default: the cluster the test brought up last,
    $CAIRN_TEST_CLUSTER); a plain connection when that cluster runs without auth."""
    import json
    from cairn.common import messenger, sessions
    from cairn.common.monclient import MonClient, load_cluster
    directory = directory or os.environ.get("CAIRN_TEST_CLUSTER")
    entity, secret = sessions.find_credentials(directory, "client.admin") if directory \
        else ("client.admin", None)
    if secret is None:
        return await messenger.connect(addr, timeout_s=timeout_s)
    handshake = sessions.monitor_handshake(entity, secret)
    with open(os.path.join(directory, "cluster.json")) as handle:
        mons = [mon["addr"] for mon in json.load(handle)["mons"]]
    if addr in mons:
        return await messenger.connect(addr, timeout_s=timeout_s, authenticate=handshake)
    monc = MonClient(load_cluster(directory), deadline_s=timeout_s + 5, authenticate=handshake)
    try:
        tickets = sessions.Tickets(monc.ticket)
        await tickets.current()
        return await messenger.connect(addr, timeout_s=timeout_s,
                                       authenticate=tickets.authenticate)
    finally:
        await monc.close()


async def osd_statuses(cluster):
    """{osd id: its `status` reply header} of every OSD of `cluster` (a test cluster)."""
    found = {}
    for entry in cluster.description["osds"]:
        admin = await connect_as_admin(entry["addr"])
        try:
            found[entry["id"]] = (await admin.request({"op": "status"})).header
        finally:
            await admin.close()
    return found


def admin_auth(directory=None):
    """The `authenticate` of a MonClient acting as client.admin in cluster `directory` (default
    $CAIRN_TEST_CLUSTER); None when that cluster runs without auth."""
    from cairn.common import sessions
    directory = directory or os.environ.get("CAIRN_TEST_CLUSTER")
    return sessions.client_handshake(directory, "client.admin") if directory else None


def close_fsspec_filesystems():
    """Close the clients of the `cairn://` filesystems fsspec keeps for reuse and forget them:
    a kept client would outlive its test's cluster, retrying."""
    from cairn.client.fsspec_fs import CairnFileSystem
    for fs in list(CairnFileSystem._cache.values()):
        fs.close()
    CairnFileSystem.clear_instance_cache()


class StorePort:
    """An osd/port.py Port for tests of one OSD's PG code alone: its id, its store and a map;
    a call to another OSD or the monitors is a test error."""

    def __new__(cls, me, store, cmap=None):
        from cairn.osd.port import Port

        class _StorePort(Port):
            @property
            def me(self):
                return me

            @property
            def store(self):
                return store

            @property
            def map(self):
                return cmap

            async def remote(self, osd_id, header, payload):
                raise AssertionError(f"this test's OSD has no peers (call to osd.{osd_id})")

            def send(self, osd_id, header, payload, timeout_s, crc=None):
                raise AssertionError(f"this test's OSD has no peers (send to osd.{osd_id})")

            async def monitor(self, request):
                raise AssertionError("this test's OSD has no monitors")

            async def wait_for_epoch(self, epoch, timeout_s):
                raise AssertionError("this test's OSD gets no maps")
        return _StorePort()
