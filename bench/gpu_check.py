"""The GPU check (`make gpu-check`): the client on CUDA tensors, run by anyone with a GPU.

On a machine with a CUDA device:
1. the compression benchmark on it (`bench/compress.py --device cuda --selector
   S`, CUDA events);
2. DDP training on CUDA tensors with --ranks gloo ranks sharing the one GPU, for
   every family and collective (every option the client runs, each with the
   probes' gains read on rank 0), checking that
   - every rank ends with the same parameters, bit for bit;
   - dense over dense_ring matches PyTorch's allreduce_hook bit for bit, step by step;
   - the hook's per-bucket work reads nothing back from the device
     (`client.syncguard.no_host_sync`: CUDA's sync debug mode and the
     Python-level net), and no synchronizing CUDA call happens anywhere in the
     backward (the hook, its collectives' callbacks, the step's statistics);
   - every step's statistics come in, with sync times from CUDA events.
NCCL refuses two ranks on one GPU, so the collectives run on gloo. On gloo some
waits are the host's by nature (it runs collectives on the host): a broadcast
(AR-Topk's indices), PowerSGD's first round and the tree's staging wait for the
bucket's data; on NCCL these only make the stream wait.

On a machine without a GPU it says so and exits 0; on one whose torch is a CPU
build while nvidia-smi lists a GPU, it says that (exit 2): install a CUDA build
of torch. `--device cpu` runs the same training checks on CPU tensors, as the
test suite does. Both use --selector (default "radix", the radix select by
Triton kernels; "sync_free" the sampled one; "auto" would give buckets this
small to torch.topk). Exits 1 if a check fails. The last printed
line is one JSON object.

    .venv/bin/python bench/gpu_check.py [--ranks 3] [--steps 6] [--device cpu] [--datasets DIR] [--selector radix]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

CASES = [  # (family, param, collective, root)
    ("dense", 0, "dense_ring", "star"), ("dense", 0, "dense_tree", "star"),
    ("bf16", 0, "dense_ring", "star"), ("bf16", 0, "dense_tree", "star"),
    ("powersgd", 1, "dense_ring", "star"), ("powersgd", 4, "dense_ring", "star"),
    ("topk", 0.01, "ag_topk", "star"),
    ("topk", 0.01, "art_ring", "star"), ("topk", 0.01, "art_ring", "var"),
    ("topk", 0.01, "art_tree", "star"), ("topk", 0.01, "art_tree", "var"),
]
PROBES = ("topk:0.1", "topk:0.01", "powersgd:1", "powersgd:4")


def model() -> nn.Module:
    # A 512 x 512 layer alone is a bucket above the device selectors' 65,536-entry floor.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7919 * rank + step)
    return torch.randn(32, 64, generator=gen).to(device), torch.randint(0, 10, (32,), generator=gen).to(device)


class FixedSource:
    """Rank 0's decisions: one option, with the probes' gains asked for."""

    def __init__(self, decision) -> None:
        self.decision = decision

    def latest(self):
        return self.decision

    def report(self, report) -> None:
        pass

    def close(self) -> None:
        pass


def guarded(run):
    """The hook's per-bucket work under no_host_sync()."""
    from flexcomm.client.syncguard import no_host_sync

    def checked(*args, **kwargs):
        with no_host_sync():
            return run(*args, **kwargs)

    return checked


def ddp(module: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module.to(device), device_ids=ids, bucket_cap_mb=0.5)


def run_case(case: tuple, rank: int, args: argparse.Namespace, device: torch.device) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from flexcomm.client.hook import register
    from flexcomm.client.syncguard import no_cuda_sync
    from flexcomm.policy.types import Decision

    family, param, collective, root = case
    ours = ddp(model(), device)
    # The device selector asked for, on every device: "auto" leaves a bucket this small to torch.topk.
    state = register(ours, source=FixedSource(Decision(family, param, collective, root=root, probes=PROBES)),
                     control_interval=2, probe_interval=2, warmup_steps=1, selector=args.selector)
    state.gradient_step.run = guarded(state.gradient_step.run)
    twin = ddp(model(), device) if (family, collective) == ("dense", "dense_ring") else None
    if twin is not None:
        twin.register_comm_hook(None, allreduce_hook)
    models = [m for m in (ours, twin) if m is not None]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    grads_equal = []
    for step in range(args.steps):
        x, y = batch(rank, step, device)
        for m, opt in zip(models, opts, strict=True):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x), y)
            with no_cuda_sync():
                loss.backward()
        if twin is not None:
            grads_equal.append(all(torch.equal(a.grad, b.grad) for a, b in
                                   zip(ours.parameters(), twin.parameters(), strict=True)))
        for opt in opts:
            opt.step()
    state.close()
    mine = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
    every = [torch.empty_like(mine) for _ in range(args.ranks)]
    dist.all_gather(every, mine)
    history = list(state.history)
    return {
        "identical": all(torch.equal(every[0], other) for other in every[1:]),
        "dense_bitwise": grads_equal if twin is not None else None,
        "twin_identical": all(torch.equal(a, b) for a, b in zip(ours.parameters(), twin.parameters(), strict=True))
        if twin is not None else None,
        "ran": [s.compression.name for s in history],
        "synced": sum(s.t_sync_s > 0 for s in history),
        "steps": len(history),
        "gains": sum(bool(s.probes) for s in history),
    }


