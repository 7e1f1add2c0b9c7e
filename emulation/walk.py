"""A seeded random walk of link rates, written in a schedule as a `[walk]` table
instead of `[[step]]`s:

    [walk]
    seed = 7                 # the same seed gives the same rates everywhere
    low = "10Mbit"           # the walk stays within [low, high]
    high = "1Gbit"
    epochs = 2               # each rate holds 2 epochs (or duration = "30s")
    steps = 10               # how many rates
    max_factor = 10          # optional: one step multiplies or divides the rate by
                             # at most this much (default 10)

The first rate is log-uniform in [low, high]; each next one is the last times
max_factor ** u, u uniform in [-1, 1], reflected back into [low, high] (in log
space). Rates are rounded to two significant digits. `walk_steps` turns the table
into the plain step tables a schedule file would hold, so every rule of a
schedule still applies to them.
"""

from __future__ import annotations

import math
import random
from typing import Any

from flexcomm.units import parse_duration, parse_rate

WALK_KEYS = ("seed", "low", "high", "epochs", "duration", "steps", "max_factor")
DEFAULT_MAX_FACTOR = 10.0


def walk_steps(raw: Any, where: str, errors: list[str]) -> list[dict[str, Any]]:
    """The `[[step]]` tables of the walk `raw`; on a bad table, the problems are
    appended to `errors` (as "WHERE: walk: FIELD: what is wrong") and [] returned."""
    prefix = f"{where}: walk"
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: must be a table ([walk])")
        return []
    before = len(errors)
    for key in raw:
        if key not in WALK_KEYS:
            errors.append(f"{prefix}: {key}: unknown key (allowed: {', '.join(WALK_KEYS)})")
    seed = _whole(raw, "seed", prefix, errors, minimum=0)
    count = _whole(raw, "steps", prefix, errors, minimum=1)
    low, high = (_rate(raw, name, prefix, errors) for name in ("low", "high"))
    if low is not None and high is not None and low >= high:
        errors.append(f"{prefix}: low/high: low must be below high, got {raw['low']!r} >= {raw['high']!r}")
    factor = raw.get("max_factor", DEFAULT_MAX_FACTOR)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
        errors.append(f"{prefix}: max_factor: must be a number > 1, got {factor!r}")
    hold = _hold(raw, prefix, errors)
    if len(errors) > before:
        return []
    rates = walk_rates(seed, count, low, high, float(factor))
    return [{**hold(i), "rate": f"{rate / 1e6:g}Mbit"} for i, rate in enumerate(rates)]


def walk_rates(seed: int, count: int, low: float, high: float, max_factor: float) -> list[float]:
    """`count` rates of the walk, in bit/s (see the module's description)."""
    rng = random.Random(seed)
    lo, hi = math.log(low), math.log(high)
    position = rng.uniform(lo, hi)
    rates = []
    for _ in range(count):
        rates.append(min(high, max(low, _two_digits(math.exp(position)))))
        position += rng.uniform(-1.0, 1.0) * math.log(max_factor)
        while not lo <= position <= hi:  # reflect at the bounds
            position = 2 * lo - position if position < lo else 2 * hi - position
    return rates


def _two_digits(value: float) -> float:
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return round(value / scale) * scale


def _whole(raw: dict[str, Any], name: str, prefix: str, errors: list[str], minimum: int) -> int:
    value = raw.get(name)
    if value is None:
        errors.append(f"{prefix}: {name}: missing")
    elif isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        errors.append(f"{prefix}: {name}: must be a whole number >= {minimum}, got {value!r}")
    else:
        return value
    return minimum


def _rate(raw: dict[str, Any], name: str, prefix: str, errors: list[str]) -> float | None:
    value = raw.get(name)
    if not isinstance(value, str):
        errors.append(f"{prefix}: {name}: needs a rate with its unit, as a string (e.g. \"10Mbit\"), "
                      f"got {value!r}")
        return None
    try:
        return parse_rate(name, value)
    except ValueError as exc:
        errors.append(f"{prefix}: {exc}")
        return None


def _hold(raw: dict[str, Any], prefix: str, errors: list[str]) -> Any:
    """How long each rate holds, as the step table's key: i -> {"epoch": ...} or
    {"duration": ...}."""
    if ("epochs" in raw) == ("duration" in raw):
        errors.append(f"{prefix}: epochs/duration: give exactly one (each rate holds `epochs` "
                      "epochs, or `duration`, e.g. \"30s\")")
        return None
    if "duration" in raw:
        duration = raw["duration"]
        try:
            if not isinstance(duration, str):
                raise ValueError(f"duration: {duration!r} needs a unit, written as a string (e.g. \"30s\")")
            parse_duration("duration", duration, allow_zero=False)
        except ValueError as exc:
            errors.append(f"{prefix}: {exc}")
        return lambda i: {"duration": duration}
    epochs = _whole(raw, "epochs", prefix, errors, minimum=1)
    return lambda i: {"epoch": i * epochs}
