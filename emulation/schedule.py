"""Emulation schedules: TOML files of link states keyed by time or by epoch.

    repeat = 2                 # optional: rounds through the steps (default 1),
                               # or "forever"
    [[step]]
    duration = "30s"           # time-keyed: hold this step for 30 s
    rate = "100Mbit"           # required: every step is the link's full state
    delay = "20ms"             # optional, with a unit; needs sch_netem
    jitter = "2ms"             # optional, needs a delay
    loss = "0.5%"              # optional: "0.5%" or 0.005

    [[step]]
    duration = "30s"
    rate = "20Mbit"

A schedule is keyed by time (every step has `duration`) or by epoch (every step
has `epoch = N`: the step starts when the job reports epoch N; epochs strictly
increase; with `repeat` the pattern recurs every last-epoch + 1 epochs). Mixing
the two in one file is refused: what a duration after an epoch boundary means is
not obvious. Instead of steps, a `[walk]` table gives a seeded random walk of
rates (`flexcomm.emulation.walk`).

`load_schedule(path)` checks everything before returning and raises one
`ScheduleError` listing every problem as "FILE: step N: FIELD: what is wrong"
(steps count from 1), so nothing is ever applied from a bad file.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexcomm.emulation.shaping import LinkState
from flexcomm.emulation.walk import walk_steps
from flexcomm.files import read_text
from flexcomm.units import parse_duration, parse_fraction, parse_rate

TOP_KEYS = ("repeat", "name", "description", "step", "walk")
STEP_KEYS = ("duration", "epoch", "rate", "delay", "jitter", "loss")


class ScheduleError(ValueError):
    """Every problem found in one schedule file, one per line."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class Step:
    """One step: `number` counts from 1 in file order; exactly one of
    `duration_s` and `epoch` is set."""

    number: int
    state: LinkState
    duration_s: float | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class Schedule:
    path: str
    steps: tuple[Step, ...]
    repeat: int | None = 1  # None: forever
    name: str = ""

    @property
    def by_epoch(self) -> bool:
        return self.steps[0].epoch is not None

    @property
    def round_seconds(self) -> float:
        """Length of one round of a time-keyed schedule."""
        return sum(step.duration_s or 0.0 for step in self.steps)

    @property
    def epoch_period(self) -> int:
        """Epochs per round of an epoch-keyed schedule."""
        return (self.steps[-1].epoch or 0) + 1

    def timeline(self) -> Iterator[tuple[float, int, Step]]:
        """(start offset in s, round from 0, step) of a time-keyed schedule, in order;
        endless when repeat is "forever"."""
        offset, round_ = 0.0, 0
        while self.repeat is None or round_ < self.repeat:
            for step in self.steps:
                yield offset, round_, step
                offset += step.duration_s or 0.0
            round_ += 1


def load_schedule(path: str | Path) -> Schedule:
    """Read and check a schedule file; raise ScheduleError naming file, step and
    field of every problem."""
    try:
        text = read_text(path)
    except ValueError as exc:
        raise ScheduleError([str(exc)]) from None
    return parse_schedule(text, str(path))


def parse_schedule(text: str, where: str = "<schedule>") -> Schedule:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleError([f"{where}: not valid TOML: {exc}"]) from None
    errors: list[str] = []
    for key in data:
        if key not in TOP_KEYS:
            errors.append(f"{where}: {key}: unknown key (allowed: {', '.join(TOP_KEYS)})")
    repeat = _repeat(data.get("repeat", 1), where, errors)
    raw_steps = data.get("step")
    if "walk" in data:
        if raw_steps is not None:
            errors.append(f"{where}: step/walk: give [[step]]s or a [walk], not both")
            raise ScheduleError(errors)
        raw_steps = walk_steps(data["walk"], where, errors)
        if errors:
            raise ScheduleError(errors)
    if raw_steps is None:
        errors.append(f"{where}: step: no steps; a schedule needs at least one [[step]] "
                      "(or a [walk])")
        raise ScheduleError(errors)
    if not isinstance(raw_steps, list) or not all(isinstance(s, dict) for s in raw_steps):
        errors.append(f"{where}: step: must be an array of tables ([[step]] sections)")
        raise ScheduleError(errors)
    steps = []
    for number, raw in enumerate(raw_steps, start=1):
        step = _step(raw, number, f"{where}: step {number}", errors)
        if step is not None:
            steps.append(step)
    _check_keys_agree(steps, where, errors)
    if errors:
        raise ScheduleError(errors)
    name = data.get("name", "")
    return Schedule(path=where, steps=tuple(steps), repeat=repeat, name=str(name))


