"""What the DDP hook and GradientSync share: options checked, a Controller and a step.

`Runner` turns the user's options into a `Controller` (steps, agreement,
statistics, reports) and a `GradientStep` (compressors, memory, transports),
after checking every option, so that bad input fails at construction. It also
gives both entry points the same read-outs (step, decision, history,
rank_stats, summary), epochs and checkpointing.

Like PyTorch's PowerSGDState, a state can be built before the process group
exists (a framework's strategy takes it before it initialises torch.distributed):
the options are checked at once, and it joins the group (`setup`, on every
rank) at its first step instead.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.agreement import CONTROL_PERIOD_S, MAX_PERIOD_S
from flexcomm.client.collectives import callbacks_released
from flexcomm.client.controller import DENSE, PROBE_SHARE, Controller, check_group, resolve_source
from flexcomm.client.decisions import DecisionSource
from flexcomm.client.nodes import share_nodes
from flexcomm.client.selection import check_selector
from flexcomm.client.stats import StepStats
from flexcomm.client.step import GradientStep
from flexcomm.client.summary import JobSummary, Scalars, ScalarWriter, show_decisions
from flexcomm.policy.types import ROOT_STAR, Decision, Policy, check_range

log = logging.getLogger("flexcomm.client")


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
        control_period_s: float = CONTROL_PERIOD_S,
        probe_interval: int = 10,
        probe_share: float = PROBE_SHARE,
        warmup_steps: int = 0,
        selector: str = "auto",
        var_smoothing: float = 0.9,
        history: int = 1000,
        writer: Scalars | None = None,
    ) -> None:
        check_selector(selector)
        for name, value in (("control_interval", control_interval), ("probe_interval", probe_interval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        check_range("probe_share", probe_share, 0.0, 1.0, open_low=True)
        check_range("control_period_s", control_period_s, 0.0, MAX_PERIOD_S)
        if source is not None and policy is not None:
            raise ValueError("source: give a source or a policy, not both")
        decided_by = resolve_source(source if source is not None else policy, compression, collective, root)
        if not isinstance(warmup_steps, int) or warmup_steps < self.min_warmup_steps:
            raise ValueError(
                f"warmup_steps: must be an integer >= {self.min_warmup_steps}"
                f"{self._warmup_why()}, got {warmup_steps!r}"
            )
        self.process_group = process_group
        self._decided_by = decided_by
        self._settings = {"control_interval": control_interval, "control_period_s": control_period_s,
                          "probe_interval": probe_interval,
                          "probe_share": probe_share,
                          "warmup_steps": warmup_steps, "history": history}
        self._engine = {"selector": selector, "var_smoothing": var_smoothing}
        self._scalars = ScalarWriter(writer) if writer is not None else None
        self._totals = JobSummary()
        self._step_facts: dict[int, tuple[int, bool]] = {}  # step -> (a dense step's bytes, exploring)
        self._restore: dict[str, Any] | None = None
        self._controller: Controller | None = None
        if process_group is not None or (dist.is_available() and dist.is_initialized()):
            self.setup()

    def setup(self) -> None:
        """Join the process group (every rank alike, once): check it, gather the
        job's nodes, build the controller and the gradient step. Done when the
        state is built if the group exists then, else at the first step."""
        if self._controller is not None:
            return
        check_group(self.process_group)
        share_nodes(self._decided_by, self.process_group)  # every rank: one gather of the nodes' addresses
        controller = Controller(self.process_group, self._decided_by, **self._settings)
        controller.finished.append(self._count)
        self.gradient_step = GradientStep(self.process_group, **self._engine)
        self._controller = controller
        if controller.rank == 0:
            show_decisions()
        if self._restore is not None:
            restore, self._restore = self._restore, None
            self.load_state_dict(restore)

    @property
    def controller(self) -> Controller:
        if self._controller is None:
            raise RuntimeError("the flexcomm state has not joined its process group yet (it does at its "
                               "first step, or call setup() once torch.distributed is initialised)")
        return self._controller

    def _note_gradient(self, g: torch.Tensor) -> None:
        """A bucket of this step: what a dense step would send, and whether the
        policy runs the step to explore (for the summary)."""
        step = self.controller.step
        dense, _ = self._step_facts.get(step, (0, False))
        self._step_facts[step] = (dense + g.numel() * g.element_size(), self.controller.running.exploring)

    def _count(self, stats: StepStats) -> None:
        dense, exploring = self._step_facts.pop(stats.step, (0, False))
        self._totals.add(stats, dense, exploring)
        if self._scalars is not None and self.controller.rank == 0:
            self._scalars.write(stats, stats.version)

    def summary(self) -> dict[str, Any]:
        """What the job ran so far on this rank: per choice ("bf16@dense_ring") its
        steps, wall seconds, bytes sent and a dense step's bytes; the totals, the
        bytes saved against dense and their share, and the share of steps the
        policy ran to explore (known on rank 0)."""
        return self._totals.as_dict()

    def _warmup_why(self) -> str:
        return ""

    @property
    def step(self) -> int:
        """The next step's number (restored by load_state_dict)."""
        return self.controller.step if self._controller is not None else 0

    @property
    def decision(self) -> Decision:
        """The decision adopted by every rank (dense during warm-up runs instead)."""
        return self.controller.decision if self._controller is not None else DENSE

    @property
    def history(self) -> deque[StepStats]:
        """Recent steps' StepStats, oldest first."""
        return self.controller.history if self._controller is not None else deque()

    def last_stats(self) -> StepStats | None:
        """The last finished step's statistics."""
        history = self.history
        return history[-1] if history else None

    @property
    def rank_stats(self) -> list[dict[str, float]]:
        """Every rank's means over the interval before the last agreement."""
        return self.controller.agreement.rank_stats if self._controller is not None else []

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next reports carry."""
        self.controller.epoch = int(epoch)

    def close(self) -> None:
        """Wait for the collectives flexcomm launched ahead of a next step and for
        the threads that ran the steps' callbacks to let go of them, then release
        the decision source. Call it on every rank, before destroy_process_group:
        gloo's worker thread, finishing either during interpreter finalisation,
        aborts the process (`collectives.callbacks_released`). A rank already
        gone fails the wait; close says so and still releases the source (it
        ends the job at the agent)."""
        if self._controller is None:
            self._decided_by.close()
            return
        try:
            self.controller.settle()
            self.gradient_step.settle()
        except RuntimeError as e:
            log.warning("flexcomm: a collective in flight at close failed: %s", str(e).splitlines()[0])
        callbacks_released()
        self.controller.close()

    def state_dict(self) -> dict[str, Any]:
        """Step counter, adopted decision, residuals and compressor state such as
        PowerSGD's warm-started factors (tensors: use torch.save). Before the state
        joined its group (a checkpoint written before the first step): the state
        it was given to restore then, else {} (nothing to restore)."""
        if self._controller is None:
            return self._restore if self._restore is not None else {}
        return {"controller": self.controller.state_dict(), "gradient_step": self.gradient_step.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned; do it on every rank (before the state
        joined its group, it is restored when it does). {} restores nothing."""
        if self._controller is None:
            self._restore = state or None
            return
        if not state:
            return
        self.controller.load_state_dict(state["controller"])
        self.gradient_step.load_state_dict(state["gradient_step"])
