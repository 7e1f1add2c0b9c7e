"""A model's gradient as the cost model sees it (`GradientLayout`): the matrices
PowerSGD would factor, the values in vectors, and the bytes of one value."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from flexcomm.policy.types import GradientLayout


def layout_of(model: torch.nn.Module | Iterable[torch.nn.Parameter]) -> GradientLayout:
    """The layout of `model`'s trainable parameters' gradients (their dtype's width);
    `model` may also be the parameters themselves."""
    params = [p for p in (model.parameters() if isinstance(model, torch.nn.Module) else model) if p.requires_grad]
    if not params:
        raise ValueError("model: no parameter requires a gradient")
    widths = {p.element_size() for p in params}
    if len(widths) != 1:
        raise ValueError(f"model: parameters of mixed widths {sorted(widths)} bytes; DDP buckets one dtype")
    return GradientLayout.of_shapes([tuple(p.shape) for p in params], widths.pop())
