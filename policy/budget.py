"""Quality as a budget over the run, time as the objective (after L-GreCo).

A step's compression error is e = 1 - gain: the share of the compensated
gradient's squared norm the step did not send (for Top-k, whose kept and dropped
values are disjoint, exactly ||g_e - g_c||^2 / ||g_e||^2). The run may spend as
much error as a reference compression known to reach the workloads' targets
would have: the sum over its steps of e must stay within the sum of e_ref, the
reference's error on the same gradients (read off each step by the client's
probes).

Each step may deliver the reference's error plus what the run saved so far (or
less what it overspent), spread over the next `payback_steps` steps and never
more than the reference's error again: an allowance in [0, 2 e_ref]. The choice
is the fastest option within the allowance. The reference itself is always
within it while the run is not in debt, so the choice is never slower than the
reference; where compression buys little (a fast link; the MOO prices error
by what it buys where bandwidth is dearest, `MooPolicy.error_price`) the run
runs lossless and saves, and the savings may buy more compression than the
reference where that is worth its error.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

LEARNED = ("spent", "allowed", "steps")


@dataclass
class QualityBudget:
    """What the run spent against what the reference allowed. `payback_steps` is
    a setting (the config's budget_payback_steps); the rest is state."""

    payback_steps: int = 100
    spent: float = 0.0  # sum of delivered errors over the run's steps
    allowed: float = 0.0  # sum of the reference's errors on the same steps
    steps: int = 0

    def observe(self, delivered_error: float, reference_error: float) -> None:
        """One step: the error it delivered against the reference's on its gradient."""
        self.spent += delivered_error
        self.allowed += reference_error
        self.steps += 1

    @property
    def saved(self) -> float:
        """Error the run has left unspent (negative: overspent)."""
        return self.allowed - self.spent

    def allowance(self, reference_error: float) -> float:
        """The error a step may deliver now, with the reference at `reference_error`."""
        share = self.saved / self.payback_steps
        return max(0.0, reference_error + max(-reference_error, min(reference_error, share)))

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in LEARNED}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], payback_steps: int) -> QualityBudget:
        """The learned state with the setting as it is now (a stored one, and an
        older state's price, are ignored)."""
        return cls(payback_steps=payback_steps, **{k: v for k, v in state.items() if k in LEARNED})


__all__ = ["QualityBudget"]
