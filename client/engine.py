"""Run one decision on one flat gradient: error feedback, Top-k, the collective.

`FlatSync.run(key, g, ...)` averages `g` (a bucket, or the whole model's
gradient) over the group in place and returns a future resolving to `g`. Each
`key` (a bucket index, or "global") has its own residual memory and its own
smoothed variance for VAR-Topk. Measurements go into the `StepStats` passed in.

Per-rank semantics of the sparse collectives (what the tests check by hand):
- ag_topk: each rank sends its own top-k of g_e = g + residual; the result is
  sum over ranks of their g_c / N.
- art_ring / art_tree: the root's top-k indices of its g_e; every rank's g_c is
  its own g_e at those indices; the result is sum of g_c / N. Root: rank
  step % N (star) or the rank with the largest smoothed variance of g_e (var).
Either way residual = g_e - g_c on every rank.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from flexcomm.client import collectives as coll
from flexcomm.client.compress import (
    ErrorFeedback,
    gains_at,
    k_for,
    make_selector,
    squared_norm,
)
from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    DENSE_RING,
    DENSE_TREE,
    ROOT_STAR,
)

INDEX_BYTES = 4


@dataclass
class StepStats:
    """What one step ran and measured on this rank (summed over its buckets).

    t_sync_s sums each bucket's time from launching its collective to its result
    (buckets may overlap); t_probe_s is the time spent reading the probe CRs'
    gains (rank 0, once per control interval), not counted in t_comp_s;
    bytes_sent is this rank's payload (values + indices it contributes), the
    message size M of the cost model.
    """

    step: int
    collective: str
    cr: float
    version: int
    roots: list[int] = field(default_factory=list)
    t_comp_s: float = 0.0
    t_sync_s: float = 0.0
    t_probe_s: float = 0.0
    bytes_sent: int = 0
    norm_e: float = 0.0
    norm_c: float = 0.0
    probes: list[tuple[dict[float, float], float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def gain(self) -> float:
        """||g_c||^2 / ||g_e||^2 over the whole step (1 when nothing was compressed)."""
        if self.norm_e <= 0.0:
            return 1.0
        return min(1.0, self.norm_c / self.norm_e)

    def add(self, *, t_comp: float = 0.0, t_sync: float = 0.0) -> None:
        # Called from collective callbacks too.
        with self._lock:
            self.t_comp_s += t_comp
            self.t_sync_s += t_sync


class FlatSync:
    """Error feedback + Top-k + collective for flat gradients, one memory per key."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        *,
        selector: str = "fast",
        var_smoothing: float = 0.9,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= var_smoothing < 1.0:
            raise ValueError(f"var_smoothing: must be in [0, 1), got {var_smoothing!r}")
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.select = make_selector(selector, seed=seed + self.rank)
        self.probe_select = make_selector(selector, seed=seed + self.rank + 7919)
        self.var_smoothing = var_smoothing
        self.tree = coll.TreeAllreduce(group)
        self.memory: dict[object, ErrorFeedback] = {}
        self.variance: dict[object, float] = {}
        # Residuals restored by load_state_dict, used when a gradient of that size appears.
        self.pending: dict[object, torch.Tensor] = {}

    def _memory(self, key: object, g: torch.Tensor) -> ErrorFeedback:
        ef = self.memory.get(key)
        if ef is None or ef.residual.numel() != g.numel() or ef.residual.dtype != g.dtype:
            ef = ErrorFeedback(g.numel(), g.dtype, g.device)
            restored = self.pending.pop(key, None)
            if restored is not None and restored.numel() == g.numel():
                ef.residual.copy_(restored)
                ef.dirty = True
            self.memory[key] = ef
        return ef

    def run(
        self,
        key: object,
        g: torch.Tensor,
        collective: str,
        cr: float,
        root: str,
        step: int,
        stats: StepStats,
        probe_crs: Sequence[float] = (),
    ) -> coll.Future:
        if collective in (DENSE_RING, DENSE_TREE):
            return self._dense(key, g, collective, stats, probe_crs)
        return self._sparse(key, g, collective, cr, root, step, stats, probe_crs)

    def _dense(self, key, g, collective, stats, probe_crs) -> coll.Future:
        ef = self.memory.get(key)
        if ef is not None and ef.dirty and ef.residual.numel() == g.numel():
            # Everything is sent this step, the residual included.
            g.add_(ef.residual)
            ef.flush()
        if probe_crs:
            self._probe(g, probe_crs, stats, squared_norm(g))
        stats.bytes_sent += g.numel() * g.element_size()
        t0 = time.perf_counter()
        if collective == DENSE_TREE:
            fut = coll.tree_allreduce_mean(g, self.tree)
            stats.add(t_sync=time.perf_counter() - t0)
            return fut

        return coll.ring_allreduce_mean(
            g, self.group, lambda t_end: stats.add(t_sync=t_end - t0), self.size
        )

    def _probe(self, g_e: torch.Tensor, probe_crs: Sequence[float], stats: StepStats,
               norm: float) -> None:
        t0 = time.perf_counter()
        stats.probes.append((gains_at(g_e, probe_crs, norm, self.probe_select), norm))
        stats.t_probe_s += time.perf_counter() - t0

    def _root(self, key, g_e: torch.Tensor, root: str, step: int, norm_e: float) -> int:
        if root == ROOT_STAR:
            return step % self.size
        n = g_e.numel()
        mean = float(g_e.sum(dtype=torch.float64)) / n
        var = max(0.0, norm_e / n - mean * mean)
        prev = self.variance.get(key)
        smoothed = var if prev is None else self.var_smoothing * prev + (1 - self.var_smoothing) * var
        self.variance[key] = smoothed
        return coll.agree_argmax(smoothed, self.group)

    def _sparse(self, key, g, collective, cr, root, step, stats, probe_crs) -> coll.Future:
        t0 = time.perf_counter()
        ef = self._memory(key, g)
        g_e = ef.compensate(g)
        norm_e = squared_norm(g_e)
        stats.norm_e += norm_e
        if probe_crs:
            probe_start = time.perf_counter()
            self._probe(g_e, probe_crs, stats, norm_e)
            t0 += time.perf_counter() - probe_start  # probing is not compression
        k = k_for(g.numel(), cr)
        value_bytes = k * g.element_size()
        if collective == AG_TOPK:
            indices = self.select(g_e, k)
            values = g_e[indices]
            ef.settle(indices)
            stats.norm_c += squared_norm(values)
            values.div_(self.size)
            stats.bytes_sent += value_bytes + k * INDEX_BYTES
            t1 = time.perf_counter()
            stats.add(t_comp=t1 - t0)
            return coll.ag_topk_mean(values, indices, g, self.group, _scatter_timer(stats, t1))
        if collective not in (ART_RING, ART_TREE):
            raise ValueError(f"collective: the client cannot run {collective!r}")
        tree = self.tree if collective == ART_TREE else None
        t1 = time.perf_counter()
        root_rank = self._root(key, g_e, root, step, norm_e)
        stats.roots.append(root_rank)
        t2 = time.perf_counter()
        if self.rank == root_rank:
            indices = self.select(g_e, k)
            stats.bytes_sent += k * INDEX_BYTES
        else:
            indices = torch.empty(k, dtype=torch.int32, device=g.device)
        t3 = time.perf_counter()
        coll.broadcast_indices(indices, root_rank, self.group, tree)
        t4 = time.perf_counter()
        values = g_e[indices]
        ef.settle(indices)
        stats.norm_c += squared_norm(values)
        values.div_(self.size)
        stats.bytes_sent += value_bytes
        t5 = time.perf_counter()
        stats.add(t_comp=(t1 - t0) + (t3 - t2) + (t5 - t4), t_sync=(t2 - t1) + (t4 - t3))
        return coll.ar_values_mean(
            values, indices, g, self.group, tree, _scatter_timer(stats, t5)
        )

    def state_dict(self) -> dict:
        return {
            "residuals": {k: ef.residual.clone() for k, ef in self.memory.items() if ef.dirty},
            "variance": dict(self.variance),
        }

    def load_state_dict(self, state: dict) -> None:
        self.memory.clear()
        self.pending = {k: v.clone() for k, v in state.get("residuals", {}).items()}
        self.variance = dict(state.get("variance", {}))


def _scatter_timer(stats: StepStats, t_launch: float):
    """Count launch -> results arrived as sync, and the scatter into place as compression."""

    def on_scatter(t_begin: float, t_end: float) -> None:
        stats.add(t_comp=t_end - t_begin, t_sync=t_begin - t_launch)

    return on_scatter
