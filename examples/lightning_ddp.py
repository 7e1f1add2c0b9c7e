"""flexcomm in a Lightning job: one callback. On 2 CPU processes (gloo):

    python examples/lightning_ddp.py --devices 2
    python examples/lightning_ddp.py --devices 2 --checkpoint /tmp/fc.ckpt   # then resumes from it

`FlexcommCallback()` registers the flexcomm hook on the strategy's DDP model
when the fit starts, with `flexcomm.register`'s defaults (the node's agent, else
the MOO in-process); Lightning's checkpoints carry every rank's hook state, and
a fit resumed from one gives each rank its own. The data are a synthetic
10-class problem (a fixed random teacher).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
import torch
from synthetic import teacher_data  # examples/synthetic.py, beside this script
from torch import nn
from torch.utils.data import DataLoader

from flexcomm.client.integrations.lightning import FlexcommCallback


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def fit(args: argparse.Namespace, steps: int, resume: Path | None) -> tuple[pl.Trainer, Classifier, FlexcommCallback]:
    torch.manual_seed(0)
    model = Classifier()
    flexcomm = FlexcommCallback(control_interval=5)  # flexcomm: the callback
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", max_steps=steps,
                         callbacks=[flexcomm], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(teacher_data(), batch_size=64, shuffle=True), ckpt_path=resume)
    return trainer, model, flexcomm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--checkpoint", type=Path, help="save a checkpoint here after the fit, then resume from it")
    args = ap.parse_args()
    trainer, model, flexcomm = fit(args, args.steps, None)
    report = {"rank": trainer.global_rank, "first_loss": sum(model.losses[:10]) / 10,
              "last_loss": sum(model.losses[-10:]) / 10, "decision": flexcomm.state.decision.label,
              "version": flexcomm.state.decision.version, "summary": flexcomm.state.summary()}
    if args.checkpoint is not None:
        trainer.save_checkpoint(args.checkpoint)  # every rank's flexcomm state goes in
        held = torch.load(args.checkpoint, weights_only=False)["callbacks"]
        report["ranks_in_checkpoint"] = len(next(iter(held.values()))["ranks"])
        saved_step = flexcomm.state.step
        trainer, model, flexcomm = fit(args, args.steps + 20, args.checkpoint)
        report["flexcomm_steps_after_resume"] = flexcomm.state.step - saved_step  # 20: its counter was restored
    print("flexcomm-report " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
