"""Sizes in bytes as users write them: an integer, or a number with a unit (``64MB``, ``1GiB``, ``"20GB"``)."""

from __future__ import annotations

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def parse_bytes(value, key: str, low: int, high: int, example: str) -> int:
    """``value`` in bytes, within ``low..high``, or an error naming ``key`` and how to write it."""
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = text[len(number) :]
    try:
        count = int(float(number) * UNITS[unit]) if not isinstance(value, bool) else -1
    except (ValueError, KeyError, OverflowError):
        count = -1
    if not low <= count <= high:
        raise ValueError(
            f"{key}={value!r} must be a size from {describe(low)} to {describe(high)}: an integer, or a number "
            f"with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB ({key}={example})"
        )
    return count


def describe(count: int) -> str:
    """``count`` bytes in the largest unit that keeps it whole (binary first), else in decimal, one decimal."""
    binary = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    decimal = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
    for unit, size in (*binary, *decimal):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    for unit, size in decimal:
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return f"{count}B"
