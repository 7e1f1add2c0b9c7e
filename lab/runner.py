"""Running a lab: one cluster, and for each policy a real gloo training job (one
rank per node, and fresh agents, one per node) under the network schedule; then
the report.

    cfg = LabConfig(out=Path("lab-run"), policies=parse_policies("dense moo"))
    run_lab(cfg, progress=print)       # -> the report's LabSummary

The run directory holds: config.json, schedule.toml, lab.db (the store: jobs and
every applied link step), and per policy policies/<name>/ (with --repeats,
policies/<name>@<repeat> for the second and later repeats) with records.jsonl
(rank 0's steps and evaluations), links.jsonl (the link states applied, with
their wall time), train.json, a log per rank and, for a policy the agents decide,
agents/ (the store and log of each agent, started afresh for the run). The
report (summary.json, summary.txt, PNGs) is written last.

With repeats, the policies run interleaved (A, B, C, A, B, C, ...), so a load
that drifts during the run falls on every policy alike.

Equal time or equal steps. Under a time-keyed schedule every policy trains for
the same seconds, each doing as many steps as it can: `budget_s` when given,
else the pacesetter's time for `steps` (dense, or the first policy listed when
dense is not; it runs first). Under an epoch-keyed schedule every policy trains
the same `steps` (a budget is refused there: a policy with faster steps would
reach the later phases sooner, so the same seconds would not see the same
network).

Epoch-keyed schedules are applied at each epoch boundary before the epoch's first
step (rank 0 waits for the runner's acknowledgement, off its training clock), so
every policy trains the same steps under the same link. Time-keyed schedules run
on rank 0's training clock as the runner reads it from the records (the last
`t` read plus the time since), so evaluations, which stop that clock, do not
shift the phases of a policy that evaluates more often.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flexcomm.emulation.emulator import AppliedStep, Emulator
from flexcomm.emulation.schedule import Schedule, parse_schedule
from flexcomm.lab import estimate_tracking
from flexcomm.lab.agents import running_agents
from flexcomm.lab.cleanup import socket_dir_prefix
from flexcomm.lab.cluster import LabCluster, describe
from flexcomm.lab.plan import (
    AGENTS,
    CONTROL_INTERVAL,
    DEFAULT_POLICIES,
    DEFAULT_SCHEDULE,
    DEFAULT_WORKLOAD,
    FAILED,
    RUN_SETTINGS,
    TORCH_METHODS,
    WORKLOAD_DEFAULTS,
    PolicySpec,
    parse_policies,
    parse_targets,
    policy_dir,
)
from flexcomm.lab.summary import LabSummary
from flexcomm.lab.trainer import OPTIMIZERS, TrainConfig
from flexcomm.lab.workload import WorkloadSpec, load_dataset, target_metric
from flexcomm.store import EmulationStep, Store

DECISION_SOURCES = ("agent", "inprocess")
POLL_S = 0.02

Progress = Callable[[dict[str, Any]], None]


class LabError(RuntimeError):
    """A lab run failed (a rank or agent died, a timeout); the message says where."""


@dataclass
class LabConfig:
    """A lab run. Training settings left None take the workload's defaults
    (`flexcomm.lab.plan.WORKLOAD_DEFAULTS`); `target` is a test accuracy (a
    fraction) or, when the workload's target metric is loss, a validation loss."""

    out: Path
    policies: list[PolicySpec] = field(default_factory=lambda: parse_policies(
        " ".join(DEFAULT_POLICIES)))
    nodes: int = 4
    schedule_text: str = DEFAULT_SCHEDULE
    schedule_name: str = "default"
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(name=DEFAULT_WORKLOAD))
    steps: int | None = None
    batch: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    eval_every: int | None = None
    target: float | None = None
    targets: list[str] | None = None  # None: [target, "tight"]; see flexcomm.lab.plan.TIGHT
    budget_s: float | None = None  # training seconds per policy (time-keyed schedules only)
    repeats: int = 1
    prefix: str = "flexlab"
    subnet: str = "10.213.0.0/24"
    decisions: str = "agent"
    control_interval: int = CONTROL_INTERVAL
    namespaces: bool | None = None  # None: when this process can
    policy_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        for name in RUN_SETTINGS:
            if getattr(self, name) is None:
                setattr(self, name, WORKLOAD_DEFAULTS[self.workload.name][name])
        if self.nodes < 2:
            raise ValueError(f"nodes: need at least 2, got {self.nodes}")
        for name in ("steps", "batch", "eval_every", "control_interval", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.target_metric == "accuracy" and not 0.0 < self.target <= 1.0:
            raise ValueError(f"target: a test accuracy must be in (0, 1], got {self.target}")
        if self.target_metric == "loss" and not self.target > 0.0:
            raise ValueError(f"target: a validation loss must be > 0, got {self.target}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.decisions not in DECISION_SOURCES:
            raise ValueError(f"decisions: one of {', '.join(DECISION_SOURCES)}, "
                             f"got {self.decisions!r}")
        self.schedule  # noqa: B018 -- validate the schedule now, before anything is built
        self.targets = parse_targets(self.targets, self.target, self.target_metric)
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s: must be > 0 seconds, got {self.budget_s}")
        if self.budget_s is not None and self.schedule.by_epoch:
            raise ValueError("budget_s: the schedule is keyed by epoch, so a policy with faster "
                             "steps would reach its later phases sooner; give a time-keyed "
                             "schedule (duration = ...) for an equal-time run, or drop --budget-s")

    @property
    def equal_time(self) -> bool:
        """Every policy trains the same seconds (else the same steps)."""
        return self.budget_s is not None or not self.schedule.by_epoch

    @property
    def pacesetter(self) -> str | None:
        """The policy whose time for `steps` is every policy's budget (None: a
        budget is given, or the run compares equal steps)."""
        if self.budget_s is not None or not self.equal_time:
            return None
        labels = [p.label for p in self.policies]
        return "dense" if "dense" in labels else labels[0]

    @property
    def schedule(self) -> Schedule:
        return parse_schedule(self.schedule_text, self.schedule_name)

    @property
    def target_metric(self) -> str:
        return target_metric(self.workload.name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out)
        d["policies"] = [p.label for p in self.policies]
        d["target_metric"] = self.target_metric
        d["equal_time"] = self.equal_time
        d["pacesetter"] = self.pacesetter
        return d


def run_lab(cfg: LabConfig, progress: Progress = lambda event: None) -> LabSummary:
    """Run every policy, write the report, return the summary. A policy whose run
    fails is reported as failed (summary.failed) and the others go on
    (when the pacesetter failed, with `steps` each: there is no time to give them)."""
    from flexcomm.lab.report import write_report

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    (out / "schedule.toml").write_text(cfg.schedule_text)
    dataset = out / "dataset.pt"
    load_dataset(cfg.workload, cache=dataset)
    with Store(out / "lab.db") as store, LabCluster.open(
        prefix=cfg.prefix, n=cfg.nodes, subnet=cfg.subnet, run_dir=out,
        namespaces=cfg.namespaces,
    ) as lab, _socket_dir(cfg.prefix) as sockets:
        progress({"kind": "cluster", **describe(lab)})
        (out / "cluster.json").write_text(json.dumps(describe(lab), indent=1))
        if any(uses_agents(cfg, p) for p in cfg.policies):
            progress({"kind": "agents", "count": cfg.nodes if lab.shaped else 1})
        budget_s = cfg.budget_s
        for repeat, index, spec in run_order(cfg):
            try:
                pdir = run_policy(lab, cfg, spec, index, sockets, store, progress, repeat, budget_s)
                if budget_s is None and spec.label == cfg.pacesetter:
                    budget_s = trained_seconds(pdir)
                    record_setting(out, "paced_budget_s", budget_s)
                    progress({"kind": "budget", "policy": spec.label, "budget_s": budget_s})
            except LabError as exc:  # the other policies still run and are reported
                (policy_dir(out, spec.label, repeat) / FAILED).write_text(str(exc))
                progress({"kind": "failed", "policy": spec.label, "repeat": repeat,
                          "message": str(exc)})
    return write_report(out)


@contextmanager
def _socket_dir(prefix: str) -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are limited to ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix=socket_dir_prefix(prefix)))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_order(cfg: LabConfig) -> list[tuple[int, int, PolicySpec]]:
    """(repeat, index, policy) in the order they run: every policy once, then
    again; the pacesetter first."""
    order = sorted(enumerate(cfg.policies), key=lambda p: p[1].label != cfg.pacesetter)
    return [(r, i, spec) for r in range(cfg.repeats) for i, spec in order]


