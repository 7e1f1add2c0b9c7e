"""The flexcomm DDP communication hook: the compression and collective rank 0's
policy decides, run by every rank alike.

Register it on a DistributedDataParallel model (gloo or NCCL) in one line:

    from flexcomm.client.hook import register
    state = register(ddp_model, compression="topk:0.01", collective="ag_topk")  # fixed choice
    state = register(ddp_model, policy=my_policy)                               # in-process policy
    state = register(ddp_model, source=AgentClient(...))                        # the node's agent

or, the PyTorch way (the state may be built before the process group exists,
as PowerSGDState can, e.g. for Lightning's DDPStrategy(ddp_comm_state=...); it
joins the group at its first step):

    state = FlexcommState(process_group=None, policy=my_policy)
    ddp_model.register_comm_hook(state, flexcomm_hook)

`flexcomm.register(ddp_model)` (client/job.py) is the one-line form: with no
choice given, the node's agent, else the MOO in-process.

What runs each step:
- Every `control_interval` steps, or every step where steps take longer than
  `control_period_s` (as many whole steps as fit in it; client/agreement.py), as
  the step's last bucket's collective completes, all ranks join one tiny
  all-reduce that carries rank 0's decision; all ranks adopt it as the next step
  begins (the one at step 0 at once, before its first bucket), and it runs while
  the optimizer and the next forward do. Only rank 0 asks its source/policy; the
  other ranks' sources are never consulted.
- The first `warmup_steps` steps (at least 1: DDP rebuilds its buckets after the
  first step, and residuals are kept per bucket index) run dense.
- Each bucket then goes through client/step.py: compensate (error feedback, for
  Top-k and PowerSGD, one residual per bucket shared by both), compress
  (client/compressors/), update the residual, communicate (client/collectives.py).
- dense over dense_ring with a zero residual is bit-identical to PyTorch's
  `allreduce_hook`, bf16 over dense_ring to its `bf16_compress_hook`.
- `global_topk=True`: one compression over the whole gradient, as in the paper, at
  the cost of holding every bucket until the last one is ready.
- A source that raises, returns None or proposes something the client cannot
  run (`ps`) leaves the last decision in place; nothing in a step waits on it.

The hook may: read and write the bucket's buffer, keep per-bucket state (the
residual, PowerSGD's Q), launch collectives on the DDP group. It may not: wait
on the agent, change what other ranks run outside the agreement, or touch the
parameters themselves.

Statistics: `state.last_stats()` is the last finished step's `StepStats`
(t_comp_s, t_sync_s, t_probe_s, t_compute_s, gain, bytes_sent, family, param,
collective, version, roots); `state.history` holds recent ones; `state.rank_stats`
every rank's means from the last agreement. Rank 0 reports each step to its
source as a `StepReport` when the next step starts, with the gains of the
decision's probes and the norm of its own gradient every `probe_interval`
steps. `state.set_epoch(e)` sets the epoch reports carry. On a GPU a step's
times come from CUDA events and its norms and gains from device tensors, read
once the device has done that work (a step or two later; nothing waits for
them), so history, rank_stats and reports trail the step by that much.

Checkpointing: `state.state_dict()` / `state.load_state_dict(...)` on every rank
(step counter, adopted decision, residuals, PowerSGD's factors, and rank 0's
in-process policy; tensors, so use torch.save). After a restart the warm-up runs
again, then the restored residuals are used.

Bad options (an unknown compression or a bad parameter, an unknown or model-only
collective, a collective the family cannot use, a group of one rank,
warmup_steps < 1, an unknown selector or root) raise ValueError naming the
option when the state is built.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.collectives import Future, chain, new_future
from flexcomm.client.compressors import Bucket
from flexcomm.client.runner import Runner
from flexcomm.client.stats import StepStats
from flexcomm.policy.types import Decision

GLOBAL_KEY = "global"


class FlexcommState(Runner):
    """State of the flexcomm hook for one DDP model (create it on every rank).

    process_group: the DDP group (None: the default group); must have >= 2 ranks.
    source / policy: where rank 0's decisions come from (a DecisionSource, or a
        flexcomm.policy Policy run in-process). Or give compression ("topk:0.01",
        "powersgd:2", "bf16"; + collective, root) for a fixed choice; nothing at
        all means dense.
    control_interval: K, the most steps between agreements; control_period_s:
        agreements come as often as whole steps fit in it (0.5 s; 0: every K
        steps whatever they take). probe_interval: steps between
        readings of the probes' gains (rank 0); probe_share: the most of the
        job's time those readings may take (0.02; a due reading is skipped while
        over it). warmup_steps: dense steps first
        (>= 1). global_topk: one compression over all buckets. selector: Top-k's
        ("auto": "fast" on CPU tensors, "radix" on a GPU; or "exact", "fast",
        "sync_free", "radix"; client/selection.py). var_smoothing: EWMA factor of VAR-Topk's variance.
        history: how many steps' StepStats to keep.
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
        self._held: list[tuple[torch.Tensor, list[torch.Size], Future]] = []
        self._shapes: dict[int, tuple[int, list[torch.Size]]] = {}  # bucket index -> (numel, shapes)
        self._backwards = 0  # backward passes this hook has seen in this process

    def _warmup_why(self) -> str:
        return " (DDP rebuilds its buckets after the first step)"

    @property
    def history(self) -> deque[StepStats]:
        """Recent steps' StepStats, oldest first (up to the last finished step)."""
        self._close_finished_step()
        return super().history

    def _close_finished_step(self) -> None:
        # A step's futures are done once DDP's backward returns; it is closed lazily
        # (here or at the next step's first bucket) so that callbacks have finished.
        if not self._in_step and self._controller is not None:
            self.controller.end_step()

    def summary(self) -> dict[str, Any]:
        self._close_finished_step()
        return super().summary()

    def close(self) -> None:
        self._close_finished_step()
        super().close()

    def state_dict(self) -> dict[str, Any]:
        self._close_finished_step()  # so that the saved step counter counts it
        return super().state_dict()

    # -- per bucket ---------------------------------------------------------
    def _run_bucket(self, bucket: dist.GradBucket) -> Future:
        self.setup()  # a state built before the process group joins it now
        if not self._in_step:
            self.controller.end_step()
            self.controller.begin_step()
            self._in_step = True
            self._backwards += 1
        stats = self.controller.stats
        assert stats is not None
        d = self.controller.running
        last = bucket.is_last()
        g = bucket.buffer()
        shapes = self._bucket_shapes(bucket, g)
        self._note_gradient(g)
        if self.global_topk:
            fut = self._run_global(g, shapes, last, d, stats)
        else:
            work = Bucket(bucket.index(), g, shapes, self.controller.step)
            fut = self.gradient_step.run(work, d, stats, self.controller.probes())
        if last:
            self._in_step = False
            if not self.global_topk:  # the global step waited for its syncs and launched it
                fut = chain(fut, self._after_syncs)
        return fut

    def _after_syncs(self, fut: Future) -> torch.Tensor:
        # Every collective of the step was launched before this one completed, and
        # DDP launches the next step's only after this future: every rank launches
        # the agreement at the same place in the order of its collectives.
        self.controller.end_syncs()
        return fut.value()

    def _bucket_shapes(self, bucket: dist.GradBucket, g: torch.Tensor) -> list[torch.Size]:
        """Its parameters' gradient shapes in the bucket's order (PowerSGD's
        matrices). DDP rebuilds its buckets before the second backward of the
        process, often to the same size with the parameters in another order (a
        model in one bucket: reversed), so shapes are kept only from then on: kept
        from the first, PowerSGD viewed the lab cnn's rebuilt bucket through the old
        order and sent even its norm layers' 1-D gradients 20-200% wrong."""
        numel, shapes = self._shapes.get(bucket.index(), (-1, []))
        if numel != g.numel():
            shapes = [t.shape for t in bucket.gradients()]
            if self._backwards > 1:
                self._shapes[bucket.index()] = (g.numel(), shapes)
        return shapes

    def _run_global(self, g: torch.Tensor, shapes: list[torch.Size], last: bool, d: Decision,
                    stats: StepStats) -> Future:
        held = new_future(g)
        self._held.append((g, shapes, held))
        if not last:
            return held
        flat = torch.cat([b for b, _, _ in self._held])
        every = [s for _, bucket_shapes, _ in self._held for s in bucket_shapes]
        work = Bucket(GLOBAL_KEY, flat, every, self.controller.step)
        self.gradient_step.run(work, d, stats, self.controller.probes()).wait()
        self.controller.end_syncs()
        offset = 0
        for buf, _, fut in self._held:
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
