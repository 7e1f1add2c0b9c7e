"""What the lab trains: real data that needs no download, and a model whose gradient
is large enough that exchanging it dominates a step on a shaped link.

- "lm": a small decoder-only transformer trained byte-level on the Python
  standard library's source (`flexcomm.lab.textlm`); quality is validation loss
  (nats) and next-byte accuracy.
- "cnn": a small residual CNN on scikit-learn's digits upsampled to 16x16
  (`flexcomm.lab.cnn`); its convolution weights are 4-D.
- "digits": scikit-learn's 8x8 handwritten digits (1797 images), standardised,
  split 80/20 with a fixed seed, and a wide MLP.
- "synthetic": a seeded Gaussian-cluster classification problem of any size, and
  the MLP.

`hidden` is the model's width (MLP units, transformer width, the CNN's first
channels) and `depth` its length (MLP layers, transformer blocks, residual
blocks); unset, each takes the workload's default (`flexcomm.lab.plan.
WORKLOAD_DEFAULTS`). Every rank builds the same data and model from the same
seed, then trains on its own shard.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from flexcomm.lab import textlm
from flexcomm.lab.plan import WORKLOAD_DEFAULTS

WORKLOADS = tuple(WORKLOAD_DEFAULTS)
LOSS_TARGETS = ("lm",)  # workloads whose target is a loss to reach; the others' an accuracy


def target_metric(workload: str) -> str:
    """What a run's target is measured in: "loss" (lower is better) or "accuracy"."""
    return "loss" if workload in LOSS_TARGETS else "accuracy"


@dataclass(frozen=True)
class WorkloadSpec:
    """How to build a workload; plain data, so it travels to rank processes as JSON.
    Sizes left None take the workload's default."""

    name: str = "digits"
    hidden: int | None = None
    depth: int | None = None
    seed: int = 0
    samples: int | None = None  # synthetic: samples; lm: training windows per epoch
    features: int = 64  # synthetic only
    classes: int = 10  # synthetic only
    context: int = 64  # lm only: bytes a prediction sees

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"workload: unknown {self.name!r} (one of {', '.join(WORKLOADS)})")
        for size in ("hidden", "depth", "samples"):
            if getattr(self, size) is None:
                object.__setattr__(self, size, WORKLOAD_DEFAULTS[self.name].get(size))
        for field_name in ("hidden", "depth", "samples", "features", "classes", "context"):
            value = getattr(self, field_name)
            if value is None and field_name == "samples":
                continue  # a workload with a fixed data set
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field_name}: must be a positive integer, got {value!r}")
        if self.name in ("digits", "synthetic") and self.depth < 2:
            raise ValueError(f"depth: need at least 2 layers, got {self.depth}")
        if self.classes < 2:
            raise ValueError(f"classes: need at least 2, got {self.classes}")
        if self.name == "lm" and self.hidden % textlm.HEAD_DIM:
            raise ValueError(f"hidden: the lm's width must be a multiple of {textlm.HEAD_DIM} "
                             f"(its attention heads), got {self.hidden}")
        if self.name == "cnn" and self.hidden % 8:
            raise ValueError(f"hidden: the cnn's channels must be a multiple of 8 (its norm groups), "
                             f"got {self.hidden}")


@dataclass(frozen=True)
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int
    text: torch.Tensor | None = None  # lm: the training text; every epoch draws fresh windows

    @property
    def features(self) -> int:
        """Input width: MLP features, image channels, or the lm's context."""
        return int(self.x_train.shape[1])


def load_dataset(spec: WorkloadSpec, cache: str | Path | None = None) -> Dataset:
    """The train/test split for `spec`, identical on every rank. With `cache`, read
    it from there when present (else build and write it): ranks then skip
    importing scikit-learn and reading the text."""
    if cache is not None and Path(cache).exists():
        return Dataset(**torch.load(cache))
    data = _build_dataset(spec)
    if cache is not None:
        torch.save(asdict(data), cache)
    return data


def _build_dataset(spec: WorkloadSpec) -> Dataset:
    if spec.name == "lm":
        text, held = textlm.training_text(spec.seed, spec.context)
        x_train, y_train = textlm.epoch_windows(text, spec.samples, spec.context, spec.seed, epoch=0)
        x_test, y_test = held
        return Dataset(x_train, y_train, x_test, y_test, textlm.VOCAB, text=text)
    if spec.name == "cnn":
        from flexcomm.lab.cnn import upsampled_digits

        images, labels = upsampled_digits()
        return _split(images, labels, 10, spec.seed)
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
    """A seeded 80/20 split, standardised with the training part's statistics
    (per feature; for images, per pixel)."""
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    mean, std = x[:cut].mean(0), x[:cut].std(0).clamp_min(1e-6)
    x = (x - mean) / std
    return Dataset(x[:cut], y[:cut], x[cut:], y[cut:], classes)


def build_model(spec: WorkloadSpec, features: int, classes: int) -> nn.Module:
    """The workload's model, seeded so every rank starts equal."""
    torch.manual_seed(spec.seed)
    if spec.name == "lm":
        return textlm.ByteTransformer(spec.hidden, spec.depth, features)
    if spec.name == "cnn":
        from flexcomm.lab.cnn import ResidualCNN

        return ResidualCNN(features, spec.hidden, spec.depth, classes)
    return _mlp(spec.hidden, spec.depth, features, classes)


def _mlp(hidden: int, depth: int, features: int, classes: int) -> nn.Module:
    """A `depth`-layer MLP of width `hidden`."""
    widths = [features] + [hidden] * (depth - 1) + [classes]
    layers: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(w_in, w_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient (what dense AllReduce moves per step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def loss_of(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction: one per sample, or one per byte."""
    return functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


class ShardLoader:
    """Rank `rank`'s shard of the training set, reshuffled every epoch with a seed
    shared by all ranks, cut into fixed-size batches (the tail is dropped so that
    every rank runs the same number of steps per epoch). A text dataset draws
    each epoch's windows afresh, so a run never reads the same window twice."""

    def __init__(self, data: Dataset, rank: int, world: int, batch: int, seed: int) -> None:
        if batch < 1:
            raise ValueError(f"batch: must be >= 1, got {batch}")
        self.data = data
        self.rank = rank
        self.world = world
        shard_min = len(data.x_train) // world
        self.steps_per_epoch = shard_min // batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch: {batch} is larger than a rank's shard ({shard_min} samples)")
        self.batch = batch
        self.seed = seed

    def _samples(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.data
        if data.text is None or epoch == 0:
            x, y = data.x_train, data.y_train
        else:
            x, y = textlm.epoch_windows(data.text, len(data.x_train), data.features, self.seed, epoch)
        return x[self.rank::self.world], y[self.rank::self.world]

    def epoch(self, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self._samples(epoch)
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(x), generator=gen)
        batches = []
        for i in range(self.steps_per_epoch):
            idx = order[i * self.batch:(i + 1) * self.batch]
            batches.append((x[idx], y[idx]))
        return batches


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Held-out loss (nats per prediction) and accuracy (share of predictions right)."""
    was_training = model.training
    model.eval()
    output = model(x)
    result = {"loss": float(loss_of(output, y)),
              "accuracy": float((output.argmax(-1) == y).float().mean())}
    model.train(was_training)
    return result
