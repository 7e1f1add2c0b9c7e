"""flexcomm in Accelerate: one call after `accelerator.prepare`.

    from flexcomm.client.integrations.accelerate import register
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    state = register(accelerator, model)

Accelerate's `DistributedDataParallelKwargs(comm_hook=...)` takes only PyTorch's
own hooks, so the hook is registered on the prepared DistributedDataParallel
model directly, with `flexcomm.register`'s defaults (the node's agent, else the
in-process MOO) or the options given (FlexcommState's). The state of every rank
is registered for checkpointing: `accelerator.save_state(...)` (called on every
process, as Accelerate asks) keeps each rank's residuals, and
`accelerator.load_state(...)` gives each rank its own.
"""

from __future__ import annotations

from typing import Any

import accelerate
import torch
from torch.nn.parallel import DistributedDataParallel

from flexcomm.client.checkpoint import EveryRank
from flexcomm.client.hook import FlexcommState
from flexcomm.client.job import register as register_hook


def register(accelerator: accelerate.Accelerator, model: torch.nn.Module, **options: Any) -> FlexcommState:
    """Register the flexcomm hook on the prepared `model` and its state for
    `accelerator`'s checkpoints. Returns the state."""
    if not isinstance(model, DistributedDataParallel):
        raise ValueError(f"model: a {type(model).__name__}, not the DistributedDataParallel model "
                         "accelerator.prepare() returns with 2 or more processes")
    state = register_hook(model, **options)
    accelerator.register_for_checkpointing(EveryRank(state))
    return state