def record_setting(out: Path, name: str, value: Any) -> None:
    """Add a setting the run decided (not given) to its config.json, so the
    report reads what the run used rather than working it out again."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    config[name] = value
    path.write_text(json.dumps(config, indent=1))


def trained_seconds(pdir: Path) -> float:
    """Rank 0's training time of a finished run (its end record)."""
    end = [r for r in _Tail(pdir / "records.jsonl").read() if r["kind"] == "end"]
    if not end:
        raise LabError(f"{pdir.name}: no end record, so no time to give the other policies")
    return float(end[-1]["t"])


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address if address.startswith("127.") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def uses_agents(cfg: LabConfig, spec: PolicySpec) -> bool:
    """Whether `spec`'s runs take their decisions from the agents (PyTorch's own
    hooks never ask one)."""
    return cfg.decisions == "agent" and spec.kind not in TORCH_METHODS


def run_policy(lab: LabCluster, cfg: LabConfig, spec: PolicySpec, index: int,
               sockets: Path, store: Store, progress: Progress, repeat: int = 0,
               budget_s: float | None = None) -> Path:
    """Train once with `spec` under the schedule (for `budget_s` training
    seconds when set, else cfg.steps), with fresh agents (sockets in `sockets`,
    stores in the run's agents/) when it uses them; returns its directory."""
    pdir = policy_dir(cfg.out, spec.label, repeat)
    if pdir.exists():
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    agents = running_agents(lab, sockets, pdir / AGENTS) if uses_agents(cfg, spec) else nullcontext([])
    with agents as handles:
        agent_socket = str(handles[0].socket) if handles else ""
        _train(lab, cfg, spec, index, pdir, agent_socket, store, progress, repeat, budget_s)
    return pdir


