"""The radix select (client/radix.py): k distinct entries, every one left out within
one bin (2^-7) of the smallest chosen, exactly torch.topk's set where the
magnitudes around the k-th are further apart than that.

This machine has no GPU, so the kernels run in Triton's interpreter
(`support.triton_interpreter`); `make gpu-check` runs them on a GPU.
"""

from __future__ import annotations

import torch

from flexcomm.client.selection import RadixSelector, select_exact
from support.triton_interpreter import run_interpreted

CHILD = r"""
import json, torch
from flexcomm.client import radix, radix_kernels
from flexcomm.client.selection import select_exact


def judged(g, k):
    idx = radix.radix_topk(g, k)
    chosen = torch.zeros(g.numel(), dtype=torch.bool)
    chosen[idx.long()] = True
    mags = g.abs()
    left_out = float(mags[~chosen].max()) if k < g.numel() else 0.0
    return {"int32": idx.dtype == torch.int32, "k": idx.numel() == k, "distinct": int(chosen.sum()) == k,
            "within_a_bin": left_out <= float(mags[chosen].min()) * (1 + 2.0 ** -7),
            "exact": torch.equal(chosen, torch.zeros_like(chosen).index_fill_(0, select_exact(g, k).long(), True))}

# Fixed data: drawn afresh each run, the top 10 of randn came within a bin of each
# other in one CI run in five, and "inf" was then not exactly torch.topk's set.
def all_cases():
    torch.manual_seed(0)
    t = torch.distributions.StudentT(2.0)
    cases = {}
    # heavy-tailed, a span and a half (ragged last span), a tensor shorter than one block
    for n, k in [(24_577, 2_458), (24_577, 25), (24_577, 1), (24_577, 24_577), (300, 30)]:
        cases[f"t {n} {k}"] = judged(t.sample((n,)), k)
    g = t.sample((20_000,))
    g[::3] = 0  # a third zeros: k reaches into them
    cases["zeros"] = judged(g, 15_000)
    cases["ties"] = judged(torch.full((20_000,), -0.5), 777)  # every magnitude equal
    g = torch.randn(20_000)
    g[123] = float("inf")
    cases["inf"] = judged(g, 10)
    # magnitudes 3% apart: more than a bin, so exactly the top k
    spread = 1.03 ** torch.arange(-300, 300, dtype=torch.float64)
    g = (spread * torch.where(torch.rand(600) < 0.5, -1.0, 1.0)).float()
    cases["spread"] = judged(g[torch.randperm(600)], 123)
    return cases


# Both ways of leaving entries out of a level's histogram: Triton's mask argument
# (3.3 and later) and counting them into bin 0 and taking them off again.
cases = {}
for mask in (True, False):
    radix_kernels.HISTOGRAM_MASK = mask
    cases.update({f"{name} mask={mask}": judged for name, judged in all_cases().items()})
print(json.dumps(cases))
"""


def test_radix_select_chooses_k_distinct_entries_within_a_bin_of_the_exact_topk():
    cases = run_interpreted(CHILD)
    assert len(cases) == 18
    for name, judged in cases.items():
        exact = judged.pop("exact")
        assert all(judged.values()), (name, judged)
        if name.split(" mask=")[0] in ("spread", "t 24577 1", "t 24577 24577", "inf"):
            assert exact, name


def test_the_radix_selector_gives_what_it_cannot_run_to_torch_topk():
    # Not float32, or on the host without Triton's interpreter: torch.topk, counted.
    selector = RadixSelector(min_numel=1_000)
    g = torch.randn(5_000)
    for x in (g.to(torch.bfloat16), g):
        assert set(selector(x, 50).tolist()) == set(select_exact(x, 50).tolist())
    assert selector.calls == 2 and selector.fallbacks == 2
    # Below its floor it is torch.topk's job, not a fallback.
    assert set(selector(g[:999], 5).tolist()) == set(select_exact(g[:999], 5).tolist())
    assert selector.fallbacks == 2
