"""Raft consensus as a pure state machine: the monitors' replicated log.

Theory of operation (the shape of etcd's raft library, README.md there):
- The core holds one monitor's view of the replicated log: hard state (term, vote, commit), the
  entries, a snapshot of the state machine, and, on a leader, each follower's progress.
- Input is a `tick()` (time, in abstract ticks), a received `Message` (`step`), or a request
  (`propose`, `propose_members`, `read_index`, `compact`). Input only changes memory and queues
  effects; `ready()` hands the effects out as one `Ready`.
- The shell carries a Ready out in this order: persist hard state, entries and snapshot (fsync);
  then send the messages; then install a received snapshot and apply the committed entries. A vote
  or an acknowledgement therefore never leaves before the fact it vouches for is durable.

Rules of this module:
1. No I/O and no clock: time is `tick()`, randomness a seeded `random.Random` passed in.
2. Safety first, from the Raft paper (Ongaro & Ousterhout 2014) and the dissertation (2014):
   a leader commits only entries of its own term by counting (section 5.4.2); membership changes
   add or remove one server at a time, take effect when appended, and wait until the leader has
   committed an entry of its term (the 2015 fix to single-server changes).
3. Liveness aids that cannot break safety: pre-vote (dissertation 9.6) so a server that was cut
   off cannot raise terms and depose a healthy leader when it returns; check-quorum, so a leader
   that cannot hear a majority steps down, and the matching lease, so servers that hear a leader
   ignore (pre-)votes from others for an election timeout.
4. Leadership transfer (dissertation 3.10): the leader stops taking proposals, brings the chosen
   member's log up to date and tells it to campaign at once (TIMEOUT_NOW); its vote request
   says so, and voters let it past their lease. A leader whose own removal commits hands over
   the same way, so a graceful stop or a removal costs no election timeout.
5. Linearizable reads by read-index (dissertation 6.4): the leader records its commit index,
   confirms leadership with a heartbeat round, and only then says the read may be served once
   that index is applied.
6. The log after a snapshot: entries may be kept from before the snapshot's index (so a follower
   a little behind gets entries, not the whole state); `log[0]` is a sentinel carrying the index
   and term just before the first kept entry.

Members are a dict {name: address}; the core only uses the names, the shell the addresses.
"""

import dataclasses

# The core's vocabulary, re-exported: `raft.Kind` is `raft_types.Kind`.
from cairn.mon.raft_types import (CHANGE_PENDING, CONF, DATA, ENTRY_KINDS,  # noqa: F401
                                  LAST_MEMBER, NOOP, ChangeRefused, Entry, HardState, Kind,
                                  Message, NotLeader, PeerInvalid, Progress, RaftConfig,
                                  RaftError, Ready, Restored, Role, Snapshot)


@dataclasses.dataclass
class _Follower:
    next: int
    match: int = 0
    state: Progress = Progress.PROBE
    paused: bool = False            # PROBE: an append is in flight
    recent_active: bool = True      # heard from since the last check-quorum round
    snapshot_ticks: int = 0
    read_acked: int = 0             # the newest read-index round it confirmed
    leaving_at: int = 0             # removed by the change at this index: tell it, then forget
    leaving_ticks: int = 0
    told: int = 0                   # heartbeats that told it the change is committed


def quorum(count):
    return count // 2 + 1


