"""Nothing in a bucket's step reads a tensor back on the host (what waits for a GPU):
every family and collective, with the probes' gains, on 2 real gloo ranks.

This machine has no GPU, so the check is the Python-level net of
`client.syncguard.no_host_sync` (int(), float(), .item(), nonzero(), boolean
masks, ...) on CPU tensors, with the selector a GPU gets by default
("sync_free"); `make gpu-check` adds CUDA's own sync detection on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.selection import FastSelector, SyncFreeSelector, k_for
from flexcomm.client.syncguard import HostSyncError, no_host_sync
from support.client_ranks import run_ranks

SHAPES = [torch.Size((300, 200)), torch.Size((200,)), torch.Size((40, 30))]
PLAN = [  # (family, param, collective, root)
    ("dense", 0, "dense_ring", "star"), ("dense", 0, "dense_tree", "star"),
    ("bf16", 0, "dense_ring", "star"), ("bf16", 0, "dense_tree", "star"),
    ("powersgd", 1, "dense_ring", "star"), ("powersgd", 4, "dense_ring", "star"),
    ("topk", 0.01, "ag_topk", "star"), ("topk", 0.01, "art_ring", "star"), ("topk", 0.01, "art_ring", "var"),
    ("topk", 0.05, "art_tree", "star"), ("topk", 0.05, "art_tree", "var"),
]
PROBES = ("topk:0.1", "topk:0.01", "powersgd:1", "powersgd:4")


def steps_without_host_reads(rank: int, world: int) -> dict:
    from flexcomm.client.compressors import Bucket
    from flexcomm.client.stats import StepStats
    from flexcomm.client.step import GradientStep
    from flexcomm.policy.types import Compression, Decision

    gradient_step = GradientStep(None, selector="sync_free")
    numel = sum(s.numel() for s in SHAPES)
    probes = [Compression.parse(p) for p in PROBES]
    ran, gains = [], []
    for step in range(2 * len(PLAN)):
        family, param, collective, root = PLAN[step % len(PLAN)]
        g = torch.randn(numel, generator=torch.Generator().manual_seed(100 * rank + step))
        stats = StepStats(step, family, param, collective, 1)
        with no_host_sync():
            fut = gradient_step.run(Bucket("b", g, SHAPES, step), Decision(family, param, collective, root=root),
                                    stats, probes if rank == 0 else ())
        fut.wait()
        ran.append((family, param, collective, root))
        gains.append([sorted(g) for g, _ in stats.probes] if stats.resolve() else None)
    return {"ran": ran, "gains": gains}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_no_family_or_collective_reads_the_device_in_a_step():
    per_rank = run_ranks(2, "client/test_host_sync.py:steps_without_host_reads", timeout=100)
    for res in per_rank:
        assert len(res["ran"]) == 2 * len(PLAN)  # every step ran inside the guard
    # The probes' gains were read afterwards, off the step.
    assert all(g == [sorted(PROBES)] for g in per_rank[0]["gains"])


def test_the_guard_catches_host_reads():
    g = torch.randn(200_000)
    k = k_for(g.numel(), 0.01)
    with no_host_sync():
        SyncFreeSelector()(g, k)
    with no_host_sync():
        g.index_put_((torch.tensor([1, 2]),), torch.zeros(()))
    for read in (lambda: FastSelector()(g, k), lambda: float(g.sum()), lambda: g[g > 0], lambda: g.nonzero(),
                 lambda: g.sum().item(), lambda: int(g.argmax()), lambda: g.__setitem__(torch.tensor([1, 2]), 0)):
        with pytest.raises(HostSyncError, match=r"^host sync: "), no_host_sync():
            read()