def _train(lab: LabCluster, cfg: LabConfig, spec: PolicySpec, index: int, pdir: Path, agent_socket: str,
           store: Store, progress: Progress, repeat: int, budget_s: float | None) -> None:
    schedule = cfg.schedule
    job_id = re.sub(r"[^A-Za-z0-9._-]", "_",
                    f"lab-{int(time.time())}-{repeat}-{index}-{spec.label}")
    train = TrainConfig(
        policy=spec.kind, policy_options=spec.options, world=cfg.nodes,
        master_addr=lab.nodes[0].address, master_port=free_port(lab.nodes[0].address),
        records=str(pdir / "records.jsonl"), workload=asdict(cfg.workload),
        agent_socket=agent_socket,
        ifname=lab.nodes[0].ifname, steps=cfg.steps, budget_s=budget_s or 0.0, batch=cfg.batch, optimizer=cfg.optimizer,
        lr=cfg.lr, eval_every=cfg.eval_every,
        hook_options={"control_interval": cfg.control_interval},
        # each host once: on loopback every rank is 127.0.0.1, one node hosting
        # several ranks as a GPU node does (the agent refuses an address twice)
        node_addresses=list(dict.fromkeys(n.address for n in lab.nodes)), dataset_cache=str(cfg.out / "dataset.pt"),
        epoch_ack=str(pdir / "epoch_ack") if schedule.by_epoch else "", job_id=job_id,
    )
    train.save(pdir / "train.json")
    store.add_job(job_id, {"policy": spec.label, "repeat": repeat, "nodes": cfg.nodes,
                           "steps": cfg.steps})
    links = _LinkLog(pdir / "links.jsonl", lab, store)
    clock = TrainingClock()
    emulator = (Emulator(schedule, lab.links, on_step=links.record, clock=clock)
                if lab.shaped else None)
    progress({"kind": "policy", "policy": spec.label, "index": index,
              "count": len(cfg.policies), "repeat": repeat, "repeats": cfg.repeats})
    if emulator is not None:  # the first step is in force before the ranks start
        if schedule.by_epoch:
            emulator.advance_epoch(0)
        else:  # Emulator.run applies it again (and the rest) once training starts
            first = schedule.steps[0].state
            lab.links.apply(first)
            links.record(AppliedStep(0, 0, first, time.time()))
    _ack(pdir, 0)
    procs = [lab.spawn(i, [sys.executable, "-m", "flexcomm.lab.trainer",
                           str(pdir / "train.json"), str(i)], log=pdir / f"rank{i}.log")
             for i in range(cfg.nodes)]
    try:
        with estimate_tracking.polling(train.agent_socket, job_id, pdir):
            _follow(cfg, spec, pdir, procs, emulator, schedule, progress, clock)
    finally:
        for proc in procs:
            lab.stop(proc)


