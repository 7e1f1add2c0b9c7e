"""dense: the gradient's own values, all-reduced over the ring or the tree.

On dense_ring with nothing in the residual this is bit-identical to PyTorch's
`allreduce_hook`: divide by N, then sum.
"""

from __future__ import annotations

from typing import Any

import torch

from flexcomm.client.collectives import Future, Ring
from flexcomm.client.compressors import Bucket, Payload, nbytes
from flexcomm.client.stats import StepStats, sync_timer
from flexcomm.policy.types import DENSE, Decision


class Dense:
    family = DENSE
    lossy = False

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        stats.bytes_sent += nbytes(g_e)
        return Payload(bucket, decision, g_e)

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        return transport.allreduce_mean(payload.data, sync_timer(stats, payload.data))

    def settle(self) -> None:
        pass  # nothing is launched ahead

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
