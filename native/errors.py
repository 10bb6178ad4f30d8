"""Typed errors of the block-device layer, shared by every twin.

The io_uring device, the pread/pwrite reference and the in-memory fault-injecting device all raise
these same classes (the Cython module imports them from here), so a caller cannot tell the twins
apart except by speed. Each error names the device, the offset and length where it applies, and the
likely fix, because "EIO" alone tells an operator nothing.

Blame, in the spirit of h11's Local/RemoteProtocolError:
- `MisalignedIO` and `OutOfRange` are misuse by the caller (a bug above us, or a bad request that
  should have been checked earlier).
- `DeviceIOError`, `DeviceGone` and `DeviceNoSpace` are operating errors of the device: the store
  reports them and the cluster recovers from other copies.
- `DirectIONotSupported` and `IoUringUnavailable` are set-up problems with a fix to print.
"""

import errno as _errno
import os


class DeviceError(Exception):
    """Base of every block-device error."""

    def __init__(self, message, *, path=None, offset=None, length=None, errno=None):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.length = length
        self.errno = errno


class DeviceIOError(DeviceError):
    """The device failed an operation (EIO and kin)."""


class MisalignedIO(DeviceError):
    """Offset, length or buffer address is not aligned for O_DIRECT."""


class OutOfRange(DeviceError):
    """The operation reaches past the end of the device."""


class DeviceGone(DeviceError):
    """The device disappeared or was closed (ENODEV, ENXIO, EBADF, or crashed in a simulation)."""


class DeviceNoSpace(DeviceError):
    """The device (or the filesystem under a file device) is out of space."""


class DirectIONotSupported(DeviceError):
    """The filesystem holding a file device refuses O_DIRECT (tmpfs, for example)."""


class IoUringUnavailable(DeviceError):
    """The kernel refused to set up an io_uring instance."""


def describe_open_failure(path, exc):
    """Turn an OSError from opening `path` with O_DIRECT into a typed error with a fix."""
    if exc.errno == _errno.EINVAL:
        return DirectIONotSupported(
            f"{path}: the filesystem refuses O_DIRECT (tmpfs does, for example); "
            "put the device file on ext4/xfs or use a real block device",
            path=path, errno=exc.errno,
        )
    if exc.errno in (_errno.ENOENT, _errno.ENODEV, _errno.ENXIO):
        return DeviceGone(f"{path}: no such device or file ({os.strerror(exc.errno)})",
                          path=path, errno=exc.errno)
    if exc.errno in (_errno.EACCES, _errno.EPERM):
        return DeviceError(f"{path}: permission denied; run as root or fix the device's owner",
                           path=path, errno=exc.errno)
    return DeviceError(f"{path}: cannot open: {os.strerror(exc.errno)}", path=path,
                       errno=exc.errno)


def describe_uring_failure(err):
    """Turn a failed io_uring_queue_init (negative errno) into an error with the likely cause."""
    err = abs(err)
    if err == _errno.EPERM:
        hint = ("io_uring is disabled for this process; likely cause: the sysctl "
                "kernel.io_uring_disabled is set (fix: 'sysctl -w kernel.io_uring_disabled=0') "
                "or a seccomp profile (container runtime) blocks io_uring_setup")
    elif err == _errno.ENOSYS:
        hint = "this kernel has no io_uring (it needs Linux 5.6 or newer)"
    elif err == _errno.ENOMEM:
        hint = ("the kernel could not lock memory for the ring; likely cause: RLIMIT_MEMLOCK "
                "is too low (fix: 'ulimit -l unlimited' or a smaller queue depth)")
    else:
        hint = os.strerror(err)
    return IoUringUnavailable(f"io_uring_queue_init failed: {hint}", errno=err)


def error_for_errno(op, err, *, path, offset, length):
    """Map a negative completion result (or an errno) to a typed error naming the operation."""
    err = abs(err)
    where = f"{path}: {op} of {length} bytes at offset {offset}"
    if err == _errno.EINVAL:
        return MisalignedIO(f"{where} was refused (EINVAL): O_DIRECT needs offset, length and "
                            "buffer address aligned to the device's logical block size; take "
                            "buffers from BufferPool",
                            path=path, offset=offset, length=length, errno=err)
    if err == _errno.ENOSPC:
        return DeviceNoSpace(f"{where} failed: no space left on the device (ENOSPC)",
                             path=path, offset=offset, length=length, errno=err)
    if err in (_errno.ENODEV, _errno.ENXIO, _errno.EBADF):
        return DeviceGone(f"{where} failed: the device is gone ({os.strerror(err)})",
                          path=path, offset=offset, length=length, errno=err)
    return DeviceIOError(f"{where} failed: {os.strerror(err)}; the device may be failing "
                         "(check dmesg)", path=path, offset=offset, length=length, errno=err)
