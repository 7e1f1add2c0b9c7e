"""The sync-free selector's candidates: the Triton kernels against plain torch.

This machine has no GPU, so the kernels run in Triton's interpreter
(`support.triton_interpreter`); `make gpu-check` runs them on a GPU.
"""

from __future__ import annotations

import torch

from flexcomm.client.candidates import passing
from support.triton_interpreter import run_interpreted

CHILD = r"""
import json, torch
from flexcomm.client.candidates import passing, use_triton
from flexcomm.client.selection import SyncFreeSelector, k_for

assert use_triton(torch.zeros(1))  # the interpreter takes host tensors
torch.manual_seed(0)
same = []
for dtype in (torch.float32, torch.bfloat16):
    # (numel, buffer size, quantile of |g| as the threshold): some pass, a full
    # buffer, a buffer of one more than all, blocks with none and a ragged last block
    for numel, size, q in [(10_000, 3_000, 0.8), (50_000, 100, 0.5), (9_000, 9_001, 0.0), (5_000, 50, 0.999)]:
        g = torch.randn(numel).to(dtype)
        g[1_000:4_000] = 0
        threshold = (g.abs().float().quantile(q) if q else torch.tensor(1e-30)).to(dtype)
        plain, fused = passing(g, threshold, size, triton=False), passing(g, threshold, size, triton=True)
        same.append(all(torch.equal(a, b) for a, b in zip(plain, fused)))
g = torch.distributions.StudentT(2.0).sample((200_000,))
chosen = []
for cr in (0.1, 0.01, 0.001):
    k = k_for(g.numel(), cr)
    a, b = SyncFreeSelector(triton=False)(g, k), SyncFreeSelector(triton=True)(g, k)
    chosen.append(torch.equal(a.sort().values, b.sort().values) and a.numel() == k)
print(json.dumps({"same": same, "chosen": chosen}))
"""


def test_triton_candidates_match_plain_torch_bit_for_bit():
    result = run_interpreted(CHILD)
    assert result["same"] == [True] * 8
    assert result["chosen"] == [True] * 3


def test_plain_candidates_fill_the_buffer_in_index_order():
    g = torch.tensor([0.5, -3.0, 0.0, 2.0, -1.0, 4.0])
    indices, magnitudes, count = passing(g, torch.tensor(1.0), 3, triton=False)
    assert indices.tolist() == [1, 3, 4] and magnitudes.tolist() == [3.0, 2.0, 1.0] and int(count) == 3
    indices, magnitudes, count = passing(g, torch.tensor(2.5), 3, triton=False)
    assert indices.tolist() == [1, 5, -1] and magnitudes.tolist() == [3.0, 4.0, -1.0] and int(count) == 2
