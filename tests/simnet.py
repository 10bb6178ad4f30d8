"""A seeded cluster in one process: the shipped OSD code over an in-memory port, in virtual time.

What runs is what ships: per OSD a real store (osd/store.py on the in-memory device twin,
native/memdev.py, whose crash loses, keeps or tears every unflushed write), and over it the
daemon's own wiring (osd/assembly.py `assemble` makes LocalCopies, both backends, the PgRegistry with its
peering and recovery loop `_peer`/`_run`, the ObjectService with its op table). Only the port
differs: `SimPort` (the osd/port.py interface) carries each request through `SimNet`, which
delays it, loses it before or after the peer handled it, and kills whatever a crashed OSD was
doing; messages between one pair of OSDs stay in order, as over one TCP connection. The
monitor is `SimMonitor`: it holds the map and the PG activation records, with the monitor's
rule for a record older than the one held (mon/monitor.py `_apply_pg_active`).

Time is virtual (`SimLoop`): when nothing is ready, the clock jumps to the next timer, so a
run of minutes of timeouts and retries takes well under a second and depends only on the seed.
The store's metadata thread and the default executor run inline (`InlineExecutor`) for the
same reason.

`Simulation` drives it from a seed: clients write, delete and read objects of a replicated and
an erasure-coded pool while OSDs crash and restart, are marked out and in, the network loses
and delays messages, and each OSD sees each new map late. It checks, as it goes and at the end
once everything is healed and every PG clean, that no read returns an older value than one
acknowledged before the read began, and that every acknowledged write is still there
(`Model`). A failure names its seed; `python -m tests.simnet SEED [--seconds S]` replays it.
"""

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import random
import selectors
import tempfile

import msgpack

from cairn.common import pg as pgs
from cairn.common.clustermap import ClusterMap, Incremental
from cairn.common.codes import Code
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.native import MemoryBlockDevice
from cairn.osd import pgs as pgs_module
from cairn.osd.assembly import assemble
from cairn.osd.pg import PgCore
from cairn.osd.port import PEER_CALL_TIMEOUT_S, Port
from cairn.osd.store import Store, mkfs

log = logging.getLogger("cairn.sim")

DEVICE_BYTES = 16 << 20


class SimulationStalled(Exception):
    """Nothing is scheduled and nothing can wake the loop: every task waits forever."""


class BugFound(AssertionError):
    """The shipped code did what it must never do (a background task died, a handler raised
    something that is not an error reply)."""


# -- virtual time --------------------------------------------------------------------------------


