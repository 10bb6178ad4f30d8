"""Talking to the monitors: requests with fail-over, and a cluster map kept current.

`MonClient(addrs)` is what OSDs, clients and the CLI use:
- `await request(header)` sends to the monitor it is connected to; when that monitor is gone
  (connection lost, no reply in time) it moves to the next address and retries, until
  `deadline_s` runs out. Errors the monitor itself returns (`RequestFailed`) are not retried:
  they are answers, except `no_quorum` (an election under way, or a monitor cut off from the
  majority), which is retried on the next monitor while time is left. Every request carries a
  request id (`rid`), the same on every retry, so a map change whose reply was lost is done
  once, not twice (mon/monitor.py).
- `await subscribe()` fetches the map and keeps `self.map` current from the monitor's pushes; if
  the connection drops, a background task reconnects (to any monitor) and asks for the epochs it
  missed. `await wait_for_epoch(e)` waits until the map is at least epoch e. Callbacks registered
  with `on_map(fn)` get every new map in order.
- A monitor cut off from the majority still answers, with the last map it has, and pushes
  nothing new. Its replies say it knows no leader (`leader: None`), so `get_map` then asks the
  other monitors too and keeps the newest map, and moves the subscription to a monitor that
  knows a leader. `wait_for_epoch` asks with `get_map` whenever no push brought the epoch
  within `EPOCH_PUSH_WAIT_S`. A client whose monitor is cut off therefore catches up as soon as
  an OSD tells it its map is old. It does not wait for the partition to heal.

`load_cluster(where)` turns what a user typed (a cluster directory made by `cairn-cluster up`,
its `cluster.json`, or `host:port,host:port`) into monitor addresses.
"""

import asyncio
import json
import logging
import os

import msgpack

from cairn.common import messenger
from cairn.common.clustermap import ClusterMap, Incremental, MapError
from cairn.common.codes import Code
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout

log = logging.getLogger("cairn.monclient")

# How long a request keeps trying other monitors before giving up. Raft elections finish within
# a few seconds; 15 s covers one plus a restart of a lone monitor.
MON_DEADLINE_S_DEFAULT = 15.0
# A no_quorum answer is retried on another monitor only with this much of the deadline left.
NO_QUORUM_RETRY_S_MIN = 1.0
RECONNECT_DELAY_S_MAX = 1.0
# wait_for_epoch waits this long for a push before it asks for the map.
EPOCH_PUSH_WAIT_S = 0.5
# Map pushes waiting to be applied; each is one small incremental.
PUSHES_QUEUED_MAX = 1024


class ClusterNotFound(Exception):
    """The cluster description could not be found or read; the message says where we looked."""


class MonitorsUnavailable(Exception):
    """No monitor answered before the deadline."""


