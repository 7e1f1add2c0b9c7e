"""Top-k selectors: the fast and the sync-free ones select exactly what torch.topk
does (no process group needed); the sync-free one decides on the device and,
when its candidates miss their window, still returns k distinct entries."""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.selection import (
    AutoSelector,
    FastSelector,
    SyncFreeSelector,
    k_for,
    make_selector,
    select_exact,
)


def heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(4) * 10


def missed(selector) -> int:
    return selector.fallbacks if isinstance(selector, FastSelector) else selector.misses


@pytest.mark.parametrize("make", [FastSelector, SyncFreeSelector], ids=["fast", "sync_free"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, cr", [(200_000, 0.1), (200_000, 0.01), (300_000, 0.001),
                                   (1_000, 0.05), (100_000, 0.5)])
def test_sampling_selectors_select_exactly_the_exact_topk(make, dtype, n, cr):
    g = heavy_tailed(n).to(dtype)
    k = k_for(n, cr)
    selector = make()
    idx = selector(g, k)
    assert idx.dtype == torch.int32 and idx.numel() == k
    if dtype == torch.float32:
        assert set(idx.tolist()) == set(select_exact(g, k).tolist())
    else:  # bf16 ties: any k of the tied magnitudes at the boundary are the top k
        kth = g.abs().float().topk(k).values[-1]
        assert float(g[idx.long()].abs().float().min()) >= float(kth)
        assert len(set(idx.tolist())) == k
    assert missed(selector) == 0


@pytest.mark.parametrize("make", [FastSelector, SyncFreeSelector], ids=["fast", "sync_free"])
def test_a_sample_of_zeros_still_gives_the_top_k(make):
    # Only 100 nonzero entries, none of them likely sampled: the sampled threshold
    # is 0; still exactly the top k (the sync-free one never takes zeros as candidates).
    g = torch.zeros(500_000)
    g[torch.arange(100) * 4999] = torch.arange(1, 101, dtype=torch.float32)
    idx = make(sample_size=1024)(g, 50)
    assert sorted(idx.tolist()) == sorted((torch.arange(50, 100) * 4999).tolist())


def test_sync_free_with_too_few_candidates_sends_them_all_and_others():
    # 100 nonzeros and k = 300: every nonzero and 200 zeros (a top k: ties at 0)
    g = torch.zeros(500_000)
    nonzero = torch.arange(100) * 4999 + 7
    g[nonzero] = torch.arange(1, 101, dtype=torch.float32)
    selector = SyncFreeSelector(sample_size=1024)
    idx = selector(g, 300).tolist()
    assert len(set(idx)) == 300 and set(nonzero.tolist()) <= set(idx)
    assert float(g[list(set(idx) - set(nonzero.tolist()))].abs().max()) == 0.0
    assert selector.misses == 1


def test_sync_free_with_too_many_candidates_still_sends_k_distinct_entries():
    # Every entry ties at the threshold: the candidate buffer overflows.
    selector = SyncFreeSelector()
    idx = selector(torch.ones(200_000), 2_000).tolist()
    assert len(set(idx)) == 2_000 and min(idx) >= 0 and max(idx) < 200_000
    assert selector.misses == 1


def test_auto_picks_by_device_and_its_default_is_everywhere():
    auto = make_selector("auto")
    assert isinstance(auto, AutoSelector)
    g = heavy_tailed(200_000)
    assert set(auto(g, 2_000).tolist()) == set(select_exact(g, 2_000).tolist())
    assert auto.host.calls == 1 and auto.device.calls == 0  # CPU tensors: the fast selector
    assert auto.calls == 1
    assert auto.fallbacks == 0


def test_auto_samples_on_the_host_only_where_it_beats_torch_topk():
    auto = make_selector("auto")
    sampled = []
    auto.host._sample_threshold = lambda g, k: sampled.append(g.numel())  # None: take torch.topk
    for n in (800_000, 1 << 22):  # the lm's whole gradient; where sampling starts to pay
        g = heavy_tailed(n)
        assert set(auto(g, n // 100).tolist()) == set(select_exact(g, n // 100).tolist())
    assert sampled == [1 << 22]


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
    with pytest.raises(ValueError, match=r"^selector: unknown selector 'approx' \(one of auto, exact, fast, sync_free"):
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


def test_indices_are_as_wide_as_the_cost_model_counts_them():
    from flexcomm.policy.costmodel import ModelForms

    idx = make_selector("auto")(heavy_tailed(200_000), 100)
    assert idx.element_size() == ModelForms().index_bytes == 4
