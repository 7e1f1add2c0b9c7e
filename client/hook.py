"""The flexcomm DDP communication hook: adaptive Top-k and collectives, rank-agreed.

Register it on a DistributedDataParallel model (gloo or NCCL) in one line:

    from flexcomm.client.hook import register
    state = register(ddp_model, cr=0.01, collective="ag_topk")      # fixed choice
    state = register(ddp_model, policy=my_policy)                      # in-process policy
    state = register(ddp_model, source=AgentClient(...))               # the node's agent

or, the PyTorch way:

    state = FlexcommState(process_group=None, policy=my_policy)
    ddp_model.register_comm_hook(state, flexcomm_hook)

What runs each step (DESIGN.md section 6):
- Every `control_interval` steps, at the start of a step (the first bucket's hook
  call), all ranks join one tiny all-reduce that carries rank 0's decision; all
  ranks adopt it from the next step on (the one at step 0 at once), so its
  latency hides behind a step. Only rank 0 asks its source/policy; the other
  ranks' sources are never consulted.
- The first `warmup_steps` steps (at least 1: DDP rebuilds its buckets after the
  first step, and residuals are kept per bucket index) run dense.
- dense_ring with a zero residual is bit-identical to PyTorch's `allreduce_hook`.
- Top-k collectives keep an error-feedback residual per bucket index
  (`global_topk=True`: one Top-k over the whole gradient, as in the paper, at
  the cost of holding every bucket until the last one is ready).

Statistics: `state.last_stats()` is the last finished step's `StepStats`
(t_comp_s, t_sync_s, gain, bytes_sent, collective, cr, roots); `state.history`
holds recent ones; `state.rank_stats` every rank's means from the last agreement.
Rank 0 reports each step to its source as a `StepReport`.

Checkpointing: `state.state_dict()` / `state.load_state_dict(...)` (residuals,
step counter, adopted decision; tensors, so use torch.save).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client import collectives as coll
from flexcomm.client.compress import check_selector
from flexcomm.client.controller import Controller, check_group, resolve_source
from flexcomm.client.decisions import DecisionSource
from flexcomm.client.engine import FlatSync, StepStats
from flexcomm.policy.types import ROOT_STAR, Policy

GLOBAL_KEY = "global"


class FlexcommState:
    """State of the flexcomm hook for one DDP model (create it on every rank).

    process_group: the DDP group (None: the default group); must have >= 2 ranks.
    source / policy: where rank 0's decisions come from (a DecisionSource, or a
        flexcomm.policy Policy run in-process). Or give cr (+ collective, root)
        for a fixed choice; nothing at all means dense.
    control_interval: K, steps between agreements. warmup_steps: dense steps first
        (>= 1). global_topk: one Top-k over all buckets. selector: "fast" or
        "exact". var_smoothing: EWMA factor of VAR-Topk's variance.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        source: DecisionSource | None = None,
        policy: Policy | None = None,
        cr: float | None = None,
        collective: str | None = None,
        root: str = ROOT_STAR,
        control_interval: int = 10,
        warmup_steps: int = 1,
        global_topk: bool = False,
        selector: str = "fast",
        var_smoothing: float = 0.9,
        history: int = 1000,
    ) -> None:
        check_selector(selector)
        if source is not None and policy is not None:
            raise ValueError("source: give a source or a policy, not both")
        decided_by = resolve_source(source if source is not None else policy, cr, collective, root)
        if not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(
                f"warmup_steps: must be >= 1 (DDP rebuilds its buckets after the first "
                f"step), got {warmup_steps!r}"
            )
        check_group(process_group)
        self.process_group = process_group
        self.global_topk = bool(global_topk)
        self.controller = Controller(
            process_group,
            decided_by,
            control_interval=control_interval,
            warmup_steps=warmup_steps,
            history=history,
        )
        self.engine = FlatSync(process_group, selector=selector, var_smoothing=var_smoothing)
        self._in_step = False
        self._held: list[tuple[torch.Tensor, coll.Future]] = []

    # -- what users read ---------------------------------------------------
    @property
    def step(self) -> int:
        return self.controller.step

    @property
    def decision(self):
        return self.controller.decision

    @property
    def history(self):
        """Recent steps' StepStats, oldest first (up to the last finished step)."""
        self._close_finished_step()
        return self.controller.history

    @property
    def rank_stats(self) -> list[dict[str, float]]:
        return self.controller.agreement.rank_stats

    def set_epoch(self, epoch: int) -> None:
        self.controller.epoch = int(epoch)

    def last_stats(self) -> StepStats | None:
        """The last finished step's statistics."""
        history = self.history
        return history[-1] if history else None

    def _close_finished_step(self) -> None:
        # A step's futures are done once DDP's backward returns; it is closed lazily
        # (here or at the next step's first bucket) so that callbacks have finished.
        if not self._in_step:
            self.controller.end_step()

    def close(self) -> None:
        self._close_finished_step()
        self.controller.source.close()

    # -- checkpointing ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict(), "engine": self.engine.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"])
        self.engine.load_state_dict(state["engine"])

    # -- per bucket ---------------------------------------------------------
    def _run_bucket(self, bucket: dist.GradBucket) -> coll.Future:
        if not self._in_step:
            self.controller.end_step()
            self.controller.begin_step()
            self._in_step = True
        stats = self.controller.stats
        assert stats is not None
        d = self.controller.running
        last = bucket.is_last()
        g = bucket.buffer()
        if self.global_topk:
            fut = self._run_global(g, last, d, stats)
        else:
            fut = self.engine.run(
                bucket.index(), g, d.collective, d.cr, d.root,
                self.controller.step, stats, self.controller.probe_crs(),
            )
        if last:
            self._in_step = False
        return fut

    def _run_global(self, g: torch.Tensor, last: bool, d, stats: StepStats) -> coll.Future:
        held: coll.Future = torch.futures.Future()
        self._held.append((g, held))
        if not last:
            return held
        buffers = [b for b, _ in self._held]
        flat = torch.cat(buffers)
        self.engine.run(
            GLOBAL_KEY, flat, d.collective, d.cr, d.root,
            self.controller.step, stats, self.controller.probe_crs(),
        ).wait()
        offset = 0
        for buf, fut in self._held:
            buf.copy_(flat[offset : offset + buf.numel()])
            offset += buf.numel()
            fut.set_result(buf)
        self._held = []
        return held


def flexcomm_hook(state: FlexcommState, bucket: dist.GradBucket) -> torch.futures.Future:
    """The DDP comm hook: `ddp_model.register_comm_hook(state, flexcomm_hook)`."""
    return state._run_bucket(bucket)


# DDP compares the annotations with the real classes; this module's are strings.
flexcomm_hook.__annotations__.update(
    bucket=dist.GradBucket, state=FlexcommState, **{"return": torch.futures.Future[torch.Tensor]}
)


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, **options: Any) -> FlexcommState:
    """Create a FlexcommState (options as its constructor) and register the hook on
    `ddp_model`, whose process group it uses. Returns the state."""
    group = options.pop("process_group", None)
    if group is None:
        group = getattr(ddp_model, "process_group", None)
    state = FlexcommState(group, **options)
    ddp_model.register_comm_hook(state, flexcomm_hook)
    return state
