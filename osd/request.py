"""Fields of an OSD request's header, checked: each parser returns the value or raises
RequestFailed(invalid) naming what is wrong. Used by the client ops (osd/service.py) and the
member ops (osd/member_ops.py) alike, so one field is checked one way."""

from cairn.common.codes import Code
from cairn.common.messenger import RequestFailed

# Entries of a listing page unless the request asks for fewer.
LIST_PAGE_DEFAULT = 1000
# Byte ranges one pg_read or shard_read may ask for (a healthy EC read of a 64 MiB object over
# 4 MiB stripes asks each data shard for 16).
PG_READ_RANGES_MAX = 1024


def object_name(header):
    name = header.get("name")
    if not isinstance(name, str) or not name:
        raise RequestFailed(Code.INVALID, "an object name is a non-empty string")
    return name


def op_version(header):
    """The PG version a member's op carries (a positive integer)."""
    version = header.get("version")
    if type(version) is not int or version <= 0:
        raise RequestFailed(Code.INVALID, "a replicated op carries its PG version")
    return version


def byte_ranges(header, required):
    """The request's `ranges`: a list of [offset, length] pairs of non-negative integers, at
    most PG_READ_RANGES_MAX; None when absent and not `required` (then at least one)."""
    ranges = header.get("ranges")
    if ranges is None and not required:
        return None
    if not (isinstance(ranges, list) and required <= len(ranges) <= PG_READ_RANGES_MAX
            and all(isinstance(r, list) and len(r) == 2 and all(
                type(v) is int and v >= 0 for v in r) for r in ranges)):
        raise RequestFailed(Code.INVALID, f"ranges must be a list of {int(required)} to "
                            f"{PG_READ_RANGES_MAX} [offset, length] pairs")
    return ranges
