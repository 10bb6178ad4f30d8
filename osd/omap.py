"""Omap requests: parsing and conditions (pure: no I/O).

An omap is an object's sorted key/value table (Ceph's name for it), kept by the store beside the
object's bytes (osd/records.py). Directories of the file namespace live in omaps: adding one
entry to a directory of a million is one small update, and listing reads the directory alone,
in pages.

The `omap` op changes one object's table atomically, if its conditions hold:

    {"op": "omap", "name": ..., "set": [[key, value], ...], "remove": [key, ...],
     "clear": bool,          # drop every entry first
     "create": bool,         # make the object (empty) if it is absent; else not_found
     "if": [["absent", key] | ["present", key] | ["equals", key, value]
            | ["none", prefix], ...],     # no key starts with prefix (b"": the table is empty)
     "if_version": int}      # compare-and-swap on the object's version (0: it must not exist)

Conditions are checked by the primary under the object's lock against its current copy, so a
check and the update it guards are one step: two clients inserting the same key (the same file
name) cannot both succeed. A failed condition changes nothing and answers `precondition`. Keys
and values are bytes; keys sort bytewise.
"""

import dataclasses

from cairn.common.codes import Code
from cairn.common.limits import OMAP_KEY_BYTES_MAX, OMAP_PAGE_ENTRIES_MAX, OMAP_UPDATE_BYTES_MAX
from cairn.common.messenger import RequestFailed
from cairn.osd import records
from cairn.osd.backend import OmapChange
from cairn.osd.errors import InvalidArgument

CONDITION_KINDS = ("absent", "present", "equals", "none")
# Keys and values of one omap_list reply (a header: common/frame.py bounds those at 1 MiB).
LIST_REPLY_BYTES = OMAP_UPDATE_BYTES_MAX
LIST_LIMIT_DEFAULT = 1000


@dataclasses.dataclass(frozen=True)
class OmapRequest:
    update: OmapChange
    create: bool = False
    conditions: tuple = ()          # (kind, key, value or None)
    if_version: int | None = None

    @property
    def keys_checked(self):
        return [key for kind, key, _ in self.conditions if kind != "none"]

    @property
    def prefixes_checked(self):
        return [prefix for kind, prefix, _ in self.conditions if kind == "none"]


def _invalid(message):
    return RequestFailed(Code.INVALID, message)


def _checked(check, value, what):
    try:
        check(value)
    except InvalidArgument as exc:
        raise _invalid(f"{what}: {exc}") from None
    return bytes(value)


def _key(value, what):
    return _checked(records.check_omap_key, value, what)


def _value(value, what):
    return _checked(records.check_omap_value, value, what)


def _list(header, field, limit=OMAP_PAGE_ENTRIES_MAX):
    value = header.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise _invalid(f"{field} must be a list of at most {limit} items")
    return value


def parse_update(header):
    """The OmapRequest of an `omap` (or `rep_omap`) header; RequestFailed(Code.INVALID) for
    anything malformed."""
    sets = []
    for pair in _list(header, "set"):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise _invalid("set is a list of [key, value] pairs")
        sets.append((_key(pair[0], "set"), _value(pair[1], "set")))
    removes = tuple(_key(key, "remove") for key in _list(header, "remove"))
    total = sum(len(k) + len(v) for k, v in sets) + sum(map(len, removes))
    if total > OMAP_UPDATE_BYTES_MAX:
        raise _invalid(f"an omap update of {total} bytes is over the limit "
                       f"({OMAP_UPDATE_BYTES_MAX}); split it")
    conditions = []
    for condition in _list(header, "if"):
        if not (isinstance(condition, list) and condition and
                condition[0] in CONDITION_KINDS and
                len(condition) == (3 if condition[0] == "equals" else 2)):
            raise _invalid("a condition is [\"absent\", key], [\"present\", key], "
                           "[\"equals\", key, value] or [\"none\", prefix]")
        value = _value(condition[2], "if") if condition[0] == "equals" else None
        if condition[0] == "none":
            if not isinstance(condition[1], bytes) or len(condition[1]) > OMAP_KEY_BYTES_MAX:
                raise _invalid("a none condition names a key prefix (bytes)")
            conditions.append(("none", condition[1], None))
        else:
            conditions.append((condition[0], _key(condition[1], "if"), value))
    if_version = header.get("if_version")
    if if_version is not None and (not isinstance(if_version, int) or if_version < 0):
        raise _invalid("if_version is an object version (0: the object must not exist)")
    for flag in ("clear", "create"):
        if not isinstance(header.get(flag, False), bool):
            raise _invalid(f"{flag} is true or false")
    return OmapRequest(OmapChange(tuple(sets), removes, header.get("clear", False)),
                       header.get("create", False), tuple(conditions), if_version)


def check_conditions(request, name, version, current, used_prefixes=()):
    """Raise RequestFailed(Code.PRECONDITION) unless every condition holds for object `name` at
    `version` (0: absent) whose checked keys hold `current` ({key: value}) and whose table has
    keys under each of `used_prefixes` (of those the request checks)."""
    if request.if_version is not None and version != request.if_version:
        state = f"at version {version:x}" if version else "absent"
        raise RequestFailed(Code.PRECONDITION, f"object {name!r} is {state}, not at version "
                            f"{request.if_version:x}")
    for kind, key, value in request.conditions:
        have = current.get(key)
        if kind == "absent" and have is not None:
            raise RequestFailed(Code.PRECONDITION, f"key {key!r} of {name!r} exists")
        if kind == "present" and have is None:
            raise RequestFailed(Code.PRECONDITION, f"key {key!r} of {name!r} does not exist")
        if kind == "equals" and have != value:
            raise RequestFailed(Code.PRECONDITION, f"key {key!r} of {name!r} holds another value")
        if kind == "none" and key in used_prefixes:
            raise RequestFailed(Code.PRECONDITION, f"{name!r} has keys starting with {key!r}")


def parse_keys(header):
    keys = _list(header, "keys")
    if not keys:
        raise _invalid("omap_get needs keys: a list of omap keys")
    return [_key(key, "keys") for key in keys]


def parse_listing(header):
    """(start_after or None, prefix, limit) of an omap_list / pg_omap header."""
    start_after = header.get("start_after")
    if start_after is not None:
        start_after = _key(start_after, "start_after")
    prefix = header.get("prefix", b"")
    if not isinstance(prefix, bytes) or len(prefix) > OMAP_KEY_BYTES_MAX:
        raise _invalid("prefix is a byte string")
    limit = header.get("limit", LIST_LIMIT_DEFAULT)
    if not isinstance(limit, int) or not 1 <= limit <= OMAP_PAGE_ENTRIES_MAX:
        raise _invalid(f"limit must be within 1..{OMAP_PAGE_ENTRIES_MAX}")
    return start_after, prefix, limit
