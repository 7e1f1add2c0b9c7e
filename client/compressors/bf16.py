"""bf16: the gradient as bfloat16 on the wire (2 bytes a value), as PyTorch's
`bf16_compress_hook` sends it: cast, divide by N, all-reduce, cast back into
the bucket. Nothing is kept for error feedback: the rounding (8 bits of
mantissa) is what PyTorch's hook loses too, and the residual of an earlier
lossy step is sent with this one.
"""

from __future__ import annotations

from typing import Any

import torch

from flexcomm.client.collectives import Future, Ring
from flexcomm.client.compressors import Bucket, Payload, nbytes
from flexcomm.client.stats import StepStats, sync_timer, timed
from flexcomm.policy.types import BF16, Decision


class Bf16:
    family = BF16
    lossy = False

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        with timed(stats, "t_comp_s", g_e):
            wire = g_e.to(torch.bfloat16)
        stats.bytes_sent += nbytes(wire)
        return Payload(bucket, decision, wire)

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        out = payload.bucket.g
        record_sync = sync_timer(stats, out)

        def decompress(wire: torch.Tensor) -> torch.Tensor:
            record_sync(wire)
            with timed(stats, "t_comp_s", out):
                out.copy_(wire)
            return out

        return transport.allreduce_mean(payload.data, decompress)

    def settle(self) -> None:
        pass  # nothing is launched ahead

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
