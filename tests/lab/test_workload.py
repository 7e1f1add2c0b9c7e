"""The lab's workloads: the same data and model on every rank, equal shards, a
cache that returns exactly what was built, bad sizes named; the lm's text split
by file, its windows fresh every epoch, its model causal and sized for the lab;
the cnn's images and 4-D weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flexcomm.lab.workload import (
    ShardLoader,
    WorkloadSpec,
    build_model,
    evaluate,
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
    ({"name": "lm", "hidden": 100}, "hidden: the lm's width must be a multiple of 32"),
    ({"name": "cnn", "hidden": 12}, "hidden: the cnn's channels must be a multiple of 8"),
    ({"name": "lm", "context": 0}, "context: must be a positive integer"),
])
def test_bad_workload_settings_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSpec(**kwargs)


def test_batch_larger_than_a_shard_is_refused() -> None:
    data = load_dataset(WorkloadSpec(name="synthetic", samples=100, features=4, classes=2))
    with pytest.raises(ValueError, match="batch: 64 is larger than a rank's shard"):
        ShardLoader(data, 0, 4, batch=64, seed=0)


def test_lm_reads_the_standard_library_split_by_file_and_seeded(tmp_path: Path) -> None:
    from flexcomm.lab import textlm

    training, validation = textlm.split_files(textlm.stdlib_sources(), seed=0)
    assert training and validation and not set(training) & set(validation)
    assert textlm.split_files(textlm.stdlib_sources(), seed=0) == (training, validation)
    assert textlm.split_files(textlm.stdlib_sources(), seed=1) != (training, validation)

    spec = WorkloadSpec(name="lm")
    built = load_dataset(spec, cache=tmp_path / "lm.pt")
    cached = load_dataset(spec, cache=tmp_path / "lm.pt")
    assert torch.equal(built.x_train, cached.x_train) and torch.equal(built.text, cached.text)
    assert built.x_train.shape == (spec.samples, spec.context) and built.classes == 256
    assert torch.equal(built.x_train[:, 1:], built.y_train[:, :-1])  # next-byte targets
    # Validation windows are the validation files' text, training windows the training files'.
    held_text = bytes(textlm.read_bytes(validation).tolist())
    train_text = bytes(built.text.tolist())
    for i in range(0, len(built.x_test), 37):
        window = bytes(built.x_test[i].tolist()) + bytes(built.y_test[i, -1:].tolist())
        assert window in held_text
    assert bytes(built.x_train[5].tolist()) in train_text


def test_lm_epochs_draw_fresh_windows_and_the_model_is_sized_for_the_lab() -> None:
    spec = WorkloadSpec(name="lm")
    data = load_dataset(spec)
    loaders = [ShardLoader(data, rank, 4, batch=8, seed=0) for rank in range(4)]
    assert loaders[0].steps_per_epoch == spec.samples // 4 // 8
    first, second = loaders[0].epoch(0)[0][0], loaders[0].epoch(1)[0][0]
    assert not torch.equal(first, second)
    assert torch.equal(loaders[0].epoch(1)[0][0], second)  # seeded
    model = build_model(spec, data.features, data.classes)
    assert 3e6 <= gradient_bytes(model) <= 15e6  # the lab's size: 3-15 MB of gradient
    x, _ = loaders[0].epoch(0)[0]
    logits = model(x)
    assert logits.shape == (8, spec.context, 256)
    # Causal: the prediction at position 3 does not depend on later bytes.
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    assert torch.allclose(model(changed)[:, :4], logits[:, :4], atol=1e-5)
    assert evaluate(model, data.x_test, data.y_test)["loss"] == pytest.approx(5.55, abs=0.3)


def test_cnn_trains_on_upsampled_digits_with_4d_weights() -> None:
    spec = WorkloadSpec(name="cnn")
    data = load_dataset(spec)
    assert data.x_train.shape == (1437, 1, 16, 16) and data.x_test.shape == (360, 1, 16, 16)
    model = build_model(spec, data.features, data.classes)
    assert any(p.dim() == 4 for p in model.parameters())
    assert model(data.x_test[:5]).shape == (5, 10)
    assert 1e6 <= gradient_bytes(model) <= 15e6
