"""Exact Pareto front and the choice on it, for a small discrete candidate set.

Objectives are minimised. With five CRs times a few collectives there are at
most a few dozen points, so the front is computed exactly (O(n^2), microseconds)
instead of with an evolutionary solver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the non-dominated points, in input order."""
    if points and len(points[0]) == 2:
        return _front_2d(points)
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]


def _front_2d(points: Sequence[Sequence[float]]) -> list[int]:
    """Sweep in (f1, f2) order: a point is dominated when an earlier point with a
    smaller f1 has f2 <= its f2, or one with the same f1 has a smaller f2."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    keep = []
    best_before = math.inf  # least f2 among points with a strictly smaller f1
    group_f1, group_best = None, math.inf
    for i in order:
        f1, f2 = points[i]
        if f1 != group_f1:
            best_before = min(best_before, group_best)
            group_f1, group_best = f1, f2
        if not (best_before <= f2 or group_best < f2):
            keep.append(i)
    return sorted(keep)


def asf_scores(points: Sequence[Sequence[float]], weights: Sequence[float], rho: float = 1e-4) -> list[float]:
    """Augmented achievement scalarising function against the ideal point. Lower
    is better; a larger weight makes that objective's shortfall count more.

    Each objective (all positive) is measured as its relative shortfall from the
    ideal, (f - f_min) / f_min, not normalised by its range over the points: a
    range makes a 1% difference look as large as a 10x one whenever every point
    is close, and the choice would then hinge on noise.
    """
    dims = range(len(weights))
    ideal = [min(p[d] for p in points) for d in dims]
    if any(v <= 0 for v in ideal):
        raise ValueError("points: objectives must be > 0")
    scores = []
    for p in points:
        parts = [weights[d] * (p[d] - ideal[d]) / ideal[d] for d in dims]
        scores.append(max(parts) + rho * sum(parts))
    return scores
