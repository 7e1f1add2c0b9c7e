"""One step of one bucket: compensate, compress, update memory, communicate.

`GradientStep.run(bucket, decision, stats, probes)` averages the bucket's flat
gradient over the group in place and returns a future resolving to it:

    g_e = memory.compensate(key, g)       # lossy families (dense ones send the residual too)
    payload = compressor.compress(...)    # client/compressors/<family>.py
    memory.update(key, payload.sent)      # what left this rank leaves the residual
    return compressor.communicate(...)    # the collective's transport (client/collectives.py)

The decision is passed whole; the compressor is its family's, the transport its
collective's. On the steps the controller asks for, the gains of the probed
compressions are read off g_e before it is compressed (rank 0).

On a GPU nothing here reads a number back from the device: norms, gains and
times are device tensors and events that reach the step's statistics later
(client/stats.py), and the default selector on large device tensors is the radix
select (client/radix.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.collectives import Future, Ring, Tree
from flexcomm.client.compressors import Bucket, make_compressors
from flexcomm.client.device import Generators
from flexcomm.client.gains import WarmFactors, probe_gains, squared_norm
from flexcomm.client.memory import Memory
from flexcomm.client.selection import make_selector
from flexcomm.client.stats import StepStats, timed
from flexcomm.policy.types import ART_TREE, DENSE_TREE, Compression, Decision

TREE_COLLECTIVES = frozenset({DENSE_TREE, ART_TREE})


class GradientStep:
    """The compressors, the shared memory and the transports of one job."""

    def __init__(self, group: dist.ProcessGroup | None, *, selector: str = "auto", var_smoothing: float = 0.9,
                 seed: int = 0) -> None:
        self.group = group
        rank = dist.get_rank(group)
        self.compressors = make_compressors(rank, selector, var_smoothing, seed)
        self.memory = Memory()
        self.ring = Ring(group)
        self.tree = Tree(group)
        self.probe_select = make_selector(selector, seed=seed + rank + 7919)
        self.probe_generators = Generators(seed + 104729)
        self.probe_factors = WarmFactors()  # PowerSGD probes' warm start, per bucket, matrix and rank

    def transport(self, collective: str) -> Ring:
        return self.tree if collective in TREE_COLLECTIVES else self.ring

    def run(self, bucket: Bucket, decision: Decision, stats: StepStats,
            probes: Sequence[Compression] = ()) -> Future:
        compressor = self.compressors[decision.family]
        if probes:  # the critical-regime signal, read before any residual joins g
            stats.add_norms(g=squared_norm(bucket.g))
        g_e = self._compensate(bucket, compressor.lossy, stats)
        if probes:
            self._probe(bucket, g_e, probes, stats)
        transport = self.transport(decision.collective)
        payload = compressor.compress(bucket, g_e, decision, transport, stats)
        self.memory.update(bucket.key, payload.sent)
        return compressor.communicate(payload, transport, stats)

    def _compensate(self, bucket: Bucket, lossy: bool, stats: StepStats) -> torch.Tensor:
        """g_e for a lossy family; for a lossless one the residual joins g and is sent."""
        if not lossy:
            self.memory.send_all_into(bucket.key, bucket.g)
            return bucket.g
        g_e = self.memory.compensate(bucket.key, bucket.g)
        bucket.norm_e = squared_norm(g_e)
        stats.add_norms(e=bucket.norm_e)
        return g_e

    def _probe(self, bucket: Bucket, g_e: torch.Tensor, probes: Sequence[Compression], stats: StepStats) -> None:
        with timed(stats, "t_probe_s", g_e):
            norm = bucket.norm_e if bucket.norm_e is not None else squared_norm(g_e)
            stats.add_probe(probe_gains(g_e, bucket.shapes, probes, norm, self.probe_select,
                                        self.probe_generators.on(g_e.device), self.probe_factors, bucket.key))

    def settle(self) -> None:
        """Wait for the collectives the compressors launched ahead of a step."""
        for compressor in self.compressors.values():
            compressor.settle()

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict(),
                "compressors": {family: c.state_dict() for family, c in self.compressors.items()},
                "probe_factors": self.probe_factors.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory.load_state_dict(state.get("memory", {}))
        for family, saved in state.get("compressors", {}).items():
            self.compressors[family].load_state_dict(saved)
        self.probe_factors.load_state_dict(state.get("probe_factors", {}))
