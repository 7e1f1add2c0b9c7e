"""The lab's convolutional network: a small residual CNN on real images that need no
download, scikit-learn's 8x8 handwritten digits upsampled (bilinear) to 16x16.

The network is ResNet-shaped: a 3x3 stem, then `depth` residual blocks (two 3x3
convolutions each, GroupNorm, ReLU), the first at 16x16 with `width` channels,
each later one halving the resolution and doubling the channels, then global
average pooling and a linear classifier. GroupNorm, not BatchNorm: DDP would
broadcast BatchNorm's running statistics outside the communication hook every
step, traffic no policy decides. Its convolution weights are 4-D tensors.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

SIDE = 16
GROUPS = 8


def upsampled_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(images [1797, 1, 16, 16] in [0, 1], labels): the digits, upsampled."""
    from sklearn.datasets import load_digits

    data = load_digits()
    small = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = functional.interpolate(small, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return images, torch.tensor(data.target, dtype=torch.long)


class ResidualBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(GROUPS, channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(GROUPS, channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False),
                nn.GroupNorm(GROUPS, channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.relu(self.norm1(self.conv1(x)))
        return functional.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResidualCNN(nn.Module):
    """[batch, channels, H, W] images -> [batch, classes] logits."""

    def __init__(self, channels: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False),
                                  nn.GroupNorm(GROUPS, width), nn.ReLU())
        blocks, current = [], width
        for i in range(depth):
            out = width * 2 ** i
            blocks.append(ResidualBlock(current, out, stride=1 if i == 0 else 2))
            current = out
        self.blocks = nn.Sequential(*blocks)
        self.classify = nn.Linear(current, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.blocks(self.stem(x)).mean(dim=(2, 3)))
