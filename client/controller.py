"""What each step runs and what it measured, shared by the DDP hook and GradientSync.

A `Controller` owns the step counter, the adopted decision, the control-interval
agreement (client/agreement.py) and the per-step statistics. Rank 0 alone asks
its `DecisionSource` for the next decision and reports each step to it; errors
from the source are logged and the last decision kept, so a broken source can
neither stop nor desynchronise the job.

A finished step's statistics are folded in once the device has done its work
(`StepStats.resolve`, at once for CPU tensors; on a GPU a step or two later,
never waiting): then it joins the history and the agreement's means. Rank 0
reports it once the next step has started too: only then is its wall time
known, and t_compute_s is that wall time less the time the step's compression,
probe and synchronisation covered (forward, backward, optimizer, data loading).

`resolve_source` and `check_group` hold the construction-time checks (a bad
compression, an unknown or model-only collective, a group of one) so that bad
input fails when the hook is built, not at step 1000.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from flexcomm.client.agreement import CONTROL_PERIOD_S, RANK_STATS, Agreement
from flexcomm.client.decisions import DecisionSource, PolicySource, as_source
from flexcomm.client.gains import merge_masses
from flexcomm.client.stats import StepStats
from flexcomm.client.summary import log_change
from flexcomm.policy.static import StaticPolicy
from flexcomm.policy.types import (
    DENSE_DECISION,
    RUNNABLE_COLLECTIVES,
    Compression,
    Decision,
    Policy,
    StepReport,
    check_collective,
    check_root,
)

log = logging.getLogger("flexcomm.client")
# Rank 0's step time for the agreements' cadence: the median of its latest steps,
# or its last step where that was slower (a step that slowed is when the network
# may have moved: paced by the median, a decision made 0.2 s into cnn's fall to
# 20 Mbit/s ran three 0.25 s steps later).
STEP_SAMPLES = 5

DENSE = replace(DENSE_DECISION, reason="dense (warm-up)")
# The probes' readings may take this share of the job's time: on the lm lab's
# model (3.3 MB of gradient, 52 tensors) a reading took 30-32 ms in one hour
# (1.5-1.6% of the run at every tenth step) and 82 ms in another (4.3%), and the
# MOO's mean step ran that much slower than a fixed choice's. On the digits and
# cnn models a reading takes a few ms and every tenth step stays well inside it.
PROBE_SHARE = 0.02


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
    compression: str | None,
    collective: str | None,
    root: str,
) -> DecisionSource:
    """The source rank 0 asks: the one given, or a fixed choice of compression
    ("topk:0.01", "powersgd:2", "bf16") over a collective (by default AllGather for
    Top-k, the ring otherwise); nothing at all is dense.
    """
    check_root(root)
    if source is not None:
        if compression is not None or collective is not None:
            raise ValueError("source: give either a source/policy or compression/collective, not both")
        return as_source(source)
    if collective is not None:
        check_runnable(collective)
    return PolicySource(StaticPolicy(Compression.parse(compression or "dense"), collective, root))


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
        control_period_s: float = CONTROL_PERIOD_S,
        probe_interval: int = 10,
        probe_share: float = PROBE_SHARE,
        warmup_steps: int = 0,
        history: int = 1000,
    ) -> None:
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be an integer >= 0, got {warmup_steps!r}")
        self.probe_interval, self.probe_share = probe_interval, probe_share
        self._probe_s = 0.0  # rank 0: the probes' readings so far
        self._first_began: float | None = None
        self._probing: tuple[Compression, ...] = ()  # this step's probes, decided as it opens
        self.agreement = Agreement(group, control_interval, control_period_s)
        self.rank = dist.get_rank(group)
        self.source = source
        self.warmup_steps = warmup_steps
        self.step = 0
        self.steps_run = 0
        self.epoch = 0
        self.decision = DENSE
        self.stats: StepStats | None = None
        self.history: deque[StepStats] = deque(maxlen=history)
        self.finished: list[Callable[[StepStats], None]] = []  # told of each step as it joins the history
        self.rejected = 0
        self._acc = dict.fromkeys(RANK_STATS, 0.0)  # sums since the last agreement
        self._pending = None
        self._agree_at_once = True  # step 0 and a restored step agree before they run
        self._unresolved: deque[StepStats] = deque()  # finished, the device's work not yet read
        self._unreported: deque[tuple[StepStats, int]] = deque()  # rank 0: resolved steps and their epoch
        self._next_began: dict[int, float] = {}  # rank 0: a finished step -> the next step's start
        self._step_s: deque[float] = deque(maxlen=STEP_SAMPLES)  # rank 0: its latest steps, start to start
        self._last_finished: StepStats | None = None

    @property
    def running(self) -> Decision:
        """The decision this step runs: dense during warm-up, else the adopted one.

        Warm-up counts the steps this process ran (not the restored step counter):
        after a restart DDP builds its buckets afresh and rebuilds them again."""
        return DENSE if self.steps_run < self.warmup_steps else self.decision

    def probes(self) -> tuple[Compression, ...]:
        """The compressions whose gains this step measures (the same for each of its
        buckets): the decision's probes, on rank 0, every probe_interval steps (a
        Top-k of the largest probed CR and a low-rank fit of every matrix are too
        dear for every step; the policies smooth gains anyway), while the readings
        so far took at most probe_share of the time since the first step began
        (the other ranks wait for rank 0's reading at the next sync)."""
        return self._probing

    def _probes_due(self, now: float) -> tuple[Compression, ...]:
        """Decided once as a step opens: decided per bucket, a step that crossed the
        share during its backward would read some buckets and not others, and
        report their gains as the whole gradient's."""
        assert self._first_began is not None
        if self.rank != 0 or self.step % self.probe_interval or \
                self._probe_s > self.probe_share * (now - self._first_began):
            return ()
        return tuple(Compression.parse(name) for name in self.decision.probes)

    def begin_step(self) -> StepStats:
        """Open a step: adopt the agreement launched as the previous step's syncs
        ended (`end_syncs`), on every rank alike. Step 0 and the first step after
        a restore agree at once, so the first decision applies from that step."""
        now = time.perf_counter()
        if self._first_began is None:
            self._first_began = now
        if self.rank == 0 and self._last_finished is not None:
            self._next_began[self._last_finished.step] = now
            if self._last_finished.began is not None:
                self._step_s.append(now - self._last_finished.began)
        self._fold_finished(wait=False)
        if self._pending is not None:
            self._adopt()
        elif self._agree_at_once:
            self._launch()
            self._adopt()
        self._agree_at_once = False
        d = self.running
        self._probing = self._probes_due(now)
        self.stats = StepStats(self.step, d.family, d.param, d.collective, self.decision.version, began=now)
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
        step_s = max(statistics.median(self._step_s), self._step_s[-1]) if self._step_s else None
        self._pending = (self.agreement.start(proposal, [*stats, steps], self.step, step_s), proposal)
        self._acc = dict.fromkeys(RANK_STATS, 0.0)

    def _adopt(self) -> None:
        assert self._pending is not None
        pending, proposal = self._pending
        self._pending = None
        agreed = self.agreement.finish(pending)
        # Rank 0 keeps its full decision (probes, reason); the others get the numbers.
        before, self.decision = self.decision, (
            proposal if proposal is not None and proposal.same_choice(agreed) else agreed)
        if self.rank == 0:
            log_change(self.step, before, self.decision)

    def end_syncs(self) -> None:
        """The open step's collectives are all launched: launch the agreement the
        next step adopts, if one is due. It runs while the optimizer and the next
        forward do, so no bucket's collective queues behind it, and it carries
        what rank 0's source has decided by now: an agent's answer to the report
        sent as this step began (launched as the next step began, that answer
        ran a step later, and a fall to 20 Mbit/s in the cnn lab cost one more
        0.4 s step). Called by the hook as its last bucket's collective
        completes, else by `end_step`."""
        if self.stats is not None and self._pending is None and self.agreement.due(self.step):
            self._launch()

    def end_step(self) -> StepStats | None:
        """Close the open step and advance the counter. Its statistics join the
        history once the device has done its work; rank 0 reports it once that is
        so and the next step has started (or at close)."""
        self.end_syncs()
        stats, self.stats = self.stats, None
        if stats is None:
            return None
        stats.seal()
        self._unresolved.append(stats)
        self._last_finished = stats
        if self.rank == 0:
            self._unreported.append((stats, self.epoch))
        self._fold_finished(wait=False)
        self.step += 1
        self.steps_run += 1
        return stats

    def _fold_finished(self, wait: bool) -> None:
        """Fold in the finished steps whose device work is done, in order (all of
        them, waiting, if `wait`), and report what can be reported."""
        while self._unresolved and self._unresolved[0].resolve(wait):
            stats = self._unresolved.popleft()
            self.history.append(stats)
            self._probe_s += stats.t_probe_s
            for tell in self.finished:
                tell(stats)
            for key, v in (("gain", stats.gain), ("t_sync_s", stats.t_sync_s), ("t_comp_s", stats.t_comp_s),
                           ("bytes_sent", stats.bytes_sent), ("steps", 1)):
                self._acc[key] += v
        while self._unreported and self._unreported[0][0].resolved and (
                wait or self._unreported[0][0].step in self._next_began):
            stats, epoch = self._unreported.popleft()
            self._report(stats, epoch, self._next_began.pop(stats.step, None))

    def _report(self, stats: StepStats, epoch: int, next_began: float | None) -> None:
        """Report a resolved step; the next step's start gives its wall time (None:
        closing, its compute time unknown)."""
        ended_unix = 0.0
        if next_began is not None:
            stats.t_compute_s = stats.compute_s(next_began)
            ended_unix = time.time() - (time.perf_counter() - next_began)  # the step ended as the next began
        try:
            report = StepReport(
                step=stats.step, family=stats.family, param=stats.param, collective=stats.collective,
                t_comp_s=stats.t_comp_s, t_sync_s=stats.t_sync_s, gain=stats.gain, bytes_sent=stats.bytes_sent,
                epoch=epoch, t_compute_s=stats.t_compute_s,
                gains=merge_masses(stats.probes) if stats.probes else {}, ended_unix=ended_unix,
                grad_norm=math.sqrt(stats.norm_g),
            )
            self.source.report(report)
        except Exception:
            log.exception("reporting step %d to the decision source failed", stats.step)

    def settle(self) -> None:
        """Adopt an agreement in flight: every rank launched it, so waiting for it
        is safe (a rank that has gone makes it raise)."""
        if self._pending is not None:
            self._adopt()

    def close(self) -> None:
        """Report what is left (waiting for the device) and release the source."""
        self._fold_finished(wait=True)
        self.source.close()

    def state_dict(self) -> dict[str, Any]:
        """Step, epoch, the adopted decision, and on rank 0 an in-process
        policy's own state and its network estimate (so a resumed job does not
        explore from scratch)."""
        # Between steps an agreement may be in flight: its collective ran on every
        # rank already, so adopting it now is what every rank does at the next step.
        if self._pending is not None:
            self._adopt()
        state = {"step": self.step, "epoch": self.epoch, "decision": self.decision.to_dict()}
        if self.rank == 0 and isinstance(self.source, PolicySource):
            state.update(self.source.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self._agree_at_once = True  # every rank restored alike agrees at once
        self.epoch = int(state.get("epoch", 0))
        self.decision = Decision.from_dict(state["decision"])
        if self.rank == 0 and "policy" in state and isinstance(self.source, PolicySource):
            self.source.load_state_dict(state)

