"""How big the lab's workloads are and what a step computes, as the lab runs them.

For each workload: parameters, gradient MB, and the median time of a forward and
backward pass without communication (the lab's `compute_s`: DDP's no_sync, one
thread per rank) with `--world` ranks computing at once on this machine, as in a
lab run. Goal for lm: a 3-15 MB gradient and 0.1-0.5 s a step with 4 ranks here,
so that communication dominates a step on slow links and compute on fast ones.
The last printed line is one JSON object, keyed by workload.

    .venv/bin/python bench/lab_workloads.py [--world 4] [--steps 20] [--workloads lm,cnn,digits]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    from flexcomm.lab.plan import WORKLOAD_DEFAULTS
    from flexcomm.lab.trainer import compute_seconds, wrap
    from flexcomm.lab.workload import ShardLoader, WorkloadSpec, build_model, load_dataset

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = {}
    for name in args.workloads.split(","):
        spec = WorkloadSpec(name=name)
        data = load_dataset(spec)
        model = build_model(spec, data.features, data.classes)
        batch = ShardLoader(data, rank, world, WORKLOAD_DEFAULTS[name]["batch"], spec.seed).epoch(0)[0]
        ddp = wrap(model)
        seconds = []
        for _ in range(args.steps):  # every sample starts on all ranks at once
            dist.barrier()
            seconds.append(compute_seconds(ddp, batch, steps=2))
        results[name] = {"params": sum(p.numel() for p in model.parameters()),
                         "compute_s": statistics.median(seconds)}
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workloads", default="lm,cnn,digits")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        mp.spawn(rank_main, args=(args.world, os.path.join(tmp, "store"), args, out),
                 nprocs=args.world, join=True)
        ranks = [torch.load(f"{out}.{r}") for r in range(args.world)]
    summary = {}
    for name in args.workloads.split(","):
        params = ranks[0][name]["params"]
        compute = statistics.median(r[name]["compute_s"] for r in ranks)
        spread = [min(r[name]["compute_s"] for r in ranks), max(r[name]["compute_s"] for r in ranks)]
        summary[name] = {"params": params, "gradient_mb": 4 * params / 1e6,
                         "compute_s": compute, "compute_s_ranks": spread}
        print(f"{name}: {params / 1e6:.2f} M parameters, {4 * params / 1e6:.2f} MB of gradient, "
              f"{1000 * compute:.0f} ms a step with {args.world} ranks at once "
              f"(ranks' medians {1000 * spread[0]:.0f}-{1000 * spread[1]:.0f} ms)")
    print(json.dumps({"world": args.world, **summary}))


if __name__ == "__main__":
    main()
