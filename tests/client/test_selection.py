"""Top-k selectors: the fast one selects exactly what torch.topk does (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.selection import FastSelector, k_for, make_selector, select_exact


def heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(4) * 10


@pytest.mark.parametrize("n, cr", [(200_000, 0.1), (200_000, 0.01), (300_000, 0.001),
                                   (1_000, 0.05), (100_000, 0.5)])
def test_fast_selects_exactly_the_exact_topk(n, cr):
    g = heavy_tailed(n)
    k = k_for(n, cr)
    fast = FastSelector()
    idx = fast(g, k)
    assert idx.dtype == torch.int32 and idx.numel() == k
    assert set(idx.tolist()) == set(select_exact(g, k).tolist())
    assert fast.fallbacks == 0


def test_fast_falls_back_when_the_sample_misleads():
    # Only 100 nonzero entries, none of them likely sampled: the threshold is 0,
    # which admits everything; still exactly the top k.
    g = torch.zeros(500_000)
    g[torch.arange(100) * 4999] = torch.arange(1, 101, dtype=torch.float32)
    idx = FastSelector(sample_size=1024)(g, 50)
    assert sorted(idx.tolist()) == sorted((torch.arange(50, 100) * 4999).tolist())


def test_fast_fallback_counts_a_threshold_that_admits_too_few():
    g = heavy_tailed(200_000)
    fast = FastSelector(sample_size=1 << 18)
    fast._sample_threshold = lambda g, k: g.abs().max()  # pretend the sample lied
    idx = fast(g, 500)
    assert fast.fallbacks == 1
    assert set(idx.tolist()) == set(select_exact(g, 500).tolist())


@pytest.mark.parametrize("cr", [0.0, -0.1, 1.01, float("nan")])
def test_k_for_rejects_bad_cr(cr):
    with pytest.raises(ValueError, match=r"^cr:"):
        k_for(100, cr)


def test_k_for_rounds_and_keeps_at_least_one():
    assert k_for(1000, 0.01) == 10
    assert k_for(10, 0.001) == 1
    assert k_for(10, 1.0) == 10


def test_selectors_reject_unknown_names_and_non_flat_tensors():
    with pytest.raises(ValueError, match=r"^selector:"):
        make_selector("approx")
    with pytest.raises(ValueError, match=r"^gradient:"):
        select_exact(torch.zeros(3, 3), 1)


@pytest.mark.parametrize("n, k", [(2_000_000, 1_950_000), (300_000, 299_990), (50_000, 10)])
def test_keep_largest_is_exact(n, k):
    values = heavy_tailed(n, seed=5).abs()
    keep = FastSelector()._keep_largest(values, k)
    assert int(keep.sum()) == k
    assert float(values[keep].min()) >= float(values[~keep].max())


def test_keep_largest_falls_back_on_ties():
    values = torch.ones(100_000)
    keep = FastSelector()._keep_largest(values, 90_000)  # no band between equal bounds
    assert int(keep.sum()) == 90_000
