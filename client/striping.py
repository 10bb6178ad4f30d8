"""Striping large data over many objects, and the manifest that makes a stripe set visible
(pure: no I/O).

`put_stream(name, ...)` writes stripe objects `NAME.~s.TOKEN.INDEX` (INDEX in hex, TOKEN fresh
per write) in parallel, then the manifest as the object `NAME` itself, flagged as a manifest.
Until the manifest is written, readers see the previous version or nothing: a half-written stripe
set is never visible. Overwriting leaves the previous stripes behind until the new manifest is in
place; then they are deleted.

The manifest is msgpack: {format, size, stripe_bytes, count, token, crcs} with one crc32c per
stripe, checked when the stripe is read back.
"""

import dataclasses
import re

import msgpack

MANIFEST_FORMAT = 1
STRIPE_BYTES_DEFAULT = 4 * 1024 * 1024
STRIPE_MARK = ".~s."


class ManifestError(ValueError):
    """A manifest that cannot be decoded (damaged, or written by a newer format)."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    size: int
    stripe_bytes: int
    token: str
    crcs: tuple

    @property
    def count(self):
        return len(self.crcs)

    def stripe_name(self, name, index):
        return stripe_name(name, self.token, index)

    def stripe_range(self, index):
        """(offset, length) of stripe `index` in the whole."""
        assert 0 <= index < self.count
        offset = index * self.stripe_bytes
        return offset, min(self.stripe_bytes, self.size - offset)

    def encode(self):
        return msgpack.packb({"format": MANIFEST_FORMAT, "size": self.size,
                              "stripe_bytes": self.stripe_bytes, "count": self.count,
                              "token": self.token, "crcs": list(self.crcs)})

    @classmethod
    def decode(cls, raw):
        try:
            data = msgpack.unpackb(raw)
            if data["format"] != MANIFEST_FORMAT:
                raise ManifestError(f"manifest format {data['format']} is not supported "
                                    f"(this client reads {MANIFEST_FORMAT})")
            manifest = cls(data["size"], data["stripe_bytes"], data["token"], tuple(data["crcs"]))
        except ManifestError:
            raise
        except Exception as exc:        # msgpack raises several unrelated types on garbage
            raise ManifestError(f"damaged manifest: {exc}") from None
        if manifest.count != data["count"] or manifest.count != stripe_count(
                manifest.size, manifest.stripe_bytes):
            raise ManifestError("damaged manifest: stripe count does not match its size")
        return manifest


def stripe_count(size, stripe_bytes):
    assert stripe_bytes > 0
    return max(1, -(-size // stripe_bytes)) if size else 0


def stripe_name(name, token, index):
    return f"{name}{STRIPE_MARK}{token}.{index:x}"


def is_stripe_name(name):
    return STRIPE_MARK in name


_STRIPE_NAME = re.compile(r"(\S+?)" + re.escape(STRIPE_MARK) + r"[0-9a-f]+\.[0-9a-f]+")


def logical_names(text):
    """`text` (an OSD's message) with stripe object names shown as the object they make up."""
    return _STRIPE_NAME.sub(r"\1", text)
