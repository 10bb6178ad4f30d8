"""Errors of the client library. Each says what happened and what to do next.

They live in `common` because `common/codes.py` maps each wire code to one of them (the client
library imports them from `cairn.client.errors`, which re-exports this module).

- ObjectNotFound: no such object (or it was deleted).
- AlreadyExists: the thing to create exists already (an auth entity, a pool).
- PoolNotFound: no such pool in the cluster map.
- NoSpace: an OSD holding the object is full; free space or add OSDs.
- QuotaExceeded: the pool is at its quota (`cairn pool set-quota`); raise it or delete objects.
- PoolUnavailable: the object's PG has fewer members up than min_size; writes are refused until
  OSDs return (reads may still work).
- DataUnavailable: too few shards of an erasure-coded object can be read right now (the message
  names the PG, the shards found and how many are needed); it may be readable again when OSDs
  return.
- PreconditionFailed: an omap update's condition did not hold (a key exists, is absent, or
  holds another value; the object is at another version); nothing was changed by this attempt
  (`maybe_applied`: an earlier attempt that got no answer may have been).
- Unsupported: the pool cannot do this (omaps need a replicated pool).
- PermissionDenied: the key's caps do not allow this (the message names the entity, the op and
  the cap it lacks), or the key is wrong, unknown or missing where the cluster requires one.
- Timeout: no answer within the op's deadline (OSDs or monitors unreachable).
- ProtocolError: a daemon sent something we do not understand, or refused the request as
  malformed.
"""


class ClientError(Exception):
    """Base of every client library error."""


class ObjectNotFound(ClientError):
    pass


class AlreadyExists(ClientError):
    pass


class PoolNotFound(ClientError):
    pass


class NoSpace(ClientError):
    pass


class QuotaExceeded(ClientError):
    pass


class PoolUnavailable(ClientError):
    pass


class DataUnavailable(ClientError):
    pass


class PreconditionFailed(ClientError):
    def __init__(self, message, maybe_applied=False):
        super().__init__(message)
        # An earlier attempt of the same op got no answer: it may have been applied, and be
        # why the condition fails now. The caller checks the outcome it wanted.
        self.maybe_applied = maybe_applied


class Unsupported(ClientError):
    pass


class PermissionDenied(ClientError):
    pass


class Timeout(ClientError):
    pass


class ProtocolError(ClientError):
    pass


__all__ = ["ClientError", "ObjectNotFound", "AlreadyExists", "PoolNotFound", "NoSpace",
           "QuotaExceeded", "PoolUnavailable", "DataUnavailable", "PreconditionFailed",
           "Unsupported", "PermissionDenied", "Timeout", "ProtocolError"]
