"""What each step runs and what it measured, shared by the DDP hook and GradientSync.

A `Controller` owns the step counter, the adopted decision, the control-interval
agreement (client/agreement.py) and the per-step statistics. Rank 0 alone asks
its `DecisionSource` for the next decision and reports each step to it; errors
from the source are logged and the last decision kept, so a broken source can
neither stop nor desynchronise the job.

`resolve_source` and `check_group` hold the construction-time checks (bad CR,
unknown or model-only collective, a group of one) so that bad input fails when
the hook is built, not at step 1000.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch.distributed as dist

from flexcomm.client.agreement import RANK_STATS, Agreement
from flexcomm.client.compress import merge_masses
from flexcomm.client.decisions import DecisionSource, PolicySource, as_source
from flexcomm.client.engine import StepStats
from flexcomm.policy.static import StaticPolicy
from flexcomm.policy.types import (
    DENSE_RING,
    RUNNABLE_COLLECTIVES,
    Decision,
    Policy,
    StepReport,
    check_collective,
    check_cr,
    check_root,
)

log = logging.getLogger("flexcomm.client")

DENSE = Decision(cr=1.0, collective=DENSE_RING, version=0, reason="dense (warm-up)")


def check_runnable(collective: str, field_name: str = "collective") -> str:
    check_collective(collective, field_name)
    if collective not in RUNNABLE_COLLECTIVES:
        raise ValueError(
            f"{field_name}: {collective!r} is model-only; the client runs "
            f"{', '.join(RUNNABLE_COLLECTIVES)}"
        )
    return collective


def resolve_source(
    source: DecisionSource | Policy | None,
    cr: float | None,
    collective: str | None,
    root: str,
) -> DecisionSource:
    """The source rank 0 asks: the one given, or a fixed choice from cr/collective.

    cr alone picks ag_topk (cr < 1) or dense_ring (cr = 1); nothing at all is dense.
    """
    check_root(root)
    if source is not None:
        if cr is not None or collective is not None:
            raise ValueError("source: give either a source/policy or cr/collective, not both")
        return as_source(source)
    if cr is not None:
        cr = check_cr(cr)
    if collective is not None:
        check_runnable(collective)
    if cr is None:
        cr = 1.0 if collective is None or collective.startswith("dense") else None
        if cr is None:
            raise ValueError(f"cr: a Top-k collective ({collective}) needs a cr in (0, 1)")
    if collective is None:
        collective = DENSE_RING if cr == 1.0 else "ag_topk"
    return PolicySource(StaticPolicy(cr, collective, root))


def check_group(group: dist.ProcessGroup | None) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("process_group: torch.distributed is not initialised")
    size = dist.get_world_size(group)
    if size < 2:
        raise ValueError(f"process_group: needs at least 2 ranks to synchronise, got {size}")


def acceptable(decision: object) -> str | None:
    """Why rank 0 cannot run `decision`, or None when it can."""
    if not isinstance(decision, Decision):
        return f"not a Decision: {decision!r}"
    if decision.collective not in RUNNABLE_COLLECTIVES:
        return f"collective {decision.collective!r} is model-only"
    return None


class Controller:
    """Step counter, adopted decision, agreement and statistics for one job."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        source: DecisionSource,
        *,
        control_interval: int = 10,
        warmup_steps: int = 0,
        history: int = 1000,
    ) -> None:
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be an integer >= 0, got {warmup_steps!r}")
        self.agreement = Agreement(group, control_interval)
        self.rank = dist.get_rank(group)
        self.source = source
        self.warmup_steps = warmup_steps
        self.step = 0
        self.steps_run = 0
        self.epoch = 0
        self.decision = DENSE
        self.stats: StepStats | None = None
        self.history: deque[StepStats] = deque(maxlen=history)
        self.rejected = 0
        self._acc = dict.fromkeys(RANK_STATS, 0.0)  # sums since the last agreement
        self._pending = None

    @property
    def running(self) -> Decision:
        """The decision this step runs: dense during warm-up, else the adopted one.

        Warm-up counts the steps this process ran (not the restored step counter):
        after a restart DDP builds its buckets afresh and rebuilds them again."""
        return DENSE if self.steps_run < self.warmup_steps else self.decision

    def probe_crs(self) -> tuple[float, ...]:
        """The CRs whose gains this step measures: the decision's probe_crs, on rank
        0, on the first step of each control interval (a Top-k of the largest probe
        CR per bucket is too dear for every step; the policies smooth gains anyway).
        """
        if self.rank != 0 or not self.agreement.due(self.step):
            return ()
        return self.decision.probe_crs

    def begin_step(self) -> StepStats:
        """Open a step: adopt an agreement launched at the previous step, launch a
        new one if due. Step 0's agreement is waited for at once, so the first
        decision applies from step 0; later ones apply from the step after they
        were launched, on every rank alike, and their latency hides behind a step."""
        if self._pending is not None:
            self._adopt()
        if self.agreement.due(self.step):
            self._launch()
            if self.step == 0:
                self._adopt()
        d = self.running
        self.stats = StepStats(self.step, d.collective, d.cr, self.decision.version)
        return self.stats

    def _proposal(self) -> Decision:
        try:
            latest = self.source.latest()
        except Exception:  # a broken source must not stop or split the job
            log.exception("decision source failed; keeping version %d", self.decision.version)
            return self.decision
        if latest is None:
            return self.decision
        why = acceptable(latest)
        if why is not None:
            self.rejected += 1
            log.warning("ignoring decision from source: %s", why)
            return self.decision
        return latest

    def _launch(self) -> None:
        proposal = self._proposal() if self.rank == 0 else None
        steps = self._acc["steps"]
        stats = [self._acc[k] / steps if steps else 0.0 for k in RANK_STATS if k != "steps"]
        self._pending = (self.agreement.start(proposal, [*stats, steps]), proposal)
        self._acc = dict.fromkeys(RANK_STATS, 0.0)

    def _adopt(self) -> None:
        assert self._pending is not None
        pending, proposal = self._pending
        self._pending = None
        agreed = self.agreement.finish(pending)
        # Rank 0 keeps its full decision (probe CRs, reason); the others get the numbers.
        before, self.decision = self.decision, (
            proposal if proposal is not None and proposal.same_choice(agreed) else agreed)
        if self.rank == 0 and (self.decision.version, self.decision.reason) != (before.version, before.reason):
            d = self.decision
            log.info("step %d: adopted decision v%d: %s cr=%g root=%s (%s)", self.step, d.version,
                     d.collective, d.cr, d.root, d.reason or "no reason given")

    def end_step(self) -> StepStats | None:
        """Close the open step: record it, report it (rank 0), advance the counter."""
        stats, self.stats = self.stats, None
        if stats is None:
            return None
        self.history.append(stats)
        for key, v in (("gain", stats.gain), ("t_sync_s", stats.t_sync_s), ("t_comp_s", stats.t_comp_s),
                       ("bytes_sent", stats.bytes_sent), ("steps", 1)):
            self._acc[key] += v
        if self.rank == 0:
            self._report(stats)
        self.step += 1
        self.steps_run += 1
        return stats

    def _report(self, stats: StepStats) -> None:
        try:
            report = StepReport(
                step=stats.step,
                cr=stats.cr,
                collective=stats.collective,
                t_comp_s=stats.t_comp_s,
                t_sync_s=stats.t_sync_s,
                gain=stats.gain,
                bytes_sent=stats.bytes_sent,
                epoch=self.epoch,
                gains=merge_masses(stats.probes) if stats.probes else {},
            )
            self.source.report(report)
        except Exception:
            log.exception("reporting step %d to the decision source failed", stats.step)

    def state_dict(self) -> dict[str, Any]:
        # Between steps an agreement may be in flight: its collective ran on every
        # rank already, so adopting it now is what every rank does at the next step.
        if self._pending is not None:
            self._adopt()
        return {"step": self.step, "epoch": self.epoch, "decision": self.decision.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.epoch = int(state.get("epoch", 0))
        self.decision = Decision.from_dict(state["decision"])

