"""Gradient synchronisation for hand-written training loops (no DDP), the paper's way.

    sync = GradientSync(model, policy=my_policy)     # every rank, after init_process_group
    for x, y in data:
        loss_fn(model(x), y).backward()
        sync.synchronize()                           # every .grad is now the average
        optimizer.step(); optimizer.zero_grad()

All gradients are flattened into one buffer and one Top-k runs over the whole
model (one residual), as in the paper's code. Decisions, the control-interval
agreement, warm-up and statistics work exactly as in the DDP hook
(client/hook.py); warm-up defaults to 0 here because there are no buckets to
rebuild. Parameters without a gradient on a step count as zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.compress import check_selector
from flexcomm.client.controller import Controller, check_group, resolve_source
from flexcomm.client.decisions import DecisionSource
from flexcomm.client.engine import FlatSync, StepStats
from flexcomm.policy.types import ROOT_STAR, Policy

MODEL_KEY = "model"


class GradientSync:
    """Average the gradients of `params` (a module or parameters) over the group.

    Options as FlexcommState (client/hook.py): source / policy / cr + collective +
    root, control_interval, warmup_steps, selector, var_smoothing, history.
    """

    def __init__(
        self,
        params: torch.nn.Module | Iterable[torch.nn.Parameter],
        process_group: dist.ProcessGroup | None = None,
        *,
        source: DecisionSource | None = None,
        policy: Policy | None = None,
        cr: float | None = None,
        collective: str | None = None,
        root: str = ROOT_STAR,
        control_interval: int = 10,
        warmup_steps: int = 0,
        selector: str = "fast",
        var_smoothing: float = 0.9,
        history: int = 1000,
    ) -> None:
        check_selector(selector)
        if source is not None and policy is not None:
            raise ValueError("source: give a source or a policy, not both")
        decided_by = resolve_source(source if source is not None else policy, cr, collective, root)
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params: no parameter requires a gradient")
        check_group(process_group)
        self.controller = Controller(
            process_group,
            decided_by,
            control_interval=control_interval,
            warmup_steps=warmup_steps,
            history=history,
        )
        self.engine = FlatSync(process_group, selector=selector, var_smoothing=var_smoothing)
        first = self.params[0]
        self._flat = torch.zeros(
            sum(p.numel() for p in self.params), dtype=first.dtype, device=first.device
        )

    @property
    def history(self):
        return self.controller.history

    @property
    def decision(self):
        return self.controller.decision

    def set_epoch(self, epoch: int) -> None:
        self.controller.epoch = int(epoch)

    def synchronize(self) -> StepStats:
        """Replace every parameter's .grad by its average over the group (blocking)."""
        stats = self.controller.begin_step()
        self._gather()
        d = self.controller.running
        self.engine.run(
            MODEL_KEY, self._flat, d.collective, d.cr, d.root,
            self.controller.step, stats, self.controller.probe_crs(),
        ).wait()
        self._scatter()
        self.controller.end_step()
        return stats

    def _gather(self) -> None:
        offset = 0
        for p in self.params:
            part = self._flat[offset : offset + p.numel()]
            if p.grad is None:
                part.zero_()
            else:
                part.copy_(p.grad.reshape(-1))
            offset += p.numel()

    def _scatter(self) -> None:
        offset = 0
        for p in self.params:
            part = self._flat[offset : offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.copy_(part)
            offset += p.numel()

    def close(self) -> None:
        self.controller.source.close()

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict(), "engine": self.engine.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"])
        self.engine.load_state_dict(state["engine"])
