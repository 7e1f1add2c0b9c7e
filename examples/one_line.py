"""The smallest flexcomm job: a plain torch DDP loop and one flexcomm line, with
two more for a checkpoint. Launched by torchrun, CPU (gloo) or GPU (NCCL):

    torchrun --nproc-per-node 2 examples/one_line.py
    torchrun --nproc-per-node 2 examples/one_line.py --checkpoint /tmp/ckpt   # saves, and resumes if there

`flexcomm.register(model)` asks the node's agent (its socket: $FLEXCOMM_AGENT_SOCKET,
else /run/flexcomm/agent.sock) under a job id unique to this run, or decides
in-process with the MOO when no agent answers (it says so once); each real
change of decision is one log line with its reason. The data are a synthetic
10-class problem (a fixed random teacher), so nothing but torch is needed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import flexcomm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--checkpoint", type=Path, help="a folder: saved at the end, resumed from if present")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[device] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    state = flexcomm.register(model)  # the one flexcomm line

    saved = args.checkpoint / f"rank{rank}.pt" if args.checkpoint else None
    if saved is not None and saved.exists():
        ckpt = torch.load(saved, weights_only=False)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        state.load_state_dict(ckpt["flexcomm"])  # checkpoint line 1 of 2: every rank its own
    teacher = nn.Linear(128, 10).to(device)
    torch.nn.init.normal_(teacher.weight, std=1.0, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1 + rank + state.step)
    first = last = None
    for _ in range(args.steps):
        x = torch.randn(64, 128, generator=gen).to(device)
        loss = nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "flexcomm": state.state_dict()}, saved)  # checkpoint line 2 of 2
    if rank == 0:
        print(f"loss {first:.3f} -> {last:.3f}; now {state.decision.label} (v{state.decision.version}), "
              f"step {state.step}", flush=True)
        print("summary:", state.summary(), flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
