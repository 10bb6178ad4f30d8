"""Raft messages between monitors: the outboxes and their senders, the receiving side that
hands messages to the Raft core, and the reports of refused messages (MON_PEER_INVALID).

Theory of operation: the Raft core (mon/raft.py) queues messages in its Ready; the monitor's
loop hands each to `send`, which puts it in the target's outbox (bounded: the oldest go first
when a peer is unreachable, Raft resends what matters). One sender task per peer drains its
outbox in frames of up to RAFT_MESSAGES_PER_FRAME_MAX, so a slow peer delays no one else.
`on_raft` takes a received frame: it checks the cluster's fsid, decodes the messages and steps
the core with each. A message the core refuses (raft.PeerInvalid) is logged with its sender,
answered `invalid`, and recorded in the monitor's peerguard.Findings; a follower reports its
findings to the leader (`peer_report_loop`, `peer_invalid_report`), which answers `cairn health`.
"""

import asyncio
import collections
import logging
import time

import msgpack

from cairn.common import messenger
from cairn.common.codes import Code
from cairn.common.daemon import crash_on_error
from cairn.common.frame import Frame, Kind
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.mon import raft

log = logging.getLogger("cairn.mon")

RAFT_SEND_TIMEOUT_S = 1.0
MON_NAME_BYTES_MAX = 64
# Raft messages queued per peer; the oldest go first when a peer is unreachable (Raft resends).
OUTBOX_MESSAGES_MAX = 1024
RAFT_MESSAGES_PER_FRAME_MAX = 256
# A failed send waits this long (one Raft tick) before the sender tries the peer again.
SEND_RETRY_S = 0.1
# How often a follower sends the leader the raft messages it refused.
PEER_REPORT_INTERVAL_S = 1.0


def addr_of(monitor, name):
    if name == monitor.name:
        return monitor.addr
    return monitor.raft.members.get(name) or monitor._learned_addrs.get(name)


def send(monitor, m):
    box = monitor._outbox.get(m.target)
    if box is None:
        box = monitor._outbox[m.target] = collections.deque(maxlen=OUTBOX_MESSAGES_MAX)
        monitor._outbox_ready[m.target] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(sender(monitor, m.target),
                                                      name=f"raft sender to {m.target}")
        task.add_done_callback(crash_on_error)
        monitor._tasks.append(task)
    box.append(m)
    monitor._outbox_ready[m.target].set()


async def sender(monitor, name):
    # Runs until the monitor stops: one per peer, so a slow peer delays no one else.
    box, ready = monitor._outbox[name], monitor._outbox_ready[name]
    while True:
        await ready.wait()
        ready.clear()
        batch = [raft.message_to_wire(box.popleft())
                 for _ in range(min(len(box), RAFT_MESSAGES_PER_FRAME_MAX))]
        if box:
            ready.set()
        addr = addr_of(monitor, name)
        if not batch or addr is None:
            continue
        header = {"op": "raft", "from": monitor.name,
                  "addr": monitor.addr, "fsid": monitor.map.fsid}
        try:
            connection = await monitor._peers.get(name, addr)
            await connection.request(header, msgpack.packb(batch),
                                     timeout_s=RAFT_SEND_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout, RequestFailed) as exc:
            # Lost messages are Raft's normal weather: it resends what matters.
            log.debug("raft messages to %s (%s) dropped: %s", name, addr, exc)
            await monitor._peers.discard(name)
            await asyncio.sleep(SEND_RETRY_S)


def on_raft(monitor, received):
    header = received.header
    if header.get("fsid") != monitor.map.fsid:
        raise RequestFailed(Code.INVALID, f"raft messages for cluster {header.get('fsid')!r}, "
                            f"this is {monitor.map.fsid}")
    source, addr = header.get("from"), header.get("addr")
    try:
        wires = msgpack.unpackb(bytes(received.payload), strict_map_key=False)
        if not isinstance(wires, list):
            raise ValueError("not a list")
        messages = [raft.message_from_wire(wire) for wire in wires]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RequestFailed(Code.INVALID, f"malformed raft messages: {exc}") from None
    now = time.monotonic()
    refused = None
    for m in messages:
        if m.target != monitor.name:
            continue
        if m.source != source:
            refused = raft.PeerInvalid(m.source, m.kind, f"sent in a batch from {source!r}")
        else:
            try:
                monitor.raft.step(m)
                monitor._seen[m.source] = now
                continue
            except raft.PeerInvalid as exc:
                refused = exc
        break
    monitor._wake.set()
    if refused is not None:
        # The core changed nothing for it; the rest of the batch is dropped with it.
        log.warning("refused a raft message from %s (%s): %s", str(source)[:64],
                    received.header.get("addr"), refused)
        monitor._peer_findings.record(monitor.name, refused.sender, refused.kind.value,
                                      refused.reason, now)
        raise RequestFailed(Code.INVALID, f"raft message refused: {refused}")
    if isinstance(source, str) and isinstance(addr, str) and \
            len(source) <= MON_NAME_BYTES_MAX:
        try:
            messenger.parse_addr(addr)
            monitor._learned_addrs[source] = addr
        except ValueError:
            pass
    return {}, b""


async def peer_report_loop(monitor):
    # Runs until the monitor stops: a follower's refused raft messages go to the leader,
    # which answers `cairn health` (mon/peerguard.py).
    while True:
        await asyncio.sleep(PEER_REPORT_INTERVAL_S)
        if monitor.is_leader:
            monitor._peer_findings.pending()           # the leader's own: already in its check
            continue
        reports = monitor._peer_findings.pending()
        if not reports:
            continue
        header = {"op": "peer_invalid_report", "reports": reports}
        try:
            await monitor._forward(Frame(Kind.REQUEST, 0, header, b""))
        except (RequestFailed, ConnectionClosed, RequestTimeout) as exc:
            monitor._peer_findings.unsend(reports)
            log.warning("raft peer findings not reported to the leader yet: %s", exc)


async def peer_invalid_report(monitor, peer, header):
    try:
        monitor._peer_findings.merge(header.get("reports"), time.monotonic())
    except ValueError as exc:
        raise RequestFailed(Code.INVALID, f"peer_invalid_report: {exc}") from None
    return {}, b""
