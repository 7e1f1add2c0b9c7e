"""Moving numbers between the host and a GPU without waiting for the GPU.

On a GPU the hook only launches work; reading a result on the host (`float(t)`,
`.item()`, a plain `.to("cpu")`) waits until the device has run everything
queued before it, which stalls the step. So:

- `Later(tensors)` starts copying device tensors into pinned host memory at
  once (a non-blocking copy and an event after it) and hands them over when the
  copy has finished: `ready()` asks without waiting, `get()` waits only if it
  must (at close). On the CPU it holds the tensors themselves.
- `to_device(t, device)` copies a host tensor to a GPU from pinned memory
  without waiting (a plain copy from pageable memory waits).
- `HostClock` and `CudaClock` time a span of the step: the host's clock, or
  CUDA events recorded on the current stream and read once they have completed
  (`clock_for(tensor)` picks by the tensor's device).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch


class Later:
    """Tensors copied to the host without waiting; read them once ready()."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.shapes = [t.shape for t in tensors]
        self.event: Any = None
        self.host: list[torch.Tensor] = [t.detach() for t in tensors]  # in host memory already
        if any(t.is_cuda for t in tensors):
            flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
            pinned = torch.empty(flat.shape, dtype=torch.float64, pin_memory=True)
            pinned.copy_(flat, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            self.host = [part.view(shape) for part, shape in
                         zip(pinned.split([s.numel() for s in self.shapes]), self.shapes, strict=True)]

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def get(self) -> list[torch.Tensor]:
        """The tensors, on the host (waits for the copy if it has not finished)."""
        if self.event is not None:
            self.event.synchronize()
        return self.host

    def numbers(self) -> list[float]:
        """Every value, flat, as Python floats (waits for the copy if it has not
        finished)."""
        tensors = self.get()
        # Host memory the copy has filled: reading it waits for nothing, so
        # client/syncguard.py's net, which cannot tell, is lifted for it.
        with torch._C.DisableTorchFunction():
            return [float(v) for t in tensors for v in t.reshape(-1).tolist()]


def to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host tensor `t` on `device` (as `dtype`), copied without waiting."""
    dtype = dtype or t.dtype
    if device.type != "cuda":
        return t.to(device, dtype)
    return t.pin_memory().to(device, non_blocking=True).to(dtype)


class HostClock:
    """Spans timed by the host's clock (CPU tensors: the work is done when it returns)."""

    def mark(self) -> float:
        return time.perf_counter()

    def done(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        pass

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaClock:
    """Spans timed by CUDA events on the current stream; read only once completed."""

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def done(self, mark: Any) -> bool:
        return mark.query()

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3


HOST_CLOCK = HostClock()
CUDA_CLOCK = CudaClock()
# The clock of each device type; a test stands a deferred clock in for CUDA's.
CLOCKS: dict[str, Any] = {"cpu": HOST_CLOCK, "cuda": CUDA_CLOCK}


def clock_for(t: torch.Tensor) -> Any:
    return CLOCKS.get(t.device.type, HOST_CLOCK)


class Generators:
    """One seeded random generator per device (sampling on a GPU must not draw on
    the host and copy over, which waits)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._by_device: dict[torch.device, torch.Generator] = {}

    def on(self, device: torch.device) -> torch.Generator:
        gen = self._by_device.get(device)
        if gen is None:
            gen = self._by_device[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen
