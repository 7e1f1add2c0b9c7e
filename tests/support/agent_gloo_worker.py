"""One rank of a real 2-rank gloo job with the flexcomm hook; rank 0 gets its
decisions from the agent through AgentClient. Trains until the stop file
appears, then writes what it saw to result-<rank>.json.

    python agent_gloo_worker.py RANK PORT AGENT_SOCKET WORKDIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from flexcomm.client.agent_client import AgentClient
from flexcomm.client.hook import register


class TimedSource:
    """The agent client, with the time every call from the training step took."""

    def __init__(self, inner: AgentClient) -> None:
        self.inner = inner
        self.calls: list[float] = []

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.calls.append(time.perf_counter() - t0)

    def latest(self):
        return self._timed(self.inner.latest)

    def report(self, report) -> None:
        self._timed(self.inner.report, report)

    def close(self) -> None:
        self.inner.close()


def main() -> None:
    rank, port, sock, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    # ~1M parameters: steps of tens of ms, like a small real job (a toy model's 4 ms
    # steps would be shorter than one Python thread switch).
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    source = None
    if rank == 0:
        source = TimedSource(AgentClient(sock, job_id="gloo-job", world_size=2, grad_bytes=grad_bytes,
                                         nodes=["127.0.0.1"], policy="moo", timeout_s=0.5,
                                         poll_interval_s=0.1, retry_max_s=0.5))
    state = register(model, source=source, control_interval=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    starts, times = [], []
    while True:
        starts.append(time.time())
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0:  # written whole, then renamed: the test never reads a half-written count
            (workdir / "progress.tmp").write_text(str(len(times)))
            os.replace(workdir / "progress.tmp", workdir / "progress")
        stop = torch.tensor([1.0 if (workdir / "stop").exists() else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0 or len(times) >= 5000:
            break
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    choices = sorted({(s.compression.name, s.collective) for s in state.history})
    result = {"rank": rank, "starts": starts, "step_times": times, "checksum": checksum,
              "choices": choices, "source_calls": source.calls if source else []}
    state.close()
    dist.destroy_process_group()
    (workdir / f"result-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
