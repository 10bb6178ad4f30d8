"""The Raft core: hand-written cases, then a deterministic simulation from a seed.

The simulation runs 3 to 5 monitors' cores in one process over a fake network that loses,
delays (so reorders) and duplicates messages and that partitions (a leader cut off from the
majority among them); monitors crash and restart from what their Readies persisted, and the
leader adds and removes monitors one at a time, hands its leadership over, compacts, and serves
read-index reads. After
every step it checks the invariants of the Raft paper (figure 3): at most one leader per term,
log matching, leader completeness, state machine safety, and that a read-index read never misses
a committed entry. At the end it heals everything and checks that a leader commits again. A
failing seed is printed and replays: CAIRN_RAFT_SEED=N pytest tests/test_raft.py -k replay
(STYLE.md 2.8, layer 4).
"""

import os
import random

import msgpack
import pytest

from cairn.mon import raft
from cairn.mon.raft import (CONF, DATA, ChangeRefused, Entry, HardState, Kind, Message,
                            NotLeader, PeerInvalid, Raft, RaftError, Restored, Role,
                            Snapshot)

pytestmark = pytest.mark.unit

MEMBERS = {"mon.0": "a0", "mon.1": "a1", "mon.2": "a2"}


def make(name, members=MEMBERS, seed=0):
    return Raft(name, Restored.initial(members), random.Random(seed))


def deliver_all(nodes, messages, drop=lambda m: False):
    """Deliver until quiet (each Ready's messages after its persistence, as a shell would);
    the entries each node was told to apply meanwhile."""
    queue = list(messages)
    applied = {name: [] for name in nodes}
    applied["reads"] = []
    for _ in range(10_000):
        if not queue:
            return applied
        m = queue.pop(0)
        if drop(m) or m.target not in nodes:
            continue
        nodes[m.target].step(m)
        ready = nodes[m.target].ready()
        queue.extend(ready.messages)
        applied[m.target].extend(ready.committed)
        applied["reads"].extend(ready.read_states)
    raise AssertionError("messages never went quiet")


def elect(nodes, name):
    node = nodes[name]
    for _ in range(node.timeout):
        node.tick()
    deliver_all(nodes, node.ready().messages)
    assert node.role is Role.LEADER
    for other in nodes.values():
        other.ready()


def test_a_single_monitor_elects_itself_and_commits_at_once():
    node = make("mon.0", {"mon.0": "a0"})
    for _ in range(node.timeout):
        node.tick()
    assert node.role is Role.LEADER and node.term == 1
    ready = node.ready()
    assert ready.hard_state == HardState(1, "mon.0", 1)         # the term's no-op, committed
    assert [e.kind for e in ready.committed] == ["noop"]
    index = node.propose(b"x")
    ready = node.ready()
    assert [e.index for e in ready.entries] == [index] and ready.committed[-1].data == b"x"


def test_three_monitors_elect_replicate_and_commit_by_majority():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    leader = nodes["mon.0"]
    index = leader.propose(b"epoch 2")
    ready = leader.ready()
    assert ready.committed == () and len(ready.entries) == 1   # not before a follower has it
    appends = [m for m in ready.messages if m.kind is Kind.APPEND]
    assert {m.target for m in appends} == {"mon.1", "mon.2"}
    applied = deliver_all(nodes, appends[:1])             # mon.1 only: 2 of 3 is a majority
    assert leader.commit == index
    assert [e.data for e in applied["mon.0"]] == [b"epoch 2"]


def test_pre_vote_keeps_a_returning_partitioned_monitor_from_deposing_the_leader():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    lone = nodes["mon.2"]
    for _ in range(100):                                    # cut off: it keeps pre-voting
        lone.tick()
        lone.ready()
    assert lone.term == 1 and lone.role is Role.PRE_CANDIDATE
    for _ in range(lone.timeout):
        lone.tick()
    deliver_all(nodes, lone.ready().messages)
    assert nodes["mon.0"].role is Role.LEADER and nodes["mon.0"].term == 1


