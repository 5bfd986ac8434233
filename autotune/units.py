"""Memory sizes: parse what users type, format what autotune prints.

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB)
are powers of 1000, as the IEC prefixes define them. A bare K, M, G or T is binary,
the way nvidia-smi and PyTorch's OOM messages mean it ("12G" is 12 GiB).

Text needs its unit: "12" could be 12 GiB or 12 bytes, so it is refused (B or "bytes"
says bytes: "1024B"). An int from Python is a byte count.
"""

from __future__ import annotations

import re
from decimal import Decimal

from autotune.errors import InvalidInput

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

# Unit (lower case) -> bytes.
_UNITS: dict[str, int] = {
    "b": 1,
    "bytes": 1,
    "k": KIB,
    "kib": KIB,
    "m": MIB,
    "mib": MIB,
    "g": GIB,
    "gib": GIB,
    "t": TIB,
    "tib": TIB,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")

ALLOWED_UNITS = "KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024), KB, MB, GB, TB (powers of 1000), B"
_FORMS = f"use a number with a unit, e.g. 12GiB, 16GB, 512MiB; units: {ALLOWED_UNITS}"

# Largest first, for format_bytes.
_FORMAT_UNITS: tuple[tuple[str, int], ...] = (
    ("TiB", TIB),
    ("GiB", GIB),
    ("MiB", MIB),
    ("KiB", KIB),
)


def parse_bytes(text: str | int) -> int:
    """Parse a memory size into bytes; the result is always > 0.

    Accepted: an int, a byte count (1024); text of a number (decimals allowed) with a
    binary unit KiB/MiB/GiB/TiB or a decimal unit KB/MB/GB/TB, case-insensitive, with
    or without a space ("12GiB", "12 gib", "12.5GiB", "16GB"); nvidia-smi style K/M/G/T,
    which mean KiB/MiB/GiB/TiB ("12G" is 12 GiB); and B or "bytes" for a byte count
    ("1024B"). A fractional byte count is rounded to the nearest byte.

    Raises InvalidInput naming the bad text and the accepted units; text without a unit
    ("12") is refused with the readings it could have ("12GiB", "12MiB", "12B").
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        # bool is an int subclass, and True is not a size
        raise InvalidInput(f"invalid memory size {text!r}: {_FORMS}")
    nbytes = text if isinstance(text, int) else _parse_text(text)
    if nbytes <= 0:
        raise InvalidInput(f"invalid memory size '{text}': must be greater than 0 bytes")
    return nbytes


def _parse_text(text: str) -> int:
    if text.strip().startswith("-") and _SIZE.match(text.strip()[1:]):
        raise InvalidInput(f"invalid memory size '{text}': must be greater than 0 bytes")
    match = _SIZE.match(text)
    if match is None:
        raise InvalidInput(f"invalid memory size '{text}': {_FORMS}")
    number, unit = Decimal(match.group(1)), match.group(2).lower()
    if not unit and number > 0:  # zero is refused as zero, whatever its unit
        raise InvalidInput(
            f"invalid memory size '{text}': a size needs a unit, e.g. {match.group(1)}GiB or "
            f"{match.group(1)}MiB ({match.group(1)}B for bytes); units: {ALLOWED_UNITS}"
        )
    if unit and unit not in _UNITS:
        raise InvalidInput(f"invalid memory size '{text}': {_FORMS}")
    return int((number * _UNITS.get(unit, 1)).to_integral_value())


def format_bytes(n: int) -> str:
    """Format a byte count in binary units, at most 2 decimals, trailing zeros dropped.

    12 * 2**30 -> "12 GiB", int(1.5 * 2**30) -> "1.5 GiB", 100 -> "100 B".
    """
    sign = "-" if n < 0 else ""
    size = abs(n)
    for name, unit in _FORMAT_UNITS:
        if size >= unit:
            number = f"{size / unit:.2f}".rstrip("0").rstrip(".")
            return f"{sign}{number} {name}"
    return f"{sign}{size} B"


def gib_to_bytes(gib: str) -> int:
    """Bytes of a GiB figure printed with 2 decimals (as in CUDA OOM messages), to the MiB.

    "14.76" -> 15114 MiB: the 2 printed decimals carry about 10 MiB of precision, so
    rounding to whole MiB adds no false precision.
    """
    return int((Decimal(gib) * 1024).to_integral_value()) * MIB
