"""Quality as a budget over the run, time as the objective (after L-GreCo).

A step's compression error is e = 1 - gain: the share of the compensated
gradient's squared norm the step did not send (for Top-k, whose kept and dropped
values are disjoint, exactly ||g_e - g_c||^2 / ||g_e||^2). The run may spend as
much error as a reference compression known to reach the workloads' targets
would have: the sum over its steps of e must stay within the sum of e_ref, the
reference's error on the same gradients (read off each step by the client's
probes).

The policy minimises the run's time under that constraint with one Lagrange
multiplier for the whole run: each choice minimises t_step + lam * e, and lam
(seconds per unit of error) starts at the price at which, on the options as the
job first measures them, the least-cost choice loses no more than the reference
(`reference_price`), and then moves with what the steps spend: up when a step's
delivered error exceeds the reference's, down when it stays below. A fixed lam
spends the budget where bandwidth is dear: on a fast link the seconds that
compression saves are few, so lam * e dominates and lossless wins (saving
budget); on a slow link they are many, and the saved budget buys more
compression than the reference.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

LAMBDA_RANGE = 1e3  # lam stays within [lam0 / 1e3, lam0 * 1e3] of where it started
MIN_REFERENCE_ERROR = 0.02  # a reference losing less than that is scaled as losing that
# The price also answers the run's balance so far (a proportional term beside the
# per-step integral one): lam x exp(BALANCE_GAIN x overspend), the overspend
# relative to what the reference allows over the run and BALANCE_HORIZON steps
# more (so the first steps move it little). With the integral term alone a run
# that began on a fast link (a low starting price) overspent 14% by its end in
# the simulated fast/slow job; with this term, within 10%.
BALANCE_GAIN = 3.0
BALANCE_HORIZON = 100


@dataclass
class QualityBudget:
    """The run's error budget and its multiplier. `lam` is None until the first
    choice with known errors sets it (`start`). `rate` is a setting (the config's
    budget_rate), the rest is what the run learned: only that is state."""

    rate: float = 0.01
    lam: float | None = None
    lam0: float | None = None
    spent: float = 0.0  # sum of delivered errors over the run's steps
    allowed: float = 0.0  # sum of the reference's errors on the same steps
    steps: int = 0

    def start(self, seconds_per_error: float) -> None:
        """Set the multiplier once (the caller's `reference_price`)."""
        if self.lam is None and math.isfinite(seconds_per_error) and seconds_per_error > 0:
            self.lam = self.lam0 = seconds_per_error

    def observe(self, delivered_error: float, reference_error: float) -> None:
        """One step: the error it delivered against the reference's on its gradient."""
        self.spent += delivered_error
        self.allowed += reference_error
        self.steps += 1
        if self.lam is None or self.lam0 is None:
            return
        excess = (delivered_error - reference_error) / max(reference_error, MIN_REFERENCE_ERROR)
        lam = self.lam * math.exp(self.rate * max(-1.0, min(1.0, excess)))
        self.lam = min(self.lam0 * LAMBDA_RANGE, max(self.lam0 / LAMBDA_RANGE, lam))

    @property
    def balance(self) -> float:
        """What the run spent beyond what the reference allowed, relative to that
        allowance and BALANCE_HORIZON steps more of it, within [-1, 1]."""
        if self.steps == 0:
            return 0.0
        per_step = max(self.allowed / self.steps, MIN_REFERENCE_ERROR)
        over = (self.spent - self.allowed) / (self.allowed + BALANCE_HORIZON * per_step)
        return max(-1.0, min(1.0, over))

    @property
    def price(self) -> float | None:
        """Seconds per unit of error a choice pays now: lam, raised while the run
        has overspent and lowered while it has saved (BALANCE_GAIN)."""
        return None if self.lam is None else self.lam * math.exp(BALANCE_GAIN * self.balance)

    def cost(self, t_step_s: float, error: float) -> float:
        """The Lagrangian of one option: its step time plus its error's price."""
        return t_step_s + (self.price or 0.0) * error

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "rate"}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], rate: float) -> QualityBudget:
        """The learned state with the `rate` set now (an older state's stored rate is ignored)."""
        return cls(rate=rate, **{k: v for k, v in state.items() if k != "rate"})


def least_cost(options: Sequence[tuple[float, float]], lam: float) -> tuple[float, float]:
    """The (step seconds, error) pair of `options` with the least t + lam * e
    (ties: the faster)."""
    return min(options, key=lambda o: (o[0] + lam * o[1], o[0]))


def reference_price(options: Sequence[tuple[float, float]], reference_error: float) -> float | None:
    """A price (seconds per unit of error) at which the least-cost choice among
    `options` ((step seconds, error) pairs) loses no more than
    `reference_error`, and the fastest such: where the budget would settle if
    the network stayed as it is. The choice changes only at prices where two
    options cost the same; between two such prices it is one option, and the
    price returned is the middle (geometric) of the first such interval whose
    option keeps within the reference, so a small move of the price does not
    change the choice. None when no two options trade time for error."""
    ties = sorted({(ta - tb) / (eb - ea) for ta, ea in options for tb, eb in options if eb > ea and ta > tb})
    if not ties:
        return None
    inside = [ties[0] / 2, *(math.sqrt(a * b) for a, b in itertools.pairwise(ties)), ties[-1] * 2]
    return next((lam for lam in inside if least_cost(options, lam)[1] <= reference_error), None)


__all__ = ["QualityBudget", "least_cost", "reference_price"]
