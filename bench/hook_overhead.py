"""Overhead of the flexcomm hook in dense mode against PyTorch's allreduce_hook.

Four gloo ranks (processes on loopback) train two identical DDP models side by
side, one with the built-in `allreduce_hook` and one with flexcomm's hook in
dense mode (its control-interval agreement included), alternating step by step
so both see the same machine load. `step_time_ratio` is flexcomm's median step
time over the built-in's; the median of the per-pair ratios and the means are
printed too (on a shared machine they move by several percent run to run).
Goal: step_time_ratio <= 1.03.
The last printed line is one JSON object with `step_time_ratio`.

    .venv/bin/python bench/hook_overhead.py [--world 4] [--steps 200] [--width 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def rank_main(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from flexcomm.client.hook import register

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    builtin = nn.parallel.DistributedDataParallel(model(args.width))
    builtin.register_comm_hook(None, allreduce_hook)
    ours = nn.parallel.DistributedDataParallel(model(args.width))
    register(ours, control_interval=args.control_interval)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    times: dict[str, list[float]] = {"builtin": [], "flexcomm": []}
    for step in range(args.warmup + args.steps):
        # Alternate which goes first so neither always follows the other.
        order = [("builtin", builtin), ("flexcomm", ours)]
        for name, m in order if step % 2 == 0 else order[::-1]:
            dist.barrier()
            t0 = time.perf_counter()
            m.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(m(x), y).backward()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        torch.save(times, out)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--control-interval", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flexcomm-bench-") as tmp:
        out = os.path.join(tmp, "times.pt")
        mp.start_processes(rank_main, args=(args.world, os.path.join(tmp, "store"), args, out),
                           nprocs=args.world, start_method="spawn")
        times = torch.load(out)
    med = {k: statistics.median(v) for k, v in times.items()}
    params = sum(p.numel() for p in model(args.width).parameters())
    ratio = med["flexcomm"] / med["builtin"]
    paired = statistics.median(f / b for f, b in zip(times["flexcomm"], times["builtin"],
                                                     strict=True))
    print(f"{args.world} gloo ranks, {params} parameters, {args.steps} steps each: "
          f"builtin {med['builtin'] * 1e3:.1f} ms, flexcomm dense {med['flexcomm'] * 1e3:.1f} ms, "
          f"ratio {ratio:.4f}")
    print(json.dumps({
        "step_time_ratio": ratio,
        "paired_ratio_median": paired,
        "builtin_median_s": med["builtin"],
        "flexcomm_median_s": med["flexcomm"],
        "builtin_mean_s": statistics.fmean(times["builtin"]),
        "flexcomm_mean_s": statistics.fmean(times["flexcomm"]),
        "world": args.world, "parameters": params, "steps": args.steps,
        "control_interval": args.control_interval,
    }))


if __name__ == "__main__":
    main()
