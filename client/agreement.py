"""The control-interval collective (DESIGN.md section 6): every rank adopts rank 0's decision.

Every K steps, at the start of a step, all ranks join one tiny all-reduce of a
float64 vector: a header that only rank 0 fills (its decision as numbers: index
into COLLECTIVES, cr, index into ROOT_SELECTIONS, version) and one slot of
statistics per rank that only that rank fills. Every other entry is zero, so the
sum reproduces each filled number exactly and every rank decodes the same
decision. Nothing else decides what a rank runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from flexcomm.policy.types import COLLECTIVES, ROOT_SELECTIONS, Decision

HEADER = 4
# Per-rank statistics carried alongside (means over the interval's steps).
RANK_STATS: tuple[str, ...] = ("gain", "t_sync_s", "t_comp_s", "bytes_sent", "steps")


def encode(decision: Decision) -> list[float]:
    return [
        float(COLLECTIVES.index(decision.collective)),
        float(decision.cr),
        float(ROOT_SELECTIONS.index(decision.root)),
        float(decision.version),
    ]


def decode(header: Sequence[float]) -> Decision:
    collective, cr, root, version = header
    return Decision(
        cr=float(cr),
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

    def agree(self, proposal: Decision | None, stats: Sequence[float]) -> Decision:
        """All ranks call this together; returns rank 0's `proposal` on every rank.

        `proposal` matters on rank 0 only (it must not be None there); `stats` are
        this rank's values for RANK_STATS.
        """
        if len(stats) != len(RANK_STATS):
            raise ValueError(f"stats: expected {len(RANK_STATS)} values, got {len(stats)}")
        width = len(RANK_STATS)
        buf = torch.zeros(HEADER + self.size * width, dtype=torch.float64)
        if self.rank == 0:
            if proposal is None:
                raise ValueError("proposal: rank 0 must propose a decision")
            buf[:HEADER] = torch.tensor(encode(proposal), dtype=torch.float64)
        start = HEADER + self.rank * width
        buf[start : start + width] = torch.tensor([float(s) for s in stats], dtype=torch.float64)
        dist.all_reduce(buf, group=self.group)
        values = buf.tolist()
        self.rank_stats = [
            dict(zip(RANK_STATS, values[HEADER + r * width : HEADER + (r + 1) * width], strict=True))
            for r in range(self.size)
        ]
        return decode(values[:HEADER])
