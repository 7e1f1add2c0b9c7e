"""topk: the k = cM entries of largest magnitude of the compensated gradient, with
their int32 indices.

- ag_topk: each rank sends its own top-k of g_e, values and indices packed in one
  AllGather (every collective call costs gloo a few thread handoffs, which on a
  busy CPU is most of a small AG-Topk's time); the result is the scatter-add of
  every rank's values / N.
- art_ring / art_tree: the root's top-k indices of its g_e are broadcast; every
  rank all-reduces its own g_e at those indices; the result is their mean at the
  indices, zero elsewhere. Root: rank step % N (star) or the rank with the
  largest smoothed variance of g_e (var, agreed by one tiny all-reduce).

Either way the residual keeps g_e off the indices this rank sent.
"""

from __future__ import annotations

from typing import Any

import torch

from flexcomm.client.collectives import Future, Ring, agree_argmax
from flexcomm.client.compressors import Bucket, Payload
from flexcomm.client.gains import squared_norm
from flexcomm.client.selection import k_for, make_selector
from flexcomm.client.stats import StepStats, sync_timer, timed
from flexcomm.policy.types import AG_TOPK, ROOT_STAR, TOPK, Decision

INDEX_BYTES = 4


class TopK:
    family = TOPK
    lossy = True

    def __init__(self, selector: str = "fast", *, var_smoothing: float = 0.9, seed: int = 0) -> None:
        if not 0.0 <= var_smoothing < 1.0:
            raise ValueError(f"var_smoothing: must be in [0, 1), got {var_smoothing!r}")
        self.select = make_selector(selector, seed=seed)
        self.var_smoothing = var_smoothing
        self.variance: dict[object, float] = {}

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        k = k_for(g_e.numel(), decision.param)
        if decision.collective == AG_TOPK:
            with timed(stats, "t_comp_s"):
                indices = self.select(g_e, k)
            stats.bytes_sent += INDEX_BYTES * k
        else:
            indices = self._root_indices(bucket, g_e, decision, transport, stats, k)
        with timed(stats, "t_comp_s"):
            values = g_e[indices]
        stats.norm_c += squared_norm(values)
        stats.bytes_sent += k * values.element_size()
        return Payload(bucket, decision, (values, indices), sent=lambda ef: ef.sent_at(indices))

    def _root_indices(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                      stats: StepStats, k: int) -> torch.Tensor:
        """AR-Topk's first half: everyone receives the root's indices (blocking)."""
        with timed(stats, "t_sync_s"):
            root = self._root(bucket, g_e, decision.root, transport)
        stats.roots.append(root)
        if transport.rank == root:
            with timed(stats, "t_comp_s"):
                indices = self.select(g_e, k)
            stats.bytes_sent += INDEX_BYTES * k
        else:
            indices = torch.empty(k, dtype=torch.int32, device=g_e.device)
        with timed(stats, "t_sync_s"):
            transport.broadcast(indices, root)
        return indices

    def _root(self, bucket: Bucket, g_e: torch.Tensor, root: str, transport: Ring) -> int:
        if root == ROOT_STAR:
            return bucket.step % transport.size
        n = g_e.numel()
        mean = float(g_e.sum(dtype=torch.float64)) / n
        var = max(0.0, bucket.norm_e / n - mean * mean)
        prev = self.variance.get(bucket.key)
        smoothed = var if prev is None else self.var_smoothing * prev + (1 - self.var_smoothing) * var
        self.variance[bucket.key] = smoothed
        return agree_argmax(smoothed, transport.group)

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        values, indices = payload.data
        out = payload.bucket.g
        record_sync = sync_timer(stats)
        if payload.decision.collective == AG_TOPK:
            return self._allgather(values, indices, out, transport, stats, record_sync)

        def scatter(summed: torch.Tensor) -> torch.Tensor:
            record_sync(summed)
            with timed(stats, "t_comp_s"):
                out.zero_()
                out[indices] = summed
            return out

        return transport.allreduce_mean(values, scatter)

    def _allgather(self, values, indices, out, transport: Ring, stats: StepStats, record_sync) -> Future:
        values = values.div_(transport.size)
        value_bytes = values.numel() * values.element_size()
        packed = torch.cat([values.reshape(-1).view(torch.uint8), indices.reshape(-1).view(torch.uint8)])

        def scatter(gathered: torch.Tensor) -> torch.Tensor:
            record_sync(gathered)
            with timed(stats, "t_comp_s"):
                per_rank = gathered.view(transport.size, -1)
                all_values = per_rank[:, :value_bytes].contiguous().view(values.dtype).reshape(-1)
                all_indices = per_rank[:, value_bytes:].contiguous().view(indices.dtype).reshape(-1)
                out.zero_()
                out.index_add_(0, all_indices, all_values)
            return out

        return transport.allgather(packed, scatter)

    def state_dict(self) -> dict[str, Any]:
        return {"variance": dict(self.variance)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.variance = dict(state.get("variance", {}))