def test_a_leader_cut_off_from_the_majority_steps_down_and_the_majority_elects():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    old = nodes["mon.0"]
    for _ in range(2 * old.config.election_ticks):
        old.tick()
        old.ready()
    assert old.role is Role.FOLLOWER                           # check-quorum
    with pytest.raises(NotLeader):
        old.propose(b"refused")
    majority = {name: nodes[name] for name in ("mon.1", "mon.2")}
    for _ in range(40):
        for node in majority.values():
            node.tick()
            deliver_all(majority, node.ready().messages)
    assert any(node.role is Role.LEADER for node in majority.values())


def test_a_vote_is_persisted_before_it_is_sent_and_survives_a_restart():
    node = make("mon.2")
    node.step(Message(Kind.VOTE, "mon.0", "mon.2", 5, index=0, log_term=0))
    ready = node.ready()
    assert ready.hard_state == HardState(5, "mon.0", 0)
    assert [m.reject for m in ready.messages] == [False]
    again = Raft("mon.2", Restored(ready.hard_state, Snapshot(0, 0, MEMBERS), 0, 0, (), 0),
                 random.Random(2))
    again.step(Message(Kind.VOTE, "mon.1", "mon.2", 5, index=0, log_term=0))
    assert [m.reject for m in again.ready().messages] == [True]    # one vote per term


def test_a_leader_never_commits_an_old_term_entry_by_counting():
    # Figure 8 of the Raft paper: an entry of term 2 on a majority is not committed by a leader
    # of term 4 until an entry of term 4 is committed above it.
    node = Raft("mon.0", Restored(HardState(3, None, 1), Snapshot(0, 0, MEMBERS), 0, 0,
                                  (Entry(1, 1, DATA, b"a"), Entry(2, 2, DATA, b"b")), 0),
                random.Random(1))
    for _ in range(node.timeout):
        node.tick()
    node.step(Message(Kind.PRE_VOTE_RESPONSE, "mon.1", "mon.0", 4))
    node.step(Message(Kind.VOTE_RESPONSE, "mon.1", "mon.0", 4))
    assert node.role is Role.LEADER and node.term == 4
    node.ready()
    node.progress["mon.1"].state = raft.Progress.REPLICATE
    node.step(Message(Kind.APPEND_RESPONSE, "mon.1", "mon.0", 4, index=2))
    assert node.commit == 1                                   # term 2 at index 2: not counted
    node.step(Message(Kind.APPEND_RESPONSE, "mon.1", "mon.0", 4, index=3))
    assert node.commit == 3


def test_membership_changes_one_at_a_time_after_a_commit_in_the_term():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    leader = nodes["mon.0"]
    with pytest.raises(ChangeRefused, match="one monitor at a time"):
        leader.propose_members({"mon.0": "a0", "mon.3": "a3"})
    index = leader.propose_members(MEMBERS | {"mon.3": "a3"})
    assert set(leader.members) == set(MEMBERS) | {"mon.3"}    # in force once appended
    with pytest.raises(ChangeRefused, match="still being committed"):
        leader.propose_members(MEMBERS)
    nodes["mon.3"] = Raft("mon.3", Restored.initial({}), random.Random(3))
    deliver_all(nodes, leader.ready().messages)
    for _ in range(3):
        leader.tick()
        deliver_all(nodes, leader.ready().messages)
    assert leader.commit >= index and nodes["mon.3"].last_index == leader.last_index
    assert set(nodes["mon.3"].members) == set(MEMBERS) | {"mon.3"}
    # A removed member is told the change committed (it would never hear otherwise).
    removal = leader.propose_members({n: a for n, a in leader.members.items() if n != "mon.2"})
    for _ in range(6):
        leader.tick()
        deliver_all(nodes, leader.ready().messages)
    assert "mon.2" not in leader.progress and nodes["mon.2"].commit >= removal
    assert "mon.2" not in nodes["mon.2"].members


