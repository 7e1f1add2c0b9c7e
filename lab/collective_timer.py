"""One rank of the collective timing grid: `python -m flexcomm.lab.collective_timer PLAN RANK`.

The calibration runner (`flexcomm.lab.calibrate`) starts one of these per node,
inside the node's namespace, for one (link rate, N) configuration. Each rank
joins a gloo process group and times, with the client's own transports and Top-k
communication (`flexcomm.client.collectives`, `client/compressors/topk.py`),
every (size, collective, CR) of the plan,
as many times as the plan's `point_repeats` says (short operations more often:
more repetitions cost them little and steady the median). Repetitions
are the outer loop, so a burst of load from other work on the machine hits one
repetition of many points rather than every repetition of one point (the
runner takes the median).

Each timed operation starts right after a barrier. A rank writes, per operation,
the monotonic clock (`time.perf_counter`, one clock for every process on the
machine) when it started and when the data had arrived (before the scatter into
the dense output, which the client counts as compression time). The runner takes
the operation's time as max(end) - max(start) over ranks: from the moment the
last rank joined to the moment the last rank had its result.

Before the grid, the selection time (t_comp) of the client's fast Top-k selector
is measured per (size, CR), and a tiny (one float) AllReduce is timed to give
the per-call latency gloo really has ("alpha from a tiny op").

Output: `<out_dir>/rank<R>.jsonl`, one JSON object per line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.collectives import Ring, Tree
from flexcomm.client.compressors import Bucket, Payload
from flexcomm.client.compressors.topk import TopK
from flexcomm.client.selection import k_for, make_selector
from flexcomm.client.stats import StepStats
from flexcomm.lab.trainer import exit_now
from flexcomm.policy.types import AG_TOPK, ART_RING, ART_TREE, DENSE_RING, TOPK, Decision

TINY_REPEATS = 15
COMP_REPEATS = 3
VALUE_BYTES = 4  # fp32 gradients


def _clock() -> float:
    return time.perf_counter()


class Timer:
    """Runs the plan's operations on one rank and writes what it measured."""

    def __init__(self, plan: dict[str, Any], rank: int) -> None:
        self.plan = plan
        self.rank = rank
        self.world = dist.get_world_size()
        self.ring = Ring(None)
        self.tree = Tree(None)
        self.topk = TopK()  # the client's own Top-k communication, as a step runs it
        self.select = make_selector("fast", seed=rank)
        self.out = open(Path(plan["out_dir"]) / f"rank{rank}.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def write(self, **record: Any) -> None:
        self.out.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.out.close()

    # --- operations: each returns (start, data arrived) on this rank ---------

    def dense(self, g: torch.Tensor, buf: torch.Tensor) -> tuple[float, float]:
        buf.copy_(g)
        dist.barrier()
        t0 = _clock()
        self.ring.allreduce_mean(buf).wait()
        return t0, _clock()

    def _topk_sends(self, collective: str, values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                    transport: Ring) -> float:
        """Top-k's communication of (values, indices) into `out`; the seconds until the data arrived."""
        decision = Decision(TOPK, 0.5, collective)  # the parameter is not read: the payload is made
        stats = StepStats(0, TOPK, 0.5, collective, 0)
        payload = Payload(Bucket("grid", out, [out.shape], 0), decision, (values, indices))
        self.topk.communicate(payload, transport, stats).wait()
        return stats.t_sync_s

    def ag_topk(self, values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> tuple[float, float]:
        dist.barrier()
        t0 = _clock()
        return t0, t0 + self._topk_sends(AG_TOPK, values, indices, out, self.ring)

    def ar_topk(self, collective: str, g: torch.Tensor, root_indices: torch.Tensor, root: int,
                out: torch.Tensor) -> tuple[float, float]:
        transport = self.tree if collective == ART_TREE else self.ring
        indices = root_indices.clone() if self.rank == root else torch.empty_like(root_indices)
        dist.barrier()
        t0 = _clock()
        transport.broadcast(indices, root)
        values = g[indices]
        broadcast = _clock()
        return t0, broadcast + self._topk_sends(collective, values, indices, out, transport)

    # --- the plan ------------------------------------------------------------

    def tiny_allreduce(self) -> None:
        t = torch.ones(1)
        for rep in range(-3, TINY_REPEATS):  # three warm-up calls, not recorded
            dist.barrier()
            t0 = _clock()
            dist.all_reduce(t)
            t1 = _clock()
            if rep >= 0:
                self.write(kind="tiny", rep=rep, start=t0, end=t1)

    def selection_times(self, grads: dict[int, torch.Tensor]) -> dict[tuple[int, float], torch.Tensor]:
        """t_comp per (size, CR) and the selected indices the grid then sends."""
        chosen = {}
        for size, g in grads.items():
            for cr in self.plan["crs"]:
                k = k_for(g.numel(), cr)
                samples = []
                for _ in range(COMP_REPEATS):
                    t0 = _clock()
                    idx = self.select(g, k)
                    values = g[idx].div_(self.world)
                    samples.append(_clock() - t0)
                chosen[(size, cr)] = idx
                self.write(kind="comp", size=size, cr=cr, k=k, t_comp_s=statistics.median(samples))
                del values
        return chosen

    def run(self) -> None:
        plan = self.plan
        gen = torch.Generator().manual_seed(1000 + self.rank)
        grads = {s: torch.randn(s // VALUE_BYTES, generator=gen) for s in plan["sizes"]}
        self.tiny_allreduce()
        chosen = self.selection_times(grads)
        self.warm_up()
        outs = {size: torch.empty_like(g) for size, g in grads.items()}
        points = plan["point_repeats"]
        for rep in range(max(n for *_, n in points)):
            for size, collective, cr, n in points:
                if rep < n:
                    op = self._op(collective, grads[size], outs[size], chosen.get((size, cr)), rep)
                    t0, t1 = op()
                    self.write(kind="op", size=size, collective=collective, cr=cr, rep=rep, start=t0, end=t1)
        dist.barrier()

    def warm_up(self) -> None:
        """Each collective once on a small tensor, so first-call costs stay out of the grid."""
        g = torch.randn(4096)
        out = torch.empty_like(g)
        idx = self.select(g, 64)
        for collective in self.plan["collectives"]:
            self._op(collective, g, out, idx, 0)()

    def _op(self, collective: str, g: torch.Tensor, out: torch.Tensor, idx: torch.Tensor | None,
            rep: int) -> Callable[[], tuple[float, float]]:
        if collective == DENSE_RING:
            return lambda: self.dense(g, out)
        assert idx is not None
        if collective == AG_TOPK:
            return lambda: self.ag_topk(g[idx], idx, out)
        if collective not in (ART_RING, ART_TREE):
            raise ValueError(f"collectives: cannot time {collective!r}")
        root = rep % self.world  # round-robin, as STAR-Topk
        return lambda: self.ar_topk(collective, g, idx, root, out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m flexcomm.lab.collective_timer PLAN.json RANK", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    rank = int(args[1])
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = plan["ifname"]
    dist.init_process_group("gloo", init_method=f"tcp://{plan['master_addr']}:{plan['master_port']}",
                            rank=rank, world_size=plan["world"])
    timer = Timer(plan, rank)
    try:
        timer.run()
    finally:
        timer.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
