"""One compressor per family, one interface (the roles of GRACE: compressor,
memory, communicator).

A step (client/step.py) runs, per bucket:

    g_e = memory.compensate(key, g)                 # lossy families; dense ones send the residual too
    payload = compressor.compress(bucket, g_e, decision, transport, stats)
    memory.update(key, payload.sent)                # what was sent leaves the residual
    return compressor.communicate(payload, transport, stats)   # a future of the average, in g

`compress` does the local work and any round trip the family's compression
itself needs (AR-Topk's root indices, PowerSGD's shared P); `communicate`
launches the collective that carries the payload and decompresses into the
bucket as it arrives, never waiting for it. A compressor may keep state across
steps (PowerSGD's warm-started factors), saved by `state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from flexcomm.client.collectives import Future, Ring
from flexcomm.client.memory import ErrorFeedback
from flexcomm.client.stats import StepStats
from flexcomm.policy.types import Decision


@dataclass
class Bucket:
    """One flat gradient to average in place: a DDP bucket or the whole model.
    `shapes` are its tensors' shapes in order (PowerSGD views them as matrices)."""

    key: object
    g: torch.Tensor
    shapes: Sequence[torch.Size]
    step: int
    norm_e: torch.Tensor | None = None  # ||g_e||^2 (0-dim, on g's device) once a lossy step compensated it


@dataclass
class Payload:
    """What a compressor made of one bucket: what the collective carries (`data`,
    the compressor's own), and `sent`, how the residual learns what left (None
    for lossless families, which sent everything)."""

    bucket: Bucket
    decision: Decision
    data: Any
    sent: Callable[[ErrorFeedback], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Compressor(Protocol):
    family: str
    lossy: bool

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        """Local compression (and any round trip it needs); adds t_comp, t_sync,
        bytes_sent and the sent norm to `stats`."""

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        """Launch the collective; the future resolves to the bucket's gradient,
        now the group's average, once it arrived and was decompressed."""

    def settle(self) -> None:
        """Wait for any collective launched for a later step (VAR-Topk's root).
        Called at close: a collective still in flight when the interpreter
        finalises aborts the process from gloo's worker thread."""

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain data to checkpoint."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""


def nbytes(t: torch.Tensor) -> int:
    """The bytes of `t`'s values at its dtype's width (what a collective moves)."""
    return t.numel() * t.element_size()


def make_compressors(group_rank: int, selector: str, var_smoothing: float, seed: int = 0) -> dict[str, Compressor]:
    """One compressor of each family, for a rank of the group."""
    from flexcomm.client.compressors.bf16 import Bf16
    from flexcomm.client.compressors.dense import Dense
    from flexcomm.client.compressors.powersgd import PowerSgd
    from flexcomm.client.compressors.topk import TopK

    compressors: Sequence[Compressor] = (
        Dense(), Bf16(), PowerSgd(seed=seed),
        TopK(selector, var_smoothing=var_smoothing, seed=seed + group_rank),
    )
    return {c.family: c for c in compressors}
