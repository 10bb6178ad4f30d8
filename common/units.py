"""Sizes as people write them: "4K", "4M", "2G", "512" (bytes; K, M, G, T are powers of 1024)."""

_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """Parse a size; raises ValueError naming the bad text.

    >>> parse_size("4K"), parse_size("1.5M"), parse_size("4096")
    (4096, 1572864, 4096)
    """
    raw = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    suffix = raw[-1:] if raw[-1:] in _SUFFIXES and raw[-1:] else ""
    number = raw[:-1] if suffix else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use bytes or a K, M, G, T suffix)") from None
    if value < 0:
        raise ValueError(f"size must not be negative: {text!r}")
    return int(value * _SUFFIXES[suffix])


def format_size(count):
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIXES[suffix]
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def parse_duration(text):
    """'90s', '15m', '2h', '1d' (or plain seconds) -> seconds; ValueError names a bad one."""
    text = str(text).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(text[-1:], None)
    number = text[:-1] if scale else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"a duration is a number with s, m, h or d (was {text!r})") from None
    if value < 0:
        raise ValueError(f"a duration is not negative (was {text!r})")
    return value