def _repeat(value: Any, where: str, errors: list[str]) -> int | None:
    if value == "forever":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.append(f"{where}: repeat: must be a whole number >= 1 or \"forever\", "
                      f"got {value!r}")
        return 1
    return value


def _field(errors: list[str], prefix: str, name: str, parse: Any, value: Any) -> Any:
    try:
        return parse(value)
    except ValueError as exc:
        message = str(exc)
        errors.append(f"{prefix}: {message if message.startswith(name) else f'{name}: {message}'}")
        return None


def _with_unit(field: str, value: Any, example: str) -> Any:
    """Durations and rates in a file must carry their unit: a bare 10 could be
    seconds or milliseconds, bits or bytes."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: {value!r} needs a unit, written as a string (e.g. {example})")
    return value


def _step(raw: dict[str, Any], number: int, prefix: str, errors: list[str]) -> Step | None:
    before = len(errors)
    for key in raw:
        if key not in STEP_KEYS:
            errors.append(f"{prefix}: {key}: unknown key (allowed: {', '.join(STEP_KEYS)})")
    duration = epoch = None
    if "duration" in raw and "epoch" in raw:
        errors.append(f"{prefix}: duration/epoch: give one of them, not both")
    elif "duration" in raw:
        duration = _field(errors, prefix, "duration", lambda v: parse_duration(
            "duration", _with_unit("duration", v, '"30s"'), allow_zero=False), raw["duration"])
    elif "epoch" in raw:
        epoch = _field(errors, prefix, "epoch", _epoch, raw["epoch"])
    else:
        errors.append(f"{prefix}: duration/epoch: missing; a step needs `duration` "
                      "(e.g. \"30s\") or `epoch` (e.g. 3)")
    if "rate" not in raw:
        errors.append(f"{prefix}: rate: missing; every step gives the full link state "
                      "(e.g. rate = \"100Mbit\")")
        rate = None
    else:
        rate = _field(errors, prefix, "rate", lambda v: parse_rate(
            "rate", _with_unit("rate", v, '"100Mbit"')), raw["rate"])
    delay = _field(errors, prefix, "delay", lambda v: parse_duration(
        "delay", _with_unit("delay", v, '"20ms"')), raw.get("delay", "0s"))
    jitter = _field(errors, prefix, "jitter", lambda v: parse_duration(
        "jitter", _with_unit("jitter", v, '"2ms"')), raw.get("jitter", "0s"))
    loss = _field(errors, prefix, "loss", lambda v: parse_fraction("loss", v), raw.get("loss", 0))
    if len(errors) > before or rate is None:
        return None
    try:
        state = LinkState(rate, delay or 0.0, jitter or 0.0, loss or 0.0)
    except ValueError as exc:
        errors.append(f"{prefix}: {exc}")
        return None
    return Step(number=number, state=state, duration_s=duration, epoch=epoch)


def _epoch(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"epoch: must be a whole number >= 0, got {value!r}")
    return value


def _check_keys_agree(steps: list[Step], where: str, errors: list[str]) -> None:
    if not steps:
        return
    by_epoch = steps[0].epoch is not None
    for step in steps[1:]:
        if (step.epoch is not None) != by_epoch:
            first = "epoch" if by_epoch else "duration"
            errors.append(f"{where}: step {step.number}: duration/epoch: step 1 uses `{first}`; "
                          "a schedule is keyed by time or by epoch, not both")
    epochs = [s for s in steps if s.epoch is not None]
    for previous, step in itertools.pairwise(epochs):
        if step.epoch <= previous.epoch:  # type: ignore[operator]
            errors.append(f"{where}: step {step.number}: epoch: must be greater than step "
                          f"{previous.number}'s epoch {previous.epoch}, got {step.epoch}")
