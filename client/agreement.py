"""The control-interval collective: every rank adopts rank 0's decision.

As a step's syncs end, every few steps, all ranks join one tiny all-reduce of a
float64 vector: a header that only rank 0 fills (its decision as numbers: index
into FAMILIES, the family's parameter, index into COLLECTIVES, index into
ROOT_SELECTIONS, version; then the steps until the next agreement) and one slot
of statistics per rank that only that rank fills. Every other entry is zero, so
the sum reproduces each filled number exactly and every rank decodes the same
decision and the same next agreement. Nothing else decides what a rank runs.

How often (`cadence`): every `interval` steps (K), or more often where steps are
slow, as many whole steps as fit in `period_s` (at least one), timed by rank 0.
At K steps alone a decision waited up to K + 1 steps to run: at the lab's K = 2
the cnn job ran bf16 three more 0.45 s steps into a 20 Mbit/s phase after its
agent had decided to leave it. An agreement costs what of its latency the
optimizer and the next forward do not cover (see CONTROL_PERIOD_S).

`start` launches it without waiting and `finish` reads it, so the Controller
launches it as one step's syncs end and reads it as the next step begins. On NCCL the
vector lives on the GPU: it goes there from pinned memory and comes back on a
side stream as soon as the collective has run, so `finish` waits for that copy
alone, not for the step's work queued on the GPU (untested here: no GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.device import Later, to_device
from flexcomm.policy.types import COLLECTIVES, FAMILIES, ROOT_SELECTIONS, Decision, check_range

HEADER = 6
# Per-rank statistics carried alongside (means over the interval's steps).
RANK_STATS: tuple[str, ...] = ("gain", "t_sync_s", "t_comp_s", "bytes_sent", "steps")
# Agreements come as often as whole steps fit in this. One costs 4.6 ms (median,
# 4 gloo ranks on the 2-vCPU lab host) where the next step's optimizer and forward
# do not cover it. bench/hook_overhead.py there against PyTorch's hook, an
# agreement every step: 1.008-1.017 (44 ms steps); launched as a step began, the
# first bucket queued behind it and it cost 1.024-1.037 (1.06-1.07 at 0.1 s steps).
CONTROL_PERIOD_S = 0.5
MAX_PERIOD_S = 3600.0


def encode(decision: Decision, next_in: int) -> list[float]:
    return [
        float(FAMILIES.index(decision.family)),
        float(decision.param),
        float(COLLECTIVES.index(decision.collective)),
        float(ROOT_SELECTIONS.index(decision.root)),
        float(decision.version),
        float(next_in),
    ]


def decode(header: Sequence[float]) -> tuple[Decision, int]:
    family, param, collective, root, version, next_in = header
    decision = Decision(
        family=FAMILIES[int(family)],
        param=float(param),
        collective=COLLECTIVES[int(collective)],
        root=ROOT_SELECTIONS[int(root)],
        version=int(version),
    )
    return decision, int(next_in)


def cadence(step_s: float | None, interval: int, period_s: float) -> int:
    """Steps from one agreement to the next: `interval`, or as many whole steps
    of `step_s` as fit in `period_s` where that is fewer (at least 1); with
    `period_s` 0, always `interval`; with no step timed yet, 1."""
    if not period_s:
        return interval
    if step_s is None:
        return 1
    return max(1, min(interval, int(period_s / step_s))) if step_s > 0 else interval


class Agreement:
    """Runs the control-interval collective over `group` (see `cadence`)."""

    def __init__(self, group: dist.ProcessGroup | None, interval: int, period_s: float = 0.0) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"control_interval: must be an integer >= 1, got {interval!r}")
        check_range("control_period_s", period_s, 0.0, MAX_PERIOD_S)
        self.group = group
        self.interval = interval
        self.period_s = float(period_s)
        self.next_step = 0  # the step at which the next agreement is launched
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # The latest statistics of every rank, as {name: value} per rank.
        self.rank_stats: list[dict[str, float]] = []

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def start(self, proposal: Decision | None, stats: Sequence[float], step: int,
              step_s: float | None = None) -> Pending:
        """Launch the collective at `step` (all ranks together, at the same place in
        their order of collectives) without waiting for it.

        `proposal` and `step_s` (its recent step time, for the `cadence`) matter on
        rank 0 only (the proposal must not be None there); `stats` are this rank's
        values for RANK_STATS. No other agreement is due until this one is read.
        """
        if len(stats) != len(RANK_STATS):
            raise ValueError(f"stats: expected {len(RANK_STATS)} values, got {len(stats)}")
        width = len(RANK_STATS)
        row = [0.0] * (HEADER + self.size * width)
        if self.rank == 0:
            if proposal is None:
                raise ValueError("proposal: rank 0 must propose a decision")
            row[:HEADER] = encode(proposal, cadence(step_s, self.interval, self.period_s))
        self.next_step = step + 1 + self.interval  # not due before it is read (then set by rank 0)
        start = HEADER + self.rank * width
        row[start : start + width] = [float(s) for s in stats]
        device = control_device(self.group)
        host = torch.tensor(row, dtype=torch.float64)
        if device.type == "cpu":
            return Pending(host, dist.all_reduce(host, group=self.group, async_op=True), step)
        buf = to_device(host, device)
        work = dist.all_reduce(buf, group=self.group, async_op=True)
        side = torch.cuda.Stream(device)
        buf.record_stream(side)
        with torch.cuda.stream(side):
            work.wait()  # the side stream, not the step's, waits for the collective
            back = Later([buf])
        return Pending(buf, work, step, back)

    def finish(self, pending: Pending) -> Decision:
        """Wait for a started agreement; every rank gets rank 0's decision."""
        if pending.back is not None:
            values = pending.back.numbers()
        else:
            pending.work.wait()
            values = pending.buf.tolist()
        width = len(RANK_STATS)
        self.rank_stats = [
            dict(zip(RANK_STATS, values[HEADER + r * width : HEADER + (r + 1) * width], strict=True))
            for r in range(self.size)
        ]
        decision, next_in = decode(values[:HEADER])
        self.next_step = pending.step + next_in
        return decision

    def agree(self, proposal: Decision | None, stats: Sequence[float], step: int = 0) -> Decision:
        """start + finish: blocking."""
        return self.finish(self.start(proposal, stats, step))


@dataclass
class Pending:
    """An agreement launched and not yet read."""

    buf: torch.Tensor
    work: Any
    step: int  # the step it was launched at
    back: Later | None = None  # on a GPU: the result on its way to the host


def control_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where tiny control tensors live: NCCL only reduces GPU tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
