"""Training for real on 2 gloo ranks: CR 0.01 Top-k and rank-2 PowerSGD with error
feedback, and bf16, reach the dense run's test accuracy (within 2 points) on
scikit-learn's digits, same seed and steps, while sending what each compression
sends (checked against the bytes a dense step sends)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.client_ranks import run_ranks

STEPS = 600
BATCH = 32


def digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def train(rank: int, world: int, **hook_options) -> dict:
    from flexcomm.client.hook import register

    (xtr, ytr), (xte, yte) = digits_split()
    xtr, ytr = xtr[rank::world], ytr[rank::world]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    state = register(model, **hook_options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        i = torch.randint(0, len(ytr), (BATCH,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xtr[i]), ytr[i]).backward()
        opt.step()
    with torch.no_grad():
        accuracy = float((model(xte).argmax(1) == yte).float().mean())
    last = state.last_stats()
    return {"accuracy": accuracy, "ran": last.compression.name, "bytes": last.bytes_sent, "gain": last.gain}


def dense_and_compressed(rank: int, world: int) -> dict:
    return {"dense": train(rank, world),
            "topk": train(rank, world, compression="topk:0.01", collective="ag_topk"),
            "art": train(rank, world, compression="topk:0.01", collective="art_ring", root="var"),
            "powersgd": train(rank, world, compression="powersgd:2"),
            "bf16": train(rank, world, compression="bf16")}


@pytest.mark.timeout(200)
def test_compressed_training_reaches_dense_accuracy_on_digits():
    results = run_ranks(2, "client/test_training.py:dense_and_compressed", timeout=160)
    got = results[0]
    # every rank holds the same model
    assert all({k: v["accuracy"] for k, v in r.items()} == {k: v["accuracy"] for k, v in got.items()}
               for r in results)
    dense = got["dense"]["accuracy"]
    assert dense > 0.9, got
    values = 64 * 128 + 128 + 128 * 10 + 10
    assert got["dense"]["bytes"] == 4 * values
    for name in ("topk", "art", "powersgd", "bf16"):
        assert got[name]["accuracy"] >= dense - 0.02, (name, got)
    # Each ran what it was asked and sent what that sends: Top-k 1% of the values
    # (AllGather with their indices), PowerSGD rank 2 factors (weights 128 x 64: P 256,
    # Q 128; 10 x 128: P 20, Q 256) and the 138 bias values dense, bf16 two bytes a value.
    assert (got["topk"]["ran"], got["topk"]["bytes"]) == ("topk:0.01", round(0.01 * values) * 8)
    assert got["art"]["ran"] == "topk:0.01" and got["art"]["bytes"] <= round(0.01 * values) * 8
    assert (got["powersgd"]["ran"], got["powersgd"]["bytes"]) == ("powersgd:2", 4 * (256 + 128 + 20 + 256 + 138))
    assert (got["bf16"]["ran"], got["bf16"]["bytes"]) == ("bf16", 2 * values)
    assert 0 < got["topk"]["gain"] < 1 and 0 < got["powersgd"]["gain"] < 1
