"""A hook state in a framework's checkpoint: every rank's, in the one file.

Frameworks (Lightning, Accelerate) write a checkpoint from rank 0 alone, but
each rank's hook state differs (its error-feedback residuals, PowerSGD's
factors), and a resumed rank must get its own, not rank 0's. `EveryRank` is the
object a framework checkpoints: its `state_dict()` gathers every rank's state
(one all_gather_object, so every rank must call it, as the frameworks do when
they save) and `load_state_dict()` gives each rank its own back, also before
the hook exists (it is applied when `attach` gives it the state).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.runner import Runner

log = logging.getLogger("flexcomm.client")


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(v) for v in value)
    return value


class EveryRank:
    """Every rank's hook state as one checkpointable object."""

    def __init__(self, state: Runner | None = None) -> None:
        self.state = state
        self._pending: dict[str, Any] | None = None

    def attach(self, state: Runner) -> None:
        """The hook state, once it exists; a state loaded before is restored into it."""
        self.state = state
        if self._pending is not None:
            pending, self._pending = self._pending, None
            state.load_state_dict(pending)

    def state_dict(self) -> dict[str, Any]:
        """{"ranks": [rank 0's state, rank 1's, ...]} on every rank (every rank calls it)."""
        if self.state is None:
            return {}
        mine = _on_cpu(self.state.state_dict())
        ranks: list[Any] = [None] * dist.get_world_size(self.state.process_group)
        dist.all_gather_object(ranks, mine, group=self.state.process_group)
        return {"ranks": ranks}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Take this rank's own state from what `state_dict` gathered."""
        ranks = saved.get("ranks") if saved else None
        if not ranks:
            return
        rank = dist.get_rank(self.state.process_group if self.state is not None else None)
        if rank >= len(ranks):
            log.warning("the checkpoint holds the flexcomm state of %d ranks; rank %d starts afresh",
                        len(ranks), rank)
            return
        if self.state is None:
            self._pending = ranks[rank]
        else:
            self.state.load_state_dict(ranks[rank])
