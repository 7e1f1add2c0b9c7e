"""Parsing and printing of sizes, rates and durations given by people.

Every parser takes the name of the field it is parsing so that an error says
which input was wrong, e.g. ``bandwidth: unknown unit 'Mbs' in '100Mbs'``.
Decimal prefixes are powers of 1000, binary ones (KiB, MiB, ...) powers of 1024.
Rates are in bits per second (the way links are sold and tc speaks); the cost
model works in bytes and seconds, so `parse_rate` returns bits/s and callers
divide by 8.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]*)\s*$")

_BYTES = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_RATES = {
    "bit": 1, "bps": 1, "bit/s": 1, "b/s": 1,
    "kbit": 1e3, "kbps": 1e3, "kbit/s": 1e3,
    "mbit": 1e6, "mbps": 1e6, "mbit/s": 1e6,
    "gbit": 1e9, "gbps": 1e9, "gbit/s": 1e9,
    "tbit": 1e12, "tbps": 1e12,
}
_DURATIONS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
    "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
}


def _split(field: str, text: str | float | int) -> tuple[float, str]:
    if isinstance(text, bool):
        raise ValueError(f"{field}: expected a number with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    m = _NUMBER.match(str(text))
    if not m:
        raise ValueError(f"{field}: cannot read {text!r} as a number with a unit")
    return float(m.group(1)), m.group(2)


def require_finite_positive(field: str, value: float, *, allow_zero: bool = False,
                            written: object = None) -> float:
    """Return `value` as float, or raise ValueError naming `field` if it is not a
    finite number > 0 (>= 0 with `allow_zero`). `written` is what the user typed,
    quoted in the message instead of the converted number."""
    shown = value if written is None else written
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {shown!r}") from None
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{field}: must be finite, got {shown!r}")
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{field}: must be {bound}, got {shown!r}")
    return v


def parse_bytes(field: str, text: str | float | int) -> float:
    """'16MB' -> 16e6, '4MiB' -> 4194304, 1000 -> 1000.0 (bytes)."""
    value, unit = _split(field, text)
    scale = _BYTES.get(unit.lower())
    if scale is None:
        raise ValueError(f"{field}: unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    return require_finite_positive(field, value * scale, written=text)


def parse_rate(field: str, text: str | float | int, *, allow_zero: bool = False) -> float:
    """'100Mbit' / '100mbps' / '1Gbit/s' -> bits per second. A bare number is
    refused: rates are ambiguous (bits or bytes?) without a unit."""
    value, unit = _split(field, text)
    if unit == "" and not isinstance(text, (int, float)):
        raise ValueError(f"{field}: rate {text!r} needs a unit (e.g. 100Mbit, 1Gbit)")
    scale = 1.0 if unit == "" else _RATES.get(unit.lower())
    if scale is None:
        raise ValueError(f"{field}: unknown rate unit {unit!r} in {text!r} (use bit, kbit, Mbit, Gbit, or mbps)")
    return require_finite_positive(field, value * scale, allow_zero=allow_zero, written=text)


def parse_duration(field: str, text: str | float | int, *, allow_zero: bool = True) -> float:
    """'10ms' -> 0.01, '2s' -> 2.0 (seconds). A bare string number is refused:
    '5' could be seconds or milliseconds."""
    value, unit = _split(field, text)
    if unit == "" and not isinstance(text, (int, float)):
        raise ValueError(f"{field}: duration {text!r} needs a unit (e.g. 5ms, 2s)")
    scale = 1.0 if unit == "" else _DURATIONS.get(unit.lower())
    if scale is None:
        raise ValueError(f"{field}: unknown time unit {unit!r} in {text!r} (use us, ms, s, min)")
    return require_finite_positive(field, value * scale, allow_zero=allow_zero, written=text)


def parse_fraction(field: str, text: str | float | int) -> float:
    """'1%' -> 0.01, 0.25 -> 0.25; must lie in [0, 1]."""
    s = str(text).strip()
    value = float(s[:-1]) / 100 if s.endswith("%") else _split(field, text)[0]
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{field}: must be between 0 and 1 (or 0% and 100%), got {text!r}")
    return value


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_rate(bits_per_s: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bits_per_s) >= scale:
            return f"{bits_per_s / scale:.3g} {unit}"
    return f"{bits_per_s:.0f} bit/s"


def format_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