def test_leadership_is_handed_over_without_waiting_for_an_election_timeout():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    leader = nodes["mon.0"]
    # mon.1 misses an entry: the leader brings it up to date before telling it to campaign.
    leader.propose(b"x")
    deliver_all(nodes, leader.ready().messages, drop=lambda m: m.target == "mon.1")
    assert nodes["mon.1"].last_index < leader.last_index
    with pytest.raises(RaftError, match="not another member"):
        leader.transfer_leadership("mon.0")
    leader.transfer_leadership("mon.1")
    with pytest.raises(NotLeader, match="handing the leadership to mon.1"):
        leader.propose(b"refused while handing over")
    deliver_all(nodes, leader.ready().messages)           # no tick: no election timeout
    new = nodes["mon.1"]
    assert new.role is Role.LEADER and new.term == 2 and leader.role is Role.FOLLOWER
    assert new.handed_over_by == "mon.0"
    assert leader.leader == "mon.1" or leader.leader is None
    # A handover the target never answers is given up after an election timeout.
    new.transfer_leadership("mon.2")
    for _ in range(new.config.election_ticks):
        new.tick()
        deliver_all(nodes, new.ready().messages, drop=lambda m: m.target == "mon.2")
    assert new.role is Role.LEADER and new.transferee is None
    new.propose(b"taken again")
    # A leader whose own removal commits hands over to a member that has everything.
    new.ready()
    removal = new.propose_members({n: a for n, a in new.members.items() if n != "mon.1"})
    deliver_all(nodes, new.ready().messages)
    assert new.commit >= removal and new.role is Role.FOLLOWER
    leaders = [n.name for n in nodes.values() if n.role is Role.LEADER]
    assert leaders in (["mon.0"], ["mon.2"]), leaders


def test_read_index_waits_for_a_heartbeat_round_from_a_majority():
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    leader = nodes["mon.0"]
    leader.read_index(7)
    ready = leader.ready()
    assert ready.read_states == ()
    beats = [m for m in ready.messages if m.kind is Kind.HEARTBEAT]
    assert deliver_all(nodes, beats[:1])["reads"] == [(7, leader.commit)]
    with pytest.raises(NotLeader):
        nodes["mon.1"].read_index(8)


def elected_three():
    """Three cores, mon.0 leading term 1 with entries 1-2 committed everywhere."""
    nodes = {name: make(name, seed=i) for i, name in enumerate(MEMBERS)}
    elect(nodes, "mon.0")
    nodes["mon.0"].propose(b"x")
    deliver_all(nodes, nodes["mon.0"].ready().messages)
    for _ in range(nodes["mon.0"].config.heartbeat_ticks):
        nodes["mon.0"].tick()
    deliver_all(nodes, nodes["mon.0"].ready().messages)
    assert all(node.commit == 2 for node in nodes.values())
    return nodes


def refused(node, m):
    """Step `m`, expect PeerInvalid naming the sender, and check the core changed nothing."""
    before = (node.term, node.vote, node.commit, node.role, node.leader, list(node.log))
    with pytest.raises(PeerInvalid) as caught:
        node.step(m)
    assert caught.value.sender == m.source and caught.value.kind is m.kind
    assert (node.term, node.vote, node.commit, node.role, node.leader, list(node.log)) == before
    assert not node.ready()
    return caught.value.reason


def test_a_second_leader_in_the_same_term_is_refused_by_the_leader_and_its_followers():
    nodes = elected_three()
    leader, follower = nodes["mon.0"], nodes["mon.2"]
    for kind in (Kind.APPEND, Kind.HEARTBEAT):
        assert "two leaders in term 1" in refused(leader, Message(kind, "mon.1", "mon.0", 1))
        assert "mon.0 leads it" in refused(follower, Message(kind, "mon.1", "mon.2", 1))
    snapshot = Message(Kind.SNAPSHOT, "mon.1", "mon.0", 1, snapshot=Snapshot(2, 1, MEMBERS))
    refused(leader, snapshot)
    assert leader.role is Role.LEADER
    # The leader goes on: a proposal still commits.
    leader.propose(b"y")
    deliver_all(nodes, leader.ready().messages)
    assert leader.commit == 3


