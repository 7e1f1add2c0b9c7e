"""Error feedback: one residual per key, shared by every lossy family."""

from __future__ import annotations

import pytest
import torch

from flexcomm.client.memory import ErrorFeedback, Memory
from flexcomm.client.selection import make_selector


def heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(4) * 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("selector", ["exact", "fast"])
def test_topk_residual_plus_what_was_sent_is_g_e_in_each_dtype(dtype, selector):
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
        ef.sent_at(idx)
        g_c = torch.zeros(n, dtype=dtype)
        g_c[idx.long()] = values
        assert torch.equal(g_c + ef.residual, g_e_before)  # exact in every dtype
        assert int((ef.residual[idx.long()] != 0).sum()) == 0


def test_an_approximation_leaves_the_rest():
    ef = ErrorFeedback(6, torch.float32)
    g_e = ef.compensate(torch.arange(6, dtype=torch.float32))
    approx = torch.tensor([0.0, 1.0, 1.0, 3.0, 3.0, 5.0])
    expected = g_e.clone() - approx
    ef.sent(approx)
    assert torch.equal(ef.residual, expected)


def test_a_lossless_step_sends_the_residual_and_clears_it():
    memory = Memory()
    g_e = memory.compensate("b", torch.ones(10))
    memory.update("b", lambda ef: ef.sent_at(torch.tensor([0], dtype=torch.int32)))
    assert float(g_e.sum()) == 9.0
    g = torch.full((10,), 2.0)
    memory.send_all_into("b", g)
    assert float(g.sum()) == 20.0 + 9.0
    assert not memory.residuals["b"].dirty and float(memory.residuals["b"].residual.abs().sum()) == 0.0
    untouched = torch.ones(4)
    memory.send_all_into("never-lossy", untouched)  # no residual yet: nothing to add
    assert torch.equal(untouched, torch.ones(4))


def test_restored_residuals_wait_for_a_gradient_of_their_size():
    memory = Memory()
    memory.compensate(0, torch.ones(8))
    saved = memory.state_dict()
    again = Memory()
    again.load_state_dict(saved)
    assert not again.residuals
    assert torch.equal(again.state_dict()["residuals"][0], torch.ones(8))  # a checkpoint now keeps it
    g = torch.zeros(8)
    again.send_all_into(0, g)  # the dense warm-up after a restart leaves it waiting
    assert torch.equal(g, torch.zeros(8))
    again.compensate(0, torch.zeros(7))  # a gradient of another size does not take it
    assert torch.equal(again.compensate(0, torch.ones(8)), torch.full((8,), 2.0))


def test_a_gradient_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"^gradient:"):
        ErrorFeedback(4, torch.float32).compensate(torch.zeros(5))
