"""The client library's errors (defined in cairn.common.errors, which the error-code table in
cairn.common.codes maps each wire code to)."""

from cairn.common.errors import *  # noqa: F401,F403
from cairn.common.errors import __all__  # noqa: F401
