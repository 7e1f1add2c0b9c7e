"""The examples' data: a synthetic 10-class problem labelled by a fixed random
teacher network, so that they need nothing but torch."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def teacher_data(n: int = 8192, features: int = 128, classes: int = 10) -> TensorDataset:
    teacher = nn.Linear(features, classes)
    torch.nn.init.normal_(teacher.weight, std=1.0, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return TensorDataset(x, teacher(x).argmax(1))