def _ack(pdir: Path, epoch: int) -> None:
    tmp = pdir / "epoch_ack.tmp"
    tmp.write_text(str(epoch))
    tmp.replace(pdir / "epoch_ack")


def _follow(cfg: LabConfig, spec: PolicySpec, pdir: Path, procs: list, emulator: Emulator | None,
            schedule: Schedule, progress: Progress, clock: TrainingClock) -> None:
    """Tail rank 0's records until every rank has exited: apply the schedule's
    epoch steps, report progress, and fail fast when a rank dies."""
    tail = _Tail(pdir / "records.jsonl")
    stop = threading.Event()
    timed: threading.Thread | None = None
    deadline = time.monotonic() + cfg.policy_timeout_s
    try:
        while True:
            for rec in tail.read():
                if "t" in rec:
                    clock.observe(rec["t"])
                if rec["kind"] == "epoch" and emulator is not None and schedule.by_epoch:
                    emulator.advance_epoch(rec["epoch"])
                if rec["kind"] == "epoch":
                    _ack(pdir, rec["epoch"])
                if rec["kind"] == "start" and emulator is not None and not schedule.by_epoch:
                    clock.observe(0.0)
                    timed = threading.Thread(target=emulator.run, args=(stop, None, 0.0),
                                             daemon=True)
                    timed.start()
                progress({"policy": spec.label, "link": _rate(emulator), **rec})
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise LabError(f"{spec.label}: rank {failed[0]} exited with code "
                               f"{codes[failed[0]]}: {_log_tail(pdir / f'rank{failed[0]}.log')}")
            if time.monotonic() > deadline:
                raise LabError(f"{spec.label}: not finished within {cfg.policy_timeout_s:.0f} s")
            time.sleep(POLL_S)
        for rec in tail.read():
            progress({"policy": spec.label, "link": _rate(emulator), **rec})
    finally:
        stop.set()
        if timed is not None:
            timed.join()


class TrainingClock:
    """Rank 0's training clock as the runner knows it: the last `t` read from its
    records plus the time since it was read. It runs on during an evaluation
    (and steps back when the next record comes), so a step can be applied at
    most one evaluation early; Emulator.run re-reads it after every wait."""

    def __init__(self) -> None:
        self._t = 0.0
        self._read_at = time.monotonic()

    def observe(self, t: float) -> None:
        self._t, self._read_at = float(t), time.monotonic()

    def __call__(self) -> float:
        return self._t + time.monotonic() - self._read_at


def _rate(emulator: Emulator | None) -> float | None:
    if emulator is None or emulator.current is None:
        return None
    return emulator.current.state.rate_bps


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n" + "\n".join(text[-lines:])


class _Tail:
    """New complete lines of a JSONL file that another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


class _LinkLog:
    """Every link step applied: to links.jsonl (for the report) and the store."""

    def __init__(self, path: Path, lab: LabCluster, store: Store) -> None:
        self.path = path
        self.lab = lab
        self.store = store

    def record(self, applied: AppliedStep) -> None:
        state = applied.state
        with open(self.path, "a") as f:
            f.write(json.dumps({"step_index": applied.step_index, "round": applied.round,
                                "epoch": applied.epoch, "rate_bps": state.rate_bps,
                                "applied_at": applied.applied_at}) + "\n")
        assert self.lab.links is not None
        for shaper in self.lab.links.shapers:
            self.store.add_emulation_step(EmulationStep(
                interface=shaper.ifname, netns=shaper.netns or "", step_index=applied.step_index,
                rate_bps=state.rate_bps, ts=applied.applied_at))
