"""The lab's workload: the same data and model on every rank, equal shards, a
cache that returns exactly what was built, and bad sizes named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flexcomm.lab.workload import (
    ShardLoader,
    WorkloadSpec,
    build_model,
    gradient_bytes,
    load_dataset,
)


def test_digits_split_model_and_cache(tmp_path: Path) -> None:
    spec = WorkloadSpec(hidden=64)
    built = load_dataset(spec, cache=tmp_path / "d.pt")
    cached = load_dataset(spec, cache=tmp_path / "d.pt")
    assert (len(built.x_train), len(built.x_test), built.features) == (1437, 360, 64)
    assert torch.equal(built.x_train, cached.x_train) and torch.equal(built.y_test, cached.y_test)
    a, b = build_model(spec, 64, 10), build_model(spec, 64, 10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    # 64*64+64 + 64*64+64 + 64*10+10 parameters of 4 bytes
    assert gradient_bytes(a) == 4 * (64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10)


def test_shards_are_disjoint_and_give_every_rank_the_same_steps() -> None:
    data = load_dataset(WorkloadSpec(name="synthetic", samples=1000, features=16, classes=3))
    loaders = [ShardLoader(data, rank, 3, batch=32, seed=0) for rank in range(3)]
    assert {ld.steps_per_epoch for ld in loaders} == {len(data.x_train) // 3 // 32}
    first = [ld.epoch(0)[0][0] for ld in loaders]
    assert not torch.equal(first[0], first[1])
    assert torch.equal(loaders[0].epoch(1)[0][0], loaders[0].epoch(1)[0][0])  # seeded


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "cifar"}, "workload: unknown 'cifar'"),
    ({"hidden": 0}, "hidden: must be a positive integer"),
    ({"depth": 1}, "depth: need at least 2 layers"),
])
def test_bad_workload_settings_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSpec(**kwargs)


def test_batch_larger_than_a_shard_is_refused() -> None:
    data = load_dataset(WorkloadSpec(name="synthetic", samples=100, features=4, classes=2))
    with pytest.raises(ValueError, match="batch: 64 is larger than a rank's shard"):
        ShardLoader(data, 0, 4, batch=64, seed=0)
