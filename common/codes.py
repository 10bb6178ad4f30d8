"""Error codes: what a daemon answers when it refuses or fails a request, and what each means.

Theory of operation:
- On the wire an error frame carries `{"error": code, "message": text}`; the code is a short
  word (the values below, unchanged since the first wire format). `Code` is a `StrEnum`, so a
  member packs, compares and prints as its word.
- `MEANINGS` is the one table that says, for each code, which client exception it becomes,
  whether the client library retries it (after a newer map or a reconnect), and whether a write
  refused with it may still have been applied (so a retried `delete` that finds nothing, or a
  retried conditional write whose condition now fails, may be its own earlier success).
  The OSD, the monitor and the client all read it; nothing else maps codes.
- A code received that this build does not know stays a plain string (`parse`); the client
  treats it as a protocol error.
"""

import dataclasses
import enum

from cairn.common import errors


class Code(enum.StrEnum):
    NOT_FOUND = "not_found"
    EXISTS = "exists"
    NO_SPACE = "no_space"
    QUOTA = "quota"
    POOL_UNAVAILABLE = "pool_unavailable"
    UNAVAILABLE = "unavailable"
    PRECONDITION = "precondition"
    UNSUPPORTED = "unsupported"
    PERMISSION_DENIED = "permission_denied"
    AUTH_EXPIRED = "auth_expired"
    TLS = "tls"
    INVALID = "invalid"
    PROTOCOL = "protocol"
    UNKNOWN_OP = "unknown_op"
    INTERNAL = "internal"
    IO_ERROR = "io_error"
    WRONG_PRIMARY = "wrong_primary"
    STALE = "stale"
    AGAIN = "again"
    BEHIND = "behind"
    BUSY = "busy"
    NO_QUORUM = "no_quorum"


@dataclasses.dataclass(frozen=True)
class Meaning:
    error: type             # the client exception a caller sees when no retry is left
    retryable: bool         # the client library retries it until the op's deadline
    may_have_applied: bool  # a write answered with it may have changed the object
    what: str               # for people: when a daemon answers with it


MEANINGS = {
    Code.NOT_FOUND: Meaning(errors.ObjectNotFound, False, False,
                            "no such object, pool, key or entity"),
    Code.EXISTS: Meaning(errors.AlreadyExists, False, False, "it exists already"),
    Code.NO_SPACE: Meaning(errors.NoSpace, False, False,
                           "an OSD (or its device) is full; nothing was written"),
    Code.QUOTA: Meaning(errors.QuotaExceeded, False, False, "the pool is at its quota"),
    Code.POOL_UNAVAILABLE: Meaning(errors.PoolUnavailable, False, False,
                                   "the PG has fewer members up than min_size"),
    Code.UNAVAILABLE: Meaning(errors.DataUnavailable, False, False,
                              "too few shards or copies can be read now"),
    Code.PRECONDITION: Meaning(errors.PreconditionFailed, False, False,
                               "an update's condition did not hold"),
    Code.UNSUPPORTED: Meaning(errors.Unsupported, False, False, "the pool cannot do this"),
    Code.PERMISSION_DENIED: Meaning(errors.PermissionDenied, False, False,
                                    "the key's caps do not allow it, or the key is wrong"),
    Code.AUTH_EXPIRED: Meaning(errors.PermissionDenied, True, False,
                               "the session's ticket expired: reconnect with a new one"),
    Code.TLS: Meaning(errors.ProtocolError, False, False, "TLS could not be set up"),
    Code.INVALID: Meaning(errors.ProtocolError, False, False, "a malformed request"),
    Code.PROTOCOL: Meaning(errors.ProtocolError, False, False, "a frame broke the protocol"),
    Code.UNKNOWN_OP: Meaning(errors.ProtocolError, False, False, "no such request"),
    Code.INTERNAL: Meaning(errors.ProtocolError, False, True,
                           "the daemon failed while handling it (a bug; see its log)"),
    Code.IO_ERROR: Meaning(errors.ProtocolError, False, False,
                           "a device error or a checksum mismatch on every copy read"),
    Code.WRONG_PRIMARY: Meaning(errors.Timeout, True, False,
                                "this OSD is not the PG's primary at the request's epoch"),
    Code.STALE: Meaning(errors.Timeout, True, False,
                        "the request's map is older than the PG's interval"),
    Code.AGAIN: Meaning(errors.Timeout, True, True,
                        "try again (a replica failed part way, or the OSD is starting)"),
    Code.BEHIND: Meaning(errors.Timeout, True, False,
                         "between OSDs: the member lacks the prior version"),
    Code.BUSY: Meaning(errors.Timeout, True, False, "the daemon is at a limit; try later"),
    Code.NO_QUORUM: Meaning(errors.Timeout, True, False, "the monitors have no leader"),
}
assert set(MEANINGS) == set(Code)


def parse(word):
    """The Code a received error word names, or the word itself when this build does not know
    it (a newer peer's code)."""
    try:
        return Code(word)
    except ValueError:
        return str(word)


def meaning(code):
    """The Meaning of a code; an unknown one is a protocol error, not retried."""
    return MEANINGS.get(code) or Meaning(errors.ProtocolError, False, False, f"unknown: {code}")
