"""The entries of a flat tensor at or above a threshold, in index order, in a buffer
of fixed size, decided on the tensor's device (nothing here reads a count on the host).

`passing(g, threshold, size)` returns (indices, magnitudes, count): the first
`size` passing entries' indices (int32, ascending) and |g| there, the slots after
them -1 in both; `count` (0-dim, on the device) is how many slots were filled
(a full buffer's last slot filled: some may not have fit). Two ways, one result:

- plain torch: |g|, a mask, `torch.nonzero_static`, a gather (about 4 passes over
  the tensor and a dozen kernels);
- Triton, for CUDA tensors where Triton is installed: one kernel counts each
  block's passing entries, a cumulative sum gives each block its first slot, and a
  second kernel writes each block's entries there (two reads of g, no write of
  its size).

`TRITON_INTERPRET=1` runs the Triton kernels on the host (numpy), which is how the
test suite checks them without a GPU.
"""

from __future__ import annotations

import functools
import os

import torch

# Entries per Triton program (each block's passing entries are scanned in
# registers), and its warps: the fastest on an H100 of 512-4096 and 1-8 warps at
# 25M and 100M values (2.0-2.3 and 1.8-2.0 passes; 4096 and 4 warps: 2.5-3.0).
BLOCK = 1024
NUM_WARPS = 2
INDEX_DTYPE = torch.int32  # of every selector's indices (half the bytes of int64)


@functools.cache
def _kernels():
    """The Triton kernels, or None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def count_passing(g_ptr, threshold_ptr, counts_ptr, n, BLOCK: tl.constexpr):
        start = tl.program_id(0) * BLOCK
        offsets = start + tl.arange(0, BLOCK)
        inside = offsets < n
        x = tl.load(g_ptr + offsets, mask=inside, other=0.0)
        passes = (tl.abs(x) >= tl.load(threshold_ptr)) & inside
        tl.store(counts_ptr + tl.program_id(0), tl.sum(passes.to(tl.int32), axis=0))

    @triton.jit
    def write_passing(g_ptr, threshold_ptr, ends_ptr, index_ptr, value_ptr, n, size, BLOCK: tl.constexpr):
        start = tl.program_id(0) * BLOCK
        offsets = start + tl.arange(0, BLOCK)
        inside = offsets < n
        x = tl.load(g_ptr + offsets, mask=inside, other=0.0)
        passes = ((tl.abs(x) >= tl.load(threshold_ptr)) & inside).to(tl.int32)
        # This block's first slot: the passing entries of every block before it.
        first = tl.load(ends_ptr + tl.program_id(0)) - tl.sum(passes, axis=0)
        slot = first + tl.cumsum(passes, axis=0) - 1
        fits = (passes > 0) & (slot < size)
        tl.store(index_ptr + slot, offsets, mask=fits)
        tl.store(value_ptr + slot, tl.abs(x), mask=fits)

    return count_passing, write_passing


def triton_available() -> bool:
    return _kernels() is not None


def use_triton(g: torch.Tensor) -> bool:
    """Whether `passing` takes the Triton kernels for `g`: on a CUDA tensor where
    Triton is installed (on any tensor under TRITON_INTERPRET=1, for tests)."""
    return (g.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") and triton_available()


def passing(g: torch.Tensor, threshold: torch.Tensor, size: int,
            triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indices, magnitudes, count) of the entries with |g| >= threshold (a 0-dim
    tensor of g's dtype on g's device); see the module docstring. `triton`: None
    picks by `use_triton`."""
    if triton is None:
        triton = use_triton(g)
    return _passing_triton(g, threshold, size) if triton else _passing_torch(g, threshold, size)


def _passing_torch(g: torch.Tensor, threshold: torch.Tensor, size: int):
    absg = g.abs()
    indices = torch.nonzero_static(absg >= threshold, size=size, fill_value=-1).squeeze(1)
    valid = indices >= 0
    return indices.to(INDEX_DTYPE), torch.where(valid, absg[indices], -1.0), valid.sum()


def _passing_triton(g: torch.Tensor, threshold: torch.Tensor, size: int):
    count_passing, write_passing = _kernels()
    n = g.numel()
    blocks = -(-n // BLOCK)
    counts = torch.empty(blocks, dtype=torch.int32, device=g.device)
    count_passing[(blocks,)](g, threshold, counts, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    indices = torch.full((size,), -1, dtype=INDEX_DTYPE, device=g.device)
    magnitudes = torch.full((size,), -1.0, dtype=g.dtype, device=g.device)
    write_passing[(blocks,)](g, threshold, ends, indices, magnitudes, n, size, BLOCK=BLOCK,
                             num_warps=NUM_WARPS)
    return indices, magnitudes, ends[-1].clamp(max=size)
