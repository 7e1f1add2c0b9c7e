"""Critical regimes of training, after Accordion (Agarwal et al., MLSys 2021).

Where the gradient's norm changes fast (the first steps, after a learning-rate
drop) compression error costs the final quality more than it does elsewhere;
Accordion compresses lightly there and heavily otherwise. The detector reads the
norm of rank 0's local gradient, one reading per probe step, and compares the
mean of a window of `window` readings with the window's before: a relative
change of at least `change` (Accordion's eta) makes the next window critical.
The first two windows, with nothing yet to compare, are critical, as training's
start is.

Before any reading the regime is unknown (`critical` None): a client that
reads no norms leaves the policy as it would be without the detector.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

LEARNED = ("previous", "total", "count", "moved", "critical")


@dataclass
class CriticalRegime:
    """`window` (readings per window; 0: never critical) and `change` are
    settings, the rest state."""

    window: int = 5
    change: float = 0.5
    previous: float | None = None  # the last complete window's mean norm
    total: float = 0.0  # the current window's readings so far
    count: int = 0
    moved: float | None = None  # the relative change between the last two windows
    critical: bool | None = None

    def observe(self, grad_norm: float) -> None:
        """One step's gradient norm (0: the step read none)."""
        if self.window == 0 or not grad_norm > 0:
            return
        if self.critical is None:
            self.critical = True
        self.total += grad_norm
        self.count += 1
        if self.count < self.window:
            return
        mean = self.total / self.count
        if self.previous is not None:
            self.moved = abs(mean - self.previous) / self.previous
            self.critical = self.moved >= self.change
        self.previous, self.total, self.count = mean, 0.0, 0

    def describe(self) -> str:
        if not self.critical:
            return ""
        if self.moved is None:
            return "critical regime (training's start)"
        return f"critical regime (the gradient's norm moved {self.moved:.0%} between windows)"

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in LEARNED}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], window: int, change: float) -> CriticalRegime:
        """The learned state with the settings as they are now."""
        return cls(window=window, change=change, **{k: v for k, v in state.items() if k in LEARNED})


__all__ = ["CriticalRegime"]
