"""topk: the k = cM entries of largest magnitude of the compensated gradient, with
their int32 indices.

- ag_topk: each rank sends its own top-k of g_e, values and indices packed in one
  AllGather (every collective call costs gloo a few thread handoffs, which on a
  busy CPU is most of a small AG-Topk's time); the result is the scatter-add of
  every rank's values / N.
- art_ring / art_tree: the root's top-k indices of its g_e are broadcast; every
  rank all-reduces its own g_e at those indices; the result is their mean at the
  indices, zero elsewhere. Root: rank step % N (star) or the rank with the
  largest smoothed variance of g_e up to the bucket's previous step (var: one
  tiny all-reduce per step, launched with the step and read at the next, so no
  rank waits for it and, on a GPU, nothing is read back from the device in the
  step; until one was agreed, the root is star's).

Either way the residual keeps g_e off the indices this rank sent. Values keep
the bucket's dtype; indices are int32 (`selection.INDEX_DTYPE`).
"""

from __future__ import annotations

from typing import Any

import torch

from flexcomm.client.collectives import ArgmaxAgreement, Future, Ring
from flexcomm.client.compressors import Bucket, Payload, nbytes
from flexcomm.client.gains import squared_norm
from flexcomm.client.selection import INDEX_DTYPE, k_for, make_selector
from flexcomm.client.stats import StepStats, sync_timer, timed
from flexcomm.policy.types import AG_TOPK, ROOT_STAR, TOPK, Decision


class TopK:
    family = TOPK
    lossy = True

    def __init__(self, selector: str = "auto", *, var_smoothing: float = 0.9, seed: int = 0) -> None:
        if not 0.0 <= var_smoothing < 1.0:
            raise ValueError(f"var_smoothing: must be in [0, 1), got {var_smoothing!r}")
        self.select = make_selector(selector, seed=seed)
        self.var_smoothing = var_smoothing
        self.variance: dict[object, torch.Tensor] = {}  # smoothed, a 0-dim tensor per bucket
        self.agreed: dict[object, ArgmaxAgreement] = {}  # VAR's root for the bucket's next step

    def compress(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                 stats: StepStats) -> Payload:
        k = k_for(g_e.numel(), decision.param)
        if decision.collective == AG_TOPK:
            with timed(stats, "t_comp_s", g_e):
                indices = self.select(g_e, k)
            stats.bytes_sent += nbytes(indices)
        else:
            indices = self._root_indices(bucket, g_e, decision, transport, stats, k)
        with timed(stats, "t_comp_s", g_e):
            values = g_e[indices]
        stats.add_norms(c=squared_norm(values))
        stats.bytes_sent += nbytes(values)
        return Payload(bucket, decision, (values, indices), sent=lambda ef: ef.sent_at(indices))

    def _root_indices(self, bucket: Bucket, g_e: torch.Tensor, decision: Decision, transport: Ring,
                      stats: StepStats, k: int) -> torch.Tensor:
        """AR-Topk's first half: everyone receives the root's indices (on gloo, blocking)."""
        root = self._root(bucket, g_e, decision.root, transport)
        stats.roots.append(root)
        if transport.rank == root:
            with timed(stats, "t_comp_s", g_e):
                indices = self.select(g_e, k)
            stats.bytes_sent += nbytes(indices)
        else:
            indices = torch.empty(k, dtype=INDEX_DTYPE, device=g_e.device)
        with timed(stats, "t_sync_s", g_e):
            transport.broadcast(indices, root)
        return indices

    def _root(self, bucket: Bucket, g_e: torch.Tensor, root: str, transport: Ring) -> int:
        star = bucket.step % transport.size
        if root == ROOT_STAR:
            return star
        last = self.agreed.get(bucket.key)
        self.agreed[bucket.key] = ArgmaxAgreement(self._smoothed_variance(bucket, g_e), transport.group)
        return star if last is None else last.result()

    def _smoothed_variance(self, bucket: Bucket, g_e: torch.Tensor) -> torch.Tensor:
        """The bucket's EWMA of var(g_e), updated with this step (a 0-dim float64 tensor)."""
        n = g_e.numel()
        norm = bucket.norm_e if bucket.norm_e is not None else squared_norm(g_e)
        mean = g_e.sum(dtype=torch.float64) / n
        var = (norm / n - mean * mean).clamp(min=0.0)
        prev = self.variance.get(bucket.key)
        smoothed = var if prev is None else self.var_smoothing * prev + (1 - self.var_smoothing) * var
        self.variance[bucket.key] = smoothed
        return smoothed

    def communicate(self, payload: Payload, transport: Ring, stats: StepStats) -> Future:
        values, indices = payload.data
        out = payload.bucket.g
        record_sync = sync_timer(stats, values)
        if payload.decision.collective == AG_TOPK:
            return self._allgather(values, indices, out, transport, stats, record_sync)

        def scatter(summed: torch.Tensor) -> torch.Tensor:
            record_sync(summed)
            with timed(stats, "t_comp_s", out):
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
            with timed(stats, "t_comp_s", out):
                per_rank = gathered.view(transport.size, -1)
                rank_values = per_rank[:, :value_bytes].contiguous().view(values.dtype)
                rank_indices = per_rank[:, value_bytes:].contiguous().view(indices.dtype)
                out.zero_()
                # One add per rank, in rank order: a rank's indices are distinct, so no
                # add races (one add of every rank's would on a GPU: atomics in any
                # order, and the ranks' parameters would drift apart bit by bit).
                for part_values, part_indices in zip(rank_values, rank_indices, strict=True):
                    out.index_add_(0, part_indices, part_values)
            return out

        return transport.allgather(packed, scatter)

    def settle(self) -> None:
        for agreement in self.agreed.values():
            agreement.result()

    def state_dict(self) -> dict[str, Any]:
        return {"variance": {key: v.clone() for key, v in self.variance.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.variance = {key: torch.as_tensor(v, dtype=torch.float64) for key, v in state.get("variance", {}).items()}
        self.agreed.clear()
