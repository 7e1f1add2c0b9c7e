"""Gains of every probed compression against brute force: Top-k against a full
sort, PowerSGD against one warm-started iteration and the exact singular values
(no process group needed)."""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.gains import (
    WarmFactors,
    merge_masses,
    powersgd_mass,
    probe_gains,
    squared_norm,
    topk_masses,
)
from flexcomm.client.selection import FastSelector, k_for
from flexcomm.policy.types import Compression

TOPK = [Compression("topk", c) for c in (0.1, 0.033, 0.011, 0.004, 0.001)]


def heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(4) * 10


def gains(g, probes, shapes=()):
    generator = torch.Generator().manual_seed(1)
    gains, _norm = probe_gains(g, shapes or [g.shape], probes, squared_norm(g), FastSelector(), generator).get()
    return gains


def test_topk_gains_equal_a_full_sort():
    g = heavy_tailed(150_000, seed=3)
    sq = torch.sort(g.double().pow(2), descending=True).values
    total = float(sq.sum())
    got = gains(g, TOPK)
    for c in TOPK:
        expected = float(sq[: k_for(g.numel(), c.param)].sum()) / total
        assert got[c.name] == pytest.approx(expected, rel=1e-5)  # ||g_e||^2 summed in fp32
    assert got["topk:0.1"] > got["topk:0.011"] > got["topk:0.001"]


def low_rank_gradient():
    """A 200 x 120 matrix of rank 3 plus noise, a 12-value bias, a 4 x 4 matrix
    PowerSGD sends dense at every rank (its factors would not save enough)."""
    gen = torch.Generator().manual_seed(0)
    low = torch.randn(200, 3, generator=gen) @ torch.randn(3, 120, generator=gen)
    m = low + 0.05 * torch.randn(200, 120, generator=gen)
    bias, small = torch.randn(12, generator=gen), torch.randn(4, 4, generator=gen)
    g = torch.cat([m.reshape(-1), bias, small.reshape(-1)])
    shapes = [torch.Size((200, 120)), torch.Size((12,)), torch.Size((4, 4))]
    return g, m, float(bias.pow(2).sum() + small.pow(2).sum()), shapes


def test_powersgd_gains_are_what_one_warm_iteration_sends_and_dense_parts_whole():
    g, m, rest, shapes = low_rank_gradient()
    s2 = torch.linalg.svdvals(m.double()).pow(2)
    total = float(g.double().pow(2).sum())
    probes = [Compression("powersgd", r) for r in (1, 2, 4)]
    warm, generator = WarmFactors(), torch.Generator().manual_seed(1)
    readings = [probe_gains(g, shapes, probes, squared_norm(g), FastSelector(), generator, warm, "bucket").get()[0]
                for _ in range(40)]
    for r in (1, 2, 4):
        best = (float(s2[:r].sum()) + rest) / total
        series = [got[f"powersgd:{r}"] for got in readings]
        assert all(v <= best * (1 + 1e-4) for v in series)  # never more than the best rank-r approximation
        assert series[-1] == pytest.approx(best, rel=2e-3)  # warm-started, it converges to it
    assert readings[-1]["powersgd:4"] > 0.99 > readings[-1]["powersgd:1"]


def test_a_warm_probe_follows_the_factors_of_its_own_bucket_and_rank():
    g, _m, _rest, shapes = low_rank_gradient()
    warm, generator = WarmFactors(), torch.Generator().manual_seed(1)
    probe_gains(g, shapes, [Compression("powersgd", 2)], squared_norm(g), FastSelector(), generator, warm, "a").get()
    assert set(warm.q) == {("a", 0, 2)} and warm.q[("a", 0, 2)].shape == (120 * 2,)


def test_the_probes_warm_start_survives_a_checkpoint():
    g, _m, _rest, shapes = low_rank_gradient()
    probes = [Compression("powersgd", 1)]

    def probe(warm: WarmFactors, seed: int) -> float:
        generator = torch.Generator().manual_seed(seed)
        return probe_gains(g, shapes, probes, squared_norm(g), FastSelector(), generator, warm, "a").get()[0][
            "powersgd:1"]

    warm = WarmFactors()
    for _ in range(3):
        probe(warm, 1)
    resumed = WarmFactors()
    resumed.load_state_dict(warm.state_dict())
    cold = probe(WarmFactors(), 2)
    assert probe(resumed, 2) == probe(warm, 2) > cold  # where it left off, not a random Q's first reading


def test_one_iteration_sends_the_projection_onto_the_new_p():
    gen = torch.Generator().manual_seed(3)
    m, q = torch.randn(30, 20, generator=gen), torch.randn(20, 2, generator=gen)
    mass, q_next = powersgd_mass(m, q)
    p = torch.linalg.qr(m @ q).Q
    assert float(mass) == pytest.approx(float((p @ p.T @ m).pow(2).sum()), rel=1e-4)
    assert q_next.shape == (20, 2)


def test_probing_leaves_the_global_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    gains(torch.randn(50 * 40), [Compression("powersgd", 2)], [torch.Size((50, 40))])
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), expected)


def test_topk_masses_and_merging_buckets():
    a, b = heavy_tailed(5_000, 1), heavy_tailed(7_000, 2)
    ga, gb = gains(a, TOPK[:1]), gains(b, TOPK[:1])
    na, nb = float(a.double().pow(2).sum()), float(b.double().pow(2).sum())
    merged = merge_masses([(ga, na), (gb, nb)])
    mass = float(topk_masses(a, [500])[0] + topk_masses(b, [700])[0])
    assert merged["topk:0.1"] == pytest.approx(mass / (na + nb), rel=1e-5)


def test_gains_of_a_zero_gradient_are_one():
    zero = torch.zeros(100)
    assert gains(zero, [*TOPK[:1], Compression("powersgd", 1)], [torch.Size((10, 10))]) == {
        "topk:0.1": 1.0, "powersgd:1": 1.0}