def load_cluster(where):
    """Monitor addresses (a list of 'host:port') from a directory, a cluster.json or a list."""
    if where is None:
        where = os.environ.get("CAIRN_CLUSTER")
    if not where:
        raise ClusterNotFound("no cluster given: pass --cluster DIR (a directory made by "
                              "'cairn-cluster up') or set CAIRN_CLUSTER")
    path = os.path.join(where, "cluster.json") if os.path.isdir(where) else where
    if os.path.isfile(path):
        try:
            with open(path) as handle:
                description = json.load(handle)
            addrs = [mon["addr"] for mon in description["mons"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterNotFound(f"{path} is not a cluster description ({exc})") from None
        if not addrs:
            raise ClusterNotFound(f"{path} names no monitors")
        return addrs
    if os.path.isdir(where) or "/" in where or where.endswith(".json"):
        raise ClusterNotFound(f"no cluster.json at {path}; is the cluster up "
                              f"('cairn-cluster up --dir {where}')?")
    addrs = [part.strip() for part in where.split(",") if part.strip()]
    for addr in addrs:
        try:
            messenger.parse_addr(addr)
        except ValueError as exc:
            raise ClusterNotFound(f"{where!r} is neither a directory nor monitor addresses: "
                                  f"{exc}") from None
    return addrs


class MonClient:
    def __init__(self, addrs, deadline_s=MON_DEADLINE_S_DEFAULT, name="client",
                 authenticate=None, tls=None):
        if not addrs:
            raise ValueError("MonClient needs at least one monitor address")
        self.addrs = list(addrs)
        self.deadline_s = deadline_s
        self.name = name
        self.map = None
        self._next = 0
        self._id = os.urandom(8).hex()      # request ids: this client's id and a counter
        self._requests = 0
        self._connection = None
        self._connect_lock = asyncio.Lock()
        self._subscribed = False
        self._keeper = None
        self._map_changed = asyncio.Condition()
        self._callbacks = []
        self._closing = False
        self._pushes = asyncio.Queue(maxsize=PUSHES_QUEUED_MAX)
        self.authenticate = authenticate    # the handshake on each new connection
        self.tls = tls                      # an ssl.SSLContext when the cluster serves TLS

    # -- connections --------------------------------------------------------------------------

    async def _connected(self, deadline):
        """The open connection, or a new one to the next monitor that answers."""
        async with self._connect_lock:
            if self._connection is not None and not self._connection.closed:
                return self._connection
            delay = 0.05
            errors = []
            loop = asyncio.get_running_loop()
            while True:
                addr = self.addrs[self._next % len(self.addrs)]
                self._next += 1
                try:
                    timeout = max(0.1, min(messenger.CONNECT_TIMEOUT_S_DEFAULT,
                                           deadline - loop.time()))
                    connection = await messenger.connect(addr, on_push=self._on_push,
                                                         timeout_s=timeout,
                                                         authenticate=self.authenticate,
                                                         tls=self.tls)
                    self._connection = connection
                    if self._subscribed:
                        await self._resubscribe(connection)
                    return connection
                except (ConnectionClosed, RequestTimeout) as exc:
                    errors.append(str(exc))
                if loop.time() + delay >= deadline:
                    raise MonitorsUnavailable(
                        f"no monitor answered within {self.deadline_s:g} s "
                        f"({'; '.join(errors[-len(self.addrs):])})")
                if self._next % len(self.addrs) == 0:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_DELAY_S_MAX)

    async def request_with_session(self, header):
        """(reply, the connection it came on): for replies holding secrets wrapped under that
        connection's session key (common/sessions.py)."""
        return await self._request(header)

    async def ticket(self):
        """The monitors' answer to auth_get_ticket, and its connection; None without auth."""
        reply, connection = await self.request_with_session({"op": "auth_get_ticket"})
        if reply.header.get("auth") == "none":
            return None
        return reply, connection

    async def request(self, header, payload=b"", timeout_s=messenger.REQUEST_TIMEOUT_S_DEFAULT):
        """The monitor's reply frame; RequestFailed is the monitor's answer, MonitorsUnavailable
        means none answered in time."""
        reply, _ = await self._request(header, payload, timeout_s)
        return reply

    async def _request(self, header, payload=b"", timeout_s=messenger.REQUEST_TIMEOUT_S_DEFAULT):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        if "rid" not in header:
            self._requests += 1
            header = {**header, "rid": f"{self._id}.{self._requests}"}
        refused = None                  # the last no_quorum answer: the truth if time runs out
        while True:
            try:
                connection = await self._connected(deadline)
            except MonitorsUnavailable:
                if refused is not None:
                    raise refused from None
                raise
            try:
                reply = await connection.request(header, payload,
                                                 timeout_s=min(timeout_s, max(0.1, deadline -
                                                                              loop.time())))
                return reply, connection
            except (ConnectionClosed, RequestTimeout) as exc:
                await connection.close()
                if loop.time() >= deadline:
                    if refused is not None:
                        raise refused from None
                    raise MonitorsUnavailable(f"{header.get('op')}: no monitor answered within "
                                              f"{self.deadline_s:g} s (last: {exc})") from None
                log.info("%s: monitor %s: %s; trying another", self.name, connection.addr, exc)
            except RequestFailed as exc:
                # No quorum is weather, not an answer: an election may be under way, or this
                # monitor is cut off from the majority. Try another while time is left.
                if exc.code != Code.NO_QUORUM or deadline - loop.time() < NO_QUORUM_RETRY_S_MIN:
                    raise
                refused = exc
                log.info("%s: monitor %s: %s; trying another", self.name, connection.addr,
                         exc.message)
                await connection.close()
                await asyncio.sleep(0.1)

    async def close(self):
        self._closing = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._connection is not None:
            await self._connection.close()

    # -- the map ------------------------------------------------------------------------------

    async def get_map(self):
        """Fetch the current map (no subscription needed). A monitor that knows no leader may be
        behind: then each other monitor is asked too, until one that knows a leader answers,
        and the connection (with the subscription) stays with that one."""
        for _ in range(len(self.addrs)):
            reply = await self.request({"op": "get_map", "have": self._epoch()})
            await self._absorb(reply.header, reply.payload)
            if reply.header.get("leader", "") is not None or len(self.addrs) == 1:
                break
            log.info("%s: monitor %s knows no leader (epoch %s); asking another", self.name,
                     self._connection.addr, reply.header.get("epoch"))
            await self._connection.close()
        return self.map

    async def subscribe(self):
        """Fetch the map and keep it current; returns the map."""
        self._subscribed = True
        connection = self._connection
        if connection is not None and not connection.closed:
            await self._resubscribe(connection)
        else:
            await self._connected(asyncio.get_running_loop().time() + self.deadline_s)
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep_connected())
        return self.map

    async def _resubscribe(self, connection):
        reply = await connection.request({"op": "subscribe", "have": self._epoch()})
        await self._absorb(reply.header, reply.payload)

    async def _keep_connected(self):
        # Runs until close(): applies pushed maps in order, and after a lost connection
        # reconnects (which resubscribes and fetches what was missed).
        while not self._closing:
            try:
                async with asyncio.timeout(0.1):
                    received = await self._pushes.get()
            except TimeoutError:
                received = None
            if received is not None:
                try:
                    await self._absorb(received.header, received.payload)
                except (MapError, ConnectionClosed, RequestTimeout, MonitorsUnavailable) as exc:
                    log.warning("%s: map push not applied (%s)", self.name, exc)
            if self._connection is None or self._connection.closed:
                try:
                    await self._connected(asyncio.get_running_loop().time() + self.deadline_s)
                except MonitorsUnavailable as exc:
                    log.warning("%s: still no monitor: %s", self.name, exc)

    def _epoch(self):
        return self.map.epoch if self.map is not None else 0

    def on_map(self, callback):
        self._callbacks.append(callback)

    def _on_push(self, received):
        if received.header.get("op") != "map":
            return
        if self._pushes.full():
            # We fell this far behind: drop the backlog; the next push shows a gap, and a gap
            # fetches everything missed in one request.
            while not self._pushes.empty():
                self._pushes.get_nowait()
        self._pushes.put_nowait(received)

    async def _absorb(self, header, payload):
        form = header.get("form")
        if form == "current":
            return
        data = msgpack.unpackb(payload, strict_map_key=False) if payload else None
        if form == "full":
            new_map = ClusterMap.from_dict(data)
            if self.map is not None and new_map.epoch <= self.map.epoch:
                return
            await self._publish(new_map)
        elif form == "incrementals":
            for entry in data:
                incremental = Incremental.from_dict(entry)
                if self.map is None or incremental.epoch <= self.map.epoch:
                    continue
                if incremental.epoch != self.map.epoch + 1:          # a gap: fetch what we miss
                    reply = await self.request({"op": "get_map", "have": self._epoch()})
                    await self._absorb(reply.header, reply.payload)
                    return
                await self._publish(self.map.apply(incremental))
        else:
            raise MapError(f"unknown map form {form!r}")

    async def _publish(self, new_map):
        self.map = new_map
        for callback in self._callbacks:
            callback(new_map)
        async with self._map_changed:
            self._map_changed.notify_all()

    async def wait_for_epoch(self, epoch, timeout_s=10.0):
        """The map once it is at least `epoch`; TimeoutError after `timeout_s`. Pushes bring
        new epochs; when none has within EPOCH_PUSH_WAIT_S, the map is asked for (get_map
        moves away from a monitor that knows no leader)."""
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    async with asyncio.timeout(EPOCH_PUSH_WAIT_S):
                        async with self._map_changed:
                            await self._map_changed.wait_for(lambda: self._epoch() >= epoch)
                    return self.map
                except TimeoutError:
                    pass
                try:
                    await self.get_map()
                except (MonitorsUnavailable, RequestFailed, ConnectionClosed,
                        RequestTimeout) as exc:
                    log.info("%s: waiting for epoch %d: %s", self.name, epoch, exc)
                if self._epoch() >= epoch:
                    return self.map
