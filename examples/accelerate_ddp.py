"""flexcomm in an Accelerate job: one call after `accelerator.prepare`. On 2 CPU
processes (gloo):

    accelerate launch --cpu --num_processes 2 examples/accelerate_ddp.py
    torchrun --nproc-per-node 2 examples/accelerate_ddp.py --checkpoint /tmp/fc-acc   # then resumes from it

`register(accelerator, model)` puts the flexcomm hook on the prepared DDP model
with `flexcomm.register`'s defaults (the node's agent, else the MOO in-process)
and registers every rank's hook state for `accelerator.save_state` /
`load_state`. The data are a synthetic 10-class problem (a fixed random teacher).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from synthetic import teacher_data  # examples/synthetic.py, beside this script
from torch import nn
from torch.utils.data import DataLoader

from flexcomm.client.integrations.accelerate import register


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--checkpoint", type=Path, help="save the state here after training, then resume from it")
    args = ap.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    data = DataLoader(teacher_data(), batch_size=64, shuffle=True)
    model, opt, data = accelerator.prepare(net, opt, data)
    state = register(accelerator, model, control_interval=5)  # flexcomm: the one line
    losses: list[float] = []
    while len(losses) < args.steps:
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            losses.append(loss.item())
            if len(losses) == args.steps:
                break
    report = {"rank": accelerator.process_index, "first_loss": sum(losses[:10]) / 10,
              "last_loss": sum(losses[-10:]) / 10, "decision": state.decision.label,
              "version": state.decision.version, "summary": state.summary()}
    if args.checkpoint is not None:
        accelerator.save_state(args.checkpoint)  # every process: every rank's flexcomm state goes in
        accelerator.wait_for_everyone()  # every file written before any rank reads the folder back
        saved = state.state_dict()
        state.load_state_dict({"controller": {**saved["controller"], "step": 0},
                               "gradient_step": {}})  # forget, to see the restore bring it back
        accelerator.load_state(args.checkpoint)
        report["restored_step"] = state.step
        report["saved_step"] = saved["controller"]["step"]
    accelerator.wait_for_everyone()
    print("flexcomm-report " + json.dumps(report), flush=True)
    state.close()


if __name__ == "__main__":
    main()
