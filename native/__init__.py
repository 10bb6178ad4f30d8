"""Native hot paths of cairn, each beside its pure-Python reference twin.

Selection happens here and only here: `open_device()` returns the io_uring device unless
`CAIRN_NO_EXTENSIONS=1` asks for the pread/pwrite reference. There is no silent fallback: if the
extension is missing, `open_device()` raises with the command that builds it, and
`implementation()` says which path a daemon is on so it can log it at start-up.
"""

import importlib
import os

# Names are loaded on first use, so a pure core that needs only crc32c does not pull asyncio in
# with the devices (tests/test_cores.py guards that).
_LAZY = {
    "FileBlockDevice": "blockdev", "UringBlockDevice": "blockdev",
    "ALIGN_BYTES": "bufpool", "BufferPool": "bufpool",
    "block_crcs": "checksum", "crc32c": "checksum",
    "DeviceError": "errors", "DeviceGone": "errors", "DeviceIOError": "errors",
    "DeviceNoSpace": "errors", "DirectIONotSupported": "errors",
    "IoUringUnavailable": "errors", "MisalignedIO": "errors", "OutOfRange": "errors",
    "MemoryBlockDevice": "memdev",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cairn.native' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"cairn.native.{module}"), name)
    globals()[name] = value
    return value


def extensions_disabled():
    return os.environ.get("CAIRN_NO_EXTENSIONS", "") not in ("", "0")


def implementation():
    """'uring' or 'file': the block-device implementation `open_device()` will use."""
    return "file" if extensions_disabled() else "uring"


def open_device(path, queue_depth=None, pool=None):
    """Open `path` (block device or regular file) with O_DIRECT on the running loop."""
    from cairn.native.blockdev import FileBlockDevice, UringBlockDevice
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
