"""The lab's language model: a small decoder-only transformer trained byte-level
on the Python standard library's own source files.

Every machine with Python has that text, so nothing is downloaded. The corpus is
the top-level `*.py` files of the running interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`, about 4.7 MB on CPython 3.11), split into
training and validation by file (a seeded tenth of the files validate). Each
epoch draws its own `samples` windows of `context + 1` bytes at seeded offsets
in the training files (the text is far longer than a run reads, so no window is
read twice); validation is a fixed `VALIDATION_WINDOWS` windows of the
validation files. Input is a window's first `context` bytes, target its last
`context`.

The model is GPT-shaped (pre-norm blocks of causal self-attention and a 4x MLP,
learned positions, the output layer tied to the byte embedding), built from
plain `torch.nn` and `scaled_dot_product_attention`.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

VOCAB = 256
HEAD_DIM = 32
VALIDATION_SHARE = 0.1
VALIDATION_WINDOWS = 128


def stdlib_sources() -> list[Path]:
    """The standard library's top-level source files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise RuntimeError(f"workload lm: no *.py files in the standard library at {root}")
    return files


def split_files(files: list[Path], seed: int) -> tuple[list[Path], list[Path]]:
    """(training, validation) files: a seeded tenth validates, at least one file each."""
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    held = max(1, round(VALIDATION_SHARE * len(files)))
    if held >= len(files):
        raise RuntimeError(f"workload lm: {len(files)} source file(s) cannot be split")
    validation = sorted(files[i] for i in order[:held])
    training = sorted(files[i] for i in order[held:])
    return training, validation


def read_bytes(files: list[Path]) -> torch.Tensor:
    """The files' bytes, one after another, as a uint8 tensor."""
    data = b"\n".join(f.read_bytes() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def windows(text: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """`count` windows of `length` bytes at seeded offsets in `text`, as int64."""
    if len(text) <= length:
        raise RuntimeError(f"workload lm: {len(text)} bytes of text; a window needs {length + 1}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - length, (count,), generator=gen)
    return text[starts[:, None] + torch.arange(length)].long()


def inputs_and_targets(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's first bytes predict its last: (window[:-1], window[1:])."""
    return batch[:, :-1], batch[:, 1:]


def training_text(seed: int, context: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(the training files' bytes, the validation windows' inputs and targets)."""
    training, validation = split_files(stdlib_sources(), seed)
    held = windows(read_bytes(validation), VALIDATION_WINDOWS, context + 1, seed)
    return read_bytes(training), inputs_and_targets(held)


def epoch_windows(text: torch.Tensor, count: int, context: int, seed: int,
                  epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Epoch `epoch`'s `count` training windows: inputs and targets."""
    return inputs_and_targets(windows(text, count, context + 1, seed * 100_003 + epoch + 1))


class Block(nn.Module):
    """Pre-norm causal self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.heads = width // HEAD_DIM
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, HEAD_DIM)
                   .permute(2, 0, 3, 1, 4))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(functional.gelu(self.up(self.norm2(x))))


class ByteTransformer(nn.Module):
    """Byte in, next-byte logits out: [batch, length] -> [batch, length, 256]."""

    def __init__(self, width: int, depth: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.position(positions))))
