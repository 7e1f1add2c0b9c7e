"""What a job's steps took outside their sync: the compute, and each
compression's time, each the median of its latest steps.

A compression's first step in the job carries its one-time set-up (buffers
allocated, kernels first run) and is left out of its figure: in the default lab
PowerSGD rank 4's first step compressed in 42 ms and its next ones in 1 ms
(Top-k 0.01 14 ms against 1-2); averaged in, rank 4's figure was still 10x its
steady one when the first exploration was planned.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy.types import plain_fields

COMPUTE_SAMPLES = 9
# A compression's time is the median of its latest steps: one step a loaded host
# stalled (PowerSGD rank 4 compressed in 85 ms, then 2 and 2) held its smoothed
# figure at 42 ms through a short lab's slow phase, where it would have been the
# fastest option within the budget.
COMP_SAMPLES = 5


@dataclass
class StepTimes:
    compute: list[float] = field(default_factory=list)  # the latest steps' compute, s
    comp: dict[str, list[float]] = field(default_factory=dict)  # compression name -> its latest steps' time, s
    set_up: list[str] = field(default_factory=list)  # compressions whose first step (their set-up) was seen

    def observe_compute(self, seconds: float) -> None:
        self.compute = [*self.compute, seconds][-COMPUTE_SAMPLES:]

    def observe_compression(self, name: str, seconds: float) -> None:
        """A step of compression `name` compressed in `seconds` (its first step
        in the job, the set-up, is left out)."""
        if name not in self.set_up:
            self.set_up = [*self.set_up, name]
            return
        self.comp[name] = [*self.comp.get(name, ()), seconds][-COMP_SAMPLES:]

    @property
    def t_compute(self) -> float:
        """The median of the latest steps' compute; 0 before any."""
        return statistics.median(self.compute) if self.compute else 0.0

    def t_comp(self, name: str) -> float | None:
        """Compression `name`'s time, the median of its latest steps past its
        set-up; None before any."""
        samples = self.comp.get(name)
        return statistics.median(samples) if samples else None

    def timed(self) -> list[str]:
        """The compressions with a time, by name."""
        return sorted(self.comp)

    def state_dict(self) -> dict[str, Any]:
        return plain_fields(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> StepTimes:
        return cls([float(t) for t in state["compute"]],
                   {str(k): [float(t) for t in v] for k, v in state["comp"].items()},
                   [str(n) for n in state["set_up"]])


__all__ = ["COMPUTE_SAMPLES", "COMP_SAMPLES", "StepTimes"]
