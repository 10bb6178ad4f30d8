"""The OSD's port: everything its PG code needs from outside itself, in one small interface.

Theory of operation. The PG code (the registry's peering and recovery, osd/pgs.py; the layout
backends, osd/backend*.py; the member ops, osd/member_ops.py) never reaches the daemon. What it
needs from the world comes through a `Port`:

    me, store, map          this OSD's id, its store, the cluster map it has now
    call(osd, header, payload)
                            one request to another OSD, answered (header, payload); to this
                            OSD itself it goes to `local`, the op table (osd/service.py)
    send(osd, header, payload, timeout_s, crc)
                            a request whose reply is awaited later (a replica write): an
                            awaitable of the reply, with no task over an open connection
    monitor(request)        one request to the monitors, answered with its reply header
    wait_for_epoch(epoch, timeout_s)
                            until the map reaches `epoch` (TimeoutError after `timeout_s`)

`DaemonPort` is the daemon's: real connections (messenger.ConnectionPool) and the monitor
client. tests/simnet.py implements the same interface in memory, so the seeded simulation runs
the shipped registry, backends and op handlers over lost, late, duplicated messages and crashes.
Failures of the transport reach the caller as RequestFailed(Code.AGAIN), whatever the port.
"""

import abc
import asyncio

from cairn.common import messenger
from cairn.common.codes import Code
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout

# Deadline of one peering or recovery call to another OSD; a member that does not answer in
# time makes peering start again.
PEER_CALL_TIMEOUT_S = 10.0


class Port(abc.ABC):
    """What the PG code needs from outside (see the module's docstring)."""

    # The op table's entry point for a call to this OSD itself: async (header, payload) ->
    # (reply header, payload); set where the service is built.
    local = None

    @property
    @abc.abstractmethod
    def me(self):
        ...

    @property
    @abc.abstractmethod
    def store(self):
        ...

    @property
    @abc.abstractmethod
    def map(self):
        ...

    async def call(self, osd_id, header, payload=b""):
        """One request to `osd_id` (handled here when it is us); its reply (header, payload)."""
        if osd_id == self.me:
            return await self.local(dict(header), payload)
        return await self.remote(osd_id, header, payload)

    @abc.abstractmethod
    async def remote(self, osd_id, header, payload):
        ...

    @abc.abstractmethod
    def send(self, osd_id, header, payload, timeout_s, crc=None):
        """Send now; an awaitable of the reply (raises what the transport or the peer did)."""

    @abc.abstractmethod
    async def monitor(self, request):
        ...

    @abc.abstractmethod
    async def wait_for_epoch(self, epoch, timeout_s):
        ...

    def header(self, pg, op, epoch, **fields):
        """The header of a member op of `pg` from this OSD."""
        return {"op": op, "pool": pg.key[0], "pg": pg.key[1], "epoch": epoch, "from": self.me,
                **fields}


class DaemonPort(Port):
    """The daemon's port: its store, its monitor client's map, connections to its peers."""

    def __init__(self, daemon):
        self._daemon = daemon
        self.connections = messenger.ConnectionPool(      # osd id -> Connection
            authenticate=daemon.tickets.authenticate, tls=daemon.tls_client)

    @property
    def me(self):
        return self._daemon.id

    @property
    def store(self):
        return self._daemon.store

    @property
    def map(self):
        return self._daemon.monc.map

    async def remote(self, osd_id, header, payload):
        osd = self.map.osds.get(osd_id)
        if osd is None or not osd["addr"]:
            raise RequestFailed(Code.AGAIN, f"osd.{osd_id} has no address")
        try:
            connection = await self.connections.get(osd_id, osd["addr"])
            reply = await connection.request(header, payload, timeout_s=PEER_CALL_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as exc:
            raise RequestFailed(Code.AGAIN, f"osd.{osd_id}: {exc}") from None
        return reply.header, reply.payload

    def send(self, osd_id, header, payload, timeout_s, crc=None):
        """Over an open connection the reply future itself (no task: a primary's writes made
        three tasks each with gather); else a task that connects first."""
        osd = self.map.osds.get(osd_id)
        addr = osd["addr"] if osd is not None else None
        connection = self.connections.ready(osd_id, addr) if addr else None
        if connection is not None:
            try:
                return connection.start_request(header, payload, timeout_s, crc)
            except ConnectionClosed:
                pass                        # reopened below

        async def connect_and_send():
            if not addr:
                raise ConnectionClosed(f"the map gives osd.{osd_id} no address")
            connection = await self.connections.get(osd_id, addr)
            return await connection.request(header, payload, timeout_s=timeout_s,
                                            payload_crc=crc)
        return asyncio.ensure_future(connect_and_send())

    async def monitor(self, request):
        return (await self._daemon.monc.request(request)).header

    async def wait_for_epoch(self, epoch, timeout_s):
        await self._daemon.monc.wait_for_epoch(epoch, timeout_s=timeout_s)

    async def close(self):
        await self.connections.close()
