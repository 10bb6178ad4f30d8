"""Hedged reads of replicated objects, the client's side (common/hedge.py is the policy,
osd/hedged.py the replica's side; docs/DESIGN.md "Hedged reads" says why).

A read goes to its PG's primary as usual. If the primary has not answered within the hedge
delay, the same `get` goes to another acting member as well (`replica: true`), paid from the
hedger's budget; the first answer is the read's. A hedge the primary beat is cancelled at the
replica too (`Connection.cancel`); a hedge that won is told to the primary (`hedge_won`,
one-way), which counts it for `cairn osd perf`. A primary a hedge beat that still has not
answered a while later is steered around: reads that would wait on it go to a replica first
for a second. Reads are watched in one deque with one timer for all of them (`_watch`,
`_sweep`), not a timer or a waiter per read: a healthy cluster pays almost nothing for this.
"""

import asyncio
import collections
import functools

from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common.placement import stable_pg

# A read steered to a replica (common/hedge.py) that has no answer in this long goes to its
# primary after all: the replica may have died or hung since the client chose it.
STEERED_READ_TIMEOUT_S = 2.0
# The sweep takes reads due this close to now (a timer may fire a little early).
HEDGE_SWEEP_SLACK_S = 0.0002


class HedgedReads:
    """The hedging of one client's (`cluster`'s) replicated reads; its policy and counters
    are `cluster.hedger`."""

    def __init__(self, cluster):
        self._cluster = cluster
        self._watched = collections.deque()     # (deadline, a primary's reply, hedge)
        self._timer = None
        self._loop = None

    async def read(self, pool, name, header):
        """A read of a replicated object (common/hedge.py): at its primary, hedged to another
        member if the primary is late; at another member first while the primary is steered
        around. None when this did not answer it (the first attempt met something `_send`
        retries: a map change, a closed connection, a refusal): the caller then reads the
        usual way. A typed error (not found, ...) is raised as `_send` would."""
        cmap, hedger = self._cluster.map, self._cluster.hedger
        pg_index = stable_pg(name, pool["pg_num"])
        acting = self._cluster._acting(pool["name"], pg_index)
        primary = acting.primary
        if primary is None:
            return None
        request = dict(header, name=name, pool=pool["id"], pg=pg_index, epoch=cmap.epoch)
        loop = self._loop = self._loop or self._cluster._loop or asyncio.get_running_loop()
        started = loop.time()
        if len(acting.members) > 1 and hedger.steering(primary):
            others = [osd for osd in acting.members if osd is not None and osd != primary]
            hedger.note_steered(primary)
            try:
                at_replica = await self._start_replica_read(
                    others, pg_index, dict(request, steered=True), STEERED_READ_TIMEOUT_S)
                reply = await at_replica
            except (RequestFailed, ConnectionClosed, RequestTimeout, OSError):
                hedger.note_refused(primary)
                return None
            hedger.record(loop.time() - started)
            return reply
        connection = self._cluster._connections.ready(primary, cmap.osds[primary]["addr"])
        if connection is None:
            return None                 # `_send` opens it
        try:
            at_primary = connection.start_request(request, b"", timeout_s=self._cluster.op_timeout_s)
        except ConnectionClosed:
            return None
        watched = self._watch(at_primary, started + hedger.delay(), connection, acting,
                              pg_index, request) if len(acting.members) > 1 else None
        try:
            reply = await at_primary    # the primary's reply, or a hedge's (`_hedge_answered`)
        except RequestFailed as exc:
            self._cluster._raise_typed(exc)
            return None
        except (ConnectionClosed, RequestTimeout):
            return None
        except asyncio.CancelledError:
            at_primary.cancel()
            raise
        finally:
            if watched is not None:
                watched[1] = None       # the reply's buffer is not kept until the sweep
        hedger.record(loop.time() - started)
        return reply

    def _watch(self, at_primary, deadline, *hedge):
        """Hedge `at_primary` (`_hedge`) if it is still due at `deadline`. One timer for all
        the reads watched, not one each (`_sweep`); they are watched in the order they
        started, so their deadlines come in that order too (the delay moves slowly). The
        entry, whose future the reader clears once answered: a future kept until the sweep
        would keep its reply's received buffer (16 MiB reads then cost 3-6% of their
        throughput in fresh buffers)."""
        entry = [deadline, at_primary, hedge]
        self._watched.append(entry)
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._sweep)
        return entry

    def _sweep(self):
        """Hedge the watched reads past their deadline; forget those answered."""
        self._timer = None
        watch, now = self._watched, self._loop.time() + HEDGE_SWEEP_SLACK_S
        while watch:
            deadline, at_primary, hedge = watch[0]
            if at_primary is not None and not at_primary.done():
                if deadline > now:
                    self._timer = self._loop.call_at(deadline, self._sweep)
                    return
                self._hedge(at_primary, *hedge)
            watch.popleft()

    def _hedge(self, at_primary, at, acting, pg_index, request):
        """Send a late read to another member too, if the budget allows; the first answer
        is the read's (`_hedge_answered`)."""
        hedger, primary = self._cluster.hedger, acting.primary
        others = [osd for osd in acting.members if osd is not None and osd != primary]
        if not others or not hedger.may_hedge(primary):
            return
        replica = self._replica_for(others, pg_index)
        connection = self._cluster._connections.ready(replica, self._cluster.map.osds[replica]["addr"])
        if connection is None:          # open it for the next time; this read waits
            hedger.note_refused(primary)
            opening = asyncio.ensure_future(self._cluster._connection(replica))
            opening.add_done_callback(_retrieved)
            return
        try:
            at_replica = connection.start_request(dict(request, replica=True), b"",
                                                  timeout_s=self._cluster.op_timeout_s)
        except ConnectionClosed:
            hedger.note_refused(primary)
            return
        at_replica.add_done_callback(
            functools.partial(self._hedge_answered, at_primary, at, primary, request))
        at_primary.add_done_callback(functools.partial(_withdraw, connection, at_replica))

    def _hedge_answered(self, at_primary, at, primary, request, at_replica):
        """The hedge's reply (or its cancellation, once the primary answered: `_withdraw`):
        the read's answer if the primary has not given one yet, and the primary is told so
        (`hedge_won`, one-way: it counts the hedges around it that won). Then, if the primary
        (on connection `at`) still has not answered a while later, it is steered around
        (common/hedge.py). The primary's own read is not cancelled: when its answer comes is
        that evidence, and its device read, once started, runs to its end anyway."""
        hedger = self._cluster.hedger
        if at_replica.cancelled():
            hedger.note_wasted(primary)
            return
        error = at_replica.exception()
        if at_primary.done():
            hedger.note_wasted(primary)
        elif error is not None:
            hedger.note_refused(primary)    # the read waits for the primary
        else:
            at_primary.set_result(at_replica.result())  # its own reply, when it comes, is dropped
            hedger.note_won(primary)
            try:
                at.send_oneway(dict(request, op="hedge_won"))
            except ConnectionClosed:
                pass
            if at.longest_wait_s() >= hedger.evidence_s():
                hedger.steer(primary)       # an earlier read is still due: evidence enough
            else:
                self._loop.call_later(hedger.evidence_s(), self._judge, at, at_primary,
                                      primary)

    def _judge(self, at, at_primary, primary):
        if at.waiting_for(at_primary):
            self._cluster.hedger.steer(primary)

    def _replica_for(self, others, pg_index):
        """One of `others` (members but the primary), one the hedger is not steering around
        where there is one, spread by PG."""
        usable = [osd for osd in others if not self._cluster.hedger.steering(osd)] or others
        return usable[pg_index % len(usable)]

    async def _start_replica_read(self, others, pg_index, request, timeout_s=None):
        """A future of `request` sent as a replica read (osd/hedged.py) to one of `others`
        (`_replica_for`)."""
        replica = self._replica_for(others, pg_index)
        connection = self._cluster._connections.ready(replica, self._cluster.map.osds[replica]["addr"]) \
            or await self._cluster._connection(replica)
        future = connection.start_request(dict(request, replica=True), b"",
                                          timeout_s=timeout_s or self._cluster.op_timeout_s)
        future.add_done_callback(_retrieved)
        return future


def _withdraw(connection, at_replica, _):
    """The primary answered a hedged read first: the hedge is cancelled, here and at the
    replica (which stops its device read or its wait for the primary's word)."""
    if not at_replica.done():
        connection.cancel(at_replica)


def _retrieved(future):
    """Mark a hedged request's failure seen (asyncio logs one nobody retrieved)."""
    if not future.cancelled():
        future.exception()
