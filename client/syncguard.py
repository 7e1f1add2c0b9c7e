"""Catching host synchronisations: `with no_host_sync(): ...` raises where the
code inside reads a tensor's data back on the host.

On a GPU such a read waits until the device has run everything queued before it,
so the step stalls. Two nets, because each sees what the other cannot:

- Python-level reads on this thread, on any device: `bool(t)`, `int(t)`,
  `float(t)`, `t.item()`, `t.tolist()`, `t.numpy()`, `nonzero()` (its size
  depends on the data), indexing with a boolean mask, `masked_select`, `unique`
  (a `TorchFunctionMode`, so it works on CPU tensors too, where tests run);
  also `t[indices] = 0`, whose number is copied from the host with a blocking copy.
- On CUDA, every synchronizing CUDA call (a blocking copy to or from the host
  included): `torch.cuda.set_sync_debug_mode("warn")`, with each such warning
  that reaches Python (this thread or a collective's callback) turned into the
  error. Not "error" itself: the mode is process-wide, and gloo's own worker
  threads synchronize their staging streams when they run a collective on CUDA
  tensors (its host algorithm), which would then fail the collective.

Waiting on a single CUDA event (`Event.synchronize`) is not flagged by either:
the gloo tree's staging does that on purpose (client/collectives.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"

_READS = frozenset({
    torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy,
    torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select, torch.masked_select,
    torch.Tensor.unique, torch.unique, torch.unique_consecutive,
})
_INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__})


class HostSyncError(RuntimeError):
    """Code that must not wait for the device read a tensor on the host."""


def _tensors_in(index: Any) -> list[torch.Tensor]:
    items = index if isinstance(index, tuple) else (index,)
    return [i for i in items if isinstance(i, torch.Tensor)]


def _is_mask(index: Any) -> bool:
    return any(i.dtype == torch.bool for i in _tensors_in(index))


def _puts_host_number(args: tuple) -> bool:
    """`t[index_tensor] = 0`: the number becomes a host tensor, and index_put_
    copies it to t's GPU with a blocking copy (a device tensor as the value does not)."""
    return len(args) > 2 and bool(_tensors_in(args[1])) and isinstance(args[2], int | float | bool)


class _NoHostReads(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS or (func in _INDEXING and len(args) > 1 and _is_mask(args[1])):
            name = getattr(func, "__name__", str(func))
            raise HostSyncError(f"host sync: {name} reads a tensor's data on the host")
        if func is torch.Tensor.__setitem__ and _puts_host_number(args):
            raise HostSyncError("host sync: t[indices] = number copies the number from the host "
                                "(use index_put_ with a device tensor)")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise at any host read of tensor data inside the block: HostSyncError for
    a Python-level read on this thread, the CUDA warning as an error for a
    synchronizing CUDA call (see the module docstring)."""
    with no_cuda_sync(), _NoHostReads():
        yield


@contextmanager
def no_cuda_sync() -> Iterator[None]:
    """The CUDA net alone (a no-op without CUDA): for code that may read host
    tensors, such as a whole training step with its statistics."""
    if not torch.cuda.is_available():
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=f".*{CUDA_SYNC_WARNING}")
            yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
