"""Small helpers shared by tests."""

import asyncio
import os


def make_file(directory, size_bytes, name="device.img"):
    """A sparse file of `size_bytes` to use as a device."""
    path = os.path.join(directory, name)
    with open(path, "wb") as handle:
        handle.truncate(size_bytes)
    return path


def run(coroutine):
    """Run a coroutine on a fresh event loop (tests stay plain functions, so hypothesis works)."""
    return asyncio.run(coroutine)
