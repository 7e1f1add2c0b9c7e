"""The control-interval collective: every rank adopts rank 0's decision.

Every K steps, at the start of a step, all ranks join one tiny all-reduce of a
float64 vector: a header that only rank 0 fills (its decision as numbers: index
into FAMILIES, the family's parameter, index into COLLECTIVES, index into
ROOT_SELECTIONS, version) and one slot of
statistics per rank that only that rank fills. Every other entry is zero, so the
sum reproduces each filled number exactly and every rank decodes the same
decision. Nothing else decides what a rank runs.

`start` launches it without waiting and `finish` reads it, so the Controller can
read it at the next step's start and hide its latency behind a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.policy.types import COLLECTIVES, FAMILIES, ROOT_SELECTIONS, Decision

HEADER = 5
# Per-rank statistics carried alongside (means over the interval's steps).
RANK_STATS: tuple[str, ...] = ("gain", "t_sync_s", "t_comp_s", "bytes_sent", "steps")


def encode(decision: Decision) -> list[float]:
    return [
        float(FAMILIES.index(decision.family)),
        float(decision.param),
        float(COLLECTIVES.index(decision.collective)),
        float(ROOT_SELECTIONS.index(decision.root)),
        float(decision.version),
    ]


def decode(header: Sequence[float]) -> Decision:
    family, param, collective, root, version = header
    return Decision(
        family=FAMILIES[int(family)],
        param=float(param),
        collective=COLLECTIVES[int(collective)],
        root=ROOT_SELECTIONS[int(root)],
        version=int(version),
    )


class Agreement:
    """Runs the control-interval collective over `group` every `interval` steps."""

    def __init__(self, group: dist.ProcessGroup | None, interval: int) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"control_interval: must be an integer >= 1, got {interval!r}")
        self.group = group
        self.interval = interval
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # The latest statistics of every rank, as {name: value} per rank.
        self.rank_stats: list[dict[str, float]] = []

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def start(self, proposal: Decision | None, stats: Sequence[float]) -> Pending:
        """Launch the collective (all ranks together, in the same order as every
        other collective) without waiting for it.

        `proposal` matters on rank 0 only (it must not be None there); `stats` are
        this rank's values for RANK_STATS.
        """
        if len(stats) != len(RANK_STATS):
            raise ValueError(f"stats: expected {len(RANK_STATS)} values, got {len(stats)}")
        width = len(RANK_STATS)
        row = [0.0] * (HEADER + self.size * width)
        if self.rank == 0:
            if proposal is None:
                raise ValueError("proposal: rank 0 must propose a decision")
            row[:HEADER] = encode(proposal)
        start = HEADER + self.rank * width
        row[start : start + width] = [float(s) for s in stats]
        buf = torch.tensor(row, dtype=torch.float64, device=control_device(self.group))
        return Pending(buf, dist.all_reduce(buf, group=self.group, async_op=True))

    def finish(self, pending: Pending) -> Decision:
        """Wait for a started agreement; every rank gets rank 0's decision."""
        pending.work.wait()
        values = pending.buf.tolist()
        width = len(RANK_STATS)
        self.rank_stats = [
            dict(zip(RANK_STATS, values[HEADER + r * width : HEADER + (r + 1) * width], strict=True))
            for r in range(self.size)
        ]
        return decode(values[:HEADER])

    def agree(self, proposal: Decision | None, stats: Sequence[float]) -> Decision:
        """start + finish: blocking."""
        return self.finish(self.start(proposal, stats))


@dataclass
class Pending:
    """An agreement launched and not yet read."""

    buf: torch.Tensor
    work: Any


def control_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where tiny control tensors live: NCCL only reduces GPU tensors (untested here)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