def rank_main(rank: int, args: argparse.Namespace, tmp: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)  # every rank shares the one GPU
        device = torch.device("cuda", 0)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=args.ranks)
    results = {}
    from flexcomm.policy.types import Compression

    for case in CASES:
        label = f"{Compression(case[0], case[1]).name} {case[2]} {case[3]}"
        try:
            results[label] = run_case(case, rank, args, device)
        except Exception as e:
            raise RuntimeError(f"{label} on rank {rank}: {type(e).__name__}: {e}") from e
    torch.save(results, Path(tmp) / f"rank{rank}.pt")
    dist.destroy_process_group()


def failures(results: list[dict], steps: int) -> list[str]:
    """What every rank's results say went wrong, one line each."""
    out = []
    for label, first in results[0].items():
        if not first["identical"]:
            out.append(f"{label}: ranks ended with different parameters")
        if first["dense_bitwise"] is not None and not (all(first["dense_bitwise"]) and first["twin_identical"]):
            out.append(f"{label}: differs from PyTorch's allreduce_hook (per step: {first['dense_bitwise']})")
        if first["steps"] != steps or first["synced"] != steps:
            out.append(f"{label}: {first['steps']} of {steps} steps' statistics, {first['synced']} with a sync time")
        if not first["gains"]:
            out.append(f"{label}: rank 0 read no probe gains")
        if any(r[label]["ran"] != first["ran"] for r in results[1:]):
            out.append(f"{label}: ranks ran different options")
    return out


def compression_benchmark(datasets: str | None, selector: str) -> dict:
    bench = Path(__file__).with_name("compress.py")
    extra = [] if datasets is None else ["--datasets", datasets]
    done = subprocess.run([sys.executable, str(bench), "--device", "cuda", "--selector", selector, *extra],
                          capture_output=True, text=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu-check: bench/compress.py failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpus_listed() -> list[str]:
    """The GPUs nvidia-smi lists (none without the driver's tools)."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")] if done.returncode == 0 else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3, help="gloo ranks sharing the GPU (>= 2)")
    ap.add_argument("--steps", type=int, default=6, help="training steps per option (>= 3)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--datasets", help="the lab workloads' data for the benchmark (bench/compress.py --datasets)")
    ap.add_argument("--selector", default="radix", choices=["radix", "sync_free"],
                    help="the Top-k selector the benchmark and the training checks use")
    args = ap.parse_args()
    if args.ranks < 2 or args.steps < 3:
        ap.error("ranks: at least 2; steps: at least 3 (one dense warm-up, then the option)")
    if args.device == "cuda" and not torch.cuda.is_available():
        torch_build = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
        if torch.version.cuda is None and gpus_listed():
            print(f"gpu-check: nvidia-smi lists {gpus_listed()[0]!r} but this torch has no CUDA ({torch_build}): "
                  f"install a CUDA build of torch==2.13.0 into {sys.prefix}", file=sys.stderr)
            return 2
        print(f"gpu-check: no CUDA device on this machine ({torch_build}); nothing to check")
        print(json.dumps({"gpu": False, "checked": False}))
        return 0
    summary: dict = {"gpu": args.device == "cuda", "device": args.device, "ranks": args.ranks, "steps": args.steps,
                     "selector": args.selector}
    if args.device == "cuda":
        summary["device_name"] = torch.cuda.get_device_name(0)
        summary["compress"] = compression_benchmark(args.datasets, args.selector)
    with tempfile.TemporaryDirectory(prefix="flexcomm-gpu-check-") as tmp:
        mp.start_processes(rank_main, args=(args, tmp), nprocs=args.ranks, start_method="spawn")
        results = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(args.ranks)]
    for label, first in results[0].items():
        print(f"{label:<26} identical={first['identical']} ran={','.join(sorted(set(first['ran'])))} "
              f"statistics={first['synced']}/{first['steps']}")
    problems = failures(results, args.steps)
    for line in problems:
        print(f"gpu-check: FAILED {line}")
    summary.update(checked=True, ok=not problems, problems=problems, options=len(results[0]))
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
