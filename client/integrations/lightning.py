"""flexcomm in Lightning: one callback.

    from flexcomm.client.integrations.lightning import FlexcommCallback
    trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[FlexcommCallback()])

When the fit starts (the strategy has wrapped the model in
DistributedDataParallel), it registers the hook with `flexcomm.register`'s
defaults (the node's agent, else the in-process MOO) or the options given,
which are FlexcommState's. Lightning's checkpoints carry every rank's hook
state (client/checkpoint.py), and a fit resumed from one restores each rank's
own. `callback.state` is the hook's state once the fit started; the job ends at
the fit's end.

On GPUs, Lightning's own way works too: `DDPStrategy(ddp_comm_state=
FlexcommState(policy=...), ddp_comm_hook=flexcomm_hook)` (the state joins the
process group at its first step); Lightning registers such hooks on CUDA only.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel

from flexcomm.client.checkpoint import EveryRank
from flexcomm.client.hook import FlexcommState
from flexcomm.client.job import register


class FlexcommCallback(pl.Callback):
    """Registers the flexcomm hook on the strategy's DDP model at the fit's start."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.checkpoint = EveryRank()
        self.state: FlexcommState | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise ValueError(f"FlexcommCallback: the strategy's model is a {type(model).__name__}, not "
                             "DistributedDataParallel (use strategy='ddp' with 2 or more devices)")
        self.state = register(model, **self.options)
        self.checkpoint.attach(self.state)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.state is not None:
            self.state.close()

    def state_dict(self) -> dict[str, Any]:
        return self.checkpoint.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.checkpoint.load_state_dict(state_dict)
