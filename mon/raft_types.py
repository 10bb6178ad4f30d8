"""The Raft core's vocabulary: roles, message kinds, entries, messages, the Ready a core hands
its shell, the state it restores from, its configuration and its errors (mon/raft.py is the core;
it re-exports all of these, so `raft.Kind` and `raft_types.Kind` are the same).

Pure data: frozen dataclasses and enums, no behaviour beyond validation of the configuration.
"""

import dataclasses
import enum

DATA = "data"
CONF = "conf"
NOOP = "noop"
ENTRY_KINDS = (DATA, CONF, NOOP)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class Kind(enum.Enum):
    PRE_VOTE = "pre_vote"
    PRE_VOTE_RESPONSE = "pre_vote_response"
    VOTE = "vote"
    VOTE_RESPONSE = "vote_response"
    APPEND = "append"
    APPEND_RESPONSE = "append_response"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_RESPONSE = "heartbeat_response"
    SNAPSHOT = "snapshot"
    TIMEOUT_NOW = "timeout_now"


class Progress(enum.Enum):
    PROBE = "probe"                 # one append in flight until it is answered
    REPLICATE = "replicate"         # appends streamed optimistically
    SNAPSHOT = "snapshot"           # a snapshot sent; waiting for its answer


class RaftError(Exception):
    """A request the core cannot take now; the message says why."""


class NotLeader(RaftError):
    def __init__(self, leader, why=None):
        super().__init__(why or f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class PeerInvalid(RaftError):
    """A peer's message that no correct member could have sent: taking it could break safety.

    The core refuses it before changing anything; the shell logs it with the sender and raises
    the MON_PEER_INVALID health check. `sender` is the message's source, `reason` says what is
    wrong, in words."""

    def __init__(self, sender, kind, reason):
        super().__init__(f"{kind.value} from {sender}: {reason}")
        self.sender, self.kind, self.reason = sender, kind, reason


class ChangeRefused(RaftError):
    """A membership change that is not one server at a time, or comes while another is under
    way."""


# Why a membership change is refused (ChangeRefused's message), besides its size.
CHANGE_PENDING = "a membership change is still being committed; try again"
LAST_MEMBER = "the last monitor cannot be removed"


@dataclasses.dataclass(frozen=True)
class Entry:
    term: int
    index: int
    kind: str
    data: object = None             # bytes (DATA), a members dict (CONF), None (NOOP)
    context: str | None = None      # CONF: the shell's tag for the change (a request id)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    index: int
    term: int
    members: dict
    data: bytes | None = None       # None: the initial state every member starts from


@dataclasses.dataclass(frozen=True)
class HardState:
    term: int
    vote: str | None
    commit: int


@dataclasses.dataclass(frozen=True)
class Message:
    kind: Kind
    source: str
    target: str
    term: int
    index: int = 0                  # append: previous index; responses: the index answered
    log_term: int = 0               # append: previous term; votes: candidate's last term
    entries: tuple = ()
    commit: int = 0
    reject: bool = False
    hint: int = 0                   # a rejected append: the follower's last index
    context: int = 0                # heartbeats: the read-index round they confirm
    snapshot: Snapshot | None = None
    transfer: bool = False          # a vote asked for by the leader handing over (TIMEOUT_NOW)


@dataclasses.dataclass(frozen=True)
class Ready:
    """What the shell must do, in field order (see the module docstring)."""
    hard_state: HardState | None = None
    entries_from: int | None = None             # drop persisted entries from here, then
    entries: tuple = ()                         # write these
    snapshot: Snapshot | None = None            # persist (taken here or received)
    install: bool = False                       # from the leader: drop every persisted entry,
                                                # replace the state machine with it
    compacted_to: tuple | None = None           # (index, term): drop persisted entries <= index
    messages: tuple = ()
    committed: tuple = ()                       # apply these, in order
    read_states: tuple = ()                     # (context, index): serve once index is applied

    def __bool__(self):
        return any((self.hard_state, self.entries_from is not None, self.snapshot,
                    self.compacted_to, self.messages, self.committed, self.read_states))


@dataclasses.dataclass(frozen=True)
class Restored:
    """Durable state to start from: what earlier Readies persisted."""
    hard_state: HardState
    snapshot: Snapshot
    offset: int                     # index of the sentinel (entries start at offset + 1)
    offset_term: int
    entries: tuple
    applied: int                    # the state machine's index

    @classmethod
    def initial(cls, members):
        return cls(HardState(0, None, 0), Snapshot(0, 0, dict(members)), 0, 0, (), 0)


@dataclasses.dataclass(frozen=True)
class RaftConfig:
    # A follower that hears no leader for a random time in [election_ticks, 2 * election_ticks)
    # campaigns (the paper's randomised timeouts; etcd's default is 10 heartbeats too).
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # Entries in one append; map changes are small, this bounds a catch-up message.
    entries_per_message_max: int = 64
    # A leader waits this long for a snapshot's answer before trying again.
    snapshot_ticks_max: int = 30

    def __post_init__(self):
        assert self.heartbeat_ticks >= 1
        assert self.election_ticks > self.heartbeat_ticks
        assert self.entries_per_message_max >= 1
