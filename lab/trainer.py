"""One rank of a lab training job: `python -m flexcomm.lab.trainer CONFIG RANK`.

The runner starts one of these per node (inside the node's namespace, with
GLOO_SOCKET_IFNAME set to its interface). Each joins a gloo process group, wraps
the workload's model in DDP with the gradient synchronisation the config names
(the flexcomm hook driven by a policy, or PyTorch's own PowerSGD hook), and trains.

Rank 0 writes one JSON object per line to the records file: a "start" record, an
"epoch" record at each epoch boundary, a "step" record per step and an "eval"
record (held-out loss and accuracy) every `eval_every` steps, then "end". Times
are on a training clock that starts after the process group is up and stops
while rank 0 evaluates or waits for the network schedule to be applied (so wall
times compare across policies).

Before the clock starts, every rank computes `COMPUTE_PROBE_STEPS` forward and
backward passes without communicating (DDP's `no_sync`) at once, as they will
in training; the start record's `compute_s` is rank 0's median: what a step
would cost if communication were free.

With `budget_s`, every rank trains until rank 0's training clock reaches the
budget, so policies compare at equal training time; otherwise it trains `steps`
steps. Either way the last step is evaluated. Rank 0 reads its clock against the
budget only every few steps, closer as the budget nears, and broadcasts when to
look next (off the clock): a broadcast before every step put one round trip of
the slow link into the hook's wall time of every step, and so into the compute
time the policy's step-time model is told.

At an epoch boundary, when `epoch_ack` is set, rank 0 waits (up to
`epoch_ack_timeout_s`) until the runner has written an epoch number >= the new
one to the file `epoch_ack`: the runner shapes the links for that epoch first, so
every policy trains the same steps under the same network.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flexcomm.lab.plan import OPTIMIZERS
from flexcomm.lab.sync import attach_sync
from flexcomm.lab.workload import (
    ShardLoader,
    WorkloadSpec,
    build_model,
    evaluate,
    gradient_bytes,
    load_dataset,
    loss_of,
)

COMPUTE_PROBE_STEPS = 8  # the first is a warm-up and not counted
STOP_LOOK_INTERVAL = 10  # steps between rank 0's looks at the budget while it is far


@dataclass
class TrainConfig:
    """Everything a rank needs; the runner writes it as JSON, one file per job."""

    policy: str
    world: int
    master_addr: str
    master_port: int
    records: str
    workload: dict[str, Any] = field(default_factory=dict)
    policy_options: dict[str, Any] = field(default_factory=dict)
    hook_options: dict[str, Any] = field(default_factory=dict)
    node_addresses: list[str] = field(default_factory=list)
    dataset_cache: str = ""  # a torch.save'd Dataset, so ranks skip building it
    agent_socket: str = ""  # empty: the policy runs in-process on rank 0
    ifname: str = ""  # GLOO_SOCKET_IFNAME; empty leaves gloo's default
    steps: int = 200  # ignored when budget_s is set
    budget_s: float = 0.0  # > 0: train this many seconds of training clock instead
    batch: int = 32
    optimizer: str = "sgd"  # one of OPTIMIZERS; adam is AdamW without weight decay
    lr: float = 0.01
    momentum: float = 0.9
    eval_every: int = 5
    threads: int = 1
    epoch_ack: str = ""
    epoch_ack_timeout_s: float = 30.0
    job_id: str = "lab"

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))


class TrainClock:
    """Seconds of training so far, excluding the intervals inside `paused()`."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._start - self._paused

    def pause_for(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._paused += time.perf_counter() - t0


class Records:
    """Rank 0's JSONL file (other ranks write nothing)."""

    def __init__(self, path: str, enabled: bool) -> None:
        self._file = open(path, "a", buffering=1) if enabled else None  # noqa: SIM115

    def write(self, kind: str, **fields: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"kind": kind, **fields}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def next_look(step: int, now: float, budget_s: float, step_s: float | None,
              interval: int = STOP_LOOK_INTERVAL) -> int:
    """The step before which rank 0 next reads its clock against the budget,
    looking at `step` with `now` seconds trained at `step_s` a step lately
    (None: not known yet); `step` itself means stop now. Looks are `interval`
    steps apart while the budget is far, and close in as it nears (a quarter of
    the steps it has left, then every step), so training still stops at the
    first step that starts past the budget unless its steps slow down more than
    fourfold within a look."""
    if now >= budget_s:
        return step
    if step_s is None or step_s <= 0:
        return step + 1
    steps_left = (budget_s - now) / step_s
    return step + max(1, min(interval, int(steps_left / 4)))


class StopRule:
    """Whether training is over before the next step, the same answer on every
    rank: after `steps` steps, or once the last step rank 0 trained ended at or
    past `budget_s` of its training clock. Rank 0 compares only at the steps
    `next_look` names and broadcasts the next such step (its own step: stop), so
    most steps cost no collective; the broadcast is kept off the training clock.
    Every rank calls it with the same steps, so every rank joins the same
    broadcasts. The comparison uses the clock as the last step ended, not as the
    look begins: the records written between the two are not training, and a
    look that read them could stop before the step that reaches the budget."""

    def __init__(self, cfg: TrainConfig, clock: TrainClock, rank: int) -> None:
        self.cfg = cfg
        self.clock = clock
        self.rank = rank
        self.done = False
        self.look_at = 0
        self._last_look: tuple[int, float] | None = None  # rank 0: (step, clock) at the last look

    def __call__(self, step: int, trained_s: float) -> bool:
        """`trained_s`: the training clock when step `step - 1` ended."""
        if self.done:
            return True
        if self.cfg.budget_s <= 0:
            self.done = step >= self.cfg.steps
        elif step == self.look_at:
            self.look_at = self.clock.pause_for(self._look, step, trained_s)
            self.done = self.look_at == step
        return self.done

    def _look(self, step: int, now: float) -> int:
        answer = torch.tensor([0], dtype=torch.int64)
        if self.rank == 0:
            step_s = None
            if self._last_look is not None and step > self._last_look[0]:
                step_s = (now - self._last_look[1]) / (step - self._last_look[0])
            self._last_look = (step, now)
            answer[0] = next_look(step, now, self.cfg.budget_s, step_s)
        dist.broadcast(answer, src=0)  # rank 0's clock decides for everyone
        return int(answer.item())


def wait_for_epoch_ack(path: str, epoch: int, timeout_s: float) -> bool:
    """True once the runner has acknowledged `epoch` (its links are shaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if int(Path(path).read_text().strip() or -1) >= epoch:
                return True
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    return False


def train(cfg: TrainConfig, rank: int) -> None:
    torch.set_num_threads(cfg.threads)
    if cfg.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = cfg.ifname
    dist.init_process_group(
        "gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
        rank=rank, world_size=cfg.world,
    )
    try:
        _train_loop(cfg, rank)
        dist.barrier()  # no rank closes its sockets while another still waits on them
    finally:
        dist.destroy_process_group()


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    raise ValueError(f"optimizer: one of {', '.join(OPTIMIZERS)}, got {cfg.optimizer!r}")


def wrap(model: nn.Module) -> DistributedDataParallel:
    """`model` in DDP with one bucket that holds the whole gradient. PyTorch's
    PowerSGD hook starts its second and third AllReduce from completion
    callbacks, which run in whatever order the buckets finish, so with two
    buckets gloo ranks issued mismatched collectives and aborted; every policy
    gets the same single bucket."""
    return DistributedDataParallel(model, bucket_cap_mb=gradient_bytes(model) / 2**20 + 1.0)


def compute_seconds(ddp: DistributedDataParallel, batch: tuple[torch.Tensor, torch.Tensor],
                    steps: int = COMPUTE_PROBE_STEPS) -> float:
    """Median time of a forward and backward pass without communication; the
    gradients it leaves are cleared."""
    times = []
    x, y = batch
    for _ in range(steps):
        t0 = time.perf_counter()
        with ddp.no_sync():
            loss_of(ddp(x), y).backward()
        times.append(time.perf_counter() - t0)
    ddp.zero_grad(set_to_none=True)
    return statistics.median(times[1:] or times)


def _train_loop(cfg: TrainConfig, rank: int) -> None:
    spec = WorkloadSpec(**cfg.workload)
    data = load_dataset(spec, cache=cfg.dataset_cache or None)
    model = build_model(spec, data.features, data.classes)
    ddp = wrap(model)
    sync = attach_sync(ddp, cfg, rank, gradient_bytes(model))  # DDP wants hooks before backward
    optimizer = make_optimizer(cfg, model)
    loader = ShardLoader(data, rank, cfg.world, cfg.batch, spec.seed)
    dist.barrier()
    compute_s = compute_seconds(ddp, loader.epoch(0)[0])
    records = Records(cfg.records, rank == 0)
    records.write("start", policy=cfg.policy, world=cfg.world, grad_bytes=gradient_bytes(model),
                  steps=0 if cfg.budget_s > 0 else cfg.steps, budget_s=cfg.budget_s,
                  steps_per_epoch=loader.steps_per_epoch, compute_s=compute_s,
                  time=time.time())
    dist.barrier()
    clock = TrainClock()
    stop = StopRule(cfg, clock, rank)
    step = evaluated = epoch = 0
    trained_s = 0.0
    while not stop(step, trained_s):
        if rank == 0:
            _enter_epoch(cfg, records, clock, epoch, step)
        for x, y in loader.epoch(epoch):
            if stop(step, trained_s):
                break
            t0, wall = clock.now(), time.time()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(ddp(x), y)
            loss.backward()
            optimizer.step()
            stats = sync.after_step(step, epoch)
            trained_s = clock.now()
            records.write("step", step=step, epoch=epoch, t=trained_s, wall=wall,
                          step_s=trained_s - t0, loss=float(loss.detach()), **stats)
            step += 1
            if rank == 0 and step % cfg.eval_every == 0:
                evaluated = _evaluate(records, clock, model, data, step, epoch)
        epoch += 1
    if rank == 0 and evaluated != step:
        _evaluate(records, clock, model, data, step, epoch - 1)
    sync.close()
    records.write("end", steps=step, t=clock.now(), time=time.time())
    records.close()


def _evaluate(records: Records, clock: TrainClock, model: nn.Module, data: Any, step: int,
              epoch: int) -> int:
    held_out = clock.pause_for(evaluate, model, data.x_test, data.y_test)
    records.write("eval", step=step, epoch=epoch, t=clock.now(), **held_out)
    return step


def _enter_epoch(cfg: TrainConfig, records: Records, clock: TrainClock, epoch: int,
                 step: int) -> None:
    records.write("epoch", epoch=epoch, step=step, t=clock.now())
    if cfg.epoch_ack:
        acked = clock.pause_for(wait_for_epoch_ack, cfg.epoch_ack, epoch, cfg.epoch_ack_timeout_s)
        if not acked:
            records.write("warning", message=f"no schedule ack for epoch {epoch}; going on")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m flexcomm.lab.trainer CONFIG.json RANK", file=sys.stderr)
        return 2
    train(TrainConfig.load(args[0]), int(args[1]))
    return 0


def exit_now(code: int) -> None:
    """Leave without interpreter finalisation. gloo's worker threads can still
    hold finished work (PowerSGD's futures) whose tensors are freed during
    finalisation, which aborts the process ("terminate called without an active
    exception", exit -6) after the run ended and its records were closed: the lab
    counted a finished policy as failed. Everything is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())

