"""Error feedback: what a lossy compression did not send is added to the next step.

One residual per key (a DDP bucket index, or the whole model), shared by every
lossy family, so a switch between Top-k and PowerSGD (or to dense, which sends
the residual with the gradient) loses nothing:

    g_e = memory.compensate(key, g)     # g_e = g + residual (lossy families)
    ... a compressor reads what it sends off g_e ...
    memory.update(key, sent)            # sent(residual): Top-k's ef.sent_at(indices),
                                        # PowerSGD's ef.sent(approximation)
    memory.send_all_into(key, g)        # dense, bf16: g += residual, residual = 0

After each step, for every rank, residual + what was sent = g_e. The residual
buffer itself holds g_e while a step runs (compensating is one in-place add).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class ErrorFeedback:
    """The residual of one flat gradient; see the module docstring."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.residual = torch.zeros(numel, dtype=dtype, device=device)
        # `residual[indices] = 0` copies the 0 from the host, which waits for a GPU.
        self._zero = torch.zeros((), dtype=dtype, device=device)
        # False while the residual is known to be all zeros (dense steps skip it).
        self.dirty = False

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        if g.shape != self.residual.shape:
            raise ValueError(
                f"gradient: shape {tuple(g.shape)} does not match the residual {tuple(self.residual.shape)}"
            )
        self.residual.add_(g)
        self.dirty = True
        return self.residual

    def sent_at(self, indices: torch.Tensor) -> None:
        """residual = g_e - g_c, where g_c is g_e at `indices` and zero elsewhere."""
        self.residual.index_put_((indices,), self._zero)

    def sent(self, approximation: torch.Tensor) -> None:
        """residual = g_e - approximation (a tensor of the residual's shape, or a
        view of part of it with `approximation` of that part's shape)."""
        self.residual.sub_(approximation)

    def send_all_into(self, g: torch.Tensor) -> None:
        """Everything goes this step: the residual joins `g` and is cleared."""
        if self.dirty:
            g.add_(self.residual)
            self.residual.zero_()
            self.dirty = False


class Memory:
    """The residuals of one job, one per key, created at the first lossy step of
    a key and kept across families. Residuals restored by `load_state_dict` wait
    until a lossy step of a gradient of their size under their key (DDP rebuilds
    its buckets after the first step)."""

    def __init__(self) -> None:
        self.residuals: dict[object, ErrorFeedback] = {}
        self.pending: dict[object, torch.Tensor] = {}

    def compensate(self, key: object, g: torch.Tensor) -> torch.Tensor:
        return self._of(key, g).compensate(g)

    def update(self, key: object, sent: Callable[[ErrorFeedback], None] | None) -> None:
        """Take what a compressor sent off the key's residual (None: it sent all,
        which send_all_into already did)."""
        if sent is not None:
            sent(self.residuals[key])

    def send_all_into(self, key: object, g: torch.Tensor) -> None:
        """A lossless step: the key's residual joins `g`. A restored residual is
        left waiting: the first steps after a restart are dense while DDP may
        still lay its buckets out differently."""
        ef = self.residuals.get(key)
        if ef is not None and ef.residual.numel() == g.numel():
            ef.send_all_into(g)

    def _of(self, key: object, g: torch.Tensor) -> ErrorFeedback:
        ef = self.residuals.get(key)
        if ef is None or ef.residual.numel() != g.numel() or ef.residual.dtype != g.dtype:
            ef = ErrorFeedback(g.numel(), g.dtype, g.device)
            restored = self.pending.get(key)
            if restored is not None and restored.numel() == g.numel():
                ef.residual.copy_(self.pending.pop(key))
                ef.dirty = True
            self.residuals[key] = ef
        return ef

    def state_dict(self) -> dict[str, Any]:
        """The residuals, restored ones not yet used included (a checkpoint taken
        right after a restart must not lose them)."""
        kept = {k: v.clone() for k, v in self.pending.items()}
        kept.update({k: ef.residual.clone() for k, ef in self.residuals.items() if ef.dirty})
        return {"residuals": kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals.clear()
        self.pending = {k: v.clone() for k, v in state.get("residuals", {}).items()}
