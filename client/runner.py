"""What the DDP hook and GradientSync share: options checked, a Controller and a step.

`Runner` turns the user's options into a `Controller` (steps, agreement,
statistics, reports) and a `GradientStep` (compressors, memory, transports),
after checking every option, so that bad input fails at construction. It also
gives both entry points the same read-outs (step, decision, history,
rank_stats), epochs and checkpointing.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch.distributed as dist

from flexcomm.client.controller import Controller, check_group, resolve_source
from flexcomm.client.decisions import DecisionSource
from flexcomm.client.selection import check_selector
from flexcomm.client.stats import StepStats
from flexcomm.client.step import GradientStep
from flexcomm.policy.types import ROOT_STAR, Decision, Policy


class Runner:
    """Options (see FlexcommState / GradientSync) -> controller + engine."""

    min_warmup_steps = 0

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        source: DecisionSource | None = None,
        policy: Policy | None = None,
        compression: str | None = None,
        collective: str | None = None,
        root: str = ROOT_STAR,
        control_interval: int = 10,
        probe_interval: int = 10,
        warmup_steps: int = 0,
        selector: str = "fast",
        var_smoothing: float = 0.9,
        history: int = 1000,
    ) -> None:
        check_selector(selector)
        for name, value in (("control_interval", control_interval), ("probe_interval", probe_interval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if source is not None and policy is not None:
            raise ValueError("source: give a source or a policy, not both")
        decided_by = resolve_source(source if source is not None else policy, compression, collective, root)
        if not isinstance(warmup_steps, int) or warmup_steps < self.min_warmup_steps:
            raise ValueError(
                f"warmup_steps: must be an integer >= {self.min_warmup_steps}"
                f"{self._warmup_why()}, got {warmup_steps!r}"
            )
        check_group(process_group)
        self.process_group = process_group
        self.controller = Controller(
            process_group,
            decided_by,
            control_interval=control_interval,
            probe_interval=probe_interval,
            warmup_steps=warmup_steps,
            history=history,
        )
        self.gradient_step = GradientStep(process_group, selector=selector, var_smoothing=var_smoothing)

    def _warmup_why(self) -> str:
        return ""

    @property
    def step(self) -> int:
        """The next step's number (restored by load_state_dict)."""
        return self.controller.step

    @property
    def decision(self) -> Decision:
        """The decision adopted by every rank (dense during warm-up runs instead)."""
        return self.controller.decision

    @property
    def history(self) -> deque[StepStats]:
        """Recent steps' StepStats, oldest first."""
        return self.controller.history

    def last_stats(self) -> StepStats | None:
        """The last finished step's statistics."""
        history = self.history
        return history[-1] if history else None

    @property
    def rank_stats(self) -> list[dict[str, float]]:
        """Every rank's means over the interval before the last agreement."""
        return self.controller.agreement.rank_stats

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next reports carry."""
        self.controller.epoch = int(epoch)

    def close(self) -> None:
        self.controller.close()

    def state_dict(self) -> dict[str, Any]:
        """Step counter, adopted decision, residuals and compressor state such as
        PowerSGD's warm-started factors (tensors: use torch.save)."""
        return {"controller": self.controller.state_dict(), "gradient_step": self.gradient_step.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned; do it on every rank."""
        self.controller.load_state_dict(state["controller"])
        self.gradient_step.load_state_dict(state["gradient_step"])
