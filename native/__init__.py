"""Native hot paths of cairn, each beside its pure-Python reference twin.

Selection happens here and only here: `open_device()` returns the io_uring device unless
`CAIRN_NO_EXTENSIONS=1` asks for the pread/pwrite reference. There is no silent fallback: if the
extension is missing, `open_device()` raises with the command that builds it, and
`implementation()` says which path a daemon is on so it can log it at start-up.
"""

import os

from cairn.native.blockdev import FileBlockDevice, UringBlockDevice
from cairn.native.bufpool import ALIGN_BYTES, BufferPool
from cairn.native.checksum import block_crcs, crc32c
from cairn.native.errors import (DeviceError, DeviceGone, DeviceIOError, DeviceNoSpace,
                                 DirectIONotSupported, IoUringUnavailable, MisalignedIO,
                                 OutOfRange)
from cairn.native.memdev import MemoryBlockDevice


def extensions_disabled():
    return os.environ.get("CAIRN_NO_EXTENSIONS", "") not in ("", "0")


def implementation():
    """'uring' or 'file': the block-device implementation `open_device()` will use."""
    return "file" if extensions_disabled() else "uring"


def open_device(path, queue_depth=None, pool=None):
    """Open `path` (block device or regular file) with O_DIRECT on the running loop."""
    if extensions_disabled():
        return FileBlockDevice.open(path, pool=pool)
    try:
        import cairn.native._uring  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "cairn's io_uring extension is not built (cairn.native._uring); run "
            "'pip install -e .' in the source tree (it needs 'apt-get install -y liburing-dev'), "
            "or set CAIRN_NO_EXTENSIONS=1 to use the slow reference device") from exc
    kwargs = {} if queue_depth is None else {"queue_depth": queue_depth}
    return UringBlockDevice.open(path, pool=pool, **kwargs)


__all__ = [
    "ALIGN_BYTES", "BufferPool", "DeviceError", "DeviceGone", "DeviceIOError", "DeviceNoSpace",
    "DirectIONotSupported", "FileBlockDevice", "IoUringUnavailable", "MemoryBlockDevice",
    "MisalignedIO", "OutOfRange", "UringBlockDevice", "block_crcs", "crc32c",
    "extensions_disabled", "implementation", "open_device",
]