class _VirtualSelector(selectors.BaseSelector):
    """The loop's selector: real file descriptors are polled without waiting; a wait with a
    timeout moves the virtual clock instead of sleeping."""

    def __init__(self):
        self._real = selectors.DefaultSelector()
        self.loop = None

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self):
        self._real.close()

    def select(self, timeout=None):
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            ready = self._real.select(1.0)      # only a thread could wake us now
            if ready:
                return ready
            raise SimulationStalled("no task is ready and no timer is set")
        if timeout > 0:
            self.loop.now += timeout
        return []


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual (see _VirtualSelector)."""

    def __init__(self):
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0
        self.set_default_executor(InlineExecutor())

    def time(self):
        return self.now


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each job at once in the caller's thread, so its result is ready in a known order."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        pass


def run(coroutine):
    """Run `coroutine` on a fresh SimLoop."""
    loop = SimLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        # Messages still on their way when the run ended (a replica write whose sender gave
        # up, a late delivery): stopped, so none is destroyed pending.
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()

        async def stopped():
            await asyncio.gather(*left, return_exceptions=True)
        loop.run_until_complete(stopped())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# -- the network and the monitor -------------------------------------------------------------------


class SimNet:
    """Requests between OSDs (and from clients): delayed, lost, kept in order per pair."""

    def __init__(self, rng, sim):
        self.rng = rng
        self.sim = sim
        self.loss = 0.0                 # chance a request or its reply is lost
        self.delay_max_s = 0.002
        self.spikes = 0.02              # chance a message stalls (and the pair's later ones)
        self.cut = set()                # OSD ids no message reaches or leaves
        self._next_at = {}              # connection (`_key`) -> when its last message arrives
        self.delivered = self.lost = self.late = 0

    def _key(self, src, dst):
        """One connection: a pair of endpoints while neither restarts."""
        def incarnation(osd_id):
            osd = self.sim.osds.get(osd_id)
            return osd.incarnation if osd is not None else 0
        return src, dst, incarnation(src), incarnation(dst)

    def _arrival(self, src, dst):
        delay = self.rng.uniform(0, self.delay_max_s)
        if self.rng.random() < self.spikes:
            delay += self.rng.uniform(0.05, 1.0)        # a stall: later messages queue behind
        key = self._key(src, dst)
        at = max(self.sim.loop.time() + delay, self._next_at.get(key, 0.0) + 1e-6)
        self._next_at[key] = at
        return at

    def _stall(self, src, dst, target, incarnation, header, payload):
        """A message stuck past its sender's deadline (TCP retransmitting into a bad path):
        the connection keeps it, so it still arrives, late, and the pair's later messages
        queue behind it (the messenger keeps its connection on a timeout; clients and
        OSDs resend on the same one). `header` None: a reply, which nobody waits for now."""
        self.lost += 1
        key = self._key(src, dst)
        at = self.sim.loop.time() + self.rng.uniform(0.5, 12.0)
        self._next_at[key] = max(self._next_at.get(key, 0.0), at)
        if header is None:
            return

        def deliver():
            if target.running and target.incarnation == incarnation:
                self.late += 1
                task = target.spawn(target.service.handle(_wire(header), payload))
                task.add_done_callback(_retrieved)
        self.sim.loop.call_at(at, deliver)

    async def request(self, src, dst, header, payload, timeout_s):
        """The reply (header, payload) of `dst`'s handler, or ConnectionClosed /
        RequestTimeout / the RequestFailed it answered, as a connection raises them."""
        loop = self.sim.loop
        deadline = loop.time() + timeout_s
        target = self.sim.osds.get(dst)
        if target is None or not target.running or src in self.cut or dst in self.cut:
            await asyncio.sleep(min(timeout_s, self.rng.uniform(0.001, 0.5)))
            raise ConnectionClosed(f"osd.{dst} does not answer")
        incarnation = target.incarnation
        await asyncio.sleep(max(0.0, self._arrival(src, dst) - loop.time()))
        if isinstance(payload, tuple):
            payload = b"".join(bytes(piece) for piece in payload)
        payload = bytes(payload)
        if self.rng.random() < self.loss:               # stuck on the way there
            self._stall(src, dst, target, incarnation, header, payload)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            raise RequestTimeout(f"request to osd.{dst} timed out")
        if not target.running or target.incarnation != incarnation:
            raise ConnectionClosed(f"osd.{dst} restarted")
        task = target.spawn(target.service.handle(_wire(header), payload))
        task.add_done_callback(_retrieved)          # a reply nobody waits for any more
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if not done:
            raise RequestTimeout(f"request to osd.{dst} timed out")
        if task.cancelled():
            raise ConnectionClosed(f"osd.{dst} went away")
        failure = task.exception()
        if failure is not None and not isinstance(failure, RequestFailed):
            self.sim.bug(f"osd.{dst} answered {header.get('op')} with {failure!r}", failure)
            raise ConnectionClosed(f"osd.{dst} failed")
        await asyncio.sleep(max(0.0, self._arrival(dst, src) - loop.time()))
        if self.rng.random() < self.loss:               # the reply is stuck
            self._stall(dst, src, target, incarnation, None, None)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            raise RequestTimeout(f"reply from osd.{dst} lost")
        if failure is not None:
            raise RequestFailed(failure.code, failure.message)
        self.delivered += 1
        reply, data = task.result()
        if isinstance(data, tuple):
            data = b"".join(bytes(piece) for piece in data)
        return _wire(reply), bytes(data)


def _retrieved(task):
    if not task.cancelled():
        task.exception()


def _wire(header):
    """A header as the peer receives it (common/frame.py packs it with msgpack)."""
    return msgpack.unpackb(msgpack.packb(header, use_bin_type=True), raw=False,
                           strict_map_key=False)


class SimMonitor:
    """The map and the PG activation records, as the monitors keep them."""

    def __init__(self, cmap):
        self.map = cmap
        self.records = {}

    def change(self, *ops):
        self.map = self.map.apply(Incremental(self.map.epoch + 1, tuple(ops)))
        return self.map

    def request(self, request):
        key = (request["pool"], request["pg"])
        if request["op"] == "pg_last_active":
            return {"record": self.records.get(key)}
        if request["op"] == "pg_set_active":
            current = self.records.get(key)
            if current is not None and current[0] > request["epoch"]:
                raise RequestFailed(Code.STALE, f"pg went active at epoch {current[0]}")
            self.records[key] = [request["epoch"], list(request["acting"]),
                                 list(request["complete"])]
            return {}
        raise AssertionError(f"the simulation's monitor does not serve {request['op']}")


# -- one OSD -----------------------------------------------------------------------------------------


class SimPort(Port):
    """osd/port.py over SimNet and SimMonitor."""

    def __init__(self, sim, osd):
        self.sim, self.osd = sim, osd

    @property
    def me(self):
        return self.osd.id

    @property
    def store(self):
        return self.osd.store

    @property
    def map(self):
        return self.osd.map

    async def remote(self, osd_id, header, payload):
        try:
            return await self.sim.net.request(self.osd.id, osd_id, header, payload,
                                              PEER_CALL_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as exc:
            raise RequestFailed(Code.AGAIN, f"osd.{osd_id}: {exc}") from None

    def send(self, osd_id, header, payload, timeout_s, crc=None):
        return asyncio.ensure_future(self.sim.net.request(self.osd.id, osd_id, header, payload,
                                                          timeout_s))

    async def monitor(self, request):
        await asyncio.sleep(self.sim.rng.uniform(0, 0.01))
        if self.osd.id in self.sim.net.cut:
            await asyncio.sleep(1.0)
            raise RequestFailed(Code.AGAIN, "monitors unreachable")
        return self.sim.monitor.request(request)

    async def wait_for_epoch(self, epoch, timeout_s):
        async with asyncio.timeout(timeout_s):
            while self.osd.map is None or self.osd.map.epoch < epoch:
                await self.osd.map_changed.wait()


class SimOsd:
    def __init__(self, sim, osd_id, directory):
        self.sim, self.id = sim, osd_id
        self.meta = os.path.join(directory, f"osd{osd_id}")
        self.device = None
        self.store = self.registry = self.service = None
        self.map = None
        self.map_changed = asyncio.Event()
        self.running = False
        self.incarnation = 0
        self.tasks = {}                 # task -> None: in the order started (a set's order
                                        # follows memory addresses: runs would differ)

    async def create(self):
        self.device = MemoryBlockDevice(DEVICE_BYTES, rng=random.Random(self.sim.seed * 31 + self.id))
        await mkfs(self.device, self.meta, force=True)

    async def start(self, cmap):
        """A fresh process over the device and metadata as a crash (or a clean stop) left them."""
        self.store = await Store.open(self.device, self.meta)
        self.store._db_thread = InlineExecutor()
        self.incarnation += 1
        parts = assemble(SimPort(self.sim, self), lambda peer, header, result: None)
        self.registry, self.service = parts.registry, parts.service
        self.registry.load_local()
        self.running = True
        self.map = None
        self.spawn(self.registry.tidy_strays_forever(), background=True)
        self.see_map(cmap)

    def see_map(self, cmap):
        if not self.running or (self.map is not None and cmap.epoch <= self.map.epoch):
            return
        self.map = cmap
        self.registry.on_map(cmap)
        self.map_changed.set()
        self.map_changed = asyncio.Event()

    def spawn(self, coroutine, background=False):
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks[task] = None
        task.add_done_callback(lambda done: self.tasks.pop(done, None))
        if background:
            task.add_done_callback(self.sim.background_done)
        return task

    async def crash(self):
        """Power loss: every task of this process stops where it is; the device keeps, loses
        or tears each write it had not flushed."""
        self.running = False
        await self.registry.stop()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.device.crash(self.sim.rng)
        await self.store.abandon()
        self.device = MemoryBlockDevice(image=self.device.image(),
                                        rng=random.Random(self.sim.rng.random()))

    async def stop(self):
        if self.running:
            self.running = False
            await self.registry.stop()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.store.close()


# -- what clients were told, and what they may read ---------------------------------------------------


class Model:
    """Per object: the value of its last acknowledged write (None: deleted or never written)
    and the values of writes after it whose outcome the client does not know. A read may
    return any of these; once it returned an unknown write's value, that write happened."""

    def __init__(self):
        self.acked = {}
        self.unknown = {}

    def allowed(self, name):
        return [self.acked.get(name)] + self.unknown.get(name, [])

    def wrote(self, name, value, acknowledged):
        if acknowledged:
            self.acked[name] = value
            self.unknown[name] = []
        else:
            self.unknown.setdefault(name, []).append(value)

    def read(self, name, value):
        allowed = self.allowed(name)
        if value not in allowed:
            return False
        if value != allowed[0]:
            later = self.unknown[name]
            del later[:later.index(value) + 1]
            self.acked[name] = value
        return True


