"""What adapting could win, read from the fixed choices' own runs.

The envelope: at each moment of training, the best held-out figure any fixed
choice had by then (the lowest loss, the highest accuracy), over one repeat's
runs. The adaptive policy's distance from it (its figure minus the envelope's,
in nats or accuracy points, positive where it is worse), over its evaluations
after the first SKIP_SHARE of its run, gives how far it was from the best fixed
choice in hindsight at each moment.

The headroom: how much sooner a choice made afresh in each phase of a
time-keyed schedule reaches a target than the best fixed choice. It rests on
one model, stated so it can be checked: a fixed choice c needs N_c steps to the
target (its own run says how many) whatever the network, so each of its steps
is 1/N_c of the way; in a phase whose link is r its steps take s(c, r) (the
mean step time its run measured at that link). Walking the schedule's phases,
a fixed choice progresses at 1/(N_c s(c, r)) per second; the hindsight-best
per phase takes the fastest choice of each phase. Headroom = the best fixed
choice's modelled time / the hindsight-best's (1.0: nothing to win). Choices
that never reached the target take no part. An epoch-keyed schedule gives no
headroom (its phases are steps, not seconds).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterator
from typing import Any

from flexcomm.emulation.schedule import Schedule

SKIP_SHARE = 0.10  # the start of a run, where every curve is steep, is left out
WALK_LIMIT_S = 1e6  # a target no choice reaches within this is never reached


class Curve:
    """One run's figure as a step function of time: the figure of the last
    evaluation at or before t. The times are listed once, so reading it at
    every moment of the envelope costs a bisection, not a fresh list."""

    def __init__(self, evals: list[dict[str, Any]], metric: str) -> None:
        self.times = [e["t"] for e in evals]
        self.values = [e[metric] for e in evals]

    def at(self, t: float) -> float | None:
        """None: no evaluation yet at `t`."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[i] if i >= 0 else None


def envelope(fixed: list[list[dict[str, Any]]], metric: str) -> list[tuple[float, float]]:
    """(t, best figure of any fixed run by t) at every evaluation time of any of them."""
    better = min if metric == "loss" else max
    curves = [Curve(evals, metric) for evals in fixed]
    points = []
    for t in sorted({t for curve in curves for t in curve.times}):
        known = [v for curve in curves if (v := curve.at(t)) is not None]
        if known:
            points.append((t, better(known)))
    return points


def distance(adaptive: list[dict[str, Any]], env: list[tuple[float, float]], metric: str
             ) -> dict[str, float | None]:
    """The adaptive run's distance from the envelope (positive: worse; nats, or
    accuracy points), worst and median over its evaluations after SKIP_SHARE."""
    if not adaptive or not env:
        return {"worst": None, "median": None}
    start = SKIP_SHARE * adaptive[-1]["t"]
    best_by = Curve([{"t": t, metric: v} for t, v in env], metric)
    gaps = []
    for e in adaptive:
        best = best_by.at(e["t"])
        if e["t"] >= start and best is not None:
            gaps.append(e[metric] - best if metric == "loss" else 100.0 * (best - e[metric]))
    if not gaps:
        return {"worst": None, "median": None}
    return {"worst": max(gaps), "median": statistics.median(gaps)}


def phases_in_time(schedule: Schedule) -> Iterator[tuple[float, float, float]]:
    """(start s, end s, rate) of each phase of a time-keyed schedule; the last
    one lasts for ever (the emulator leaves it in force)."""
    timeline = list(itertools.islice(schedule.timeline(), 10_000))
    for (start, _, step), nxt in itertools.zip_longest(timeline, timeline[1:]):
        yield start, (nxt[0] if nxt else float("inf")), step.state.rate_bps


def modelled_time(schedule: Schedule, choices: dict[str, tuple[int, dict[float, float]]],
                  pick: str | None) -> float | None:
    """Seconds to the target, walking the schedule: with `pick`, that fixed
    choice throughout; with None, the fastest choice of each phase. `choices`:
    label -> (steps to the target, {link rate: mean step time})."""
    progress = 0.0
    for start, end, rate in phases_in_time(schedule):
        speeds = [1.0 / (n * times[rate]) for label, (n, times) in choices.items()
                  if (pick is None or label == pick) and rate in times and times[rate] > 0]
        if not speeds:
            return None
        speed = max(speeds)
        span = min(end, WALK_LIMIT_S) - start
        if progress + speed * span >= 1.0:
            return start + (1.0 - progress) / speed
        progress += speed * span
        if end >= WALK_LIMIT_S:
            return None
    return None


def headroom(schedule: Schedule, choices: dict[str, tuple[int, dict[float, float]]]
             ) -> dict[str, Any]:
    """The headroom to one target from one repeat's fixed runs that reached it:
    label -> (steps to the target, {link rate: mean step time})."""
    if schedule.by_epoch:
        return {"ratio": None, "why": "the schedule is keyed by epoch"}
    if not choices:
        return {"ratio": None, "why": "no fixed choice reached the target"}
    alone = {label: modelled_time(schedule, choices, label) for label in choices}
    reaching = {label: t for label, t in alone.items() if t is not None}
    best_mix = modelled_time(schedule, choices, None)
    if not reaching or not best_mix:
        return {"ratio": None, "why": "the walk found no time to the target"}
    best = min(reaching, key=reaching.__getitem__)
    return {"ratio": reaching[best] / best_mix, "best_fixed": best,
            "best_fixed_s": reaching[best], "hindsight_per_phase_s": best_mix,
            "per_phase": _per_phase(schedule, choices)}


def _per_phase(schedule: Schedule, choices: dict[str, tuple[int, dict[float, float]]]
               ) -> list[dict[str, Any]]:
    """The fastest choice of each phase (up to the end of one round)."""
    out = []
    for start, end, rate in phases_in_time(schedule):
        speeds = {label: 1.0 / (n * times[rate]) for label, (n, times) in choices.items()
                  if rate in times and times[rate] > 0}
        if speeds:
            out.append({"start_s": start, "rate_bps": rate,
                        "policy": max(speeds, key=speeds.__getitem__)})
        if end == float("inf") or len(out) >= len(schedule.steps):
            break
    return out
