"""Gradient synchronisation for hand-written training loops (no DDP), the paper's way.

    sync = GradientSync(model, policy=my_policy)     # every rank, after init_process_group
    for x, y in data:
        loss_fn(model(x), y).backward()
        sync.synchronize()                           # every .grad is now the average
        optimizer.step(); optimizer.zero_grad()

All gradients are flattened into one buffer and one compression runs over the
whole model (one residual), as in the paper's code. Decisions, the
control-interval agreement, warm-up and statistics work exactly as in the DDP
hook (client/hook.py); warm-up defaults to 0 here because there are no buckets
to rebuild. Parameters without a gradient on a step count as zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.compressors import Bucket
from flexcomm.client.runner import Runner
from flexcomm.client.stats import StepStats

MODEL_KEY = "model"


class GradientSync(Runner):
    """Average the gradients of `params` (a module or parameters) over the group.

    Options as FlexcommState (client/hook.py): source / policy / compression +
    collective + root, control_interval, probe_interval, probe_share, warmup_steps (default
    0), selector, var_smoothing, history.
    """

    def __init__(
        self,
        params: torch.nn.Module | Iterable[torch.nn.Parameter],
        process_group: dist.ProcessGroup | None = None,
        **options: Any,
    ) -> None:
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params: no parameter requires a gradient")
        super().__init__(process_group, **options)
        first = self.params[0]
        self._flat = torch.zeros(
            sum(p.numel() for p in self.params), dtype=first.dtype, device=first.device
        )
        self._shapes = [p.shape for p in self.params]

    def synchronize(self) -> StepStats:
        """Replace every parameter's .grad by its average over the group (blocking)."""
        self.setup()  # a GradientSync built before the process group joins it now
        stats = self.controller.begin_step()
        self._gather()
        self._note_gradient(self._flat)
        bucket = Bucket(MODEL_KEY, self._flat, self._shapes, self.controller.step)
        self.gradient_step.run(bucket, self.controller.running, stats, self.controller.probes()).wait()
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