# -- the simulation -------------------------------------------------------------------------------------


class Simulation:
    """Six OSDs on six hosts, a replicated pool (size 3, min_size 2) and an erasure-coded one
    (2+2), a few PGs each; clients and faults from one seed (see the module's docstring)."""

    HOSTS = 6
    PG_NUM = 2
    CLIENTS = 4
    NAMES_PER_CLIENT = 3

    def __init__(self, seed, directory, duration_s=60.0, faults=True):
        self.seed = seed
        self.rng = random.Random(seed)
        self.directory = directory
        self.duration_s = duration_s
        self.faults = faults
        self.loop = None
        self.net = SimNet(self.rng, self)
        self.monitor = None
        self.osds = {}
        self.model = Model()
        self.bugs = []
        self.history = []
        self.counts = {"acked": 0, "unknown": 0, "reads": 0, "crashes": 0, "outs": 0,
                       "refused": 0}

    def capture_logs(self):
        """OSD log lines (warnings and up) go into the history, with the virtual time."""
        sim = self

        class ToHistory(logging.Handler):
            def emit(self, record):
                if sim.loop is not None:
                    sim.note(f"log {record.levelname.lower()}: {record.getMessage()}")
        handler = ToHistory(level=logging.INFO)
        logging.getLogger("cairn.osd").addHandler(handler)
        return handler

    def note(self, text):
        self.history.append(f"{self.loop.time():9.3f} {text}")
        log.debug("%s", text)

    def bug(self, text, exc=None):
        self.note(f"BUG {text}")
        self.bugs.append((text, exc))

    def background_done(self, task):
        if not task.cancelled() and task.exception() is not None:
            self.bug(f"a background task died: {task.exception()!r}", task.exception())

    def initial_map(self):
        cmap = ClusterMap("sim", epoch=1)
        ops = []
        for osd_id in range(self.HOSTS):
            ops += [{"op": "osd_add", "id": osd_id, "uuid": f"u{osd_id}",
                     "location": {"host": f"h{osd_id}"}},
                    {"op": "osd_boot", "id": osd_id, "addr": f"sim:{osd_id}"}]
        ops += [{"op": "pool_create", "name": "rep", "kind": "replicated", "size": 3,
                 "min_size": 2, "pg_num": self.PG_NUM},
                {"op": "pool_create", "name": "ec", "kind": "erasure", "k": 2, "m": 2,
                 "pg_num": self.PG_NUM}]
        return cmap.apply(Incremental(2, tuple(ops)))

    # -- maps --------------------------------------------------------------------------------

    def publish(self, *ops):
        """A new map from the monitor; each running OSD sees it after its own delay."""
        cmap = self.monitor.change(*ops)
        self.note(f"epoch {cmap.epoch}: {ops}")
        self.maps.append((self.loop.time(), cmap))
        for osd in self.osds.values():
            delay = self.rng.uniform(0, 0.3) if self.rng.random() < 0.8 else \
                self.rng.uniform(0.3, 2.0)
            self.loop.call_later(delay, osd.see_map, cmap)
        return cmap

    def client_map(self):
        """The map a client has: the monitor's, as of a moment up to a second ago (clients
        learn new maps late too; an old primary then still gets their ops)."""
        seen_by = self.loop.time() - self.rng.uniform(0, 1.0)
        return next((cmap for at, cmap in reversed(self.maps) if at <= seen_by),
                    self.maps[0][1])

    # -- clients -------------------------------------------------------------------------------

    async def client_op(self, header, payload=b""):
        """One client op as the client library sends it: to the PG's primary in the newest
        map, retried on `again` and the like until it is answered or the op's deadline.
        Returns the reply, or raises the last failure (RequestFailed)."""
        deadline = self.loop.time() + 30.0
        while True:
            cmap = self.client_map()
            pool = cmap.pools[header["pool_name"]]
            acting = pgs.acting_set(cmap, pool["name"], header["pg"])
            request = {k: v for k, v in header.items() if k != "pool_name"}
            request.update(pool=pool["id"], epoch=cmap.epoch)
            failure = None
            if acting.primary is None:
                failure = RequestFailed(Code.AGAIN, "no primary")
            else:
                try:
                    return await self.net.request("client", acting.primary, request, payload, 5.0)
                except RequestFailed as exc:
                    if exc.code not in (Code.AGAIN, Code.WRONG_PRIMARY, Code.STALE,
                                        Code.POOL_UNAVAILABLE):
                        raise
                    failure = exc
                except (ConnectionClosed, RequestTimeout) as exc:
                    failure = RequestFailed(Code.AGAIN, str(exc))
            if self.loop.time() > deadline:
                raise failure
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))

    async def client(self, index, until):
        names = [(pool, f"c{index}.{pool}.{n}", n % self.PG_NUM)
                 for pool in ("rep", "ec") for n in range(self.NAMES_PER_CLIENT)]
        serial = 0
        while self.loop.time() < until:
            pool, name, pg_index = self.rng.choice(names)
            header = {"pool_name": pool, "pg": pg_index, "name": name}
            action = self.rng.random()
            if action < 0.45:
                serial += 1
                value = f"{name}={serial}".encode() * self.rng.choice((1, 40, 300))
                await self.write(header, value)
            elif action < 0.55:
                await self.write(header, None)
            else:
                await self.read(header)
            await asyncio.sleep(self.rng.uniform(0, 0.2))

    async def write(self, header, value):
        name = header["name"]
        op = {**header, "op": "put" if value is not None else "delete"}
        try:
            reply, _ = await self.client_op(op, value or b"")
        except RequestFailed as exc:
            if exc.code == Code.NOT_FOUND and value is None:
                self.model.wrote(name, None, True)      # a delete of nothing: it is absent
                self.note(f"delete {name}: not found")
                return
            self.counts["unknown"] += 1
            self.model.wrote(name, value, False)
            self.note(f"{op['op']} {name} unknown: {exc.code}")
            return
        self.counts["acked"] += 1
        self.model.wrote(name, value, True)
        self.note(f"{op['op']} {name} acked: version {reply.get('version', 0):x}")

    async def read(self, header, required=False):
        name = header["name"]
        allowed = self.model.allowed(name)
        try:
            _, data = await self.client_op({**header, "op": "get"})
            value = bytes(data)
        except RequestFailed as exc:
            if exc.code != Code.NOT_FOUND:
                if required:
                    raise AssertionError(f"seed {self.seed}: {name} unreadable after healing: "
                                         f"{exc}") from None
                self.counts["refused"] += 1
                return
            value = None
        self.counts["reads"] += 1
        if not self.model.read(name, value):
            shown = [v[:24] if v else v for v in allowed]
            self.bug(f"read of {name} returned {value[:24] if value else value!r}, "
                     f"allowed {shown}")

    # -- faults ----------------------------------------------------------------------------------

    async def nemesis(self, until):
        down, out = set(), set()
        while self.loop.time() < until:
            await asyncio.sleep(self.rng.uniform(0.5, 4.0))
            action = self.rng.random()
            alive = [o for o in self.osds.values() if o.running]
            if action < 0.25 and len(down) < 2:
                victim = self.rng.choice(alive)
                self.note(f"crash osd.{victim.id}")
                self.counts["crashes"] += 1
                await victim.crash()
                down.add(victim.id)
                await asyncio.sleep(self.rng.uniform(0.5, 3.0))   # the failure detector
                self.publish({"op": "osd_down", "id": victim.id})
            elif action < 0.45 and down:
                back = self.osds[self.rng.choice(sorted(down))]
                self.note(f"restart osd.{back.id}")
                await back.start(self.monitor.map)
                down.discard(back.id)
                self.publish({"op": "osd_boot", "id": back.id, "addr": f"sim:{back.id}"})
            elif action < 0.55 and len(out) < 1:
                victim = self.rng.choice(sorted(self.osds))
                out.add(victim)
                self.counts["outs"] += 1
                self.publish({"op": "osd_out", "id": victim})
            elif action < 0.65 and out:
                back = self.rng.choice(sorted(out))
                out.discard(back)
                self.publish({"op": "osd_in", "id": back})
            elif action < 0.8:
                self.net.loss = self.rng.choice((0.0, 0.02, 0.1))
                self.note(f"message loss {self.net.loss}")
        self.net.loss = 0.0
        for osd_id in sorted(down):
            await self.osds[osd_id].start(self.monitor.map)
            self.publish({"op": "osd_boot", "id": osd_id, "addr": f"sim:{osd_id}"})
        for osd_id in sorted(out):
            self.publish({"op": "osd_in", "id": osd_id})

    # -- the run ----------------------------------------------------------------------------------

    def clean(self):
        """Whether every PG of every pool is active and clean on its primary."""
        cmap = self.monitor.map
        for pool in cmap.pools.values():
            for index, acting in enumerate(pgs.acting_sets(cmap, pool["name"])):
                primary = self.osds.get(acting.primary)
                if primary is None or not primary.running or primary.map is not cmap:
                    return False
                pg = primary.registry.pgs.get((pool["id"], index))
                if pg is None or not pg.core.serving or not pg.core.clean:
                    return False
        return True

    async def main(self):
        self.loop = asyncio.get_running_loop()
        self.monitor = SimMonitor(self.initial_map())
        self.maps = [(0.0, self.monitor.map)]
        self.osds = {i: SimOsd(self, i, self.directory) for i in range(self.HOSTS)}
        try:
            for osd in self.osds.values():
                await osd.create()
                await osd.start(self.monitor.map)
            until = self.loop.time() + self.duration_s
            jobs = [self.client(index, until) for index in range(self.CLIENTS)]
            if self.faults:
                jobs.append(self.nemesis(until))
            await asyncio.gather(*jobs)
            self.note("healed; waiting for every PG to be clean")
            settle_until = self.loop.time() + 600.0
            while not self.clean():
                if self.loop.time() > settle_until:
                    raise AssertionError(f"seed {self.seed}: PGs not clean 600 s after healing; "
                                         f"{self.pg_states()}")
                await asyncio.sleep(1.0)
            for index in range(self.CLIENTS):
                for pool in ("rep", "ec"):
                    for n in range(self.NAMES_PER_CLIENT):
                        await self.read({"pool_name": pool, "pg": n % self.PG_NUM,
                                         "name": f"c{index}.{pool}.{n}"}, required=True)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + self._recent_history()) from exc
        finally:
            for osd in self.osds.values():
                if osd.store is not None and osd.running:
                    await osd.stop()
        if self.bugs:
            text, exc = self.bugs[0]
            raise BugFound(f"seed {self.seed}: {text}\n" + self._recent_history()) from exc
        return self

    def _recent_history(self):
        """The last SIM_HISTORY (default 60) events, for a failure's message."""
        return "\n".join(self.history[-int(os.environ.get("SIM_HISTORY", "60")):])

    def pg_states(self):
        states = {}
        for osd in self.osds.values():
            if osd.running:
                for key, pg in osd.registry.pgs.items():
                    if pg.core.role.value == "primary":
                        states[f"{key[0]}.{key[1]} on osd.{osd.id}"] = pg.core.state
        return states


