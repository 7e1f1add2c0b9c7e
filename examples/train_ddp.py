"""Train a small classifier with DDP and the flexcomm hook, launched by torchrun.

CPU (gloo) and GPU (NCCL) alike; the backend follows the hardware:

    torchrun --nproc-per-node 4 examples/train_ddp.py --compression topk:0.01 --collective ag_topk
    torchrun --nproc-per-node 4 examples/train_ddp.py --policy moo \
        --latency 1ms --bandwidth 200Mbit
    torchrun --nproc-per-node 4 examples/train_ddp.py --agent      # the node's flexcomm agent

Without a choice it runs `flexcomm.register(model)`: the node's agent if one
answers, else the MOO in-process. What a user copies into their own script is
marked "flexcomm:" below: the import and one line after wrapping the model in
DistributedDataParallel.
The data are a synthetic 10-class problem (a fixed random teacher network), so
the example needs nothing but torch. The NCCL path is untested on this project's
CI machines (no GPU there).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import flexcomm  # flexcomm: the import
from flexcomm.client.layout import layout_of


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--compression", help="a fixed compression: dense, bf16, powersgd:RANK, topk:CR")
    ap.add_argument("--collective", help="dense_ring, dense_tree, ag_topk, art_ring, art_tree")
    ap.add_argument("--root", default="star", help="AR-Topk root: star or var")
    ap.add_argument("--policy", help="in-process policy: dense, static, moo, gravac")
    ap.add_argument("--latency", help="for --policy: the network's latency, e.g. 1ms")
    ap.add_argument("--bandwidth", help="for --policy: the network's bandwidth, e.g. 200Mbit")
    ap.add_argument("--agent", nargs="?", const="", default=None, metavar="SOCKET",
                    help="ask the node's agent (the default without a choice; its socket: $FLEXCOMM_AGENT_SOCKET, "
                    "else /run/flexcomm/agent.sock; or host:port); --policy names the agent's policy")
    ap.add_argument("--global-topk", action="store_true", help="one Top-k over all buckets")
    ap.add_argument("--control-interval", type=int, default=10)
    return ap.parse_args()


def teacher_data(rank: int, features: int = 128, classes: int = 10):
    teacher = nn.Linear(features, classes)
    torch.nn.init.normal_(teacher.weight, std=1.0, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1 + rank)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, features, generator=gen)
        with torch.no_grad():
            return x, teacher(x).argmax(1)

    return batch


def hook_options(args: argparse.Namespace, model: nn.Module, world: int) -> dict:
    """Turn the command line into flexcomm.register() options: a fixed choice, an
    in-process policy, or (the default) the node's agent, else the MOO in-process."""
    options: dict = {"control_interval": args.control_interval, "global_topk": args.global_topk}
    if args.compression:
        options.update(compression=args.compression, collective=args.collective, root=args.root)
    elif args.policy and args.agent is None:
        from flexcomm.policy import make_policy
        from flexcomm.policy.types import NetworkObservation
        from flexcomm.units import parse_duration, parse_rate

        layout = layout_of(model)  # the gradient's matrices and value width, for the cost model
        policy = make_policy(args.policy, grad_bytes=layout.grad_bytes, nodes=world, layout=layout)
        if args.latency and args.bandwidth:
            policy.observe_network(NetworkObservation.from_link(
                parse_duration("latency", args.latency),
                parse_rate("bandwidth", args.bandwidth), world))
        options["policy"] = policy
    else:
        options.update(agent=args.agent or None, agent_policy=args.policy or "moo")
    return options


def main() -> None:
    args = parse_args()
    # flexcomm logs (rank 0) each decision it adopts, with the policy's reason.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[device] if cuda else None)
    state = flexcomm.register(model, **hook_options(args, net, world))  # flexcomm: the hook
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    batch = teacher_data(rank)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.batch)
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            s = state.last_stats()  # flexcomm: optional, what the step ran and measured
            print(f"step {step:4d} loss {loss.item():.3f} {s.compression.name}@{s.collective} "
                  f"gain={s.gain:.3f} t_sync={s.t_sync_s * 1e3:.1f}ms "
                  f"sent={s.bytes_sent}B", flush=True)
    x, y = batch(2048)
    with torch.no_grad():
        acc = (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()
    if rank == 0:
        print(f"done: {args.steps} steps in {time.perf_counter() - t0:.1f}s, "
              f"accuracy {acc:.3f}", flush=True)
        print("flexcomm summary:", state.summary(), flush=True)  # flexcomm: optional, what the job chose
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
