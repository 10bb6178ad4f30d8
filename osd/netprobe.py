"""Packet loss and round-trip time to every other host, measured with UDP probes.

Each OSD probes one OSD on every other host (the lowest-numbered one up there) `PROBES_PER_S`
times a second, on the UDP port of the same number as its messenger's TCP port, and answers the
probes it receives with an echo. A probe whose echo has not come back within `ECHO_TIMEOUT_S` is
lost (a loss either way counts: 10% dropped each way loses about 19% of round trips). The
heartbeat reports, per peer host, what was sent and lost in the last `SHORT_WINDOW_S` and
`LONG_WINDOW_S` seconds and the mean RTT; the monitors judge (mon/netloss.py).

Datagram (24 bytes, little-endian): magic b"CPRB", kind (0 probe, 1 echo), 3 bytes zero, sender
OSD id (u32), sequence (u64), then sent at (u32, milliseconds of the sender's monotonic clock,
echoed back untouched). Anything else that arrives is ignored: the port is open to the network,
and a bad datagram must cost nothing.

Bandwidth: 5 probes and 5 echoes of 24 bytes a second per pair of hosts, about 1 KB/s each way
(UDP and IP headers included) for a host with 8 peers.
"""

import asyncio
import collections
import logging
import struct
import time

log = logging.getLogger("cairn.osd")

PROBES_PER_S = 5.0
ECHO_TIMEOUT_S = 2.0
SHORT_WINDOW_S = 20.0
LONG_WINDOW_S = 45.0
_DATAGRAM = struct.Struct("<4sB3xIQI")
MAGIC = b"CPRB"
PROBE, ECHO = 0, 1


class ProbeWindow:
    """The probes to one peer host (pure: the caller passes time in seconds)."""

    def __init__(self):
        self._probes = collections.OrderedDict()    # seq -> [sent at, rtt seconds or None]
        self._next = 0

    def sent(self, now):
        """A new probe's sequence number."""
        seq = self._next
        self._next += 1
        self._probes[seq] = [now, None]
        while self._probes and next(iter(self._probes.values()))[0] < now - LONG_WINDOW_S - \
                ECHO_TIMEOUT_S:
            self._probes.popitem(last=False)
        return seq

    def echoed(self, seq, now):
        probe = self._probes.get(seq)
        if probe is not None and probe[1] is None and now - probe[0] <= ECHO_TIMEOUT_S:
            probe[1] = now - probe[0]

    def stats(self, now, window_s):
        """(probes judged, of them lost, mean RTT ms or None) of the probes sent in the
        `window_s` seconds before the newest ECHO_TIMEOUT_S (whose echo may still come)."""
        judged = lost = 0
        rtts = []
        for sent_at, rtt in self._probes.values():
            if not now - window_s - ECHO_TIMEOUT_S <= sent_at <= now - ECHO_TIMEOUT_S:
                continue
            judged += 1
            if rtt is None:
                lost += 1
            else:
                rtts.append(rtt)
        return judged, lost, (round(sum(rtts) / len(rtts) * 1e3, 3) if rtts else None)


def encode(kind, osd_id, seq, sent_ms):
    return _DATAGRAM.pack(MAGIC, kind, osd_id & 0xFFFFFFFF, seq, sent_ms & 0xFFFFFFFF)


def decode(data):
    """(kind, osd id, seq, sent ms) or None for anything that is not a probe or an echo."""
    if len(data) != _DATAGRAM.size:
        return None
    magic, kind, osd_id, seq, sent_ms = _DATAGRAM.unpack(data)
    if magic != MAGIC or kind not in (PROBE, ECHO):
        return None
    return kind, osd_id, seq, sent_ms


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, prober):
        self.prober = prober
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.prober.received(data, addr)

    def error_received(self, exc):
        pass            # ICMP unreachable for a peer that went away: its probes count as lost


class NetProber:
    """The asyncio shell: one UDP socket, a probing task, and the windows per peer host."""

    def __init__(self, osd_id):
        self.osd_id = osd_id
        self.targets = {}                   # peer host -> (ip, port) of the OSD probed there
        self._windows = {}                  # peer host -> ProbeWindow
        self._by_addr = {}                  # (ip, port) -> peer host
        self._protocol = None
        self.bad_datagrams_total = 0

    async def start(self, ip, port):
        loop = asyncio.get_running_loop()
        _, self._protocol = await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=(ip, port))

    def close(self):
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()

    def set_targets(self, targets):
        """{peer host: "ip:port"} to probe from now on (hosts gone are forgotten)."""
        self.targets = {}
        for host, addr in targets.items():
            ip, _, port = addr.rpartition(":")
            self.targets[host] = (ip, int(port))
        self._windows = {host: self._windows.get(host) or ProbeWindow() for host in self.targets}
        self._by_addr = {target: host for host, target in self.targets.items()}

    async def run_forever(self):
        while True:
            await asyncio.sleep(1.0 / PROBES_PER_S)
            self.probe_all(time.monotonic())

    def probe_all(self, now):
        transport = self._protocol.transport if self._protocol else None
        if transport is None or transport.is_closing():
            return
        for host, target in self.targets.items():
            seq = self._windows[host].sent(now)
            transport.sendto(encode(PROBE, self.osd_id, seq, int(now * 1000)), target)

    def received(self, data, addr):
        message = decode(data)
        if message is None:
            self.bad_datagrams_total += 1
            return
        kind, osd_id, seq, sent_ms = message
        if kind == PROBE:
            self._protocol.transport.sendto(encode(ECHO, osd_id, seq, sent_ms), addr)
            return
        host = self._by_addr.get(addr[:2])
        if host is not None and osd_id == self.osd_id:
            self._windows[host].echoed(seq, time.monotonic())

    def report(self, now=None):
        """{peer host: {"short": [judged, lost], "long": [judged, lost], "rtt_ms": x}}."""
        now = time.monotonic() if now is None else now
        out = {}
        for host, window in self._windows.items():
            short, long_ = window.stats(now, SHORT_WINDOW_S), window.stats(now, LONG_WINDOW_S)
            out[host] = {"short": list(short[:2]), "long": list(long_[:2]), "rtt_ms": short[2]}
        return out


def probe_targets(cmap, osd_id):
    """{peer host: addr} of the OSD probed on every other host: the lowest-numbered one up."""
    me = cmap.osds.get(osd_id)
    here = me["location"].get("host") if me else None
    targets = {}
    for other in sorted(cmap.osds):
        osd = cmap.osds[other]
        host = osd["location"].get("host")
        if osd["up"] and osd["addr"] and host and host != here and host not in targets:
            targets[host] = osd["addr"]
    return targets