def simulate(seed, duration_s=60.0, faults=True):
    """Run one seeded simulation; returns it (counts, history) or raises what it found."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        sim = Simulation(seed, scratch, duration_s, faults)
        original = pgs_module.crash_on_error
        pgs_module.crash_on_error = sim.background_done     # a peering task's death is a finding
        handler = sim.capture_logs()
        # A PG log of a few entries, so trims (and recovery by backfill across them) happen.
        window = PgCore.log_entries_kept, PgCore.log_trim_batch
        PgCore.log_entries_kept, PgCore.log_trim_batch = 8, 4
        osd_log = logging.getLogger("cairn.osd")
        level, propagate = osd_log.level, osd_log.propagate
        osd_log.setLevel(logging.INFO)
        osd_log.propagate = False                           # into the history, not the output
        try:
            return run(sim.main())
        finally:
            pgs_module.crash_on_error = original
            PgCore.log_entries_kept, PgCore.log_trim_batch = window
            osd_log.removeHandler(handler)
            osd_log.setLevel(level)
            osd_log.propagate = propagate


def run_seed(job):
    """(seed, None) or (seed, what it found): one seed of `run_seeds`, in a worker process."""
    seed, duration_s = job
    try:
        simulate(seed, duration_s=duration_s)
    except (AssertionError, SimulationStalled) as exc:
        return seed, f"{type(exc).__name__}: {str(exc)[:6000]}"
    return seed, None


def run_seeds(seeds, duration_s, workers):
    """[(seed, what it found)] of the seeds that failed, run `workers` at a time in fresh
    processes (spawned: the test process holds threads a fork would copy mid-flight). The
    workers end with the pool, also when this is interrupted."""
    jobs = [(seed, duration_s) for seed in seeds]
    if workers <= 1:
        results = map(run_seed, jobs)
        return sorted((seed, text) for seed, text in results if text)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.imap_unordered(run_seed, jobs, chunksize=4)
        return sorted((seed, text) for seed, text in results if text)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(
        description="Replay seeds of the simulation (tests/test_simulation.py runs 30 s seeds in "
                    "CI and 60 s ones in the slow tier). SIM_HISTORY=N: events shown on a failure.")
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--seconds", type=float, default=30.0, help="virtual seconds of faults")
    options = parser.parse_args()
    for seed in options.seeds:
        result = simulate(seed, duration_s=options.seconds)
        print(f"seed {seed}: {result.counts}; messages {result.net.delivered} delivered, "
              f"{result.net.lost} stuck, {result.net.late} handled late")
