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
- A source that raises, returns None or proposes something the client cannot
  run (`ps`) leaves the last decision in place; nothing in a step waits on it.

Statistics: `state.last_stats()` is the last finished step's `StepStats`
(t_comp_s, t_sync_s, t_probe_s, gain, bytes_sent, collective, cr, version,
roots); `state.history` holds recent ones; `state.rank_stats` every rank's means
from the last agreement. Rank 0 reports each step to its source as a
`StepReport`, with the gains of the decision's `probe_crs` on the first step of
each control interval. `state.set_epoch(e)` sets the epoch reports carry.

Checkpointing: `state.state_dict()` / `state.load_state_dict(...)` on every rank
(residuals, step counter, adopted decision; tensors, so use torch.save). After a
restart the warm-up runs again, then the restored residuals are used.

Bad options (a CR outside (0, 1], an unknown or model-only collective, a group of
one rank, warmup_steps < 1, an unknown selector or root) raise ValueError naming
the option when the state is built.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client import collectives as coll
from flexcomm.client.engine import StepStats
from flexcomm.client.runner import Runner

GLOBAL_KEY = "global"


class FlexcommState(Runner):
    """State of the flexcomm hook for one DDP model (create it on every rank).

    process_group: the DDP group (None: the default group); must have >= 2 ranks.
    source / policy: where rank 0's decisions come from (a DecisionSource, or a
        flexcomm.policy Policy run in-process). Or give cr (+ collective, root)
        for a fixed choice; nothing at all means dense.
    control_interval: K, steps between agreements. warmup_steps: dense steps first
        (>= 1). global_topk: one Top-k over all buckets. selector: "fast" or
        "exact". var_smoothing: EWMA factor of VAR-Topk's variance. history: how
        many steps' StepStats to keep.
    """

    min_warmup_steps = 1

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        global_topk: bool = False,
        warmup_steps: int = 1,
        **options: Any,
    ) -> None:
        super().__init__(process_group, warmup_steps=warmup_steps, **options)
        self.global_topk = bool(global_topk)
        self._in_step = False
        self._held: list[tuple[torch.Tensor, coll.Future]] = []

    def _warmup_why(self) -> str:
        return " (DDP rebuilds its buckets after the first step)"

    @property
    def history(self) -> deque[StepStats]:
        """Recent steps' StepStats, oldest first (up to the last finished step)."""
        self._close_finished_step()
        return self.controller.history

    def _close_finished_step(self) -> None:
        # A step's futures are done once DDP's backward returns; it is closed lazily
        # (here or at the next step's first bucket) so that callbacks have finished.
        if not self._in_step:
            self.controller.end_step()

    def close(self) -> None:
        self._close_finished_step()
        super().close()

    def state_dict(self) -> dict[str, Any]:
        self._close_finished_step()  # so that the saved step counter counts it
        return super().state_dict()

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
