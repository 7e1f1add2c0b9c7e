"""powersgd: rank-r factors of each matrix of the compensated gradient (Vogels et
al., NeurIPS 2019), with PyTorch's own math (`powerSGD_hook`): each tensor of two
or more dimensions is viewed as M (shape[0] x the rest); those PowerSGD's rule
compresses at r (`policy.costmodel.powersgd_compresses`, its min_compression_rate
2) become P = M Q, with Q warm-started from the last step and orthogonalised by
PyTorch's `_orthogonalize`; everything else is sent dense.

Round 1 (in `compress`, blocking): all-reduce P, orthogonalise it. Round 2 (in
`communicate`, asynchronous): all-reduce Q = M^T P with the dense tensors, then
write P Q^T / N (and the dense mean) into the bucket.

Where PyTorch's hook keeps its own residual (g_e less the group's mean
approximation), this one hands the shared memory the local projection
P P^T M = P Q^T of this rank's M (what this rank contributes): the two residuals
differ per rank and agree in their sum over ranks. Its own loop, rather than
calling `powerSGD_hook`, is what lets it time compression apart from the two
all-reduces, share one residual with Top-k, read the sent norm ||Q||^2 for the
gain, and keep Q per (bucket, rank) so a switch of rank and back loses no warm start.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from flexcomm.client.collectives import Future, Ring
from flexcomm.client.compressors import Bucket, Payload, nbytes
from flexcomm.client.device import to_device
from flexcomm.client.gains import ORTHOGONALIZE_EPSILON, WarmFactors, squared_norm
from flexcomm.client.memory import ErrorFeedback
from flexcomm.client.stats import StepStats, sync_timer, timed
from flexcomm.policy.costmodel import powersgd_compresses
from flexcomm.policy.types import POWERSGD, Decision


@dataclass
class _Split:
    """A bucket's tensors as PowerSGD sees them at one rank: views of g_e."""

    matrices: list[torch.Tensor]  # n x m views
    ranks: list[int]
    dense: list[torch.Tensor]  # flat views


def split(g: torch.Tensor, shapes, rank: int) -> _Split:
    matrices, ranks, dense = [], [], []
    offset = 0
    for shape in shapes:
        numel = int(torch.Size(shape).numel())
        part = g[offset : offset + numel]
        offset += numel
        r = powersgd_compresses(shape[0], numel // shape[0], rank) if len(shape) >= 2 and numel else 0
        if r:
            matrices.append(part.view(shape[0], -1))
            ranks.append(r)
        else:
            dense.append(part)
    if offset < g.numel():
        dense.append(g[offset:])
    return _Split(matrices, ranks, dense)


class PowerSgd:
    family = POWERSGD
    lossy = True

    def __init__(self, seed: int = 0) -> None:
        # Every rank starts Q from the same seed: PowerSGD's Q is shared state.
        self.seed = seed
        self.warm = WarmFactors()  # the group's Q per (bucket, rank)

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        rank = int(decision.param)
        parts = split(g_e, bucket.shapes, rank)
        with timed(stats, "t_comp_s", g_e):
            qs = self._warm_q(bucket.key, rank, parts, g_e)
            ps = [m @ q for m, q in zip(parts.matrices, qs, strict=True)]
            flat_p = torch.cat([p.reshape(-1) for p in ps]) if ps else g_e.new_empty(0)
        with timed(stats, "t_sync_s", g_e):
            transport.allreduce_mean(flat_p).wait()  # round 1; its scale does not matter
        with timed(stats, "t_comp_s", g_e):
            ps = _views(flat_p, [p.shape for p in ps])
            for p in ps:
                _orthogonalize(p.unsqueeze(0), ORTHOGONALIZE_EPSILON)
            local_qs = [m.T @ p for m, p in zip(parts.matrices, ps, strict=True)]
            wire = torch.cat([q.reshape(-1) for q in local_qs] + [d.reshape(-1) for d in parts.dense])
        stats.add_norms(c=squared_norm(wire))  # every local Q and the dense tensors: what this rank sends
        stats.bytes_sent += nbytes(flat_p) + nbytes(wire)

        def sent(ef: ErrorFeedback) -> None:
            # The residual buffer is g_e: take off the local projection P Q^T of each
            # matrix, and the dense tensors whole.
            mine = split(ef.residual, bucket.shapes, rank)
            for m, p, q in zip(mine.matrices, ps, local_qs, strict=True):
                m.sub_(p @ q.T)
            for d in mine.dense:
                d.zero_()

        return Payload(bucket, decision, wire, sent=sent, extra={"ps": ps, "q_shapes": [q.shape for q in local_qs],
                                                                 "rank": rank})

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        out_parts = split(payload.bucket.g, payload.bucket.shapes, payload.extra["rank"])
        ps, q_shapes = payload.extra["ps"], payload.extra["q_shapes"]
        q_numel = sum(s.numel() for s in q_shapes)
        record_sync = sync_timer(stats, payload.data)
        key, rank = payload.bucket.key, payload.extra["rank"]

        def decompress(mean: torch.Tensor) -> torch.Tensor:
            record_sync(mean)
            with timed(stats, "t_comp_s", mean):
                qs = _views(mean[:q_numel], q_shapes)
                for out, p, q in zip(out_parts.matrices, ps, qs, strict=True):
                    torch.matmul(p, q.T, out=out)
                offset = q_numel
                for out in out_parts.dense:
                    out.copy_(mean[offset : offset + out.numel()])
                    offset += out.numel()
                self._keep_q(key, rank, qs)  # the group's Q warm-starts the next step
            return payload.bucket.g

        return transport.allreduce_mean(payload.data, decompress)

    def _warm_q(self, key: object, rank: int, parts: _Split, like: torch.Tensor) -> list[torch.Tensor]:
        """Last step's Q for (key, rank), orthogonalised (PowerSGD's warm start), or
        a seeded random one when there is none or the bucket changed."""
        shapes = [torch.Size((m.shape[1], r)) for m, r in zip(parts.matrices, parts.ranks, strict=True)]
        kept = self.warm.get((key, rank), sum(s.numel() for s in shapes), like.dtype, like.device)
        if kept is not None:
            qs = [q.clone() for q in _views(kept, shapes)]
        else:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + _stable(key) * 1031 + rank)
            drawn = [torch.randn(s, generator=gen, dtype=torch.float32) for s in shapes]  # the same on any device
            qs = [to_device(q, like.device, like.dtype) for q in drawn]
        for q in qs:
            _orthogonalize(q.unsqueeze(0), ORTHOGONALIZE_EPSILON)
        return qs

    def _keep_q(self, key: object, rank: int, qs: list[torch.Tensor]) -> None:
        if qs:
            self.warm.keep((key, rank), torch.cat([q.reshape(-1) for q in qs]))

    def settle(self) -> None:
        pass  # nothing is launched ahead

    def state_dict(self) -> dict[str, Any]:
        return self.warm.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.warm.load_state_dict(state)


def _views(flat: torch.Tensor, shapes) -> list[torch.Tensor]:
    out, offset = [], 0
    for s in shapes:
        n = torch.Size(s).numel()
        out.append(flat[offset : offset + n].view(s))
        offset += n
    return out


def _stable(key: object) -> int:
    """A hash of a bucket key that is the same on every rank and run."""
    return key if isinstance(key, int) else zlib.crc32(str(key).encode())