def test_an_append_that_contradicts_a_committed_entry_is_refused():
    nodes = elected_three()
    follower = nodes["mon.1"]
    forged = Message(Kind.APPEND, "mon.0", "mon.1", 1, index=0, log_term=0,
                     entries=(Entry(1, 1, DATA, b"a"), Entry(0, 2, DATA, b"b")), commit=2)
    assert "contradicts the committed one" in refused(follower, forged)
    ahead = Message(Kind.APPEND, "mon.0", "mon.1", 1, index=2, log_term=1,
                    entries=(Entry(5, 3, DATA, b"c"),))
    assert "beyond the sender's term" in refused(follower, ahead)
    snap = Message(Kind.SNAPSHOT, "mon.0", "mon.1", 1, snapshot=Snapshot(2, 0, MEMBERS))
    assert "contradicts the committed entry" in refused(follower, snap)


def test_a_leader_refuses_acknowledgements_of_what_it_never_sent():
    # Before the check, this reached `assert commit <= self.last_index` and ended the monitor.
    nodes = elected_three()
    leader = nodes["mon.0"]
    ack = Message(Kind.APPEND_RESPONSE, "mon.1", "mon.0", 1, index=99)
    assert "log ends at 2" in refused(leader, ack)
    read = Message(Kind.HEARTBEAT_RESPONSE, "mon.1", "mon.0", 1, context=7)
    assert "read round 7" in refused(leader, read)


def test_a_vote_from_a_non_member_and_a_handover_from_a_non_leader_are_refused():
    node = make("mon.0")
    for _ in range(node.timeout):
        node.tick()
    node.step(Message(Kind.PRE_VOTE_RESPONSE, "mon.1", "mon.0", 1))
    assert node.role is Role.CANDIDATE
    node.ready()
    vote = Message(Kind.VOTE_RESPONSE, "mon.9", "mon.0", 1)
    assert "not a member" in refused(node, vote)
    assert node.role is Role.CANDIDATE                      # one vote of mon.9 made no leader
    nodes = elected_three()
    follower = nodes["mon.2"]
    assert "does not lead" in refused(follower, Message(Kind.TIMEOUT_NOW, "mon.1", "mon.2", 1))
    assert "never heard led" in refused(follower,
                                        Message(Kind.TIMEOUT_NOW, "mon.0", "mon.2", 5))
    assert follower.term == 1 and follower.role is Role.FOLLOWER


def test_wire_form_round_trips_and_rejects_garbage():
    m = Message(Kind.APPEND, "mon.0", "mon.1", 3, index=4, log_term=2,
                entries=(Entry(3, 5, DATA, b"x"), Entry(3, 6, CONF, {"mon.0": "a"}, "rid.1")),
                commit=4)
    assert raft.message_from_wire(msgpack.unpackb(msgpack.packb(raft.message_to_wire(m)))) == m
    vote = Message(Kind.VOTE, "mon.1", "mon.2", 4, index=6, log_term=3, transfer=True)
    assert raft.message_from_wire(raft.message_to_wire(vote)) == vote
    for garbage in ({}, {"k": "nope", "s": "a", "t": "b", "T": 1},
                    {"k": "append", "s": "a", "t": "b", "T": 1, "e": [[1, 9, "data", b""]]},
                    {"k": "snapshot", "s": "a", "t": "b", "T": 1}, {"k": "vote", "T": "x"},
                    {"k": "append", "s": "a", "t": "b", "T": 1, "e": [[1, 1, "conf", {}, 7]]},
                    {"k": "append", "s": "a", "t": "b", "T": 1, "e": [[1, 1, "conf", {}, "r",
                                                                      "extra"]]}):
        with pytest.raises(ValueError, match="malformed raft message"):
            raft.message_from_wire(garbage)


# -- the simulation ---------------------------------------------------------------------------------

NAMES = [f"mon.{i}" for i in range(5)]
STEPS = 400


class Disk:
    """What a monitor persisted: the Readies it carried out, and its state machine."""

    def __init__(self, members):
        self.hard = HardState(0, None, 0)
        self.snapshot = Snapshot(0, 0, dict(members))
        self.offset, self.offset_term = 0, 0
        self.entries = {}
        self.applied = 0
        self.state = ()

    def restored(self):
        entries = tuple(self.entries[i] for i in sorted(self.entries))
        return Restored(self.hard, self.snapshot, self.offset, self.offset_term, entries,
                        self.applied)