class Raft:
    """One member's core. `Raft(name, Restored, rng)`; feed it; take `ready()`."""

    def __init__(self, name, restored, rng, config=RaftConfig()):
        self.name = name
        self.config = config
        self._rng = rng
        hard = restored.hard_state
        self.term, self.vote, self.commit = hard.term, hard.vote, hard.commit
        self.snapshot = restored.snapshot
        self.log = [Entry(restored.offset_term, restored.offset, NOOP)] + list(restored.entries)
        self.applied = restored.applied
        assert self.offset <= self.snapshot.index <= self.applied <= self.commit <= self.last_index
        for position, entry in enumerate(self.log):
            assert entry.index == self.offset + position
        self.members = self._members_at(self.last_index)
        self.role = Role.FOLLOWER
        self.leader = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.timeout = self._random_timeout()
        self.progress = {}
        self.granted = {}
        self.pending_conf_index = 0
        self.transferee = None          # leader: the member it is handing the leadership to
        self.transfer_elapsed = 0
        self.handed_over_by = None      # the leader that told us to campaign (this campaign)
        self._reads = []                # leader: [(context, index, round)]
        self._read_round = 0
        self._reset_effects()

    # -- the log ----------------------------------------------------------------------------------

    @property
    def offset(self):
        return self.log[0].index

    @property
    def last_index(self):
        return self.log[-1].index

    @property
    def last_term(self):
        return self.log[-1].term

    def term_at(self, index):
        """The term of the entry at `index`, or None when compacted away or beyond the log."""
        if self.offset <= index <= self.last_index:
            return self.log[index - self.offset].term
        if index == self.snapshot.index:
            return self.snapshot.term
        return None

    def entries(self, first, last):
        """Entries first..last (inclusive); the caller checks they are kept."""
        assert self.offset < first and last <= self.last_index
        return self.log[first - self.offset:last - self.offset + 1]

    def _members_at(self, index):
        for entry in reversed(self.log[1:index - self.offset + 1]):
            if entry.kind == CONF:
                return dict(entry.data)
        return dict(self.snapshot.members)

    def _truncate_and_append(self, entries):
        first = entries[0].index
        assert first > self.commit, f"truncating committed entry {first} (commit {self.commit})"
        assert first <= self.last_index + 1
        del self.log[first - self.offset:]
        self.log.extend(entries)
        self._dirty_from = first if self._dirty_from is None else min(self._dirty_from, first)
        self.members = self._members_at(self.last_index)

    def _append(self, kind, data, context=None):
        entry = Entry(self.term, self.last_index + 1, kind, data, context)
        self._truncate_and_append([entry])
        return entry.index

    # -- effects ----------------------------------------------------------------------------------

    def _reset_effects(self):
        self._hard_dirty = False
        self._dirty_from = None
        self._snapshot_out = None
        self._install = False
        self._compacted = None
        self._messages = []
        self._read_states = []

    def _send(self, kind, target, **fields):
        fields.setdefault("term", self.term)
        self._messages.append(Message(kind, self.name, target, **fields))

    def _set_hard(self, term=None, vote=None, commit=None):
        if term is not None and term != self.term:
            self.term = term
            self.vote = None
            self._hard_dirty = True
        if vote is not None and vote != self.vote:
            self.vote = vote
            self._hard_dirty = True
        if commit is not None and commit > self.commit:
            assert commit <= self.last_index
            self.commit = commit
            self._hard_dirty = True

    def ready(self):
        """Everything queued since the last call; the shell carries it out in field order."""
        committed = ()
        if self.commit > self.applied:
            committed = tuple(self.entries(self.applied + 1, self.commit))
            self.applied = self.commit
        entries = ()
        if self._dirty_from is not None:
            entries = tuple(self.log[self._dirty_from - self.offset:])
        ready = Ready(
            hard_state=HardState(self.term, self.vote, self.commit) if self._hard_dirty else None,
            entries_from=self._dirty_from, entries=entries, snapshot=self._snapshot_out,
            install=self._install, compacted_to=self._compacted,
            messages=tuple(self._messages), committed=committed,
            read_states=tuple(self._read_states))
        self._reset_effects()
        return ready

    # -- time -------------------------------------------------------------------------------------

    def _random_timeout(self):
        return self.config.election_ticks + self._rng.randrange(self.config.election_ticks)

    def tick(self):
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.timeout and self.name in self.members:
            self._campaign(pre=True)

    def _tick_leader(self):
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.transferee is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= self.config.election_ticks:
                self.transferee = None                  # it did not take over: carry on
        for name, follower in list(self.progress.items()):
            if follower.leaving_at:
                follower.leaving_ticks += 1
                # Three heartbeats saying so (one may be lost), or give up on a silent one.
                if follower.told >= 3 or \
                        follower.leaving_ticks >= 2 * self.config.election_ticks:
                    del self.progress[name]
                    continue
            if follower.state is Progress.SNAPSHOT:
                follower.snapshot_ticks += 1
                if follower.snapshot_ticks >= self.config.snapshot_ticks_max:
                    follower.state, follower.paused = Progress.PROBE, False
        if self.election_elapsed >= self.config.election_ticks:
            self.election_elapsed = 0
            heard = {name for name, f in self.progress.items() if f.recent_active}
            heard.add(self.name)
            for follower in self.progress.values():
                follower.recent_active = False
            if len(heard & set(self.members)) < quorum(len(self.members)):
                self._become_follower(self.term, None)           # check-quorum
                return
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat()

    # -- roles ------------------------------------------------------------------------------------

    def _become_follower(self, term, leader):
        self._set_hard(term=term)
        self.role = Role.FOLLOWER
        self.leader = leader
        self.election_elapsed = 0
        self.timeout = self._random_timeout()
        self.progress = {}
        self.transferee = None
        self._reads = []

    def _campaign(self, pre, transfer=False):
        if not transfer:
            self.handed_over_by = None
        self.election_elapsed = 0
        self.timeout = self._random_timeout()
        self.leader = None
        if pre:
            self.role = Role.PRE_CANDIDATE
            term = self.term + 1
        else:
            self.role = Role.CANDIDATE
            self._set_hard(term=self.term + 1)
            self._set_hard(vote=self.name)
            term = self.term
        self.granted = {self.name: True}
        if self._tally():
            return
        kind = Kind.PRE_VOTE if pre else Kind.VOTE
        for name in sorted(self.members):
            if name != self.name:
                self._send(kind, name, term=term, index=self.last_index, log_term=self.last_term,
                           transfer=transfer)

    def _tally(self):
        """Count (pre-)votes; moves on and returns True once decided."""
        members = set(self.members)
        yes = sum(1 for name, granted in self.granted.items() if granted and name in members)
        no = sum(1 for name, granted in self.granted.items() if not granted and name in members)
        if yes >= quorum(len(members)):
            if self.role is Role.PRE_CANDIDATE:
                self._campaign(pre=False)
            else:
                self._become_leader()
            return True
        if no >= quorum(len(members)):
            self._become_follower(self.term, None)
            return True
        return False

    def _become_leader(self):
        assert self.role is Role.CANDIDATE and self.vote == self.name
        self.role = Role.LEADER
        self.leader = self.name
        self.transferee = None
        self.election_elapsed = self.heartbeat_elapsed = 0
        self.progress = {name: _Follower(next=self.last_index + 1)
                         for name in self.members if name != self.name}
        # No membership change until everything before this term is committed (rule 2).
        self.pending_conf_index = self.last_index + 1
        self._append(NOOP, None)
        self._broadcast_append()
        self._maybe_commit()

    # -- requests ---------------------------------------------------------------------------------

    def campaign(self):
        """Start an election now: a lone member need not wait out a timeout at start-up."""
        if self.role is not Role.LEADER and self.name in self.members:
            self._campaign(pre=True)

    def _check_leading(self):
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.transferee is not None:
            raise NotLeader(self.transferee, f"handing the leadership to {self.transferee}")

    def propose(self, data):
        """Append `data` (bytes) to the log; its index. Raises NotLeader (also while handing
        the leadership over)."""
        self._check_leading()
        index = self._append(DATA, data)
        self._broadcast_append()
        self._maybe_commit()
        return index

    def propose_members(self, members, context=None):
        """Change the members to `members` ({name: address}), one server added or removed;
        the index of the change. `context` (a string) travels with the entry for the shell.
        Raises NotLeader, ChangeRefused."""
        self._check_leading()
        if self.pending_conf_index > self.commit or self.term_at(self.commit) != self.term:
            raise ChangeRefused(CHANGE_PENDING)
        old, new = set(self.members), set(members)
        if len(old ^ new) != 1:
            raise ChangeRefused(f"add or remove exactly one monitor at a time (members "
                                f"{sorted(old)}, asked for {sorted(new)})")
        if not new:
            raise ChangeRefused(LAST_MEMBER)
        index = self._append(CONF, dict(members), context)
        self.pending_conf_index = index
        for name in new - old:
            self.progress[name] = _Follower(next=self.last_index)
        for name in old - new:
            # A removed member learns of its removal only from us: keep replicating to it
            # (outside the quorum) until it has been told the change is committed.
            if name in self.progress:
                self.progress[name].leaving_at = index
        self._broadcast_append()
        self._maybe_commit()
        return index

    def transfer_leadership(self, target):
        """Hand the leadership to `target`, a member: stop taking proposals, bring its log up
        to date, then tell it to campaign at once. Given up (proposals taken again) if it has
        not taken over within an election timeout. Raises NotLeader, RaftError."""
        self._check_leading()
        if target not in self.progress or target not in self.members:
            raise RaftError(f"cannot hand the leadership to {target!r}: not another member "
                            f"(members {', '.join(sorted(self.members))})")
        self.transferee, self.transfer_elapsed = target, 0
        if not self._timeout_now_if_caught_up(target):
            self._send_append(target)               # the append's answer hands over

    def _timeout_now_if_caught_up(self, name):
        """Tell `name` to campaign at once if its log is all of ours; whether it was told."""
        if self.progress[name].match != self.last_index:
            return False
        self._send(Kind.TIMEOUT_NOW, name)
        return True

    def read_index(self, context):
        """Ask to serve a linearizable read tagged `context` (an int); a read state (context,
        index) comes out of a later Ready once leadership is confirmed. Raises NotLeader, or
        RaftError while the leader has not yet committed an entry of its term."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.term_at(self.commit) != self.term:
            raise RaftError("the leader has not yet committed an entry of its term")
        self._read_round += 1
        self._reads.append((context, self.commit, self._read_round))
        if self.progress:
            self._broadcast_heartbeat()
        self._release_reads()

    def compact(self, index, data, entries_kept):
        """The state machine at `index` (applied) is `data`: keep it as the snapshot and drop
        entries older than `entries_kept` before it."""
        assert self.snapshot.index < index <= self.applied
        self.snapshot = Snapshot(index, self.term_at(index), self._members_at(index), data)
        self._snapshot_out = self.snapshot
        new_offset = max(self.offset, index - entries_kept)
        if new_offset > self.offset:
            sentinel = Entry(self.term_at(new_offset), new_offset, NOOP)
            self.log = [sentinel] + self.log[new_offset - self.offset + 1:]
            self._compacted = (sentinel.index, sentinel.term)
            if self._dirty_from is not None:
                self._dirty_from = max(self._dirty_from, new_offset + 1)

    # -- messages ---------------------------------------------------------------------------------

    def step(self, m):
        """Take one received message. Raises PeerInvalid, having changed nothing, for a message
        that breaks Raft's rules (see `_invalid`)."""
        assert m.target == self.name
        reason = self._invalid(m)
        if reason is not None:
            raise PeerInvalid(m.source, m.kind, reason)
        if m.term > self.term:
            if m.kind in (Kind.PRE_VOTE, Kind.VOTE) and self.leader is not None and \
                    self.election_elapsed < self.config.election_ticks and not m.transfer:
                return                  # we hear a leader: its lease holds (rule 3)
            if m.kind is Kind.PRE_VOTE or (m.kind is Kind.PRE_VOTE_RESPONSE and not m.reject):
                pass                    # pre-votes never change terms
            else:
                leader = m.source if m.kind in (Kind.APPEND, Kind.HEARTBEAT,
                                                Kind.SNAPSHOT) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if m.kind in (Kind.APPEND, Kind.HEARTBEAT):
                # A deposed leader: our term tells it to step down.
                self._send(Kind.APPEND_RESPONSE, m.source)
            elif m.kind is Kind.PRE_VOTE:
                self._send(Kind.PRE_VOTE_RESPONSE, m.source, reject=True)
            return
        handler = {Kind.PRE_VOTE: self._on_vote, Kind.VOTE: self._on_vote,
                   Kind.PRE_VOTE_RESPONSE: self._on_vote_response,
                   Kind.VOTE_RESPONSE: self._on_vote_response,
                   Kind.APPEND: self._on_append, Kind.HEARTBEAT: self._on_heartbeat,
                   Kind.SNAPSHOT: self._on_snapshot,
                   Kind.APPEND_RESPONSE: self._on_append_response,
                   Kind.HEARTBEAT_RESPONSE: self._on_heartbeat_response,
                   Kind.TIMEOUT_NOW: self._on_timeout_now}[m.kind]
        handler(m)

    def _invalid(self, m):
        """Why no correct peer could have sent `m` to us now, or None when it may be taken.

        Each rule holds for every message a correct member sends, however late, duplicated or
        reordered, and whatever crashes came between (the simulation in tests/test_raft.py runs
        every message it delivers through here):
        - one leader per term: a leader's message in our term from anyone but the leader we
          follow, or while we lead;
        - a leader's log holds every committed entry (Leader Completeness): an append or a
          snapshot that contradicts an entry we know is committed;
        - no entry or snapshot from a term beyond its sender's;
        - a leader counts only what exists: an acknowledgement beyond our last index, a
          read-index round we never started;
        - only members vote: a granted vote from a name outside the members we asked;
        - only our leader hands over to us (TIMEOUT_NOW), in our term.
        """
        leads = m.kind in (Kind.APPEND, Kind.HEARTBEAT, Kind.SNAPSHOT)
        if leads and m.term == self.term:
            if self.role is Role.LEADER:
                return f"two leaders in term {m.term}: this member leads it"
            if self.leader is not None and self.leader != m.source:
                return f"two leaders in term {m.term}: {self.leader} leads it"
        if m.kind is Kind.APPEND and m.term >= self.term:
            for entry in m.entries:
                if entry.term > m.term:
                    return f"entry {entry.index} of term {entry.term}, beyond the sender's term"
            if m.index <= self.commit and self.term_at(m.index) not in (None, m.log_term):
                return f"previous entry {m.index} of term {m.log_term} contradicts the " \
                       f"committed one of term {self.term_at(m.index)}"
            for entry in m.entries:
                if entry.index > self.commit:
                    break
                known = self.term_at(entry.index)
                if known is not None and known != entry.term:
                    return f"entry {entry.index} of term {entry.term} contradicts the " \
                           f"committed one of term {known}"
        if m.kind is Kind.SNAPSHOT and m.term >= self.term:
            snap = m.snapshot
            if snap.term > m.term:
                return f"a snapshot of term {snap.term}, beyond the sender's term"
            if snap.index <= self.commit and self.term_at(snap.index) not in (None, snap.term):
                return f"a snapshot at {snap.index} of term {snap.term} contradicts the " \
                       f"committed entry of term {self.term_at(snap.index)}"
        if self.role is Role.LEADER and m.term == self.term:
            if m.kind is Kind.APPEND_RESPONSE and not m.reject and m.index > self.last_index:
                return f"acknowledges entry {m.index}; this leader's log ends at " \
                       f"{self.last_index}"
            if m.kind is Kind.HEARTBEAT_RESPONSE and m.context > self._read_round:
                return f"confirms read round {m.context}; this leader started " \
                       f"{self._read_round}"
        if m.kind is Kind.VOTE_RESPONSE and not m.reject and self.role is Role.CANDIDATE and \
                m.term == self.term and m.source not in self.members:
            return f"a vote from {m.source}, not a member ({', '.join(sorted(self.members))})"
        if m.kind is Kind.TIMEOUT_NOW:
            if m.term > self.term:
                return f"a handover in term {m.term}, which this member never heard led"
            if m.term == self.term and (self.role is Role.LEADER or
                                        self.leader not in (None, m.source)):
                return f"a handover from {m.source}, which does not lead term {m.term}"
        return None

    def _on_vote(self, m):
        pre = m.kind is Kind.PRE_VOTE
        free = self.vote == m.source or (self.vote is None and self.leader is None) or \
            (pre and m.term > self.term)
        current = m.log_term > self.last_term or \
            (m.log_term == self.last_term and m.index >= self.last_index)
        response = Kind.PRE_VOTE_RESPONSE if pre else Kind.VOTE_RESPONSE
        if free and current:
            self._send(response, m.source, term=m.term)
            if not pre:
                self._set_hard(vote=m.source)
                self.election_elapsed = 0
        else:
            self._send(response, m.source, reject=True)

    def _on_vote_response(self, m):
        expected = Role.PRE_CANDIDATE if m.kind is Kind.PRE_VOTE_RESPONSE else Role.CANDIDATE
        if self.role is expected:
            self.granted[m.source] = not m.reject
            self._tally()

    def _on_timeout_now(self, m):
        # The leader hands over to us, our log as long as its: campaign now, no pre-vote.
        if self.role is not Role.LEADER and self.name in self.members:
            self.handed_over_by = m.source
            self._campaign(pre=False, transfer=True)

    def _follow(self, m):
        assert self.role is not Role.LEADER, f"two leaders in term {self.term}"
        if self.role is not Role.FOLLOWER:
            self._become_follower(m.term, m.source)
        self.leader = m.source
        self.election_elapsed = 0

    def _on_append(self, m):
        self._follow(m)
        if m.index < self.commit:
            self._send(Kind.APPEND_RESPONSE, m.source, index=self.commit)
            return
        if self.term_at(m.index) != m.log_term:
            self._send(Kind.APPEND_RESPONSE, m.source, index=m.index, reject=True,
                       hint=self.last_index)
            return
        for position, entry in enumerate(m.entries):
            if self.term_at(entry.index) != entry.term:
                self._truncate_and_append(list(m.entries[position:]))
                break
        last_new = m.index + len(m.entries)
        self._set_hard(commit=min(m.commit, last_new))
        self._send(Kind.APPEND_RESPONSE, m.source, index=last_new)

    def _on_heartbeat(self, m):
        self._follow(m)
        # The leader sends min(its commit, our match), so the entries up to it are the leader's.
        self._set_hard(commit=min(m.commit, self.last_index))
        self._send(Kind.HEARTBEAT_RESPONSE, m.source, context=m.context)

    def _on_snapshot(self, m):
        self._follow(m)
        snap = m.snapshot
        if snap.index <= self.commit:
            self._send(Kind.APPEND_RESPONSE, m.source, index=self.commit)
            return
        if self.term_at(snap.index) == snap.term:
            # Our log already holds it: just commit up to it.
            self._set_hard(commit=snap.index)
            self._send(Kind.APPEND_RESPONSE, m.source, index=snap.index)
            return
        self.log = [Entry(snap.term, snap.index, NOOP)]
        self.snapshot = snap
        self.members = dict(snap.members)
        self.commit = self.applied = snap.index
        self._hard_dirty = True
        self._snapshot_out, self._install = snap, True
        self._compacted = (snap.index, snap.term)
        self._dirty_from = None
        self._send(Kind.APPEND_RESPONSE, m.source, index=snap.index)

    # -- the leader's side ------------------------------------------------------------------------

    def _on_append_response(self, m):
        if self.role is not Role.LEADER or m.source not in self.progress:
            return
        follower = self.progress[m.source]
        follower.recent_active = True
        if m.reject:
            if m.index == follower.next - 1 or follower.state is Progress.REPLICATE:
                follower.next = max(follower.match + 1, min(m.index, m.hint + 1))
                follower.state, follower.paused = Progress.PROBE, False
                self._send_append(m.source)
            return
        if m.index > follower.match:
            follower.match = m.index
            follower.next = max(follower.next, m.index + 1)
            follower.paused = False
            if follower.state is not Progress.REPLICATE:
                follower.state = Progress.REPLICATE
            if self._maybe_commit():
                if self.role is not Role.LEADER:
                    return                                  # it committed our removal
                self._broadcast_append()
            self._release_reads()
            if m.source == self.transferee:
                self._timeout_now_if_caught_up(m.source)
        elif follower.state is Progress.PROBE:
            follower.paused = False
        if follower.next <= self.last_index:
            self._send_append(m.source)

    def _on_heartbeat_response(self, m):
        if self.role is not Role.LEADER or m.source not in self.progress:
            return
        follower = self.progress[m.source]
        follower.recent_active = True
        if follower.state is Progress.PROBE:
            follower.paused = False
        if follower.match < self.last_index:
            self._send_append(m.source)
        if m.context > follower.read_acked:
            follower.read_acked = m.context
            self._release_reads()
        if m.source == self.transferee:
            self._timeout_now_if_caught_up(m.source)        # again, in case it was lost

    def _release_reads(self):
        if not self._reads:
            return
        need = quorum(len(self.members)) - (1 if self.name in self.members else 0)
        while self._reads:
            context, index, round_ = self._reads[0]
            acked = sum(1 for name, f in self.progress.items()
                        if f.read_acked >= round_ and name in self.members)
            if acked < need:
                return
            self._reads.pop(0)
            self._read_states.append((context, index))

    def _send_append(self, target):
        follower = self.progress[target]
        if follower.state is Progress.SNAPSHOT or \
                (follower.state is Progress.PROBE and follower.paused):
            return
        previous = follower.next - 1
        log_term = self.term_at(previous)
        if log_term is None or previous < self.offset:
            follower.state, follower.snapshot_ticks = Progress.SNAPSHOT, 0
            self._send(Kind.SNAPSHOT, target, snapshot=self.snapshot)
            return
        last = min(self.last_index, previous + self.config.entries_per_message_max)
        entries = tuple(self.entries(previous + 1, last)) if last > previous else ()
        self._send(Kind.APPEND, target, index=previous, log_term=log_term, entries=entries,
                   commit=self.commit)
        if entries:
            if follower.state is Progress.REPLICATE:
                follower.next = last + 1
            else:
                follower.paused = True

    def _broadcast_append(self):
        for name in sorted(self.progress):
            self._send_append(name)

    def _broadcast_heartbeat(self):
        for name in sorted(self.progress):
            follower = self.progress[name]
            commit = min(follower.match, self.commit)
            self._send(Kind.HEARTBEAT, name, commit=commit, context=self._read_round)
            if follower.leaving_at and commit >= follower.leaving_at:
                follower.told += 1

    def _maybe_commit(self):
        members = sorted(self.members)
        matches = sorted((self.last_index if name == self.name else
                          self.progress[name].match if name in self.progress else 0)
                         for name in members)
        candidate = matches[len(matches) - quorum(len(matches))]
        if candidate <= self.commit or self.term_at(candidate) != self.term:
            return False
        self._set_hard(commit=candidate)
        if self.name not in self.members and self.commit >= self.pending_conf_index:
            # Removed, and the change is committed: hand over to a member that has everything
            # (if one does), then step down.
            for name in sorted(self.members, reverse=True):
                if name in self.progress and self._timeout_now_if_caught_up(name):
                    break
            self._become_follower(self.term, None)
        return True

    # -- views ------------------------------------------------------------------------------------

    def status(self):
        """A plain dict for status output."""
        view = {"name": self.name, "role": self.role.value, "term": self.term,
                "leader": self.leader, "commit": self.commit, "applied": self.applied,
                "last_index": self.last_index, "snapshot_index": self.snapshot.index,
                "members": sorted(self.members)}
        if self.role is Role.LEADER:
            view["progress"] = {name: {"match": f.match, "next": f.next,
                                       "state": f.state.value, "active": f.recent_active}
                                for name, f in sorted(self.progress.items())}
        return view


