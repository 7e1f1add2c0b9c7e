"""Training for real on 2 gloo ranks: CR 0.01 Top-k with error feedback reaches the
dense run's test accuracy (within 2 points) on scikit-learn's digits, same seed
and steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.client_ranks import run_ranks

STEPS = 400
BATCH = 32


def digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def train(rank: int, world: int, **hook_options) -> float:
    from flexcomm.client.hook import register

    (xtr, ytr), (xte, yte) = digits_split()
    xtr, ytr = xtr[rank::world], ytr[rank::world]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    register(model, **hook_options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        i = torch.randint(0, len(ytr), (BATCH,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xtr[i]), ytr[i]).backward()
        opt.step()
    with torch.no_grad():
        return float((model(xte).argmax(1) == yte).float().mean())


def dense_and_topk(rank: int, world: int) -> dict:
    return {"dense": train(rank, world),
            "topk": train(rank, world, cr=0.01, collective="ag_topk"),
            "art": train(rank, world, cr=0.01, collective="art_ring", root="var")}


@pytest.mark.timeout(200)
def test_cr_001_reaches_dense_accuracy_on_digits():
    results = run_ranks(2, "client/test_training.py:dense_and_topk", timeout=160)
    acc = results[0]
    assert all(r == acc for r in results)  # every rank holds the same model
    assert acc["dense"] > 0.9, acc
    assert acc["topk"] >= acc["dense"] - 0.02, acc
    assert acc["art"] >= acc["dense"] - 0.02, acc