class Simulation:
    def __init__(self, seed):
        self.seed = seed
        self.rng = random.Random(seed)
        self.loss = self.rng.choice([0.0, 0.05, 0.2])
        self.duplication = self.rng.choice([0.0, 0.05])
        self.delay_max = self.rng.choice([1, 3, 8])
        self.transfers = self.rng.choice([0.02, 0.3])         # leadership handed over, per step
        # One entry per append in some runs, so a follower can hold an old term's entry without
        # the new leader's no-op (the figure 8 case of the Raft paper).
        self.config = raft.RaftConfig(entries_per_message_max=self.rng.choice([1, 64]))
        first = self.rng.choice([3, 5])
        initial = {name: f"addr-{name}" for name in NAMES[:first]}
        self.disks = {name: Disk(initial) for name in NAMES[:first]}
        self.disks.update({name: Disk({}) for name in NAMES[first:]})
        self.nodes = {name: self._boot(name) for name in NAMES}
        self.down = set()
        self.cut = set()                    # names cut off from everyone else
        self.flight = []                    # [deliver_at, sequence, wire bytes]
        self.now = 0
        self.sequence = 0
        self.committed = {}                 # index -> (term, data, step committed)
        self.leaders = {}                   # term -> name
        self.elected = {}                   # (name, term) -> step
        self.reads = {}                     # context -> commit floor when asked
        self.proposed = 0
        self.reads_served = 0
        self.snapshots_sent = 0
        self.handovers = set()              # (member told to campaign, the term it would lead)

    def _boot(self, name):
        return Raft(name, self.disks[name].restored(), random.Random(self.rng.random()),
                    self.config)

    # -- the shell's job ------------------------------------------------------------------------

    def process(self, name):
        node, disk = self.nodes[name], self.disks[name]
        ready = node.ready()
        if ready.hard_state is not None:
            disk.hard = ready.hard_state
        if ready.install:
            disk.entries = {}
        if ready.entries_from is not None:
            for index in [i for i in disk.entries if i >= ready.entries_from]:
                del disk.entries[index]
            for entry in ready.entries:
                disk.entries[entry.index] = entry
        if ready.snapshot is not None:
            disk.snapshot = ready.snapshot
        if ready.compacted_to is not None:
            disk.offset, disk.offset_term = ready.compacted_to
            for index in [i for i in disk.entries if i <= disk.offset]:
                del disk.entries[index]
        for m in ready.messages:                     # sent only after persisting
            self.send(m)
        if ready.install:
            disk.state = tuple(msgpack.unpackb(ready.snapshot.data))
            disk.applied = ready.snapshot.index
        for entry in ready.committed:
            self.apply(name, entry)
        for context, index in ready.read_states:
            assert index >= self.reads.pop(context), \
                f"read {context} at {index} misses a committed entry"
            self.reads_served += 1
        if node.applied - node.snapshot.index >= 12 and self.rng.random() < 0.3:
            node.compact(node.applied, msgpack.packb(list(disk.state)),
                         entries_kept=self.rng.choice([0, 3, 10]))
            self.process(name)

    def apply(self, name, entry):
        disk = self.disks[name]
        assert entry.index == disk.applied + 1, f"{name} applies {entry.index} after " \
                                                f"{disk.applied}"
        known = self.committed.setdefault(entry.index, (entry.term, entry.data, self.now))
        assert known[:2] == (entry.term, entry.data), \
            f"state machine safety: {name} applies {entry} where another applied {known}"
        if entry.kind == DATA:
            disk.state += (entry.data,)
        disk.applied = entry.index

    def send(self, m):
        if m.kind is Kind.SNAPSHOT:
            self.snapshots_sent += 1
        if m.kind is Kind.TIMEOUT_NOW:
            self.handovers.add((m.target, m.term + 1))
        copies = 1
        if self.rng.random() < self.loss:
            copies = 0
        elif self.rng.random() < self.duplication:
            copies = 2
        wire = msgpack.packb(raft.message_to_wire(m))
        for _ in range(copies):
            self.sequence += 1
            self.flight.append([self.now + self.rng.randint(0, self.delay_max), self.sequence,
                                wire])

    # -- one step ---------------------------------------------------------------------------------

    def step(self):
        self.now += 1
        self.fault()
        live = [name for name in NAMES if name not in self.down]
        self.rng.shuffle(live)
        for name in live:
            self.nodes[name].tick()
            self.process(name)
        due = [item for item in self.flight if item[0] <= self.now]
        self.flight = [item for item in self.flight if item[0] > self.now]
        self.rng.shuffle(due)
        for _, _, wire in due:
            m = raft.message_from_wire(msgpack.unpackb(wire))
            if m.target in self.down or (m.source in self.cut) != (m.target in self.cut) or \
                    (m.source in self.cut and m.target in self.cut):
                continue
            self.nodes[m.target].step(m)
            self.process(m.target)
            if self.rng.random() < 0.01:
                # Crash and restart at once, right after answering (a vote, an append): only
                # what the Ready persisted survives (FoundationDB's BUGGIFY spirit).
                self.nodes[m.target] = self._boot(m.target)
        self.client()
        self.check()

    def fault(self):
        roll = self.rng.random()
        if roll < 0.03 and len(self.down) < 2:
            victim = self.leader() if roll < 0.015 else None        # leaders, above all
            victim = victim or self.rng.choice([n for n in NAMES if n not in self.down])
            self.down.add(victim)                                   # crash: memory lost
        elif roll < 0.06 and self.down:
            name = self.rng.choice(sorted(self.down))
            self.down.discard(name)
            self.nodes[name] = self._boot(name)
        elif roll < 0.08 and not self.cut:
            leader = self.leader()
            if leader is not None:
                self.cut = {leader}                                 # the leader cut off
        elif roll < 0.09 and not self.cut:
            self.cut = {self.rng.choice(NAMES)}
        elif roll < 0.12 and self.cut:
            self.cut = set()

    def leader(self):
        leaders = [n for n in self.nodes.values() if n.role is Role.LEADER
                   and n.name not in self.down]
        return max(leaders, key=lambda n: n.term).name if leaders else None

    def client(self):
        # Any node that believes it leads, a deposed one cut off too: it must refuse or wait.
        leaders = sorted(n.name for n in self.nodes.values()
                         if n.role is Role.LEADER and n.name not in self.down)
        if not leaders:
            return
        name = self.rng.choice(leaders)
        node = self.nodes[name]
        roll = self.rng.random()
        try:
            if roll < 0.4:
                self.proposed += 1
                node.propose(f"{self.seed}:{self.proposed}".encode())
            elif roll < 0.5:
                context = self.now * 10 + 1
                node.read_index(context)
                self.reads[context] = max((n.commit for n in self.nodes.values()), default=0)
            elif roll < 0.5 + self.transfers:
                node.transfer_leadership(self.rng.choice(sorted(node.members)))
            elif roll < 0.53 + self.transfers:
                members = dict(node.members)
                spare = [n for n in NAMES if n not in members]
                if spare and (len(members) < 3 or self.rng.random() < 0.5):
                    members[spare[0]] = f"addr-{spare[0]}"
                elif len(members) > 2:
                    members.pop(self.rng.choice(sorted(members)))
                node.propose_members(members)
        except RaftError:
            pass
        self.process(name)

    # -- invariants -------------------------------------------------------------------------------

    def check(self):
        live = [self.nodes[n] for n in NAMES if n not in self.down]
        for node in live:
            assert node.offset <= node.snapshot.index <= node.applied <= node.commit \
                <= node.last_index
            if node.role is Role.LEADER:
                holder = self.leaders.setdefault(node.term, node.name)
                assert holder == node.name, f"two leaders in term {node.term}: {holder}, " \
                                            f"{node.name}"
                elected = self.elected.setdefault((node.name, node.term), self.now)
                self.check_leader_completeness(node, elected)
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                self.check_log_matching(a, b)

    def check_leader_completeness(self, node, elected):
        for index, (term, data, when) in self.committed.items():
            if when >= elected or index <= node.snapshot.index and index <= node.offset:
                continue
            assert index <= node.last_index, f"leader {node.name} (term {node.term}) lacks " \
                                             f"committed entry {index}"
            if index > node.offset:
                entry = node.log[index - node.offset]
                assert (entry.term, entry.data) == (term, data), \
                    f"leader {node.name} has {entry} where {index} committed as {term}"

    def check_log_matching(self, a, b):
        low = max(a.offset, b.offset) + 1
        high = min(a.last_index, b.last_index)
        same_from_here_down = False
        for index in range(high, low - 1, -1):
            ea, eb = a.log[index - a.offset], b.log[index - b.offset]
            if ea.term == eb.term:
                same_from_here_down = True
            if same_from_here_down:
                assert ea == eb, f"log matching: {a.name} and {b.name} differ at {index}: " \
                                 f"{ea} vs {eb}"

    # -- the end ----------------------------------------------------------------------------------

    def heal_and_commit(self):
        self.cut = set()
        for name in sorted(self.down):
            self.nodes[name] = self._boot(name)
        self.down = set()
        self.loss = self.duplication = 0.0
        marker = None
        for _ in range(400):
            self.now += 1
            for name in NAMES:
                self.nodes[name].tick()
                self.process(name)
            due = sorted(item for item in self.flight if item[0] <= self.now)
            self.flight = [item for item in self.flight if item[0] > self.now]
            for _, _, wire in due:
                m = raft.message_from_wire(msgpack.unpackb(wire))
                self.nodes[m.target].step(m)
                self.process(m.target)
            self.check()
            name = self.leader()
            if name is None:
                continue
            leader = self.nodes[name]
            if marker is None or leader.term_at(marker[0]) != marker[1]:
                try:                              # (again, if a deposed leader lost it)
                    marker = (leader.propose(b"final"), leader.term)
                except RaftError:
                    continue
                self.process(name)
            members = [self.nodes[n] for n in leader.members]
            if all(n.applied >= marker[0] for n in members):
                final = [self.disks[n.name].state for n in members]
                assert all(state == final[0] for state in final)
                return
        raise AssertionError(f"no leader committed after healing (leader: {self.leader()}, "
                             f"marker {marker})")


