"""What the lab trains: real data that ships with scikit-learn, and a model whose
gradient is large enough that exchanging it dominates a step on a shaped link.

- "digits": scikit-learn's 8x8 handwritten digits (1797 images, no download),
  standardised, split 80/20 with a fixed seed.
- "synthetic": a seeded Gaussian-cluster classification problem of any size, for
  runs that want a larger input or more samples than digits has.

The model is a wide MLP; `hidden` sets its width and so the gradient size
(about hidden**2 * (depth - 1) parameters). Every rank builds the same data and
model from the same seed, then trains on its own shard.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from flexcomm.lab.plan import DEFAULTS

WORKLOADS = ("digits", "synthetic")


@dataclass(frozen=True)
class WorkloadSpec:
    """How to build a workload; plain data, so it travels to rank processes as JSON."""

    name: str = "digits"
    hidden: int = DEFAULTS["hidden"]
    depth: int = DEFAULTS["depth"]
    seed: int = 0
    samples: int = 4000  # synthetic only
    features: int = 64  # synthetic only
    classes: int = 10  # synthetic only

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"workload: unknown {self.name!r} (one of {', '.join(WORKLOADS)})")
        for field_name in ("hidden", "depth", "samples", "features", "classes"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field_name}: must be a positive integer, got {value!r}")
        if self.depth < 2:
            raise ValueError(f"depth: need at least 2 layers, got {self.depth}")
        if self.classes < 2:
            raise ValueError(f"classes: need at least 2, got {self.classes}")


@dataclass(frozen=True)
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])


def load_dataset(spec: WorkloadSpec, cache: str | Path | None = None) -> Dataset:
    """The train/test split for `spec`, identical on every rank. With `cache`, read
    it from there when present (else build and write it): ranks then skip
    importing scikit-learn."""
    if cache is not None and Path(cache).exists():
        return Dataset(**torch.load(cache))
    data = _build_dataset(spec)
    if cache is not None:
        torch.save(asdict(data), cache)
    return data


def _build_dataset(spec: WorkloadSpec) -> Dataset:
    if spec.name == "digits":
        from sklearn.datasets import load_digits

        data = load_digits()
        x, y, classes = data.data, data.target, 10
    else:
        from sklearn.datasets import make_classification

        x, y = make_classification(
            n_samples=spec.samples, n_features=spec.features,
            n_informative=max(2, spec.features // 2), n_classes=spec.classes,
            n_clusters_per_class=2, class_sep=1.5, random_state=spec.seed,
        )
        classes = spec.classes
    return _split(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long),
                  classes, spec.seed)


def _split(x: torch.Tensor, y: torch.Tensor, classes: int, seed: int) -> Dataset:
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    mean, std = x[:cut].mean(0), x[:cut].std(0).clamp_min(1e-6)
    x = (x - mean) / std
    return Dataset(x[:cut], y[:cut], x[cut:], y[cut:], classes)


def build_model(spec: WorkloadSpec, features: int, classes: int) -> nn.Module:
    """A `depth`-layer MLP of width `hidden`, seeded so every rank starts equal."""
    torch.manual_seed(spec.seed)
    widths = [features] + [spec.hidden] * (spec.depth - 1) + [classes]
    layers: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(w_in, w_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient (what dense AllReduce moves per step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class ShardLoader:
    """Rank `rank`'s shard of the training set, reshuffled every epoch with a seed
    shared by all ranks, cut into fixed-size batches (the tail is dropped so that
    every rank runs the same number of steps per epoch)."""

    def __init__(self, data: Dataset, rank: int, world: int, batch: int, seed: int) -> None:
        if batch < 1:
            raise ValueError(f"batch: must be >= 1, got {batch}")
        self.x = data.x_train[rank::world]
        self.y = data.y_train[rank::world]
        shard_min = len(data.x_train) // world
        self.steps_per_epoch = shard_min // batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch: {batch} is larger than a rank's shard ({shard_min} samples)")
        self.batch = batch
        self.seed = seed

    def epoch(self, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(self.x), generator=gen)
        batches = []
        for i in range(self.steps_per_epoch):
            idx = order[i * self.batch:(i + 1) * self.batch]
            batches.append((self.x[idx], self.y[idx]))
        return batches


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    was_training = model.training
    model.eval()
    correct = (model(x).argmax(1) == y).sum().item()
    model.train(was_training)
    return correct / len(y)
