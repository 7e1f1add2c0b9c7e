"""Which per-step figure says what a compression costs a run: for each fixed
option, the two candidates measured on the same training, beside the quality the
run reached.

- gain: what the client reports, the share of each rank's compensated gradient
  (g + residual) the step sent, rank 0's, as the policy's error budget reads it;
- update error: ||u - mean(g)|| / ||mean(g)||, how far the update the group
  applied lies from the dense mean of this step's raw gradients (each rank's
  gradient recomputed on a copy of the model and all-reduced apart, so the
  measuring is outside the hook).

Real gloo ranks on loopback (no shaping: quality does not depend on the link),
the lab's workload, model, data shards and optimizer, through flexcomm's hook
with a fixed choice. The figures are medians over the steps after the first
dense ones; the quality is the held-out accuracy (or, for lm, the validation
loss) after --steps. The last printed line is one JSON object.

    .venv/bin/python bench/quality_measures.py [--workload cnn] [--steps 150] [--world 4]
        [--options "dense bf16 powersgd:1 powersgd:2 powersgd:4 topk:0.1 topk:0.033 topk:0.01"]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPTIONS = "dense bf16 powersgd:1 powersgd:2 powersgd:4 topk:0.1 topk:0.033 topk:0.01"
SKIP_STEPS = 2  # the hook's dense warm-up, and the first compressed step's cold start


def rank_main(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    from flexcomm.client.hook import register
    from flexcomm.lab.plan import WORKLOAD_DEFAULTS
    from flexcomm.lab.trainer import wrap
    from flexcomm.lab.workload import ShardLoader, WorkloadSpec, build_model, evaluate, load_dataset, loss_of
    from flexcomm.policy.static import StaticPolicy

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    spec, defaults = WorkloadSpec(name=args.workload), WORKLOAD_DEFAULTS[args.workload]
    data = load_dataset(spec)
    results = {}
    for option in args.options.split():
        model = build_model(spec, data.features, data.classes)
        ddp = wrap(model)
        state = register(ddp, source=StaticPolicy(option) if rank == 0 else None, warmup_steps=1)
        optimizer = _optimizer(model, defaults)
        loader = ShardLoader(data, rank, world, defaults["batch"], spec.seed)
        errors, gains = [], []
        for step, (x, y) in enumerate(_batches(loader, args.steps)):
            mean_g = _dense_mean(model, x, y, loss_of, world)
            optimizer.zero_grad(set_to_none=True)
            loss_of(ddp(x), y).backward()
            applied = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            if step >= SKIP_STEPS:
                errors.append(float((applied - mean_g).norm() / mean_g.norm()))
            optimizer.step()
            stats = state.last_stats()
            if stats is not None and stats.step >= SKIP_STEPS:
                gains.append(float(stats.gain))
        state.close()
        results[option] = {"update_error": statistics.median(errors),
                           "gain": statistics.median(gains) if gains else None,
                           **evaluate(model, data.x_test, data.y_test)}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def _optimizer(model: torch.nn.Module, defaults: dict) -> torch.optim.Optimizer:
    if defaults["optimizer"] == "adam":
        return torch.optim.AdamW(model.parameters(), lr=defaults["lr"], weight_decay=0.0)
    return torch.optim.SGD(model.parameters(), lr=defaults["lr"], momentum=0.9)


def _batches(loader, steps: int):
    epoch, done = 0, 0
    while True:
        for batch in loader.epoch(epoch):
            if done == steps:
                return
            yield batch
            done += 1
        epoch += 1


def _dense_mean(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_of, world: int) -> torch.Tensor:
    """The group's mean of this step's raw gradients, computed apart from the hook."""
    shadow = copy.deepcopy(model)
    loss_of(shadow(x), y).backward()
    g = torch.cat([p.grad.reshape(-1) for p in shadow.parameters()])
    dist.all_reduce(g)
    return g / world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="cnn", choices=("digits", "cnn", "lm", "synthetic"))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--options", default=OPTIONS, help="fixed choices, space separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flexcomm-quality-") as tmp:
        out = str(Path(tmp) / "results.pt")
        mp.spawn(rank_main, args=(args.world, str(Path(tmp) / "store"), args, out), nprocs=args.world)
        results = torch.load(out)
    metric = "loss" if args.workload == "lm" else "accuracy"
    print(f"{args.workload}, {args.world} ranks, {args.steps} steps; medians over steps {SKIP_STEPS}+")
    print(f"{'option':12s} {'update error':>12s} {'gain':>6s} {metric:>9s}")
    for option, r in results.items():
        gain = "-" if r["gain"] is None else f"{r['gain']:.3f}"
        print(f"{option:12s} {r['update_error']:12.3f} {gain:>6s} {r[metric]:9.4f}")
    print(json.dumps({"bench": "quality_measures", "workload": args.workload, "steps": args.steps,
                      "world": args.world, "metric": metric, "options": results}))


if __name__ == "__main__":
    main()