def run_simulation(seed):
    sim = Simulation(seed)
    try:
        for _ in range(STEPS):
            sim.step()
        sim.heal_and_commit()
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} at step {sim.now}: {exc} (replay: CAIRN_RAFT_SEED="
                             f"{seed} pytest tests/test_raft.py -k replay)") from exc
    return sim


@pytest.mark.parametrize("block", range(10))
def test_simulation(block):
    for seed in range(block * 20, block * 20 + 20):
        run_simulation(seed)


def test_the_simulation_reaches_the_rare_paths():
    totals = {"leaders": 0, "reads": 0, "snapshots": 0, "members": 0, "handed_over": 0}
    for seed in range(30):
        sim = run_simulation(seed)
        totals["leaders"] += len(sim.leaders)
        totals["reads"] += sim.reads_served
        totals["snapshots"] += sim.snapshots_sent
        totals["members"] += len(set().union(*(n.members for n in sim.nodes.values()))) > 3
        # Handovers that made their target leader in the term it campaigned for.
        totals["handed_over"] += len(sim.handovers & {(name, term) for term, name in
                                                      sim.leaders.items()})
    assert totals["leaders"] > 60 and totals["reads"] > 50
    assert totals["snapshots"] > 10 and totals["members"] > 5, totals
    print(totals)
    assert totals["handed_over"] > 20, totals


@pytest.mark.skipif("CAIRN_RAFT_SEED" not in os.environ,
                    reason="replays one seed: set CAIRN_RAFT_SEED=N")
def test_replay():
    run_simulation(int(os.environ["CAIRN_RAFT_SEED"]))
