"""The lab's summary as types, and the one place they become summary.json.

A `LabSummary` holds the run's settings, its scenario-wide figures and, under
`policies`, one `PolicySummary` per policy (its figures over the repeats, each
repeat's, and its `Phase`s). Policy names are keys of `policies` only, so no
name can shadow a field of the lab. `to_json` writes it (a non-finite float
becomes null) and `from_json` reads it back.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Phase:
    """One applied link step of a run: its steps and what ran most in it."""

    phase: tuple[int, int] | None  # (schedule step index, round); None: no link step applied
    rate_bps: float | None
    steps: int
    seconds: float
    mean_step_s: float
    compression: str | None
    collective: str | None
    predicted_sync_s: float | None
    measured_sync_s: float | None


@dataclass(frozen=True)
class Repeat:
    """One run of a policy: to the workload's target, to each named target,
    the quality at equal time, and what it trained."""

    time_to_target_s: float | None
    steps_to_target: int | None
    time_to_targets_s: dict[str, float | None]
    steps_to_targets: dict[str, int | None]
    at_equal_time: dict[str, float | None]  # "loss", "accuracy"
    final_accuracy: float | None
    final_loss: float | None
    bytes_sent: int
    wall_s: float | None
    steps: int
    explore_steps: int
    compute_s: float | None
    fixed: bool
    phases: tuple[Phase, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class PolicySummary:
    """A policy over its repeats: each figure the median, `spread` its [min,
    max] and `per_repeat` every repeat's value (by figure name); `phases` and
    `estimate_tracking` are the first repeat's."""

    time_to_target_s: float | None
    steps_to_target: float | None
    time_to_targets_s: dict[str, float | None]
    at_equal_time: dict[str, float | None]
    final_accuracy: float | None
    final_loss: float | None
    bytes_sent: float | None
    wall_s: float | None
    steps: float | None
    explore_steps: float | None
    compute_s: float | None
    spread: dict[str, Any]
    per_repeat: dict[str, Any]
    fixed: bool
    phases: tuple[Phase, ...]
    warnings: tuple[str, ...]
    estimate_tracking: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Comparison:
    """MOO against one rival, medians over repeats."""

    rival_over_moo_time_to_target: float | None
    moo_minus_rival_final_accuracy_points: float | None
    moo_minus_rival_final_loss: float | None


@dataclass(frozen=True)
class Headroom:
    """To one target: the best fixed choice's modelled time over the best
    choice per phase's (median over repeats, with its [min, max]); the rest is
    the first repeat's. `why` says why there is no ratio."""

    ratio: float | None
    spread: tuple[float | None, float | None]
    best_fixed: str | None = None
    best_fixed_s: float | None = None
    hindsight_per_phase_s: float | None = None
    per_phase: tuple[dict[str, Any], ...] = ()
    why: str = ""


@dataclass(frozen=True)
class EnvelopeDistance:
    """MOO's distance from the envelope of the fixed choices after the first
    10% of its run (positive: worse): per repeat, and the medians."""

    unit: str
    per_repeat: tuple[dict[str, float | None], ...]
    worst: float | None
    median: float | None


@dataclass(frozen=True)
class Settings:
    """What the run was asked to do, and whether its links were shaped."""

    target: float
    target_metric: str
    targets: dict[str, float]
    equal_time: bool
    equal_time_s: float | None
    budget_s: float | None
    pacesetter: str | None
    nodes: int
    steps: int
    repeats: int
    shaped: bool | None
    reason_unshaped: str
    decisions: str


@dataclass(frozen=True)
class LabSummary:
    workload: str
    schedule: str
    settings: Settings
    policies: dict[str, PolicySummary]
    headroom: dict[str, Headroom]
    envelope_distance: EnvelopeDistance
    hindsight_best_fixed_s: float | None
    hindsight_per_repeat: tuple[float | None, ...]
    hindsight_choices: tuple[dict[str, Any], ...]
    compute_only_s: float | None
    comparisons: dict[str, Comparison]
    moo_over_hindsight_best_fixed: float | None
    estimate_tracking: dict[str, Any]
    verdicts: tuple[str, ...]
    failed: dict[str, str] = field(default_factory=dict)
    hindsight_reaching_s: float | None = None
    moo_over_hindsight_reaching: float | None = None


def to_json(summary: LabSummary) -> str:
    """summary.json's text: strict JSON, a non-finite float written as null."""
    return json.dumps(_finite(asdict(summary)), indent=1, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def from_json(text: str) -> LabSummary:
    """A LabSummary from summary.json's text."""
    d = json.loads(text)
    return LabSummary(**{
        **d,
        "settings": Settings(**d["settings"]),
        "policies": {label: _policy(p) for label, p in d["policies"].items()},
        "headroom": {t: Headroom(**{**h, "spread": tuple(h["spread"]),
                                    "per_phase": tuple(h["per_phase"])})
                     for t, h in d["headroom"].items()},
        "envelope_distance": EnvelopeDistance(**{
            **d["envelope_distance"],
            "per_repeat": tuple(d["envelope_distance"]["per_repeat"])}),
        "comparisons": {label: Comparison(**c) for label, c in d["comparisons"].items()},
        **{name: tuple(d[name]) for name in ("hindsight_per_repeat", "hindsight_choices",
                                             "verdicts")},
    })


def _policy(d: dict[str, Any]) -> PolicySummary:
    return PolicySummary(**{**d, "phases": tuple(_phase(p) for p in d["phases"]),
                            "warnings": tuple(d["warnings"]),
                            "estimate_tracking": tuple(d["estimate_tracking"])})


def _phase(d: dict[str, Any]) -> Phase:
    return Phase(**{**d, "phase": None if d["phase"] is None else tuple(d["phase"])})