# -- the wire form (msgpack-friendly dicts) ---------------------------------------------------------

def message_to_wire(m):
    wire = {"k": m.kind.value, "s": m.source, "t": m.target, "T": m.term}
    for key, value in (("i", m.index), ("lt", m.log_term), ("c", m.commit), ("h", m.hint),
                       ("x", m.context)):
        if value:
            wire[key] = value
    if m.reject:
        wire["r"] = True
    if m.transfer:
        wire["tr"] = True
    if m.entries:
        wire["e"] = [[e.term, e.index, e.kind, e.data] + ([e.context] if e.context else [])
                     for e in m.entries]
    if m.snapshot is not None:
        s = m.snapshot
        wire["S"] = [s.index, s.term, s.members, s.data]
    return wire


def message_from_wire(wire):
    """A Message from its wire dict; ValueError names what is wrong."""
    try:
        entries = tuple(Entry(int(t), int(i), k, d, *context)
                        for t, i, k, d, *context in wire.get("e", ()))
        if any(e.kind not in ENTRY_KINDS or not isinstance(e.context, (str, type(None)))
               for e in entries):
            raise ValueError("unknown entry kind or context")
        snapshot = None
        if "S" in wire:
            index, term, members, data = wire["S"]
            if not isinstance(members, dict):
                raise ValueError("snapshot members must be a dict")
            snapshot = Snapshot(int(index), int(term), members, data)
        m = Message(Kind(wire["k"]), str(wire["s"]), str(wire["t"]), int(wire["T"]),
                    index=int(wire.get("i", 0)), log_term=int(wire.get("lt", 0)),
                    entries=entries, commit=int(wire.get("c", 0)),
                    reject=bool(wire.get("r", False)), hint=int(wire.get("h", 0)),
                    context=int(wire.get("x", 0)), snapshot=snapshot,
                    transfer=bool(wire.get("tr", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed raft message: {exc}") from None
    if m.kind is Kind.SNAPSHOT and snapshot is None:
        raise ValueError("malformed raft message: a snapshot message without a snapshot")
    for position, entry in enumerate(entries):
        if entry.index != m.index + 1 + position:
            raise ValueError("malformed raft message: entries out of sequence")
    return m
