"""Overhead of the flexcomm hook against PyTorch's own hook for the same choice.

Four gloo ranks (processes on loopback) train two identical DDP models side by
side, one with PyTorch's hook and one with flexcomm's hook fixed on the same
choice (its control-interval agreement included): dense against the built-in
`allreduce_hook` (the default), or `--compression powersgd:R` against
`powerSGD_hook` at rank R (error feedback and warm start on, as flexcomm's),
alternating step by step
so both see the same machine load. `step_time_ratio` is flexcomm's median step
time over the built-in's; the median of the per-pair ratios and the means are
printed too (on a shared machine they move by several percent run to run).
Goal: step_time_ratio <= 1.03 (dense).
The last printed line is one JSON object with `step_time_ratio`.

    .venv/bin/python bench/hook_overhead.py [--world 4] [--steps 200] [--width 1024]
        [--compression powersgd:4] [--control-interval 10] [--control-period-s 0.1]
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

from flexcomm.client.agreement import CONTROL_PERIOD_S
from flexcomm.lab.workload import gradient_bytes


def model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def one_bucket(m: nn.Module) -> nn.parallel.DistributedDataParallel:
    """`m` in DDP on a group of its own (the two hooks' collectives never share a
    queue) with one bucket: PyTorch's PowerSGD hook starts AllReduces from
    completion callbacks, and with two buckets gloo ranks issue them out of order
    and abort (as the lab's models, flexcomm.lab.trainer.wrap)."""
    return nn.parallel.DistributedDataParallel(m, process_group=dist.new_group(),
                                               bucket_cap_mb=gradient_bytes(m) / 2**20 + 1.0)


def register_builtin(ddp: nn.parallel.DistributedDataParallel, compression: str) -> None:
    """PyTorch's own hook for `compression` ("dense" or "powersgd:R")."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if compression == "dense":
        ddp.register_comm_hook(None, allreduce_hook)
        return
    family, _, rank = compression.partition(":")
    if family != "powersgd" or not rank.isdigit():
        raise SystemExit(f"hook_overhead: --compression {compression!r}: expected dense or powersgd:RANK")
    # PowerSGD's smallest start with error feedback and warm start; the warm-up steps cover it.
    state = psgd.PowerSGDState(process_group=ddp.process_group, matrix_approximation_rank=int(rank),
                               start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)


def rank_main(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    from flexcomm.client.hook import register

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    builtin = one_bucket(model(args.width))
    register_builtin(builtin, args.compression)
    ours = one_bucket(model(args.width))
    fixed = {"compression": args.compression} if args.compression != "dense" else {}
    register(ours, control_interval=args.control_interval, control_period_s=args.control_period_s, **fixed)
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
    # Each model's group first, no hook work in flight: torn down with the default
    # group, PyTorch's PowerSGD state aborted one run in three ("Resource deadlock
    # avoided").
    dist.barrier()
    for m in (builtin, ours):
        dist.destroy_process_group(m.process_group)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--control-interval", type=int, default=10)
    ap.add_argument("--control-period-s", type=float, default=CONTROL_PERIOD_S,
                    help="the hook's control_period_s (0: every --control-interval steps)")
    ap.add_argument("--compression", default="dense", help="dense or powersgd:RANK (both hooks fixed on it)")
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
          f"PyTorch's hook {med['builtin'] * 1e3:.1f} ms, flexcomm {med['flexcomm'] * 1e3:.1f} ms "
          f"({args.compression}), "
          f"ratio {ratio:.4f}")
    print(json.dumps({
        "step_time_ratio": ratio,
        "paired_ratio_median": paired,
        "builtin_median_s": med["builtin"],
        "flexcomm_median_s": med["flexcomm"],
        "builtin_mean_s": statistics.fmean(times["builtin"]),
        "flexcomm_mean_s": statistics.fmean(times["flexcomm"]),
        "world": args.world, "parameters": params, "steps": args.steps,
        "control_interval": args.control_interval, "control_period_s": args.control_period_s,
        "compression": args.compression,
    }))


if __name__ == "__main__":
    main()
