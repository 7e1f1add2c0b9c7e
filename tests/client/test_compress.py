"""Top-k selectors, error feedback and gains (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.compress import (
    ErrorFeedback,
    FastSelector,
    gains_at,
    k_for,
    make_selector,
    merge_masses,
    select_exact,
    topk_masses,
)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("selector", ["exact", "fast"])
def test_error_feedback_invariant_for_each_dtype(dtype, selector):
    n, k = 100_000, 1_000
    ef = ErrorFeedback(n, dtype)
    select = make_selector(selector)
    for step in range(3):
        g = heavy_tailed(n, seed=step).to(dtype)
        g_e_before = g + ef.residual
        g_e = ef.compensate(g)
        assert torch.equal(g_e, g_e_before)
        idx = select(g_e, k)
        values = g_e[idx].clone()
        ef.settle(idx)
        g_c = torch.zeros(n, dtype=dtype)
        g_c[idx.long()] = values
        assert torch.equal(g_c + ef.residual, g_e_before)  # exact in every dtype
        assert int((ef.residual[idx.long()] != 0).sum()) == 0


def test_residual_starts_at_zero_and_flush_clears_it():
    ef = ErrorFeedback(10, torch.float32)
    assert torch.equal(ef.residual, torch.zeros(10)) and not ef.dirty
    ef.compensate(torch.ones(10))
    ef.settle(torch.tensor([0], dtype=torch.int32))
    assert ef.dirty and float(ef.residual.sum()) == 9.0
    ef.flush()
    assert not ef.dirty and float(ef.residual.abs().sum()) == 0.0


def test_gains_at_equal_a_full_sort():
    g = heavy_tailed(150_000, seed=3)
    crs = [0.1, 0.033, 0.011, 0.004, 0.001]
    sq = torch.sort(g.double().pow(2), descending=True).values
    total = float(sq.sum())
    got = gains_at(g, crs)
    for c in crs:
        expected = float(sq[: k_for(g.numel(), c)].sum()) / total
        assert got[c] == pytest.approx(expected, rel=1e-5)  # ||g_e||^2 summed in fp32
    assert got[0.1] > got[0.011] > got[0.001]


def test_topk_masses_and_merging_buckets():
    a, b = heavy_tailed(5_000, 1), heavy_tailed(7_000, 2)
    ga, gb = gains_at(a, [0.1]), gains_at(b, [0.1])
    na, nb = float(a.double().pow(2).sum()), float(b.double().pow(2).sum())
    merged = merge_masses([(ga, na), (gb, nb)])
    mass = topk_masses(a, [500])[0] + topk_masses(b, [700])[0]
    assert merged[0.1] == pytest.approx(mass / (na + nb), rel=1e-5)


def test_gains_of_a_zero_gradient_are_one():
    assert gains_at(torch.zeros(100), [0.1]) == {0.1: 1.0}


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
    with pytest.raises(ValueError, match=r"^gradient:"):
        ErrorFeedback(4, torch.float32).compensate(torch.zeros(5))


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
